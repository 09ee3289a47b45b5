"""The code location: the only ``dg.Definitions`` of stormlake.

``dg dev``, ``dg launch --assets … --partition …`` and the contract's ``dagster asset materialize
-m pipeline.definitions`` all load ``defs`` from here. Settings come from the environment (contract
section 1); the ledger DSN and the webhook URL are read through ``dg.EnvVar`` so they are never
shown in the UI or logged.

The four phases are one multi-asset each, with one asset per Delta table they write (ten tables,
grouped by phase: groups ``ingest``, ``enrich``, ``correlate``, ``present``; ``storm_job`` runs
them all), each with its code reference (file and line of the phase's function). Besides them
the location holds the observable source asset ``landing_files`` (group ``landing``,
``assets/landing_files.py``), the input of ingest's tables, and the ``observe_landing`` job that
observes it.

The landing sensor is registered RUNNING (``STORMLAKE_LANDING_SENSOR=stopped`` registers it
stopped): landed files, today's included, are run as they come (docs/LIVE.md). The outbox sensor
is registered RUNNING too: it only continues partitions whose run stopped between phases. The
schedules are registered STOPPED: they launch nothing until an operator turns them on in the UI
(Automation) or with ``dagster schedule start <name>`` in the project folder.
"""

from __future__ import annotations

import warnings

import dagster as dg

from assets.correlate import storm_correlation
from assets.enrich import enriched_outages
from assets.ingest import ingested_batch
from assets.landing_files import landing_files
from assets.present import operational_picture
from pipeline.engine import executor_def
from pipeline.jobs import observe_landing, storm_job
from pipeline.schedules import SCHEDULES
from pipeline.sensors import SENSORS
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.files import apply_file_mode
from resources.ledger_resource import LedgerResource
from resources.settings import load_settings


def build_resources(*, resolved: bool = False) -> dict[str, dg.ConfigurableResource]:
    """The resources of the code location.

    Secrets are ``dg.EnvVar`` references, resolved by Dagster inside a run. ``resolved=True``
    puts the values themselves in, for using the resources outside a run (the CLI's preflight).
    """
    s = load_settings()
    apply_file_mode(s.file_mode)  # the lake, artifacts and Dagster's files of every run and server

    def secret(name: str, value: str | None) -> str:
        if not value:
            return ""
        return value if resolved else dg.EnvVar(name)  # type: ignore[return-value]

    return {
        "ledger": LedgerResource(**_ledger_logins(s, secret), pgdata=str(s.pgdata)),
        "lake": LakeResource(root=s.lake, log_retention_minutes=s.lake_log_retention_minutes),
        "landing": LandingResource(root=str(s.landing), regions_file=str(s.regions_file)),
        "publisher": PublisherResource(
            publish_dir=str(s.publish_dir),
            webhook_url=secret("STORMLAKE_WEBHOOK_URL", s.webhook_url),
            webhook_timeout_s=s.webhook_timeout_s,
            webhook_tries=s.webhook_tries,
            webhook_backoff_s=s.webhook_backoff_s,
        ),
    }


def _ledger_logins(s, secret) -> dict[str, str]:  # noqa: ANN001 - Settings, build_resources' secret
    """The pipeline's login (``STORMLAKE_PIPELINE_DSN``, else the contract's ``STORMLAKE_PG_DSN``)
    and the owner's, which migrates on first use: given only as the contract's one DSN, or as
    ``STORMLAKE_OWNER_DSN`` when the run's environment holds it (resources.logins)."""
    if s.pipeline_dsn:
        return {"dsn": secret("STORMLAKE_PIPELINE_DSN", s.pipeline_dsn),
                "owner_dsn": secret("STORMLAKE_OWNER_DSN", s.owner_dsn)}
    if s.pg_dsn:
        one = not s.owner_dsn
        return {"dsn": secret("STORMLAKE_PG_DSN", s.pg_dsn),
                "owner_dsn": secret("STORMLAKE_PG_DSN", s.pg_dsn) if one else secret("STORMLAKE_OWNER_DSN", s.owner_dsn)}
    if s.owner_dsn:
        return {"dsn": secret("STORMLAKE_OWNER_DSN", s.owner_dsn), "owner_dsn": secret("STORMLAKE_OWNER_DSN", s.owner_dsn)}
    return {}


# One multi-asset per phase (its tables), in protocol order, each pointing at its source code.
# ``with_source_code_references`` and the code reference values it attaches are beta; the
# references are deliberate (each table links to its phase's function in the UI).
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)
    PHASE_ASSETS = list(dg.with_source_code_references(
        [ingested_batch, enriched_outages, storm_correlation, operational_picture]))
    SOURCE_ASSETS = list(dg.with_source_code_references([landing_files]))  # observed, never materialized

# By default every job runs its steps in the run's own process (the UI's backfills and
# "Materialize", the schedule's and sensors' runs, `dg launch`), as the CLI's runs do: a step
# process of its own would pay Dagster's import and the code location's load again for every
# phase, several times what a small partition's phase costs, and a phase reads what the phase
# before it wrote from the process's partition cache instead of the Delta files. Parallelism
# comes from runs (the queue's limits), not from steps: a partition's phases run one after
# another anyway. STORMLAKE_EXECUTOR=celery puts the steps on Celery workers instead, on other
# hosts (pipeline/engine.py).
defs = dg.Definitions(
    assets=[*SOURCE_ASSETS, *PHASE_ASSETS],
    jobs=[storm_job, observe_landing],
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=build_resources(),
    executor=executor_def(load_settings()),
)
