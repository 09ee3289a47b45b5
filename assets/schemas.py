"""The Arrow schemas of every Delta table, i.e. what each phase hands to the next.

Every table starts with the partition columns ``region_id`` and ``day`` (``YYYY-MM-DD``
string) and is partitioned by them (contract section 4). Timestamps are UTC microseconds.
A change to a table's columns is a schema change: bump the owning phase's ``schema_version``
(``assets/phases.py``) so that checkpoints of the old shape are not reused.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import dagster as dg

TS = pa.timestamp("us", tz="UTC")
PARTITION_COLUMNS = ["region_id", "day"]
_PART = [pa.field("region_id", pa.string(), nullable=False), pa.field("day", pa.string(), nullable=False)]


def _schema(*fields: tuple[str, pa.DataType] | tuple[str, pa.DataType, bool]) -> pa.Schema:
    out = list(_PART)
    for f in fields:
        name, typ, *rest = f
        out.append(pa.field(name, typ, nullable=rest[0] if rest else True))
    return pa.schema(out)


# ---- landing CSV files (contract section 3) ------------------------------------------------
# The columns each landing file must have, in the order the scenario generator writes them (a
# landing file may order them otherwise and carry extra ones).
OUTAGES_CSV_COLUMNS = (
    "event_id", "region_id", "reported_at", "lat", "lon", "customers_out", "cause", "restored_at")
WEATHER_CSV_COLUMNS = (
    "station_id", "region_id", "observed_at", "lat", "lon", "wind_gust_ms", "rain_mm", "pressure_hpa")
CUSTOMERS_CSV_COLUMNS = ("cell_id", "region_id", "feeder_id", "customers")
TERRAIN_CSV_COLUMNS = ("cell_id", "region_id", "elevation_m", "slope_deg", "vegetation_index", "flood_zone")

# ---- ingest ----------------------------------------------------------------------------
OUTAGES_RAW = _schema(
    ("event_id", pa.string(), False),
    ("reported_at", TS, False),
    ("lat", pa.float64(), False),
    ("lon", pa.float64(), False),
    ("customers_out", pa.int64(), False),
    ("cause", pa.string(), False),
    ("restored_at", TS),
    ("source_line", pa.int64(), False),
)
WEATHER_RAW = _schema(
    ("station_id", pa.string(), False),
    ("observed_at", TS, False),
    ("lat", pa.float64(), False),
    ("lon", pa.float64(), False),
    ("wind_gust_ms", pa.float64(), False),
    ("rain_mm", pa.float64(), False),
    ("pressure_hpa", pa.float64(), False),
    ("source_line", pa.int64(), False),
)
# Reference data as the partition's ingest saw it (a snapshot per batch, so that a resumed or
# re-run batch reads exactly the reference data it was computed with).
CUSTOMERS_REF = _schema(
    ("cell_id", pa.string(), False),
    ("feeder_id", pa.string(), False),
    ("customers", pa.int64(), False),
    ("source_line", pa.int64(), False),
)
TERRAIN_REF = _schema(
    ("cell_id", pa.string(), False),
    ("elevation_m", pa.float64(), False),
    ("slope_deg", pa.float64(), False),
    ("vegetation_index", pa.float64(), False),
    ("flood_zone", pa.bool_(), False),
    ("source_line", pa.int64(), False),
)
QUARANTINE = _schema(
    ("source_file", pa.string(), False),  # path relative to the landing zone
    ("line", pa.int64(), False),  # 1-based physical line; the header is line 1
    ("field", pa.string()),  # the offending column, null when the row as a whole is bad
    ("reason", pa.string(), False),
    ("raw", pa.string(), False),  # the row's text as it stood in the file
)

# ---- enrich ----------------------------------------------------------------------------
OUTAGES_ENRICHED = _schema(
    ("event_id", pa.string(), False),
    ("reported_at", TS, False),
    ("restored_at", TS),
    ("hour", pa.int32(), False),  # UTC hour of reported_at, 0..23
    ("lat", pa.float64(), False),
    ("lon", pa.float64(), False),
    ("cell_id", pa.string(), False),  # H3 resolution 7
    ("customers_out", pa.int64(), False),
    ("cause", pa.string(), False),
    ("feeder_id", pa.string()),  # the feeder serving most customers of the cell
    ("cell_customers", pa.int64(), False),  # customers in the cell (0 when unknown)
    ("elevation_m", pa.float64()),
    ("slope_deg", pa.float64()),
    ("vegetation_index", pa.float64()),
    ("flood_zone", pa.bool_()),
    ("gust_ms", pa.float64()),  # weather at the cell in that hour (nearest station)
    ("rain_mm", pa.float64()),
    ("restoration_min", pa.float64()),  # minutes to restore, null while not restored
)

# ---- correlate -------------------------------------------------------------------------
CELL_HOUR_STATS = _schema(
    ("cell_id", pa.string(), False),
    ("hour", pa.int32(), False),
    ("outages", pa.int64(), False),
    ("customers_out", pa.int64(), False),
    ("cell_customers", pa.int64(), False),
    ("gust_ms", pa.float64()),
    ("rain_mm", pa.float64()),
)
CELL_RISK = _schema(
    ("cell_id", pa.string(), False),
    ("lat", pa.float64(), False),  # cell centre
    ("lon", pa.float64(), False),
    ("outages", pa.int64(), False),
    ("customers_out", pa.int64(), False),
    ("cell_customers", pa.int64(), False),
    ("affected_pct", pa.float64(), False),
    ("max_gust_ms", pa.float64()),
    ("total_rain_mm", pa.float64()),
    ("vegetation_index", pa.float64()),
    ("slope_deg", pa.float64()),
    ("risk", pa.float64(), False),  # 0..1
    ("cluster_id", pa.int64()),  # null when the cell is in no cluster
)
STORM_CLUSTERS = _schema(
    ("cluster_id", pa.int64(), False),  # 1.. within the partition, ordered by outages desc
    ("cell_count", pa.int64(), False),
    ("outages", pa.int64(), False),
    ("customers_out", pa.int64(), False),
    ("center_lat", pa.float64(), False),
    ("center_lon", pa.float64(), False),
    ("peak_hour", pa.int32(), False),
    ("max_gust_ms", pa.float64()),
    ("mean_risk", pa.float64(), False),
    ("cell_ids", pa.list_(pa.string()), False),
)

# ---- present ---------------------------------------------------------------------------
REGION_DAY_SUMMARY = _schema(
    ("outages", pa.int64(), False),
    ("customers_out", pa.int64(), False),
    ("customers_served", pa.int64(), False),
    ("affected_pct", pa.float64(), False),
    ("cells_affected", pa.int64(), False),
    ("clusters", pa.int64(), False),
    ("peak_hour", pa.int32()),
    ("max_gust_ms", pa.float64()),
    ("total_rain_mm", pa.float64()),
    ("restored", pa.int64(), False),
    ("backlog", pa.int64(), False),  # outages not restored by the end of the day
    ("backlog_customers", pa.int64(), False),
    ("median_restoration_min", pa.float64()),
    ("quarantined_rows", pa.int64(), False),
    ("max_risk", pa.float64()),
    ("top_feeders", pa.string(), False),  # JSON list of {feeder_id, outages, customers_out}
    ("signal_quality", pa.string(), False),  # high | medium | low | noisy (assets.quality)
)

#: table name -> its Arrow schema. Which phase writes a table is declared once, by the phase
#: (``assets.phases.Phase.tables``, looked up through ``TABLE_PHASE``).
SCHEMAS: dict[str, pa.Schema] = {
    "outages_raw": OUTAGES_RAW,
    "weather_raw": WEATHER_RAW,
    "customers_ref": CUSTOMERS_REF,
    "terrain_ref": TERRAIN_REF,
    "quarantine": QUARANTINE,
    "outages_enriched": OUTAGES_ENRICHED,
    "cell_hour_stats": CELL_HOUR_STATS,
    "cell_risk": CELL_RISK,
    "storm_clusters": STORM_CLUSTERS,
    "region_day_summary": REGION_DAY_SUMMARY,
}

#: table name -> what one row is (the table asset's description in Dagster's catalog)
DESCRIPTIONS: dict[str, str] = {
    "outages_raw": "One validated outage report of the batch's outages.csv.",
    "weather_raw": "One validated weather observation of the batch's weather.csv.",
    "customers_ref": "Customers per H3 cell and feeder of the batch's region, as its ingest read them.",
    "terrain_ref": "Terrain per H3 cell of the batch's region, as its ingest read it.",
    "quarantine": "One rejected landing row: file, line, field, reason and the raw text.",
    "outages_enriched": "One outage on its H3 resolution-7 cell, with the cell's customers, feeder, terrain "
                        "and the weather there in that hour.",
    "cell_hour_stats": "Outages and customers out per H3 cell and UTC hour, against the gust and rain there.",
    "cell_risk": "Risk in [0, 1] per H3 cell with outages (density, hazard, vulnerability), and its cluster.",
    "storm_clusters": "One damage cluster: anomalous cells connected through H3 adjacency.",
    "region_day_summary": "The batch's one summary row: outages, customers out, clusters, restoration, top feeders.",
}


@cache
def table_schema(table: str) -> dg.TableSchema:
    """The Dagster column schema (``dagster/column_schema``) of a table, from its Arrow schema above.

    A column's type is the Arrow type as Arrow prints it (``timestamp[us, tz=UTC]``,
    ``list<item: string>``); a non-nullable field is marked ``nullable=False``.
    """
    import dagster as dg  # here: this module is imported by commands that never load Dagster

    schema = SCHEMAS[table]
    return dg.TableSchema(columns=[
        dg.TableColumn(
            name=f.name,
            type=str(f.type),
            description="partition column" if f.name in PARTITION_COLUMNS else None,
            constraints=dg.TableColumnConstraints(nullable=f.nullable),
        )
        for f in schema
    ])
