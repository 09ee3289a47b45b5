"""Deterministic synthetic storm scenario: the landing zone of contract section 3 plus its ground truth.

The scenario exists so that every phase can be exercised and *graded* without real data: the
generator knows where it planted damage clusters and which rows it corrupted, and writes that
knowledge to ``<landing>/_truth/scenario.json`` (a folder starting with ``_`` is never a region).

Model (all distances equirectangular km, times in hours since ``start`` 00:00 UTC):

* Storm track: starts just south of the first region's box and moves north-east by
  ``(0.14 deg lat, 0.11 deg lon)`` an hour with a small seeded wobble, so it crosses one region
  about every 8 hours.  Peak gust ``vmax(t) = 18 + 42 * exp(-t / 40)`` m/s (weakening inland).
* Gust at distance ``d``: ``g = 9 + (vmax - 9) * exp(-d / 90)``; rain (mm/h)
  ``35 * exp(-(d / 70)^2) * vmax / 60``; pressure ``1013 - 1.1 * (vmax - 9) * exp(-(d / 120)^2)``.
* Outage placement weight per (cell, hour), with the gust at the cell centre at mid-hour:
  ``w = (g / 20)^3 * (0.5 + vegetation_index) * (1 + slope_deg / 45)``.  In a planted damage
  cluster the vulnerability factor is replaced by ``M * mean_vulnerability`` with ``M`` in
  [6, 10] (centre cell 1.5 M), so clusters stand out by ~6-15x against their surroundings.
  The partition's ``rows_per_partition`` outages are drawn with one multinomial over all
  (cell, hour) pairs, so the row count is exact.
* Bad rows are corrupted **in place**: ``round(bad_rows * rows_per_partition)`` of the rows are
  rewritten, so every ``outages.csv`` has exactly ``rows_per_partition`` data rows.
* Noisy partitions (``noisy``, a probability per partition, drawn from the partition's own
  stream): ``NOISY_BAD_ROWS`` of their outage rows are corrupted and ``NOISY_WEATHER_GAP`` of
  their station-hours are left out of ``weather.csv``, so present grades them ``noisy`` and
  holds them (:mod:`assets.quality`). The truth lists them (``partitions[key]["noisy"]``).

A storm in progress (``as_of``): every value is drawn as for the whole day, then only what was
reported up to that moment is written: the outages reported by then (the first lines of the day's file,
since rows are in time order; each with its ``restored_at`` as drawn, the feed's estimate), the
weather observed by then, and no folder for a day that begins after it. Days before ``as_of``'s
are whole. A later ``as_of`` therefore writes a longer version of the same file (the earlier one
is its first lines), and the day's last one equals the file written without ``as_of``.
Files are written to a temporary name and renamed into place, so a reader never sees half of one.

Random streams are derived per region (reference data) and per (region, day) partition from
``(seed, region index, day index)``, so generating one region yields byte-identical files for
that region as generating six.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import h3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from assets.schemas import (
    CUSTOMERS_CSV_COLUMNS,
    OUTAGES_CSV_COLUMNS,
    TERRAIN_CSV_COLUMNS,
    WEATHER_CSV_COLUMNS,
)
from resources.landing_layout import CUSTOMERS_FILE, OUTAGES_FILE, TERRAIN_FILE, WEATHER_FILE, partition_file
from resources.settings import Region

RES = 7
KM_PER_DEG = 111.2
BG_GUST = 9.0
CAUSES = np.array(["wind", "vegetation", "equipment", "lightning", "flooding", "unknown"])
CAUSE_P = np.array([0.38, 0.30, 0.12, 0.08, 0.07, 0.05])
BAD_KINDS = (
    "lat_not_numeric", "lat_out_of_box", "negative_customers", "empty_event_id", "duplicate_event_id",
    "reported_outside_day", "unparseable_timestamp", "restored_before_reported", "wrong_region",
    "wrong_column_count",
)
OFFSET_SHARE = 0.03  # share of timestamps written with a -05:00 offset
UNRESTORED_SHARE = 0.15
STATION_GRID = 5  # stations per side of a region's box
NOISY_BAD_ROWS = 0.25  # share of a noisy partition's outage rows corrupted
NOISY_WEATHER_GAP = 0.5  # share of a noisy partition's station-hours without a reading


def storm_position(t: np.ndarray, first: Region, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Storm centre (lat, lon) and peak gust at fractional hours ``t``; depends on the first region only."""
    phase = np.random.default_rng([seed, 2]).uniform(0, 2 * math.pi)
    lat = first.min_lat - 0.3 + 0.14 * t + 0.03 * np.sin(2 * math.pi * t / 17 + phase)
    lon = first.min_lon + 0.25 + 0.11 * t + 0.03 * np.cos(2 * math.pi * t / 23 + phase)
    vmax = 18.0 + 42.0 * np.exp(-t / 40.0)
    return lat, lon, vmax


def _dist_km(lat1: np.ndarray, lon1: np.ndarray, lat2: np.ndarray, lon2: np.ndarray) -> np.ndarray:
    coslat = np.cos(np.radians((lat1 + lat2) / 2))
    return KM_PER_DEG * np.hypot(lat1 - lat2, (lon1 - lon2) * coslat)


def _fields(d: np.ndarray, vmax: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    gust = BG_GUST + (vmax - BG_GUST) * np.exp(-d / 90.0)
    rain = 35.0 * np.exp(-((d / 70.0) ** 2)) * vmax / 60.0
    pressure = 1013.0 - 1.1 * (vmax - BG_GUST) * np.exp(-((d / 120.0) ** 2))
    return gust, rain, pressure


def _region_cells(region: Region) -> tuple[list[str], np.ndarray, np.ndarray]:
    poly = h3.LatLngPoly([(region.min_lat, region.min_lon), (region.min_lat, region.max_lon),
                          (region.max_lat, region.max_lon), (region.max_lat, region.min_lon)])
    cells = sorted(h3.polygon_to_cells(poly, RES))
    centres = np.array([h3.cell_to_latlng(c) for c in cells])
    return cells, centres[:, 0], centres[:, 1]


def _fmt(values: np.ndarray, decimals: int) -> pa.Array:
    return pc.cast(pa.array(np.round(values, decimals)), pa.string())


def _fmt_ts(seconds: np.ndarray, offset_mask: np.ndarray) -> pa.Array:
    """ISO-8601 text of epoch seconds; rows in ``offset_mask`` are written in UTC-05:00."""
    local = np.where(offset_mask, seconds - 5 * 3600, seconds).astype("datetime64[s]")
    text = pc.replace_substring(pc.cast(pa.array(local), pa.string()), " ", "T", max_replacements=1)
    suffix = pa.array(np.where(offset_mask, "-05:00", "+00:00"))
    return pc.binary_join_element_wise(text, suffix, "")


def _write_csv(path: Path, header: Sequence[str], columns: Sequence[pa.Array]) -> None:
    """Write string columns as CSV lines by joining in Arrow (fast, no quoting: values never need it),
    to a temporary name renamed into place (a sensor may read the landing zone meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = pc.binary_join_element_wise(pc.binary_join_element_wise(*columns, ","), "", "\n")
    lines = lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset: lines.offset + len(lines) + 1]
    body = lines.buffers()[2].to_pybytes()[offsets[0]: offsets[-1]] if len(lines) else b""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes((",".join(header) + "\n").encode() + body)
    os.replace(tmp, path)


def _reference(region: Region, ri: int, seed: int) -> dict:
    """Cells, terrain and customers of one region (its own random stream)."""
    rng = np.random.default_rng([seed, 0, ri])
    cells, clat, clon = _region_cells(region)
    n = len(cells)
    elevation = np.clip((clat - 29.3) * 90 + rng.normal(0, 12, n), 0, None)
    slope = np.clip(rng.gamma(2.0, 3.5, n) + elevation / 60, 0, 90)
    veg = np.clip(rng.beta(2.5, 2.0, n), 0, 1)
    flood = (elevation < 12) & (rng.random(n) < 0.6) | (rng.random(n) < 0.03)
    parents = [h3.cell_to_parent(c, 5) for c in cells]
    parent_ix = {p: i for i, p in enumerate(sorted(set(parents)))}
    primary = rng.integers(0, 2, n)
    second = rng.random(n) < 0.35
    cust1 = np.where(rng.random(n) < 0.04, 0, np.round(rng.lognormal(math.log(350), 0.8, n))).astype(np.int64)
    cust2 = np.round(rng.lognormal(math.log(120), 0.9, n)).astype(np.int64)
    feeders: list[tuple[str, str, int]] = []
    for i, c in enumerate(cells):
        base = f"{region.region_id}-f{parent_ix[parents[i]]:03d}"
        feeders.append((c, f"{base}{'ab'[primary[i]]}", int(cust1[i])))
        if second[i]:
            feeders.append((c, f"{base}{'ba'[primary[i]]}", int(cust2[i])))
    return {"cells": cells, "lat": clat, "lon": clon, "elevation": elevation, "slope": slope, "veg": veg,
            "flood": flood, "feeders": feeders, "vuln": (0.5 + veg) * (1 + slope / 45)}


def _plant_clusters(ref: dict, exposure: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """Pick 2-3 well separated cluster centres among the most storm-exposed cells of the day."""
    index = {c: i for i, c in enumerate(ref["cells"])}
    order = np.argsort(-exposure, kind="stable")
    pool = order[: max(20, len(order) // 12)]
    wanted = int(rng.integers(2, 4))
    chosen: list[dict] = []
    for ci in rng.permutation(pool):
        k = int(rng.integers(1, 3))
        centre = ref["cells"][ci]
        disk = h3.grid_disk(centre, k)
        if not all(c in index for c in h3.grid_disk(centre, k + 1)):
            continue  # keep the whole cluster (and a margin) inside the region
        if any(h3.grid_distance(centre, o["center_cell"]) < 10 for o in chosen):
            continue
        mult = float(np.round(rng.uniform(6, 10), 3))
        chosen.append({"center_cell": centre, "k": k, "multiplier": mult, "cells": sorted(disk),
                       "_ix": [index[c] for c in sorted(disk)]})
        if len(chosen) == wanted:
            break
    return chosen


def _partition(root: Path, region: Region, ri: int, day: str, di: int, ref: dict, *, seed: int,
               n_rows: int, bad_rows: float, noisy: float = 0.0, cutoff: int | None = None) -> dict:
    """Write one partition's outages.csv and weather.csv; return its ground truth.

    ``cutoff``: epoch seconds; only the rows reported (observed) up to it are written.
    """
    rng_cl, rng, rng_wx = (np.random.default_rng(s) for s in np.random.SeedSequence([seed, 1, ri, di]).spawn(3))
    # its own stream, so the knob never changes what the other streams draw
    is_noisy = bool(noisy > 0 and np.random.default_rng([seed, 2, ri, di]).random() < noisy)
    if is_noisy:
        bad_rows = max(bad_rows, NOISY_BAD_ROWS)
    day0 = int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp())
    rid = region.region_id
    weight, clusters = _outage_weights(ref, di, seed, rng_cl)
    outages = _draw_outages(region, ref, day, day0, weight, n_rows, rng)
    rel = partition_file(rid, day, OUTAGES_FILE)
    bad_pos, new_lines, truth_bad = _corrupt(outages, region, day, rel, bad_rows, rng)
    if cutoff is not None:  # drawn for the whole day, cut to what was reported by then
        outages, n_rows = outages.reported_by(cutoff)
        kept = bad_pos < n_rows
        bad_pos, new_lines = bad_pos[kept], [line for line, k in zip(new_lines, kept, strict=True) if k]
        truth_bad = [t for t, k in zip(truth_bad, kept, strict=True) if k]
    for cl in clusters:
        cl["outages"] = int(np.isin(outages.cell_ix, cl.pop("_ix")).sum())
    _write_outages(root / rel, outages.cols, bad_pos, new_lines)
    n_wx = _weather(root / partition_file(rid, day, WEATHER_FILE), region, rid, day0, di, ref, seed, rng_wx,
                    gap=NOISY_WEATHER_GAP if is_noisy else 0.0, cutoff=cutoff)
    n_bad = len(bad_pos)
    return {"region_id": rid, "day": day, "rows": {"outages": n_rows, "bad": n_bad, "good": n_rows - n_bad,
                                                  "weather": n_wx},
            "clusters": clusters, "bad_rows": truth_bad, "noisy": is_noisy}


def _outage_weights(ref: dict, di: int, seed: int, rng: np.random.Generator) -> tuple[np.ndarray, list[dict]]:
    """Outage placement weight per (cell, hour) of day ``di``, and the damage clusters planted in it."""
    slat, slon, vmax = storm_position(di * 24 + np.arange(24) + 0.5, ref["first"], seed)
    d = _dist_km(ref["lat"][:, None], ref["lon"][:, None], slat[None, :], slon[None, :])
    gust, _, _ = _fields(d, vmax[None, :])
    g = (gust / 20.0) ** 3
    weight = g * ref["vuln"][:, None]
    clusters = _plant_clusters(ref, g.sum(axis=1), rng)
    vbar = float(ref["vuln"].mean())
    for cl in clusters:
        for ix in cl["_ix"]:
            mult = cl["multiplier"] * (1.5 if ref["cells"][ix] == cl["center_cell"] else 1.0)
            weight[ix] = g[ix] * vbar * mult
    return weight, clusters


@dataclass(frozen=True)
class _Outages:
    """A partition's outage rows before any is corrupted."""

    cols: dict[str, pa.Array]  # the text of every column of outages.csv
    cell_ix: np.ndarray  # the cell of each row (an index into the region's cells)
    secs: np.ndarray  # reported_at of each row, epoch seconds
    customers_out: np.ndarray

    def reported_by(self, cutoff: int) -> tuple[_Outages, int]:
        """The rows reported up to ``cutoff`` (epoch seconds; a prefix, rows are in time order), and their number."""
        n = int(np.searchsorted(self.secs, cutoff, side="right"))
        return _Outages({k: v[:n] for k, v in self.cols.items()}, self.cell_ix[:n], self.secs[:n],
                        self.customers_out[:n]), n


def _draw_outages(region: Region, ref: dict, day: str, day0: int, weight: np.ndarray, n_rows: int,
                  rng: np.random.Generator) -> _Outages:
    """Exactly ``n_rows`` outages placed by one multinomial over (cell, hour), in time order."""
    rid, ncell = region.region_id, len(ref["cells"])
    counts = rng.multinomial(n_rows, (weight / weight.sum()).ravel())
    flat = np.repeat(np.arange(ncell * 24), counts)
    cell_ix, hour = flat // 24, flat % 24
    secs = day0 + hour * 3600 + rng.integers(0, 3600, n_rows)
    order = np.argsort(secs, kind="stable")
    cell_ix, secs = cell_ix[order], secs[order]
    r = 0.35 * np.sqrt(rng.random(n_rows))
    ang = rng.uniform(0, 2 * math.pi, n_rows)
    lat = ref["lat"][cell_ix] + r * np.sin(ang) / KM_PER_DEG
    lon = ref["lon"][cell_ix] + r * np.cos(ang) / (KM_PER_DEG * np.cos(np.radians(ref["lat"][cell_ix])))
    lat = np.clip(lat, region.min_lat + 1e-5, region.max_lat - 1e-5)
    lon = np.clip(lon, region.min_lon + 1e-5, region.max_lon - 1e-5)
    cust_out = np.minimum(np.round(rng.lognormal(math.log(25), 1.3, n_rows)), 20000).astype(np.int64)
    cause = CAUSES[rng.choice(len(CAUSES), n_rows, p=CAUSE_P)]
    restored = secs + np.round(rng.lognormal(math.log(180 * 60), 0.9, n_rows)).astype(np.int64) + 60
    unrestored = rng.random(n_rows) < UNRESTORED_SHARE
    rep_off, res_off = rng.random(n_rows) < OFFSET_SHARE, rng.random(n_rows) < OFFSET_SHARE
    stamp = day.replace("-", "")
    cols = {
        "event_id": pc.binary_join_element_wise(f"{rid}-{stamp}-", pc.cast(pa.array(np.arange(n_rows) + 1), pa.string()), ""),
        "region_id": pa.array(np.full(n_rows, rid)),
        "reported_at": _fmt_ts(secs, rep_off),
        "lat": _fmt(lat, 6), "lon": _fmt(lon, 6),
        "customers_out": pc.cast(pa.array(cust_out), pa.string()),
        "cause": pa.array(cause),
        "restored_at": pc.if_else(pa.array(unrestored), "", _fmt_ts(restored, res_off)),
    }
    return _Outages(cols, cell_ix, secs, cust_out)


def _corrupt(outages: _Outages, region: Region, day: str, rel: str, bad_rows: float,
             rng: np.random.Generator) -> tuple[np.ndarray, list[str], list[dict]]:
    """Pick the rows to corrupt and rewrite each with one kind of error (the kinds in turn, shuffled).

    Returns their positions, their new lines and their ground truth.
    """
    cols, secs, n_rows = outages.cols, outages.secs, len(outages.secs)
    n_bad = min(int(round(bad_rows * n_rows)), max(n_rows - 1, 0))
    bad_pos = np.sort(rng.choice(np.arange(1, n_rows), n_bad, replace=False)) if n_bad else np.array([], int)
    kinds = rng.permutation(np.resize(np.array(BAD_KINDS), n_bad))
    bad_set, truth_bad, new_lines = set(bad_pos.tolist()), [], []
    for pos, kind in zip(bad_pos.tolist(), kinds.tolist(), strict=True):
        f = {k: cols[k][pos].as_py() for k in OUTAGES_CSV_COLUMNS}
        rec = {"file": rel, "line": pos + 2, "kind": kind, "event_id": f["event_id"]}
        if kind == "lat_not_numeric":
            f["lat"] = "lat" + f["lat"][:4]
        elif kind == "lat_out_of_box":
            f["lat"] = f"{region.max_lat + 0.75 + rng.random() / 10:.6f}"
        elif kind == "negative_customers":
            f["customers_out"] = f"-{max(1, int(outages.customers_out[pos]))}"
        elif kind == "empty_event_id":
            f["event_id"] = ""
        elif kind == "duplicate_event_id":
            src = int(rng.integers(0, pos))
            while src in bad_set:
                src -= 1
            f["event_id"] = rec["event_id"] = cols["event_id"][src].as_py()
            rec["duplicate_of_line"] = src + 2
        elif kind == "reported_outside_day":
            shift = 86400 if rng.random() < 0.5 else -86400
            f["reported_at"], f["restored_at"] = _fmt_ts(np.array([secs[pos] + shift]), np.array([False]))[0].as_py(), ""
        elif kind == "unparseable_timestamp":
            f["reported_at"] = f"{day}T25:61:00+00:00" if rng.random() < 0.5 else "not-a-time"
        elif kind == "restored_before_reported":
            back = int(rng.integers(5, 120)) * 60
            f["restored_at"] = _fmt_ts(np.array([secs[pos] - back]), np.array([False]))[0].as_py()
        elif kind == "wrong_region":
            f["region_id"] = "offshore"
        vals = [f[k] for k in OUTAGES_CSV_COLUMNS]
        if kind == "wrong_column_count":
            vals = vals[:-2] if rng.random() < 0.5 else [*vals, "extra"]
        new_lines.append(",".join(vals))
        truth_bad.append(rec)
    return bad_pos, new_lines, truth_bad


def _write_outages(path: Path, cols: dict[str, pa.Array], bad_pos: np.ndarray, new_lines: list[str]) -> None:
    line = pc.binary_join_element_wise(*[cols[k] for k in OUTAGES_CSV_COLUMNS], ",")
    if len(bad_pos):
        mask = np.zeros(len(line), dtype=bool)
        mask[bad_pos] = True
        line = pc.replace_with_mask(line, pa.array(mask), pa.array(new_lines, pa.string()))
    _write_csv(path, OUTAGES_CSV_COLUMNS, [line])


def _weather(path: Path, region: Region, rid: str, day0: int, di: int, ref: dict, seed: int,
             rng: np.random.Generator, *, gap: float = 0.0, cutoff: int | None = None) -> int:
    """One observation per station per hour on a STATION_GRID x STATION_GRID grid inside the box
    (``gap``: the share of station-hours left out, drawn after every other value; ``cutoff``:
    only the observations up to it, epoch seconds)."""
    frac = (np.arange(STATION_GRID) + 0.5) / STATION_GRID
    glat, glon = np.meshgrid(region.min_lat + frac * (region.max_lat - region.min_lat),
                             region.min_lon + frac * (region.max_lon - region.min_lon), indexing="ij")
    st_lat, st_lon = glat.ravel(), glon.ravel()
    n_st = len(st_lat)
    minute = rng.integers(0, 56, n_st)
    slat, slon, vmax = storm_position(di * 24 + np.arange(24) + 0.5, ref["first"], seed)
    d = _dist_km(st_lat[:, None], st_lon[:, None], slat[None, :], slon[None, :])
    gust, rain, pres = _fields(d, vmax[None, :])
    gust = np.clip(gust + rng.normal(0, 2.0, gust.shape), 0, 120)
    rain = np.clip(rain * rng.uniform(0.7, 1.3, rain.shape) + rng.exponential(0.1, rain.shape), 0, 500)
    pres = np.clip(pres + rng.normal(0, 0.8, pres.shape), 850, 1090)
    secs = day0 + np.arange(24)[None, :] * 3600 + minute[:, None] * 60
    n = n_st * 24
    sid = np.repeat(np.array([f"{rid}-ws{i:02d}" for i in range(n_st)]), 24)
    columns = [
        pa.array(sid), pa.array(np.full(n, rid)), _fmt_ts(secs.ravel(), rng.random(n) < OFFSET_SHARE),
        _fmt(np.repeat(st_lat, 24), 4), _fmt(np.repeat(st_lon, 24), 4), _fmt(gust.ravel(), 1),
        _fmt(rain.ravel(), 2), _fmt(pres.ravel(), 1)]
    if gap > 0:
        # every station keeps its first hour, so each is still seen on the day
        keep = rng.random((n_st, 24)) >= gap
        keep[:, 0] = True
        mask = pa.array(keep.ravel())
        columns = [c.filter(mask) for c in columns]
        secs = secs.ravel()[keep.ravel()]
    if cutoff is not None:
        mask = pa.array(secs.ravel() <= cutoff)
        columns = [c.filter(mask) for c in columns]
    _write_csv(path, WEATHER_CSV_COLUMNS, columns)
    return len(columns[0])


def generate_scenario(landing: Path, regions: Sequence[Region], *, days: int = 2, start: str = "2026-09-01",
                      rows_per_partition: int = 20_000, seed: int = 7, bad_rows: float = 0.002,
                      noisy: float = 0.0, as_of: dt.datetime | None = None,
                      progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Write a synthetic storm scenario into ``landing`` and return its ground truth.

    Args:
        landing: the landing-zone root (created if missing).
        regions: the regions to generate, in region-list order (their index seeds their streams).
        days: number of UTC days from ``start``.
        start: first day, ``YYYY-MM-DD``.
        rows_per_partition: exact number of data rows of every ``outages.csv``.
        seed: master seed; same arguments give byte-identical files.
        bad_rows: fraction of outage rows corrupted in place (recorded in the truth).
        noisy: probability that a partition is noisy (see the module docstring); 0 for none.
        as_of: a moment (with a time zone): write only the rows reported up to it, and no day
            that begins after it (a storm in progress; see the module docstring).
        progress: called as ``progress("partitions", done, total)`` after each partition.

    Returns:
        The ground-truth dict, also written to ``<landing>/_truth/scenario.json``.
    """
    landing = Path(landing)
    start_day = dt.date.fromisoformat(start)
    refs = []
    for ri, region in enumerate(regions):
        ref = _reference(region, ri, seed)
        ref["first"] = regions[0]
        refs.append(ref)
    customers_rows = _write_reference(landing, regions, refs)
    parts: dict[str, dict] = {}
    cutoff = int(as_of.timestamp()) if as_of is not None else None
    day_starts = [dt.datetime.combine(start_day + dt.timedelta(days=di), dt.time(), dt.UTC) for di in range(days)]
    # a day that begins after as_of has nothing reported yet: no folder
    written = [di for di in range(days) if cutoff is None or int(day_starts[di].timestamp()) <= cutoff]
    total, done = len(regions) * len(written), 0
    for ri, (region, ref) in enumerate(zip(regions, refs, strict=True)):
        for di in written:
            day = day_starts[di].date().isoformat()
            parts[f"{region.region_id}/{day}"] = _partition(landing, region, ri, day, di, ref, seed=seed,
                                                            n_rows=rows_per_partition, bad_rows=bad_rows,
                                                            noisy=noisy, cutoff=cutoff)
            done += 1
            if progress is not None:
                progress("partitions", done, total)
    truth = {
        "seed": seed,
        "params": {"days": days, "start": start, "rows_per_partition": rows_per_partition, "bad_rows": bad_rows,
                   "noisy": noisy, "regions": [r.region_id for r in regions], "h3_resolution": RES,
                   **({"as_of": as_of.astimezone(dt.UTC).isoformat()} if as_of is not None else {})},
        "storm": {"track": _storm_track(regions[0], start_day, days, seed)},
        "reference": {"cells": {r.region_id: len(ref["cells"]) for r, ref in zip(regions, refs, strict=True)},
                      "customers_rows": customers_rows, "terrain_rows": sum(len(ref["cells"]) for ref in refs)},
        "partitions": parts,
        "noisy": sorted(k for k, p in parts.items() if p["noisy"]),
    }
    out = landing / "_truth" / "scenario.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(truth, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return truth


def _write_reference(landing: Path, regions: Sequence[Region], refs: Sequence[dict]) -> int:
    """Write the customers and terrain of every region to the reference files; return the customers rows."""
    cust_rows = [(c, r.region_id, f, str(n)) for r, ref in zip(regions, refs, strict=True) for c, f, n in ref["feeders"]]
    _write_csv(landing / CUSTOMERS_FILE, CUSTOMERS_CSV_COLUMNS,
               [pa.array(list(col)) for col in zip(*cust_rows, strict=True)])
    terr = [pa.concat_arrays(x) for x in zip(*[
        (pa.array(ref["cells"]), pa.array(np.full(len(ref["cells"]), r.region_id)), _fmt(ref["elevation"], 1),
         _fmt(ref["slope"], 2), _fmt(ref["veg"], 3), pa.array(np.where(ref["flood"], "true", "false")))
        for r, ref in zip(regions, refs, strict=True)], strict=True)]
    _write_csv(landing / TERRAIN_FILE, TERRAIN_CSV_COLUMNS, terr)
    return len(cust_rows)


def _storm_track(first: Region, start_day: dt.date, days: int, seed: int) -> list[dict]:
    """The storm centre and peak gust at every hour of the scenario."""
    hours = np.arange(days * 24, dtype=float)
    tlat, tlon, tv = storm_position(hours, first, seed)
    t0 = dt.datetime.combine(start_day, dt.time(), dt.UTC)
    return [{"time": (t0 + dt.timedelta(hours=int(h))).isoformat(), "lat": round(float(a), 4),
             "lon": round(float(b), 4), "max_gust_ms": round(float(v), 2)}
            for h, a, b, v in zip(hours, tlat, tlon, tv, strict=True)]
