"""Typed reads of the ledger for people and sensors: status, the report, the outbox, the bench.

Status and the report read ``partition_state`` (migration 004): one row a partition, with its
tier, flags and the contract's entries, which the database refreshes in the same transaction as
every change of a checkpoint or a receipt. So a view costs about the same on a ledger of a year of
50 regions (18,250 partitions, 73,000 head checkpoints, a quarter of a million events) as on a
demo's: nothing here walks every checkpoint, in Python or in SQL. The one view that returns every
partition, the full ``status --json`` dump, is made as JSON text by the server and streamed
as the server makes it, a chunk of partitions at a time.

A partition's tier is the number of leading phases (``phase_order``) whose head checkpoint is
COMPLETED on the current state of every phase it read (``summary.upstream`` contained in the
partition's current state hashes), as contract section 8 defines it; the SQL of migration 004 is
its one definition.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row

from resources.errors import AccessRefused, LedgerError
from resources.landing import utc_today
from resources.ledger import Checkpoint, Ledger
from resources.settings import DEFAULT_DEAD_LETTER_AFTER

T = TypeVar("T")

#: Rows a chunk when streaming the full status.
STREAM_BATCH = 2000

#: How many revisions the partition ``s`` has had: the most artifact ids any of its artifacts (kind
#: and target) was delivered under, each new revision superseding the one before. The one
#: definition, for the table, the report and ``status --json``; read from the entries that
#: ``partition_state`` already holds, so it costs no query of its own.
REVISIONS_SQL = sql.SQL(
    "(SELECT coalesce(max(g.n), 0) FROM (SELECT count(DISTINCT d->>'artifact_id') AS n"
    " FROM jsonb_array_elements(s.deliveries) d"
    " GROUP BY split_part(d->>'artifact_id', '@', 1), d->>'target') g)")


@dataclass(frozen=True)
class StatusFilter:
    """Which partitions a view covers; every field narrows it, the default is all of them."""

    regions: tuple[str, ...] = ()
    days: tuple[str, str] | None = None  # inclusive
    tier: int | None = None
    failed: bool = False  # only partitions with a FAILED head
    limit: int | None = None


#: The filter that selects every partition.
ALL_PARTITIONS = StatusFilter()


@dataclass(frozen=True)
class PartitionRow:
    """One partition as status shows it (the contract's entry, as Python values)."""

    partition_key: str
    region: str
    day: str
    tier: int
    tier_label: str  # the ledger's: "held_for_review" for a held batch (migration 006)
    failed: bool
    pending: bool
    phases: dict[str, dict[str, Any]]
    deliveries: list[dict[str, Any]]
    held: bool = False  # present held its deliveries for review (a noisy batch)
    signal_quality: str | None = None  # present's grade, None before present ran
    revisions: int = 0  # see REVISIONS_SQL


@dataclass(frozen=True)
class StatusSummary:
    partitions: int
    by_tier: dict[int, int]
    with_failure: int
    with_pending: int
    held: int = 0
    by_quality: dict[str, int] = field(default_factory=dict)  # grade -> partitions graded so


@dataclass(frozen=True)
class GridCell:
    """A partition on the report's heat map."""

    region: str
    day: str
    tier: int
    failed: bool
    pending: bool
    quality: str | None = None  # present's signal quality, None before present ran
    held: bool = False


@dataclass(frozen=True)
class PhaseCount:
    phase: str
    status: str
    heads: int
    retried: int  # heads with attempt > 1
    stale: int  # PENDING heads untouched longer than the stale limit


@dataclass(frozen=True)
class PhaseDurations:
    phase: str
    n: int
    failed: int
    p50: float | None
    p90: float | None
    max: float | None


@dataclass(frozen=True, kw_only=True)
class RegionCounts(StatusSummary):
    """The summary of one region's partitions."""

    region: str


@dataclass(frozen=True)
class AttentionRow:
    """A partition not at the last tier or with a failure, and the phase it is held at."""

    partition_key: str
    region: str
    day: str
    tier: int
    phase: str  # the first FAILED phase, else the phase after its tier
    state: str  # FAILED | PENDING | stale (upstream changed) | not run
    also_failed: list[str]
    error_class: str | None
    error_message: str | None
    attempts: int | None
    run_id: str | None
    updated_at: dt.datetime | None


class Attention(NamedTuple):
    """The partitions that need attention: how many, the first of them, and (when asked for) how
    many dead-lettered phases they hold."""

    total: int
    rows: list[AttentionRow]
    dead_letters: int | None = None


@dataclass(frozen=True)
class ReceiptCounts:
    target: str
    kind: str
    delivered: int
    pending: int
    revisions: int
    attempts: int
    with_error: int
    last_delivered: dt.datetime | None


@dataclass(frozen=True)
class ReceiptRow:
    artifact_id: str
    idempotency_key: str
    target: str
    status: str
    supersedes: str | None
    attempts: int
    last_error: str | None
    created_at: dt.datetime
    delivered_at: dt.datetime | None


@dataclass(frozen=True)
class PhaseSpan:
    """A completed head checkpoint's time in flight: claimed (``created_at``) to committed."""

    partition_key: str
    phase: str
    created_at: dt.datetime
    completed_at: dt.datetime


@dataclass(frozen=True)
class EventRow:
    event_id: int
    partition_key: str
    phase: str
    status: str
    run_id: str | None
    at: dt.datetime


class LedgerViews:
    """The read side of the ledger: each method one question, answered by the server."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        # A person's read: the logged request of each kind read, per session (backend pid), since
        # a request serves only the session that opened it (migration 009).
        self._requests: dict[tuple[int, str], int] = {}
        self._uses: list[str] = []  # the kinds of read the next read names in its transaction

    #: placeholder -> (the table the pipeline reads, the ``ledger_read`` view a person's read goes through)
    SOURCES: dict[str, tuple[str, str]] = {
        "ps": ("partition_state", "partitions"), "cp": ("checkpoints", "checkpoints"),
        "ev": ("checkpoint_events", "events"), "rc": ("receipts", "receipts"),
    }

    def _q(self, text: str, **parts: sql.Composable) -> sql.Composed:
        """``text`` with its sources filled in: ``{ps}``, ``{cp}``, ``{ev}``, ``{rc}`` are the tables
        themselves for the pipeline. For an audited ledger (a person's reads) they are the views of
        ``ledger_read`` (migration 007), each through a logged read request, opened and committed
        once per kind and session for this object, and named by the transaction of the next read
        (:meth:`_read`). Other ``{name}`` fields come from ``parts``."""
        names = {f for _, f, _, _ in string.Formatter().parse(text) if f}
        for name in names & set(self.SOURCES):
            table, what = self.SOURCES[name]
            if self.ledger.audited:
                self._uses.append(what)
                parts[name] = sql.Identifier("ledger_read", what)
            else:
                parts[name] = sql.Identifier(table)
        return sql.SQL(text).format(**parts)

    def _request(self, conn: psycopg.Connection, what: str) -> int:
        """The logged read request of kind ``what`` of the session ``conn`` (outside a transaction),
        opened (and committed, durably) on its first use there."""
        key = (conn.info.backend_pid, what)
        if key not in self._requests:
            self._requests[key] = int(conn.execute("SELECT ledger_read.open(%s)", (what,)).fetchone()[0])
        return self._requests[key]

    def sibling(self) -> LedgerViews:
        """A reader of the same ledger for another thread (one object is not shared between
        threads), going through this one's read requests."""
        other = LedgerViews(self.ledger)
        other._requests = self._requests
        return other

    def _read(self, fn: Callable[[psycopg.Connection], T], *, what: str) -> T:
        """Run the read ``fn(conn)``: for a person's read in one transaction that first names the
        requests its queries read through (``ledger_read.use``)."""
        kinds = self._take_uses()
        if not kinds:
            return self.ledger.read(fn, what=what)
        with self._session(what) as conn:
            requests = [self._request(conn, k) for k in kinds]  # each committed before the read begins
            with conn.transaction():
                self._use(conn, requests)
                return fn(conn)

    @contextlib.contextmanager
    def _session(self, what: str) -> Iterator[psycopg.Connection]:
        """A session of the ledger's pool for a person's read; the database's refusal is one line."""
        try:
            with self.ledger.connection() as conn:
                yield conn
        except psycopg.errors.InsufficientPrivilege as exc:
            raise AccessRefused(f"could not {what}: {exc.diag.message_primary}") from exc
        except psycopg.Error as exc:
            raise LedgerError(f"ledger error while trying to {what}: {exc.__class__.__name__}: {exc}") from exc

    def _take_uses(self) -> list[str]:
        """The kinds of read the queries built since the last read go through (once each)."""
        kinds, self._uses = sorted(set(self._uses)), []
        return kinds

    @staticmethod
    def _use(conn: psycopg.Connection, requests: list[int]) -> None:
        """Name ``requests`` (the session's own) in the transaction ``conn`` is in."""
        for request in requests:
            conn.execute("SELECT ledger_read.use(%s)", (request,))

    def hidden_phases(self) -> list[str]:
        """The phases whose checkpoints the ledger's role may not read (none for the pipeline)."""
        if not self.ledger.audited:
            return []
        return [r[0] for r in self._read(
            lambda c: c.execute("SELECT phase FROM phase_order WHERE NOT ledger_may_read(phase, current_user)"
                                " ORDER BY position").fetchall(), what="read the access policy")]

    @staticmethod
    def _where(flt: StatusFilter) -> sql.Composed:
        conds: list[sql.Composable] = [sql.SQL("true")]
        if flt.regions:
            conds.append(sql.SQL("s.region_id = ANY({})").format(sql.Literal(list(flt.regions))))
        if flt.days:
            conds.append(sql.SQL("s.day BETWEEN {} AND {}").format(sql.Literal(flt.days[0]), sql.Literal(flt.days[1])))
        if flt.tier is not None:
            conds.append(sql.SQL("s.tier = {}").format(sql.Literal(int(flt.tier))))
        if flt.failed:
            conds.append(sql.SQL("s.failed"))
        return sql.SQL(" AND ").join(conds)

    @staticmethod
    def _limit(flt: StatusFilter) -> sql.Composable:
        return sql.SQL(" LIMIT {}").format(sql.Literal(int(flt.limit))) if flt.limit is not None else sql.SQL("")

    def _rows(self, query: sql.Composable | str, row: type[T], what: str, params: tuple[Any, ...] = ()) -> list[T]:
        """The rows of one read-only query, as ``row`` dataclasses."""

        def q(conn: psycopg.Connection) -> list[T]:
            with conn.cursor(row_factory=class_row(row)) as cur:
                return cur.execute(query, params).fetchall()  # type: ignore[arg-type]

        return self._read(q, what=what)

    # ---- status ----------------------------------------------------------------------------
    def partitions(self, flt: StatusFilter = ALL_PARTITIONS) -> list[PartitionRow]:
        """The selected partitions, in (day, region) order."""
        query = self._q("SELECT s.partition_key, s.region_id AS region, s.day, s.tier, s.tier_label, s.failed,"
                        " s.pending, s.phases,"
                        " s.deliveries, s.held, s.signal_quality, {revisions} AS revisions"
                        " FROM {ps} s WHERE {where} ORDER BY s.day, s.region_id{limit}",
                        where=self._where(flt), limit=self._limit(flt), revisions=REVISIONS_SQL)
        return self._rows(query, PartitionRow, "read the partitions' status")

    def stream_status_json(self, flt: StatusFilter = ALL_PARTITIONS, *, open_day: str | None = None,
                           dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER) -> Iterator[str]:
        """Each selected partition as the contract's JSON object (text made by the server), in order.

        Beyond the contract's keys: ``signal_quality`` (null before present ran), ``held``,
        ``dead_lettered``, the phases that failed ``dead_letter_after`` times on their inputs,
        ``revisions`` (:data:`REVISIONS_SQL`) and ``open``, whether its day is ``open_day`` (by
        default the UTC day in progress).

        The rows are streamed (libpq's chunked rows, :data:`STREAM_BATCH` at a time; one at a time
        with a libpq older than 17): a dump of every partition of a year starts at once, holds one
        chunk in memory, and the server makes the next rows while this process writes the last
        ones (a server-side cursor would make each batch only when asked for it). An iterator
        closed early cancels the query.

        The object is written as text around the entries' own text, its keys in the order
        ``jsonb`` gives them (by length, then bytes), as a ``jsonb`` object of these values would
        print; building that object first would copy every partition's entries and deliveries
        into it only to print them, a large share of the server's time for a year's dump.
        """
        query = self._q("SELECT concat('{{\"day\": ', to_json(s.day), ', \"held\": ', to_json(s.held),"
                        " ', \"open\": ', (s.day = {today})::text,"
                        " ', \"tier\": ', s.tier, ', \"phases\": ', s.phases, ', \"region\": ', to_json(s.region_id),"
                        " ', \"revisions\": ', {revisions},"
                        " ', \"deliveries\": ', s.deliveries, ', \"tier_label\": ', to_json(s.tier_label),"
                        " ', \"dead_lettered\": ', CASE WHEN s.failed THEN coalesce((SELECT jsonb_agg(e.key ORDER BY e.key)"
                        "  FROM jsonb_each(s.phases) e WHERE (e.value->>'failures')::int >= {after}), '[]')"
                        " ELSE '[]' END, ', \"signal_quality\": ', coalesce(to_json(s.signal_quality)::text, 'null'), '}}')"
                        " FROM {ps} s WHERE {where} ORDER BY s.day, s.region_id{limit}",
                        after=sql.Literal(int(dead_letter_after)), where=self._where(flt), limit=self._limit(flt),
                        today=sql.Literal(open_day or utc_today()), revisions=REVISIONS_SQL)
        kinds = self._take_uses()
        with self._session("read the partitions' status") as conn:
            requests = [self._request(conn, k) for k in kinds]
            with conn.transaction(), conn.cursor() as cur:
                self._use(conn, requests)
                for (text,) in cur.stream(query, size=STREAM_BATCH if psycopg.pq.version() >= 170000 else 1):
                    yield text

    def summary(self, flt: StatusFilter = ALL_PARTITIONS) -> StatusSummary:
        query = self._q("SELECT s.tier, s.signal_quality, count(*), count(*) FILTER (WHERE s.failed),"
                        " count(*) FILTER (WHERE s.pending), count(*) FILTER (WHERE s.held)"
                        " FROM {ps} s WHERE {where} GROUP BY s.tier, s.signal_quality", where=self._where(flt))

        def q(conn: psycopg.Connection) -> tuple[int, list[tuple[Any, ...]]]:
            last = conn.execute("SELECT max(position) FROM phase_order").fetchone()[0]
            return int(last), conn.execute(query).fetchall()

        last, rows = self._read(q, what="summarize the partitions")
        by_tier = dict.fromkeys(range(last + 1), 0)
        by_quality: dict[str, int] = {}
        for tier, grade, n, *_ in rows:
            by_tier[int(tier)] = by_tier.get(int(tier), 0) + int(n)
            if grade is not None:
                by_quality[grade] = by_quality.get(grade, 0) + int(n)
        return StatusSummary(partitions=sum(int(r[2]) for r in rows), by_tier=by_tier,
                             with_failure=sum(int(r[3]) for r in rows), with_pending=sum(int(r[4]) for r in rows),
                             held=sum(int(r[5]) for r in rows), by_quality=by_quality)

    def grid(self, flt: StatusFilter = ALL_PARTITIONS) -> list[GridCell]:
        """(region, day, tier, failed, pending) of every selected partition, for the heat map."""
        query = self._q("SELECT s.region_id AS region, s.day, s.tier, s.failed, s.pending,"
                        " s.signal_quality AS quality, s.held FROM {ps} s WHERE {where}", where=self._where(flt))
        return self._rows(query, GridCell, "read the partition grid")

    def attention(self, limit: int, flt: StatusFilter = ALL_PARTITIONS, *,
                  dead_letter_after: int | None = None) -> Attention:
        """How many partitions are not at the last tier or have a failure, and the first ``limit`` of
        them: failed first, then pending, stale, not run; then by tier, day and region.

        With ``dead_letter_after``, also how many of their phases are dead letters (FAILED that many
        times on the same inputs; see :meth:`dead_letters`). A dead letter's partition has failed,
        so it is among these, and the heads this read has at hand answer it.
        """
        query = self._q(
            "WITH o AS (SELECT phase, position FROM phase_order),"
            " need AS (SELECT s.partition_key, s.region_id, s.day, s.tier,"
            "   (SELECT array_agg(o.phase ORDER BY o.position) FROM o WHERE o.phase = ANY (s.failed_phases))"
            "     AS failed_phases"
            "   FROM {ps} s WHERE ({where}) AND (s.failed OR s.tier < (SELECT max(position) FROM o))),"
            " held AS (SELECT need.*, coalesce(need.failed_phases[1], (SELECT o.phase FROM o WHERE o.position ="
            "   least(need.tier + 1, (SELECT max(position) FROM o)))) AS phase FROM need),"
            # the heads of those partitions, read once (a person's read goes through a view that
            # cannot be probed by key): the held-at phase's head, and the latest run of any head
            " heads AS (SELECT x.partition_key, x.phase, x.status, x.attempt, x.failures, x.error_class, x.error_message,"
            "   x.updated_at, x.run_id, row_number() OVER (PARTITION BY x.partition_key"
            "     ORDER BY x.updated_at DESC) AS newest"
            "   FROM {cp} x WHERE x.superseded_at IS NULL AND x.partition_key IN (SELECT partition_key FROM held)),"
            " last_run AS (SELECT partition_key, run_id FROM heads WHERE newest = 1)"
            " SELECT held.partition_key, held.region_id, held.day, held.tier, held.phase, held.failed_phases,"
            "   c.status, c.attempt, c.error_class, c.error_message, c.updated_at,"
            "   coalesce(c.run_id, r.run_id) AS run_id,"
            "   count(*) OVER () AS total, {dead} AS dead_letters,"
            "   CASE c.status WHEN 'FAILED' THEN 0 WHEN 'PENDING' THEN 1 WHEN 'COMPLETED' THEN 2 ELSE 3 END AS rank"
            " FROM held LEFT JOIN heads c ON c.partition_key = held.partition_key AND c.phase = held.phase"
            "   LEFT JOIN last_run r ON r.partition_key = held.partition_key"
            " ORDER BY rank, held.tier, held.day, held.region_id LIMIT {limit}",
            where=self._where(flt), limit=sql.Literal(int(limit)),
            dead=sql.SQL("NULL::bigint") if dead_letter_after is None else sql.SQL(
                "(SELECT count(*) FROM heads d WHERE d.status = 'FAILED' AND d.failures >= {})").format(
                sql.Literal(int(dead_letter_after))))

        def q(conn: psycopg.Connection) -> list[dict[str, Any]]:
            with conn.cursor(row_factory=dict_row) as cur:
                return cur.execute(query).fetchall()

        rows = self._read(q, what="find the partitions that need attention")
        states = {"FAILED": "FAILED", "PENDING": "PENDING", "COMPLETED": "stale (upstream changed)", None: "not run"}
        out = [AttentionRow(
            partition_key=r["partition_key"], region=r["region_id"], day=r["day"], tier=int(r["tier"]),
            phase=r["phase"], state=states[r["status"]],
            also_failed=[ph for ph in (r["failed_phases"] or []) if ph != r["phase"]],
            error_class=r["error_class"], error_message=r["error_message"], attempts=r["attempt"],
            run_id=r["run_id"], updated_at=r["updated_at"],
        ) for r in rows]
        if not rows:  # nothing needs attention, so nothing has failed
            return Attention(0, [], None if dead_letter_after is None else 0)
        dead = rows[0]["dead_letters"]
        return Attention(int(rows[0]["total"]), out, None if dead is None else int(dead))

    def phase_order(self) -> list[tuple[str, int, str]]:
        """(phase, position, tier label) as the ledger's schema knows them."""
        return self._read(
            lambda c: c.execute("SELECT phase, position, tier_label FROM phase_order ORDER BY position").fetchall(),
            what="read the phase order")

    # ---- phases and events -------------------------------------------------------------------
    def phase_counts(self, *, stale_after: dt.timedelta) -> list[PhaseCount]:
        """Head checkpoints per (phase, status), with how many were retried and how many are stale."""
        query = self._q("SELECT phase, status, count(*) AS heads, count(*) FILTER (WHERE attempt > 1) AS retried,"
                        " count(*) FILTER (WHERE status = 'PENDING' AND updated_at < now() - %s) AS stale"
                        " FROM {cp} c WHERE superseded_at IS NULL GROUP BY phase, status")

        return self._rows(query, PhaseCount, "count head checkpoints per phase", (stale_after,))

    def event_counts(self) -> dict[tuple[str, str], int]:
        """(phase, status) -> number of checkpoint events."""
        query = self._q("SELECT phase, status, count(*) FROM {ev} e GROUP BY phase, status")
        rows = self._read(lambda c: c.execute(query).fetchall(), what="count checkpoint events")
        return {(r[0], r[1]): int(r[2]) for r in rows}

    def durations(self) -> dict[str, PhaseDurations]:
        """Per phase: attempts from claim (PENDING event) to COMPLETED, their percentiles, and failures."""
        # One pass with a window (the claim's time beside each of its outcomes) rather than a join of
        # the events with themselves, which a person's read through the ledger_read view could not
        # serve from an index.
        query = self._q(
            "SELECT x.phase,"
            " count(*) FILTER (WHERE x.status = 'COMPLETED') AS n,"
            " count(*) FILTER (WHERE x.status = 'FAILED') AS failed,"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM x.at - x.started))"
            "   FILTER (WHERE x.status = 'COMPLETED') AS p50,"
            " percentile_cont(0.9) WITHIN GROUP (ORDER BY extract(epoch FROM x.at - x.started))"
            "   FILTER (WHERE x.status = 'COMPLETED') AS p90,"
            " max(extract(epoch FROM x.at - x.started)) FILTER (WHERE x.status = 'COMPLETED') AS max"
            " FROM (SELECT e.phase, e.status, e.at, min(e.at) FILTER (WHERE e.status = 'PENDING')"
            "         OVER (PARTITION BY e.checkpoint_id, e.seq) AS started"
            "       FROM {ev} e WHERE e.checkpoint_id IS NOT NULL"
            "         AND e.status IN ('PENDING', 'COMPLETED', 'FAILED')) x"
            " WHERE x.status IN ('COMPLETED', 'FAILED') AND x.started IS NOT NULL GROUP BY x.phase"
        )

        return {d.phase: d for d in self._rows(query, PhaseDurations, "measure phase durations")}

    def recent_events(self, limit: int) -> list[EventRow]:
        return self._rows(self._q("SELECT event_id, partition_key, phase, status, run_id, at FROM {ev} e"
                                  " ORDER BY event_id DESC LIMIT %s"), EventRow, "read recent checkpoint events", (limit,))

    def last_event_id(self) -> int:
        """The id of the newest checkpoint event (0 when there is none)."""
        query = self._q("SELECT coalesce(max(event_id), 0) FROM {ev} e")
        return int(self._read(lambda c: c.execute(query).fetchone()[0], what="read the newest event id"))

    def last_event_ids(self, partition_keys: Sequence[str]) -> dict[str, int]:
        """partition key -> id of its newest checkpoint event (keys without events are left out)."""
        query = self._q("SELECT partition_key, max(event_id) FROM {ev} e WHERE partition_key = ANY(%s) GROUP BY partition_key")
        rows = self._read(lambda c: c.execute(query, (list(partition_keys),)).fetchall(),
                                what="read the newest event of partitions")
        return {r[0]: int(r[1]) for r in rows}

    def latest_events(self, partition_keys: Sequence[str], after_event_id: int) -> list[EventRow]:
        """Of each (partition, phase) of ``partition_keys``, its newest checkpoint event after
        ``after_event_id`` (what a backfill started then has done to it so far)."""
        query = self._q("SELECT DISTINCT ON (partition_key, phase) event_id, partition_key, phase, status, run_id, at"
                        " FROM {ev} e WHERE partition_key = ANY(%s) AND event_id > %s"
                        " ORDER BY partition_key, phase, event_id DESC")
        return self._rows(query, EventRow, "read the newest events of partitions", (list(partition_keys), after_event_id))

    def phase_seconds(self) -> dict[str, float]:
        """phase -> seconds during which one or more of its head checkpoints was in flight (claimed,
        not yet completed): the union of their claim-to-completion spans, not their sum. A range
        step claims a group of partitions together and commits them together, so their spans
        overlap, and summing them would count the step's time once per partition of the group."""
        # Each span in order of claim counts from where the earlier ones reached (NULL for the
        # first: greatest() passes over it) to its own end, if that lies further.
        query = self._q(
            "SELECT phase, sum(greatest(extract(epoch FROM e - greatest(s, reached)), 0))::float8 FROM"
            " (SELECT phase, created_at AS s, completed_at AS e, max(completed_at) OVER (PARTITION BY phase"
            "  ORDER BY created_at, completed_at ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached"
            "  FROM {cp} c WHERE superseded_at IS NULL AND status = 'COMPLETED') spans GROUP BY phase")
        rows = self._read(lambda c: c.execute(query).fetchall(), what="sum phase durations")
        return {r[0]: float(r[1] or 0.0) for r in rows}

    def phase_spans(self) -> list[PhaseSpan]:
        """Every COMPLETED head checkpoint's claim and commit times, in order of commit: when each
        partition's phases were done (the bench orders partitions by their last phase's)."""
        return self._rows(self._q("SELECT partition_key, phase, created_at, completed_at FROM {cp} c"
                                  " WHERE superseded_at IS NULL AND status = 'COMPLETED'"
                                  " ORDER BY completed_at, partition_key, phase"), PhaseSpan, "read the phases' spans")

    def other_connections(self) -> int:
        """Sessions connected to the ledger's database now, besides the one asking."""
        return int(self._read(
            lambda c: c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND pid <> pg_backend_pid()").fetchone()[0], what="count connections"))

    # ---- what waits for a person ------------------------------------------------------------
    def dead_letters(self, limit: int) -> list[Checkpoint]:
        """Head checkpoints FAILED ``limit`` times or more for the same inputs, oldest first."""
        return self._rows(self._q("SELECT * FROM {cp} c WHERE superseded_at IS NULL AND status = 'FAILED'"
                                  " AND failures >= %s ORDER BY day, region_id, phase"),
                          Checkpoint, "read the dead letters", (limit,))

    def held(self, keys: Sequence[str] | None = None) -> list[Checkpoint]:
        """Head checkpoints that hold their deliveries for review (a noisy batch), oldest day first;
        with ``keys``, of those partitions only (found held by :meth:`grid`)."""
        where = "" if keys is None else " AND partition_key = ANY(%s)"
        params: tuple[Any, ...] = () if keys is None else (list(keys),)
        return self._rows(self._q("SELECT * FROM {cp} c WHERE superseded_at IS NULL AND status = 'COMPLETED'"
                                  " AND summary ? 'held'" + where + " ORDER BY day, region_id, phase"),
                          Checkpoint, "read the held batches", params)

    # ---- receipts ----------------------------------------------------------------------------
    def receipt_counts(self) -> list[ReceiptCounts]:
        query = self._q(
            "SELECT target, kind,"
            " count(*) FILTER (WHERE status = 'DELIVERED') AS delivered,"
            " count(*) FILTER (WHERE status = 'PENDING') AS pending,"
            " count(*) FILTER (WHERE supersedes IS NOT NULL) AS revisions,"
            " coalesce(sum(attempts), 0) AS attempts,"
            " count(*) FILTER (WHERE last_error IS NOT NULL) AS with_error,"
            " max(delivered_at) AS last_delivered"
            " FROM {rc} r GROUP BY target, kind ORDER BY target, kind"
        )

        return self._rows(query, ReceiptCounts, "count receipts")

    def latest_receipts(self, limit: int) -> list[ReceiptRow]:
        return self._rows(self._q("SELECT artifact_id, idempotency_key, target, status, supersedes, attempts, last_error,"
                                  " created_at, delivered_at FROM {rc} r ORDER BY receipt_id DESC LIMIT %s"),
                          ReceiptRow, "read the latest receipts", (limit,))

    def last_delivery_at(self) -> dt.datetime | None:
        query = self._q("SELECT max(coalesce(delivered_at, created_at)) FROM {rc} r")
        return self._read(lambda c: c.execute(query).fetchone()[0], what="read the last delivery time")
