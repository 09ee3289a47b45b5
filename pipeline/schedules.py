"""The daily schedule: yesterday's batch of every region, once the UTC day is over.

At 03:00 UTC the schedule asks for one run of ``storm_job`` per region for the day that just
ended (``<yesterday>|<region>``). Each request carries the run key ``daily:<yesterday>|<region>``,
so a tick evaluated twice (daemon restart, a manual "test tick") never launches a partition
twice. Days before ``STORMLAKE_FIRST_DAY`` are not partitions and are skipped. A run for a
partition that is already published only records skips in the ledger (the phases decide), so
a late schedule after a manual backfill costs a few seconds and delivers nothing.

``observe_landing_schedule`` runs the ``observe_landing`` job every 15 minutes: an observation of
the landing files (no phase runs), so a changed landing file shows its partition of ingest stale
in the UI even while the landing sensor is off. Also STOPPED by default.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from assets.partitions import first_day, region_ids
from pipeline.jobs import observe_landing, storm_job

OBSERVE_CRON = "*/15 * * * *"
DAILY_CRON = "0 3 * * *"  # 03:00 UTC: late landing files of the previous day have had three hours
LAUNCHED_BY = "stormlake/launched_by"


def daily_requests(scheduled: dt.datetime) -> list[dg.RunRequest] | dg.SkipReason:
    """The run requests of the tick scheduled at ``scheduled`` (any timezone; UTC days)."""
    if scheduled.tzinfo is None:
        scheduled = scheduled.replace(tzinfo=dt.UTC)
    yesterday = (scheduled.astimezone(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    if yesterday < first_day():
        return dg.SkipReason(f"{yesterday} is before the first day {first_day()} (STORMLAKE_FIRST_DAY)")
    return [
        dg.RunRequest(
            run_key=f"daily:{yesterday}|{region}",
            partition_key=f"{yesterday}|{region}",
            tags={LAUNCHED_BY: "daily_schedule"},
        )
        for region in region_ids()
    ]


@dg.schedule(
    name="daily_storm_schedule",
    cron_schedule=DAILY_CRON,
    execution_timezone="UTC",
    job=storm_job,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="At 03:00 UTC, runs yesterday's batch of every region (one run per region, run key "
                "daily:<day>|<region>). Stopped by default: turn it on in the UI (Automation) or with "
                "`dagster schedule start daily_storm_schedule`.",
)
def daily_storm_schedule(context: dg.ScheduleEvaluationContext):
    scheduled = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
    return daily_requests(scheduled)


observe_landing_schedule = dg.ScheduleDefinition(
    name="observe_landing_schedule",
    cron_schedule=OBSERVE_CRON,
    execution_timezone="UTC",
    job=observe_landing,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    tags={LAUNCHED_BY: "observe_landing_schedule"},
    description="Every 15 minutes, observes the landing files (a new data version for each partition whose "
                "files changed; ingest then shows stale in the UI). Runs no phase. Stopped by default.",
)


SCHEDULES = [daily_storm_schedule, observe_landing_schedule]
