"""RFC 4180 records in landing files: quoted commas, ``""``, line breaks inside quotes, CRLF, BOM.

Python's csv module is the oracle: what it reads from a file, ingest reads, record for record,
each record's ``line`` being the physical line it starts on and its ``raw`` its full text.
"""

from __future__ import annotations

import csv
import io
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from assets.transforms.ingest import validate_outages
from tests.unit.test_ingest import DAY, GULF, conserved, write

# cause and notes last: garbage in them cannot shift the fields the other rules judge
COLUMNS = ["event_id", "region_id", "reported_at", "lat", "lon", "customers_out", "restored_at", "cause", "notes"]


def stamp(i: int) -> str:
    return f"{DAY}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"


def row(i: int, **over: str) -> dict[str, str]:
    base = {"event_id": f"e{i}", "region_id": "gulf_coast", "reported_at": stamp(i), "lat": "29.7",
            "lon": "-90.0", "customers_out": str(i), "restored_at": "", "cause": "wind", "notes": ""}
    return {**base, **over}


def field(value: str, quote: bool = False) -> str:
    """One RFC 4180 field: quoted when it must be (or when asked), with ``""`` for a quote."""
    if quote or any(c in value for c in ',"\r\n'):
        return '"' + value.replace('"', '""') + '"'
    return value


def rfc(header: list[str], rows: list[dict[str, str]], eol: str = "\n") -> str:
    return "".join(",".join(field(v) for v in line) + eol for line in [header, *[[r[h] for h in header] for r in rows]])


@dataclass
class Rec:
    """One record as the oracle reads it: fields, or why it is structurally broken."""

    line: int
    raw: str
    fields: dict[str, str] | None = None
    broken: str | None = None  # "unbalanced quotes" | "malformed quoting" | "wrong number of fields"


def oracle(text: str) -> list[Rec]:
    """The records of a landing file as contract section 3 reads it, found with the csv module alone.

    A record is what ``csv.reader`` reads (a line break inside quotes is data); one that its
    strict mode rejects is malformed. A quoted value still open at the end of the file is the
    one exception: only the line that opened it is quarantined and reading resumes on the next
    line. Empty lines, and whitespace-only lines at the end, are not records.
    """
    lines = re.findall(r"[^\n]*\n|[^\n]+\Z", text.removeprefix("\ufeff"))
    n = len(lines)
    while n and not lines[n - 1].strip():
        n -= 1
    reader = csv.reader(iter(lines[:n]), strict=True)
    header = [h.strip() for h in next(reader)]
    k, recs = reader.line_num, []
    while k < n:
        if not lines[k].removesuffix("\n").removesuffix("\r"):
            k += 1
            continue
        reader = csv.reader(iter([*lines[k:n], "\n"]), strict=False)  # a sentinel line after the end
        next(reader)
        used = reader.line_num
        if used > n - k:  # it read the sentinel: the value is open to the end of the file
            recs.append(Rec(k + 1, lines[k].removesuffix("\n").removesuffix("\r"), broken="unbalanced quotes"))
            k += 1
            continue
        raw = "".join(lines[k : k + used]).removesuffix("\n").removesuffix("\r")
        try:
            (values,) = csv.reader(io.StringIO(raw, newline=""), strict=True)
        except csv.Error:
            recs.append(Rec(k + 1, raw, broken="malformed quoting"))
        else:
            if len(values) == len(header):
                recs.append(Rec(k + 1, raw, dict(zip(header, values, strict=True))))
            else:
                recs.append(Rec(k + 1, raw, broken="wrong number of fields"))
        k += used
    return recs


def ingest(tmp_path: Path, text: str):
    path = write(tmp_path / "o.csv", text)
    accepted, quarantine, report = validate_outages(path, "o.csv", GULF, DAY)
    assert conserved(report), report
    return accepted, quarantine, report


# ---- the reported file and the cases the report names -----------------------------------

def test_report_300_records_two_causes_with_quoted_line_breaks(tmp_path: Path) -> None:
    cause = "tree, large\nfell on line"
    rows = [row(i, cause=cause if i in (41, 207) else "wind") for i in range(300)]
    text = rfc(COLUMNS, rows)
    assert '"tree, large\nfell on line"' in text and text.count("\n") == 303
    assert len(list(csv.reader(io.StringIO(text, newline="")))) == 301  # header + 300 records
    accepted, quarantine, report = ingest(tmp_path, text)
    assert (report.rows_read, report.rows_accepted, report.rows_quarantined) == (300, 300, 0)
    assert quarantine.num_rows == 0
    causes = accepted.column("cause").to_pylist()
    assert (causes[41], causes[207]) == (cause, cause) and causes.count("wind") == 298
    assert accepted.column("event_id").to_pylist() == [f"e{i}" for i in range(300)]
    # each record's line is where it starts: one line later after each two-line record
    assert accepted.column("source_line").to_pylist() == [i + 2 + (i > 41) + (i > 207) for i in range(300)]


@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_doubled_quotes_and_line_breaks_inside_quotes(tmp_path: Path, eol: str) -> None:
    causes = ['said "hi", then left', '"quoted"', 'a ""double"" one', 'ends with a quote"\nnext line',
              '"\n"', 'crlf\r\ninside', "bare\rcr inside", "two\n\nbreaks", 'x""\ny']
    text = rfc(COLUMNS, [row(i, cause=c) for i, c in enumerate(causes)], eol)
    accepted, quarantine, report = ingest(tmp_path, text)
    assert quarantine.num_rows == 0, quarantine.to_pylist()
    assert report.rows_read == len(causes)
    assert accepted.column("cause").to_pylist() == [c.strip() for c in causes]
    assert accepted.column("source_line").to_pylist() == [r.line for r in oracle(text)]


def test_crlf_file_with_bom_and_a_line_break_in_the_first_record(tmp_path: Path) -> None:
    rows = [row(0, cause="tree\r\nfell"), row(1), row(2, notes="a,\r\nb", cause="limb\ndown")]
    text = "\ufeff" + rfc(COLUMNS, rows, "\r\n") + "\r\n"
    accepted, quarantine, report = ingest(tmp_path, text)
    assert (report.rows_read, report.rows_accepted, quarantine.num_rows) == (3, 3, 0)
    assert accepted.column("event_id").to_pylist() == ["e0", "e1", "e2"]
    assert accepted.column("cause").to_pylist() == ["tree\r\nfell", "wind", "limb\ndown"]
    assert accepted.column("source_line").to_pylist() == [2, 4, 5]


@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_record_with_line_break_that_breaks_a_rule_is_quarantined_once(tmp_path: Path, eol: str) -> None:
    rows = [row(0), row(1, lat="99", cause=f"tree{eol}fell"), row(2)]
    text = rfc(COLUMNS, rows, eol)
    accepted, quarantine, report = ingest(tmp_path, text)
    assert (report.rows_read, report.rows_accepted, report.rows_quarantined) == (3, 2, 1)
    assert accepted.column("source_line").to_pylist() == [2, 5]
    (q,) = quarantine.to_pylist()
    assert (q["line"], q["field"]) == (3, "lat") and "'99'" in q["reason"]
    assert q["raw"] == text.split(eol)[2] + eol + text.split(eol)[3]  # the whole record, as written


@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_record_with_line_break_and_a_field_too_many_is_quarantined_once(tmp_path: Path, eol: str) -> None:
    lines = rfc(COLUMNS, [row(0), row(1), row(2)], eol).split(eol)
    bad = f'{lines[2]},"extra{eol}text{eol}here"'
    text = eol.join([*lines[:2], bad, lines[3]]) + eol
    accepted, quarantine, report = ingest(tmp_path, text)
    assert (report.rows_read, report.rows_accepted, report.rows_quarantined) == (3, 2, 1)
    assert accepted.column("source_line").to_pylist() == [2, 6]
    (q,) = quarantine.to_pylist()
    assert q["line"] == 3 and q["field"] is None and q["raw"] == bad
    assert "wrong number of fields: expected 9, got 10" in q["reason"] and "lines 3-5" in q["reason"]


def test_junk_after_a_closing_quote_spanning_lines_is_malformed(tmp_path: Path) -> None:
    lines = rfc(COLUMNS, [row(0), row(1), row(2)]).splitlines()
    bad = lines[2].replace(",wind,", ',"tree\nfell"x,')
    text = "\n".join([*lines[:2], bad, lines[3]]) + "\n"
    accepted, quarantine, _ = ingest(tmp_path, text)
    assert accepted.column("source_line").to_pylist() == [2, 5]
    (q,) = quarantine.to_pylist()
    assert (q["line"], q["raw"]) == (3, bad) and "malformed quoting" in q["reason"]


def test_quote_never_closed_quarantines_only_its_line(tmp_path: Path) -> None:
    lines = rfc(COLUMNS, [row(i, cause="tree\nfell" if i == 0 else "wind") for i in range(6)]).splitlines()
    # lines[1:3] hold record e0; e2 (line 5) opens a quote that is never closed. So does e4 (line 7),
    # read inside that value or not: its quote after "x" is text or a closing quote followed by
    # junk, the comma after it ends the field either way, and the next quote opens a value.
    lines[4] = lines[4].replace(",wind,", ',"wind,')
    lines[6] = lines[6].replace(",wind,", ',x"y,"wind')
    text = "\n".join(lines) + "\n\n"
    accepted, quarantine, report = ingest(tmp_path, text)
    assert (report.rows_read, report.rows_accepted, report.rows_quarantined) == (6, 4, 2)
    assert accepted.column("event_id").to_pylist() == ["e0", "e1", "e3", "e5"]
    assert accepted.column("source_line").to_pylist() == [2, 4, 6, 8]
    assert accepted.column("cause").to_pylist()[0] == "tree\nfell"
    assert quarantine.column("line").to_pylist() == [5, 7]
    assert quarantine.column("raw").to_pylist() == [lines[4], lines[6]]
    for reason in quarantine.column("reason").to_pylist():
        assert reason.startswith("unbalanced quotes") and "never closed" in reason


def test_header_name_with_a_line_break(tmp_path: Path) -> None:
    header = [*COLUMNS[:-1], "crew\nnotes"]
    rows = [{**row(i), "crew\nnotes": "x"} for i in range(2)]
    accepted, quarantine, report = ingest(tmp_path, rfc(header, rows))
    assert report.extra_columns == ("crew\nnotes",) and quarantine.num_rows == 0
    assert accepted.column("source_line").to_pylist() == [3, 4]


def test_stray_quotes_in_unquoted_fields_are_text_as_for_the_csv_module(tmp_path: Path) -> None:
    lines = rfc(COLUMNS, [row(0), row(1), row(2)]).splitlines()
    lines[1] = lines[1].replace(",wind,", ',12" pipe,')  # an odd quote count, yet one plain record
    lines[2] = lines[2].replace(",wind,", ',3" valve,"tree\nfell"')  # a stray quote, then a quoted break
    text = "\n".join(lines) + "\n"
    expected = oracle(text)
    assert [r.fields["cause"] for r in expected] == ['12" pipe', '3" valve', "wind"]
    accepted, quarantine, report = ingest(tmp_path, text)
    assert quarantine.num_rows == 0, quarantine.to_pylist()
    assert accepted.column("cause").to_pylist() == ['12" pipe', '3" valve', "wind"]
    assert accepted.column("source_line").to_pylist() == [r.line for r in expected] == [2, 3, 5]


def test_bare_carriage_return_outside_quotes_in_a_record_spanning_lines(tmp_path: Path) -> None:
    lines = rfc(COLUMNS, [row(0), row(1, cause="tree\nfell"), row(2)]).split("\n")
    lines[2] = lines[2].replace("gulf_coast", "gulf\rcoast")
    text = "\n".join(lines)
    accepted, quarantine, _ = ingest(tmp_path, text)
    assert accepted.column("source_line").to_pylist() == [2, 5]
    (q,) = quarantine.to_pylist()
    assert (q["line"], q["raw"]) == (3, lines[2] + "\n" + lines[3]) and "carriage return" in q["reason"]


# ---- generated files against the oracle --------------------------------------------------

PIECES = ["a", "tree", " ", ",", '"', '""', "\n", "\r\n", "\r", "é", "limb, large"]


def text_of(rng: random.Random, k: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, k)))


@pytest.mark.parametrize("seed", range(40))
def test_generated_rfc4180_files_read_as_the_csv_module_reads_them(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    header = rng.sample(COLUMNS, len(COLUMNS))  # any column order
    eol = rng.choice(["\n", "\r\n"])
    rows = [row(i, cause=f"{text_of(rng, 4)}k{text_of(rng, 4)}", notes=text_of(rng, 6)) for i in range(rng.randint(1, 40))]
    out = [",".join(header) + eol]
    for r in rows:
        out.append(",".join(field(r[h], rng.random() < 0.2) for h in header) + eol)
        if rng.random() < 0.1:
            out.append(eol)  # an empty line is not a record
    text = ("\ufeff" if rng.random() < 0.3 else "") + "".join(out)
    if rng.random() < 0.3:
        text = text.removesuffix(eol)
    expected = oracle(text)
    assert all(r.fields is not None for r in expected)  # the generator writes valid RFC 4180
    accepted, quarantine, report = ingest(tmp_path, text)
    assert quarantine.num_rows == 0, quarantine.to_pylist()
    assert report.rows_read == report.rows_accepted == len(rows) == len(expected)
    assert accepted.column("source_line").to_pylist() == [r.line for r in expected]
    assert accepted.column("event_id").to_pylist() == [r.fields["event_id"] for r in expected]
    assert accepted.column("cause").to_pylist() == [r.fields["cause"].strip() for r in expected] \
        == [r["cause"].strip() for r in rows]


MESSY = ["tree", " ", ",", '"', '""', "\n", "\r\n", "x", '12" pipe', '",', '"x"y']


def messy(rng: random.Random) -> str:
    text = "".join(rng.choice(MESSY) for _ in range(rng.randint(0, 5)))
    kind = rng.random()
    if kind < 0.5:
        return field(text, quote=True)
    return ('"' + text) if kind < 0.6 else text  # a quote that may never close; stray quotes, raw breaks


@pytest.mark.parametrize("seed", range(60))
def test_generated_messy_files_follow_the_oracle(tmp_path: Path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    eol = rng.choice(["\n", "\r\n"])
    clean = {f"e{i}": row(i) for i in range(rng.randint(1, 30))}
    causes = ['"tree, large\nfell on line"', *(messy(rng) for _ in range(len(clean) - 1))]  # one break for sure
    text = ",".join(COLUMNS) + eol + "".join(
        ",".join([*(r[c] for c in COLUMNS[:-2]), cause, messy(rng)]) + eol
        for r, cause in zip(clean.values(), causes, strict=True))
    expected = oracle(text)
    accepted, quarantine, report = ingest(tmp_path, text)
    assert report.rows_read == len(expected)
    structural = [(q["line"], q["raw"], q["reason"]) for q in quarantine.to_pylist() if q["field"] is None]
    broken = [r for r in expected if r.broken]
    assert [(line, raw) for line, raw, _ in structural] == [(r.line, r.raw) for r in broken]
    for (_, _, reason), r in zip(structural, broken, strict=True):
        assert reason.startswith(r.broken), (reason, r)
    sound = {r.line: r.fields for r in expected if r.fields is not None}
    judged = sorted([*accepted.column("source_line").to_pylist(),
                     *(q["line"] for q in quarantine.to_pylist() if q["field"] is not None)])
    assert judged == sorted(sound)
    got = dict(zip(accepted.column("source_line").to_pylist(), accepted.column("cause").to_pylist(), strict=True))
    for line, fields in sound.items():
        first = clean.get(fields["event_id"])
        if first is not None and all(fields[c] == first[c] for c in COLUMNS[:-2]):  # the rules pass but for cause
            assert (line in got) == bool(fields["cause"].strip()), (line, fields)
        if line in got:
            assert got[line] == fields["cause"].strip()
