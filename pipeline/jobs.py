"""Jobs of the code location: the whole storm pipeline over one (day, region) partition."""

from __future__ import annotations

import dagster as dg

from assets.partitions import PARTITIONS

STORM_JOB = "storm_job"

storm_job = dg.define_asset_job(
    STORM_JOB,
    selection=dg.AssetSelection.groups("storm"),
    partitions_def=PARTITIONS,
    description="All four phases (ingest, enrich, correlate, present) of one (day, region) batch.",
)
