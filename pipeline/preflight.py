"""The CLI's preflight, before Dagster: which selected partitions have work at all.

A partition whose every phase would skip (the ledger's head checkpoints are current for its
inputs, as :meth:`assets.runner.PhaseRunner.current_heads` decides) is reported done here, with
its skips recorded, and needs no Dagster run. Only the partitions left go on to Dagster
(:mod:`pipeline.orchestrate`). This module imports neither Dagster nor the code location, so a
rerun of published partitions never pays for them: importing Dagster, preparing its instance
(its storage modules and a connection) and loading the definitions with the phases' libraries
was most of a rerun's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from assets.context import PartitionRef
from assets.phases import PHASES
from assets.runner import PhaseRunner
from resources.errors import DB_DOWN_CLASSES
from resources.ledger import Checkpoint
from resources.settings import Settings, load_regions


@dataclass
class PartitionRun:
    """What a CLI run reports for one partition: each phase's outcome, its deliveries, its error."""

    key: str
    ok: bool
    run_id: str
    seconds: float
    phases: dict[str, str] = field(default_factory=dict)  # phase -> COMPLETED | SKIPPED | FAILED
    delivered: list[str] = field(default_factory=list)
    error: str | None = None
    error_class: str | None = None

    @property
    def ledger_down(self) -> bool:
        return self.error_class in DB_DOWN_CLASSES


def light_runner(settings: Settings) -> PhaseRunner:
    """A phase runner on the settings' ledger, lake, landing zone and targets, built without Dagster
    (the same objects the code location's resources give a run)."""
    from assets.schemas import PARTITION_COLUMNS, SCHEMAS
    from resources.lake import Lake
    from resources.landing import Landing
    from resources.ledger import get_ledger
    from resources.logins import resolve_logins
    from resources.publisher import build_targets

    logins = resolve_logins(settings)
    return PhaseRunner(
        ledger=get_ledger(logins.pipeline, owner_dsn=logins.owner),
        lake=Lake(settings.lake, SCHEMAS, partition_by=PARTITION_COLUMNS,
                  log_retention_minutes=settings.lake_log_retention_minutes),
        landing=Landing(settings.landing),
        targets=build_targets(settings.publish_dir, settings.webhook_url or None, timeout_s=settings.webhook_timeout_s,
                              max_tries=settings.webhook_tries, backoff_s=settings.webhook_backoff_s),
        regions={r.region_id: r for r in load_regions(settings.regions_file)},
        dead_letter_after=settings.dead_letter_after,
    )


def sort_out(runner: PhaseRunner, keys: list[str], *, keep: int = len(PHASES),
             on_done: Callable[[PartitionRun], None] | None = None) -> dict[str, list[Checkpoint]]:
    """The keys with work, in their order, each with the heads of its leading phases that would
    skip (at most ``keep`` of them: a forced re-run keeps only the phases before its own).

    A partition whose every phase would skip has its skips recorded (as a run of it would) and is
    reported through ``on_done`` instead.
    """
    todo: dict[str, list[Checkpoint]] = {}
    for key in keys:
        start = time.monotonic()
        current = runner.current_heads(PartitionRef.parse(key, runner.regions))[:keep]
        if len(current) < len(PHASES):
            todo[key] = current
            continue
        runner.record_skips(current)
        if on_done:
            on_done(PartitionRun(key=key, ok=True, run_id="", seconds=time.monotonic() - start,
                                 phases={p.name: "SKIPPED" for p in PHASES}))
    return todo
