"""Ingest rules of contract section 3, exercised on real files written to tmp_path."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

import h3
import numpy as np
import pyarrow as pa
import pytest

from assets import schemas
from assets.transforms.ingest import (
    FileReport,
    ingest_partition,
    validate_customers,
    validate_outages,
    validate_terrain,
    validate_weather,
)
from resources.errors import InputFileError
from resources.settings import Region

DAY = "2026-09-01"
GULF = Region("gulf_coast", "Gulf Coast", 29.20, 30.20, -90.60, -89.40)
KNOWN = ("gulf_coast", "pine_belt", "red_hills")
CELL = h3.latlng_to_cell(29.7, -90.0, 7)
CELL2 = h3.latlng_to_cell(29.9, -89.8, 7)
OUT_HEADER = ["event_id", "region_id", "reported_at", "lat", "lon", "customers_out", "cause", "restored_at"]
WX_HEADER = ["station_id", "region_id", "observed_at", "lat", "lon", "wind_gust_ms", "rain_mm", "pressure_hpa"]
CUST_HEADER = ["cell_id", "region_id", "feeder_id", "customers"]
TERR_HEADER = ["cell_id", "region_id", "elevation_m", "slope_deg", "vegetation_index", "flood_zone"]


def csv_text(header: list[str], rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for row in rows:
        w.writerow([row[h] for h in header])
    return buf.getvalue()


def outage(i: int, **over: str) -> dict[str, str]:
    row = {"event_id": f"e{i}", "region_id": "gulf_coast", "reported_at": f"{DAY}T10:{i:02d}:00Z",
           "lat": "29.7", "lon": "-90.0", "customers_out": "12", "cause": "wind", "restored_at": ""}
    return {**row, **over}


def weather(i: int, **over: str) -> dict[str, str]:
    row = {"station_id": f"s{i}", "region_id": "gulf_coast", "observed_at": f"{DAY}T03:{i:02d}:00+00:00",
           "lat": "29.5", "lon": "-90.1", "wind_gust_ms": "31.5", "rain_mm": "12", "pressure_hpa": "990"}
    return {**row, **over}


def customer(i: int, **over: str) -> dict[str, str]:
    return {**{"cell_id": CELL, "region_id": "gulf_coast", "feeder_id": f"f{i}", "customers": "150"}, **over}


def terrain(i: int, **over: str) -> dict[str, str]:
    row = {"cell_id": CELL if i % 2 else CELL2, "region_id": "gulf_coast", "elevation_m": "3.5",
           "slope_deg": "2", "vegetation_index": "0.4", "flood_zone": "true"}
    return {**row, **over}


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


def conserved(r: FileReport) -> bool:
    return r.rows_read == r.rows_accepted + r.rows_quarantined + r.rows_other_regions


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    """A complete, valid landing zone for gulf_coast / DAY."""
    part = tmp_path / "gulf_coast" / DAY
    write(part / "outages.csv", csv_text(OUT_HEADER, [outage(i) for i in range(3)]))
    write(part / "weather.csv", csv_text(WX_HEADER, [weather(i) for i in range(2)]))
    write(tmp_path / "reference" / "customers.csv",
          csv_text(CUST_HEADER, [customer(0), customer(1, region_id="pine_belt"), customer(2)]))
    write(tmp_path / "reference" / "terrain.csv",
          csv_text(TERR_HEADER, [terrain(1), terrain(2), terrain(3, region_id="red_hills")]))
    return tmp_path


# ---- one malformed row per rule -----------------------------------------------------------

OUTAGE_CASES = [
    ("event_id", {"event_id": ""}, ["event_id", "non-empty"]),
    ("event_id", {"event_id": "   "}, ["event_id", "non-empty"]),
    ("region_id", {"region_id": "pine_belt"}, ["region_id", "folder", "'pine_belt'"]),
    ("reported_at", {"reported_at": f"{DAY}T10:00:00"}, ["reported_at", "offset", "naive"]),
    ("reported_at", {"reported_at": "yesterday"}, ["reported_at", "ISO-8601", "'yesterday'"]),
    ("reported_at", {"reported_at": "2026-02-30T10:00:00Z"}, ["reported_at", "ISO-8601"]),
    ("reported_at", {"reported_at": "2026-09-02T00:00:00Z"}, ["reported_at", "day", DAY]),
    ("reported_at", {"reported_at": f"{DAY}T02:00:00+05:00"}, ["reported_at", "day"]),  # 21:00Z the day before
    ("lat", {"lat": "north"}, ["lat", "number", "box", "'north'"]),
    ("lat", {"lat": "31.5"}, ["lat", "box", "'31.5'"]),
    ("lat", {"lat": "nan"}, ["lat", "number"]),
    ("lon", {"lon": "-91.0"}, ["lon", "box", "'-91.0'"]),
    ("customers_out", {"customers_out": "-3"}, ["customers_out must be an integer >= 0, got '-3'"]),
    ("customers_out", {"customers_out": "2.5"}, ["customers_out", "integer"]),
    ("customers_out", {"customers_out": ""}, ["customers_out", "integer"]),
    ("cause", {"cause": ""}, ["cause", "non-empty"]),
    ("restored_at", {"restored_at": f"{DAY}T12:00:00"}, ["restored_at", "offset"]),
    ("restored_at", {"restored_at": "later"}, ["restored_at", "ISO-8601", "'later'"]),
    ("restored_at", {"restored_at": f"{DAY}T09:59:00Z"}, ["restored_at", "before", "reported_at"]),
    ("restored_at", {"restored_at": f"{DAY}T04:00:00-05:00"}, ["restored_at", "before"]),  # 09:00Z
]


def check_single_bad_row(accepted: pa.Table, quarantine: pa.Table, report: FileReport, path: Path,
                         field: str | None, words: list[str], good: int = 2) -> None:
    """The bad row is on line 3 between two good rows (lines 2 and 4)."""
    assert conserved(report)
    assert (report.rows_read, report.rows_accepted, report.rows_quarantined) == (good + 1, good, 1)
    assert accepted.column("source_line").to_pylist() == [2, 4]
    (q,) = quarantine.to_pylist()
    assert q["line"] == 3 and q["field"] == field, q
    for word in words:
        assert word in q["reason"], (word, q["reason"])
    assert q["raw"] == path.read_bytes().decode().split("\n")[2]
    assert q["source_file"] == report.source_file and (q["region_id"], q["day"]) == ("gulf_coast", DAY)
    assert quarantine.schema.equals(schemas.QUARANTINE)


@pytest.mark.parametrize(("field", "over", "words"), OUTAGE_CASES)
def test_outage_rule(tmp_path: Path, field: str, over: dict[str, str], words: list[str]) -> None:
    path = write(tmp_path / "o.csv", csv_text(OUT_HEADER, [outage(1), outage(2, **over), outage(3)]))
    accepted, quarantine, report = validate_outages(path, "gulf_coast/x/o.csv", GULF, DAY)
    check_single_bad_row(accepted, quarantine, report, path, field, words)
    assert accepted.schema.equals(schemas.OUTAGES_RAW)


STRUCTURE_CASES = [
    ("too_few", "e9,gulf_coast,2026-09-01T10:00:00Z,29.7,-90.0,12,wind", ["number of fields", "expected 8, got 7"]),
    ("too_many", "e9,gulf_coast,2026-09-01T10:00:00Z,29.7,-90.0,12,wind,,x", ["number of fields", "got 9"]),
    ("unbalanced", 'e9,gulf_coast,2026-09-01T10:00:00Z,29.7,-90.0,12,"wind,', ["unbalanced quotes"]),
    ("malformed", 'e9,gulf_coast,2026-09-01T10:00:00Z,29.7,-90.0,12,"wi"nd,', ["malformed quoting"]),
    ("whitespace", "   ", ["number of fields"]),
    ("bare_cr", "e9,gulf_coast,2026-09-01T10:00:00Z,29.7,-90.0,12,wi\rnd,", ["carriage return"]),
]


@pytest.mark.parametrize(("name", "line", "words"), STRUCTURE_CASES, ids=[c[0] for c in STRUCTURE_CASES])
def test_structural_row(tmp_path: Path, name: str, line: str, words: list[str]) -> None:
    lines = csv_text(OUT_HEADER, [outage(1), outage(3)]).splitlines()
    path = write(tmp_path / "o.csv", "\n".join([*lines[:2], line, lines[2]]) + "\n")
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    check_single_bad_row(accepted, quarantine, report, path, None, words)
    assert quarantine.column("raw").to_pylist() == [line]


WEATHER_CASES = [
    ("station_id", {"station_id": ""}, ["station_id", "non-empty"]),
    ("region_id", {"region_id": "red_hills"}, ["region_id", "folder"]),
    ("observed_at", {"observed_at": f"{DAY} 03:00:00"}, ["observed_at", "offset"]),
    ("observed_at", {"observed_at": "2026-08-31T23:59:59Z"}, ["observed_at", "day"]),
    ("lat", {"lat": "29.1"}, ["lat", "box"]),
    ("lon", {"lon": ""}, ["lon", "number"]),
    ("wind_gust_ms", {"wind_gust_ms": "120.5"}, ["wind_gust_ms", "[0, 120]", "'120.5'"]),
    ("wind_gust_ms", {"wind_gust_ms": "-1"}, ["wind_gust_ms", "[0, 120]"]),
    ("rain_mm", {"rain_mm": "501"}, ["rain_mm", "[0, 500]"]),
    ("pressure_hpa", {"pressure_hpa": "849.9"}, ["pressure_hpa", "[850, 1090]"]),
    ("pressure_hpa", {"pressure_hpa": "high"}, ["pressure_hpa", "number"]),
]


@pytest.mark.parametrize(("field", "over", "words"), WEATHER_CASES)
def test_weather_rule(tmp_path: Path, field: str, over: dict[str, str], words: list[str]) -> None:
    path = write(tmp_path / "w.csv", csv_text(WX_HEADER, [weather(1), weather(2, **over), weather(3)]))
    accepted, quarantine, report = validate_weather(path, "w.csv", GULF, DAY)
    check_single_bad_row(accepted, quarantine, report, path, field, words)
    assert accepted.schema.equals(schemas.WEATHER_RAW)


REFERENCE_CASES = [
    (validate_customers, CUST_HEADER, customer, "cell_id", {"cell_id": "not-a-cell"}, ["H3", "resolution 7"]),
    (validate_customers, CUST_HEADER, customer, "cell_id", {"cell_id": h3.latlng_to_cell(29.7, -90, 8)}, ["resolution 7"]),
    (validate_customers, CUST_HEADER, customer, "region_id", {"region_id": "atlantis"}, ["known region", "'atlantis'"]),
    (validate_customers, CUST_HEADER, customer, "region_id", {"region_id": ""}, ["known region", "''"]),
    (validate_customers, CUST_HEADER, customer, "feeder_id", {"feeder_id": ""}, ["feeder_id", "non-empty"]),
    (validate_customers, CUST_HEADER, customer, "customers", {"customers": "-1"}, ["customers", "integer >= 0"]),
    (validate_terrain, TERR_HEADER, terrain, "cell_id", {"cell_id": "8f" * 10}, ["H3"]),
    (validate_terrain, TERR_HEADER, terrain, "region_id", {"region_id": "Gulf Coast"}, ["known region"]),
    (validate_terrain, TERR_HEADER, terrain, "elevation_m", {"elevation_m": "high"}, ["elevation_m", "number"]),
    (validate_terrain, TERR_HEADER, terrain, "slope_deg", {"slope_deg": "91"}, ["slope_deg", "[0, 90]"]),
    (validate_terrain, TERR_HEADER, terrain, "vegetation_index", {"vegetation_index": "1.2"}, ["[0, 1]"]),
    (validate_terrain, TERR_HEADER, terrain, "flood_zone", {"flood_zone": "maybe"}, ["flood_zone", "true or false"]),
]


@pytest.mark.parametrize(("fn", "header", "make", "field", "over", "words"), REFERENCE_CASES)
def test_reference_rule(tmp_path: Path, fn, header, make, field: str, over: dict[str, str], words: list[str]) -> None:
    path = write(tmp_path / "ref.csv", csv_text(header, [make(1), make(2, **over), make(3)]))
    accepted, quarantine, report = fn(path, "reference/ref.csv", GULF, DAY, known_regions=KNOWN)
    check_single_bad_row(accepted, quarantine, report, path, field, words)


# ---- the remaining rules and formats ------------------------------------------------------

def test_duplicate_event_ids_keep_the_first(tmp_path: Path) -> None:
    rows = [outage(1), outage(2, event_id="e1", cause="other"), outage(3), outage(4, event_id="e1")]
    path = write(tmp_path / "o.csv", csv_text(OUT_HEADER, rows))
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert accepted.column("event_id").to_pylist() == ["e1", "e3"]
    assert accepted.column("cause").to_pylist() == ["wind", "wind"]
    assert quarantine.column("line").to_pylist() == [3, 5]
    assert all("unique" in r and "line 2" in r for r in quarantine.column("reason").to_pylist())
    assert conserved(report) and report.rows_quarantined == 2


def test_reordered_and_extra_columns(tmp_path: Path) -> None:
    header = ["notes", *reversed(OUT_HEADER), "crew"]
    rows = [{**outage(1, cause="tree"), "notes": "x", "crew": "7"}, {**outage(2), "notes": "", "crew": ""}]
    path = write(tmp_path / "o.csv", csv_text(header, rows))
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert report.extra_columns == ("notes", "crew") and quarantine.num_rows == 0
    assert accepted.column("event_id").to_pylist() == ["e1", "e2"]
    assert accepted.column("cause").to_pylist() == ["tree", "wind"]
    assert accepted.column("lat").to_pylist() == [29.7, 29.7]
    assert accepted.schema.equals(schemas.OUTAGES_RAW)


def test_quoted_header_with_odd_quotes_does_not_shift_parsing(tmp_path: Path) -> None:
    # A literal quote in a header name (odd count) must not make later lines look quoted.
    header = 'notes, misc,' + ",".join(OUT_HEADER) + ',x"y'
    rows = [f'"a, b",{",".join(outage(1, cause="tree, limb").values())},1',
            f'c,{",".join(outage(2).values())},2']
    text = '"' + header.replace("notes, misc,", 'notes, misc",') + "\n" + "\n".join(rows) + "\n"
    text = text.replace("tree, limb", '"tree, limb"')
    path = write(tmp_path / "o.csv", text)
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert quarantine.num_rows == 0, quarantine.to_pylist()
    assert report.extra_columns == ("notes, misc", 'x"y')
    assert accepted.column("cause").to_pylist() == ["tree, limb", "wind"]


def test_quoted_commas_and_escaped_quotes(tmp_path: Path) -> None:
    rows = [outage(1, cause="tree, limb"), outage(2, cause='said "hi", then left'), outage(3, event_id="e,3")]
    path = write(tmp_path / "o.csv", csv_text(OUT_HEADER, rows))
    assert '"tree, limb"' in path.read_text()
    accepted, quarantine, _ = validate_outages(path, "o.csv", GULF, DAY)
    assert quarantine.num_rows == 0
    assert accepted.column("cause").to_pylist() == ["tree, limb", 'said "hi", then left', "wind"]
    assert accepted.column("event_id").to_pylist() == ["e1", "e2", "e,3"]


@pytest.mark.parametrize("impossible_date", [False, True], ids=["arrow", "pandas_fallback"])
def test_mixed_offsets_convert_to_utc(tmp_path: Path, impossible_date: bool) -> None:
    rows = [outage(1, reported_at=f"{DAY}T10:00:00+00:00", restored_at=f"{DAY}T07:30:00-05:00"),
            outage(2, reported_at=f"{DAY}T05:00:00-05:00", restored_at=f"{DAY}T12:00:00.250Z"),
            outage(3, reported_at=f"{DAY} 15:30:00+0530"),
            outage(4, reported_at=f"{DAY}T23:59:59.999999Z")]
    if impossible_date:  # one 30 February makes Arrow refuse the whole column; the rest must still parse
        rows.append(outage(5, reported_at="2026-02-30T10:00:00+00:00"))
    path = write(tmp_path / "o.csv", csv_text(OUT_HEADER, rows))
    accepted, quarantine, _ = validate_outages(path, "o.csv", GULF, DAY)
    assert quarantine.column("field").to_pylist() == (["reported_at"] if impossible_date else [])
    utc = dt.UTC
    assert accepted.column("reported_at").to_pylist() == [
        dt.datetime(2026, 9, 1, 10, tzinfo=utc), dt.datetime(2026, 9, 1, 10, tzinfo=utc),
        dt.datetime(2026, 9, 1, 10, tzinfo=utc), dt.datetime(2026, 9, 1, 23, 59, 59, 999999, tzinfo=utc)]
    assert accepted.column("restored_at").to_pylist() == [
        dt.datetime(2026, 9, 1, 12, 30, tzinfo=utc), dt.datetime(2026, 9, 1, 12, 0, 0, 250000, tzinfo=utc), None, None]


def test_crlf_bom_blank_lines_keep_physical_line_numbers(tmp_path: Path) -> None:
    lines = csv_text(OUT_HEADER, [outage(1), outage(2, lat="99"), outage(3)]).splitlines()
    text = "\ufeff" + "\r\n".join([lines[0], lines[1], "", lines[2], lines[3]]) + "\r\n\r\n  \r\n"
    path = write(tmp_path / "o.csv", text)
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert accepted.column("source_line").to_pylist() == [2, 5]
    assert quarantine.column("line").to_pylist() == [4]
    assert quarantine.column("raw").to_pylist() == [lines[2]]  # no "\r"
    assert (report.rows_read, report.rows_accepted, report.rows_quarantined) == (3, 2, 1)


def test_value_spanning_lines_is_one_record_numbered_by_its_first_line(tmp_path: Path) -> None:
    lines = csv_text(OUT_HEADER, [outage(1), outage(2, cause="tree\nlimb"), outage(3)]).splitlines()
    path = write(tmp_path / "o.csv", "\n".join(lines) + "\n")
    assert len(lines) == 5  # the quoted newline makes the middle row two physical lines
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert accepted.column("source_line").to_pylist() == [2, 3, 5]
    assert accepted.column("cause").to_pylist() == ["wind", "tree\nlimb", "wind"]
    assert quarantine.num_rows == 0
    assert conserved(report) and report.rows_read == 3


def test_reference_rows_of_other_regions(landing: Path) -> None:
    result = ingest_partition(landing, GULF, DAY, known_regions=KNOWN)
    files = {f.source_file: f for f in result.files}
    cust, terr = files["reference/customers.csv"], files["reference/terrain.csv"]
    assert (cust.rows_read, cust.rows_accepted, cust.rows_quarantined, cust.rows_other_regions) == (3, 2, 0, 1)
    assert (terr.rows_read, terr.rows_accepted, terr.rows_quarantined, terr.rows_other_regions) == (3, 2, 0, 1)
    assert result.customers.column("feeder_id").to_pylist() == ["f0", "f2"]
    assert result.terrain.column("flood_zone").to_pylist() == [True, True]
    # Without pine_belt among the known regions its row is quarantined, naming the region.
    other = ingest_partition(landing, GULF, DAY, known_regions=("gulf_coast", "red_hills"))
    (q,) = [r for r in other.quarantine.to_pylist() if r["source_file"] == "reference/customers.csv"]
    assert q["field"] == "region_id" and "'pine_belt'" in q["reason"] and q["line"] == 3


def test_cell_id_normalised_and_flood_zone_case_insensitive(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", csv_text(TERR_HEADER, [terrain(1, cell_id=CELL.upper(), flood_zone="FALSE"),
                                                            terrain(2, flood_zone="True")]))
    accepted, quarantine, _ = validate_terrain(path, "t.csv", GULF, DAY, known_regions=KNOWN)
    assert quarantine.num_rows == 0
    assert accepted.column("cell_id").to_pylist() == [CELL, CELL2]
    assert accepted.column("flood_zone").to_pylist() == [False, True]


def test_partition_tables_have_the_exact_schemas(landing: Path) -> None:
    result = ingest_partition(landing, GULF, DAY, known_regions=KNOWN)
    for table, schema in ((result.outages, schemas.OUTAGES_RAW), (result.weather, schemas.WEATHER_RAW),
                          (result.customers, schemas.CUSTOMERS_REF), (result.terrain, schemas.TERRAIN_REF),
                          (result.quarantine, schemas.QUARANTINE)):
        assert table.schema.equals(schema), (table.schema, schema)
        assert table.column_names[:2] == ["region_id", "day"]
        assert set(table.column("region_id").to_pylist()) <= {"gulf_coast"}
        assert set(table.column("day").to_pylist()) <= {DAY}
    assert [f.source_file for f in result.files] == [
        f"gulf_coast/{DAY}/outages.csv", f"gulf_coast/{DAY}/weather.csv", "reference/customers.csv",
        "reference/terrain.csv"]
    assert all(conserved(f) for f in result.files)
    assert result.outages.num_rows == 3 and result.quarantine.num_rows == 0


def test_header_only_file_gives_empty_tables(tmp_path: Path) -> None:
    path = write(tmp_path / "o.csv", ",".join(OUT_HEADER) + "\n\n")
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert accepted.num_rows == quarantine.num_rows == report.rows_read == 0
    assert accepted.schema.equals(schemas.OUTAGES_RAW)


# ---- whole-file failures ------------------------------------------------------------------

HEADER = ",".join(OUT_HEADER)
FILE_CASES = [
    ("missing", None, ["not found"]),
    ("empty", b"", ["empty"]),
    ("blank", b"\n\n  \n", ["empty"]),
    ("not_utf8", f"{HEADER}\ne1,gulf_coast,x,1,2,3,caf\xe9,\n".encode("latin-1"), [":2:", "UTF-8"]),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["binary"]),
    ("missing_columns", b"event_id,region_id,reported_at,lat,customers_out,cause,restored_at\n", ["lon"]),
    ("two_missing", b"event_id,region_id,reported_at,customers_out,cause,restored_at\n", ["lat, lon"]),
    ("duplicate_column", f"{HEADER},lat\n".encode(), ["duplicate", "lat"]),
    ("bad_header", b'event_id,"region_id\n', ["header"]),
]


@pytest.mark.parametrize(("name", "content", "words"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_whole_file_failure(landing: Path, name: str, content: bytes | None, words: list[str]) -> None:
    rel = f"gulf_coast/{DAY}/outages.csv"
    if content is None:
        (landing / rel).unlink()
    else:
        write(landing / rel, content)
    with pytest.raises(InputFileError) as info:
        ingest_partition(landing, GULF, DAY, known_regions=KNOWN)
    message = str(info.value)
    assert "\n" not in message and message.startswith(rel), message
    for word in words:
        assert word in message, (word, message)


def test_missing_reference_file_fails_the_partition(landing: Path) -> None:
    (landing / "reference" / "terrain.csv").unlink()
    with pytest.raises(InputFileError, match=r"^reference/terrain\.csv: file not found$"):
        ingest_partition(landing, GULF, DAY, known_regions=KNOWN)


# ---- volume -------------------------------------------------------------------------------

def test_200k_rows_synthetic(tmp_path: Path) -> None:
    n = 200_000
    rng = np.random.default_rng(7)
    secs = rng.integers(0, 86_400, n)
    stamps = np.datetime64(f"{DAY}T00:00:00") + secs.astype("timedelta64[s]")
    reported = np.char.add(np.datetime_as_string(stamps, unit="s").astype(str), "Z")
    lat = np.round(rng.uniform(29.3, 30.1, n), 5)
    causes = np.array(["wind", '"tree, limb"', "flood", "ice"])[rng.integers(0, 4, n)]
    lines = [f"e{i},gulf_coast,{reported[i]},{lat[i]},-90.0,{i % 977},{causes[i]}," for i in range(n)]
    bad = {17: "e17,gulf_coast,x,29.5,-90.0,1,wind,", 150_001: "e150001,gulf_coast,2026-09-01T01:00:00Z,1,1,1,wind,",
           199_999: "e199999,gulf_coast"}
    for i, line in bad.items():
        lines[i] = line
    path = write(tmp_path / "o.csv", HEADER + "\n" + "\n".join(lines) + "\n")
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert (report.rows_read, report.rows_accepted, report.rows_quarantined) == (n, n - 3, 3)
    assert quarantine.column("line").to_pylist() == [i + 2 for i in sorted(bad)]
    assert quarantine.column("field").to_pylist() == ["reported_at", "lat", None]
    assert quarantine.column("raw").to_pylist() == [bad[i] for i in sorted(bad)]
    lines_out = accepted.column("source_line").to_numpy()
    assert lines_out[0] == 2 and lines_out[-1] == n  # row n-1 (line n+1) was bad
    assert accepted.column("customers_out").to_numpy().sum() == sum(i % 977 for i in range(n) if i not in bad)
    keep = np.ones(n, bool)
    keep[list(bad)] = False
    assert np.array_equal(accepted.column("lat").to_numpy(), lat[keep])
    assert accepted.column("cause").to_pylist()[:200] == [c.strip('"') for c in causes[keep][:200]]
    assert accepted.schema.equals(schemas.OUTAGES_RAW)


def test_judged_reference_files_are_reused_for_another_day_and_judged_again_when_they_change(landing: Path) -> None:
    """The reference cache: the next day of the region gets what judging the files again gives;
    changed bytes are judged anew."""
    from assets.transforms.ingest import ReferenceCache

    day2 = "2026-09-02"
    (landing / "gulf_coast" / day2).mkdir()
    for name in ("outages.csv", "weather.csv"):
        text = (landing / "gulf_coast" / DAY / name).read_text().replace(DAY, day2)
        write(landing / "gulf_coast" / day2 / name, text)
    ReferenceCache.clear()
    ingest_partition(landing, GULF, DAY, known_regions=KNOWN)
    cached = ingest_partition(landing, GULF, day2, known_regions=KNOWN)
    ReferenceCache.clear()
    fresh = ingest_partition(landing, GULF, day2, known_regions=KNOWN)
    for a, b in ((cached.customers, fresh.customers), (cached.terrain, fresh.terrain),
                 (cached.quarantine, fresh.quarantine)):
        assert a.equals(b) and a.schema.equals(b.schema)
    assert set(cached.customers.column("day").to_pylist()) == {day2}
    assert cached.files == fresh.files
    # New bytes in the reference file: judged again (the bad row is quarantined, naming its line).
    write(landing / "reference" / "customers.csv",
          csv_text(CUST_HEADER, [customer(0), customer(1, region_id="pine_belt"), customer(2, customers="-4")]))
    changed = ingest_partition(landing, GULF, day2, known_regions=KNOWN)
    (q,) = [r for r in changed.quarantine.to_pylist() if r["source_file"] == "reference/customers.csv"]
    assert q["field"] == "customers" and q["line"] == 4 and q["day"] == day2
    assert changed.customers.num_rows == 1


def test_res7_cells_agrees_with_h3_on_cells_near_misses_and_noise() -> None:
    """The vectorised test of a resolution-7 cell gives h3's answer (``is_valid_cell`` and
    ``get_resolution == 7``) on cells of resolutions 6-8, pentagons and their neighbourhoods,
    every one-digit change of some cells, random 60-bit hex and malformed strings."""
    import random

    import h3
    import pyarrow as pa

    from assets.transforms.ingest import res7_cells

    def h3_says(c: str | None) -> bool:
        if c is None or len(c) != 15 or any(ch not in "0123456789abcdef" for ch in c):
            return False
        return bool(h3.is_valid_cell(c)) and h3.get_resolution(c) == 7

    rng = random.Random(4)
    cells: list[str | None] = []
    for _ in range(500):
        lat, lon = rng.uniform(-90, 90), rng.uniform(-180, 180)
        cells += [h3.latlng_to_cell(lat, lon, res) for res in (6, 7, 8)]
    for p in h3.get_pentagons(7):
        cells += [p, *h3.grid_disk(p, 1), *h3.cell_to_children(h3.cell_to_parent(p, 5), 7)]
    for c in [*cells[:12:3], h3.get_pentagons(7)[3]]:
        cells += [c[:i] + ch + c[i + 1:] for i in range(15) for ch in "0123456789abcdef"]
    cells += [f"{rng.getrandbits(60):015x}" for _ in range(3000)]
    cells += ["", None, "x" * 15, "f" * 15, "872830828ffffff ", "872830828fffff", "0872830828fffff",
              "872830828FFFFFF", "87283082\u00e9ffffff"]
    want = np.array([h3_says(c) for c in cells])
    assert 1000 < want.sum() < len(cells) - 1000
    got = res7_cells(pa.array(cells, pa.string()))
    assert [c for c, w, g in zip(cells, want, got, strict=True) if w != g] == []
    assert list(res7_cells(pa.array(cells, pa.string()).slice(3, 40))) == list(want[3:43])
