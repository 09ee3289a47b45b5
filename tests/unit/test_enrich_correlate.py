"""Enrich and correlate on generated scenarios (pandas stands in for ingest) and on tiny hand-made frames."""

from __future__ import annotations

from pathlib import Path

import h3
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from assets.schemas import (
    CELL_HOUR_STATS,
    CELL_RISK,
    OUTAGES_ENRICHED,
    OUTAGES_RAW,
    STORM_CLUSTERS,
    WEATHER_RAW,
)
from assets.transforms.correlate import (
    BACKGROUND_K,
    _row_nanmedian,
    anomalous_cells,
    connected_clusters,
    correlate_storm,
    disk_members,
)
from assets.transforms.enrich import (
    ByContent,
    empty_frame,
    enrich_partition,
    feeder_table,
    station_hour_grid,
    terrain_table,
)
from pipeline.tools.generate import generate_scenario
from resources.settings import DEFAULT_REGIONS_FILE, Region, load_regions

DAY = "2026-09-01"
REGION = Region("testland", "Test Land", 30.0, 31.0, -90.0, -89.0)


# ---- ingest stand-in ---------------------------------------------------------------------------
def _ts(col: pd.Series) -> pd.Series:
    return pd.to_datetime(col.replace("", None), utc=True, format="ISO8601")


def load_partition(root: Path, part: dict) -> dict[str, pd.DataFrame]:
    """Read one generated partition like ingest would, minus the rows the truth marks as bad."""
    rid, day = part["region_id"], part["day"]
    bad = [b["line"] - 1 for b in part["bad_rows"]]  # skiprows is 0-based, header = 0
    o = pd.read_csv(root / rid / day / "outages.csv", dtype=str, keep_default_na=False, skiprows=bad)
    outages = pd.DataFrame({
        "region_id": rid, "day": day, "event_id": o["event_id"], "reported_at": _ts(o["reported_at"]),
        "lat": o["lat"].astype(float), "lon": o["lon"].astype(float), "customers_out": o["customers_out"].astype(np.int64),
        "cause": o["cause"], "restored_at": _ts(o["restored_at"]), "source_line": np.arange(len(o), dtype=np.int64) + 2,
    })
    w = pd.read_csv(root / rid / day / "weather.csv", dtype={"station_id": str})
    w["observed_at"] = _ts(w["observed_at"])
    w["day"] = day
    w["source_line"] = np.arange(len(w), dtype=np.int64) + 2
    cust = pd.read_csv(root / "reference" / "customers.csv", dtype={"cell_id": str, "feeder_id": str})
    terr = pd.read_csv(root / "reference" / "terrain.csv", dtype={"cell_id": str})
    for ref in (cust, terr):
        ref["source_line"] = np.arange(len(ref), dtype=np.int64) + 2
        ref["day"] = day
    return {"outages": outages[OUTAGES_RAW.names], "weather": w[WEATHER_RAW.names],
            "customers": cust[cust["region_id"] == rid].reset_index(drop=True),
            "terrain": terr[terr["region_id"] == rid].reset_index(drop=True)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = tmp_path_factory.mktemp("scenario")
    regions = load_regions(DEFAULT_REGIONS_FILE)[:2]
    truth = generate_scenario(root, regions, days=1, rows_per_partition=20_000, seed=7)
    by_id = {r.region_id: r for r in regions}
    out = []
    for part in truth["partitions"].values():
        frames = load_partition(root, part)
        region = by_id[part["region_id"]]
        enriched = enrich_partition(frames["outages"], frames["weather"], frames["customers"], frames["terrain"],
                                  region=region, day=part["day"])[0]
        stats, risk, clusters = correlate_storm(enriched, frames["weather"], frames["customers"], frames["terrain"],
                                                region=region, day=part["day"])
        out.append({"truth": part, "region": region, **frames, "enriched": enriched, "stats": stats, "risk": risk,
                    "clusters": clusters})
    return out


# ---- generated scenario --------------------------------------------------------------------------
def test_every_planted_cluster_is_found_with_few_false_ones(results: list[dict]) -> None:
    for res in results:
        found = [set(cells) for cells in res["clusters"]["cell_ids"]]
        planted = [set(cl["cells"]) for cl in res["truth"]["clusters"]]
        for cl in res["truth"]["clusters"]:
            hits = [f for f in found if cl["center_cell"] in f]
            assert hits, f"planted cluster at {cl['center_cell']} not detected"
            assert len(hits[0] & set(cl["cells"])) >= 0.7 * len(cl["cells"])
            assert len(hits[0] - set(cl["cells"])) <= len(cl["cells"])  # not swallowed by a huge blob
        false = [f for f in found if not any(f & p for p in planted)]
        assert len(false) <= 1, f"{len(false)} clusters match no planted one"


def test_risk_is_higher_in_planted_cluster_cells(results: list[dict]) -> None:
    for res in results:
        planted = {c for cl in res["truth"]["clusters"] for c in cl["cells"]}
        inside = res["risk"]["cell_id"].isin(planted)
        assert inside.sum() >= 7
        assert res["risk"]["risk"][inside].mean() > res["risk"]["risk"][~inside].mean() + 0.1


def test_outputs_convert_to_the_arrow_schemas(results: list[dict]) -> None:
    for res in results:
        for df, schema in ((res["enriched"], OUTAGES_ENRICHED), (res["stats"], CELL_HOUR_STATS),
                           (res["risk"], CELL_RISK), (res["clusters"], STORM_CLUSTERS)):
            assert list(df.columns) == schema.names
            table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
            assert table.num_rows == len(df)
            for field in schema:
                if not field.nullable:
                    assert table.column(field.name).null_count == 0, field.name


def test_enriched_rows_are_consistent(results: list[dict]) -> None:
    for res in results:
        e, o = res["enriched"], res["outages"]
        assert len(e) == len(o) and e["event_id"].is_unique
        assert e["event_id"].tolist() == sorted(o["event_id"].tolist())
        assert (e["region_id"] == res["region"].region_id).all() and (e["day"] == DAY).all()
        sample = e.sample(200, random_state=1)
        assert [h3.latlng_to_cell(a, b, 7) for a, b in zip(sample["lat"], sample["lon"], strict=True)] == \
            sample["cell_id"].tolist()
        assert (e["hour"] == e["reported_at"].dt.hour).all()
        restored = e["restored_at"].notna()
        assert e["restoration_min"].notna().tolist() == restored.tolist()
        assert (e.loc[restored, "restoration_min"] >= 0).all()
        cust = res["customers"].groupby("cell_id")["customers"].sum()
        assert (e["cell_customers"].to_numpy() == cust.reindex(e["cell_id"]).fillna(0).to_numpy()).all()
        assert e["gust_ms"].notna().all() and e["vegetation_index"].notna().all()
        assert e["gust_ms"].between(0, 120).all()


def test_correlate_tables_are_consistent(results: list[dict]) -> None:
    for res in results:
        stats, risk, clusters, e = res["stats"], res["risk"], res["clusters"], res["enriched"]
        assert stats["outages"].sum() == len(e) == risk["outages"].sum()
        assert not stats.duplicated(["cell_id", "hour"]).any()
        assert risk["cell_id"].is_unique and risk["cell_id"].is_monotonic_increasing
        assert set(res["terrain"]["cell_id"]) <= set(risk["cell_id"])
        assert risk["risk"].between(0, 1).all() and risk["affected_pct"].between(0, 100).all()
        assert clusters["cluster_id"].tolist() == list(range(1, len(clusters) + 1))
        assert clusters["outages"].is_monotonic_decreasing
        for row in clusters.itertuples():
            assert list(row.cell_ids) == sorted(row.cell_ids) and row.cell_count == len(row.cell_ids) >= 3
            members = risk[risk["cluster_id"] == row.cluster_id]
            assert sorted(members["cell_id"]) == list(row.cell_ids)
            assert members["outages"].sum() == row.outages
            assert row.mean_risk == pytest.approx(members["risk"].mean())
            hours = e[e["cell_id"].isin(row.cell_ids)].groupby("hour").size()
            assert row.peak_hour == hours.idxmax()
        assert risk["cluster_id"].notna().sum() == clusters["cell_count"].sum()


def test_correlate_is_deterministic_under_row_order(results: list[dict]) -> None:
    res = results[0]
    shuffled = res["enriched"].sample(frac=1.0, random_state=3).reset_index(drop=True)
    again = correlate_storm(shuffled, res["weather"], res["customers"], res["terrain"], region=res["region"], day=DAY)
    for mine, theirs in zip(again, (res["stats"], res["risk"], res["clusters"]), strict=True):
        pd.testing.assert_frame_equal(mine, theirs)
    enriched_again = enrich_partition(res["outages"].iloc[::-1], res["weather"], res["customers"], res["terrain"],
                                    region=res["region"], day=DAY)[0]
    pd.testing.assert_frame_equal(enriched_again, res["enriched"])


# ---- empty input -------------------------------------------------------------------------------------
def test_empty_inputs(results: list[dict]) -> None:
    res = results[0]
    empty = res["outages"].iloc[0:0]
    e = enrich_partition(empty, res["weather"], res["customers"], res["terrain"], region=res["region"], day=DAY)[0]
    assert list(e.columns) == OUTAGES_ENRICHED.names and len(e) == 0
    pa.Table.from_pandas(e, schema=OUTAGES_ENRICHED, preserve_index=False)
    stats, risk, clusters = correlate_storm(e, res["weather"], res["customers"], res["terrain"],
                                            region=res["region"], day=DAY)
    assert len(stats) == 0 and len(clusters) == 0
    assert len(risk) == res["terrain"]["cell_id"].nunique() and (risk["outages"] == 0).all()
    none = [df.iloc[0:0] for df in (res["weather"], res["customers"], res["terrain"])]
    e2 = enrich_partition(empty, *none, region=res["region"], day=DAY)[0]
    outs = correlate_storm(e2, *none, region=res["region"], day=DAY)
    for df, schema in zip((stats, risk, clusters, *outs), (CELL_HOUR_STATS, CELL_RISK, STORM_CLUSTERS) * 2,
                          strict=True):
        assert list(df.columns) == schema.names
        pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    assert all(len(df) == 0 for df in outs)


# ---- tiny hand-made frames ---------------------------------------------------------------------------
def _cell(lat: float, lon: float) -> str:
    return h3.latlng_to_cell(lat, lon, 7)


def _outages(rows: list[tuple[str, float, float, str, str | None]]) -> pd.DataFrame:
    return pd.DataFrame({
        "region_id": REGION.region_id, "day": DAY, "event_id": [r[0] for r in rows],
        "reported_at": pd.to_datetime([r[3] for r in rows], utc=True, format="ISO8601"),
        "lat": [r[1] for r in rows], "lon": [r[2] for r in rows], "customers_out": np.full(len(rows), 5, np.int64),
        "cause": "wind", "restored_at": pd.to_datetime([r[4] for r in rows], utc=True, format="ISO8601"),
        "source_line": np.arange(len(rows), dtype=np.int64) + 2,
    })


def _weather(rows: list[tuple[str, float, float, str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame({
        "region_id": REGION.region_id, "day": DAY, "station_id": [r[0] for r in rows],
        "observed_at": pd.to_datetime([r[3] for r in rows], utc=True, format="ISO8601"), "lat": [r[1] for r in rows],
        "lon": [r[2] for r in rows], "wind_gust_ms": [r[4] for r in rows], "rain_mm": [r[5] for r in rows],
        "pressure_hpa": 1000.0, "source_line": np.arange(len(rows), dtype=np.int64) + 2,
    })


def _refs(cell_a: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    customers = pd.DataFrame({"region_id": REGION.region_id, "day": DAY, "cell_id": [cell_a] * 4,
                              "feeder_id": ["f-b", "f-a", "f-c", "f-c"], "customers": np.array([300, 300, 100, 150]),
                              "source_line": np.arange(4) + 2})
    terrain = pd.DataFrame({"region_id": REGION.region_id, "day": DAY, "cell_id": [cell_a],
                            "elevation_m": [12.0], "slope_deg": [4.0], "vegetation_index": [0.7],
                            "flood_zone": [True], "source_line": [2]})
    return customers, terrain


def test_enrich_hand_made_cases() -> None:
    a_lat, a_lon = 30.5, -89.5
    b_lat, b_lon = 30.9, -89.1
    cell_a, cell_b = _cell(a_lat, a_lon), _cell(b_lat, b_lon)
    customers, terrain = _refs(cell_a)
    outages = _outages([
        ("e3", b_lat, b_lon, "2026-09-01T10:20:00Z", None),
        ("e1", a_lat, a_lon, "2026-09-01T04:30:00Z", "2026-09-01T06:00:30Z"),
        ("e2", a_lat + 0.001, a_lon, "2026-09-01T13:05:00-05:00", "2026-09-02T01:05:00Z"),
    ])
    weather = _weather([
        ("near_a", a_lat + 0.01, a_lon, "2026-09-01T03:10:00Z", 20.0, 1.0),
        ("near_a", a_lat + 0.01, a_lon, "2026-09-01T05:50:00Z", 30.0, 3.0),
        ("near_a", a_lat + 0.01, a_lon, "2026-09-01T18:00:00Z", 44.0, 9.0),
        ("near_a", a_lat + 0.01, a_lon, "2026-09-01T18:30:00Z", 41.0, 11.0),
        ("near_b", b_lat, b_lon - 0.05, "2026-09-01T10:00:00Z", 55.0, 7.0),
        ("far", 30.0, -90.0, "2026-09-01T04:00:00Z", 99.0, 99.0),
    ])
    e = enrich_partition(outages, weather, customers, terrain, region=REGION, day=DAY)[0].set_index("event_id")
    assert e.index.tolist() == ["e1", "e2", "e3"]
    # feeder: f-a and f-b tie at 300, f-c sums its two rows to 250 -> smallest id of the tie
    assert e.loc["e1", "feeder_id"] == "f-a" and e.loc["e1", "cell_customers"] == 850
    assert e.loc["e3", "cell_id"] == cell_b and e.loc["e3", "cell_customers"] == 0
    assert e.loc["e3", "feeder_id"] is None and np.isnan(e.loc["e3", "vegetation_index"])
    assert bool(e.loc["e1", "flood_zone"]) is True and pd.isna(e.loc["e3", "flood_zone"])
    # hour 4 is missing at near_a: hours 3 and 5 are equally near -> the earlier one
    assert e.loc["e1", "hour"] == 4 and e.loc["e1", "gust_ms"] == 20.0 and e.loc["e1", "rain_mm"] == 1.0
    # 13:05-05:00 is 18:05 UTC: max of the two observations in that hour
    assert e.loc["e2", "hour"] == 18 and e.loc["e2", "gust_ms"] == 44.0 and e.loc["e2", "rain_mm"] == 11.0
    assert e.loc["e3", "gust_ms"] == 55.0  # nearest station, not the stronger far one
    assert e.loc["e1", "restoration_min"] == pytest.approx(90.5)
    assert e.loc["e2", "restoration_min"] == pytest.approx(420.0)
    assert np.isnan(e.loc["e3", "restoration_min"])
    no_weather = enrich_partition(outages, weather.iloc[0:0], customers, terrain, region=REGION, day=DAY)[0]
    assert no_weather["gust_ms"].isna().all()
    pa.Table.from_pandas(no_weather, schema=OUTAGES_ENRICHED, preserve_index=False)


def test_cluster_detection_on_a_hand_made_grid() -> None:
    centre = _cell(30.5, -89.5)
    cells = np.array(sorted(h3.grid_disk(centre, 9)), dtype=object)
    rng = np.random.default_rng(0)
    counts = rng.poisson(4.0, len(cells)).astype(float)
    assert not connected_clusters(cells, anomalous_cells(cells, counts))
    blob = set(h3.grid_disk(centre, 1))
    counts[np.isin(cells, list(blob))] = 40.0
    lone = next(c for c in cells if h3.grid_distance(c, centre) == 6)
    counts[cells == lone] = 60.0  # a single hot cell is not a cluster
    found = connected_clusters(cells, anomalous_cells(cells, counts))
    assert found == [sorted(blob)]


# ---- the neighbourhood lookup against h3's string API ----------------------------------------------
def _string_pairs(cells: np.ndarray, k: int, of: list[int]) -> set[tuple[int, int]]:
    """(i, j) with cells[j] in h3.grid_disk(cells[i], k), looked up by string (the last of equal keys)."""
    index = {c: i for i, c in enumerate(cells)}
    return {(i, index[n]) for i in of for n in h3.grid_disk(cells[i], k) if n in index}


def _string_mask(cells: np.ndarray, outages: np.ndarray) -> np.ndarray:
    """The anomaly rule of the correlate module's docstring, computed cell by cell with h3's string API."""
    index = {c: i for i, c in enumerate(cells)}
    out = np.zeros(len(cells), dtype=bool)
    for i, c in enumerate(cells):
        local = [outages[index[n]] for n in h3.grid_disk(c, BACKGROUND_K) if n in index]
        b = max(float(np.median(local)), 1.0)
        o = outages[i]
        out[i] = o >= 6 and o >= 3 * b and (o - b) / np.sqrt(b) >= 4
    return out


def _awkward_universe() -> np.ndarray:
    """Cells around a pentagon (short disks), with holes, an upper-case spelling and a repeated cell."""
    pentagon = sorted(h3.get_pentagons(7))[0]
    rng = np.random.default_rng(3)
    cells = sorted(h3.grid_disk(pentagon, 7))
    cells = [c for c in cells if c == pentagon or rng.random() > 0.15]
    return np.array([*cells, cells[5].upper(), cells[9]], dtype=object)


def test_disk_members_match_the_string_lookup() -> None:
    for cells, k in [(_awkward_universe(), BACKGROUND_K), (_awkward_universe(), 1),
                     (np.array(sorted(h3.grid_disk(_cell(30.5, -89.5), 8)), dtype=object), BACKGROUND_K),
                     (np.array([], dtype=object), BACKGROUND_K)]:
        for of in (None, np.arange(0, len(cells), 3)):
            rows, members = disk_members(cells, k, of)
            pairs = list(zip(rows.tolist(), members.tolist(), strict=True))
            assert len(pairs) == len(set(pairs))
            assert set(pairs) == _string_pairs(cells, k, range(len(cells)) if of is None else of.tolist())
            assert rows.tolist() == sorted(rows.tolist())


def test_anomalous_cells_match_the_rule_cell_by_cell() -> None:
    rng = np.random.default_rng(11)
    for cells in (_awkward_universe(), np.array(sorted(h3.grid_disk(_cell(30.5, -89.5), 9)), dtype=object)):
        for _ in range(3):
            counts = rng.poisson(rng.uniform(0.2, 5.0), len(cells)).astype(float)
            hot = rng.choice(len(cells), size=12, replace=False)
            counts[hot] += rng.integers(5, 60, size=12)  # some stand out, some do not
            expected = _string_mask(cells, counts)
            assert expected.any() and not expected.all()
            assert anomalous_cells(cells, counts).tolist() == expected.tolist()


def test_row_median_is_numpys_nanmedian() -> None:
    rng = np.random.default_rng(5)
    vals = rng.integers(0, 40, size=(300, 61)).astype(float)
    vals[rng.random(vals.shape) < rng.random((300, 1))] = np.nan  # rows from full to nearly empty
    vals[7] = np.nan  # a row without values
    vals[8, :] = rng.normal(size=61) * 1e3  # non-integers: the mean of the middle two, exactly
    with pytest.warns(RuntimeWarning):
        expected = np.nanmedian(vals, axis=1)
    assert np.array_equal(_row_nanmedian(vals), expected, equal_nan=True)
    assert _row_nanmedian(np.zeros((0, 61))).shape == (0,)


def test_empty_frame_helper_matches_schemas() -> None:
    for schema in (OUTAGES_ENRICHED, CELL_HOUR_STATS, CELL_RISK, STORM_CLUSTERS):
        df = empty_frame(schema)
        assert list(df.columns) == schema.names
        assert pa.Table.from_pandas(df, schema=schema, preserve_index=False).num_rows == 0


# ---- the per-cell reference tables and the station grid against plain pandas ----------------


def _reference(seed: int, rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Customers and terrain rows with repeated cells, repeated (cell, feeder) pairs and ties."""
    rng = np.random.default_rng(seed)
    cells = [h3.latlng_to_cell(29.5 + i * 0.01, -90.0, 7) for i in range(max(rows // 4, 1))]
    customers = pd.DataFrame({
        "cell_id": rng.choice(cells, rows),
        "feeder_id": rng.choice([f"F{k:02d}" for k in range(6)], rows),
        "customers": rng.integers(0, 4, rows) * 10,  # few values: ties between feeders are common
        "source_line": rng.permutation(rows) + 2,
    })
    terrain = pd.DataFrame({
        "cell_id": rng.choice(cells, rows), "elevation_m": rng.normal(5, 2, rows), "slope_deg": rng.random(rows),
        "vegetation_index": rng.random(rows), "flood_zone": rng.random(rows) < 0.3,
        "source_line": rng.permutation(rows) + 2,
    })
    return customers, terrain


def _feeders_by_group_by(customers: pd.DataFrame) -> pd.DataFrame:
    """What :func:`feeder_table` means, said with pandas' group-by, sort and de-duplication."""
    per = customers.groupby(["cell_id", "feeder_id"], sort=True, as_index=False)["customers"].sum()
    best = per.sort_values(["cell_id", "customers", "feeder_id"], ascending=[True, False, True], kind="stable")
    best = best.drop_duplicates("cell_id").set_index("cell_id")
    total = per.groupby("cell_id", sort=True)["customers"].sum()
    return pd.DataFrame({"feeder_id": best["feeder_id"].astype(object), "cell_customers": total.astype(np.int64)})


def test_a_reference_result_is_kept_for_its_content_only() -> None:
    """``ByContent``: a region's reference rows of another day (the same cells, feeders and
    counts) get the kept result, as a copy the caller may change; a frame that differs in one
    value the function reads, or in a row, is computed again; columns it does not read are not
    compared."""
    calls = []

    def derive(frame: pd.DataFrame) -> pd.DataFrame:
        calls.append(len(frame))
        return feeder_table.fn(frame)

    table = ByContent(derive, feeder_table.columns)
    customers, _ = _reference(3, 200)
    first = table(customers.assign(day="2026-09-01"))
    again = table(customers.assign(day="2026-09-02"))
    assert calls == [200]
    pd.testing.assert_frame_equal(again, first)
    again.iloc[0, again.columns.get_loc("cell_customers")] = -1  # the caller's own copy
    pd.testing.assert_frame_equal(table(customers), first)
    assert calls == [200]
    changed = customers.copy()
    changed.loc[changed.index[-1], "customers"] += 10
    pd.testing.assert_frame_equal(table(changed), feeder_table.fn(changed))
    table(customers.iloc[:-1])
    assert calls == [200, 200, 199]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_feeder_and_terrain_tables_match_their_pandas_definitions(seed: int) -> None:
    customers, terrain = _reference(seed, 400)
    pd.testing.assert_frame_equal(feeder_table(customers), _feeders_by_group_by(customers))
    cols = ["elevation_m", "slope_deg", "vegetation_index", "flood_zone"]
    want = terrain.sort_values(["cell_id", "source_line"], kind="stable").drop_duplicates("cell_id").set_index("cell_id")
    pd.testing.assert_frame_equal(terrain_table(terrain), want[cols])
    assert len(feeder_table(customers.iloc[0:0])) == 0 and len(terrain_table(terrain.iloc[0:0])) == 0
    # a row without an id belongs to no cell and no feeder, as a group-by leaves it out
    holed = customers.astype({"cell_id": object, "feeder_id": object})
    holed.loc[::5, "cell_id"] = None
    holed.loc[1::7, "feeder_id"] = None
    pd.testing.assert_frame_equal(feeder_table(holed), _feeders_by_group_by(holed))
    holed = terrain.astype({"cell_id": object})
    holed.loc[::4, "cell_id"] = None
    got = terrain_table(holed)
    assert got.index.notna().all()
    kept = holed[holed["cell_id"].notna()]
    want = kept.sort_values(["cell_id", "source_line"], kind="stable").drop_duplicates("cell_id").set_index("cell_id")
    pd.testing.assert_frame_equal(got, want[cols])


def test_station_grid_takes_each_hours_strongest_reading_and_each_stations_first_position() -> None:
    day = "2026-09-01"
    rows = pd.DataFrame({
        "station_id": ["S2", "S1", "S2", "S1", "S2", "S3"],
        "observed_at": pd.to_datetime(["2026-09-01T03:10Z", "2026-09-01T01:00Z", "2026-09-01T00:30Z",
                                       "2026-09-01T01:40Z", "2026-09-01T03:50Z", "2026-08-31T23:00Z"], utc=True),
        "lat": [30.2, 30.1, 30.0, 30.9, 30.3, 31.0], "lon": [-90.0, -89.0, -90.5, -89.9, -90.1, -91.0],
        "wind_gust_ms": [12.0, 20.0, 8.0, 25.0, 30.0, 99.0], "rain_mm": [1.0, 0.0, 2.0, 0.5, 0.2, 9.0],
    })
    for frame in (rows, rows.iloc[::-1], rows.assign(observed_at=rows["observed_at"].astype(str))):
        grid = station_hour_grid(frame, day)
        assert list(grid.station_ids) == ["S1", "S2"]  # S3 reported only the day before
        assert list(grid.lat) == [30.1, 30.0] and list(grid.lon) == [-89.0, -90.5]  # first reports
        assert grid.gust[0, 1] == 25.0 and grid.gust[1, 3] == 30.0 and grid.gust[1, 0] == 8.0
        assert grid.rain_obs[1, 3] == 1.0 and np.isnan(grid.rain_obs[1, 2])
        assert grid.gust[1, 1] == 8.0 and grid.gust[1, 2] == 30.0  # missing hours: the nearest, ties earlier


def test_weather_coverage_counts_the_hours_the_feed_has_reached() -> None:
    """The day in progress: a feed that has reached 10:00 is graded on hours 0-10, not on the 24."""
    lat, lon = 30.5, -89.5
    customers, terrain = _refs(_cell(lat, lon))
    outages = _outages([("e1", lat, lon, "2026-09-01T09:20:00Z", None)])
    rows = [(st, lat + i * 0.1, lon, f"2026-09-01T{h:02d}:05:00Z", 20.0, 1.0)
            for i, st in enumerate(("s1", "s2")) for h in range(11)]
    coverage = enrich_partition(outages, _weather(rows), customers, terrain, region=REGION, day=DAY)[1]
    assert (coverage["station_hours"], coverage["station_hours_observed"]) == (2 * 11, 2 * 11)
    # A gap inside the hours reached still counts: s2 silent at 04:00.
    gap = [r for r in rows if not (r[0] == "s2" and r[3].startswith("2026-09-01T04"))]
    coverage = enrich_partition(outages, _weather(gap), customers, terrain, region=REGION, day=DAY)[1]
    assert (coverage["station_hours"], coverage["station_hours_observed"]) == (2 * 11, 2 * 11 - 1)
