"""The PostgreSQL ledger: checkpoints, leases, recorded calls and delivery receipts.

The ledger is the source of truth for what is done. Each public method owns its transaction
and retries transient errors (connection loss, serialization failure) with backoff and jitter
a bounded number of times; the ``_..._txn(conn, ...)`` helpers join a caller's transaction and
never commit. Every statement is parametrized.

Lifecycle of a checkpoint row (one per (partition, phase, input hash) generation)::

    claim  ──►  PENDING (seq = fencing token) ──► complete ──► COMPLETED (immutable)
                   │  ▲                    └────► fail     ──► FAILED ──► claim again
                   └──┘ re-claimed after a crash: attempt + 1, new seq

A newer input hash for the same (partition, phase) supersedes the old row; the live row is
the "head". Completing or failing is fenced: the UPDATE matches only while the row still
carries the attempt's ``seq``, so a writer whose lease was taken over cannot commit.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from resources.errors import (
    AccessRefused,
    ConfigError,
    FencingError,
    LeaseTimeout,
    LedgerError,
    LedgerUnavailable,
    MigrationError,
)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_MIGRATION_LOCK = 7_406_001  # advisory lock id serialising migrations between processes
T = TypeVar("T")
#: (phase, partition_key, status, delivered artifact ids) -> None
OutcomeWatcher = Callable[[str, str, str, tuple[str, ...]], None]

_TRANSIENT = (
    psycopg.OperationalError,  # connection refused / lost, server shutting down
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    PoolTimeout,
)


def idempotency_key(partition_key: str, phase: str, input_hash: str) -> str:
    """An attempt's identity: lowercase hex sha256 of ``partition|phase|input hash`` in UTF-8.

    The table's CHECK (migration 002) computes the same in SQL and refuses any other value.
    """
    return hashlib.sha256(f"{partition_key}|{phase}|{input_hash}".encode()).hexdigest()


#: The role the pipeline works as (migration 007): not a superuser, not the tables' owner.
PIPELINE_ROLE = "resume_worker"
#: The roles a person may read the ledger as (``--role``), through ``ledger_read`` (migration 007), each read logged.
READ_AS_ROLES = ("ops_reader", "compliance_auditor", "admin", PIPELINE_ROLE)


def _session_options(dsn: str, role: str | None = None) -> str:
    """The DSN's own ``options``, asynchronous commit as the session default, custom plans and,
    with ``role``, the role every statement of the session runs as (``-c role=…``, as ``SET
    ROLE`` does).

    ``plan_cache_mode=force_custom_plan``: a session lives as long as its process (a daemon, a
    backfill of a year), and the plans it caches (its prepared statements, the partition state's
    refresh in the triggers' functions) would otherwise be generic plans made once, for the
    tables as they were then. PostgreSQL makes a cached plan anew only after an ANALYZE of its
    tables, so where autovacuum does not run (or has not yet), a plan made on an empty ledger
    keeps reading whole tables as they grow to a year's. A custom plan is made for each use, for
    the tables as they are."""
    own = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    as_role = f" -c role={role}" if role else ""
    return f"{own} -c synchronous_commit=off -c plan_cache_mode=force_custom_plan{as_role}".strip()


def _lock_key(*parts: str) -> int:
    digest = hashlib.sha256("|".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass(frozen=True)
class Checkpoint:
    id: int
    partition_key: str
    region_id: str
    day: str
    phase: str
    input_hash: str
    idempotency_key: str
    status: str
    state_hash: str | None
    schema_version: int
    code_version: str
    first_seq: int
    seq: int
    attempt: int
    tier: int
    tier_label: str
    summary: dict[str, Any]
    calls: list[Any]
    run_id: str | None
    error_class: str | None
    error_message: str | None
    created_at: Any
    updated_at: Any
    completed_at: Any
    superseded_at: Any
    failures: int = 0  # failed attempts that count toward the dead-letter limit (migration 005)


def receipt_key(artifact_id: str, generation: int) -> str:
    """A delivery's idempotency key: the artifact id, and its generation from the second on."""
    return artifact_id if generation == 1 else f"{artifact_id}#{generation}"


@dataclass(frozen=True)
class ReceiptRequest:
    """What a receipt is prepared for (:meth:`Ledger.prepare_receipts`): an artifact to a target."""

    artifact_id: str
    target: str
    partition_key: str
    region_id: str
    day: str
    kind: str
    content_hash: str
    size_bytes: int
    target_ref: str
    checkpoint_id: int | None


@dataclass(frozen=True)
class Receipt(ReceiptRequest):
    """A receipt row: what was prepared (:class:`ReceiptRequest`) and how its delivery stands."""

    generation: int
    idempotency_key: str
    receipt_id: int
    status: str
    supersedes: str | None
    attempts: int
    last_error: str | None
    response: Any
    created_at: Any
    delivered_at: Any


@dataclass(frozen=True)
class Event:
    event_id: int
    checkpoint_id: int | None
    partition_key: str
    region_id: str
    day: str
    phase: str
    status: str
    input_hash: str
    seq: int | None
    attempt: int | None
    tier: int | None
    run_id: str | None
    detail: dict[str, Any]
    at: Any
    txid: int = 0  # the writing transaction's id (0 before migration 010): (txid, event_id) is commit order

    @property
    def position(self) -> tuple[int, int]:
        """Where this event stands in the order readers read in: (txid, event_id)."""
        return (self.txid, self.event_id)


@dataclass(frozen=True)
class EventReader:
    """A reader of the checkpoint events (the outbox sensor) and how far it has read: every event
    at or before the position (after_txid, after_event_id) in commit order."""

    name: str
    after_event_id: int
    updated_at: Any
    after_txid: int = 0


@dataclass(frozen=True)
class PruneResult:
    """What :meth:`Ledger.prune` deleted, and which old events it kept and why."""

    checkpoints: int  # superseded checkpoints deleted
    events: int  # checkpoint events deleted
    receipts: int  # receipts deleted (a later revision of their slot was delivered)
    old_events_kept_current: int  # events past the cutoff kept: they belong to a head checkpoint
    old_events_kept_unread: int  # events past the cutoff kept: not read by every reader (or no reader known)
    readers: list[EventReader]  # the recorded readers, lowest position first

    @property
    def read_up_to(self) -> int | None:
        """The lowest recorded reader position; None when no reader recorded one."""
        return self.readers[0].after_event_id if self.readers else None


@dataclass
class Claim:
    """An attempt's hold on a checkpoint row: what ``complete``/``fail`` are fenced by."""

    checkpoint: Checkpoint
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)  # call_key -> output

    @property
    def id(self) -> int:
        return self.checkpoint.id

    @property
    def seq(self) -> int:
        return self.checkpoint.seq


@dataclass(frozen=True)
class CallRecord:
    """A completed outside call of an attempt, to record (:meth:`Ledger.record_calls`)."""

    claim: Claim
    call_key: str
    kind: str
    name: str
    input: dict[str, Any]
    output: dict[str, Any]


@dataclass(frozen=True)
class AccessRow:
    """One row of ``checkpoint_access_log``: a role's read (or attempt) of one phase."""

    access_id: int
    request_id: int
    at: dt.datetime
    role: str
    phase: str
    partition_key: str | None
    what: str
    allowed: bool
    named: bool
    login: str | None = None  # the login (session_user) that read
    client_addr: str | None = None  # its address (None over the Unix socket)
    backend_pid: int | None = None


@dataclass(frozen=True)
class Release:
    """What one ``stormlake release`` re-armed: dead-lettered phases, and the phase it unheld."""

    partition_key: str
    phases: list[str]
    held_phase: str | None


@dataclass(frozen=True)
class Decision:
    """What the ledger says about a phase before work: skip it, or claim it."""

    skip: bool
    head: Checkpoint | None
    claim: Claim | None = None


class _LeaseGroup:
    """The leases :meth:`Ledger.try_leases` took together on one session; each let go on its own."""

    def __init__(self, ledger: Ledger, conn: psycopg.Connection, held: int):
        self._ledger = ledger
        self._conn = conn
        self._held = held
        self._reusable = True
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lease(self, key: int, what: str) -> Iterator[None]:
        try:
            yield
        finally:
            self._let_go(key, what)

    def _let_go(self, key: int, what: str) -> None:
        released = False
        try:
            released = bool(self._conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()[0])
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"ledger connection lost while holding the lease for {what}") from exc
        finally:
            with self._lock:
                self._held -= 1
                self._reusable = self._reusable and released
                last, reusable = self._held == 0, self._reusable
            if last:
                self._ledger._lease_session_done(self._conn, reusable=reusable)  # noqa: SLF001


def _reason(exc: BaseException) -> str:
    """The driver's own reason for a failed connection or statement, on one short line (libpq's
    messages name the server, the database and the user, never a password)."""
    text = " ".join(str(exc).split())
    return (text[:240] + "…") if len(text) > 240 else (text or exc.__class__.__name__)


def _advice(exc: BaseException) -> str:
    """What to check: the DSN when the server answered that its database or user is wrong."""
    text = str(exc)
    if any(s in text for s in ("does not exist", "authentication failed", "no pg_hba.conf entry", "invalid port")):
        return "check STORMLAKE_PG_DSN (the server answered; its database or user is not right)"
    return "check that PostgreSQL is running, then run again"


class Ledger:
    """One connection pool per process and DSN; see :func:`get_ledger`.

    Durability: receipts, claims and failures commit synchronously (the WAL is flushed before
    the commit returns). Checkpoint completions, recorded calls and skip events commit with
    ``synchronous_commit = off``, which saves the WAL flush, the largest part of a commit. A client crash never loses a committed transaction either
    way; only a crash of the PostgreSQL server itself can lose the last fraction of a second of
    asynchronous commits, and then only together with everything committed after them (the WAL
    is one sequence, and the next synchronous commit — a receipt, the next claim — flushes all
    before it). A lost completion leaves the head PENDING, so the phase runs again: its Delta
    writes are recognised by their app transactions and its deliveries by their receipts, so
    nothing is written or delivered twice.
    """

    def __init__(self, dsn: str, *, max_size: int = 4, retries: int = 5, pool_timeout: float = 5.0,
                 role: str | None = PIPELINE_ROLE, audited: bool = False):
        """``role``: the database role every session takes on (the pipeline's by default; None
        keeps the DSN's user). ``audited``: reads through :mod:`resources.ledger_views` go through
        the logged ``ledger_read`` views (a person's reads: status, report, review)."""
        self.dsn = dsn
        self.role = role
        self.audited = audited
        self.retries = retries
        self._pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=pool_timeout,
            # No check on checkout (a round trip per use): a dropped connection fails its first
            # statement with OperationalError, which _run retries on a fresh connection.
            kwargs={"connect_timeout": 5, "autocommit": True, "options": _session_options(dsn, role)},
            name="stormlake-ledger",
        )
        self._opened = False
        self._open_lock = threading.Lock()
        # Sessions that held a lease and released it; a lease still dies with its process.
        self._lease_conns: list[psycopg.Connection] = []
        self._watchers: list[OutcomeWatcher] = []
        self._telling = threading.Lock()  # outcomes come from a range step's thread and its flusher

    # ---- one ledger per process and DSN -------------------------------------------------
    _shared: ClassVar[dict[tuple[int, str, str | None, bool], Ledger]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    _migrated: ClassVar[set[tuple[int, str]]] = set()

    @classmethod
    def shared(cls, dsn: str, *, role: str | None = PIPELINE_ROLE, audited: bool = False,
               owner_dsn: str | None = None) -> Ledger:
        """This process's ledger for ``dsn`` and ``role`` (one pool each per process).

        With ``owner_dsn`` (the login that owns the ledger's tables), pending migrations are
        applied as that login on first use; without it nothing runs DDL, and a ledger whose schema
        is behind is reported as such (:meth:`require_schema`)."""
        for what, value in (("the ledger DSN", dsn), ("the owner's DSN", owner_dsn)):
            try:
                if value is not None:
                    psycopg.conninfo.conninfo_to_dict(value)
            except psycopg.ProgrammingError:
                raise ConfigError(f"{what} is not a valid PostgreSQL connection string"
                                  " (its value is not shown: it may hold a secret)") from None
        key = (os.getpid(), dsn, role, audited)
        with cls._shared_lock:
            if owner_dsn is not None and (os.getpid(), owner_dsn) not in cls._migrated:
                owner = cls(owner_dsn, role=None)
                try:
                    owner.migrate()
                finally:
                    owner.close()
                cls._migrated.add((os.getpid(), owner_dsn))
            ledger = cls._shared.get(key)
            if ledger is None:
                ledger = cls(dsn, role=role, audited=audited)
                cls._shared[key] = ledger
            return ledger

    @classmethod
    def close_shared(cls, match: Callable[[str], bool] = lambda _dsn: True) -> None:
        """Close and forget this process's shared ledgers whose DSN ``match`` accepts (a database
        about to be dropped, say)."""
        with cls._shared_lock:
            for key in [k for k in cls._shared if match(k[1])]:
                cls._shared.pop(key).close()

    # ---- outcomes, as they happen in this process ----------------------------------------
    @contextlib.contextmanager
    def watching(self, watcher: OutcomeWatcher) -> Iterator[None]:
        """Tell ``watcher`` of every phase outcome this process records while the block runs
        (the CLI's progress display follows a multi-partition run this way)."""
        self._watchers.append(watcher)
        try:
            yield
        finally:
            self._watchers.remove(watcher)

    def tell_watchers(self, phase: str, partition_key: str, status: str, delivered: tuple[str, ...] = ()) -> None:
        """Called by the phase runner after each outcome: COMPLETED, SKIPPED or FAILED. The
        watchers hear one outcome at a time, though a range step tells some from its flusher
        thread (``assets.runner``)."""
        with self._telling:
            for watcher in list(self._watchers):
                watcher(phase, partition_key, status, delivered)

    # ---- plumbing ---------------------------------------------------------------------
    def _ensure_open(self) -> None:
        if not self._opened:
            with self._open_lock:
                if not self._opened:
                    self._pool.open(wait=False)
                    self._opened = True

    def close(self) -> None:
        with self._open_lock:
            conns, self._lease_conns = self._lease_conns, []
        for conn in conns:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        if self._opened:
            self._pool.close()
            self._opened = False

    def _run(self, fn: Callable[[psycopg.Connection], T], *, what: str, single: bool = False,
             durable: bool = True) -> T:
        """Run ``fn(conn)`` in one transaction, retrying transient errors with backoff.

        Sessions default to ``synchronous_commit = off``; a ``durable`` transaction turns it on
        for itself, so its COMMIT returns only once the WAL is flushed (see "Durability" in the
        class docs for which transactions need that). ``single=True`` means ``fn`` sends one
        statement, run on the autocommit connection as its own (non-durable) transaction.
        """
        self._ensure_open()
        delay = 0.1
        for attempt in range(1, self.retries + 1):
            try:
                with self._pool.connection() as conn:
                    if single:
                        return fn(conn)
                    with conn.transaction():
                        if durable:
                            conn.execute("SET LOCAL synchronous_commit TO on")
                        return fn(conn)
            except _TRANSIENT as exc:
                if attempt == self.retries:
                    raise LedgerUnavailable(
                        f"ledger unreachable while trying to {what} ({exc.__class__.__name__}"
                        f" after {attempt} tries: {_reason(exc)}); {_advice(exc)}"
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
            except psycopg.errors.IntegrityConstraintViolation as exc:
                raise LedgerError(f"ledger refused to {what}: {exc.diag.message_primary or exc}") from exc
            except psycopg.Error as exc:
                raise LedgerError(f"ledger error while trying to {what}: {exc.__class__.__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    # ---- migrations -------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply pending numbered migrations, each in one transaction with its version row.

        As the DSN's own user (the tables' owner), on a connection of its own: the sessions of the
        pool take on :attr:`role`, which may not exist before migration 007 made it.
        """
        files = sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql"))

        def apply(conn: psycopg.Connection) -> list[int]:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            if conn.execute("SELECT to_regclass('public.schema_migrations')").fetchone()[0] is None:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            applied: list[int] = []
            for path in files:
                version = int(path.name[:3])
                if version in done:
                    continue
                try:
                    with conn.transaction():
                        conn.execute(path.read_text(encoding="utf-8"))  # type: ignore[arg-type]
                        conn.execute(
                            "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                            (version, path.name),
                        )
                except psycopg.Error as exc:
                    if isinstance(exc, _TRANSIENT):
                        raise
                    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
                        hint = exc.diag.message_hint or ("run `stormlake db migrate` with the login that owns"
                                                         " the ledger's tables (STORMLAKE_OWNER_DSN)")
                        raise ConfigError(f"migration {path.name}: {exc.diag.message_primary}; {hint}") from exc
                    raise MigrationError(f"migration {path.name} failed: {exc}") from exc
                applied.append(version)
            return applied

        return self._as_owner(apply, what="apply migrations")

    def _as_owner(self, fn: Callable[[psycopg.Connection], T], *, what: str) -> T:
        """Run ``fn(conn)`` in one transaction as the DSN's own user (no role taken on), on a
        connection of its own: migrations and the changes of the access policy."""
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10,
                                 options=_session_options(self.dsn)) as conn, conn.transaction():
                return fn(conn)
        except _TRANSIENT as exc:
            raise LedgerUnavailable(
                f"ledger unreachable while trying to {what} ({exc.__class__.__name__}: {_reason(exc)});"
                f" {_advice(exc)}") from exc
        except psycopg.Error as exc:
            raise LedgerError(f"ledger error while trying to {what}: {exc.__class__.__name__}: {exc}") from exc

    def schema_version(self) -> int:
        return self._run(
            lambda c: c.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0],
            what="read the schema version",
        )

    def schema_version_as_owner(self) -> int:
        """The schema version, read as the DSN's own login (no role taken on)."""
        return int(self._as_owner(
            lambda c: c.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0],
            what="read the schema version"))

    def require_schema(self) -> None:
        """Raise :class:`ConfigError` unless every migration has been applied (a command that
        runs no DDL says who must run it)."""
        error = schema_behind(self._run(_schema_version_txn, what="read the schema version", single=True))
        if error is not None:
            raise error

    def read(self, fn: Callable[[psycopg.Connection], T], *, what: str) -> T:
        """Run the read-only ``fn(conn)`` on a pooled connection, retrying transient errors.

        The typed reads of :mod:`resources.ledger_views` go through here.
        """
        return self._run(fn, what=what, single=True)

    def read_in_transaction(self, fn: Callable[[psycopg.Connection], T], *, what: str) -> T:
        """Run the read-only ``fn(conn)`` in one transaction (no durable commit), retrying transient errors."""
        return self._run(fn, what=what, durable=False)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection of one's own for a while (a streaming read); no retries."""
        self._ensure_open()
        try:
            with self._pool.connection() as conn:
                yield conn
        except _TRANSIENT as exc:
            raise LedgerUnavailable(
                f"ledger unreachable while reading ({exc.__class__.__name__}); check that PostgreSQL is running,"
                " then run again") from exc

    # ---- checkpoints ------------------------------------------------------------------
    @staticmethod
    def _head_txn(conn: psycopg.Connection, partition_key: str, phase: str, *, lock: bool) -> Checkpoint | None:
        q = "SELECT * FROM checkpoints WHERE partition_key = %s AND phase = %s AND superseded_at IS NULL"
        if lock:
            q += " FOR UPDATE"
        with conn.cursor(row_factory=class_row(Checkpoint)) as cur:
            return cur.execute(q, (partition_key, phase)).fetchone()

    @staticmethod
    def _live_txn(conn: psycopg.Connection, key: str) -> Checkpoint | None:
        """The live checkpoint with this idempotency key (served by the unique index on live keys)."""
        with conn.cursor(row_factory=class_row(Checkpoint)) as cur:
            return cur.execute(
                "SELECT * FROM checkpoints WHERE idempotency_key = %s AND superseded_at IS NULL", (key,)
            ).fetchone()

    def head(self, partition_key: str, phase: str) -> Checkpoint | None:
        return self._run(lambda c: self._head_txn(c, partition_key, phase, lock=False), what="read a checkpoint", single=True)

    def heads(self, partition_keys: list[str] | None = None) -> list[Checkpoint]:
        def q(conn: psycopg.Connection) -> list[Checkpoint]:
            with conn.cursor(row_factory=class_row(Checkpoint)) as cur:
                if partition_keys is None:
                    return cur.execute(
                        "SELECT * FROM checkpoints WHERE superseded_at IS NULL ORDER BY day, region_id, phase"
                    ).fetchall()
                return cur.execute(
                    "SELECT * FROM checkpoints WHERE superseded_at IS NULL AND partition_key = ANY(%s)"
                    " ORDER BY day, region_id, phase",
                    (partition_keys,),
                ).fetchall()

        return self._run(q, what="read checkpoints", single=True)

    @classmethod
    def _event_txn(cls, conn: psycopg.Connection, cp: Checkpoint, status: str, run_id: str | None,
                   detail: dict[str, Any] | None = None) -> None:
        """One checkpoint event (:meth:`_events_txn` of one)."""
        cls._events_txn(conn, [(cp, status, detail)], run_id)

    # The head of a (partition, phase) is found by the attempt's identity, its idempotency key
    # (partition, phase, input hash), which names at most one live checkpoint (a unique index).
    # It is current, and the phase skips, when it is COMPLETED at the phase's schema version.

    def look(self, *, partition_key: str, region_id: str, day: str, phase: str, input_hash: str,
             schema_version: int, code_version: str, run_id: str | None) -> Decision:
        """Whether the phase would skip: a cheap look before taking the lease (no lock, no write).

        One index lookup by key, and the (partition, phase) head only when no live row has the key.
        """
        key = idempotency_key(partition_key, phase, input_hash)

        def txn(conn: psycopg.Connection) -> Decision:
            own = self._live_txn(conn, key)
            if own is not None and own.status == "COMPLETED" and own.schema_version == schema_version:
                return Decision(skip=True, head=own)
            return Decision(skip=False, head=own or self._head_txn(conn, partition_key, phase, lock=False))

        return self._run(txn, what=f"look at {phase} of {partition_key}", single=True)

    @staticmethod
    def look_at(head: Checkpoint | None, *, partition_key: str, phase: str, input_hash: str,
                schema_version: int) -> Decision:
        """:meth:`look`'s answer from the (partition, phase) head read already (``None``: none).

        The live checkpoint with the attempt's idempotency key, if there is one, is that head
        (a key names one partition and phase, which have one live checkpoint).
        """
        key = idempotency_key(partition_key, phase, input_hash)
        own = head if head is not None and head.idempotency_key == key else None
        if own is not None and own.status == "COMPLETED" and own.schema_version == schema_version:
            return Decision(skip=True, head=own)
        return Decision(skip=False, head=head)

    def claim(self, *, partition_key: str, region_id: str, day: str, phase: str, input_hash: str,
              schema_version: int, code_version: str, run_id: str | None) -> Decision:
        """Under the lease: record a skip when the phase is current, else claim the attempt (a new
        fencing token in ``Decision.claim``).

        The (partition, phase) head is locked, since it is the row a new input hash supersedes,
        and it is this attempt's own when it carries the key. A skip is recorded as a SKIPPED
        event; the COMPLETED checkpoint itself is untouched. An earlier attempt of the same work
        (failed or dead) is taken over with a new token; other work supersedes the head.
        """
        return self.claim_all([dict(partition_key=partition_key, region_id=region_id, day=day, phase=phase,
                                    input_hash=input_hash, schema_version=schema_version,
                                    code_version=code_version, run_id=run_id)])[0]

    def claim_all(self, requests: list[dict[str, Any]]) -> list[Decision]:
        """:meth:`claim` for one or several (partition, phase) pairs in one transaction, each under
        its lease (held by the caller); each one's decision, in their order. ``requests``: the
        keyword arguments :meth:`claim` takes, one dict each.

        Each pair is decided as :meth:`claim` describes, on its head locked; the heads
        that new work supersedes are marked in one statement, the new attempts inserted in one
        (a new ``checkpoint_seq`` number each), and the events written in one, so the partition
        states are refreshed once for all and the transaction commits (durably) once.
        """
        keys = [idempotency_key(r["partition_key"], r["phase"], r["input_hash"]) for r in requests]

        def txn(conn: psycopg.Connection) -> list[Decision]:
            with conn.cursor(row_factory=class_row(Checkpoint)) as cur:
                locked = cur.execute(
                    "SELECT c.* FROM checkpoints c JOIN unnest(%s::text[], %s::text[]) AS k(partition_key, phase)"
                    " USING (partition_key, phase) WHERE c.superseded_at IS NULL"
                    " ORDER BY c.partition_key, c.phase FOR UPDATE OF c",
                    ([r["partition_key"] for r in requests], [r["phase"] for r in requests]),
                ).fetchall()
            heads = {(cp.partition_key, cp.phase): cp for cp in locked}
            decisions: list[Decision | None] = [None] * len(requests)
            events: list[tuple[Checkpoint, str, dict[str, Any] | None]] = []
            fresh: list[tuple[int, Checkpoint | None]] = []  # requests that start new work, and the head they supersede
            for i, (r, key) in enumerate(zip(requests, keys, strict=True)):
                head = heads.get((r["partition_key"], r["phase"]))
                own = head if head is not None and head.idempotency_key == key else None
                if own is not None and own.status == "COMPLETED" and own.schema_version == r["schema_version"]:
                    events.append((own, "SKIPPED", None))
                    decisions[i] = Decision(skip=True, head=own)
                elif own is not None and own.schema_version == r["schema_version"]:
                    cp = self._take_over_txn(conn, own, r["run_id"])
                    events.append((cp, "PENDING", {"superseded": None}))
                    decisions[i] = Decision(skip=False, head=cp, claim=Claim(cp, self._recorded_txn(conn, cp)))
                else:
                    fresh.append((i, head))
            superseded = [head.id for _, head in fresh if head is not None]
            if superseded:
                conn.execute("UPDATE checkpoints SET superseded_at = now() WHERE id = ANY(%s)", (superseded,))
            if fresh:
                rows = [{"partition": requests[i]["partition_key"], "region": requests[i]["region_id"],
                         "day": requests[i]["day"], "phase": requests[i]["phase"],
                         "input_hash": requests[i]["input_hash"], "key": keys[i],
                         "schema": requests[i]["schema_version"], "code": requests[i]["code_version"],
                         "run": requests[i]["run_id"]} for i, _ in fresh]
                with conn.cursor(row_factory=class_row(Checkpoint)) as cur:
                    made = cur.execute(
                        "WITH v AS (SELECT x.*, nextval('checkpoint_seq') AS s FROM jsonb_to_recordset(%s)"
                        "  AS x(partition text, region text, day text, phase text, input_hash text, key text,"
                        "  schema integer, code text, run text))"
                        " INSERT INTO checkpoints (partition_key, region_id, day, phase, input_hash,"
                        " idempotency_key, status, schema_version, code_version, first_seq, seq, run_id)"
                        " SELECT partition, region, day, phase, input_hash, key, 'PENDING', schema, code, s, s, run"
                        " FROM v RETURNING *",
                        (Jsonb(rows),),
                    ).fetchall()
                by_key = {cp.idempotency_key: cp for cp in made}
                for i, head in fresh:
                    cp = by_key[keys[i]]
                    events.append((cp, "PENDING", {"superseded": head.id if head is not None else None}))
                    decisions[i] = Decision(skip=False, head=cp, claim=Claim(cp, {}))
            self._events_txn(conn, events, requests[0]["run_id"])
            return [d for d in decisions if d is not None]

        first = requests[0]
        return self._run(txn, what=f"claim {first['phase']} of {first['partition_key']}" if len(requests) == 1
                         else f"claim {len(requests)} {first['phase']} attempts")

    @staticmethod
    def _events_txn(conn: psycopg.Connection, events: list[tuple[Checkpoint, str, dict[str, Any] | None]],
                    run_id: str | None) -> None:
        """Checkpoint events, in their order, in one statement: one round trip (no NOTIFY: any login could LISTEN)."""
        if not events:
            return
        rows = [{"id": cp.id, "partition": cp.partition_key, "region": cp.region_id, "day": cp.day, "phase": cp.phase,
                 "status": status, "input_hash": cp.input_hash, "seq": cp.seq, "attempt": cp.attempt, "tier": cp.tier,
                 "detail": detail or {}, "n": n} for n, (cp, status, detail) in enumerate(events)]
        conn.execute(
            "INSERT INTO checkpoint_events (checkpoint_id, partition_key, region_id, day, phase, status,"
            " input_hash, seq, attempt, tier, run_id, detail)"
            " SELECT x.id, x.partition, x.region, x.day, x.phase, x.status, x.input_hash, x.seq, x.attempt, x.tier,"
            " %(run)s, x.detail FROM jsonb_to_recordset(%(rows)s) AS x(id bigint, partition text,"
            " region text, day text, phase text, status text, input_hash text, seq bigint, attempt integer,"
            " tier integer, detail jsonb, n bigint) ORDER BY x.n",
            {"rows": Jsonb(rows), "run": run_id},
        )

    @staticmethod
    def _take_over_txn(conn: psycopg.Connection, own: Checkpoint, run_id: str | None) -> Checkpoint:
        """The same work, whose earlier attempt failed or died: PENDING again under a new token."""
        with conn.cursor(row_factory=class_row(Checkpoint)) as cur:
            cp = cur.execute(
                "UPDATE checkpoints SET status = 'PENDING', seq = nextval('checkpoint_seq'), attempt = attempt + 1,"
                " run_id = %(run)s, error_class = NULL, error_message = NULL, updated_at = now()"
                " WHERE id = %(id)s RETURNING *",
                {"run": run_id, "id": own.id},
            ).fetchone()
        assert cp is not None
        return cp

    @staticmethod
    def _recorded_txn(conn: psycopg.Connection, cp: Checkpoint) -> dict[str, Any]:
        """The outside calls earlier attempts of this checkpoint recorded, by call key."""
        rows = conn.execute("SELECT call_key, output FROM recorded_calls WHERE checkpoint_id = %(id)s", {"id": cp.id})
        return {r[0]: r[1] for r in rows}

    def record_skip(self, head: Checkpoint, run_id: str | None) -> None:
        """Record that a run found this COMPLETED checkpoint current and did no work."""
        self._run(lambda c: self._event_txn(c, head, "SKIPPED", run_id), what="record a skip", durable=False)

    def record_call(self, claim: Claim, *, call_key: str, kind: str, name: str,
                    input: dict[str, Any], output: dict[str, Any]) -> None:
        """Record a completed outside call of this attempt (fenced by the attempt's seq):
        :meth:`record_calls` of one; :class:`FencingError` if the attempt lost its lease."""
        (fenced,) = self.record_calls([CallRecord(claim, call_key, kind, name, input, output)])
        if fenced is not None:
            raise fenced

    _RECORD_CALLS_SQL = (
        "INSERT INTO recorded_calls (checkpoint_id, call_key, kind, name, input, output, seq)"
        " SELECT c.id, v.key, v.kind, v.name, v.input, v.output, c.seq"
        " FROM jsonb_to_recordset(%(items)s)"
        "  AS v(id bigint, seq bigint, key text, kind text, name text, input jsonb, output jsonb, n integer)"
        " JOIN checkpoints c ON c.id = v.id AND c.seq = v.seq AND c.status = 'PENDING'"
        " ORDER BY v.n"
        " ON CONFLICT (checkpoint_id, call_key)"
        " DO UPDATE SET output = EXCLUDED.output, seq = EXCLUDED.seq, recorded_at = now()"
        " RETURNING checkpoint_id, call_key, seq"
    )

    def record_calls(self, calls: list[CallRecord]) -> list[FencingError | None]:
        """Record completed outside calls of one or more attempts in one statement, each fenced
        by its own attempt's seq: for each call, None once recorded (and kept in its claim's
        ``recorded``) or the :class:`FencingError` of an attempt that lost its lease (the others
        are recorded all the same). A range step records the writes of the partitions it wrote
        together this way: one round trip for all of them.

        Like a checkpoint completion, a lost record is re-derived (the Delta app transaction,
        the receipt), so it is not made durable on its own.
        """
        if not calls:
            return []
        first = calls[0]
        return self._record(calls, "", {}, what=f"record the call {first.kind} {first.name}" if len(calls) == 1
                            else f"record {len(calls)} calls")

    def _record(self, calls: list[CallRecord], with_sql: str, params: dict[str, Any], *,
                what: str) -> list[FencingError | None]:
        """:meth:`record_calls` as one statement, after ``with_sql`` (the statement's other
        common table expressions, each ending in a comma, with their ``params``)."""
        # One row per attempt and key (the same call recorded twice in one batch: its last output,
        # as two statements would leave it); PostgreSQL updates a row only once per statement.
        last = {(c.claim.id, c.claim.seq, c.call_key): n for n, c in enumerate(calls)}
        payload = [{"id": c.claim.id, "seq": c.claim.seq, "key": c.call_key, "kind": c.kind, "name": c.name,
                    "input": c.input, "output": c.output, "n": n}
                   for n, c in enumerate(calls) if last[(c.claim.id, c.claim.seq, c.call_key)] == n]
        sql = (f"WITH {with_sql.rstrip().rstrip(',')} " if with_sql else "") + self._RECORD_CALLS_SQL

        def stmt(conn: psycopg.Connection) -> set[tuple[int, int, str]]:
            rows = conn.execute(sql, {**params, "items": Jsonb(payload)}).fetchall()  # type: ignore[arg-type]
            return {(int(r[0]), int(r[2]), r[1]) for r in rows}

        done = self._run(stmt, single=True, what=what)
        out: list[FencingError | None] = []
        for c in calls:
            if (c.claim.id, c.claim.seq, c.call_key) in done:
                c.claim.recorded[c.call_key] = c.output
                out.append(None)
            else:
                out.append(FencingError(f"attempt seq {c.claim.seq} of checkpoint {c.claim.id} lost its lease;"
                                        f" not recording {c.kind} {c.name}"))
        return out

    def complete(self, claim: Claim, *, state_hash: str, summary: dict[str, Any], tier: int,
                 tier_label: str, run_id: str | None) -> Checkpoint:
        """Commit the checkpoint COMPLETED in one transaction, with its event
        (:meth:`complete_all` of one); :class:`FencingError` if the attempt lost its lease.

        The fenced UPDATE and the COMPLETED event are one data-modifying statement,
        sent alone on the autocommit session: one round trip. It commits without waiting for the
        WAL flush: see "Durability" in the class docs for why that is safe here and not for
        receipts.
        """
        (done,) = self.complete_all([(claim, state_hash, summary, tier, tier_label)], run_id)
        if isinstance(done, FencingError):
            raise done
        return done

    _COMPLETE_ALL_SQL = (
        "WITH v AS ("
        " SELECT * FROM jsonb_to_recordset(%(items)s)"
        "  AS x(id bigint, seq bigint, state text, summary jsonb, tier integer, label text)"
        "), upd AS ("
        " UPDATE checkpoints c SET status = 'COMPLETED', state_hash = v.state, summary = v.summary,"
        "  tier = v.tier, tier_label = v.label, run_id = %(run)s, completed_at = now(), updated_at = now(),"
        "  calls = coalesce((SELECT jsonb_agg(jsonb_build_object('key', r.call_key, 'kind', r.kind, 'name', r.name,"
        "   'input', r.input, 'output', r.output, 'seq', r.seq) ORDER BY r.recorded_at, r.call_key)"
        "   FROM recorded_calls r WHERE r.checkpoint_id = c.id), '[]'::jsonb)"
        " FROM v WHERE c.id = v.id AND c.seq = v.seq AND c.status = 'PENDING' AND c.superseded_at IS NULL"
        " RETURNING c.*"
        "), ev AS ("
        " INSERT INTO checkpoint_events (checkpoint_id, partition_key, region_id, day, phase, status,"
        "  input_hash, seq, attempt, tier, run_id, detail)"
        " SELECT id, partition_key, region_id, day, phase, 'COMPLETED', input_hash, seq, attempt, tier, run_id,"
        "  jsonb_build_object('state_hash', state_hash) FROM upd ORDER BY id RETURNING checkpoint_id, partition_key, phase"
        ") SELECT upd.* FROM upd JOIN ev ON ev.checkpoint_id = upd.id"
    )

    def complete_all(self, items: list[tuple[Claim, str, dict[str, Any], int, str]],
                     run_id: str | None) -> list[Checkpoint | FencingError]:
        """Commit several checkpoints COMPLETED in one statement: ``(claim, state_hash, summary,
        tier, tier_label)`` each; each one's COMPLETED checkpoint, or the :class:`FencingError` of
        an attempt that lost its lease (the others commit all the same), in their order.

        Each UPDATE is fenced by its attempt's seq, and the statement is one transaction, so the
        partition states are refreshed once for all of them: a range step's partitions written
        together commit together.
        """
        payload = [{"id": claim.id, "seq": claim.seq, "state": state, "summary": summary, "tier": tier, "label": label}
                   for claim, state, summary, tier, label in items]

        def stmt(conn: psycopg.Connection) -> dict[int, Checkpoint]:
            with conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(self._COMPLETE_ALL_SQL,  # type: ignore[arg-type]
                                   {"items": Jsonb(payload), "run": run_id}).fetchall()
            done: dict[int, Checkpoint] = {}
            for row in rows:
                done[row["id"]] = Checkpoint(**row)
            return done

        phase = items[0][0].checkpoint.phase
        done = self._run(stmt, single=True, what=f"commit the {phase} checkpoint" if len(items) == 1
                         else f"commit {len(items)} {phase} checkpoints")
        out: list[Checkpoint | FencingError] = []
        for claim, *_rest in items:
            cp = done.get(claim.id)
            if cp is None:
                # A retry after a lost reply finds its own commit already done: that is success.
                head = self.head(claim.checkpoint.partition_key, claim.checkpoint.phase)
                if head is not None and head.id == claim.id and head.seq == claim.seq and head.status == "COMPLETED":
                    cp = head
            out.append(cp if cp is not None else FencingError(
                f"{claim.checkpoint.phase} of {claim.checkpoint.partition_key}: attempt seq {claim.seq}"
                " lost its lease to a newer attempt; its result is not committed"))
        return out

    def fail(self, claim: Claim, *, error_class: str, error_message: str, run_id: str | None,
             counts: bool = True) -> bool:
        """Record FAILED with the error; returns False when the attempt was already fenced off.

        ``counts``: the failure counts toward the dead-letter limit (not for a transient error).
        """

        def txn(conn: psycopg.Connection) -> bool:
            with conn.cursor(row_factory=class_row(Checkpoint)) as cur:
                cp = cur.execute(
                    "UPDATE checkpoints SET status = 'FAILED', error_class = %(cls)s, error_message = %(msg)s,"
                    " run_id = %(run)s, updated_at = now(), failures = failures + %(counts)s"
                    " WHERE id = %(id)s AND seq = %(seq)s AND status = 'PENDING' RETURNING *",
                    {"cls": error_class, "msg": error_message[:4000], "run": run_id, "counts": int(counts),
                     "id": claim.id, "seq": claim.seq},
                ).fetchone()
            if cp is None:
                return False
            self._event_txn(conn, cp, "FAILED", run_id, {"error_class": error_class})
            return True

        return self._run(txn, what=f"record the failure of {claim.checkpoint.phase}")

    # ---- a person's reads (migration 007) ---------------------------------------------
    def open_read(self, what: str, phases: list[str] | None = None, partition_key: str | None = None) -> int:
        """Log a read of ``what`` (one access-log row per phase, allowed or denied) and return its
        request id, committed (durably) before any row is read through ``ledger_read``."""
        return int(self._run(
            lambda conn: conn.execute("SELECT ledger_read.open(%s, %s, %s)", (what, phases, partition_key)).fetchone()[0],
            what=f"log a read of {what}"))

    def access_log(self, *, role: str | None = None, since: dt.datetime | None = None,
                   limit: int = 200) -> tuple[int, list[AccessRow]]:
        """How many reads match (by role used or by login), and the newest ``limit`` of them.

        Through ``ledger_access_log`` (migration 009): the login must be a member of
        compliance_auditor or admin."""

        def q(conn: psycopg.Connection) -> tuple[int, list[AccessRow]]:
            total = conn.execute("SELECT ledger_access_log_count(%s, %s)", (role, since)).fetchone()[0]
            with conn.cursor(row_factory=class_row(AccessRow)) as cur:
                rows = cur.execute(
                    "SELECT access_id, request_id, at, role, phase, partition_key, what, allowed, named, login,"
                    " host(client_addr) AS client_addr, backend_pid FROM ledger_access_log(%s, %s, %s)",
                    (role, since, limit)).fetchall()
            return int(total), rows

        return self._as_login(q, what="read the access log")

    def access_policy(self) -> dict[str, list[str]]:
        """phase -> the roles that may read it, in phase order."""
        return self._as_login(lambda conn: {r[0]: list(r[1]) for r in conn.execute(
            "SELECT phase, roles FROM ledger_access_policy()").fetchall()}, what="read the access policy")

    def change_access(self, action: str, role: str, phase: str, *, reason: str) -> bool:
        """Grant (``action="grant"``) or revoke a role's reading of a phase, as one operator action
        recorded with the login that made it and why; returns whether the policy changed.

        Through ``ledger_change_access`` (migration 009), which refuses a login that is not a
        member of admin."""
        if action not in ("grant", "revoke"):
            raise ValueError(action)
        return bool(self._as_login(
            lambda conn: conn.execute("SELECT ledger_change_access(%s, %s, %s, %s)",
                                      (action, role, phase, reason)).fetchone()[0],
            what=f"{action} {role} on {phase}"))

    def retain(self, *, older_than_days: int, reason: str) -> tuple[int, int]:
        """Remove access-log rows and operator actions older than the window, through
        ``ledger_retain`` (admin only; it records its own use). Returns (log rows, actions) removed."""
        row = self._as_login(lambda conn: conn.execute("SELECT access_rows, actions FROM ledger_retain(%s, %s)",
                                                       (dt.timedelta(days=older_than_days), reason)).fetchone(),
                             what="apply the access log's retention")
        return int(row[0]), int(row[1])

    def _as_login(self, fn: Callable[[psycopg.Connection], T], *, what: str) -> T:
        """:meth:`_as_owner` for a person's action: a refusal of the database (not a member of
        admin, no such role or phase, a reason missing) is one line naming the refusal."""
        try:
            return self._as_owner(fn, what=what)
        except LedgerError as exc:
            cause = exc.__cause__
            if isinstance(cause, psycopg.errors.InsufficientPrivilege | psycopg.errors.UndefinedObject
                          | psycopg.errors.InvalidParameterValue | psycopg.errors.UndefinedFunction):
                if isinstance(cause, psycopg.errors.UndefinedFunction):
                    raise ConfigError(f"could not {what}: the ledger's schema is older than this stormlake; run"
                                      " `stormlake db migrate` as the ledger's owner") from cause
                raise AccessRefused(f"could not {what}: {cause.diag.message_primary}") from cause
            raise

    # ---- dead letters and operator actions ----------------------------------------------
    def release(self, partition_key: str, *, actor: str, reason: str) -> Release:
        """Release what of a partition waits for a person, as one operator action recorded with
        who and why: its dead-lettered phases (their failure count back to 0) and its held head
        (the next run of that phase delivers, :meth:`release_of`)."""

        def txn(conn: psycopg.Connection) -> Release:
            phases = sorted(r[0] for r in conn.execute(
                "UPDATE checkpoints SET failures = 0, updated_at = now() WHERE partition_key = %(key)s"
                " AND superseded_at IS NULL AND status = 'FAILED' AND failures > 0 RETURNING phase",
                {"key": partition_key}))
            # The held head, by its natural input hash (a head held by a forced re-run has its own).
            held = conn.execute(
                "SELECT phase, coalesce(summary->>'natural_input_hash', input_hash), summary->'held' FROM checkpoints"
                " WHERE partition_key = %(key)s AND superseded_at IS NULL AND status = 'COMPLETED' AND summary ? 'held'",
                {"key": partition_key}).fetchone()
            detail: dict[str, Any] = {"phases": phases}
            if held is not None:
                detail["held"] = {"phase": held[0], "input_hash": held[1], **(held[2] or {})}
            self.record_action_txn(conn, "release", partition_key, actor=actor, reason=reason, detail=detail,
                                   phase=held[0] if held is not None else None)
            return Release(partition_key, phases, held[0] if held is not None else None)

        return self._run(txn, what=f"release {partition_key}")

    def release_of(self, partition_key: str, phase: str, input_hash: str) -> dict[str, Any] | None:
        """The latest release of a ``phase`` head held on the natural ``input_hash`` that no
        COMPLETED checkpoint has carried out yet: action id, who, why, when. (A release is used
        once: a batch held again on the same inputs later waits for a release of its own.)"""

        def q(conn: psycopg.Connection) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT a.action_id, a.actor, a.reason, a.at FROM operator_actions a WHERE a.partition_key = %(key)s"
                " AND a.action = 'release' AND a.phase = %(phase)s AND a.detail->'held'->>'input_hash' = %(ih)s"
                " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.partition_key = a.partition_key"
                "   AND c.phase = a.phase AND c.status = 'COMPLETED'"
                "   AND c.summary->'released'->>'action_id' = a.action_id::text)"
                " ORDER BY a.action_id DESC LIMIT 1", {"key": partition_key, "phase": phase, "ih": input_hash},
            ).fetchone()
            if row is None:
                return None
            return {"action_id": int(row[0]), "by": row[1], "reason": row[2], "at": row[3].isoformat()}

        return self._run(q, what=f"read the releases of {partition_key}", single=True)

    def record_action(self, action: str, partition_key: str, *, actor: str, reason: str, phase: str | None = None,
                      detail: dict[str, Any] | None = None) -> None:
        """Record an operator action (who, when, why) in ``operator_actions``."""
        self._run(lambda conn: self.record_action_txn(conn, action, partition_key, actor=actor, reason=reason,
                                                      phase=phase, detail=detail),
                  what=f"record the {action} of {partition_key}")

    @staticmethod
    def record_action_txn(conn: psycopg.Connection, action: str, partition_key: str, *, actor: str, reason: str,
                          phase: str | None = None, detail: dict[str, Any] | None = None) -> None:
        conn.execute(
            "INSERT INTO operator_actions (action, partition_key, phase, actor, reason, detail)"
            " VALUES (%(action)s, %(key)s, %(phase)s, %(actor)s, %(reason)s, %(detail)s)",
            {"action": action, "key": partition_key, "phase": phase, "actor": actor, "reason": reason,
             "detail": Jsonb(detail or {})})

    # ---- leases -----------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self, partition_key: str, phase: str, *, timeout_s: float = 600.0,
              on_wait: Callable[[float], None] | None = None) -> Iterator[None]:
        """Hold the (partition, phase) lease: a session advisory lock on a dedicated connection.

        The lock dies with the connection, so a process killed while holding it releases it
        without an operator. Waiting polls, so a caller can show that it is waiting (``on_wait``,
        called at each poll; its own time does not count toward ``timeout_s``). ``timeout_s=0``
        asks once: :class:`LeaseTimeout` at once if another session holds it.
        """
        key = _lock_key("stormlake-lease", partition_key, phase)
        conn, rows = self._lease_first(f"the lease for {phase} of {partition_key}",
                                       "SELECT pg_try_advisory_lock(%s)", (key,))
        granted = bool(rows[0][0])
        reusable = False
        try:
            start = time.monotonic()
            delay = 0.05
            while not granted:
                waited = time.monotonic() - start
                if waited >= timeout_s:
                    reusable = True  # it holds no lock: the session serves the next lease
                    raise LeaseTimeout(f"lease for {phase} of {partition_key} not granted within {timeout_s:.0f} s")
                if on_wait:
                    began = time.monotonic()
                    on_wait(waited)
                    start += time.monotonic() - began  # what the caller did meanwhile is not waiting
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 1.5, 1.0)
                granted = bool(conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0])
            yield
            # Released explicitly so the session can serve the next lease of this process.
            reusable = bool(conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()[0])
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"ledger connection lost while holding the lease for {phase} of {partition_key}") from exc
        finally:
            self._lease_session_done(conn, reusable=reusable)

    def try_leases(self, items: Sequence[tuple[str, str]]) -> list[contextlib.AbstractContextManager[None] | None]:
        """Take each of the (partition key, phase) leases of ``items`` that is free, all at once
        on one session: a context per lease taken (its exit lets that lease go), None for one
        another session holds. Never waits.

        A range step claims the partitions it computes next together (``assets.runner``): one
        round trip and one ledger connection for the group, where :meth:`lease` takes one of
        each a partition. The session serves this process's next leases once every lease of
        the group is let go; closing it (a lost connection, a killed process) lets all of them
        go at once, as it does a lease of its own.
        """
        if not items:
            return []
        keys = [_lock_key("stormlake-lease", key, phase) for key, phase in items]
        what = f"the leases of {len(items)} partitions for {items[0][1]}"
        conn, rows = self._lease_first(
            what, "SELECT pg_try_advisory_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(k, n) ORDER BY n",
            (keys,))
        granted = [bool(r[0]) for r in rows]
        if not any(granted):
            self._lease_session_done(conn, reusable=True)
            return [None] * len(items)
        group = _LeaseGroup(self, conn, sum(granted))
        return [group.lease(key, name) if ok else None
                for key, name, ok in zip(keys, (f"{phase} of {pk}" for pk, phase in items), granted, strict=True)]

    def _lease_first(self, what: str, statement: str, params: tuple[Any, ...]
                     ) -> tuple[psycopg.Connection, list[tuple[Any, ...]]]:
        """A lease session and the rows of its first statement (taking leases).

        A session this process kept may have been dropped by the server since it was let go (a
        restart, an idle-session timeout): it then holds no lock, and it is closed with every
        other kept session (they went the same way) and the statement runs once more on a new
        one. Any other failure closes the session, letting go whatever it took:
        :class:`LedgerUnavailable` for a database error, an interrupt raised as it is.
        """
        conn, kept = self._lease_session(what)
        while True:
            try:
                return conn, conn.execute(statement, params).fetchall()
            except psycopg.Error as exc:
                self._lease_session_done(conn, reusable=False)  # whatever it took dies with it
                if not (kept and isinstance(exc, psycopg.OperationalError)):
                    raise LedgerUnavailable(f"ledger connection lost while taking {what}") from exc
                self._drop_kept_lease_sessions()
                conn, kept = self._lease_session(what)
            except BaseException:  # an interrupt: the session and whatever it took go
                self._lease_session_done(conn, reusable=False)
                raise

    def _drop_kept_lease_sessions(self) -> None:
        with self._open_lock:
            kept, self._lease_conns = self._lease_conns, []
        for conn in kept:
            self._lease_session_done(conn, reusable=False)

    def _lease_session(self, what: str) -> tuple[psycopg.Connection, bool]:
        """A session for leases: one this process let go of (and True), or a new one (False)."""
        with self._open_lock:
            conn = self._lease_conns.pop() if self._lease_conns else None
        if conn is not None and not conn.closed:
            return conn, True
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5,
                                   options=_session_options(self.dsn, self.role))
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(
                f"ledger unreachable while taking {what}"
                f" ({exc.__class__.__name__}); check that PostgreSQL is running, then run again"
            ) from exc
        return conn, False

    def _lease_session_done(self, conn: psycopg.Connection, *, reusable: bool) -> None:
        """A lease session that holds no lease any more serves the next ones; any other is closed
        (closing the session releases every advisory lock it holds)."""
        if reusable:
            with self._open_lock:
                self._lease_conns.append(conn)
        else:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    # ---- receipts ---------------------------------------------------------------------
    def prepare_receipt(self, **request: Any) -> Receipt:
        """The receipt of delivering an artifact to a target now: :meth:`prepare_receipts` of one
        :class:`ReceiptRequest`, given by its fields."""
        (rec,) = self.prepare_receipts([ReceiptRequest(**request)])
        return rec

    _LAST_RECEIPT_SQL = (
        "SELECT r.*, (SELECT artifact_id FROM receipts WHERE region_id = %(region)s AND day = %(day)s"
        "  AND kind = %(kind)s AND target = %(target)s AND status = 'DELIVERED' AND artifact_id <> %(artifact)s"
        "  ORDER BY receipt_id DESC LIMIT 1) AS prev_delivered,"
        " (SELECT coalesce(max(generation), 0) + 1 FROM receipts WHERE artifact_id = %(artifact)s"
        "  AND target = %(target)s) AS next_generation"
        " FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT * FROM receipts WHERE region_id = %(region)s"
        "  AND day = %(day)s AND kind = %(kind)s AND target = %(target)s ORDER BY receipt_id DESC LIMIT 1) r ON true"
    )

    def prepare_receipts(self, requests: list[ReceiptRequest]) -> list[Receipt]:
        """The receipts of delivering each artifact to its target now, in order: each inserted
        PENDING, all in one durable transaction committed before any side effect, or the one
        already there. A partition's deliveries prepare their receipts together: one commit
        instead of one an artifact.

        The last receipt of the slot (region, day, kind, target) says what the target was last
        sent. If it is this artifact, it is returned as it stands: DELIVERED means nothing to do,
        PENDING means deliver again under the same key. Otherwise a new generation of this
        artifact's receipt is made, so that a partition whose inputs went A -> B -> A ends on A
        again (under the key ``<artifact id>#<generation>``, since A's own key was used before);
        a PENDING receipt of another artifact it overtakes becomes SUPERSEDED. ``supersedes``
        names the last DELIVERED revision of the slot.

        Every slot is locked first, in one order for every process (the locks' keys sorted), so
        two processes preparing receipts of overlapping slots cannot wait for each other.
        """
        if not requests:
            return []
        locks = sorted({_lock_key("stormlake-receipt-slot", r.region_id, r.day, r.kind, r.target) for r in requests})

        def txn(conn: psycopg.Connection) -> list[Receipt]:
            conn.execute("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k ORDER BY k", (locks,))
            out: list[Receipt] = []
            for req in requests:
                args = {"artifact": req.artifact_id, "target": req.target, "region": req.region_id, "day": req.day,
                        "kind": req.kind}
                with conn.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(self._LAST_RECEIPT_SQL, args).fetchone()  # type: ignore[arg-type]
                assert row is not None
                prev, generation = row.pop("prev_delivered"), row.pop("next_generation")
                if row["receipt_id"] is not None:
                    last = Receipt(**row)
                    if last.artifact_id == req.artifact_id:
                        out.append(last)
                        continue
                    if last.status == "PENDING":
                        conn.execute("UPDATE receipts SET status = 'SUPERSEDED' WHERE receipt_id = %s",
                                     (last.receipt_id,))
                with conn.cursor(row_factory=class_row(Receipt)) as cur:
                    rec = cur.execute(
                        "INSERT INTO receipts (artifact_id, target, generation, idempotency_key, partition_key,"
                        " region_id, day, kind, content_hash, size_bytes, target_ref, status, supersedes, checkpoint_id)"
                        " VALUES (%(artifact)s, %(target)s, %(generation)s, %(key)s, %(partition)s, %(region)s,"
                        " %(day)s, %(kind)s, %(content)s, %(size)s, %(ref)s, 'PENDING', %(supersedes)s, %(checkpoint)s)"
                        " RETURNING *",
                        {**args, "generation": generation, "key": receipt_key(req.artifact_id, generation),
                         "partition": req.partition_key, "content": req.content_hash, "size": req.size_bytes,
                         "ref": req.target_ref, "supersedes": prev, "checkpoint": req.checkpoint_id},
                    ).fetchone()
                assert rec is not None
                out.append(rec)
            return out

        first = requests[0].artifact_id
        return self._run(txn, what=f"record the receipt of {first}" if len(requests) == 1
                         else f"record {len(requests)} receipts of {requests[0].partition_key}")

    def note_delivery_attempt(self, receipt: Receipt, error: str | None) -> None:
        self._run(
            lambda c: c.execute(
                "UPDATE receipts SET attempts = attempts + 1, last_error = %s WHERE receipt_id = %s",
                (error, receipt.receipt_id),
            ),
            what=f"note a delivery attempt of {receipt.idempotency_key}",
        )

    # The receipt marked DELIVERED in a transaction whose commit waits for the WAL flush,
    # whatever the session says (as ``ledger_read.open`` does: a plain statement of the
    # autocommit session, so one round trip instead of BEGIN, SET LOCAL, UPDATE, COMMIT).
    _MARK_DELIVERED_SQL = (
        "durable AS (SELECT pg_catalog.set_config('synchronous_commit', 'on', true) AS setting),"
        " marked AS (UPDATE receipts SET status = 'DELIVERED', delivered_at = coalesce(delivered_at, now()),"
        "  response = %(response)s, last_error = NULL FROM durable WHERE receipt_id = %(receipt)s"
        "  RETURNING receipt_id),"
    )

    def mark_delivered(self, receipt: Receipt, response: dict[str, Any], *,
                       records: list[CallRecord] | None = None) -> list[FencingError | None]:
        """Mark the receipt DELIVERED, durably (a receipt is what keeps a delivery from being
        made twice), and record the delivery's call (``records``, :meth:`record_calls`) in the
        same statement: one round trip and one commit for both. Returns what
        :meth:`record_calls` returns for ``records``: the receipt is marked even if the attempt
        lost its lease, since the target has the artifact."""
        params = {"response": Jsonb(response), "receipt": receipt.receipt_id}
        what = f"mark {receipt.idempotency_key} delivered"
        if records:
            return self._record(records, self._MARK_DELIVERED_SQL, params, what=what)
        self._run(lambda c: c.execute(f"WITH {self._MARK_DELIVERED_SQL.rstrip(',')} SELECT count(*) FROM marked",
                                      params).fetchone(), single=True, what=what)
        return []

    def receipts(self, *, partition_key: str | None = None) -> list[Receipt]:
        def q(conn: psycopg.Connection) -> list[Receipt]:
            with conn.cursor(row_factory=class_row(Receipt)) as cur:
                if partition_key is None:
                    return cur.execute("SELECT * FROM receipts ORDER BY day, region_id, receipt_id").fetchall()
                return cur.execute(
                    "SELECT * FROM receipts WHERE partition_key = %s ORDER BY receipt_id",
                    (partition_key,),
                ).fetchall()

        return self._run(q, what="read receipts", single=True)

    # ---- events, status, pruning ------------------------------------------------------
    _EVENT_COLUMNS = ("event_id, checkpoint_id, partition_key, region_id, day, phase, status, input_hash, seq,"
                      " attempt, tier, run_id, detail, at, txid::text::bigint AS txid")

    def events_since(self, after: tuple[int, int], *, limit: int = 500) -> list[Event]:
        """The events after position ``after`` = (txid, event_id), in commit order (migration 010):
        only those of transactions older than every one still running, so that an event committed
        late can never land behind a position already read."""

        def q(conn: psycopg.Connection) -> list[Event]:
            with conn.cursor(row_factory=class_row(Event)) as cur:
                return cur.execute(
                    f"SELECT {self._EVENT_COLUMNS} FROM checkpoint_events"
                    " WHERE (txid, event_id) > (%s::text::xid8, %s) AND txid < pg_snapshot_xmin(pg_current_snapshot())"
                    " ORDER BY txid, event_id LIMIT %s",
                    (int(after[0]), int(after[1]), limit),
                ).fetchall()

        return self._run(q, what="read checkpoint events", single=True)

    def record_reader(self, name: str, after: tuple[int, int]) -> None:
        """Record that reader ``name`` has read every checkpoint event up to position ``after``
        = (txid, event_id), in the order of :meth:`events_since`.

        Written only when the position moved (backwards too: a reader whose cursor was reset
        reads again from there). :meth:`prune` keeps every event after the lowest position.
        Not made durable on its own: a position lost with a server crash is an older one,
        which only keeps more.
        """
        self._run(
            lambda c: c.execute(
                "INSERT INTO event_readers (name, after_txid, after_event_id) VALUES (%s, %s::text::xid8, %s)"
                " ON CONFLICT (name) DO UPDATE SET after_txid = EXCLUDED.after_txid,"
                " after_event_id = EXCLUDED.after_event_id, updated_at = now()"
                " WHERE (event_readers.after_txid, event_readers.after_event_id)"
                " IS DISTINCT FROM (EXCLUDED.after_txid, EXCLUDED.after_event_id)",
                (name, int(after[0]), int(after[1])),
            ),
            what=f"record how far {name} read the checkpoint events",
            single=True,
        )

    def event_readers(self) -> list[EventReader]:
        def q(conn: psycopg.Connection) -> list[EventReader]:
            with conn.cursor(row_factory=class_row(EventReader)) as cur:
                return cur.execute("SELECT name, after_event_id, updated_at, after_txid::text::bigint AS after_txid"
                                   " FROM event_readers ORDER BY name").fetchall()

        return self._run(q, what="read the event readers", single=True)

    _PRUNE_EVENTS_SQL = (
        "WITH old AS ("
        " SELECT e.event_id, coalesce((e.txid, e.event_id) <= (%(upto_txid)s::text::xid8, %(upto)s), false) AS read,"
        "  EXISTS (SELECT 1 FROM checkpoints c WHERE c.id = e.checkpoint_id AND c.superseded_at IS NULL) AS current"
        " FROM checkpoint_events e WHERE e.at < now() - %(cutoff)s::interval"
        "), del AS ("
        " DELETE FROM checkpoint_events e USING old"
        "  WHERE e.event_id = old.event_id AND old.read AND NOT old.current RETURNING 1"
        ") SELECT (SELECT count(*) FROM del) AS deleted,"
        " count(*) FILTER (WHERE current) AS kept_current,"
        " count(*) FILTER (WHERE NOT current AND NOT read) AS kept_unread FROM old"
    )

    def prune(self, *, older_than_days: int, keep_days_from: str | None) -> PruneResult:
        """Delete history older than the window: superseded checkpoints, old events and receipts.

        Never deletes a head checkpoint, nor an event of one (its attempts, completion and skips
        are what status and the report show of it), nor an event some reader of the outbox has
        not read yet: every event after the lowest position in ``event_readers``, and every
        event at all while no reader has recorded a position. Never deletes a receipt (or the
        checkpoint it names) whose day is on or after ``keep_days_from`` (the start of the
        backfill window); before it, a receipt goes only when a later receipt of the same slot
        (region, day, kind, target) was DELIVERED, so the revision a target holds stays.
        """

        def txn(conn: psycopg.Connection) -> PruneResult:
            cutoff = f"{int(older_than_days)} days"
            with conn.cursor(row_factory=class_row(EventReader)) as cur:
                readers = cur.execute(
                    "SELECT name, after_event_id, updated_at, after_txid::text::bigint AS after_txid"
                    " FROM event_readers ORDER BY after_txid, after_event_id, name"
                ).fetchall()
            upto = readers[0] if readers else None
            deleted, kept_current, kept_unread = conn.execute(
                self._PRUNE_EVENTS_SQL,
                {"upto": None if upto is None else upto.after_event_id,  # type: ignore[arg-type]
                 "upto_txid": None if upto is None else upto.after_txid, "cutoff": cutoff}
            ).fetchone()
            cp = conn.execute(
                "DELETE FROM checkpoints WHERE superseded_at IS NOT NULL AND superseded_at < now() - %s::interval"
                " AND (%s::text IS NULL OR day < %s::text)",
                (cutoff, keep_days_from, keep_days_from),
            ).rowcount
            rc = conn.execute(
                "DELETE FROM receipts r WHERE r.created_at < now() - %s::interval"
                " AND (%s::text IS NULL OR r.day < %s::text)"
                " AND EXISTS (SELECT 1 FROM receipts n WHERE n.region_id = r.region_id AND n.day = r.day"
                "             AND n.kind = r.kind AND n.target = r.target AND n.status = 'DELIVERED'"
                "             AND n.created_at > r.created_at)",
                (cutoff, keep_days_from, keep_days_from),
            ).rowcount
            return PruneResult(checkpoints=cp, events=int(deleted), receipts=rc,
                               old_events_kept_current=int(kept_current), old_events_kept_unread=int(kept_unread),
                               readers=readers)

        return self._run(txn, what="prune ledger history")


def dead_lettered_phases(dsn: str, keys: list[str], after: int, *, timeout_s: float = 2.0) -> dict[str, list[str]]:
    """Of ``keys``, the phases whose head checkpoint failed ``after`` times or more, by partition.

    One statement on a connection of its own, as the pipeline's role, with no pool, migration
    or retry, and at most ``timeout_s`` to connect and to run: for a caller that must not wait on
    the ledger (the run coordinator in Dagster's daemon, ``pipeline.launcher``). Raises
    ``psycopg.Error`` (unreachable, or a ledger older than the ``failures`` column).
    """
    options = f"{_session_options(dsn, PIPELINE_ROLE)} -c statement_timeout={int(timeout_s * 1000)}"
    with psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, round(timeout_s)), options=options) as conn:
        rows = conn.execute(
            "SELECT partition_key, phase FROM checkpoints WHERE superseded_at IS NULL AND status = 'FAILED'"
            " AND failures >= %s AND partition_key = ANY(%s) ORDER BY partition_key, phase", (after, keys)).fetchall()
    out: dict[str, list[str]] = {}
    for key, phase in rows:
        out.setdefault(key, []).append(phase)
    return out


def login_roles(dsn: str, role: str | None = None) -> tuple[str, list[str], int]:
    """The login of ``dsn``, which of the roles a person may read as it is a member of (with
    ``role``, that one is looked at too), and the ledger's schema version (0: not migrated, or too
    old to tell its readers). One connection of its own, no role taken on, no DDL."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            login, roles = conn.execute(
                "SELECT session_user::text, coalesce(array_agg(r ORDER BY r) FILTER (WHERE"
                " EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) AND pg_has_role(session_user, r, 'MEMBER')), '{}')"
                " FROM unnest(%s::text[]) r", (sorted({*READ_AS_ROLES, *([role] if role else [])}),)).fetchone()
            version = _schema_version_txn(conn)
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"could not log in to the ledger ({_reason(exc)}); {_advice(exc)}") from exc
    return str(login), list(roles), version


def _schema_version_txn(conn: psycopg.Connection) -> int:
    if not conn.execute("SELECT to_regclass('public.schema_migrations') IS NOT NULL AND"
                        " has_table_privilege('public.schema_migrations', 'SELECT')").fetchone()[0]:
        return 0  # not migrated, or too old to grant its readers the version (009)
    return int(conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0])


def latest_schema_version() -> int:
    return max(int(p.name[:3]) for p in MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql"))


def schema_behind(have: int) -> ConfigError | None:
    """The error of a command that runs no DDL on a ledger at schema version ``have``, if it is behind."""
    latest = latest_schema_version()
    if have >= latest:
        return None
    return ConfigError(f"the ledger's schema is at version {have}, this stormlake needs {latest}: run"
                       " `stormlake db migrate` as the ledger's owner (STORMLAKE_OWNER_DSN), then again")


def get_ledger(dsn: str, *, role: str | None = PIPELINE_ROLE, audited: bool = False,
               owner_dsn: str | None = None) -> Ledger:
    """The process-wide ledger for ``dsn`` and ``role`` (one pool each per process); with
    ``owner_dsn``, migrated as that login on first use (:meth:`Ledger.shared`)."""
    return Ledger.shared(dsn, role=role, audited=audited, owner_dsn=owner_dsn)
