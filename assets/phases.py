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


@dataclass(frozen=True, kw_only=True)
class Phase:
    name: str  # ingest | enrich | correlate | present
    asset: str  # the Dagster op (step) that materializes the phase's tables, one asset per table
    tier: int  # the progress tier a partition reaches when this phase commits
    tier_label: str
    schema_version: int
    code_version: str
    upstream_phases: tuple[str, ...]  # earlier phases whose tables (at pinned versions) this phase reads
    input_tables: tuple[str, ...]  # tables of those phases it reads (the only ones its context lets it read)
    tables: tuple[str, ...]  # tables this phase writes, one Dagster asset each


INGEST = Phase(
    name="ingest", asset="ingested_batch", tier=1, tier_label="ingested", schema_version=1, code_version="1",
    upstream_phases=(), input_tables=(),
    tables=("outages_raw", "weather_raw", "customers_ref", "terrain_ref", "quarantine"),
)
ENRICH = Phase(
    name="enrich", asset="enriched_outages", tier=2, tier_label="enriched", schema_version=1, code_version="3",
    upstream_phases=("ingest",),
    input_tables=("outages_raw", "weather_raw", "customers_ref", "terrain_ref"),
    tables=("outages_enriched",),
)
CORRELATE = Phase(
    name="correlate", asset="storm_correlation", tier=3, tier_label="correlated", schema_version=1,
    code_version="1", upstream_phases=("ingest", "enrich"),
    input_tables=("outages_enriched", "weather_raw", "customers_ref", "terrain_ref"),
    tables=("cell_hour_stats", "cell_risk", "storm_clusters"),
)
PRESENT = Phase(
    name="present", asset="operational_picture", tier=4, tier_label="published", schema_version=2,
    code_version="6", upstream_phases=("ingest", "enrich", "correlate"),
    input_tables=("outages_enriched", "cell_hour_stats", "cell_risk", "storm_clusters", "customers_ref"),
    tables=("region_day_summary",),
)

PHASES: tuple[Phase, ...] = (INGEST, ENRICH, CORRELATE, PRESENT)
# The last phase reading each table: after it has read a partition, this process needs it no more.
LAST_READER = {table: phase.name for phase in PHASES for table in phase.input_tables}
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
