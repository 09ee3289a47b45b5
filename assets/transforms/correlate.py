"""The correlate transform: outage statistics per cell and hour, a risk score per cell, damage clusters.

Cell universe: every cell of the region's reference data (terrain or customers) whose centre lies
in the region's box, plus every cell that had an outage.  Cells without outages are kept because
they carry storm exposure and vulnerability, and because the cluster detector needs the zeros to
estimate the local background.

Risk (``cell_risk.risk``, in [0, 1]) is a weighted blend of three scores in [0, 1]::

    risk = 0.5 * density + 0.3 * hazard + 0.2 * vulnerability
    density       = percentile rank of the cell's outage count among the universe (0 without outages)
    hazard        = 0.7 * clip((max_gust_ms - 10) / 40, 0, 1) + 0.3 * clip(total_rain_mm / 200, 0, 1)
    vulnerability = 0.6 * vegetation_index + 0.4 * clip(slope_deg / 30, 0, 1)

(a missing input scores 0).  Observed damage dominates; exposure and vulnerability rank cells
that have not (yet) reported outages.

Damage clusters: a cell is *anomalous* when its outage count ``o`` stands out against its local
background ``b`` = median outage count over ``grid_disk(cell, 4)`` (61 cells, zeros included,
floored at 1): ``o >= 6`` and ``o >= 3 b`` and the Poisson excess ``(o - b) / sqrt(b) >= 4``.
A local rather than region-wide baseline keeps the smooth storm gradient (many outages all along
the track) from being reported as one giant cluster.  Anomalous cells connected through H3
adjacency (``grid_disk(k=1)``) form a cluster when there are at least 3 of them.
"""

from __future__ import annotations

from typing import Any

import h3
import numpy as np
import pandas as pd
from h3.api import numpy_int

from assets.schemas import CELL_HOUR_STATS, CELL_RISK, STORM_CLUSTERS
from assets.transforms.enrich import (
    cell_centres,
    empty_frame,
    feeder_table,
    group_max,
    group_sum,
    nearest_station,
    station_hour_grid,
    terrain_table,
)
from resources.settings import Region

BACKGROUND_K = 4
MIN_OUTAGES = 6
MIN_RATIO = 3.0
MIN_POISSON_Z = 4.0
MIN_CLUSTER_CELLS = 3


def _with_partition(df: pd.DataFrame, region: Region, day: str, names: list[str]) -> pd.DataFrame:
    """``df``'s columns in the order of ``names``, with the partition's ``region_id`` and ``day``."""
    n = len(df)
    const = {"region_id": np.full(n, region.region_id, dtype=object), "day": np.full(n, day, dtype=object)}
    return pd.DataFrame({c: const[c] if c in const else df[c].array for c in names})


def _with_cell(enriched: pd.DataFrame) -> pd.DataFrame:
    """The outages that have a cell: a row without one is in no group (as a group-by drops it)."""
    return enriched[enriched["cell_id"].notna()] if enriched["cell_id"].hasnans else enriched


def cell_hour_stats(enriched: pd.DataFrame, region: Region, day: str) -> pd.DataFrame:
    """Per (cell, hour) with outages: counts, customers, max gust and max rain (one station value per hour).

    Grouped over factorized keys with NumPy's unbuffered reductions (a pandas group-by with five
    named aggregations costs several times as much at 500 rows, and more at 200,000).
    """
    enriched = _with_cell(enriched)
    if len(enriched) == 0:
        return empty_frame(CELL_HOUR_STATS)
    cell_code, cells = pd.factorize(enriched["cell_id"], sort=True)
    hour_code, hours = pd.factorize(enriched["hour"].to_numpy(dtype=np.int64), sort=True)
    keys, group = np.unique(cell_code.astype(np.int64) * len(hours) + hour_code, return_inverse=True)
    n = len(keys)
    g = pd.DataFrame({
        "cell_id": np.asarray(cells, dtype=object)[keys // len(hours)],
        "hour": np.asarray(hours)[keys % len(hours)].astype(np.int32),
        "outages": np.bincount(group, minlength=n).astype(np.int64),
        "customers_out": group_sum(group, enriched["customers_out"].to_numpy(dtype=np.int64), n),
        "cell_customers": group_max(group, enriched["cell_customers"].to_numpy(dtype=np.int64), n, floats=False),
        "gust_ms": group_max(group, enriched["gust_ms"].to_numpy(dtype=float, na_value=np.nan), n, floats=True),
        "rain_mm": group_max(group, enriched["rain_mm"].to_numpy(dtype=float, na_value=np.nan), n, floats=True),
    })
    return _with_partition(g, region, day, CELL_HOUR_STATS.names)


def _universe(enriched: pd.DataFrame, customers: pd.DataFrame, terrain: pd.DataFrame, region: Region) -> np.ndarray:
    ref = pd.unique(pd.concat([terrain["cell_id"], customers["cell_id"]], ignore_index=True).astype(object))
    if len(ref):
        lat, lon = cell_centres(ref)
        inside = (lat >= region.min_lat) & (lat <= region.max_lat) & (lon >= region.min_lon) & (lon <= region.max_lon)
        ref = ref[inside]
    return np.array(sorted(set(ref.tolist()) | set(pd.unique(enriched["cell_id"]).tolist())), dtype=object)


#: Each cell's H3 integer and whether the string is h3's own spelling of it, kept per process
#: (a region's cells recur every day); past this many the kept ones are dropped.
CELL_INTS_KEPT = 500_000
_cell_ints: dict[str, tuple[int, bool]] = {}


def _cell_int(cell: str) -> tuple[int, bool]:
    got = _cell_ints.get(cell)
    if got is None:
        if len(_cell_ints) > CELL_INTS_KEPT:
            _cell_ints.clear()
        value = h3.str_to_int(cell)
        got = _cell_ints[cell] = (value, h3.int_to_str(value) == cell)
    return got


def disk_members(cells: np.ndarray, k: int, of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``cells`` lie in ``grid_disk(cells[i], k)``, as pairs ``(i, j)`` sorted by ``i``.

    ``of`` (ascending positions in ``cells``) limits the disks taken to those cells; all of
    ``cells`` are looked for in them. A neighbour matches a cell of ``cells`` when it is spelled
    as h3 spells it (lower-case hex; the last of repeated cells), as with ``h3.grid_disk(c, k)``
    and a dict of ``cells``; a cell given in another spelling still has its own disk. The disks
    are taken as integer arrays and matched by a binary search, much faster than h3's string API.
    """
    of = np.arange(len(cells)) if of is None else np.asarray(of, dtype=np.int64)
    if len(of) == 0:  # no disk to take (a quiet day: no cell has enough outages to be anomalous)
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    facts = [_cell_int(c) for c in cells]
    ints = np.fromiter((f[0] for f in facts), dtype=np.uint64, count=len(cells))
    disks = [numpy_int.grid_disk(int(ints[i]), k) for i in of]
    sizes = np.fromiter((len(d) for d in disks), dtype=np.int64, count=len(disks))
    flat = np.concatenate(disks) if disks else np.zeros(0, dtype=np.uint64)
    rows = np.repeat(of, sizes)
    canonical = np.flatnonzero([f[1] for f in facts])
    order = canonical[np.argsort(ints[canonical], kind="stable")]
    keys = ints[order]
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # The last of equal keys, as a dict built from ``cells`` would keep it.
    at = np.maximum(np.searchsorted(keys, flat, side="right") - 1, 0)
    hit = keys[at] == flat
    return rows[hit], order[at[hit]]


def _row_nanmedian(vals: np.ndarray) -> np.ndarray:
    """``np.nanmedian(vals, axis=1)`` (NaN for a row without values), without its masked-array path.

    Sorting puts the NaNs last, so the ``n`` values of a row are its first ``n`` sorted entries;
    the median is the middle one, or the mean of the middle two as numpy takes it.
    """
    ordered = np.sort(vals, axis=1)
    n = np.count_nonzero(~np.isnan(vals), axis=1)
    rows = np.arange(len(vals))
    lo, hi = ordered[rows, np.maximum(n - 1, 0) // 2], ordered[rows, n // 2 - (n == 0)]
    return np.where(n > 0, (lo + hi) / 2.0, np.nan)


def anomalous_cells(cells: np.ndarray, outages: np.ndarray) -> np.ndarray:
    """Boolean mask of cells whose outage count is a local Poisson excess (see the module docstring).

    Only a cell with at least ``MIN_OUTAGES`` outages can be anomalous, so only those cells get
    a background: on a quiet day that is a handful of disks instead of one per cell of the region.
    """
    width = 3 * BACKGROUND_K * (BACKGROUND_K + 1) + 1
    candidates = np.flatnonzero(outages >= MIN_OUTAGES)
    rows, members = disk_members(cells, BACKGROUND_K, candidates)
    slot = np.searchsorted(candidates, rows)  # the candidate each pair belongs to
    # Column of each member within its row: its rank among the row's members.
    first = np.searchsorted(rows, candidates)
    vals = np.full((len(candidates), width), np.nan)
    vals[slot, np.arange(len(rows)) - first[slot]] = outages[members]
    background = np.ones(len(cells))  # (cells that are not candidates fail the first test anyway)
    background[candidates] = np.maximum(_row_nanmedian(vals), 1.0)
    z = (outages - background) / np.sqrt(background)
    return (outages >= MIN_OUTAGES) & (outages >= MIN_RATIO * background) & (z >= MIN_POISSON_Z)


def connected_clusters(cells: np.ndarray, mask: np.ndarray) -> list[list[str]]:
    """Connected components (H3 adjacency) of the masked cells with >= MIN_CLUSTER_CELLS cells."""
    chosen = set(cells[mask].tolist())
    seen: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(chosen):
        if start in seen:
            continue
        comp, stack = [], [start]
        seen.add(start)
        while stack:
            c = stack.pop()
            comp.append(c)
            for n in h3.grid_disk(c, 1):
                if n in chosen and n not in seen:
                    seen.add(n)
                    stack.append(n)
        if len(comp) >= MIN_CLUSTER_CELLS:
            out.append(sorted(comp))
    return out


def _risk(outages: np.ndarray, gust: np.ndarray, rain: np.ndarray, veg: np.ndarray, slope: np.ndarray) -> np.ndarray:
    n = len(outages)
    density = np.zeros(n)
    if n:
        density = np.where(outages > 0, pd.Series(outages).rank(method="average", pct=True).to_numpy(), 0.0)
    hazard = 0.7 * np.nan_to_num(np.clip((gust - 10.0) / 40.0, 0, 1)) + 0.3 * np.nan_to_num(np.clip(rain / 200.0, 0, 1))
    vuln = 0.6 * np.nan_to_num(np.clip(veg, 0, 1)) + 0.4 * np.nan_to_num(np.clip(slope / 30.0, 0, 1))
    return np.clip(0.5 * density + 0.3 * hazard + 0.2 * vuln, 0.0, 1.0)


def correlate_storm(enriched: pd.DataFrame, weather: pd.DataFrame, customers: pd.DataFrame, terrain: pd.DataFrame,
                    *, region: Region, day: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Correlate one partition's enriched outages with weather and reference data.

    Returns:
        ``(cell_hour_stats, cell_risk, storm_clusters)`` with exactly the columns of
        ``CELL_HOUR_STATS``, ``CELL_RISK`` and ``STORM_CLUSTERS``; rows sorted by cell (and hour),
        clusters numbered 1.. by outages descending, then smallest cell id.
    """
    stats = cell_hour_stats(enriched, region, day)
    cells = _universe(enriched, customers, terrain, region)
    if len(cells) == 0:
        return stats, empty_frame(CELL_RISK), empty_frame(STORM_CLUSTERS)
    outages, cust_out, cell_cust = _cell_counts(enriched, customers, cells)
    lat, lon = cell_centres(cells)
    gust, rain = _cell_weather(weather, day, lat, lon, len(cells))
    terr = terrain_table(terrain).reindex(cells)
    veg, slope = terr["vegetation_index"].to_numpy(float), terr["slope_deg"].to_numpy(float)
    risk = _risk(outages.astype(float), gust, rain, veg, slope)
    affected = np.where(cell_cust > 0, np.minimum(100.0, 100.0 * cust_out / np.maximum(cell_cust, 1)), 0.0)
    cluster_id, rows = _clusters(cells, outages, cust_out, lat, lon, gust, risk, stats)
    risk_df = pd.DataFrame({
        "cell_id": cells, "lat": lat, "lon": lon, "outages": outages, "customers_out": cust_out,
        "cell_customers": cell_cust, "affected_pct": affected, "max_gust_ms": gust, "total_rain_mm": rain,
        "vegetation_index": veg, "slope_deg": slope, "risk": risk,
        "cluster_id": pd.array(np.where(cluster_id > 0, cluster_id, 0), dtype="Int64"),
    })
    risk_df.loc[cluster_id < 0, "cluster_id"] = pd.NA
    risk_df = _with_partition(risk_df, region, day, CELL_RISK.names)
    if rows:
        clusters = pd.DataFrame(rows)
        clusters["peak_hour"] = clusters["peak_hour"].astype(np.int32)
        clusters = _with_partition(clusters, region, day, STORM_CLUSTERS.names)
    else:
        clusters = empty_frame(STORM_CLUSTERS)
    return stats, risk_df, clusters


def _cell_counts(enriched: pd.DataFrame, customers: pd.DataFrame,
                 cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell of ``cells`` (sorted, holding every cell of ``enriched``): outages, customers out,
    and the cell's customers (the reference's, else the largest the outages carry, else 0)."""
    n = len(cells)
    enriched = _with_cell(enriched)
    cell_code, seen = pd.factorize(enriched["cell_id"], sort=True)
    at = np.searchsorted(cells, np.asarray(seen, dtype=object))[cell_code] if len(enriched) else np.zeros(0, np.int64)
    outages = np.bincount(at, minlength=n).astype(np.int64)
    cust_out = group_sum(at, enriched["customers_out"].to_numpy(dtype=np.int64), n)
    carried = group_max(at, enriched["cell_customers"].to_numpy(dtype=np.int64), n, floats=False)
    feeders = feeder_table(customers).reindex(cells)
    reference = feeders["cell_customers"].to_numpy(dtype=float, na_value=np.nan)
    cell_cust = np.where(np.isnan(reference), np.where(outages > 0, carried, 0), reference).astype(np.int64)
    return outages, cust_out, cell_cust


def _cell_weather(weather: pd.DataFrame, day: str, lat: np.ndarray, lon: np.ndarray,
                  n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per cell: the day's highest gust and total rain at its nearest station (NaN with no stations)."""
    grid = station_hour_grid(weather, day)
    if grid.empty:
        return np.full(n, np.nan), np.full(n, np.nan)
    st = nearest_station(lat, lon, grid)
    return np.nanmax(grid.gust, axis=1)[st], np.nansum(grid.rain_obs, axis=1)[st]


def _clusters(cells: list[str], outages: np.ndarray, cust_out: np.ndarray, lat: np.ndarray, lon: np.ndarray,
              gust: np.ndarray, risk: np.ndarray, stats: pd.DataFrame) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The damage clusters (anomalous cells connected through H3 adjacency), numbered 1.. by
    outages descending, then smallest cell id: each cell's cluster (-1: none) and one row each."""
    comps = connected_clusters(cells, anomalous_cells(cells, outages.astype(float)))
    cluster_id = np.full(len(cells), -1, dtype=np.int64)
    if not comps:
        return cluster_id, []
    pos = {c: i for i, c in enumerate(cells)}
    comps.sort(key=lambda comp: (-int(outages[[pos[c] for c in comp]].sum()), comp[0]))
    rows = []
    hourly = stats.set_index(["cell_id", "hour"])["outages"]  # outages per (cell, hour), as counted above
    for cid, comp in enumerate(comps, start=1):
        ix = np.array([pos[c] for c in comp])
        cluster_id[ix] = cid
        w = outages[ix].astype(float)
        by_hour = hourly.loc[[c for c in comp if outages[pos[c]] > 0]].groupby(level="hour").sum()
        member_gust = gust[ix]
        rows.append({
            "cluster_id": cid, "cell_count": len(comp), "outages": int(w.sum()), "customers_out": int(cust_out[ix].sum()),
            "center_lat": float(np.average(lat[ix], weights=w)), "center_lon": float(np.average(lon[ix], weights=w)),
            "peak_hour": int(by_hour.index[np.argmax(by_hour.to_numpy())]),
            "max_gust_ms": float(np.nanmax(member_gust)) if np.isfinite(member_gust).any() else np.nan,
            "mean_risk": float(risk[ix].mean()), "cell_ids": list(comp),
        })
    return cluster_id, rows
