"""Ingest: read one partition's landing files and split every row into accepted or quarantined.

Contract section 3 is the rule book. Each file is read once as bytes and judged in three steps:

1. **Whole file** (raises :class:`InputFileError`, nothing is returned): missing, binary (a NUL
   byte), not UTF-8 (names the line of the first bad byte), empty / blank header line, header not
   valid CSV, duplicate or missing required column(s).
2. **Structure** (per physical line; quarantined with ``field`` null), in order: a bare carriage
   return, unbalanced quotes (an odd number of ``"``), malformed quoting (``"ab"c``), a field
   count that differs from the header's. Quoted fields follow RFC 4180 (``"tree, limb"``,
   ``""`` for a quote). Each physical line is one row: a quoted value spanning lines is not
   supported, so each of its lines is quarantined on its own terms (the opening one as
   unbalanced quotes), which keeps every ``line`` physical and correct. Empty lines are not rows
   (nor are trailing whitespace-only lines); a UTF-8 BOM before the header is ignored. Only the
   sound lines are handed to Arrow's CSV reader (all columns as text).
3. **Rules** (vectorized; the first rule a row breaks is its one quarantine reason), in order:

   - outages: event_id non-empty; event_id unique (the first occurrence in the file owns the id,
     later ones are quarantined even if the first one fails a later rule); region_id equals the
     folder; reported_at has a UTC offset; reported_at is ISO-8601; reported_at inside the day;
     lat; lon; customers_out; cause non-empty; restored_at has an offset / is ISO-8601 (or
     empty); restored_at not before reported_at.
   - weather: station_id; region_id; observed_at (offset, ISO-8601, inside the day); lat; lon;
     wind_gust_ms; rain_mm; pressure_hpa.
   - customers: region_id (see below); cell_id; feeder_id; customers.
   - terrain: region_id; cell_id; elevation_m; slope_deg; vegetation_index; flood_zone.

Values are judged after trimming surrounding whitespace. Timestamps may use ``T`` or a space,
``Z`` or ``+HH:MM``/``+HHMM``/``+HH``, and are stored as UTC microseconds. Numbers are finite
decimals (``nan``/``inf`` are rejected). Reference files are shared by all regions: rows of this
region are judged, rows of another known region only counted (``rows_other_regions``), rows with
an empty or unknown region quarantined; a structurally broken reference row cannot be attributed
to a region, so every partition quarantines it. ``cell_id`` is stored in canonical lower case.
"""

from __future__ import annotations

import codecs
import csv
import datetime as dt
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import h3
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from assets.schemas import CUSTOMERS_REF, OUTAGES_RAW, QUARANTINE, TERRAIN_REF, TS, WEATHER_RAW
from resources.errors import InputFileError
from resources.settings import Region

OUTAGES_COLUMNS = (
    "event_id", "region_id", "reported_at", "lat", "lon", "customers_out", "cause", "restored_at")
WEATHER_COLUMNS = (
    "station_id", "region_id", "observed_at", "lat", "lon", "wind_gust_ms", "rain_mm", "pressure_hpa")
CUSTOMERS_COLUMNS = ("cell_id", "region_id", "feeder_id", "customers")
TERRAIN_COLUMNS = ("cell_id", "region_id", "elevation_m", "slope_deg", "vegetation_index", "flood_zone")

_TS_RE = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}(:?\d{2})?)$"
_NAIVE_RE = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$"
_NUM_RE = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"  # exactly what Arrow's float cast accepts
_INT_RE = r"^\d{1,18}$"  # non-negative and far from int64 overflow


@dataclass(frozen=True)
class FileReport:
    """Row accounting of one landing file: rows_read == accepted + quarantined + other regions."""

    source_file: str
    rows_read: int
    rows_accepted: int
    rows_quarantined: int
    rows_other_regions: int = 0
    extra_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class IngestResult:
    """The tables of one (region, day) partition, each with the exact schema of assets.schemas."""

    outages: pa.Table
    weather: pa.Table
    customers: pa.Table
    terrain: pa.Table
    quarantine: pa.Table
    files: tuple[FileReport, ...]


@dataclass
class _Parsed:
    """A structurally read file: string columns of the structurally sound rows, plus the rest."""

    rel: str
    cols: dict[str, pa.Array]  # required columns, trimmed, one entry per sound row
    lines: np.ndarray  # physical line (1-based) of each sound row
    bad: list[tuple[int, str]]  # (line, reason) of structurally broken rows
    rows_read: int
    extra: tuple[str, ...]
    raw: Callable[[Sequence[int]], list[str]]  # physical lines -> their exact text


def _read(path: Path, rel: str, required: Sequence[str]) -> _Parsed:
    """Read ``path`` into string columns; raise InputFileError when the file is unusable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(rel, "file not found") from None
    except OSError as exc:
        raise InputFileError(rel, f"cannot be read ({exc.strerror or exc.__class__.__name__})") from None
    if not data:
        raise InputFileError(rel, "empty file (no header row)")
    nul = data.find(b"\x00")
    if nul >= 0:  # text never holds NUL; this catches gzip, parquet, images, ...
        raise InputFileError(rel, "not a CSV text file (binary data)", line=data.count(b"\n", 0, nul) + 1)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputFileError(rel, f"not UTF-8 (byte 0x{data[exc.start]:02x})", line=line) from None
    arr = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(arr == 10)
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    starts = np.concatenate(([bom], newlines + 1)).astype(np.int64)
    ends = np.concatenate((newlines, [len(data)])).astype(np.int64)  # exclusive, before "\n"
    ends -= (ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13)  # the CR of CRLF is not text
    n = len(starts)
    while n and not data[starts[n - 1] : ends[n - 1]].strip():  # trailing blank lines are not rows
        n -= 1
    if n == 0 or not data[starts[0] : ends[0]].strip():
        raise InputFileError(rel, "empty file (no header row)", line=1)
    try:
        header = [h.strip() for h in next(csv.reader([data[starts[0] : ends[0]].decode("utf-8")], strict=True))]
    except csv.Error as exc:
        raise InputFileError(rel, f"header row is not valid CSV ({exc})", line=1) from None
    dupes = sorted({h for h in header if h in required and header.count(h) > 1})
    if dupes:
        raise InputFileError(rel, f"duplicate column(s): {', '.join(dupes)}", line=1)
    missing = [c for c in required if c not in header]
    if missing:
        raise InputFileError(rel, f"missing required column(s): {', '.join(missing)}", line=1)
    extra = tuple(h for h in header if h not in required)

    ds, de = starts[1:n], ends[1:n]
    nfields, problems = _structure(data, arr, starts[:n], ends[:n])
    empty = de == ds  # empty lines are not rows
    for i in np.flatnonzero((nfields != len(header)) & ~empty):
        problems.setdefault(int(i), f"wrong number of fields: expected {len(header)}, got {int(nfields[i])}")
    sound = ~empty
    sound[list(problems)] = False
    sound_idx = np.flatnonzero(sound)

    # Hand Arrow only the sound lines: the runs between broken lines are contiguous byte ranges.
    view = memoryview(data)
    cut = sorted(problems)
    pieces, prev = [], int(ds[0]) if len(ds) else 0
    for i in cut:
        pieces.append(view[prev : ds[i]])
        prev = int(ds[i + 1]) if i + 1 < len(ds) else int(de[i])
    if len(ds):
        pieces.append(view[prev : max(prev, int(de[-1]))])
    body = pieces[0] if len(pieces) == 1 else b"".join(pieces)  # no copy in the common case
    names = [h if h in required else f"_extra_{k}" for k, h in enumerate(header)]
    if sound_idx.size:
        convert = pacsv.ConvertOptions(column_types={c: pa.string() for c in required}, include_columns=list(required),
                                       strings_can_be_null=False, quoted_strings_can_be_null=False)
        try:  # every column as text: the rules below decide what a value means, not type inference
            table = pacsv.read_csv(pa.BufferReader(pa.py_buffer(body)), convert_options=convert,
                                   read_options=pacsv.ReadOptions(column_names=names, block_size=8 << 20))
        except pa.ArrowInvalid as exc:
            raise InputFileError(rel, f"not valid CSV ({str(exc).splitlines()[0]})") from None
        if table.num_rows != sound_idx.size:
            raise InputFileError(rel, f"not valid CSV ({table.num_rows} rows parsed, {sound_idx.size} lines)")
        cols = {c: pc.utf8_trim_whitespace(table.column(c).combine_chunks()) for c in required}
    else:
        cols = {c: pa.array([], pa.string()) for c in required}

    def raw(lines: Sequence[int]) -> list[str]:
        return [data[starts[k - 1] : ends[k - 1]].decode("utf-8") for k in lines]

    bad = [(i + 2, problems[i]) for i in cut]
    return _Parsed(rel, cols, sound_idx + 2, bad, int((~empty).sum()), extra, raw)


def _structure(data: bytes, arr: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, dict]:
    """Count the fields of every data line; return (counts, {data line index: structural problem}).

    Vectorized: fields = commas + 1 - commas inside quotes, where "inside" is an odd running
    count of quotes (one pass over the bytes). That equals RFC 4180 parsing while every quote
    opens a field, closes one or is half of an escaped ``""``; only lines breaking that shape
    are re-counted by the csv module (rare).
    """
    ds, de = starts[1:], ends[1:]
    problems: dict[int, str] = {}
    commas = np.flatnonzero(arr == 44)
    nfields = np.searchsorted(commas, de) - np.searchsorted(commas, ds) + 1
    if not len(ds):
        return nfields, problems

    def line_of(pos: np.ndarray) -> np.ndarray:  # data-line index of positions on data lines
        return np.unique(np.searchsorted(ds, pos, side="right") - 1)

    cr = np.flatnonzero(arr[ds[0] : de[-1]] == 13) + ds[0]
    for i in line_of(cr[arr[cr + 1] != 10]):  # a CR that is not part of CRLF
        problems[int(i)] = "line contains a bare carriage return"
    quote = arr == 34
    q = np.flatnonzero(quote[ds[0] : de[-1]]) + ds[0]
    if not q.size:
        return nfields, problems
    inside = np.bitwise_xor.accumulate(quote.view(np.uint8))
    flips = inside[np.maximum(ends - 1, 0)] ^ inside[np.maximum(starts - 1, 0)]  # odd quotes on the line
    if starts[0] == 0:  # the header has no byte before it: inside[0] already counted its quote
        flips[0] ^= quote[0]
    if flips.any():  # close every unbalanced line at its end so the next line starts outside quotes
        quote = quote.copy()
        quote[ends[flips.astype(bool) & (ends < arr.size)]] ^= True
        inside = np.bitwise_xor.accumulate(quote.view(np.uint8))
    odd = flips[1:].astype(bool)
    quoted = commas[(inside[commas] == 1) & (commas >= ds[0]) & (commas < de[-1])]
    nfields -= np.bincount(np.searchsorted(ds, quoted, side="right") - 1, minlength=len(ds))
    prev, nxt = arr[q - 1], arr[np.minimum(q + 1, arr.size - 1)]
    shaped = np.where(inside[q] == 1, (prev == 44) | (prev == 10) | (prev == 34),
                      (nxt == 44) | (nxt == 10) | (nxt == 13) | (nxt == 34) | (q + 1 == arr.size))
    for i in np.flatnonzero(odd):
        problems.setdefault(int(i), "unbalanced quotes (a quoted value spanning lines is not supported)")
    for i in line_of(q[~shaped]):
        if odd[i]:
            continue
        try:
            nfields[i] = len(next(csv.reader([data[ds[i] : de[i]].decode("utf-8")], strict=True)))
        except csv.Error as exc:
            problems.setdefault(int(i), f"malformed quoting ({exc})")
    return nfields, problems


def _np(mask: pa.Array) -> np.ndarray:
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def _matches(arr: pa.Array, pattern: str) -> np.ndarray:
    return _np(pc.match_substring_regex(arr, pattern))


def _floats(arr: pa.Array) -> np.ndarray:
    """Parse decimals; anything else (including nan/inf) becomes NaN."""
    ok = _matches(arr, _NUM_RE)
    return pc.cast(pc.if_else(pa.array(ok), arr, None), pa.float64()).to_numpy(zero_copy_only=False)


def _timestamps(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Return (naive, parsed, values): values are UTC timestamps, null where not parsed."""
    shaped = _matches(arr, _TS_RE)
    candidates = pc.if_else(pa.array(shaped), arr, None)
    try:
        values = pc.cast(candidates, TS)
    except pa.ArrowInvalid:
        # Arrow refuses the whole array for one impossible date (2026-02-30) or a nanosecond
        # fraction; pandas coerces element by element (slower, so only on this path).
        parsed = pd.to_datetime(candidates.to_pandas(), format="ISO8601", utc=True, errors="coerce")
        values = pa.Array.from_pandas(parsed).cast(TS, safe=False)
    return _matches(arr, _NAIVE_RE), _np(pc.is_valid(values)), values


_Got = Callable[[np.ndarray], list[str]]


class _Judge:
    """Applies rules in order; the first rule a row breaks becomes its one quarantine reason."""

    OPEN, OTHER = -1, -2

    def __init__(self, parsed: _Parsed):
        self.p = parsed
        self.state = np.full(len(parsed.lines), self.OPEN, dtype=np.int32)
        self.rules: list[tuple[str, str, _Got]] = []

    def check(self, field: str, ok: np.ndarray, rule: str, got: _Got | None = None) -> None:
        """Quarantine the still-open rows where ``ok`` is False, for breaking ``rule``.

        ``got`` describes the bad value of the given rows; by default ``got '<value>'``.
        """
        self.state[(self.state == self.OPEN) & ~ok] = len(self.rules)
        values = self.p.cols[field]
        self.rules.append((field, rule, got or (lambda idx: [f"got {v!r}" for v in values.take(idx).to_pylist()])))

    def route_regions(self, region_id: str, known: Collection[str]) -> None:
        """Reference files: judge this region's rows, count other known regions', quarantine the rest."""
        col = self.p.cols["region_id"]
        other = _np(pc.is_in(col, pa.array(sorted(set(known) - {region_id}), pa.string())))
        self.check("region_id", _np(pc.equal(col, region_id)) | other, "region_id must be a known region")
        self.state[(self.state == self.OPEN) & other] = self.OTHER

    def check_region(self, region: Region) -> None:
        ok = _np(pc.equal(self.p.cols["region_id"], region.region_id))
        self.check("region_id", ok, f"region_id must equal the folder's region {region.region_id!r}")

    def check_box(self, region: Region) -> tuple[np.ndarray, np.ndarray]:
        lat, lon = _floats(self.p.cols["lat"]), _floats(self.p.cols["lon"])
        for name, v, lo, hi in (("lat", lat, region.min_lat, region.max_lat),
                                ("lon", lon, region.min_lon, region.max_lon)):
            self.check(name, (v >= lo) & (v <= hi), f"{name} must be a number inside the region's box [{lo}, {hi}]")
        return lat, lon

    def check_range(self, field: str, lo: float, hi: float) -> np.ndarray:
        v = _floats(self.p.cols[field])
        self.check(field, (v >= lo) & (v <= hi), f"{field} must be a number in [{lo:g}, {hi:g}]")
        return v

    def check_nonempty(self, field: str) -> None:
        ok = _np(pc.greater(pc.utf8_length(self.p.cols[field]), 0))
        self.check(field, ok, f"{field} must be non-empty")

    def check_time(self, field: str, day: str, *, optional: bool = False) -> pa.Array:
        naive, parsed, values = _timestamps(self.p.cols[field])
        empty = _np(pc.equal(self.p.cols[field], "")) if optional else np.zeros(len(parsed), bool)
        self.check(field, ~naive, f"{field} must carry a UTC offset (naive timestamps are rejected)")
        self.check(field, parsed | empty, f"{field} must be an ISO-8601 timestamp with a UTC offset"
                   + (" or empty" if optional else ""))
        if not optional:
            lo, hi = _day_bounds(day)
            us = pc.fill_null(values.cast(pa.int64()), 0).to_numpy()
            self.check(field, (us >= lo) & (us < hi), f"{field} must be inside the partition's UTC day {day}")
        return values

    def check_int(self, field: str) -> np.ndarray:
        ok = _matches(self.p.cols[field], _INT_RE)
        self.check(field, ok, f"{field} must be an integer >= 0")
        return pc.fill_null(pc.cast(pc.if_else(pa.array(ok), self.p.cols[field], None), pa.int64()), 0).to_numpy()

    def check_cell(self) -> pa.Array:
        cells = pc.utf8_lower(self.p.cols["cell_id"])
        enc = cells.dictionary_encode()
        good = [_is_res7(c) for c in enc.dictionary.to_pylist()]
        ok = np.asarray(good, dtype=bool)[enc.indices.to_numpy()] if good else np.zeros(0, bool)
        self.check("cell_id", ok, "cell_id must be a valid H3 cell at resolution 7")
        return cells

    def finish(self, region: Region, day: str, schema: pa.Schema,
               columns: dict[str, pa.Array | np.ndarray]) -> tuple[pa.Table, pa.Table, FileReport]:
        """Build (accepted table, quarantine table, FileReport)."""
        p, state = self.p, self.state
        keep = state == self.OPEN
        accepted = {name: pc.filter(pa.array(col) if isinstance(col, np.ndarray) else col, pa.array(keep))
                    for name, col in columns.items()}
        accepted["source_line"] = pa.array(p.lines[keep], pa.int64())
        q = [(line, None, reason) for line, reason in p.bad]
        for k, (field, rule, got) in enumerate(self.rules):
            idx = np.flatnonzero(state == k)
            if idx.size:
                q += [(int(ln), field, f"{rule}, {g}") for ln, g in zip(p.lines[idx], got(idx), strict=True)]
        q.sort(key=lambda r: r[0])
        n_other = int((state == self.OTHER).sum())
        report = FileReport(p.rel, p.rows_read, int(keep.sum()), len(q), n_other, p.extra)
        if report.rows_read != report.rows_accepted + report.rows_quarantined + report.rows_other_regions:
            raise AssertionError(f"{p.rel}: row accounting broken: {report}")
        lines = [r[0] for r in q]
        quarantine = _table(QUARANTINE, region, day, len(q), {
            "source_file": pa.array([p.rel] * len(q), pa.string()),
            "line": pa.array(lines, pa.int64()),
            "field": pa.array([r[1] for r in q], pa.string()),
            "reason": pa.array([r[2] for r in q], pa.string()),
            "raw": pa.array(p.raw(lines), pa.string()),
        })
        return _table(schema, region, day, int(keep.sum()), accepted), quarantine, report


def _is_res7(cell: str) -> bool:
    # The regex first: h3 raises OverflowError on long hex strings instead of answering False.
    if len(cell) != 15 or any(ch not in "0123456789abcdef" for ch in cell):
        return False
    return bool(h3.is_valid_cell(cell)) and h3.get_resolution(cell) == 7


def _day_bounds(day: str) -> tuple[int, int]:
    """[day 00:00Z, next day 00:00Z) in microseconds since the epoch; ValueError for a bad day."""
    lo = (dt.date.fromisoformat(day) - dt.date(1970, 1, 1)).days * 86_400_000_000
    return lo, lo + 86_400_000_000


def _table(schema: pa.Schema, region: Region, day: str, n: int, columns: dict[str, pa.Array]) -> pa.Table:
    columns = {**columns, "region_id": pa.repeat(region.region_id, n), "day": pa.repeat(day, n)}
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def _start(path: Path, rel: str, columns: Sequence[str], day: str) -> tuple[_Parsed, _Judge]:
    _day_bounds(day)  # a bad day is the caller's bug: fail before reading anything
    parsed = _read(Path(path), rel, columns)
    return parsed, _Judge(parsed)


def validate_outages(path: Path, rel: str, region: Region, day: str) -> tuple[pa.Table, pa.Table, FileReport]:
    """Judge one ``outages.csv``; returns (OUTAGES_RAW rows, QUARANTINE rows, report)."""
    p, j = _start(path, rel, OUTAGES_COLUMNS, day)
    ids = p.cols["event_id"]
    j.check_nonempty("event_id")
    codes = ids.dictionary_encode().indices.to_numpy().astype(np.int64)
    # Codes are handed out in order of first appearance, so a new running maximum marks the
    # first row of each id; every other row repeats an id seen earlier.
    first = np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)
    dup = first[codes] != np.arange(len(codes)) if len(codes) else np.zeros(0, bool)
    j.check("event_id", ~dup, "event_id must be unique in the file", lambda idx: [
        f"got {v!r} again (first on line {p.lines[first[codes[i]]]})"
        for i, v in zip(idx, ids.take(idx).to_pylist(), strict=True)])
    j.check_region(region)
    reported = j.check_time("reported_at", day)
    lat, lon = j.check_box(region)
    customers_out = j.check_int("customers_out")
    j.check_nonempty("cause")
    restored = j.check_time("restored_at", day, optional=True)
    before = _np(pc.less(restored, reported))
    j.check("restored_at", ~before, "restored_at must not be before reported_at", lambda idx: [
        f"got {r!r} < {s!r}" for r, s in zip(p.cols["restored_at"].take(idx).to_pylist(),
                                             p.cols["reported_at"].take(idx).to_pylist(), strict=True)])
    return j.finish(region, day, OUTAGES_RAW, {
        "event_id": ids, "reported_at": reported, "lat": lat, "lon": lon,
        "customers_out": customers_out, "cause": p.cols["cause"], "restored_at": restored,
    })


def validate_weather(path: Path, rel: str, region: Region, day: str) -> tuple[pa.Table, pa.Table, FileReport]:
    """Judge one ``weather.csv``; returns (WEATHER_RAW rows, QUARANTINE rows, report)."""
    p, j = _start(path, rel, WEATHER_COLUMNS, day)
    j.check_nonempty("station_id")
    j.check_region(region)
    observed = j.check_time("observed_at", day)
    lat, lon = j.check_box(region)
    cols = {name: j.check_range(name, lo, hi)
            for name, lo, hi in (("wind_gust_ms", 0, 120), ("rain_mm", 0, 500), ("pressure_hpa", 850, 1090))}
    return j.finish(region, day, WEATHER_RAW, {
        "station_id": p.cols["station_id"], "observed_at": observed, "lat": lat, "lon": lon, **cols})


def validate_customers(
    path: Path, rel: str, region: Region, day: str, *, known_regions: Collection[str] = ()
) -> tuple[pa.Table, pa.Table, FileReport]:
    """Judge the shared ``reference/customers.csv`` for one region; returns CUSTOMERS_REF rows."""
    p, j = _start(path, rel, CUSTOMERS_COLUMNS, day)
    j.route_regions(region.region_id, known_regions)
    cells = j.check_cell()
    j.check_nonempty("feeder_id")
    customers = j.check_int("customers")
    return j.finish(region, day, CUSTOMERS_REF,
                    {"cell_id": cells, "feeder_id": p.cols["feeder_id"], "customers": customers})


def validate_terrain(
    path: Path, rel: str, region: Region, day: str, *, known_regions: Collection[str] = ()
) -> tuple[pa.Table, pa.Table, FileReport]:
    """Judge the shared ``reference/terrain.csv`` for one region; returns TERRAIN_REF rows."""
    p, j = _start(path, rel, TERRAIN_COLUMNS, day)
    j.route_regions(region.region_id, known_regions)
    cells = j.check_cell()
    elevation = _floats(p.cols["elevation_m"])
    j.check("elevation_m", np.isfinite(elevation), "elevation_m must be a number")
    slope = j.check_range("slope_deg", 0, 90)
    vegetation = j.check_range("vegetation_index", 0, 1)
    flood = pc.utf8_lower(p.cols["flood_zone"])
    ok = _np(pc.is_in(flood, pa.array(["true", "false"])))
    j.check("flood_zone", ok, "flood_zone must be true or false")
    return j.finish(region, day, TERRAIN_REF, {
        "cell_id": cells, "elevation_m": elevation, "slope_deg": slope, "vegetation_index": vegetation,
        "flood_zone": pc.equal(flood, "true"),
    })


def ingest_partition(landing: Path, region: Region, day: str, *, known_regions: Collection[str]) -> IngestResult:
    """Read and judge the four landing files of one (region, day) partition.

    Raises:
        InputFileError: a file is missing or unreadable as a whole; nothing is returned.
    """
    landing, rid = Path(landing), region.region_id
    rels = (f"{rid}/{day}/outages.csv", f"{rid}/{day}/weather.csv",
            "reference/customers.csv", "reference/terrain.csv")
    outages = validate_outages(landing / rels[0], rels[0], region, day)
    weather = validate_weather(landing / rels[1], rels[1], region, day)
    customers = validate_customers(landing / rels[2], rels[2], region, day, known_regions=known_regions)
    terrain = validate_terrain(landing / rels[3], rels[3], region, day, known_regions=known_regions)
    parts = (outages, weather, customers, terrain)
    return IngestResult(
        outages=outages[0], weather=weather[0], customers=customers[0], terrain=terrain[0],
        quarantine=pa.concat_tables([part[1] for part in parts]),
        files=tuple(part[2] for part in parts),
    )
