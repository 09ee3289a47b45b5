"""Fault injection for tests: die or raise at named points of the phase protocol.

Set ``STORMLAKE_FAULTS`` to a comma-separated list of ``[phase.]point[@partition][=action]``:

- ``point`` is one of :data:`POINTS`;
- ``phase`` limits it to one phase (``correlate.after_lease``), ``partition`` to one partition
  key (``after_lease@2026-09-01|gulf_coast``);
- ``action`` is ``exit`` (default: ``os._exit(137)``, what a SIGKILL leaves behind: no
  cleanup, no ``finally``, no atexit), ``exit-always``, ``raise`` (:class:`InjectedFault`) or
  ``hang`` (say so on stderr, then wait for the test to kill the process from outside; exit
  after :data:`HANG_S`).

``exit`` fires once per phase, point and partition in a ``STORMLAKE_HOME``: a marker file under
``$STORMLAKE_HOME/faults/`` is written just before the process dies, and a point with its marker
is passed. A crashed run is retried by Dagster (run retries, dagster.yaml) in a process with the
same environment, and that retry resumes the phase as a person's next backfill would.
``exit-always`` dies every time the point is reached (each retry dies too).

Example: ``STORMLAKE_FAULTS=present.after_pending=exit``.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

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
ACTIONS = ("exit", "exit-always", "raise", "hang")
EXIT_CODE = 137
HANG_S = 600
MARKERS = "faults"  # the folder under $STORMLAKE_HOME of the ``exit`` points that fired


def marker(phase: str, point: str, partition_key: str) -> Path | None:
    """The file saying that ``exit`` fired at this point for this partition (None without a home)."""
    home = os.environ.get("STORMLAKE_HOME")
    if not home:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", f"{phase}.{point}@{partition_key}")
    return Path(home) / MARKERS / safe


def fired(phase: str, point: str, partition_key: str) -> bool:
    """Whether ``exit`` already fired at this point for this partition in this home."""
    path = marker(phase, point, partition_key)
    return path is not None and path.exists()


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
        if point not in POINTS or action not in ACTIONS:
            raise ConfigError(
                f"STORMLAKE_FAULTS: {item!r} is not a fault point (one of {', '.join(POINTS)}) with action"
                f" {'|'.join(ACTIONS)}"
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
        if action == "exit":
            path = marker(phase, point, partition_key)
            if path is not None:
                if path.exists():
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"pid {os.getpid()}\n")
        sys.stderr.write(f"stormlake: injected exit at {phase}.{point} for {partition_key}\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
