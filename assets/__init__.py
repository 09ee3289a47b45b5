"""Middle floor: the four phases, their transforms, schemas and the one phase runner."""

import warnings

import dagster as dg

# ``backfill_policy`` on @asset is marked beta; the policy is deliberate (README, "Backfills").
warnings.filterwarnings("ignore", message=r".*`backfill_policy`.*beta", category=dg.BetaWarning)
# ``observable_source_asset`` and ``DataVersionsByPartition`` are beta too; landing_files uses them
# deliberately (assets/landing_files.py).
warnings.filterwarnings("ignore", message=r".*`(observable_source_asset|DataVersionsByPartition)`.*beta",
                        category=dg.BetaWarning)
