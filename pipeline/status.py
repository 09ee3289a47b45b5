"""`stormlake status`: the ledger's view of every partition (contract section 8), as JSON or a table.

Both read through :class:`resources.ledger_views.LedgerViews`, which aggregates in PostgreSQL, so
they answer in well under a second on a year of 50 regions. At that scale:

- ``status --json`` still returns every selected partition in the contract's shape; the server
  builds each partition's JSON and streams them as it goes, a chunk at a time, so output starts
  at once and memory stays flat. Keys inside an object come in PostgreSQL's ``jsonb`` order.
- ``status`` (the table) lists every partition when there are at most :data:`FULL_TABLE_MAX`;
  beyond that it shows the tier counts and the partitions that need attention (failed first),
  and the filters (``--regions``, ``--days``, ``--tier``, ``--failed``, ``--limit``) list the
  partitions asked for.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from typing import Any, TextIO

from assets.phases import PHASES, TIER_LABELS
from assets.quality import GRADES
from resources.landing import utc_today
from resources.ledger import Ledger
from resources.ledger_views import ALL_PARTITIONS, LedgerViews, PartitionRow, StatusFilter, StatusSummary
from resources.settings import DEFAULT_DEAD_LETTER_AFTER

#: Up to this many partitions the unfiltered table lists them all.
FULL_TABLE_MAX = 60
#: Rows of the table a filtered listing shows unless ``--limit`` says otherwise.
TABLE_LIMIT = 200
#: Partitions needing attention shown under the summary of a large ledger.
ATTENTION_ROWS = 20

LAST_TIER = len(PHASES)


def views(ledger: Ledger) -> LedgerViews:
    """The ledger's typed reads."""
    return LedgerViews(ledger)


def as_entry(row: PartitionRow, *, open_day: str,
             dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER) -> dict[str, Any]:
    """One partition in the contract's shape, plus its signal quality, whether it is held, its
    dead-lettered phases, its revisions and whether its day is ``open_day`` (as ``status --json``
    gives them)."""
    return {
        "region": row.region,
        "day": row.day,
        "tier": row.tier,
        "tier_label": row.tier_label,
        "phases": {p.name: row.phases[p.name] for p in PHASES if p.name in row.phases},
        "deliveries": row.deliveries,
        "signal_quality": row.signal_quality,
        "held": row.held,
        "dead_lettered": sorted(name for name, e in row.phases.items() if e.get("failures", 0) >= dead_letter_after),
        "revisions": row.revisions,
        "open": row.day == open_day,
    }


def partition_status(ledger: Ledger, flt: StatusFilter = ALL_PARTITIONS, *,
                     dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER) -> list[dict[str, Any]]:
    """The selected partitions in the contract's shape, in (day, region) order."""
    today = utc_today()
    return [as_entry(row, open_day=today, dead_letter_after=dead_letter_after) for row in views(ledger).partitions(flt)]


def write_json(ledger: Ledger, out: TextIO, flt: StatusFilter = ALL_PARTITIONS, *,
               dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER) -> int:
    """Stream ``{"partitions": [...], "open_days": [...]}`` to ``out``; returns how many partitions
    were written."""
    today = utc_today()
    n = 0
    out.write('{"partitions": [')
    for text in views(ledger).stream_status_json(flt, open_day=today, dead_letter_after=dead_letter_after):
        out.write(",\n" if n else "\n")
        out.write(text)
        n += 1
    out.write("\n]" if n else "]")
    out.write(f', "open_days": {json.dumps(open_days(flt, today))}}}\n')
    return n


def open_days(flt: StatusFilter, today: str) -> list[str]:
    """The days still open within the selection: the UTC day in progress, unless ``--days`` leaves it out."""
    return [today] if flt.days is None or flt.days[0] <= today <= flt.days[1] else []


def open_day_line() -> str:
    """Which day is still open: the current UTC day, whose partitions get a new revision as files land."""
    return (f"open: {utc_today()} (the UTC day in progress: its partitions get a new revision as files land); "
            "every earlier day is closed")


def _row_line(p: PartitionRow) -> str:
    cells = []
    for phase in PHASES:
        e = p.phases.get(phase.name)
        if e is None:
            cells.append(f"{'-':<11}")
        else:
            short = {"COMPLETED": "ok", "FAILED": "FAILED", "PENDING": "pending"}[e["status"]]
            cells.append(f"{short + (' x' + str(e['attempts']) if e['attempts'] > 1 else ''):<11}")
    delivered = sum(d["status"] == "DELIVERED" for d in p.deliveries)
    pending = sum(d["status"] == "PENDING" for d in p.deliveries)
    return (f"{p.day:<10}  {p.region:<16} {str(p.tier) + ' ' + p.tier_label:<18} "
            + " ".join(cells) + f" {p.signal_quality or '-':<8} {p.revisions:<9} {delivered}"
            + (f" (+{pending} pending)" if pending else ""))


def _header() -> list[str]:
    head = (f"{'day':<10}  {'region':<16} {'tier':<18} " + " ".join(f"{p.name:<11}" for p in PHASES)
            + f" {'quality':<8} {'revisions':<9} delivered")
    return [head, "-" * len(head)]


def render_table(ledger: Ledger, flt: StatusFilter = ALL_PARTITIONS, *, filtered: bool = False,
                 dead_letter_after: int | None = None) -> Iterator[str]:
    """The lines of ``stormlake status``: every partition of a small ledger or of a filtered listing,
    else the tier counts and the partitions that need attention; with ``dead_letter_after``, a last
    line counting the dead letters when there are any."""
    v = views(ledger)
    summary = v.summary(flt)
    counted = yield from _table(v, summary, flt, filtered, dead_letter_after)
    # a dead letter is a FAILED head: with none among all the partitions, there is none to count
    if dead_letter_after is not None and (filtered or summary.with_failure):
        dead = counted if counted is not None else len(v.dead_letters(dead_letter_after))
        if dead:
            yield f"{dead} dead-lettered phase(s) wait for a person: stormlake review"


def _table(v: LedgerViews, summary: StatusSummary, flt: StatusFilter, filtered: bool,
           dead_letter_after: int | None) -> Generator[str, None, int | None]:
    """The table's lines. Where the attention list is read (over every partition), it also counts
    the dead letters, and that count is returned (else None)."""
    if summary.partitions == 0:
        yield ("no partitions match the filters" if filtered else
               "no partitions in the ledger yet (run `stormlake demo` or `stormlake backfill`)")
        return None
    total_line = f"{summary.partitions} partitions; {summary.by_tier[LAST_TIER]} published" + (
        f"; {summary.held} held for review (stormlake review)" if summary.held else "")
    if filtered or summary.partitions <= FULL_TABLE_MAX:
        limit = flt.limit if flt.limit is not None else (TABLE_LIMIT if filtered else None)
        rows = v.partitions(StatusFilter(regions=flt.regions, days=flt.days, tier=flt.tier, failed=flt.failed,
                                         limit=limit))
        yield from _header()
        yield from (_row_line(p) for p in rows)
        if len(rows) < summary.partitions:
            yield f"… {summary.partitions - len(rows)} more (--limit N shows more)"
        yield open_day_line()
        yield total_line
        return None
    yield "partitions by tier: " + ", ".join(
        f"{t} {TIER_LABELS[t]} {summary.by_tier[t]}" for t in range(LAST_TIER + 1))
    yield (f"with a FAILED phase: {summary.with_failure}; with a PENDING phase: {summary.with_pending}; "
           f"held for review: {summary.held}")
    if summary.by_quality:
        yield "signal quality: " + ", ".join(f"{g} {summary.by_quality.get(g, 0)}" for g in GRADES)
    n_attention, attention, dead = v.attention(ATTENTION_ROWS, flt, dead_letter_after=dead_letter_after)
    if n_attention:
        yield ""
        yield f"needing attention: {n_attention} (failed first; the first {len(attention)} shown)"
        yield f"{'day':<10}  {'region':<16} {'tier':<14} {'held at':<10} {'state':<26} error"
        for a in attention:
            error = f"{a.error_class}: {a.error_message}" if a.error_class else ""
            yield (f"{a.day:<10}  {a.region:<16} {str(a.tier) + ' ' + TIER_LABELS[a.tier]:<14} {a.phase:<10} "
                   f"{a.state + (f' x{a.attempts}' if (a.attempts or 0) > 1 else ''):<26} {error[:120]}")
    yield ""
    yield "list partitions with --regions a,b, --days START..END, --tier N, --failed, --limit N; --json for all"
    yield open_day_line()
    yield total_line
    return dead
