"""Unit tests of the present phase's summary and artifacts (assets/transforms/present.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import h3
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from PIL import Image

from assets.schemas import (
    CELL_HOUR_STATS,
    CELL_RISK,
    CUSTOMERS_REF,
    OUTAGES_ENRICHED,
    REGION_DAY_SUMMARY,
    STORM_CLUSTERS,
)
from assets.transforms import pictures
from assets.transforms.pictures import render_hourly_svg, render_map_svg
from assets.transforms.present import render_artifacts, summarize
from assets.transforms.render import DPI, encode_png
from resources.publisher import ARTIFACT_KINDS
from resources.settings import Region

REPO = Path(__file__).resolve().parents[2]
DAY = "2026-09-01"
REGION = Region("gulf_coast", "Gulf Coast", 29.20, 30.20, -90.60, -89.40)
UTC = "UTC"



def _cell_hours(enr: pd.DataFrame) -> pd.DataFrame:
    """The cell-hour table the present phase receives, built from hand-made outages."""
    return (
        enr.groupby(["cell_id", "hour"], sort=True)
        .agg(
            outages=("event_id", "size"),
            customers_out=("customers_out", "sum"),
            cell_customers=("cell_customers", "first"),
            gust_ms=("gust_ms", "max"),
            rain_mm=("rain_mm", "max"),
        )
        .reset_index()
    )

def _ts(text: str | None) -> pd.Timestamp | None:
    return None if text is None else pd.Timestamp(text, tz=UTC)


def _frame(rows: list[dict], schema: pa.Schema) -> pd.DataFrame:
    """Rows -> a frame typed as a Delta read of ``schema`` would be."""
    if not rows:
        return schema.empty_table().to_pandas()
    return pa.Table.from_pylist(rows, schema=schema).to_pandas()


def build_inputs(region: Region = REGION, day: str = DAY) -> dict[str, pd.DataFrame]:
    """A small storm: a 7-cell cluster near (29.7, -90.0), a 1-cell cluster at (29.5, -90.3).

    Expected figures are asserted in the tests below; change both together.
    """
    centre = h3.latlng_to_cell(29.7, -90.0, 7)
    storm = sorted(h3.grid_disk(centre, 1))  # 7 cells
    lone = h3.latlng_to_cell(29.5, -90.3, 7)
    quiet = sorted(set(h3.grid_disk(centre, 3)) - set(storm))  # cells with customers, no outages
    all_cells = sorted({*storm, lone, *quiet})

    base = {"region_id": region.region_id, "day": day}
    customers = []
    for i, cell in enumerate(all_cells):
        customers.append(
            {
                **base,
                "cell_id": cell,
                "feeder_id": f"F{i % 5:02d}",
                "customers": 100,
                "source_line": 2 * i + 2,
            }
        )
        customers.append(
            {
                **base,
                "cell_id": cell,
                "feeder_id": f"F{(i + 1) % 5:02d}",
                "customers": 50,
                "source_line": 2 * i + 3,
            }
        )
    feeder_of = {c: f"F{i % 5:02d}" for i, c in enumerate(all_cells)}

    # (event, reported, restored, cell, customers_out, gust, rain)
    spec = [
        ("E01", "2026-09-01T03:10:00Z", "2026-09-01T05:10:00Z", storm[0], 120, 31.0, 4.0),
        ("E02", "2026-09-01T03:40:00Z", "2026-09-01T04:10:00Z", storm[1], 80, 29.5, 3.0),
        ("E03", "2026-09-01T05:05:00Z", None, storm[2], 300, 33.5, 6.0),
        (
            "E04",
            "2026-09-01T05:15:00Z",
            "2026-09-02T00:00:00Z",
            storm[3],
            40,
            33.5,
            6.0,
        ),  # restored at midnight
        (
            "E05",
            "2026-09-01T05:50:00Z",
            "2026-09-02T02:00:00Z",
            storm[4],
            60,
            34.2,
            7.5,
        ),  # restored after midnight
        ("E06", "2026-09-01T12:00:00Z", "2026-09-01T13:30:00Z", storm[5], 10, 20.0, 1.0),
        ("E07", "2026-09-01T22:30:00Z", None, storm[6], 25, 18.0, 0.5),
        ("E08", "2026-09-01T03:55:00Z", "2026-09-01T06:55:00Z", lone, 15, 27.0, 2.0),
        ("E09", "2026-09-01T12:20:00Z", "2026-09-01T12:50:00Z", storm[0], 5, 21.0, 1.5),
    ]
    enriched = []
    for ev, rep, res, cell, cust, gust, rain in spec:
        r_at, s_at = _ts(rep), _ts(res)
        lat, lon = h3.cell_to_latlng(cell)
        enriched.append(
            {
                **base,
                "event_id": ev,
                "reported_at": r_at,
                "restored_at": s_at,
                "hour": r_at.hour,
                "lat": lat,
                "lon": lon,
                "cell_id": cell,
                "customers_out": cust,
                "cause": "wind & <trees>",
                "feeder_id": feeder_of[cell],
                "cell_customers": 150,
                "elevation_m": 2.0,
                "slope_deg": 0.5,
                "vegetation_index": 0.6,
                "flood_zone": False,
                "gust_ms": gust,
                "rain_mm": rain,
                "restoration_min": None if s_at is None else (s_at - r_at).total_seconds() / 60.0,
            }
        )
    enr = pd.DataFrame(enriched)
    ch = _cell_hours(enr)
    cell_hour = [{**base, **r} for r in ch.to_dict("records")]

    cluster_of = {c: 1 for c in storm} | {lone: 2}
    per_cell = enr.groupby("cell_id").agg(
        outages=("event_id", "size"),
        customers_out=("customers_out", "sum"),
        gust=("gust_ms", "max"),
        rain=("rain_mm", "sum"),
    )
    cell_risk = []
    for i, cell in enumerate(all_cells):
        lat, lon = h3.cell_to_latlng(cell)
        st = per_cell.loc[cell] if cell in per_cell.index else None
        outages = int(st.outages) if st is not None else 0
        cust = int(st.customers_out) if st is not None else 0
        cell_risk.append(
            {
                **base,
                "cell_id": cell,
                "lat": lat,
                "lon": lon,
                "outages": outages,
                "customers_out": cust,
                "cell_customers": 150,
                "affected_pct": cust / 150 * 100,
                "max_gust_ms": None if st is None else float(st.gust),
                "total_rain_mm": None if st is None else float(st.rain),
                "vegetation_index": 0.6,
                "slope_deg": 0.5,
                "risk": min(1.0, 0.05 + 0.2 * outages + (i % 7) / 40),
                "cluster_id": cluster_of.get(cell),
            }
        )
    clusters = [
        {
            **base,
            "cluster_id": 1,
            "cell_count": 7,
            "outages": 8,
            "customers_out": 640,
            "center_lat": float(np.mean([h3.cell_to_latlng(c)[0] for c in storm])),
            "center_lon": float(np.mean([h3.cell_to_latlng(c)[1] for c in storm])),
            "peak_hour": 5,
            "max_gust_ms": 34.2,
            "mean_risk": 0.4567891,
            "cell_ids": list(reversed(storm)),
        },
        {
            **base,
            "cluster_id": 2,
            "cell_count": 1,
            "outages": 1,
            "customers_out": 15,
            "center_lat": h3.cell_to_latlng(lone)[0],
            "center_lon": h3.cell_to_latlng(lone)[1],
            "peak_hour": 3,
            "max_gust_ms": 27.0,
            "mean_risk": 0.3,
            "cell_ids": [lone],
        },
    ]
    return {
        "enriched": _frame(enriched, OUTAGES_ENRICHED),
        "cell_hour": _frame(cell_hour, CELL_HOUR_STATS),
        "cell_risk": _frame(cell_risk, CELL_RISK),
        "clusters": _frame(clusters, STORM_CLUSTERS),
        "customers": _frame(customers, CUSTOMERS_REF),
    }


def build_large_inputs(region: Region = REGION, day: str = DAY, seed: int = 7) -> dict[str, pd.DataFrame]:
    """Every res-7 cell of the region box (~2,400), a few thousand outages, three clusters."""
    rng = np.random.default_rng(seed)
    poly = h3.LatLngPoly(
        [
            (region.min_lat, region.min_lon),
            (region.min_lat, region.max_lon),
            (region.max_lat, region.max_lon),
            (region.max_lat, region.min_lon),
        ]
    )
    cells = sorted(h3.h3shape_to_cells(poly, 7))
    latlng = np.array([h3.cell_to_latlng(c) for c in cells])
    base = {"region_id": region.region_id, "day": day}
    storms = [(29.75, -90.1, 0.12), (29.45, -89.7, 0.08), (30.0, -89.6, 0.05)]
    risk = np.zeros(len(cells))
    for lat, lon, s in storms:
        risk += np.exp(-(((latlng[:, 0] - lat) ** 2 + (latlng[:, 1] - lon) ** 2) / (2 * s * s)))
    risk = np.clip(risk + rng.uniform(0, 0.08, len(cells)), 0, 1)
    customers = [
        {
            **base,
            "cell_id": c,
            "feeder_id": f"F{i % 40:03d}",
            "customers": int(rng.integers(50, 900)),
            "source_line": i + 2,
        }
        for i, c in enumerate(cells)
    ]
    enriched = []
    day_start = pd.Timestamp(day, tz=UTC)
    for k in range(3000):
        i = int(rng.choice(len(cells), p=risk / risk.sum()))
        # the storm peaks in the early morning
        rep = day_start + pd.Timedelta(minutes=int(np.clip(rng.normal(7 * 60, 240), 0, 24 * 60 - 1)))
        res = rep + pd.Timedelta(minutes=int(rng.integers(20, 900))) if rng.random() < 0.85 else None
        enriched.append(
            {
                **base,
                "event_id": f"E{k:05d}",
                "reported_at": rep,
                "restored_at": res,
                "hour": rep.hour,
                "lat": latlng[i, 0],
                "lon": latlng[i, 1],
                "cell_id": cells[i],
                "customers_out": int(rng.integers(1, 400)),
                "cause": "wind",
                "feeder_id": f"F{i % 40:03d}",
                "cell_customers": 500,
                "elevation_m": 1.0,
                "slope_deg": 1.0,
                "vegetation_index": 0.5,
                "flood_zone": False,
                "gust_ms": float(12 + 28 * risk[i] * np.exp(-(((rep.hour - 7) / 6) ** 2))),
                "rain_mm": float(10 * risk[i]),
                "restoration_min": None if res is None else (res - rep).total_seconds() / 60.0,
            }
        )
    enr = pd.DataFrame(enriched)
    ch = _cell_hours(enr)
    cell_risk, clusters = [], []
    members: dict[int, list[str]] = {}
    for j, (lat, lon, s) in enumerate(storms, start=1):
        d = np.hypot(latlng[:, 0] - lat, latlng[:, 1] - lon)
        members[j] = [cells[i] for i in np.flatnonzero(d < 1.3 * s)]
    cid = {c: j for j, cs in members.items() for c in cs}
    for i, c in enumerate(cells):
        cell_risk.append(
            {
                **base,
                "cell_id": c,
                "lat": latlng[i, 0],
                "lon": latlng[i, 1],
                "outages": 0,
                "customers_out": 0,
                "cell_customers": 500,
                "affected_pct": 0.0,
                "max_gust_ms": None,
                "total_rain_mm": None,
                "vegetation_index": 0.5,
                "slope_deg": 1.0,
                "risk": float(risk[i]),
                "cluster_id": cid.get(c),
            }
        )
    for j, (lat, lon, _) in enumerate(storms, start=1):
        clusters.append(
            {
                **base,
                "cluster_id": j,
                "cell_count": len(members[j]),
                "outages": 100 // j,
                "customers_out": 5000 // j,
                "center_lat": lat,
                "center_lon": lon,
                "peak_hour": 4 + j,
                "max_gust_ms": 30.0 + j,
                "mean_risk": 0.5,
                "cell_ids": members[j],
            }
        )
    return {
        "enriched": _frame(enriched, OUTAGES_ENRICHED),
        "cell_hour": _frame([{**base, **r} for r in ch.to_dict("records")], CELL_HOUR_STATS),
        "cell_risk": _frame(cell_risk, CELL_RISK),
        "clusters": _frame(clusters, STORM_CLUSTERS),
        "customers": _frame(customers, CUSTOMERS_REF),
    }


def run_all(
    inputs: dict[str, pd.DataFrame], region: Region = REGION, day: str = DAY, quarantined_rows: int = 3
) -> tuple[pd.DataFrame, dict[str, bytes]]:
    summary = summarize(region=region, day=day, quarantined_rows=quarantined_rows, signal_quality="high", **inputs)
    arts = render_artifacts(
        region=region,
        day=day,
        summary=summary,
        cell_hour=inputs["cell_hour"],
        cell_risk=inputs["cell_risk"],
        clusters=inputs["clusters"],
        enriched=inputs["enriched"],
    )
    return summary, arts


def _digests(arts: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in sorted(arts.items())}


def _empty_inputs() -> dict[str, pd.DataFrame]:
    return {
        "enriched": OUTAGES_ENRICHED.empty_table().to_pandas(),
        "cell_hour": CELL_HOUR_STATS.empty_table().to_pandas(),
        "cell_risk": CELL_RISK.empty_table().to_pandas(),
        "clusters": STORM_CLUSTERS.empty_table().to_pandas(),
        "customers": CUSTOMERS_REF.empty_table().to_pandas(),
    }


SVG = "{http://www.w3.org/2000/svg}"


def _svgs(page: str) -> list[ET.Element]:
    """The pictures of a page: its inline ``<svg>`` elements, parsed (so each is well-formed XML)."""
    return [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", page, flags=re.S)]


def _texts(svg: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]


@pytest.fixture(scope="module")
def small() -> tuple[dict[str, pd.DataFrame], pd.DataFrame, dict[str, bytes]]:
    inputs = build_inputs()
    summary, arts = run_all(inputs)
    return inputs, summary, arts


# ---- summary ------------------------------------------------------------------------------


def test_summary_figures(small) -> None:
    inputs, summary, _ = small
    assert list(summary.columns) == REGION_DAY_SUMMARY.names
    assert len(summary) == 1
    s = summary.iloc[0]
    assert (s.region_id, s.day) == ("gulf_coast", DAY)
    assert s.outages == 9
    assert s.customers_out == 655
    n_cells = inputs["customers"]["cell_id"].nunique()
    assert s.customers_served == 150 * n_cells
    assert s.affected_pct == pytest.approx(655 / (150 * n_cells) * 100)
    assert s.cells_affected == 8
    assert s.clusters == 2
    # hours: 3 -> E01,E02,E08 (3); 5 -> E03,E04,E05 (3); 12 -> 2; 22 -> 1. Tie goes to the earlier hour.
    assert s.peak_hour == 3
    assert s.max_gust_ms == pytest.approx(34.2)
    assert s.total_rain_mm == pytest.approx(inputs["cell_hour"]["rain_mm"].sum())
    # Restored by midnight: E01, E02, E04 (exactly at midnight), E06, E08, E09. Backlog: E03 (open),
    # E05 (restored after midnight), E07 (open).
    assert s.restored == 6
    assert s.backlog == 3
    assert s.backlog_customers == 300 + 60 + 25
    assert s.median_restoration_min == pytest.approx(np.median([120, 30, 1125, 90, 180, 30]))
    assert s.quarantined_rows == 3
    assert s.max_risk == pytest.approx(inputs["cell_risk"]["risk"].max())


def test_top_feeders_ranking(small) -> None:
    inputs, summary, _ = small
    text = summary.iloc[0].top_feeders
    feeders = json.loads(text)
    enr = inputs["enriched"]
    expected = (
        enr.groupby("feeder_id")
        .agg(outages=("event_id", "size"), customers_out=("customers_out", "sum"))
        .reset_index()
        .sort_values(["customers_out", "outages", "feeder_id"], ascending=[False, False, True])
    )
    assert feeders == [
        {"customers_out": int(r.customers_out), "feeder_id": r.feeder_id, "outages": int(r.outages)}
        for r in expected.itertuples()
    ]
    assert [f["customers_out"] for f in feeders] == sorted(
        (f["customers_out"] for f in feeders), reverse=True
    )
    # compact and key-sorted
    assert text == json.dumps(feeders, sort_keys=True, separators=(",", ":"))


def test_top_feeders_keeps_ten_and_breaks_ties() -> None:
    inputs = build_inputs()
    enr = inputs["enriched"]
    rows = []
    for k in range(12):
        r = enr.iloc[0].copy()
        r["event_id"], r["feeder_id"], r["customers_out"] = (
            f"X{k:02d}",
            f"G{11 - k:02d}",
            100 if k < 4 else 10 + k,
        )
        rows.append(r)
    rows.append(rows[0].copy())
    rows[-1]["event_id"], rows[-1]["customers_out"] = "X99", 0  # G11 ties on customers, wins on outages
    inputs["enriched"] = pd.DataFrame(rows).reset_index(drop=True)
    summary = summarize(region=REGION, day=DAY, quarantined_rows=0, signal_quality="high", **inputs)
    feeders = json.loads(summary.iloc[0].top_feeders)
    assert len(feeders) == 10
    assert [f["feeder_id"] for f in feeders[:4]] == ["G11", "G08", "G09", "G10"]
    assert [f["customers_out"] for f in feeders[4:]] == [21, 20, 19, 18, 17, 16]


def test_summary_converts_to_arrow_schema(small) -> None:
    _, summary, _ = small
    for frame in (summary, summarize(region=REGION, day=DAY, quarantined_rows=0, signal_quality="high", **_empty_inputs())):
        table = pa.Table.from_pandas(frame, schema=REGION_DAY_SUMMARY, preserve_index=False)
        assert table.schema.equals(REGION_DAY_SUMMARY)
        assert table.num_rows == 1


def test_empty_inputs_summary() -> None:
    summary = summarize(region=REGION, day=DAY, quarantined_rows=0, signal_quality="high", **_empty_inputs())
    s = summary.iloc[0]
    assert (s.outages, s.customers_out, s.customers_served, s.cells_affected, s.clusters) == (0, 0, 0, 0, 0)
    assert s.affected_pct == 0.0
    assert (s.restored, s.backlog, s.backlog_customers) == (0, 0, 0)
    assert pd.isna(s.peak_hour) and pd.isna(s.max_gust_ms) and pd.isna(s.median_restoration_min)
    assert pd.isna(s.max_risk) and pd.isna(s.total_rain_mm)
    assert s.top_feeders == "[]"
    # Frames without any columns (nothing written upstream) are accepted too.
    bare = {k: pd.DataFrame() for k in _empty_inputs()}
    assert summarize(region=REGION, day=DAY, quarantined_rows=0, signal_quality="high", **bare).equals(summary)


def test_missing_column_is_reported() -> None:
    inputs = build_inputs()
    inputs["enriched"] = inputs["enriched"].drop(columns=["restored_at"])
    with pytest.raises(ValueError, match="restored_at"):
        summarize(region=REGION, day=DAY, quarantined_rows=0, signal_quality="high", **inputs)


# ---- artifacts ------------------------------------------------------------------------------


def test_artifact_keys(small) -> None:
    _, _, arts = small
    assert (
        tuple(sorted(arts))
        == tuple(sorted(ARTIFACT_KINDS))
        == ("clusters.geojson", "report.html", "summary.json")
    )
    assert all(isinstance(v, bytes) and v for v in arts.values())


def test_summary_json(small) -> None:
    _, summary, arts = small
    doc = json.loads(arts["summary.json"])
    assert doc["region"] == {
        "id": "gulf_coast",
        "name": "Gulf Coast",
        "box": {"min_lat": 29.2, "max_lat": 30.2, "min_lon": -90.6, "max_lon": -89.4},
    }
    assert doc["day"] == DAY
    assert doc["summary"]["backlog"] == 3 and doc["summary"]["peak_hour"] == 3
    assert doc["summary"]["affected_pct"] == round(float(summary.iloc[0].affected_pct), 3)
    assert [c["cluster_id"] for c in doc["clusters"]] == [1, 2]
    c1 = doc["clusters"][0]
    assert c1["mean_risk"] == 0.457 and c1["cell_count"] == 7 and c1["cells"] == sorted(c1["cells"])
    assert set(c1["center"]) == {"lat", "lon"} and c1["peak_hour"] == 5
    assert doc["top_feeders"] == json.loads(summary.iloc[0].top_feeders)
    # canonical form: re-dumping with the same settings reproduces the bytes
    assert (
        arts["summary.json"]
        == (
            json.dumps(doc, sort_keys=True, indent=2, separators=(",", ": "), ensure_ascii=False) + "\n"
        ).encode()
    )


def _rings(geometry: dict) -> list[list[list[float]]]:
    polys = [geometry["coordinates"]] if geometry["type"] == "Polygon" else geometry["coordinates"]
    return [ring for poly in polys for ring in poly]


def _signed_area(ring: list[list[float]]) -> float:
    return sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(ring, ring[1:], strict=False)) / 2


def test_clusters_geojson_valid(small) -> None:
    inputs, _, arts = small
    doc = json.loads(arts["clusters.geojson"])
    assert doc["type"] == "FeatureCollection"
    assert len(doc["features"]) == 2
    clusters = inputs["clusters"].set_index("cluster_id")
    for feat in doc["features"]:
        assert feat["type"] == "Feature"
        geom = feat["geometry"]
        assert geom["type"] in ("Polygon", "MultiPolygon")
        polys = [geom["coordinates"]] if geom["type"] == "Polygon" else geom["coordinates"]
        for poly in polys:
            for k, ring in enumerate(poly):
                assert len(ring) >= 4 and ring[0] == ring[-1]
                # right-hand rule (RFC 7946 3.1.6): exterior counter-clockwise, holes clockwise
                assert (_signed_area(ring) > 0) == (k == 0)
                for lon, lat in ring:  # lon first: the two ranges do not overlap, so a swap fails here
                    assert REGION.min_lon <= lon <= REGION.max_lon
                    assert REGION.min_lat <= lat <= REGION.max_lat
        props = feat["properties"]
        cid = props["cluster_id"]
        assert feat["id"] == cid
        row = clusters.loc[cid]
        assert props["cell_count"] == row.cell_count and props["outages"] == row.outages
        assert props["customers_out"] == row.customers_out and props["peak_hour"] == row.peak_hour
        assert props["max_gust_ms"] == pytest.approx(row.max_gust_ms) and "mean_risk" in props
        # the outline covers exactly the cluster's cells
        assert sorted(h3.geo_to_cells(geom, 7)) == sorted(row.cell_ids)


def test_clusters_geojson_holes_and_multipolygon() -> None:
    inputs = build_inputs()
    centre = h3.latlng_to_cell(29.7, -90.0, 7)
    ring_cells = sorted(h3.grid_ring(centre, 1)) + [h3.latlng_to_cell(29.4, -89.6, 7)]
    cl = inputs["clusters"].iloc[:1].copy()
    cl["cell_ids"] = [ring_cells]
    cl["cell_count"] = len(ring_cells)
    inputs["clusters"] = cl
    _, arts = run_all(inputs)
    geom = json.loads(arts["clusters.geojson"])["features"][0]["geometry"]
    assert geom["type"] == "MultiPolygon"
    assert sorted(len(p) for p in geom["coordinates"]) == [1, 2]  # the ring of cells has a hole
    assert all(r[0] == r[-1] for r in _rings(geom))
    assert sorted(h3.geo_to_cells(geom, 7)) == sorted(ring_cells)


def test_report_html(small) -> None:
    _, _, arts = small
    page = arts["report.html"].decode("utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "Gulf Coast" in page and DAY in page
    fetched = page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a name, never fetched
    assert "http://" not in fetched and "https://" not in fetched and "//cdn" not in fetched
    assert "<script" not in page and "<link" not in page and "<img" not in page
    map_svg, hourly_svg = _svgs(page)
    assert map_svg.get("viewBox") == "0 0 880 760" and hourly_svg.get("viewBox") == "0 0 880 400"
    # the map: every cell drawn once, in its risk's colour; both clusters outlined, labelled and titled
    cells = [p for p in map_svg.iter(f"{SVG}path") if p.get("fill", "").startswith("#") and p.get("d", "").startswith("M")]
    drawn = {p.get("fill"): p.get("d").count("M") for p in cells}
    inputs = build_inputs()
    want = pd.Series(pictures.risk_colors(inputs["cell_risk"]["risk"].to_numpy())).value_counts().to_dict()
    assert drawn == want
    assert {"C1", "C2", "Storm cluster (2)", "Region box", "Longitude (°)", "Latitude (°)"} <= set(_texts(map_svg))
    titles = ["".join(t.itertext()) for t in map_svg.iter(f"{SVG}title")]
    assert any(t.startswith("C1: ") and " outages, " in t for t in titles)
    # the hourly chart: a bar per hour with outages, every hour's figures in its title
    hours = ["".join(t.itertext()) for t in hourly_svg.iter(f"{SVG}title")]
    assert len(hours) == 24 and hours[3].startswith("03:00–04:00 UTC: ")
    counts = inputs["enriched"]["hour"].value_counts()
    assert [int(h.split(": ")[1].split()[0]) for h in hours] == [int(counts.get(h, 0)) for h in range(24)]
    bars = next(p for p in hourly_svg.iter(f"{SVG}path") if p.get("fill") == pictures.BAR_COLOR)
    assert bars.get("d").count("M") == int((counts > 0).sum())
    # tables: clusters, feeders and the open outages (largest first)
    assert ">C1<" in page and ">C2<" in page
    assert page.index(">E03<") < page.index(">E05<") < page.index(">E07<")
    assert ">E04<" not in page  # restored exactly at midnight: not in the backlog
    # text from the data is escaped
    assert "wind &amp; &lt;trees&gt;" in page and "<trees>" not in page


def test_pictures_parse_whatever_the_region_is_called() -> None:
    """Markup and characters XML does not allow in a region's name leave well-formed pictures."""
    region = Region("odd", 'Odd <b>"name"</b> & \x0c\x01 \ufffe end', 29.2, 30.2, -90.6, -89.4)
    inputs = build_inputs(region)
    for svg in (render_map_svg(region=region, day=DAY, cell_risk=inputs["cell_risk"], clusters=inputs["clusters"]),
                render_hourly_svg(region=region, day=DAY, enriched=inputs["enriched"], cell_hour=inputs["cell_hour"])):
        title = _texts(ET.fromstring(svg))[-1]
        assert title.startswith('Odd <b>"name"</b> &   end — ')


def test_report_escapes_region_name() -> None:
    region = Region("gulf_coast", 'Gulf <Coast> & "Bayou"', 29.2, 30.2, -90.6, -89.4)
    _, arts = run_all(build_inputs(region), region=region)
    page = arts["report.html"].decode("utf-8")
    assert "Gulf &lt;Coast&gt; &amp; &quot;Bayou&quot;" in page
    assert "<Coast>" not in page
    assert json.loads(arts["summary.json"])["region"]["name"] == region.name


def test_empty_inputs_still_give_valid_artifacts() -> None:
    summary, arts = run_all(_empty_inputs(), quarantined_rows=0)
    geo = json.loads(arts["clusters.geojson"])
    assert geo["type"] == "FeatureCollection" and geo["features"] == []
    doc = json.loads(arts["summary.json"])
    assert doc["clusters"] == [] and doc["top_feeders"] == [] and doc["summary"]["outages"] == 0
    assert doc["summary"]["peak_hour"] is None
    page = arts["report.html"].decode("utf-8")
    assert "Gulf Coast" in page and "No storm clusters" in page
    map_svg, hourly_svg = _svgs(page)
    assert "No cell data for this day" in _texts(map_svg) and "Storm cluster (0)" in _texts(map_svg)
    assert "No outages reported" in _texts(hourly_svg)


# ---- determinism ----------------------------------------------------------------------------


def test_deterministic_in_process(small) -> None:
    _, _, arts = small
    _, again = run_all(build_inputs())
    assert _digests(again) == _digests(arts)
    # row order of the inputs does not matter
    shuffled = {k: v.iloc[::-1].reset_index(drop=True) for k, v in build_inputs().items()}
    shuffled["cell_risk"] = shuffled["cell_risk"].sample(frac=1.0, random_state=3).reset_index(drop=True)
    _, third = run_all(shuffled)
    assert _digests(third) == _digests(arts)


def test_artifacts_change_with_inputs(small) -> None:
    inputs, _, arts = small
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["cell_risk"].loc[0, "risk"] = 0.99
    _, other = run_all(changed)
    assert other["report.html"] != arts["report.html"]
    assert other["clusters.geojson"] == arts["clusters.geojson"]


_SUBPROCESS = """
import hashlib, json
from tests.unit.test_present import build_inputs, run_all
_, arts = run_all(build_inputs())
print(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in sorted(arts.items())}))
"""


def test_deterministic_across_processes(small) -> None:
    _, _, arts = small
    env = {**os.environ, "PYTHONHASHSEED": "4242"}  # a different set/dict hash order than this process
    out = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == _digests(arts)


def test_pictures_do_not_depend_on_what_was_drawn_before(small) -> None:
    """The only state the pictures keep is the cells' path data (made once per process and region):
    the bytes are the same with them made afresh and after other regions, days and scales."""
    inputs, _, _ = small

    def drawn(region: Region, data: dict[str, pd.DataFrame], day: str = DAY) -> tuple[str, str]:
        return (render_map_svg(region=region, day=day, cell_risk=data["cell_risk"], clusters=data["clusters"]),
                render_hourly_svg(region=region, day=day, enriched=data["enriched"], cell_hour=data["cell_hour"]))

    pictures._cell_path_data.clear()
    first = drawn(REGION, inputs)
    other = Region("other", "Another region", 40.0, 41.0, -80.0, -79.0)
    between = [drawn(other, _empty_inputs()), drawn(REGION, _empty_inputs(), "2026-09-02"),
               drawn(REGION, build_large_inputs())]
    assert all(b[0] != first[0] and b[1] != first[1] for b in between)
    assert drawn(REGION, inputs) == first
    pictures._cell_path_data.clear()
    assert drawn(REGION, inputs) == first
    broken = inputs["clusters"].assign(cluster_id="not a number")
    with pytest.raises(ValueError):
        render_map_svg(region=REGION, day=DAY, cell_risk=inputs["cell_risk"], clusters=broken)
    assert drawn(REGION, inputs) == first


# ---- speed ----------------------------------------------------------------------------------


def test_render_is_fast_for_a_full_region() -> None:
    inputs = build_large_inputs()
    assert len(inputs["cell_risk"]) > 2000
    run_all(inputs)  # warm-up: font cache, imports
    t0 = time.perf_counter()
    _, arts = run_all(inputs)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, f"rendering took {elapsed:.2f}s"
    assert len(json.loads(arts["clusters.geojson"])["features"]) == 3


# ---- pictures -------------------------------------------------------------------------------


def _png_chunks(png: bytes) -> list[bytes]:
    kinds, at = [], 8
    while at < len(png):
        (size,) = struct.unpack(">I", png[at : at + 4])
        kinds.append(png[at + 4 : at + 8])
        at += 12 + size
    return kinds


def test_png_encoder_round_trips() -> None:
    rng = np.random.default_rng(2)
    rgba = rng.integers(0, 256, size=(37, 53, 4), dtype=np.uint8)
    opaque = rgba.copy()
    opaque[:, :, 3] = 255
    for image, mode in ((rgba, "RGBA"), (opaque, "RGB")):
        png = encode_png(image)
        assert png == encode_png(image.copy())
        assert _png_chunks(png) == [b"IHDR", b"pHYs", b"IDAT", b"IEND"]  # no text, no time
        decoded = Image.open(io.BytesIO(png))
        assert decoded.mode == mode
        assert round(decoded.info["dpi"][0]) == DPI
        assert np.array_equal(np.asarray(decoded), image if mode == "RGBA" else image[:, :, :3])
    for bad in (rgba[:, :, :3], rgba.astype(np.int16), rgba[:0]):
        with pytest.raises(ValueError, match="encode_png"):
            encode_png(bad)


def _reach(svg: ET.Element) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of what a picture draws outside its cells' and outlines' group
    (clipped to the plot): boxes, lines and the texts' extents, a text's width estimated from its
    length at :data:`pictures._CHAR_EM` of its font size (its ``textLength`` when it has one)."""
    xs: list[float] = []
    ys: list[float] = []
    for el in svg.iter():
        tag = el.tag.removeprefix(SVG)
        if tag == "rect" and el.get("x") is not None:
            x, y, w, h = (float(el.get(k)) for k in ("x", "y", "width", "height"))
            xs += [x, x + w]
            ys += [y, y + h]
        elif tag == "text":
            size = float(el.get("font-size", pictures._TICK_FONT))
            width = float(el.get("textLength") or len("".join(el.itertext())) * pictures._CHAR_EM * size)
            if el.get("transform"):  # rotated -90° about its anchor point: it runs upwards
                x, y = map(float, re.match(r"translate\(([-\d.]+) ([-\d.]+)\)", el.get("transform")).groups())
                xs += [x - size, x]
                ys += [y - width / 2, y + width / 2]
                continue
            x, y = float(el.get("x")), float(el.get("y"))
            left = {"start": x, "middle": x - width / 2, "end": x - width}[el.get("text-anchor", "start")]
            xs += [left, left + width]
            ys += [y - size, y + 0.25 * size]
    return min(xs), min(ys), max(xs), max(ys)


def test_pictures_are_not_cut_at_the_edges() -> None:
    """Titles, tick labels, axis labels, the legend and the colour bar stay inside the picture for
    any region shape and name, and the hourly chart's value axes have room for six-digit labels."""
    tall = Region("tall", "A tall and narrow region with a long name that goes on and on and on and on", 40.0,
                  43.0, -75.0, -74.5)
    wide = Region("wide", "Wide south-eastern region", -34.2, -33.4, 149.5, 152.5)
    for region, inputs in ((REGION, build_inputs()), (tall, _empty_inputs()), (wide, _empty_inputs())):
        svg = ET.fromstring(render_map_svg(region=region, day=DAY, cell_risk=inputs["cell_risk"],
                                           clusters=inputs["clusters"]))
        width, height = map(float, svg.get("viewBox").split()[2:])
        assert width == 880 and (height < 600 if region is wide else height <= 770)  # wide: no blank rows
        left, top, right, bottom = _reach(svg)
        assert left >= 4 and top >= 4 and right <= width - 4 and bottom <= height - 4, (region.region_id, _reach(svg))
    many = pd.DataFrame({"hour": np.repeat(np.arange(24), 30), "gust_ms": 30.0})
    many = many.loc[many.index.repeat(5000)]  # 150,000 outages an hour: six-digit tick labels
    for enriched in (build_inputs()["enriched"], many):
        svg = ET.fromstring(render_hourly_svg(region=REGION, day=DAY, enriched=enriched, cell_hour=enriched.iloc[0:0]))
        assert "150000" in _texts(svg) or len(enriched) < 1000
        left, top, right, bottom = _reach(svg)
        assert left >= 4 and top >= 4 and right <= 876 and bottom <= 396, _reach(svg)
        # the count labels (digits) end before the axis label beside them begins
        texts = list(svg.iter(f"{SVG}text"))
        label_x = next(float(re.match(r"translate\(([-\d.]+)", t.get("transform")).group(1))
                       for t in texts if "".join(t.itertext()) == "Outages")
        counts = [t for t in texts if t.get("text-anchor") == "end"]
        widest = max(len("".join(t.itertext())) * pictures._DIGIT_EM * pictures._TICK_FONT for t in counts)
        assert min(float(t.get("x")) for t in counts) - widest >= label_x + 2


def test_map_draws_a_pentagon_and_a_distorted_cell_with_all_their_vertices() -> None:
    pentagon = sorted(h3.get_pentagons(7))[0]
    lat, lon = h3.cell_to_latlng(pentagon)
    region = Region("pent", "Around a pentagon", lat - 0.05, lat + 0.05, lon - 0.05, lon + 0.05)
    hexagon = h3.grid_ring(pentagon, 1)[0]
    risk = pd.DataFrame({"cell_id": [pentagon, hexagon], "risk": [0.2, 0.9]})
    for _ in range(2):  # made, then looked up
        svg = ET.fromstring(render_map_svg(region=region, day=DAY, cell_risk=risk, clusters=_empty_inputs()["clusters"]))
        paths = {p.get("fill"): p.get("d") for p in svg.iter(f"{SVG}path") if p.get("fill", "").startswith("#")}
        shape = paths[pictures.risk_colors(np.array([0.2]))[0]]
        assert shape.count("M") == 1 and len(re.findall(r"-?\d+", shape)) == 2 * len(h3.cell_to_boundary(pentagon))
        # its neighbour has distortion vertices (more than six): drawn with all of them too
        neighbour = paths[pictures.risk_colors(np.array([0.9]))[0]]
        assert len(re.findall(r"-?\d+", neighbour)) == 2 * len(h3.cell_to_boundary(hexagon)) > 12


def test_map_places_cells_where_they_are() -> None:
    """A cell's hexagon is drawn around the point of its centre, in the colour of its risk step,
    and the colour scale runs from the lightest colour at risk 0 to the darkest at risk 1."""
    region = REGION
    frame = pictures._MapFrame(region)
    cell = h3.latlng_to_cell(29.7, -90.0, 7)
    risk = pd.DataFrame({"cell_id": [cell], "risk": [0.5]})
    svg = ET.fromstring(render_map_svg(region=region, day=DAY, cell_risk=risk, clusters=_empty_inputs()["clusters"]))
    (path,) = [p for p in svg.iter(f"{SVG}path") if p.get("d", "").startswith("M") and p.get("fill", "").startswith("#")
               and p.get("fill") != pictures.BAR_COLOR]
    assert path.get("fill") == pictures.risk_colors(np.array([0.5]))[0]
    nums = [int(v) for v in re.findall(r"-?\d+", path.get("d"))]
    pts = np.cumsum(np.array([nums[0:2]] + [nums[i:i + 2] for i in range(2, 12, 2)]), axis=0) / 10
    centre = frame.xy(np.array([-90.0, 29.7]))
    assert np.abs(pts.mean(axis=0) - centre).max() < 5  # within a few units of the centre point
    assert pictures.risk_colors(np.array([0.0, 1.0, np.nan])) == [pictures.RISK_COLORS[0], pictures.RISK_COLORS[-1],
                                                                 pictures.RISK_COLORS[0]]


def test_peak_hour_tie_goes_to_earliest_hour() -> None:
    inputs = build_inputs()
    enr = inputs["enriched"]
    # Hour 12 (E06, E09) first in row order, then hour 3 (E02, E08): equal counts -> 3.
    inputs["enriched"] = enr[enr["event_id"].isin(["E06", "E09", "E02", "E08"])].iloc[[1, 3, 0, 2]]
    assert list(inputs["enriched"]["hour"]) == [12, 12, 3, 3]
    summary = summarize(region=REGION, day=DAY, quarantined_rows=0, signal_quality="high", **inputs)
    assert summary.iloc[0].peak_hour == 3
