"""The daily schedule: yesterday's batch of every region, once the UTC day is over.

``daily_storm_schedule`` is built from ``storm_job``'s partitions
(``dg.build_schedule_from_partitioned_job``; the job takes them from its table assets, so the
schedule is complete once the code location resolves the job: ``defs.resolve_schedule_def``).
The day dimension is daily in UTC, so at 03:00 UTC it asks for one run per region of the day
that just ended (``<yesterday>|<region>``), each with that partition key as its run key, so a
tick evaluated twice (daemon restart, a manual "test tick") never launches a partition twice. A
tick before the first full day of the partitions (``STORMLAKE_FIRST_DAY``) is skipped. A run for
a partition that is already published only records skips in the ledger (the phases decide), so a
late schedule after a manual backfill costs a few seconds and delivers nothing.

``observe_landing_schedule`` runs the ``observe_landing`` job every 15 minutes: an observation of
the landing files (no phase runs), so a changed landing file shows its partition of ingest stale
in the UI even while the landing sensor is off.

Both are STOPPED by default: turn them on in the UI (Automation), or with
``dagster schedule start <name>`` from the project folder.
"""

from __future__ import annotations

import dagster as dg

from pipeline.jobs import observe_landing, storm_job
from resources.keys import LAUNCHED_BY

OBSERVE_CRON = "*/15 * * * *"
DAILY_HOUR_UTC = 3  # 03:00 UTC: late landing files of the previous day have had three hours

daily_storm_schedule = dg.build_schedule_from_partitioned_job(
    storm_job,
    name="daily_storm_schedule",
    hour_of_day=DAILY_HOUR_UTC,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    tags={LAUNCHED_BY: "daily_schedule"},
    description="At 03:00 UTC, runs yesterday's batch of every region (one run per region; run key "
                "<day>|<region>, the partition key). Stopped by default: turn it on in the UI (Automation).",
)

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
