"""Jobs of the code location: the whole storm pipeline over one (day, region) partition, and the
observation of the landing files (``landing_files``, not a phase: group ``landing``).

``storm_job`` selects every table asset of the four phases (one group per phase); its partitions
are theirs (Dagster takes them from the selected assets)."""

from __future__ import annotations

import dagster as dg

from assets.landing_files import LANDING_FILES
from assets.phases import PHASES, table_keys

STORM_JOB = "storm_job"
OBSERVE_LANDING_JOB = "observe_landing"

storm_job = dg.define_asset_job(
    STORM_JOB,
    selection=dg.AssetSelection.assets(*table_keys(PHASES)),
    description="All four phases (ingest, enrich, correlate, present) of one (day, region) batch: "
                "every table they write.",
)

observe_landing = dg.define_asset_job(
    OBSERVE_LANDING_JOB,
    selection=dg.AssetSelection.assets(LANDING_FILES),
    description="Observes the landing files: records a new data version for every partition whose files "
                "changed, so their ingest shows stale in the UI. Runs no phase.",
)
