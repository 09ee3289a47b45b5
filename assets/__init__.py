"""Middle floor: the four phases, their transforms, schemas and the one phase runner."""

import warnings

# ``backfill_policy`` on @asset is marked beta; the policy is deliberate (README, "Backfills").
# ``observable_source_asset`` and ``DataVersionsByPartition`` are beta too; landing_files uses them
# deliberately (assets/landing_files.py). Matched by message, so importing this package (for the
# phase list, say) does not import Dagster.
warnings.filterwarnings("ignore", message=r".*`backfill_policy`.*beta")
warnings.filterwarnings("ignore", message=r".*`(observable_source_asset|DataVersionsByPartition)`.*beta")
