"""The synthetic scenario generator: determinism, exact counts, recorded bad rows, contract rules."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import h3
import pytest

from assets.schemas import OUTAGES_CSV_COLUMNS, WEATHER_CSV_COLUMNS
from pipeline.tools.generate import BAD_KINDS, generate_scenario
from resources.settings import DEFAULT_REGIONS_FILE, Region, load_regions

ROWS = 4000


@pytest.fixture(scope="module")
def regions() -> list[Region]:
    return load_regions(DEFAULT_REGIONS_FILE)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, regions: list[Region]) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("landing")
    truth = generate_scenario(root, regions[:2], days=2, rows_per_partition=ROWS, seed=11, bad_rows=0.01)
    return root, truth


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _ts(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    assert value.tzinfo is not None, text
    return value.astimezone(dt.UTC)


def _day_bounds(day: str) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def test_same_arguments_give_identical_bytes(tmp_path: Path, regions: list[Region]) -> None:
    a = generate_scenario(tmp_path / "a", regions[:2], days=2, rows_per_partition=3000, seed=5)
    b = generate_scenario(tmp_path / "b", regions[:2], days=2, rows_per_partition=3000, seed=5)
    assert a == b
    fa, fb = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert fa == fb
    assert "_truth/scenario.json" in fa and "reference/customers.csv" in fa
    c = generate_scenario(tmp_path / "c", regions[:2], days=2, rows_per_partition=3000, seed=6)
    assert _files(tmp_path / "c") != fa
    assert c["seed"] == 6


def test_a_region_is_the_same_whether_generated_alone_or_with_others(tmp_path: Path, regions: list[Region]) -> None:
    generate_scenario(tmp_path / "one", regions[:1], days=1, rows_per_partition=2000, seed=3)
    generate_scenario(tmp_path / "three", regions[:3], days=1, rows_per_partition=2000, seed=3)
    rid = regions[0].region_id
    for name in ("outages.csv", "weather.csv"):
        one = (tmp_path / "one" / rid / "2026-09-01" / name).read_bytes()
        assert one == (tmp_path / "three" / rid / "2026-09-01" / name).read_bytes()
    assert not (tmp_path / "one" / regions[1].region_id).exists()


def test_exact_row_counts_and_truth_file(scenario: tuple[Path, dict], regions: list[Region]) -> None:
    root, truth = scenario
    assert json.loads((root / "_truth" / "scenario.json").read_text()) == truth
    text = (root / "_truth" / "scenario.json").read_text()
    assert text == json.dumps(truth, sort_keys=True, indent=1) + "\n"
    assert sorted(truth["partitions"]) == sorted(
        f"{r.region_id}/{d}" for r in regions[:2] for d in ("2026-09-01", "2026-09-02"))
    assert len(truth["storm"]["track"]) == 48
    for key, part in truth["partitions"].items():
        outages = _lines(root / key / "outages.csv")
        assert outages[0] == ",".join(OUTAGES_CSV_COLUMNS)
        assert len(outages) - 1 == ROWS == part["rows"]["outages"]
        assert part["rows"]["bad"] == len(part["bad_rows"]) == round(0.01 * ROWS)
        assert part["rows"]["good"] == ROWS - part["rows"]["bad"]
        weather = _lines(root / key / "weather.csv")
        assert weather[0] == ",".join(WEATHER_CSV_COLUMNS)
        assert len(weather) - 1 == part["rows"]["weather"] > 0
        assert 2 <= len(part["clusters"]) <= 3
        for cl in part["clusters"]:
            assert sorted(h3.grid_disk(cl["center_cell"], cl["k"])) == cl["cells"]
            assert cl["outages"] > 0


def test_bad_rows_are_malformed_as_recorded(scenario: tuple[Path, dict], regions: list[Region]) -> None:
    root, truth = scenario
    boxes = {r.region_id: r for r in regions}
    kinds_seen: set[str] = set()
    for key, part in truth["partitions"].items():
        rid, day = key.split("/")
        region, (start, end) = boxes[rid], _day_bounds(day)
        lines = _lines(root / key / "outages.csv")
        for bad in part["bad_rows"]:
            assert bad["file"] == f"{key}/outages.csv"
            raw = lines[bad["line"] - 1]  # line numbers are 1-based, header = line 1
            fields = next(csv.reader([raw]))
            kind = bad["kind"]
            kinds_seen.add(kind)
            if kind == "wrong_column_count":
                assert len(fields) != len(OUTAGES_CSV_COLUMNS)
                continue
            assert len(fields) == len(OUTAGES_CSV_COLUMNS), raw
            row = dict(zip(OUTAGES_CSV_COLUMNS, fields, strict=True))
            if kind == "lat_not_numeric":
                with pytest.raises(ValueError):
                    float(row["lat"])
            elif kind == "lat_out_of_box":
                assert not region.min_lat <= float(row["lat"]) <= region.max_lat
            elif kind == "negative_customers":
                assert int(row["customers_out"]) < 0
            elif kind == "empty_event_id":
                assert row["event_id"] == ""
            elif kind == "duplicate_event_id":
                original = lines[bad["duplicate_of_line"] - 1].split(",")[0]
                assert bad["duplicate_of_line"] < bad["line"] and original == row["event_id"] != ""
            elif kind == "reported_outside_day":
                assert not start <= _ts(row["reported_at"]) < end
            elif kind == "unparseable_timestamp":
                with pytest.raises(ValueError):
                    dt.datetime.fromisoformat(row["reported_at"])
            elif kind == "restored_before_reported":
                assert _ts(row["restored_at"]) < _ts(row["reported_at"])
            elif kind == "wrong_region":
                assert row["region_id"] != rid
            else:
                pytest.fail(f"unknown kind {kind}")
    assert kinds_seen == set(BAD_KINDS)


def test_good_rows_follow_the_contract(scenario: tuple[Path, dict], regions: list[Region]) -> None:
    root, truth = scenario
    boxes = {r.region_id: r for r in regions}
    offsets: set[str] = set()
    for key, part in truth["partitions"].items():
        rid, day = key.split("/")
        region, (start, end) = boxes[rid], _day_bounds(day)
        bad = {b["line"] for b in part["bad_rows"]}
        seen: set[str] = set()
        unrestored = 0
        with (root / key / "outages.csv").open(encoding="utf-8", newline="") as fh:
            for line, fields in enumerate(csv.reader(fh), start=1):
                if line == 1 or line in bad:
                    continue
                row = dict(zip(OUTAGES_CSV_COLUMNS, fields, strict=True))
                assert row["event_id"] and row["event_id"] not in seen
                seen.add(row["event_id"])
                assert row["region_id"] == rid and row["cause"]
                assert region.contains(float(row["lat"]), float(row["lon"]))
                reported = _ts(row["reported_at"])
                assert start <= reported < end
                offsets.add(row["reported_at"][-6:])
                assert int(row["customers_out"]) >= 0
                if row["restored_at"]:
                    assert _ts(row["restored_at"]) >= reported
                else:
                    unrestored += 1
        assert len(seen) == part["rows"]["good"]
        assert 0 < unrestored < len(seen) / 2
        with (root / key / "weather.csv").open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                assert row["region_id"] == rid
                assert start <= _ts(row["observed_at"]) < end
                assert region.contains(float(row["lat"]), float(row["lon"]))
                assert 0 <= float(row["wind_gust_ms"]) <= 120
                assert 0 <= float(row["rain_mm"]) <= 500
                assert 850 <= float(row["pressure_hpa"]) <= 1090
    assert offsets == {"+00:00", "-05:00"}


def test_reference_files(scenario: tuple[Path, dict], regions: list[Region]) -> None:
    root, truth = scenario
    boxes = {r.region_id: r for r in regions[:2]}
    with (root / "reference" / "terrain.csv").open(encoding="utf-8", newline="") as fh:
        terrain = list(csv.DictReader(fh))
    with (root / "reference" / "customers.csv").open(encoding="utf-8", newline="") as fh:
        customers = list(csv.DictReader(fh))
    assert len(terrain) == truth["reference"]["terrain_rows"] == sum(truth["reference"]["cells"].values())
    assert len(customers) == truth["reference"]["customers_rows"]
    cells = set()
    for row in terrain:
        assert row["region_id"] in boxes
        assert h3.is_valid_cell(row["cell_id"]) and h3.get_resolution(row["cell_id"]) == 7
        assert boxes[row["region_id"]].contains(*h3.cell_to_latlng(row["cell_id"]))
        assert 0 <= float(row["vegetation_index"]) <= 1 and 0 <= float(row["slope_deg"]) <= 90
        assert row["flood_zone"] in ("true", "false")
        cells.add(row["cell_id"])
    feeders: dict[str, int] = {}
    for row in customers:
        assert row["cell_id"] in cells and int(row["customers"]) >= 0
        feeders[row["cell_id"]] = feeders.get(row["cell_id"], 0) + 1
    assert set(feeders) == cells and set(feeders.values()) == {1, 2}
    planted = {c for part in truth["partitions"].values() for cl in part["clusters"] for c in cl["cells"]}
    assert planted <= cells


def test_scale_smoke_and_progress(tmp_path: Path, regions: list[Region]) -> None:
    calls: list[tuple[str, int, int]] = []
    truth = generate_scenario(tmp_path, regions[2:3], days=1, rows_per_partition=200_000, seed=1,
                              progress=lambda stage, done, total: calls.append((stage, done, total)))
    rid = regions[2].region_id
    with (tmp_path / rid / "2026-09-01" / "outages.csv").open("rb") as fh:
        assert sum(1 for _ in fh) == 200_001
    assert truth["partitions"][f"{rid}/2026-09-01"]["rows"]["bad"] == 400
    assert calls == [("partitions", 1, 1)]


def test_noisy_partitions_are_planted_on_their_own_stream(tmp_path: Path, regions: list[Region]) -> None:
    """``noisy``: the chosen partitions get many bad rows and station-hours missing; every other
    file is byte-identical to a scenario generated without the knob."""
    from pipeline.tools.generate import NOISY_BAD_ROWS, NOISY_WEATHER_GAP, STATION_GRID

    plain = generate_scenario(tmp_path / "plain", regions[:3], days=3, rows_per_partition=400, seed=7)
    noisy = generate_scenario(tmp_path / "noisy", regions[:3], days=3, rows_per_partition=400, seed=7, noisy=0.3)
    assert plain["noisy"] == [] and 0 < len(noisy["noisy"]) < 9
    assert noisy["noisy"] == sorted(k for k, p in noisy["partitions"].items() if p["noisy"])
    a, b = _files(tmp_path / "plain"), _files(tmp_path / "noisy")
    for rel in a:
        if rel.startswith("_truth"):
            continue
        touched = any(rel.startswith(k + "/") for k in noisy["noisy"])
        assert (a[rel] == b[rel]) != touched, rel
    for key in noisy["noisy"]:
        part = noisy["partitions"][key]
        assert part["rows"]["bad"] == round(NOISY_BAD_ROWS * 400)
        with open(tmp_path / "noisy" / key / "weather.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        stations = STATION_GRID ** 2
        assert len(rows) == part["rows"]["weather"] and len({r["station_id"] for r in rows}) == stations
        missing = 1 - len(rows) / (stations * 24)
        assert NOISY_WEATHER_GAP - 0.15 < missing < NOISY_WEATHER_GAP + 0.15


def test_as_of_writes_what_was_reported_by_then_and_a_later_time_a_longer_version(
        tmp_path: Path, regions: list[Region]) -> None:
    def at(hour: int, minute: int = 0) -> dt.datetime:
        return dt.datetime(2026, 9, 2, hour, minute, tzinfo=dt.UTC)

    args = {"days": 3, "rows_per_partition": 3000, "seed": 5, "bad_rows": 0.01}
    full = generate_scenario(tmp_path / "full", regions[:1], **args)
    ten = generate_scenario(tmp_path / "ten", regions[:1], as_of=at(10), **args)
    again = generate_scenario(tmp_path / "again", regions[:1], as_of=at(10), **args)
    noon = generate_scenario(tmp_path / "noon", regions[:1], as_of=at(12, 30), **args)
    end = generate_scenario(tmp_path / "end", regions[:1], as_of=at(23, 59) + dt.timedelta(seconds=59), **args)
    assert ten == again and _files(tmp_path / "ten") == _files(tmp_path / "again")  # deterministic
    rid = regions[0].region_id
    # The day after as_of has not begun: no folder; the day before it is whole.
    assert sorted(ten["partitions"]) == [f"{rid}/2026-09-01", f"{rid}/2026-09-02"]
    assert not (tmp_path / "ten" / rid / "2026-09-03").exists()
    for name in ("outages.csv", "weather.csv"):
        whole = (tmp_path / "full" / rid / "2026-09-01" / name).read_bytes()
        assert (tmp_path / "ten" / rid / "2026-09-01" / name).read_bytes() == whole
        # The day's last version is the file written without as_of.
        assert (tmp_path / "end" / rid / "2026-09-02" / name).read_bytes() == \
            (tmp_path / "full" / rid / "2026-09-02" / name).read_bytes()
    assert end["partitions"][f"{rid}/2026-09-02"] == full["partitions"][f"{rid}/2026-09-02"]

    def rows(root: str, name: str) -> list[dict[str, str]]:
        with (tmp_path / root / rid / "2026-09-02" / name).open(newline="") as fh:
            return list(csv.DictReader(fh))

    for root, cut in (("ten", at(10)), ("noon", at(12, 30))):
        out, wx = rows(root, "outages.csv"), rows(root, "weather.csv")
        truth = {"ten": ten, "noon": noon}[root]["partitions"][f"{rid}/2026-09-02"]
        assert len(out) == truth["rows"]["outages"] and len(wx) == truth["rows"]["weather"]
        good = [r for r in out if r["event_id"] and len(r) == len(OUTAGES_CSV_COLUMNS)]
        for r in good:
            try:
                reported = _ts(r["reported_at"])
            except ValueError:
                continue  # a planted unparseable time
            if reported.date().isoformat() == "2026-09-02":
                assert reported <= cut, r
        assert all(_ts(r["observed_at"]) <= cut for r in wx)
    # A later time: the same rows first, then more; the earlier file's event ids are a prefix.
    ten_out, noon_out = rows("ten", "outages.csv"), rows("noon", "outages.csv")
    assert 0 < len(ten_out) < len(noon_out) < 3000
    assert [r["event_id"] for r in ten_out] == [r["event_id"] for r in noon_out[:len(ten_out)]]
    # Outages are in time order: the earlier version is the first lines of the later.
    early = (tmp_path / "ten" / rid / "2026-09-02" / "outages.csv").read_bytes()
    assert (tmp_path / "noon" / rid / "2026-09-02" / "outages.csv").read_bytes().startswith(early)
    assert len(rows("ten", "weather.csv")) < len(rows("noon", "weather.csv"))
