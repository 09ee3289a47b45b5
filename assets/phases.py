"""The four phases: their order, tiers, schema versions and the tables each writes.

A phase's ``schema_version`` is the shape of what it writes; bump it whenever a table of that
phase changes columns or meaning. Its ``code_version`` is the phase's logic; bump it when the same inputs
would give different output. Both enter the phase's input hash, so a checkpoint of another
version is never reused: that phase and the phases after it recompute, earlier ones are reused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dagster as dg


@dataclass(frozen=True)
class Phase:
    name: str  # ingest | enrich | correlate | present
    asset: str  # the Dagster op (step) that materializes the phase's tables, one asset per table
    tier: int
    tier_label: str
    schema_version: int
    code_version: str
    reads: tuple[str, ...]  # earlier phases whose tables (at pinned versions) this phase reads
    tables: tuple[str, ...]  # tables this phase writes
    inputs: tuple[str, ...] = ()  # tables of earlier phases it reads (the only ones PhaseIO lets it read)

    @property
    def pool(self) -> str:
        """The Dagster concurrency pool of its op: one a phase, the writer of its Delta tables."""
        return f"stormlake_{self.name}"


INGEST = Phase("ingest", "ingested_batch", 1, "ingested", 1, "1",
               (), ("outages_raw", "weather_raw", "customers_ref", "terrain_ref", "quarantine"))
ENRICH = Phase("enrich", "enriched_outages", 2, "enriched", 1, "1", ("ingest",), ("outages_enriched",),
               ("outages_raw", "weather_raw", "customers_ref", "terrain_ref"))
CORRELATE = Phase("correlate", "storm_correlation", 3, "correlated", 1, "1",
                  ("ingest", "enrich"), ("cell_hour_stats", "cell_risk", "storm_clusters"),
                  ("outages_enriched", "weather_raw", "customers_ref", "terrain_ref"))
PRESENT = Phase("present", "operational_picture", 4, "published", 1, "2",
                ("ingest", "enrich", "correlate"), ("region_day_summary",),
                ("outages_enriched", "cell_hour_stats", "cell_risk", "storm_clusters", "customers_ref"))

PHASES: tuple[Phase, ...] = (INGEST, ENRICH, CORRELATE, PRESENT)
# The last phase reading each table: after it has read a partition, this process needs it no more.
LAST_READER = {table: phase.name for phase in PHASES for table in phase.inputs}
BY_NAME = {p.name: p for p in PHASES}
TIER_LABELS = {0: "not_started", **{p.tier: p.tier_label for p in PHASES}}
# The phase of each Dagster op (the ``asset`` names above), e.g. for a step key.
OP_PHASE = {p.asset: p.name for p in PHASES}
# The phase writing each table (each table is one Dagster asset, keyed by its name).
TABLE_PHASE = {table: p.name for p in PHASES for table in p.tables}


def table_keys(phases: Phase | Iterable[Phase]) -> list[dg.AssetKey]:
    """The Dagster asset keys of the tables the phase (or phases, in order) write."""
    import dagster as dg  # here: the ledger's read-only commands import this module without Dagster

    group = [phases] if isinstance(phases, Phase) else list(phases)
    return [dg.AssetKey(table) for phase in group for table in phase.tables]
