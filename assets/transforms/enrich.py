"""The enrich transform: put every accepted outage on the H3 grid and attach what is known there.

Each outage gets its resolution-7 cell, the cell's main feeder and customer count, the cell's
terrain and the weather of the nearest station in the outage's hour.  Everything is computed
per *unique cell* (a few thousand) and then broadcast to the rows, so a partition of a million
outages costs one H3 call per row and a handful of vectorised gathers.

The weather helpers (:func:`station_hour_grid`, :func:`nearest_station`, :func:`cell_centres`)
are shared with the correlate transform so that both phases see a cell's weather the same way;
the per-group reductions (:func:`group_sum`, :func:`group_max`) and :func:`utc` serve correlate
and present too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import h3
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from h3.api import basic_int

from assets.schemas import OUTAGES_ENRICHED
from resources.settings import Region

RES = 7
HOURS = 24


@dataclass(frozen=True)
class StationGrid:
    """Hourly weather of the partition's stations.

    Attributes:
        lat, lon: station positions (first observation of each station).
        gust, rain: ``(stations, 24)`` arrays; ``gust``/``rain`` have missing hours filled from the
            station's nearest observed hour (ties: the earlier hour); ``rain_obs`` keeps NaN there.
    """

    station_ids: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    gust: np.ndarray
    rain: np.ndarray
    rain_obs: np.ndarray

    @property
    def empty(self) -> bool:
        return len(self.station_ids) == 0

    @property
    def observed(self) -> np.ndarray:
        """``(stations, 24)``: whether the station reported in that hour (rain is never null in a reading)."""
        return ~np.isnan(self.rain_obs)


def empty_frame(schema: pa.Schema) -> pd.DataFrame:
    """A zero-row frame whose dtypes round-trip through ``pa.Table.from_pandas(..., schema=schema)``."""
    return schema.empty_table().to_pandas()


def utc(series: pd.Series) -> pd.Series:
    """Timestamps as tz-aware UTC (naive values are taken to be UTC already); a column read from
    the lake is that already and is returned as it is (``pd.to_datetime`` would look at every value)."""
    dtype = series.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        return series if str(dtype.tz) == "UTC" else series.dt.tz_convert("UTC")
    return pd.to_datetime(series, utc=True)


def day_start(day: str) -> pd.Timestamp:
    return pd.Timestamp(day, tz="UTC")


#: Cell centres kept per process: a region's reference cells recur in every partition of the
#: region (correlate places all of them, each day). Past this many the kept ones are dropped.
CELL_CENTRES_KEPT = 500_000
_centres: dict[str, tuple[float, float]] = {}


def cell_centres(cells: np.ndarray | list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Centre lat/lon of H3 cells given as strings (kept per process, see :data:`CELL_CENTRES_KEPT`)."""
    kept = _centres
    if len(kept) > CELL_CENTRES_KEPT:
        kept.clear()
    pts = []
    for c in cells:
        at = kept.get(c)
        if at is None:
            at = kept[c] = h3.cell_to_latlng(c)
        pts.append(at)
    out = np.array(pts, dtype=float).reshape(-1, 2)
    return out[:, 0], out[:, 1]


def nearest_station(lat: np.ndarray, lon: np.ndarray, grid: StationGrid) -> np.ndarray:
    """Index of the nearest station for every point (equirectangular distance; ties: lower index).

    The equirectangular approximation is exact enough inside a region of ~100 km and, unlike a
    haversine, is a cheap broadcast over (points, stations).
    """
    if len(lat) == 0 or grid.empty:
        return np.zeros(len(lat), dtype=np.int64)
    coslat = np.cos(np.radians(lat))[:, None]
    d2 = (lat[:, None] - grid.lat[None, :]) ** 2 + ((lon[:, None] - grid.lon[None, :]) * coslat) ** 2
    return np.argmin(d2, axis=1)


def _fill_nearest_hour(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    out = values.copy()
    hours = np.arange(values.shape[1])
    for s in range(values.shape[0]):
        avail = np.flatnonzero(present[s])
        if len(avail) == 0 or len(avail) == values.shape[1]:
            continue
        pos = np.clip(np.searchsorted(avail, hours), 1, len(avail)) if len(avail) > 1 else np.ones_like(hours)
        left = avail[np.maximum(pos - 1, 0)]
        right = avail[np.minimum(pos, len(avail) - 1)]
        pick = np.where(np.abs(hours - left) <= np.abs(right - hours), left, right)
        out[s] = values[s, pick]
    return out


def group_sum(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per group ``0..n-1``: the sum of its ``values`` as int64 (0 for a group without any)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, groups, values)
    return out


def group_max(groups: np.ndarray, values: np.ndarray, n: int, *, floats: bool) -> np.ndarray:
    """Per group ``0..n-1``: the largest of ``values`` (floats: NaN skipped, NaN when none)."""
    out = np.full(n, np.nan) if floats else np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    (np.fmax if floats else np.maximum).at(out, groups, values)
    return out


def _firsts(groups: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The first position of each group in ``order`` (positions sorted by group first)."""
    ordered = groups[order]
    return order[np.r_[True, ordered[1:] != ordered[:-1]]]


def station_hour_grid(weather: pd.DataFrame, day: str) -> StationGrid:
    """Per station and UTC hour of ``day``: the max gust and max rain of the hour's observations.

    Max (not mean) because a duplicated or sub-hourly report must not dilute the strongest
    reading, and an hourly rain accumulation reported twice must not be summed.
    """
    if weather is None or len(weather) == 0:
        z = np.zeros((0, HOURS))
        return StationGrid(np.array([], dtype=object), np.zeros(0), np.zeros(0), z, z, z)
    obs = utc(weather["observed_at"])
    hour = ((obs - day_start(day)) // pd.Timedelta(hours=1)).to_numpy()
    keep = (hour >= 0) & (hour < HOURS) & weather["station_id"].notna().to_numpy()
    if not keep.any():
        return station_hour_grid(weather.iloc[0:0], day)
    hour = hour[keep].astype(np.int64)
    station, ids = pd.factorize(weather["station_id"].to_numpy()[keep], sort=True)
    first = _firsts(station, np.lexsort((obs.array.asi8[keep], station)))  # each station's first report
    gust = np.full((len(ids), HOURS), np.nan)
    rain = np.full((len(ids), HOURS), np.nan)
    np.fmax.at(gust, (station, hour), weather["wind_gust_ms"].to_numpy(float)[keep])
    np.fmax.at(rain, (station, hour), weather["rain_mm"].to_numpy(float)[keep])
    present = np.zeros((len(ids), HOURS), dtype=bool)
    present[station, hour] = True
    return StationGrid(np.asarray(ids, dtype=object), weather["lat"].to_numpy(float)[keep][first],
                       weather["lon"].to_numpy(float)[keep][first],
                       _fill_nearest_hour(gust, present), _fill_nearest_hour(rain, present), rain)


def cells_of_points(lat: np.ndarray, lon: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """H3 res-7 cells of points as (unique cell strings sorted, inverse index per point)."""
    to_cell = basic_int.latlng_to_cell
    ints = np.fromiter((to_cell(a, b, RES) for a, b in zip(lat.tolist(), lon.tolist(), strict=True)),
                       dtype=np.uint64, count=len(lat))
    uniq, inverse = np.unique(ints, return_inverse=True)
    # hex strings of equal length sort like the integers, so ``uniq`` strings are sorted too
    return np.array([h3.int_to_str(int(x)) for x in uniq], dtype=object), inverse


class ByContent:
    """A function of a reference frame whose results are kept per process, each for the content it
    was computed from: a region's reference rows are the same in every partition of the region
    (each day's ingest writes the region's rows of the reference files), and enrich and correlate
    both derive the same tables from them. A frame whose ``columns`` (the ones ``fn`` reads) equal
    a kept one's, value for value and in order, gets that result again, as a copy; any other is
    computed. The last :data:`REFERENCE_RESULTS_KEPT` results are kept.

    Comparing a region's rows is much cheaper than deriving the feeder and terrain tables from
    them, which a small partition would otherwise do twice, a noticeable share of its compute.
    """

    def __init__(self, fn, columns: tuple[str, ...]):  # noqa: ANN001 - Callable[[pd.DataFrame], pd.DataFrame]
        self.fn = fn
        self.columns = columns
        self.kept: dict[tuple, tuple[pd.DataFrame, pd.DataFrame]] = {}
        self.lock = threading.Lock()

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        cols = [c for c in self.columns if c in frame.columns]
        key = (tuple(cols), len(frame), frame[cols[0]].iat[0] if len(frame) and cols else None)
        with self.lock:
            hit = self.kept.get(key)
        if hit is not None and all(frame[c].equals(hit[0][c]) for c in cols):
            return hit[1].copy()
        out = self.fn(frame)
        with self.lock:
            if len(self.kept) >= REFERENCE_RESULTS_KEPT:
                self.kept.pop(next(iter(self.kept)))
            self.kept[key] = (frame[cols].copy(), out.copy())
        return out


#: Results of :class:`ByContent` functions kept per function (a region's results each).
REFERENCE_RESULTS_KEPT = 64


def _feeder_table(customers: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the feeder with most customers (ties: smallest feeder_id) and the cell's total.

    Vectorised over factorized ids (a pandas group-by, sort and de-duplication cost about three
    times as much on a region's few thousand reference rows, and both enrich and correlate ask).
    """
    if len(customers) == 0:
        return pd.DataFrame({"feeder_id": pd.Series([], dtype=object),
                             "cell_customers": pd.Series([], dtype=np.int64)}, index=pd.Index([], name="cell_id"))
    cell_code, cells = pd.factorize(customers["cell_id"], sort=True)
    feeder_code, feeders = pd.factorize(customers["feeder_id"], sort=True)
    counted = customers["customers"].to_numpy(dtype=np.int64)
    keyed = (cell_code >= 0) & (feeder_code >= 0)  # a null id is in no group (as a group-by drops it)
    if not keyed.all():
        cell_code, feeder_code, counted = cell_code[keyed], feeder_code[keyed], counted[keyed]
    pairs, inverse = np.unique(cell_code.astype(np.int64) * len(feeders) + feeder_code, return_inverse=True)
    sums = group_sum(inverse, counted, len(pairs))
    pair_cell, pair_feeder = pairs // len(feeders), pairs % len(feeders)
    best = _firsts(pair_cell, np.lexsort((pair_feeder, -sums, pair_cell)))  # most customers, then smallest id
    total = group_sum(pair_cell, sums, len(cells))
    return pd.DataFrame({"feeder_id": np.asarray(feeders, dtype=object)[pair_feeder[best]],
                         "cell_customers": total[pair_cell[best]]},
                        index=pd.Index(np.asarray(cells, dtype=object)[pair_cell[best]], name="cell_id"))


def _terrain_table(terrain: pd.DataFrame) -> pd.DataFrame:
    """One terrain row per cell (the first by source line when the reference repeats a cell)."""
    cols = ["elevation_m", "slope_deg", "vegetation_index", "flood_zone"]
    if len(terrain) == 0:
        return pd.DataFrame({c: pd.Series([], dtype=float) for c in cols}, index=pd.Index([], name="cell_id"))
    cell_code, cells = pd.factorize(terrain["cell_id"], sort=True)
    keys = (terrain["source_line"].to_numpy(), cell_code) if "source_line" in terrain.columns else (cell_code,)
    first = _firsts(cell_code, np.lexsort(keys))
    first = first[cell_code[first] >= 0]  # rows without a cell id describe no cell
    out = terrain[cols].iloc[first]
    out.index = pd.Index(np.asarray(cells, dtype=object)[cell_code[first]], name="cell_id")
    return out


#: Per cell: the feeder with most customers and the cell's total (:func:`_feeder_table`), kept per region's rows.
feeder_table = ByContent(_feeder_table, ("cell_id", "feeder_id", "customers"))
#: One terrain row per cell (:func:`_terrain_table`), kept per region's rows.
terrain_table = ByContent(_terrain_table, ("cell_id", "source_line", "elevation_m", "slope_deg",
                                           "vegetation_index", "flood_zone"))


def enrich_partition(outages: pd.DataFrame, weather: pd.DataFrame, customers: pd.DataFrame, terrain: pd.DataFrame,
                     *, region: Region, day: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """Enrich one partition's accepted outages (schema OUTAGES_RAW) to OUTAGES_ENRICHED, and measure
    its weather coverage.

    Returns:
        A frame with exactly the columns of ``OUTAGES_ENRICHED`` in order, sorted by ``event_id``.
        ``gust_ms``/``rain_mm`` are the nearest station's (to the cell centre) values in the
        outage's hour, or of that station's nearest observed hour when the hour is missing; null
        when the partition has no weather.  ``restoration_min`` is null while not restored.

        And the weather coverage the batch's signal quality is graded on (:mod:`assets.quality`):
        ``outages_with_reading`` (the nearest station reported in the outage's own hour),
        ``station_hours`` (stations seen that day x the hours the feed has reached: up to its
        last hour with a reading, so that the day in progress is not graded on hours still to
        come; an outage in an hour no station reported is counted by ``outages_with_reading``
        still) and ``station_hours_observed``.
    """
    names = OUTAGES_ENRICHED.names
    grid = station_hour_grid(weather, day)
    observed = grid.observed
    hours = observed.any(axis=0).nonzero()[0]
    reached = observed[:, : int(hours[-1]) + 1] if len(hours) else observed
    coverage = {"outages_with_reading": 0, "station_hours": int(reached.size),
                "station_hours_observed": int(reached.sum())}
    if len(outages) == 0:
        return empty_frame(OUTAGES_ENRICHED), coverage
    order = pc.sort_indices(pa.array(outages["event_id"].astype(object).to_numpy(), pa.string())).to_numpy()
    o = outages.iloc[order]
    lat, lon = o["lat"].to_numpy(float), o["lon"].to_numpy(float)
    cells, inv = cells_of_points(lat, lon)
    reported = utc(o["reported_at"]).reset_index(drop=True)
    restored = utc(o["restored_at"]).reset_index(drop=True)
    hour = reported.dt.hour.to_numpy().astype(np.int32)

    feeders = feeder_table(customers).reindex(cells)
    cell_feeder = feeders["feeder_id"].to_numpy(dtype=object)
    cell_feeder = np.where(pd.isna(cell_feeder), None, cell_feeder)
    cell_cust = feeders["cell_customers"].fillna(0).to_numpy().astype(np.int64)
    terr = terrain_table(terrain).reindex(cells)

    if grid.empty:
        gust = rain = np.full(len(o), np.nan)
    else:
        clat, clon = cell_centres(cells)
        st = nearest_station(clat, clon, grid)[inv]
        gust, rain = grid.gust[st, hour], grid.rain[st, hour]
        coverage["outages_with_reading"] = int(observed[st, hour].sum())

    cell_flood = pd.array([None if pd.isna(v) else bool(v) for v in terr["flood_zone"]], dtype="boolean")
    out = pd.DataFrame({
        "region_id": region.region_id,
        "day": day,
        "event_id": o["event_id"].astype(object).to_numpy(),
        "reported_at": reported,
        "restored_at": restored,
        "hour": hour,
        "lat": lat,
        "lon": lon,
        "cell_id": cells[inv],
        "customers_out": o["customers_out"].to_numpy().astype(np.int64),
        "cause": o["cause"].astype(object).to_numpy(),
        "feeder_id": cell_feeder[inv],
        "cell_customers": cell_cust[inv],
        "elevation_m": terr["elevation_m"].to_numpy(float)[inv],
        "slope_deg": terr["slope_deg"].to_numpy(float)[inv],
        "vegetation_index": terr["vegetation_index"].to_numpy(float)[inv],
        "flood_zone": cell_flood.take(inv),
        "gust_ms": gust,
        "rain_mm": rain,
        "restoration_min": (restored - reported).dt.total_seconds().to_numpy() / 60.0,
    })
    return out[names], coverage
