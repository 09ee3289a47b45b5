"""The present phase's pure transforms: the region-day summary row and the published artifacts.

:func:`summarize` turns the partition's enriched outages, correlation tables and reference data
into the single ``REGION_DAY_SUMMARY`` row. :func:`render_artifacts` turns that row and the
tables behind it into the three published files of contract section 6.

Artifacts are byte-for-byte deterministic for the same inputs (their sha256 is the artifact id
and a re-run with unchanged inputs must deliver nothing): no clock, no random ids, no version
stamps; rows are sorted before use; floats are rounded to fixed decimals; JSON is written with
sorted keys and fixed separators. The pictures come from :mod:`assets.transforms.render`.

Definitions (documented here because the contract leaves them open):

* End of the day is the next UTC midnight; an outage counts as *restored* when ``restored_at``
  is set and ``<=`` that instant, otherwise it is in the *backlog* (also when it was restored
  later, after the day closed).
* ``total_rain_mm`` is the sum of ``rain_mm`` over the partition's cell-hours
  (``CELL_HOUR_STATS``), i.e. rain summed over the affected cells and hours, not per station
  (the phase does not read the station table). Null when no cell-hour has a rain value.
* ``max_gust_ms`` is the strongest gust over the cell-hours and the enriched outages.
* ``peak_hour`` is the UTC hour with the most outages reported; ties go to the earliest hour.
* ``median_restoration_min`` is taken over the restored outages, from ``restoration_min`` (or
  ``restored_at - reported_at`` where that column is null).
* ``customers_served`` sums ``customers`` over all reference rows of the region.
* ``top_feeders`` ranks feeders by ``customers_out`` desc, then outages desc, then feeder id;
  outages whose cell has no known feeder are left out of the ranking.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import math
from collections.abc import Iterable
from typing import Any

import h3
import pandas as pd
import pyarrow as pa

from assets.schemas import (
    CELL_HOUR_STATS,
    CELL_RISK,
    CUSTOMERS_REF,
    OUTAGES_ENRICHED,
    REGION_DAY_SUMMARY,
    STORM_CLUSTERS,
)
from assets.transforms.render import render_hourly_png, render_map_png
from resources.settings import Region

TOP_FEEDERS = 10
#: How many open outages the report's backlog table lists (largest first); the rest are summed.
BACKLOG_ROWS = 20
COORD_DECIMALS = 6  # ~0.1 m; plenty for hexagons of ~1.2 km edge, and keeps the file stable
FIGURE_DECIMALS = 3

# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def _conform(df: pd.DataFrame, schema: pa.Schema, what: str) -> pd.DataFrame:
    """Return ``df`` with every column of ``schema`` present.

    An empty frame may come without columns (nothing was written for the partition); it gets
    them added. A non-empty frame missing a column is a bug upstream and is reported.

    Raises:
        ValueError: ``df`` has rows but lacks a column of ``schema``.
    """
    missing = [n for n in schema.names if n not in df.columns]
    if not missing:
        return df
    if len(df):
        raise ValueError(f"{what}: missing column(s) {', '.join(missing)}")
    return schema.empty_table().to_pandas()


def _utc(series: pd.Series) -> pd.Series:
    """Timestamps as tz-aware UTC (naive values are taken to be UTC already)."""
    return pd.to_datetime(series, utc=True)


def _day_end(day: str) -> pd.Timestamp:
    """The instant the partition's UTC day closes: the next midnight."""
    return pd.Timestamp(dt.date.fromisoformat(day) + dt.timedelta(days=1), tz="UTC")


def _opt_float(value: Any) -> float | None:
    """``value`` as a float, or None for null/NaN."""
    if value is None or value is pd.NA:
        return None
    f = float(value)
    return None if math.isnan(f) else f


def _rnd(value: Any, decimals: int = FIGURE_DECIMALS) -> float | None:
    """Round for publication; ``+ 0.0`` turns a ``-0.0`` into ``0.0`` so it prints the same."""
    f = _opt_float(value)
    return None if f is None else round(f, decimals) + 0.0


def _opt_int(value: Any) -> int | None:
    f = _opt_float(value)
    return None if f is None else int(f)


def _dumps(obj: Any, *, indent: int | None) -> bytes:
    """Canonical JSON: sorted keys, fixed separators, no NaN, UTF-8, trailing newline."""
    seps = (",", ": ") if indent else (",", ":")
    text = json.dumps(
        obj, sort_keys=True, separators=seps, indent=indent, ensure_ascii=False, allow_nan=False
    )
    return (text + "\n").encode("utf-8")


def _restored_mask(enriched: pd.DataFrame, day: str) -> pd.Series:
    restored_at = _utc(enriched["restored_at"])
    return restored_at.notna() & (restored_at <= _day_end(day))


def _top_feeders(enriched: pd.DataFrame) -> list[dict[str, Any]]:
    known = enriched[enriched["feeder_id"].notna()]
    if known.empty:
        return []
    grouped = (
        known.groupby("feeder_id", sort=True)
        .agg(outages=("event_id", "size"), customers_out=("customers_out", "sum"))
        .reset_index()
        .sort_values(
            ["customers_out", "outages", "feeder_id"], ascending=[False, False, True], kind="mergesort"
        )
        .head(TOP_FEEDERS)
    )
    return [
        {"feeder_id": str(r.feeder_id), "outages": int(r.outages), "customers_out": int(r.customers_out)}
        for r in grouped.itertuples(index=False)
    ]


# ---------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------


def summarize(
    *,
    region: Region,
    day: str,
    enriched: pd.DataFrame,
    cell_hour: pd.DataFrame,
    cell_risk: pd.DataFrame,
    clusters: pd.DataFrame,
    customers: pd.DataFrame,
    quarantined_rows: int,
) -> pd.DataFrame:
    """Compute the partition's ``REGION_DAY_SUMMARY`` row (definitions in the module docstring).

    Args:
        region: The partition's region.
        day: The partition's UTC day, ``YYYY-MM-DD``.
        enriched: Rows of ``OUTAGES_ENRICHED`` for the partition.
        cell_hour: Rows of ``CELL_HOUR_STATS``.
        cell_risk: Rows of ``CELL_RISK``.
        clusters: Rows of ``STORM_CLUSTERS``.
        customers: Rows of ``CUSTOMERS_REF`` (the reference snapshot the partition used).
        quarantined_rows: Rows ingest quarantined for the partition.

    Returns:
        One row with exactly the columns of ``REGION_DAY_SUMMARY`` in order, convertible with
        ``pa.Table.from_pandas(df, schema=REGION_DAY_SUMMARY, preserve_index=False)``.

    Raises:
        ValueError: a non-empty input lacks a column of its schema, or ``day`` is not a date.
    """
    enriched = _conform(enriched, OUTAGES_ENRICHED, "outages_enriched")
    cell_hour = _conform(cell_hour, CELL_HOUR_STATS, "cell_hour_stats")
    cell_risk = _conform(cell_risk, CELL_RISK, "cell_risk")
    clusters = _conform(clusters, STORM_CLUSTERS, "storm_clusters")
    customers = _conform(customers, CUSTOMERS_REF, "customers_ref")
    # The snapshot is per partition, but filter anyway so a multi-region frame cannot inflate it.
    if "region_id" in customers.columns and customers["region_id"].notna().any():
        customers = customers[customers["region_id"] == region.region_id]

    n = len(enriched)
    customers_out = int(enriched["customers_out"].sum()) if n else 0
    served = int(customers["customers"].sum()) if len(customers) else 0
    affected_pct = customers_out / served * 100.0 if served > 0 else 0.0

    peak_hour: int | None = None
    if n:
        counts = enriched["hour"].astype(int).value_counts()
        peak_hour = int(counts[counts == counts.max()].index.min())

    gusts = pd.concat([cell_hour["gust_ms"], enriched["gust_ms"]]).astype(float)
    rain = cell_hour["rain_mm"].astype(float)
    restored = _restored_mask(enriched, day) if n else pd.Series([], dtype=bool)
    backlog = enriched[~restored] if n else enriched

    median_min: float | None = None
    if n and restored.any():
        done = enriched[restored]
        minutes = done["restoration_min"].astype(float)
        computed = (_utc(done["restored_at"]) - _utc(done["reported_at"])).dt.total_seconds() / 60.0
        median_min = float(minutes.fillna(computed).median())

    row = {
        "region_id": region.region_id,
        "day": day,
        "outages": n,
        "customers_out": customers_out,
        "customers_served": served,
        "affected_pct": float(affected_pct),
        "cells_affected": int(enriched["cell_id"].nunique()) if n else 0,
        "clusters": len(clusters),
        "peak_hour": peak_hour,
        "max_gust_ms": _opt_float(gusts.max()) if gusts.notna().any() else None,
        "total_rain_mm": float(rain.sum()) if rain.notna().any() else None,
        "restored": int(restored.sum()) if n else 0,
        "backlog": len(backlog),
        "backlog_customers": int(backlog["customers_out"].sum()) if len(backlog) else 0,
        "median_restoration_min": median_min,
        "quarantined_rows": int(quarantined_rows),
        "max_risk": _opt_float(cell_risk["risk"].max()) if cell_risk["risk"].notna().any() else None,
        "top_feeders": json.dumps(_top_feeders(enriched), sort_keys=True, separators=(",", ":")),
    }
    out = pd.DataFrame([row], columns=REGION_DAY_SUMMARY.names)
    # Nullable dtypes so a missing value stays null (not NaN-in-object) through Arrow.
    out = out.astype(
        {f.name: f.type.to_pandas_dtype() for f in REGION_DAY_SUMMARY if pa.types.is_floating(f.type)}
    )
    out = out.astype(
        {
            f.name: "Int64" if f.type == pa.int64() else "Int32"
            for f in REGION_DAY_SUMMARY
            if pa.types.is_integer(f.type)
        }
    )
    return out


# ---------------------------------------------------------------------------------------
# artifacts
# ---------------------------------------------------------------------------------------


def _figures(summary: pd.DataFrame) -> dict[str, Any]:
    """The summary row as plain JSON values, floats rounded."""
    if len(summary) != 1:
        raise ValueError(f"summary: expected one row, got {len(summary)}")
    rec = summary.iloc[0]
    out: dict[str, Any] = {}
    for f in REGION_DAY_SUMMARY:
        if f.name in ("region_id", "day", "top_feeders"):
            continue
        v = rec[f.name]
        out[f.name] = _opt_int(v) if pa.types.is_integer(f.type) else _rnd(v)
    return out


def _cluster_records(clusters: pd.DataFrame) -> list[dict[str, Any]]:
    """Clusters sorted by id, as JSON-ready dicts (cell ids sorted)."""
    if clusters.empty:
        return []
    out = []
    for r in clusters.sort_values("cluster_id", kind="mergesort").itertuples(index=False):
        cells = sorted(str(c) for c in (r.cell_ids if r.cell_ids is not None else []))
        out.append(
            {
                "cluster_id": int(r.cluster_id),
                "cell_count": int(r.cell_count),
                "cells": cells,
                "outages": int(r.outages),
                "customers_out": int(r.customers_out),
                "center": {
                    "lat": _rnd(r.center_lat, COORD_DECIMALS),
                    "lon": _rnd(r.center_lon, COORD_DECIMALS),
                },
                "peak_hour": _opt_int(r.peak_hour),
                "max_gust_ms": _rnd(r.max_gust_ms),
                "mean_risk": _rnd(r.mean_risk),
            }
        )
    return out


def _region_json(region: Region) -> dict[str, Any]:
    return {
        "id": region.region_id,
        "name": region.name,
        "box": {
            "min_lat": region.min_lat,
            "max_lat": region.max_lat,
            "min_lon": region.min_lon,
            "max_lon": region.max_lon,
        },
    }


def _summary_json(region: Region, day: str, summary: pd.DataFrame, clusters: pd.DataFrame) -> bytes:
    feeders = json.loads(str(summary.iloc[0]["top_feeders"]) or "[]")
    doc = {
        "region": _region_json(region),
        "day": day,
        "summary": _figures(summary),
        "clusters": _cluster_records(clusters),
        "top_feeders": feeders,
    }
    return _dumps(doc, indent=2)


def _round_coords(obj: Any) -> Any:
    """Nested coordinate tuples -> lists of rounded floats."""
    if isinstance(obj, (tuple, list)) and obj and isinstance(obj[0], (int, float)):
        return [_rnd(x, COORD_DECIMALS) for x in obj]
    return [_round_coords(x) for x in obj]


def _cluster_geometry(cells: Iterable[str]) -> dict[str, Any] | None:
    """Outline of the union of ``cells`` as a GeoJSON Polygon/MultiPolygon.

    h3 returns lon/lat rings that are closed, exterior counter-clockwise and holes clockwise,
    i.e. already in RFC 7946's right-hand-rule order. Rounding keeps the rings closed because the
    first and last vertex round identically.
    """
    cells = sorted(set(cells))
    if not cells:
        return None  # RFC 7946 allows a null geometry for an unlocated feature
    geo = h3.cells_to_geo(cells)
    return {"type": geo["type"], "coordinates": _round_coords(geo["coordinates"])}


def _clusters_geojson(region: Region, day: str, clusters: pd.DataFrame) -> bytes:
    features = []
    for rec in _cluster_records(clusters):
        features.append(
            {
                "type": "Feature",
                "id": rec["cluster_id"],
                "geometry": _cluster_geometry(rec["cells"]),
                "properties": {
                    "cluster_id": rec["cluster_id"],
                    "cell_count": rec["cell_count"],
                    "outages": rec["outages"],
                    "customers_out": rec["customers_out"],
                    "peak_hour": rec["peak_hour"],
                    "max_gust_ms": rec["max_gust_ms"],
                    "mean_risk": rec["mean_risk"],
                    "center_lat": rec["center"]["lat"],
                    "center_lon": rec["center"]["lon"],
                },
            }
        )
    doc = {
        "type": "FeatureCollection",
        "region_id": region.region_id,  # foreign members (RFC 7946 section 6.1)
        "day": day,
        "features": features,
    }
    return _dumps(doc, indent=None)


# ---- report.html ------------------------------------------------------------------------

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;background:#f4f5f7;color:#1c1e21}
main{max-width:960px;margin:0 auto;padding:24px}
h1{font-size:1.6em;margin:0 0 4px}h2{font-size:1.2em;margin:28px 0 8px;border-bottom:1px solid #d0d4da;padding-bottom:4px}
.sub{color:#555;margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:10px}
.card{background:#fff;border:1px solid #d0d4da;border-radius:6px;padding:10px 12px}
.card .v{font-size:1.35em;font-weight:600}.card .k{color:#555;font-size:.85em}
figure{background:#fff;border:1px solid #d0d4da;border-radius:6px;margin:12px 0;padding:8px}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{color:#555;font-size:.85em;margin-top:4px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:.9em}
th,td{border:1px solid #d0d4da;padding:4px 8px;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
th{background:#e9ecf0}.empty{color:#555;font-style:italic}
footer{color:#777;font-size:.8em;margin-top:32px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt_int(value: Any) -> str:
    v = _opt_int(value)
    return "—" if v is None else f"{v:,}"


def _fmt_float(value: Any, decimals: int = 1, unit: str = "") -> str:
    v = _rnd(value, decimals)
    return "—" if v is None else f"{v:,.{decimals}f}{unit}"


def _fmt_hour(value: Any) -> str:
    v = _opt_int(value)
    return "—" if v is None else f"{v:02d}:00 UTC"


def _deg(value: float, pos: str, neg: str) -> str:
    """A latitude/longitude as ``29.2° N`` / ``90.6° W``."""
    return f"{abs(value):.2f}° {pos if value >= 0 else neg}"


def _table(headers: list[tuple[str, bool]], rows: list[list[str]], empty: str) -> str:
    """An HTML table; ``headers`` are (label, numeric); cells are already escaped."""
    if not rows:
        return f'<p class="empty">{_e(empty)}</p>'
    head = "".join(f'<th class="n">{_e(h)}</th>' if num else f"<th>{_e(h)}</th>" for h, num in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{c}</td>' if num else f"<td>{c}</td>"
            for c, (_, num) in zip(r, headers, strict=True)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _backlog_rows(enriched: pd.DataFrame, day: str) -> tuple[list[list[str]], int, int]:
    """Largest open outages at the end of the day; returns (rows, not-listed count, their customers)."""
    if enriched.empty:
        return [], 0, 0
    open_ = enriched[~_restored_mask(enriched, day)].copy()
    if open_.empty:
        return [], 0, 0
    open_["reported_utc"] = _utc(open_["reported_at"])
    open_ = open_.sort_values(
        ["customers_out", "reported_utc", "event_id"], ascending=[False, True, True], kind="mergesort"
    )
    end = _day_end(day)
    rows = []
    for r in open_.head(BACKLOG_ROWS).itertuples(index=False):
        hours_open = (end - r.reported_utc).total_seconds() / 3600.0
        rows.append(
            [
                _e(r.event_id),
                _e(r.reported_utc.strftime("%H:%M")),
                _e(r.cell_id),
                _e(r.feeder_id if isinstance(r.feeder_id, str) else "—"),
                _e(r.cause),
                _fmt_int(r.customers_out),
                _fmt_float(hours_open, 1),
            ]
        )
    rest = open_.iloc[BACKLOG_ROWS:]
    return rows, len(rest), int(rest["customers_out"].sum()) if len(rest) else 0


def _report_html(
    region: Region,
    day: str,
    summary: pd.DataFrame,
    clusters: pd.DataFrame,
    enriched: pd.DataFrame,
    map_png: bytes,
    hourly_png: bytes,
) -> bytes:
    fig = _figures(summary)
    feeders = json.loads(str(summary.iloc[0]["top_feeders"]) or "[]")
    cards = [
        ("Outages", _fmt_int(fig["outages"])),
        ("Customers out", _fmt_int(fig["customers_out"])),
        ("Share of customers affected", _fmt_float(fig["affected_pct"], 2, " %")),
        ("Customers served", _fmt_int(fig["customers_served"])),
        ("Cells affected", _fmt_int(fig["cells_affected"])),
        ("Storm clusters", _fmt_int(fig["clusters"])),
        ("Peak hour", _fmt_hour(fig["peak_hour"])),
        ("Max wind gust", _fmt_float(fig["max_gust_ms"], 1, " m/s")),
        ("Rain (sum over cell-hours)", _fmt_float(fig["total_rain_mm"], 1, " mm")),
        ("Restored by midnight", _fmt_int(fig["restored"])),
        ("Backlog at midnight", _fmt_int(fig["backlog"])),
        ("Backlog customers", _fmt_int(fig["backlog_customers"])),
        ("Median restoration", _fmt_float(fig["median_restoration_min"], 0, " min")),
        ("Max cell risk", _fmt_float(fig["max_risk"], 2)),
        ("Quarantined input rows", _fmt_int(fig["quarantined_rows"])),
    ]
    cards_html = "".join(
        f'<div class="card"><div class="v">{_e(v)}</div><div class="k">{_e(k)}</div></div>' for k, v in cards
    )

    cluster_rows = [
        [
            _e(f"C{c['cluster_id']}"),
            _fmt_int(c["cell_count"]),
            _fmt_int(c["outages"]),
            _fmt_int(c["customers_out"]),
            _e(_fmt_hour(c["peak_hour"])),
            _fmt_float(c["max_gust_ms"], 1),
            _fmt_float(c["mean_risk"], 2),
            _e(f"{c['center']['lat']:.4f}, {c['center']['lon']:.4f}"),
        ]
        for c in _cluster_records(clusters)
    ]
    clusters_tbl = _table(
        [
            ("Cluster", False),
            ("Cells", True),
            ("Outages", True),
            ("Customers out", True),
            ("Peak hour", False),
            ("Max gust (m/s)", True),
            ("Mean risk", True),
            ("Centre (lat, lon)", False),
        ],
        cluster_rows,
        "No storm clusters were found for this day.",
    )
    feeder_rows = [
        [_e(f["feeder_id"]), _fmt_int(f["outages"]), _fmt_int(f["customers_out"])] for f in feeders
    ]
    feeders_tbl = _table(
        [("Feeder", False), ("Outages", True), ("Customers out", True)],
        feeder_rows,
        "No outages on known feeders.",
    )
    b_rows, b_more, b_more_cust = _backlog_rows(enriched, day)
    backlog_tbl = _table(
        [
            ("Event", False),
            ("Reported (UTC)", False),
            ("Cell", False),
            ("Feeder", False),
            ("Cause", False),
            ("Customers out", True),
            ("Hours open at midnight", True),
        ],
        b_rows,
        "Every outage of the day was restored by midnight UTC.",
    )
    if b_more:
        backlog_tbl += f'<p class="sub">…and {b_more:,} more open outages with {b_more_cust:,} customers.</p>'

    title = f"Storm outage report — {region.name}, {day}"
    box = f"{_deg(region.min_lat, 'N', 'S')} – {_deg(region.max_lat, 'N', 'S')}, {_deg(region.min_lon, 'E', 'W')} – {_deg(region.max_lon, 'E', 'W')}"
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<main>
<h1>{_e(title)}</h1>
<p class="sub">Region <code>{_e(region.region_id)}</code> · box {_e(box)} · all times UTC</p>
<section class="cards">{cards_html}</section>
<h2>Where: risk by cell</h2>
<figure>{_img(map_png, f"Map of {region.name} cells coloured by outage risk with storm clusters outlined")}
<figcaption>Each hexagon is an H3 resolution-7 cell, coloured by its risk score (0–1). Outlined areas are storm clusters, labelled as in the table below; the dashed frame is the region box.</figcaption></figure>
<h2>When: outages per hour</h2>
<figure>{_img(hourly_png, "Outages reported per hour with the maximum wind gust")}
<figcaption>Bars: outages reported in each UTC hour. Line: strongest gust measured at any affected cell in that hour.</figcaption></figure>
<h2>Storm clusters</h2>
{clusters_tbl}
<h2>Top feeders by customers out</h2>
{feeders_tbl}
<h2>Restoration backlog at midnight UTC</h2>
<p class="sub">{_e(_fmt_int(fig["backlog"]))} outages with {_e(_fmt_int(fig["backlog_customers"]))} customers were still open when the day closed; the largest are listed.</p>
{backlog_tbl}
<footer>stormlake · present phase · region-day {_e(region.region_id)}/{_e(day)}</footer>
</main>
</body>
</html>
"""
    return page.encode("utf-8")


def render_artifacts(
    *,
    region: Region,
    day: str,
    summary: pd.DataFrame,
    cell_hour: pd.DataFrame,
    cell_risk: pd.DataFrame,
    clusters: pd.DataFrame,
    enriched: pd.DataFrame,
) -> dict[str, bytes]:
    """Render the partition's published artifacts (contract section 6).

    Args:
        region: The partition's region.
        day: The partition's UTC day.
        summary: The one-row frame from :func:`summarize`.
        cell_hour: Rows of ``CELL_HOUR_STATS``.
        cell_risk: Rows of ``CELL_RISK``.
        clusters: Rows of ``STORM_CLUSTERS``.
        enriched: Rows of ``OUTAGES_ENRICHED``.

    Returns:
        ``{"summary.json": ..., "clusters.geojson": ..., "report.html": ...}``; the bytes are a
        pure function of the arguments.

    Raises:
        ValueError: ``summary`` is not one row, or a non-empty input lacks a column.
    """
    cell_hour = _conform(cell_hour, CELL_HOUR_STATS, "cell_hour_stats")
    cell_risk = _conform(cell_risk, CELL_RISK, "cell_risk")
    clusters = _conform(clusters, STORM_CLUSTERS, "storm_clusters")
    enriched = _conform(enriched, OUTAGES_ENRICHED, "outages_enriched")
    map_png = render_map_png(region=region, day=day, cell_risk=cell_risk, clusters=clusters)
    hourly_png = render_hourly_png(region=region, day=day, enriched=enriched, cell_hour=cell_hour)
    return {
        "summary.json": _summary_json(region, day, summary, clusters),
        "clusters.geojson": _clusters_geojson(region, day, clusters),
        "report.html": _report_html(region, day, summary, clusters, enriched, map_png, hourly_png),
    }
