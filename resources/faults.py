"""Fault injection for tests: die or raise at named points of the phase protocol.

Set ``STORMLAKE_FAULTS`` to a comma-separated list of ``[phase.]point[@partition][=action]``:

- ``point`` is one of :data:`POINTS`;
- ``phase`` limits it to one phase (``correlate.after_lease``), ``partition`` to one partition
  key (``after_lease@2026-09-01|gulf_coast``);
- ``action`` is ``exit`` (default: ``os._exit(137)``, what a SIGKILL leaves behind: no
  cleanup, no ``finally``, no atexit), ``raise`` (:class:`InjectedFault`) or ``hang`` (say so on
  stderr, then wait for the test to kill the process from outside; exit after :data:`HANG_S`).

Example: ``STORMLAKE_FAULTS=present.after_pending=exit``.
"""

from __future__ import annotations

import os
import sys
import time

from resources.errors import ConfigError, InjectedFault

POINTS = (
    "after_lease",  # the lease is held and the attempt claimed
    "mid_transform",  # inside the phase's computation
    "after_delta_commit",  # after each Delta commit, before the checkpoint
    "after_write",  # a range step's writes made (together), none of them recorded yet
    "after_checkpoint",  # the checkpoint is COMPLETED
    "after_pending",  # a receipt is PENDING, the artifact not yet delivered
    "after_delivery",  # the artifact was delivered, the receipt not yet DELIVERED
    # An outside call (a Delta commit, a delivery) was made and recorded, the checkpoint not yet
    # committed. Fires after each call an attempt makes itself, never after one answered from the
    # record, so the same fault set on every retry moves one call further each time.
    "after_call",
)
EXIT_CODE = 137
HANG_S = 600


def _parse(spec: str) -> list[tuple[str | None, str, str | None, str]]:
    rules = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        action = "exit"
        if "=" in item:
            item, action = item.rsplit("=", 1)
        partition = None
        if "@" in item:
            item, partition = item.split("@", 1)
        phase, _, point = item.rpartition(".")
        if point not in POINTS or action not in ("exit", "raise", "hang"):
            raise ConfigError(
                f"STORMLAKE_FAULTS: {item!r} is not a fault point (one of {', '.join(POINTS)}) with action exit|raise|hang"
            )
        rules.append((phase or None, point, partition, action))
    return rules


def check(point: str, *, phase: str, partition_key: str) -> None:
    """Die or raise here if ``STORMLAKE_FAULTS`` names this point."""
    spec = os.environ.get("STORMLAKE_FAULTS", "")
    if not spec:
        return
    for f_phase, f_point, f_partition, action in _parse(spec):
        if f_point != point or (f_phase and f_phase != phase) or (f_partition and f_partition != partition_key):
            continue
        if action == "raise":
            raise InjectedFault(f"injected fault at {phase}.{point} for {partition_key}")
        if action == "hang":
            sys.stderr.write(f"stormlake: injected hang at {phase}.{point} for {partition_key} (pid {os.getpid()})\n")
            sys.stderr.flush()
            time.sleep(HANG_S)
            os._exit(EXIT_CODE)
        sys.stderr.write(f"stormlake: injected exit at {phase}.{point} for {partition_key}\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
