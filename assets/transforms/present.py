"""The present phase's pure transforms: the region-day summary row and the published artifacts.

:func:`summarize` turns the partition's enriched outages, correlation tables and reference data
into the single ``REGION_DAY_SUMMARY`` row. :func:`render_artifacts` turns that row and the
tables behind it into the three published files of contract section 6.

Artifacts are byte-for-byte deterministic for the same inputs (their sha256 is the artifact id
and a re-run with unchanged inputs must deliver nothing): no clock, no random ids, no version
stamps; rows are sorted before use; floats are rounded to fixed decimals; JSON is written with
sorted keys and fixed separators. The pictures (SVG) come from :mod:`assets.transforms.pictures`; the
page is ``templates/report.html.j2``, rendered through :mod:`assets.transforms.pages`.

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

import datetime as dt
import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import h3
import jinja2
import markupsafe
import numpy as np
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
from assets.transforms.enrich import group_sum, utc
from assets.transforms.pages import html_escaped, page_environment
from assets.transforms.pictures import render_hourly_svg, render_map_svg
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
    restored_at = utc(enriched["restored_at"])
    return restored_at.notna() & (restored_at <= _day_end(day))


def _top_feeders(enriched: pd.DataFrame) -> list[dict[str, Any]]:
    """The :data:`TOP_FEEDERS` feeders with most customers out (then most outages, then id)."""
    code, feeders = pd.factorize(enriched["feeder_id"], sort=True)  # a null feeder: code -1
    known = code >= 0
    if not known.any():
        return []
    code = code[known]
    outages = np.bincount(code, minlength=len(feeders))
    customers_out = group_sum(code, enriched["customers_out"].to_numpy(dtype=np.int64)[known], len(feeders))
    seen = np.flatnonzero(outages)
    top = seen[np.lexsort((seen, -outages[seen], -customers_out[seen]))][:TOP_FEEDERS]
    return [{"feeder_id": str(feeders[i]), "outages": int(outages[i]), "customers_out": int(customers_out[i])}
            for i in top.tolist()]


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
    signal_quality: str,
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
        signal_quality: The batch's grade (:func:`assets.quality.grade`).

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
    customers = _region_customers(_conform(customers, CUSTOMERS_REF, "customers_ref"), region)
    row = {
        "region_id": region.region_id,
        "day": day,
        **_impact(enriched, customers),
        "clusters": len(clusters),
        **_weather(enriched, cell_hour),
        **_restoration(enriched, day),
        "quarantined_rows": int(quarantined_rows),
        "max_risk": _max(cell_risk["risk"]),
        "top_feeders": json.dumps(_top_feeders(enriched), sort_keys=True, separators=(",", ":")),
        "signal_quality": signal_quality,
    }
    return _summary_frame(row)


def _region_customers(customers: pd.DataFrame, region: Region) -> pd.DataFrame:
    """The reference rows of ``region``: the snapshot is per partition, but a multi-region frame
    must not inflate the customers served."""
    if "region_id" in customers.columns and customers["region_id"].notna().any():
        return customers[customers["region_id"] == region.region_id]
    return customers


def _impact(enriched: pd.DataFrame, customers: pd.DataFrame) -> dict[str, Any]:
    """The outages and customers out, against the customers the region serves; the cells and the
    peak hour they fell in."""
    n = len(enriched)
    customers_out = int(enriched["customers_out"].sum()) if n else 0
    served = int(customers["customers"].sum()) if len(customers) else 0
    return {
        "outages": n,
        "customers_out": customers_out,
        "customers_served": served,
        "affected_pct": float(customers_out / served * 100.0 if served > 0 else 0.0),
        "cells_affected": int(enriched["cell_id"].nunique()) if n else 0,
        "peak_hour": _peak_hour(enriched),
    }


def _peak_hour(enriched: pd.DataFrame) -> int | None:
    """The UTC hour with the most outages reported, the earliest on a tie; None without outages."""
    if not len(enriched):
        return None
    counts = enriched["hour"].astype(int).value_counts()
    return int(counts[counts == counts.max()].index.min())


def _weather(enriched: pd.DataFrame, cell_hour: pd.DataFrame) -> dict[str, Any]:
    """The strongest gust (cell-hours and outages) and the rain summed over the cell-hours."""
    rain = cell_hour["rain_mm"].astype(float)
    return {
        "max_gust_ms": _max(pd.concat([cell_hour["gust_ms"], enriched["gust_ms"]]).astype(float)),
        "total_rain_mm": float(rain.sum()) if rain.notna().any() else None,
    }


def _max(values: pd.Series) -> float | None:
    """The largest non-null value, None when there is none."""
    return _opt_float(values.max()) if values.notna().any() else None


def _restoration(enriched: pd.DataFrame, day: str) -> dict[str, Any]:
    """The outages restored by the end of the day, the backlog left open, and the median time to
    restore."""
    n = len(enriched)
    restored = _restored_mask(enriched, day) if n else pd.Series([], dtype=bool)
    backlog = enriched[~restored] if n else enriched
    return {
        "restored": int(restored.sum()) if n else 0,
        "backlog": len(backlog),
        "backlog_customers": int(backlog["customers_out"].sum()) if len(backlog) else 0,
        "median_restoration_min": _median_minutes(enriched[restored]) if n and restored.any() else None,
    }


def _median_minutes(done: pd.DataFrame) -> float:
    """Median ``restoration_min`` of restored outages, ``restored_at - reported_at`` where it is null."""
    minutes = done["restoration_min"].astype(float)
    computed = (utc(done["restored_at"]) - utc(done["reported_at"])).dt.total_seconds() / 60.0
    return float(minutes.fillna(computed).median())


def _summary_dtype(field: pa.Field) -> Any:
    if pa.types.is_floating(field.type):
        return field.type.to_pandas_dtype()
    if pa.types.is_integer(field.type):
        return "Int64" if field.type == pa.int64() else "Int32"
    return object


#: The pandas dtype of each column of the summary row: nullable integers, so that a missing
#: value stays null (not NaN-in-object) through Arrow.
_SUMMARY_DTYPES = {f.name: _summary_dtype(f) for f in REGION_DAY_SUMMARY}


def _summary_frame(row: dict[str, Any]) -> pd.DataFrame:
    """``row`` as a one-row frame with the columns of ``REGION_DAY_SUMMARY`` in order, in the
    dtypes of :data:`_SUMMARY_DTYPES`."""
    return pd.DataFrame({name: pd.array([row.get(name)], dtype=dtype) for name, dtype in _SUMMARY_DTYPES.items()})


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
        if pa.types.is_string(f.type):
            out[f.name] = str(v)
        else:
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


def _feeder_ranking(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The summary row's ``top_feeders``, decoded."""
    return json.loads(str(summary.iloc[0]["top_feeders"]) or "[]")


def _summary_json(region: Region, day: str, summary: pd.DataFrame, clusters: pd.DataFrame) -> bytes:
    doc = {
        "region": _region_json(region),
        "day": day,
        "summary": _figures(summary),
        "clusters": _cluster_records(clusters),
        "top_feeders": _feeder_ranking(summary),
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


@dataclass(frozen=True)
class _OpenOutage:
    """An outage still open when the day closed, as the report's backlog table lists it."""

    event_id: str
    reported: str  # HH:MM UTC
    cell_id: str
    feeder_id: str  # "—" when the cell has no known feeder
    cause: str
    customers_out: int
    hours_open: float  # at midnight UTC


@dataclass(frozen=True)
class _Backlog:
    """The largest open outages at the end of the day, and the count and customers of the rest."""

    listed: list[_OpenOutage]
    more: int
    more_customers: int


def _backlog(enriched: pd.DataFrame, day: str) -> _Backlog:
    """The outages open at the end of the day, largest first (then earliest, then by id)."""
    if not len(enriched):
        return _Backlog([], 0, 0)
    shown = ["event_id", "reported_at", "cell_id", "feeder_id", "cause", "customers_out"]
    open_ = enriched.loc[~_restored_mask(enriched, day).to_numpy(), shown]
    if open_.empty:
        return _Backlog([], 0, 0)
    open_ = open_.assign(reported_utc=utc(open_["reported_at"]))
    open_ = open_.sort_values(
        ["customers_out", "reported_utc", "event_id"], ascending=[False, True, True], kind="mergesort"
    )
    end = _day_end(day)
    listed = [
        _OpenOutage(
            event_id=r.event_id,
            reported=r.reported_utc.strftime("%H:%M"),
            cell_id=r.cell_id,
            feeder_id=r.feeder_id if isinstance(r.feeder_id, str) else "—",
            cause=r.cause,
            customers_out=r.customers_out,
            hours_open=(end - r.reported_utc).total_seconds() / 3600.0,
        )
        for r in open_.head(BACKLOG_ROWS).itertuples(index=False)
    ]
    rest = open_.iloc[BACKLOG_ROWS:]
    return _Backlog(listed, len(rest), int(rest["customers_out"].sum()) if len(rest) else 0)


def _integer(value: Any) -> str:
    """A count with thousands separators; a dash for null."""
    v = _opt_int(value)
    return "—" if v is None else f"{v:,}"


def _decimal(value: Any, decimals: int = 1, unit: str = "") -> str:
    """A figure rounded to ``decimals``, with thousands separators and ``unit``; a dash for null."""
    v = _rnd(value, decimals)
    return "—" if v is None else f"{v:,.{decimals}f}{unit}"


def _hour(value: Any) -> str:
    """An hour of the day as ``05:00 UTC``; a dash for null."""
    v = _opt_int(value)
    return "—" if v is None else f"{v:02d}:00 UTC"


def _degrees(value: float, pos: str, neg: str) -> str:
    """A latitude/longitude as ``29.2° N`` / ``90.6° W``."""
    return f"{abs(value):.2f}° {pos if value >= 0 else neg}"


def prepare() -> None:
    """Make now what present makes once per process (the page template), in a process about to
    fork the processes that run it (the pictures need nothing made ahead)."""
    _report_template()


@functools.cache
def _report_template() -> jinja2.Template:
    """``templates/report.html.j2``, with the page's number formats as filters; made once a process."""
    env = page_environment("assets.transforms", finalize=html_escaped)
    env.filters.update(integer=_integer, decimal=_decimal, hour=_hour, degrees=_degrees)
    return env.get_template("report.html.j2")


def _report_html(
    region: Region,
    day: str,
    summary: pd.DataFrame,
    clusters: pd.DataFrame,
    enriched: pd.DataFrame,
    map_svg: str,
    hourly_svg: str,
) -> bytes:
    """The report page: the day's figures, the two pictures, and the clusters, feeders and backlog."""
    page = _report_template().render(
        region=region,
        day=day,
        figures=_figures(summary),
        clusters=_cluster_records(clusters),
        feeders=_feeder_ranking(summary),
        backlog=_backlog(enriched, day),
        map_svg=markupsafe.Markup(map_svg),
        hourly_svg=markupsafe.Markup(hourly_svg),
    )
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
    map_svg = render_map_svg(region=region, day=day, cell_risk=cell_risk, clusters=clusters)
    hourly_svg = render_hourly_svg(region=region, day=day, enriched=enriched, cell_hour=cell_hour)
    return {
        "summary.json": _summary_json(region, day, summary, clusters),
        "clusters.geojson": _clusters_geojson(region, day, clusters),
        "report.html": _report_html(region, day, summary, clusters, enriched, map_svg, hourly_svg),
    }
