"""Ingest: read one partition's landing files and split every row into accepted or quarantined.

Contract section 3 is the rule book. Each file is read once as bytes and judged in three steps:

1. **Whole file** (raises :class:`InputFileError`, nothing is returned): missing, binary (a NUL
   byte), not UTF-8 (names the line of the first bad byte), empty / blank header line, header not
   valid CSV, duplicate or missing required column(s).
2. **Structure** (per record; quarantined with ``field`` null). Records follow RFC 4180 and read
   as Python's csv module reads them: a quoted field may hold commas, ``""`` for a quote, and
   line breaks (LF, CRLF or CR), so one record can span physical lines. A row is a record: it is
   counted once, its ``line`` is the physical line it starts on and its ``raw`` is its full text.
   Lines end in LF or CRLF. In order: a carriage return outside quotes that does not end a line;
   unbalanced quotes (a value opened by a quote and still open at the end of the file: only the
   line that opened it is quarantined and reading resumes on the next line, so one stray quote
   cannot swallow the rest of the file); malformed quoting (``"ab"c``; a quote inside an unquoted
   field, ``12" pipe``, is text as for the csv module); a field count that differs from the
   header's (for a record spanning lines the reason names its last line). Empty lines are not
   rows (nor are trailing whitespace-only lines); a UTF-8 BOM before the header is ignored, and
   a quoted header name may span lines too. Only the sound records are handed to Arrow's CSV
   reader (all columns as text), told to expect line breaks in values only when one of them has
   one (that parse is slower). Finding records is vectorized (see :func:`_records`).
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
import io
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from assets.schemas import (
    CUSTOMERS_CSV_COLUMNS,
    CUSTOMERS_REF,
    OUTAGES_CSV_COLUMNS,
    OUTAGES_RAW,
    QUARANTINE,
    TERRAIN_CSV_COLUMNS,
    TERRAIN_REF,
    TS,
    WEATHER_CSV_COLUMNS,
    WEATHER_RAW,
)
from resources import landing_layout
from resources.errors import InputFileError
from resources.landing import MISSING, file_stamp
from resources.settings import Region
from resources.storage import Storage, StoredFile, open_storage

# The bytes that shape CSV records.
LF, CR, QUOTE, COMMA = 0x0A, 0x0D, 0x22, 0x2C

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
    """A structurally read file: string columns of the structurally sound records, plus the rest."""

    rel: str
    cols: dict[str, pa.Array]  # required columns, trimmed, one entry per sound record
    lines: np.ndarray  # physical line (1-based) each sound record starts on
    bad: list[tuple[int, str]]  # (start line, reason) of structurally broken records
    rows_read: int  # records, not physical lines
    extra: tuple[str, ...]
    raw: Callable[[Sequence[int]], list[str]]  # start lines -> the exact text of those records


@dataclass
class _Records:
    """The data records of a file, as ranges of physical lines (indices into ``starts``/``ends``)."""

    first: np.ndarray  # the line each record starts on
    last: np.ndarray  # the line it ends on: ``first`` unless a quoted value holds a line break
    start: np.ndarray  # byte offset of each record
    end: np.ndarray  # byte offset just past its text (before its line end)
    spanning: np.ndarray  # the records that span lines (few), ascending
    quotes: np.ndarray  # byte offsets of every quote in the records
    quote_commas: np.ndarray  # commas in the file before each quote
    quote_rec: np.ndarray  # the record of each quote
    quote_local: np.ndarray  # its index among its record's quotes
    irregular: np.ndarray  # a quote stands where RFC 4180 puts none: the csv module reads the record
    unclosed: np.ndarray  # a quoted value opened on the line is never closed before the end of file


@dataclass
class _Scan:
    """Where the bytes that shape records are: one pass over the file finds all four kinds."""

    quotes: np.ndarray  # byte offsets of every quote
    quote_commas: np.ndarray  # commas before each quote
    crs: np.ndarray  # byte offsets of every carriage return
    commas_to: np.ndarray  # commas before the end of each physical line


@dataclass
class _Quotes:
    """How the quotes of the data lines stand: per quote, and per physical line (a mask over lines)."""

    line: np.ndarray  # the physical line of each quote (ascending)
    local: np.ndarray  # its index among that line's quotes
    odd_lines: np.ndarray  # the lines with an odd number of quotes
    out_lines: np.ndarray  # the line of each quote misplaced for a line read from outside a quoted value
    in_lines: np.ndarray  # the line of each quote misplaced for a line read from inside one
    odd: np.ndarray  # per line: an odd number of quotes
    misplaced_out: np.ndarray  # per line: a quote is misplaced, read from outside
    misplaced_in: np.ndarray  # per line: a quote is misplaced, read from inside
    can_open: np.ndarray  # per line: a quote starts a field
    text_quotes: np.ndarray  # per line: read from outside, every quote is text (none can open a value)


def _read(path: Path | StoredFile, rel: str, required: Sequence[str]) -> _Parsed:
    """Read ``path`` into string columns; raise InputFileError when the file is unusable."""
    data = _load(path, rel)
    arr = np.frombuffer(data, dtype=np.uint8)
    scan, starts, ends = _scan(data, arr)
    n = len(starts)
    while n and not data[starts[n - 1] : ends[n - 1]].strip():  # trailing blank lines are not rows
        n -= 1
    if n == 0 or not data[starts[0] : ends[0]].strip():
        raise InputFileError(rel, "empty file (no header row)", line=1)
    header, h = _header(data, starts, ends, n, rel)
    extra = _check_columns(header, required, rel)

    recs = _records(data, arr, starts, ends, h, n, scan)
    first, last = recs.first, recs.last
    problems, breaks = _problems(data, arr, recs, scan, len(header))
    sound = np.ones(len(first), bool)
    sound[list(problems)] = False
    sound_idx = np.flatnonzero(sound)
    cut = sorted(problems)
    if sound_idx.size:
        names = [c if c in required else f"_extra_{k}" for k, c in enumerate(header)]
        # Line breaks inside values make Arrow find row ends by parsing, which is slower: only then.
        newlines_in_values = bool(breaks.size and sound[breaks].any())
        cols = _parse(_sound_body(data, recs, starts, cut), names, required, sound_idx.size, newlines_in_values, rel)
    else:
        cols = {c: pa.array([], pa.string()) for c in required}

    spans = {int(first[r]): int(last[r]) for r in recs.spanning}

    def raw(lines: Sequence[int]) -> list[str]:
        return [data[starts[k - 1] : ends[spans.get(k - 1, k - 1)]].decode("utf-8") for k in lines]

    bad = [(int(first[r]) + 1, problems[r]) for r in cut]
    return _Parsed(rel, cols, first[sound_idx] + 1, bad, len(first), extra, raw)


def _load(path: Path | StoredFile, rel: str) -> bytes:
    """The file's bytes; raise InputFileError when it is missing, unreadable, empty, binary or not UTF-8."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        where = f" at {path}" if isinstance(path, StoredFile) and path.storage.kind != "file" else ""
        raise InputFileError(rel, f"file not found{where}") from None
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
    return data


def _scan(data: bytes, arr: np.ndarray) -> tuple[_Scan, np.ndarray, np.ndarray]:
    """Where the structural bytes are, and the physical lines: (scan, line starts, line ends).

    One pass finds every byte the structure depends on (LF, comma, quote, CR); each kind's
    offsets come from that short list, and running counts along it give commas per line and
    before each quote, so no per-line search is needed. A line's end is exclusive, before its LF
    and the CR of a CRLF; the first line starts after a UTF-8 BOM.
    """
    at = _find_structural(arr)
    kind = arr[at]
    is_nl, is_quote = kind == LF, kind == QUOTE
    commas = np.cumsum(kind == COMMA, dtype=np.int32 if at.size < 2**31 else np.int64)  # commas up to each hit
    newlines = at[is_nl]
    scan = _Scan(at[is_quote], commas[is_quote], at[kind == CR],
                 np.append(commas[is_nl], commas[-1] if commas.size else 0))
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    starts = np.concatenate(([bom], newlines + 1)).astype(np.int64)
    ends = np.concatenate((newlines, [len(data)])).astype(np.int64)
    ends -= (ends > starts) & (arr[np.maximum(ends - 1, 0)] == CR)  # the CR of CRLF is not text
    return scan, starts, ends


def _check_columns(header: list[str], required: Sequence[str], rel: str) -> tuple[str, ...]:
    """Raise InputFileError for a duplicate or missing required column; return the extra columns."""
    dupes = sorted({c for c in header if c in required and header.count(c) > 1})
    if dupes:
        raise InputFileError(rel, f"duplicate column(s): {', '.join(dupes)}", line=1)
    missing = [c for c in required if c not in header]
    if missing:
        raise InputFileError(rel, f"missing required column(s): {', '.join(missing)}", line=1)
    return tuple(c for c in header if c not in required)


def _problems(data: bytes, arr: np.ndarray, recs: _Records, scan: _Scan,
              width: int) -> tuple[dict[int, str], np.ndarray]:
    """({record: why it is structurally broken}, records with line breaks in values); ``width``: the header's."""
    nfields, problems, breaks = _structure(data, arr, recs, scan)
    for r in np.flatnonzero(nfields != width):
        problems.setdefault(int(r), f"wrong number of fields: expected {width}, got {int(nfields[r])}")
    for r in recs.spanning.tolist():  # a record's line is where it starts: say where it ends
        if r in problems:
            problems[r] += f" (the record spans lines {recs.first[r] + 1}-{recs.last[r] + 1})"
    return problems, breaks


def _sound_body(data: bytes, recs: _Records, starts: np.ndarray, cut: Sequence[int]) -> bytes | memoryview:
    """The bytes of the records not in ``cut``: the runs between broken records are contiguous byte ranges."""
    rs, re_, last = recs.start, recs.end, recs.last
    view = memoryview(data)
    pieces, prev = [], int(rs[0]) if len(rs) else 0
    for r in cut:
        pieces.append(view[prev : rs[r]])
        prev = int(starts[last[r] + 1]) if last[r] + 1 < len(starts) else int(re_[r])
    if len(rs):
        pieces.append(view[prev : max(prev, int(re_[-1]))])
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # no copy in the common case


def _parse(body: bytes | memoryview, names: list[str], required: Sequence[str], records: int,
           newlines_in_values: bool, rel: str) -> dict[str, pa.Array]:
    """Parse the sound records with Arrow: the required columns as text, trimmed."""
    convert = pacsv.ConvertOptions(column_types={c: pa.string() for c in required}, include_columns=list(required),
                                   strings_can_be_null=False, quoted_strings_can_be_null=False)
    parse = pacsv.ParseOptions(newlines_in_values=newlines_in_values)
    try:  # every column as text: the rules decide what a value means, not type inference
        table = pacsv.read_csv(pa.BufferReader(pa.py_buffer(body)), convert_options=convert, parse_options=parse,
                               read_options=pacsv.ReadOptions(column_names=names, block_size=8 << 20))
    except pa.ArrowInvalid as exc:
        raise InputFileError(rel, f"not valid CSV ({str(exc).splitlines()[0]})") from None
    if table.num_rows != records:
        raise InputFileError(rel, f"not valid CSV ({table.num_rows} rows parsed, {records} records)")
    return {c: pc.utf8_trim_whitespace(table.column(c).combine_chunks()) for c in required}


def _find_structural(arr: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
    """Offsets of every LF, comma, quote and CR, ascending.

    A chunk at a time, into two masks reused throughout: small buffers stay in cache and take no
    fresh pages, where whole-file masks would cost a page fault per 4 KiB of file.
    """
    hit, tmp = np.empty(min(chunk, arr.size), bool), np.empty(min(chunk, arr.size), bool)
    found = []
    for lo in range(0, arr.size, chunk):
        part = arr[lo : lo + chunk]
        mask, scratch = hit[: part.size], tmp[: part.size]
        np.equal(part, LF, out=mask)
        for byte in (COMMA, QUOTE, CR):
            mask |= np.equal(part, byte, out=scratch)
        found.append(np.flatnonzero(mask) + lo)
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _header(data: bytes, starts: np.ndarray, ends: np.ndarray, n: int, rel: str) -> tuple[list[str], int]:
    """Parse the header record; return (its names, trimmed; the number of physical lines it takes)."""

    def lines() -> Iterator[str]:  # line by line with their line ends: a quoted name may span lines
        for k in range(n):
            yield data[starts[k] : starts[k + 1] if k + 1 < n else ends[k]].decode("utf-8")

    reader = csv.reader(lines(), strict=True)
    try:
        header = [c.strip() for c in next(reader)]
    except csv.Error as exc:
        raise InputFileError(rel, f"header row is not valid CSV ({exc})", line=1) from None
    return header, reader.line_num


def _records(data: bytes, arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, h: int, n: int,
             scan: _Scan) -> _Records:
    """Group the data lines ``[h, n)`` into records: a line break inside a quoted value is data.

    Vectorized per line (:func:`_quotes`): its quote count, and whether every quote stands where
    RFC 4180 puts one. Such a line leaves a value open exactly when its start state flipped by its
    quote count says so; the rare other lines are read by :func:`_ends_inside`. Only the lines
    that can leave a value open are visited one by one, so a file without quoted line breaks
    costs a few array passes. A value still open at the end of the file quarantines only the
    line that opened it, and reading resumes on the next line.
    """
    ds, de = starts[h:n], ends[h:n]
    text = de > ds  # empty lines are not records
    if text.all():  # the usual file: its lines are its records, their bytes views of the line arrays
        nonempty, rs, re_, pick = np.arange(h, n), ds, de, slice(h, n)
    else:
        nonempty = pick = np.flatnonzero(text) + h
        rs, re_ = starts[nonempty], ends[nonempty]
    lo, hi = np.searchsorted(scan.quotes, [starts[h], ends[n - 1]] if h < n else [0, 0])
    q, qc = scan.quotes[lo:hi], scan.quote_commas[lo:hi]
    none, no = np.zeros(len(nonempty), bool), np.zeros(0, np.int64)
    if not q.size:
        return _Records(nonempty, nonempty, rs, re_, no, q, qc, no, no, none, none)
    qs = _quotes(arr, starts, ends, n, q)
    misplaced_in, misplaced_out, odd = qs.misplaced_in, qs.misplaced_out, qs.odd

    def ends_inside(k: int, inside: bool) -> bool:
        if not (misplaced_in if inside else misplaced_out)[k]:
            return inside != bool(odd[k])
        return _ends_inside(data[starts[k] : ends[k]], inside)

    # Starting outside, only these lines can end inside; the first of them does start outside.
    maybe = np.union1d(qs.odd_lines, qs.out_lines)
    openers = [k for k in maybe[~qs.text_quotes[maybe]].tolist() if ends_inside(k, False)]
    if not openers:
        rec = qs.line - h if isinstance(pick, slice) else np.searchsorted(nonempty, qs.line)
        return _without_text_quotes(_Records(nonempty, nonempty, rs, re_, no, q, qc, rec, qs.local,
                                             misplaced_out[pick] & qs.can_open[pick], none), qs.text_quotes[pick])
    # Starting inside, only these lines can end outside (close the value).
    spans, unclosed = _spans(openers, np.union1d(qs.odd_lines, qs.in_lines), ends_inside, h, n)
    covered = np.zeros(n, bool)
    for e, end in spans:
        covered[e + 1 : end + 1] = True
    first = nonempty[~covered[nonempty]]
    last = first.copy()
    spanning = no
    if spans:
        opened, closed = np.array(spans, dtype=np.int64).T
        spanning = np.searchsorted(first, opened)
        last[spanning] = closed
    misplaced_before = np.concatenate(([0], np.cumsum(misplaced_in)))
    irregular = (misplaced_out[first] & qs.can_open[first]) | (misplaced_before[last + 1] > misplaced_before[first + 1])
    rec = np.searchsorted(first, qs.line, side="right") - 1
    # A line read inside a value is never text-quoted; one that opens a value can open one.
    return _without_text_quotes(_Records(first, last, starts[first], ends[last], spanning, q, qc, rec, _rank(rec),
                                         irregular, np.isin(first, unclosed)), qs.text_quotes[first])


def _quotes(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, n: int, q: np.ndarray) -> _Quotes:
    """How the quotes at offsets ``q`` (ascending, on lines before ``n``) stand on their lines.

    An opening quote starts a field, a closing quote ends one, ``""`` is a closing and an opening
    quote back to back; a quote is misplaced when it is not where its turn puts it, both for a line
    that starts outside a quoted value and for one that starts inside.
    """
    line = np.searchsorted(starts, q, side="right") - 1  # the physical line of each quote (ascending)
    local = _rank(line)  # its index among that line's quotes
    prev, nxt = arr[q - 1], arr[np.minimum(q + 1, arr.size - 1)]  # q >= 1: the header comes first
    at_field = (q == starts[line]) | (prev == COMMA)
    opens = at_field | (prev == QUOTE)
    closes = (q + 1 == ends[line]) | (nxt == COMMA) | (nxt == QUOTE)
    even = (local & 1) == 0
    heads = np.flatnonzero(local == 0)
    odd_lines = line[heads[(np.diff(heads, append=q.size) & 1) == 1]]
    # Starting outside, a line's quotes open, close, open, ...; starting inside, close, open, ...
    out_lines, in_lines = line[np.where(even, ~opens, ~closes)], line[np.where(even, ~closes, ~opens)]
    odd, misplaced_out, misplaced_in = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    odd[odd_lines] = misplaced_out[out_lines] = misplaced_in[in_lines] = True
    # Read from outside, a line none of whose quotes starts a field (``12" pipe``) opens no value:
    # every quote on it is text, for the csv module and Arrow alike.
    can_open = np.zeros(n, bool)
    can_open[line[at_field]] = True
    return _Quotes(line, local, odd_lines, out_lines, in_lines, odd, misplaced_out, misplaced_in, can_open,
                   misplaced_out & ~can_open)


def _spans(openers: list[int], closers: np.ndarray, ends_inside: Callable[[int, bool], bool], h: int,
           n: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Follow each value opened on a line of ``openers`` to the line of ``closers`` that closes it.

    Returns the (opening line, closing line) of every record spanning lines, and the lines whose
    value stays open to the end of the file.
    """
    spans: list[tuple[int, int]] = []
    unclosed: list[int] = []
    k = h  # the next line that starts a record
    eof_from = n  # reading inside a value from this line on reaches the end of the file
    for e in openers:
        if e < k:  # inside the value of an earlier record
            continue
        end, j = None, e + 1
        while j < eof_from:
            p = int(np.searchsorted(closers, j))
            if p == closers.size or closers[p] >= eof_from:
                break
            if not ends_inside(int(closers[p]), True):
                end = int(closers[p])
                break
            j = int(closers[p]) + 1
        if end is None:  # open to the end: every later value opened also stays open (same lines)
            eof_from = min(eof_from, e + 1)
            unclosed.append(e)
            k = e + 1
        else:
            spans.append((e, end))
            k = end + 1
    return spans, unclosed


def _without_text_quotes(recs: _Records, text_quotes: np.ndarray) -> _Records:
    """Drop the quotes of the records whose quotes are all text: they shape neither fields nor values."""
    if not text_quotes.any():
        return recs
    keep = ~text_quotes[recs.quote_rec]
    return replace(recs, quotes=recs.quotes[keep], quote_commas=recs.quote_commas[keep],
                   quote_rec=recs.quote_rec[keep], quote_local=recs.quote_local[keep])


def _rank(keys: np.ndarray) -> np.ndarray:
    """For ascending ``keys``: the index of each element among the equal ones before it."""
    idx = np.arange(keys.size)
    head = np.ones(keys.size, bool)
    head[1:] = keys[1:] != keys[:-1]
    return idx - np.maximum.accumulate(np.where(head, idx, 0))


_QUOTE_OR_COMMA = re.compile(rb'[",]')


def _ends_inside(text: bytes, inside: bool) -> bool:
    """Whether a line with misplaced quotes leaves a quoted value open, reading it as the csv module does.

    A quote opens a value only at the start of a field; inside one, ``""`` is a quote and ``"``
    closes it; anywhere else a quote is text up to the next comma.
    """
    state = 2 if inside else 0  # 0 field start, 1 unquoted field, 2 quoted value, 3 after its quote
    after = 0  # the offset just past the last quote or comma
    for m in _QUOTE_OR_COMMA.finditer(text):
        at = m.start()
        if at > after and state != 2:  # other text came first
            state = 1
        after = at + 1
        if text[at] == COMMA:
            state = 2 if state == 2 else 0
        elif state != 1:
            state = 3 if state == 2 else 2
    return state == 2


def _structure(data: bytes, arr: np.ndarray, recs: _Records,
               scan: _Scan) -> tuple[np.ndarray, dict[int, str], np.ndarray]:
    """Count the fields of every record; return (counts, {record: problem}, records with line breaks in values).

    Vectorized: fields = commas + 1 - commas inside quotes. In a record whose quotes all stand
    where RFC 4180 puts them they pair up in order (opening, closing), and the commas inside
    quotes are those between the two quotes of a pair; the rare irregular records are read by
    the csv module instead.
    """
    rs, re_, q = recs.start, recs.end, recs.quotes
    problems: dict[int, str] = {}
    nfields = scan.commas_to[recs.last] - scan.commas_to[recs.first - 1] + 1
    breaks = recs.spanning
    if not rs.size:
        return nfields, problems, breaks
    if q.size:
        rec = recs.quote_rec
        regular = ~(recs.irregular[rec] | recs.unclosed[rec])
        pair = np.flatnonzero(((recs.quote_local & 1) == 0) & regular)  # an even count: each has a partner
        if pair.size:
            inner = recs.quote_commas[pair + 1] - recs.quote_commas[pair]
            heads = np.flatnonzero(np.diff(rec[pair], prepend=-1))
            nfields[rec[pair[heads]]] -= np.add.reduceat(inner, heads)
    lo, hi = np.searchsorted(scan.crs, [rs[0], re_[-1]])
    cr = scan.crs[lo:hi]
    cr = cr[arr[cr + 1] != LF]  # not part of CRLF (a CR ending the last line is not in range)
    if cr.size:
        rec = np.searchsorted(rs, cr, side="right") - 1
        quoted = np.zeros(cr.size, bool)
        if q.size:
            quoted = (((np.searchsorted(q, cr) - np.searchsorted(q, rs[rec])) & 1) == 1) \
                & ~(recs.irregular[rec] | recs.unclosed[rec])
        breaks = np.union1d(breaks, rec[quoted])  # a CR inside quotes is data; Arrow ends rows at a bare one
        for r in np.unique(rec[~quoted]).tolist():
            problems[r] = "line contains a bare carriage return"
    for r in np.flatnonzero(recs.unclosed).tolist():
        problems.setdefault(r, "unbalanced quotes (a quoted value opened on this line is never closed)")
    for r in np.flatnonzero(recs.irregular).tolist():
        if r in problems:
            continue
        try:  # one row by construction: its line breaks are inside quotes, as the csv module reads them
            (row,) = csv.reader(io.StringIO(data[rs[r] : re_[r]].decode("utf-8"), newline=""), strict=True)
        except csv.Error as exc:
            problems[r] = f"malformed quoting ({exc})"
            continue
        nfields[r] = len(row)
    return nfields, problems, breaks


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
        good = res7_cells(enc.dictionary)
        ok = good[enc.indices.to_numpy()] if len(good) else np.zeros(0, bool)
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


#: The base cells that are pentagons: their cells may not start (after zeros) with digit 1.
_PENTAGON_BASE_CELLS = np.array([4, 14, 24, 38, 49, 58, 63, 72, 83, 97, 107, 117])
_HEX_VALUE = np.full(256, 255, dtype=np.uint8)
_HEX_VALUE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


def res7_cells(cells: pa.Array) -> np.ndarray:
    """Whether each string of ``cells`` is an H3 cell at resolution 7, spelled in lower-case hex.

    The test of ``h3.is_valid_cell`` (H3's ``isValidCell``) and ``h3.get_resolution(c) == 7``,
    done on the bits of all the strings at once: 15 hex digits; mode 1 (a cell), the reserved
    bits and the high bit zero; a base cell below 122; resolution 7; the first seven digits 0-6,
    the other eight 7 (unused); and on a pentagon's base cell, a first non-zero digit other than
    1 (the deleted K axis). String by string, a big reference file's test was a noticeable cost.
    """
    cells = pc.fill_null(cells, "")
    ok = _np(pc.and_(pc.equal(pc.binary_length(cells), 15), pc.string_is_ascii(cells)))
    if not ok.any():
        return ok
    spelled = pc.filter(cells, pa.array(ok)).cast(pa.binary())  # fresh: its bytes are contiguous
    start = int(np.frombuffer(spelled.buffers()[1], dtype=np.int32)[spelled.offset])
    chars = np.frombuffer(spelled.buffers()[2], dtype=np.uint8)[start:start + 15 * len(spelled)].reshape(-1, 15)
    nibbles = _HEX_VALUE[chars]
    hexed = (nibbles != 255).all(axis=1)
    value = np.zeros(len(chars), dtype=np.uint64)
    for k in range(15):
        value = (value << np.uint64(4)) | (nibbles[:, k].astype(np.uint64) & np.uint64(15))

    def bits(shift: int, width: int) -> np.ndarray:
        return ((value >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(np.int64)

    digits = np.stack([bits(3 * (15 - r), 3) for r in range(1, 16)], axis=1)  # digit r at column r - 1
    used = digits[:, :7]
    first = used[np.arange(len(used)), np.argmax(used != 0, axis=1)]  # 0 when all are zero
    valid = (hexed & (bits(63, 1) == 0) & (bits(59, 4) == 1) & (bits(56, 3) == 0) & (bits(45, 7) < 122)
             & (bits(52, 4) == 7) & (used <= 6).all(axis=1) & (digits[:, 7:] == 7).all(axis=1)
             & ~(np.isin(bits(45, 7), _PENTAGON_BASE_CELLS) & (first == 1)))
    ok[ok] = valid
    return ok


def _day_bounds(day: str) -> tuple[int, int]:
    """[day 00:00Z, next day 00:00Z) in microseconds since the epoch; ValueError for a bad day."""
    lo = (dt.date.fromisoformat(day) - dt.date(1970, 1, 1)).days * 86_400_000_000
    return lo, lo + 86_400_000_000


def _table(schema: pa.Schema, region: Region, day: str, n: int, columns: dict[str, pa.Array]) -> pa.Table:
    columns = {**columns, "region_id": pa.repeat(region.region_id, n), "day": pa.repeat(day, n)}
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def _start(path: Path, rel: str, columns: Sequence[str], day: str) -> tuple[_Parsed, _Judge]:
    _day_bounds(day)  # a bad day is the caller's bug: fail before reading anything
    parsed = _read(path if isinstance(path, StoredFile) else Path(path), rel, columns)
    return parsed, _Judge(parsed)


def validate_outages(path: Path, rel: str, region: Region, day: str) -> tuple[pa.Table, pa.Table, FileReport]:
    """Judge one ``outages.csv``; returns (OUTAGES_RAW rows, QUARANTINE rows, report)."""
    p, j = _start(path, rel, OUTAGES_CSV_COLUMNS, day)
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
    p, j = _start(path, rel, WEATHER_CSV_COLUMNS, day)
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
    p, j = _start(path, rel, CUSTOMERS_CSV_COLUMNS, day)
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
    p, j = _start(path, rel, TERRAIN_CSV_COLUMNS, day)
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


class ReferenceCache:
    """The reference files as judged for a region, kept for the next partition of this process.

    ``reference/customers.csv`` and ``terrain.csv`` are shared by every day of a region and hold
    every region's rows, so judging them again is most of a small partition's ingest. An entry
    is keyed by the file's stamp (:func:`resources.landing.file_stamp`: a changed file never
    keeps its stamp, so no file is read to find its entry), the region's definition and the
    known regions; the day only names the partition columns, which are set anew on a hit.
    """

    MAX_ENTRIES = 128
    _entries: ClassVar[OrderedDict[tuple[str, ...], tuple[str, tuple[pa.Table, pa.Table, FileReport]]]] = OrderedDict()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def judge(cls, validate: Callable[..., tuple[pa.Table, pa.Table, FileReport]], path: Path, rel: str,
              region: Region, day: str, known_regions: Collection[str]) -> tuple[pa.Table, pa.Table, FileReport]:
        stamp = file_stamp(path if isinstance(path, StoredFile) else Path(path))
        if stamp == MISSING:  # the validator says so, naming the file
            return validate(path, rel, region, day, known_regions=known_regions)
        key = (validate.__name__, rel, stamp, region.fingerprint(), *sorted(known_regions))
        with cls._lock:
            hit = cls._entries.get(key)
            if hit is not None:
                cls._entries.move_to_end(key)
        if hit is None:
            judged = validate(path, rel, region, day, known_regions=known_regions)
            with cls._lock:
                cls._entries[key] = (day, judged)
                while len(cls._entries) > cls.MAX_ENTRIES:
                    cls._entries.popitem(last=False)
            return judged
        was, (accepted, quarantine, report) = hit
        if was == day:
            return accepted, quarantine, report
        return _on_day(accepted, day), _on_day(quarantine, day), report

    @classmethod
    def clear(cls) -> None:
        with cls._lock:
            cls._entries.clear()


def _on_day(table: pa.Table, day: str) -> pa.Table:
    """``table`` with its partition column ``day`` set to ``day``."""
    i = table.schema.get_field_index("day")
    return table.set_column(i, table.schema.field(i), pa.repeat(day, table.num_rows).cast(table.schema.field(i).type))


def ingest_partition(landing: Path | str | Storage, region: Region, day: str, *,
                     known_regions: Collection[str]) -> IngestResult:
    """Read and judge the four landing files of one (region, day) partition.

    ``landing``: the landing zone (a folder, an ``s3://`` URL or its :class:`Storage`).

    Raises:
        InputFileError: a file is missing or unreadable as a whole; nothing is returned.
        StorageError: the landing zone's store failed (not the file's fault).
    """
    zone = open_storage(landing)
    rels = landing_layout.input_files(region.region_id, day)
    outages = validate_outages(zone.file(rels[0]), rels[0], region, day)
    weather = validate_weather(zone.file(rels[1]), rels[1], region, day)
    customers = ReferenceCache.judge(validate_customers, zone.file(rels[2]), rels[2], region, day, known_regions)
    terrain = ReferenceCache.judge(validate_terrain, zone.file(rels[3]), rels[3], region, day, known_regions)
    parts = (outages, weather, customers, terrain)
    return IngestResult(
        outages=outages[0], weather=weather[0], customers=customers[0], terrain=terrain[0],
        quarantine=pa.concat_tables([part[1] for part in parts]),
        files=tuple(part[2] for part in parts),
    )
