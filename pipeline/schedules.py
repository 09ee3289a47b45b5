"""The daily schedule: yesterday's batch of every region, once the UTC day is over.

``daily_storm_schedule`` closes the day: at 00:05 UTC it asks for the partitions of the UTC day
that just ended, every region's, with every file landed by then. While the day was open (today
is a partition), the landing sensor ran each new version of its files; this run makes the day's
last revision, its final one (a changed file of a closed day later still makes a new revision,
as late data of any past day does). Its requests come in the key ranges a UI backfill's runs have
(:func:`assets.plan.range_run_requests`: at most ``MAX_PARTITIONS_PER_RUN`` neighbouring
regions a run; a day of 50 regions is 7 runs, not 50). Each run's run key is its range
(``<first key>..<last key>``, or the partition key for a range of one), so a tick evaluated
twice (daemon restart, a manual "test tick") never launches a partition twice. Only the regions
whose files landed are requested; the others are named in the tick's log (a range holding a
region with no files would fail that region, ``assets.materialize``). A tick before
the first full day of the partitions (``STORMLAKE_FIRST_DAY``) is skipped. A run for partitions
already published only records skips in the ledger (the phases decide), so a late schedule
after a manual backfill costs a few seconds and delivers nothing.

``observe_landing_schedule`` runs the ``observe_landing`` job every 15 minutes: an observation of
the landing files (no phase runs), so a changed landing file shows its partition of ingest stale
in the UI even while the landing sensor is off.

Both are STOPPED by default: turn them on in the UI (Automation), or with
``dagster schedule start <name>`` from the project folder.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from assets.partitions import first_day, region_ids
from assets.plan import range_run_requests
from pipeline.jobs import observe_landing, storm_job
from resources.keys import LAUNCHED_BY, partition_key
from resources.landing import Landing
from resources.settings import load_settings

OBSERVE_CRON = "*/15 * * * *"
CLOSE_CRON = "5 0 * * *"  # 00:05 UTC: the day just closed, its files as they stood at midnight


@dg.schedule(
    name="daily_storm_schedule",
    cron_schedule=CLOSE_CRON,
    execution_timezone="UTC",
    job=storm_job,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="At 00:05 UTC, closes the day just ended: runs its batch of every region in key ranges of "
                "neighbouring regions, as a UI backfill does (run key: the range). Stopped by default: turn it on "
                "in the UI (Automation).",
)
def daily_storm_schedule(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
    at = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
    day = (at.astimezone(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    if day < first_day():
        return dg.SkipReason(f"no partitions for {day}: the partitions start on {first_day()}")
    zone = Landing(load_settings().landing)
    keys = [partition_key(day, region) for region in region_ids() if zone.has_partition_files(region, day)]
    missing = [region for region in region_ids() if partition_key(day, region) not in keys]
    if missing:
        context.log.info(f"{day}: no landing files for {len(missing)} region(s), not requested: {', '.join(missing[:20])}")
    if not keys:
        return dg.SkipReason(f"no landing files for {day}")
    return range_run_requests(keys, run_key=lambda group: "..".join(dict.fromkeys((group[0], group[-1]))),
                              tags={LAUNCHED_BY: "daily_schedule"})


observe_landing_schedule = dg.ScheduleDefinition(
    name="observe_landing_schedule",
    cron_schedule=OBSERVE_CRON,
    execution_timezone="UTC",
    job=observe_landing,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    tags={LAUNCHED_BY: "observe_landing_schedule"},
    description="Every 15 minutes, observes the landing files (a new data version for each partition whose "
                "files changed; ingest then shows stale in the UI). Runs no phase. Stopped by default: turn it on "
                "in the UI (Automation).",
)


SCHEDULES = [daily_storm_schedule, observe_landing_schedule]
