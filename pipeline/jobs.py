"""Jobs of the code location: the whole storm pipeline over one (day, region) partition, and the
observation of the landing files (``landing_files``, not a phase: group ``landing``)."""

from __future__ import annotations

import dagster as dg

from assets.landing_files import LANDING_FILES
from assets.partitions import PARTITIONS

STORM_JOB = "storm_job"
OBSERVE_LANDING_JOB = "observe_landing"

storm_job = dg.define_asset_job(
    STORM_JOB,
    selection=dg.AssetSelection.groups("storm"),
    partitions_def=PARTITIONS,
    description="All four phases (ingest, enrich, correlate, present) of one (day, region) batch.",
)

observe_landing = dg.define_asset_job(
    OBSERVE_LANDING_JOB,
    selection=dg.AssetSelection.assets(LANDING_FILES),
    description="Observes the landing files: records a new data version for every partition whose files "
                "changed, so their ingest shows stale in the UI. Runs no phase.",
)
