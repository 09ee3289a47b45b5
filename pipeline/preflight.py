"""The ledger's check before Dagster: whether every selected partition is current through present.

A partition whose every phase would skip (the ledger's head checkpoints are current for its
inputs, as :meth:`assets.runner.PhaseRunner.current_heads` decides) needs no run. When that holds
for the whole selection, ``stormlake backfill`` records the skips (as a run would) and says
"nothing to do" without a backfill; otherwise the whole selection goes to Dagster as one backfill
(:mod:`pipeline.backfill`), where each phase asks the ledger again. This module imports neither
Dagster nor the code location, so a re-run of published partitions never pays for them.
"""

from __future__ import annotations

from assets.context import PartitionRef
from assets.phases import PHASES
from assets.runner import PhaseRunner
from resources.settings import Settings, load_regions


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


def all_current(runner: PhaseRunner, keys: list[str]) -> bool:
    """Whether every phase of every key would skip; if so, their skips are recorded (as a run of
    them would record them). Stops looking at the first key with work."""
    heads = []
    for key in keys:
        current = runner.current_heads(PartitionRef.parse(key, runner.regions))
        if len(current) < len(PHASES):
            return False
        heads.extend(current)
    runner.record_skips(heads)
    return True
