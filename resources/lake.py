"""Delta tables under ``$STORMLAKE_LAKE``: pinned reads and crash-safe partition overwrites.

Every write replaces exactly the (region_id, day) partitions it names with a predicate
overwrite, never an append, so a repeated write cannot duplicate rows: one partition, or the
few small partitions of a range step at once (:meth:`Lake.overwrite_partitions`). Each
partition carries a Delta app transaction ``(app_id, seq)`` and the same pair in the commit's
custom metadata. Before writing,
the table's ``transaction_version(app_id)`` tells whether an earlier attempt of the same
checkpoint already committed (``version >= first_seq``): then the table is not written again and
the version of that commit is found in the history. delta-rs itself accepts duplicate and lower
app transaction versions, so this check is ours to make.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from resources.errors import LakeError
from resources.settings import DEFAULT_LAKE_LOG_RETENTION_MINUTES
from resources.storage import delta_storage_options

log = logging.getLogger(__name__)

APP_KEY = "stormlake.app_id"
SEQ_KEY = "stormlake.seq"
#: A write of several partitions: ``{app_id: seq}`` of each, as JSON (APP_KEY and SEQ_KEY name the first).
APPS_KEY = "stormlake.apps"

PREFETCH_NICE = 10
CACHE_BUDGET_BYTES = 768 * 1024 * 1024
CREATE_TRIES = 5  # a table creation racing another process's is tried again
CacheKey = tuple[str, str, str, int]  # (table uri, region_id, day, version)
#: Threads that write (and hash) a phase's tables at once: a phase writes at most five, and a
#: range step's flush behind (``assets.runner``) writes while the next partition hashes its own.
WRITER_THREADS = 10
T = TypeVar("T")


class ProcessThreads:
    """A thread pool of this process, made on first use; a forked child makes its own (the
    parent's threads do not survive a fork)."""

    def __init__(self, workers: int, name: str):
        self._workers = workers
        self._name = name
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool[0] != os.getpid():
                self._pool = (os.getpid(), ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._name))
            return self._pool[1]


_writers = ProcessThreads(WRITER_THREADS, "stormlake-writer")


def in_background(call: Callable[[], T]) -> Future[T]:
    """Start ``call`` in the process's writer threads; its future (a phase's table hashes are
    computed this way while the step goes on, ``assets.runner``)."""
    return _writers.get().submit(call)


def at_once(calls: list[Callable[[], T]]) -> list[T | BaseException]:
    """Run ``calls`` in the process's writer threads at once; their results in the same order,
    an exception where a call raised one (the caller decides what to do with the others).

    A phase's tables are written this way: a Delta write spends most of its time in delta-rs
    and the Parquet encoder with the GIL released, so the writes of five tables take about half
    the time of five in a row (their content hashes, sha256 also without the GIL, are started
    earlier, :func:`in_background`).
    One call runs on the calling thread.
    """
    if len(calls) == 1:
        try:
            return [calls[0]()]
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, in order
            return [exc]
    pool = _writers.get()
    futures = [pool.submit(call) for call in calls]
    return [f.exception() or f.result() for f in futures]


def table_configuration(log_retention_minutes: int = DEFAULT_LAKE_LOG_RETENTION_MINUTES) -> dict[str, str]:
    """The table properties every lake table is created with (and an older table is given at its
    first write by a process).

    ``delta.logRetentionDuration`` is how long a table's log keeps the commits before its last
    checkpoint (``STORMLAKE_LAKE_LOG_RETENTION_MINUTES``). Every write lists the log folder and
    reads what it finds, so its cost grows with every commit kept (a year of 50 regions is 18,250
    commits a table, which kept whole would make a write cost more than a partition's phase work). Commits older
    than this are removed when delta-rs writes a checkpoint (every 100 commits); a pinned read
    finds its partition's files in the ledger, not in the log (see :meth:`Lake.read_partition`),
    so only an outside reader's time travel is bounded by it.

    ``delta.dataSkippingNumIndexedCols`` 0: a data file's add action carries its row count
    (``numRecords``, which :meth:`Lake.row_count` reads) but no per-column minimum, maximum or
    null count. Every commit rebuilds the table's list of live files with their statistics, so
    their size is paid again on each write, for each file of the table: a table of a year holds
    18,250 files. Nothing here skips data by them: every read names its partition, whose files
    the partition columns select.
    """
    return {"delta.logRetentionDuration": f"interval {log_retention_minutes} minutes",
            "delta.dataSkippingNumIndexedCols": "0"}


def _background_priority() -> None:
    """Lower the calling thread's scheduling priority (Linux: ``nice`` is per thread).

    The reader runs beside a phase computing on the main thread; on a machine with few cores
    it must take the CPU the phase leaves idle, not the phase's own.
    """
    if not sys.platform.startswith("linux"):  # elsewhere the id below would name a process
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PREFETCH_NICE)
    except OSError:  # not allowed here: read at normal priority
        pass


class PartitionCache:
    """Partitions this process wrote or read recently, by (table uri, region, day, version).

    A later phase of the same run reads them back at exactly that version, so they are served
    from memory instead of a Parquet scan (a resumed run reads an upstream table from disk once,
    not once per phase that needs it). A pinned version never changes, so an entry never goes
    stale. Least recently used first out, within a byte budget. It also holds the reads started
    ahead of need (:meth:`Lake.prefetch`, one background reader) and the tables known to exist.

    One cache serves the whole process (:meth:`shared`): Dagster builds a new :class:`Lake` for
    every step, and the partitions a step wrote are read by the next step of the same run.
    """

    _shared: ClassVar[tuple[int, PartitionCache] | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, budget_bytes: int = CACHE_BUDGET_BYTES):
        self.budget_bytes = budget_bytes
        self.nbytes = 0
        self.known_tables: set[str] = set()
        self._tables: OrderedDict[CacheKey, pa.Table] = OrderedDict()
        self._inflight: dict[CacheKey, Future[None]] = {}
        self._lock = threading.Lock()
        self._reader: ThreadPoolExecutor | None = None

    @classmethod
    def shared(cls) -> PartitionCache:
        """This process's cache (a forked child gets its own)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared[0] != os.getpid():
                cls._shared = (os.getpid(), cls())
            return cls._shared[1]

    def __contains__(self, key: CacheKey) -> bool:
        with self._lock:
            return key in self._tables

    @property
    def reads_in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def take(self, key: CacheKey, *, last_use: bool) -> pa.Table | None:
        """The cached partition, after any read of it in flight; removed when this is its last use."""
        with self._lock:
            pending = self._inflight.get(key)
        if pending is not None:
            pending.exception()  # wait for the prefetch; if it failed, the caller's read says why
        with self._lock:
            if last_use:
                cached = self._tables.pop(key, None)
                if cached is not None:
                    self.nbytes -= cached.nbytes
                return cached
            cached = self._tables.get(key)
            if cached is not None:
                self._tables.move_to_end(key)
            return cached

    def remember(self, key: CacheKey, data: pa.Table) -> None:
        """Keep a partition, evicting the least recently used over budget."""
        with self._lock:
            old = self._tables.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            if data.nbytes > self.budget_bytes:
                return
            self._tables[key] = data
            self.nbytes += data.nbytes
            while self._tables and self.nbytes > self.budget_bytes:
                _, evicted = self._tables.popitem(last=False)
                self.nbytes -= evicted.nbytes

    def read_ahead(self, key: CacheKey, read: Callable[[], pa.Table]) -> None:
        """Run ``read`` on the background reader and keep its result, unless the partition is
        here already or being read."""
        with self._lock:
            if key in self._tables or key in self._inflight:
                return
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stormlake-prefetch",
                                                  initializer=_background_priority)
            self._inflight[key] = self._reader.submit(self._read_ahead, key, read)

    def _read_ahead(self, key: CacheKey, read: Callable[[], pa.Table]) -> None:
        try:
            self.remember(key, read())
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self.nbytes = 0


@dataclass(frozen=True)
class WriteResult:
    table: str
    version: int  # the table version holding this partition's data
    written: bool  # False when an earlier attempt's commit was recognised and reused
    rows: int
    #: The partition's data files at ``version`` (paths relative to the table, as the log has
    #: them), from the commit that wrote them; None when they could not be told (a remote lake,
    #: a commit no longer in the log). A pinned read of the partition reads these files.
    files: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PartitionWrite:
    """One partition of a write (:meth:`Lake.overwrite_partitions`): its rows and the attempt's seq
    and first seq (see :meth:`Lake.overwrite_partition`)."""

    region_id: str
    day: str
    data: pa.Table
    seq: int
    first_seq: int


def app_id(table: str, region_id: str, day: str) -> str:
    return f"stormlake/{table}/{region_id}/{day}"


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class Lake:
    """Access to the lake's tables by name."""

    def __init__(self, root: str, schemas: dict[str, pa.Schema], *, partition_by: list[str],
                 cache: PartitionCache | None = None, log_retention_minutes: int = DEFAULT_LAKE_LOG_RETENTION_MINUTES):
        self.root = root
        # On S3: the AWS variables and conditional writes, which keep concurrent commits safe
        # without a lock table (resources/storage.py).
        self.storage_options = delta_storage_options(root)
        self.configuration = table_configuration(log_retention_minutes)
        self.cache = cache if cache is not None else PartitionCache.shared()
        self.schemas = schemas
        self.partition_by = partition_by
        # Per table, the row count of each data file at the version last counted (row_count),
        # moved forward by reading only the commits since; a remote table keeps a log handle.
        self._counts: dict[str, _FileRows] = {}
        self._count_handles: dict[str, DeltaTable] = {}
        # The table's rows at each version this process committed, summed when it committed.
        self._totals: dict[tuple[str, int], int] = {}
        # One handle per table for writes, moved to the latest version before each (see _latest).
        self._write_handles: dict[str, DeltaTable] = {}

    def uri(self, table: str) -> str:
        return self.root.rstrip("/") + "/" + table

    def ensure_table(self, table: str) -> bool:
        """Create the table (empty, partitioned) unless it exists; safe against a creation race.

        Returns whether this is the process's first look at the table (its stored schema is then
        brought up to date by the first write, :meth:`_add_new_columns`)."""
        uri = self.uri(table)
        if uri in self.cache.known_tables:
            return False
        if "://" not in uri:
            Path(uri).parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(CREATE_TRIES):
            try:
                if DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                    break
                DeltaTable.create(uri, self.schemas[table], mode="ignore", partition_by=self.partition_by,
                                  configuration=self.configuration, storage_options=self.storage_options)
                break
            except (CommitFailedError, DeltaError, OSError) as exc:
                if DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                    break
                if attempt == CREATE_TRIES - 1:
                    raise LakeError(f"cannot create Delta table {table} at {uri}: {exc}") from exc
                time.sleep(0.1 * (attempt + 1))
        self.cache.known_tables.add(uri)
        return True

    def _add_new_columns(self, table: str, dt: DeltaTable) -> DeltaTable:
        """``dt`` (the table as just loaded) with the columns a newer schema version of ``table``
        has and the stored table lacks, added; reloaded when that took a commit.

        Added as nullable (Delta cannot add a required column to rows already written); the rows
        of older partitions read them as null, and a phase at the new schema version writes them.
        A column added concurrently by another process is fine.
        """
        have = {f.name for f in dt.schema().fields}
        new = [f.with_nullable(True) for f in self.schemas[table] if f.name not in have]
        if not new:
            return dt
        try:
            dt.alter.add_columns([Field.from_arrow(f) for f in new])
        except (CommitFailedError, DeltaError) as exc:
            latest = self.table(table)
            if not {f.name for f in new} <= {f.name for f in latest.schema().fields}:
                raise LakeError(f"cannot add the columns {', '.join(f.name for f in new)} to {table}: {exc}") from exc
            return latest
        return self.table(table)

    def _configured(self, table: str, dt: DeltaTable) -> DeltaTable:
        """``dt`` with the lake's :func:`table_configuration` set (a table made before a property was
        added, or with another retention, gets it with one commit; a concurrent setter is fine)."""
        have = dt.metadata().configuration
        missing = {k: v for k, v in self.configuration.items() if have.get(k) != v}
        if not missing:
            return dt
        try:
            dt.alter.set_table_properties(missing)
        except (CommitFailedError, DeltaError) as exc:
            log.warning("could not set %s on %s: %s", ", ".join(missing), table, exc)
        return self.table(table)

    def _latest(self, table: str) -> DeltaTable:
        """``table`` at its latest version, to write to. The handle is kept and moved forward
        (``update_incremental`` reads only the commits since the handle's version, other
        processes' included), where a new handle loads the last checkpoint and every commit after
        it, a cost on every write. On a local lake the handle is moved only when the log holds
        the commit after its version (one file lookup): an update that finds nothing new still
        lists the whole log folder, which grows with the versions. A handle whose update fails is dropped for a new one."""
        uri = self.uri(table)
        dt = self._write_handles.get(uri)
        if dt is not None:
            try:
                if _has_commits_after(uri, dt.version()):
                    dt.update_incremental()
                return dt
            except (DeltaError, OSError):
                del self._write_handles[uri]
        dt = self._write_handles[uri] = self.table(table)
        return dt

    def table(self, table: str, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)
        except TableNotFoundError as exc:
            raise LakeError(f"Delta table {table} not found at {self.uri(table)}") from exc
        except DeltaError as exc:
            raise LakeError(f"cannot open Delta table {table} at version {version}: {exc}") from exc

    def read_partition(self, table: str, region_id: str, day: str, *, version: int,
                       files: Sequence[str] | None = None, last_use: bool = False) -> pa.Table:
        """Read one partition at a pinned table version (never "latest").

        On a local lake the partition's files at that version are read by pyarrow's own Parquet
        reader, with its threads, and the partition columns are added back as the constants they
        are. ``files`` are those files as the write recorded them (:attr:`WriteResult.files`):
        then the table is not loaded at the version at all, so the read neither replays the log
        nor needs the version's commits, which the log's cleanup removes (see
        :func:`table_configuration`). Without them, or when one is gone, the files come from the
        table loaded at the version. Elsewhere, or when the table uses a reader feature this
        does not handle (deletion vectors, column mapping), the deltalake dataset is scanned,
        single-threaded: a threaded scan through deltalake's filesystem handler has been seen
        to abort the interpreter at exit with deltalake 1.6 and pyarrow 26.

        ``last_use``: no later reader in this process needs the partition, so it leaves the
        process cache (memory handed back for the next allocations instead of fresh pages).
        """
        key = (self.uri(table), region_id, day, version)
        cached = self.cache.take(key, last_use=last_use)
        if cached is not None:
            return cached
        out = self._scan(table, region_id, day, version, files=files)
        if not last_use:
            self.cache.remember(key, out)
        return out

    def prefetch(self, table: str, region_id: str, day: str, *, version: int,
                 files: Sequence[str] | None = None) -> None:
        """Start reading a pinned partition in the background for a later :meth:`read_partition`.

        A range run computes one partition while the next one's inputs are read (Parquet
        decoding and the Delta log replay release the GIL). Does nothing when the partition is
        in memory already or being read.
        """
        key = (self.uri(table), region_id, day, version)
        # Single-threaded: on a machine with few cores the phase computing meanwhile has the rest.
        self.cache.read_ahead(key, lambda: self._scan(table, region_id, day, version, files=files, threads=False))

    def _scan(self, table: str, region_id: str, day: str, version: int, *, files: Sequence[str] | None = None,
              threads: bool = True) -> pa.Table:
        schema = self.schemas[table]
        uri = self.uri(table)
        if files is not None and "://" not in uri and self._plain_parquet(table):
            paths = [f"{uri}/{urllib.parse.unquote(f)}" for f in files]
            if all(os.path.exists(p) for p in paths):
                return _read_files(paths, region_id, day, schema, threads=threads)
        dt = self.table(table, version)
        if "://" not in uri and _plain(dt):
            paths = dt.file_uris(file_pruning_predicate=[("region_id", "=", region_id), ("day", "=", day)])
            return _read_files(paths, region_id, day, schema, threads=threads)
        import pyarrow.dataset as pads  # it imports pandas, which a process that only loads the definitions never needs

        flt = (pads.field("region_id") == region_id) & (pads.field("day") == day)
        return dt.to_pyarrow_dataset().to_table(filter=flt, use_threads=False).cast(schema)

    def _plain_parquet(self, table: str) -> bool:
        """Whether the table's data files are read as they are: no reader feature this module does
        not handle (deletion vectors, column mapping). Asked of the table as last loaded here."""
        uri = self.uri(table)
        dt = self._write_handles.get(uri) or self._count_handles.get(uri)
        if dt is None:
            dt = self._count_handles[uri] = self.table(table)
        return _plain(dt)

    def committed_version(self, table: str, app: str, seq: int, *, search: int = 500,
                          dt: DeltaTable | None = None) -> int | None:
        """The table version whose commit carries app transaction ``(app, seq)``, if any, among the
        newest ``search`` commits; from ``dt`` (a handle at the latest version) when given, else
        from the table loaded anew.

        On a local lake the commits are read from their own files, newest first, so each version
        is the number in its file's name. deltalake's ``history()`` is not used there: it numbers
        the commits it lists by counting down from the snapshot's version, and a commit another
        writer adds while it lists shifts every number after it (seen with two processes writing
        the same tables: the version of a neighbour's commit, off by one or two, returned as ours).
        """
        found = self._committed(table, app, seq, search=search, dt=dt)
        return None if found is None else found[0]

    def _committed(self, table: str, app: str, seq: int, *, search: int = 500,
                   dt: DeltaTable | None = None) -> tuple[int, _Commit | None] | None:
        """:meth:`committed_version`, with the commit as read from its file (None on a remote lake)."""
        dt = dt if dt is not None else self.table(table)
        uri = self.uri(table)
        if "://" not in uri:
            top = dt.version()
            while os.path.exists(_commit_file(uri, top + 1)):  # commits made since the handle's version
                top += 1
            for version in range(top, max(-1, top - search), -1):
                commit = _read_commit(uri, version)
                if commit is None:  # the log's cleanup removed it and everything before it
                    break
                if commit.made_by(app, seq):
                    return version, commit
            return None
        for entry in dt.history(search):
            if _made_by(entry, app, seq):
                return int(entry["version"]), None
        return None

    def overwrite_partition(self, table: str, region_id: str, day: str, data: pa.Table, *,
                            seq: int, first_seq: int, keep: bool = True) -> WriteResult:
        """Replace one partition, unless an attempt of the same checkpoint already did.

        Args:
            seq: the attempt's fencing token, written as the app transaction version.
            first_seq: the seq of the checkpoint's first attempt; any app transaction version at
                or above it was written by an attempt of this same (partition, phase, input hash).
            keep: keep the written partition in the process cache for a later reader.
        """
        return self.overwrite_partitions(table, [PartitionWrite(region_id, day, data, seq, first_seq)], keep=keep)[0]

    def overwrite_partitions(self, table: str, writes: Sequence[PartitionWrite], *,
                             keep: bool = True) -> list[WriteResult]:
        """Replace several partitions of ``table`` in one commit; each, unless an attempt of the
        same checkpoint already did (:meth:`overwrite_partition` for one).

        One predicate overwrite names exactly the partitions written, ``(region_id = … AND day =
        …) OR …``, and carries one app transaction per partition, so each partition is
        recognised later on its own, as if it had been written alone. A Delta commit costs the
        same for one partition as for eight of a few hundred rows, and more on a table of a year's
        partitions: a range step of small partitions pays it once per table.
        """
        if len({(w.region_id, w.day) for w in writes}) != len(writes):
            raise LakeError(f"{table}: a partition named twice in one write")
        first_look = self.ensure_table(table)
        uri = self.uri(table)
        schema = self.schemas[table]
        apps = [app_id(table, w.region_id, w.day) for w in writes]
        datas = [w.data.select(schema.names).cast(schema) for w in writes]
        results: dict[int, WriteResult] = {}
        for attempt in range(6):
            dt = self._latest(table)
            if first_look:  # the table as this process first writes it: schema and properties brought up to date
                dt, first_look = self._configured(table, self._add_new_columns(table, dt)), False
                self._write_handles[uri] = dt
            # Only an earlier attempt of a checkpoint (first_seq < seq), or this one in a commit
            # race it may have won (attempt > 0), can have written a partition: a first attempt's
            # first try skips the lookup, which reads the table's log.
            for i, (w, app) in enumerate(zip(writes, apps, strict=True)):
                done = dt.transaction_version(app) if i not in results and (attempt or w.seq != w.first_seq) else None
                if done is not None and done >= w.first_seq:
                    found = self._committed(table, app, done, dt=dt)
                    if found is not None:
                        results[i] = WriteResult(table, found[0], written=False, rows=datas[i].num_rows,
                                                 files=_files_of(found[1], w.region_id, w.day))
            todo = [i for i in range(len(writes)) if i not in results]
            if not todo:
                break
            what = _what(table, [writes[i] for i in todo])
            predicate = " OR ".join(f"(region_id = {_sql_str(writes[i].region_id)} AND day = {_sql_str(writes[i].day)})"
                                    for i in todo)
            metadata = {APP_KEY: apps[todo[0]], SEQ_KEY: str(writes[todo[0]].seq)}
            if len(todo) > 1:
                metadata[APPS_KEY] = json.dumps({apps[i]: writes[i].seq for i in todo}, sort_keys=True)
            try:
                write_deltalake(
                    dt,
                    datas[todo[0]] if len(todo) == 1 else pa.concat_tables([datas[i] for i in todo]),
                    mode="overwrite",
                    predicate=predicate,
                    partition_by=self.partition_by,
                    commit_properties=CommitProperties(
                        custom_metadata=metadata,
                        app_transactions=[Transaction(apps[i], writes[i].seq) for i in todo],
                        max_commit_retries=50,
                    ),
                )
            except (CommitFailedError, FileNotFoundError) as exc:
                # Lost a commit race, or the log's cleanup removed a commit the write was reading:
                # reload and re-decide (maybe our earlier attempt won it).
                self._write_handles.pop(uri, None)
                if attempt == 5:
                    raise LakeError(f"{what}: commit kept failing: {exc}") from exc
                time.sleep(0.05 * (attempt + 1))
                continue
            except DeltaError as exc:
                self._write_handles.pop(uri, None)
                raise LakeError(f"{what}: write failed: {exc}") from exc
            # The handle now stands at our commit's version; confirm it from that commit itself
            # (its file on a local lake; else the newest entry of the history) and search the
            # commits if anything disagrees. (``history(1)`` lists the log as it is now, so another
            # writer's newer commit can stand there: it is not used on a local lake.)
            confirmed = self._confirm(table, dt, [(apps[i], writes[i].seq) for i in todo])
            self._remember_total(uri, dt)
            for i, (version, commit) in zip(todo, confirmed, strict=True):
                if version is None:
                    raise LakeError(f"{_what(table, [writes[i]])}: commit of seq {writes[i].seq} not found"
                                    " in the table history")
                if keep:
                    self.cache.remember((uri, writes[i].region_id, writes[i].day, version), datas[i])
                results[i] = WriteResult(table, version, written=True, rows=datas[i].num_rows,
                                         files=_files_of(commit, writes[i].region_id, writes[i].day))
            break
        else:
            raise LakeError(f"{_what(table, writes)}: write did not complete")
        return [results[i] for i in range(len(writes))]

    def _confirm(self, table: str, dt: DeltaTable,
                 made: list[tuple[str, int]]) -> list[tuple[int | None, _Commit | None]]:
        """The version (and, on a local lake, the commit) of the write just made, for each app
        transaction ``(app, seq)`` it carried, ``dt`` standing at the version it committed. The
        commit (or the history's newest entry) is read once for all of them; one it does not
        name is searched for on its own."""
        uri = self.uri(table)
        version = dt.version()
        if "://" not in uri:
            commit = _read_commit(uri, version)
            return [(version, commit) if commit is not None and commit.made_by(app, seq)
                    else self._committed(table, app, seq, dt=dt) or (None, None) for app, seq in made]
        entry = dt.history(1)
        newest = entry[0] if entry and entry[0].get("version", version) == version else {}
        return [(version, None) if _made_by(newest, app, seq)
                else (self.committed_version(table, app, seq), None)  # the table loaded anew
                for app, seq in made]

    def row_count(self, table: str, version: int) -> int | None:
        """Total rows of ``table`` at ``version``, from the Delta log; None when the log does not tell.

        Every data file's record count is in its add action (written with the file's statistics),
        so no data is read. A version this process committed was summed as it committed
        (:meth:`_remember_total`). Otherwise, on a local lake, the rows of each live file are
        kept per table and moved forward by reading only the commits after the version last
        counted (a commit's JSON); loading a snapshot at each version instead costs far more,
        growing with the log, for each of a phase's tables and partitions. An earlier version, a
        remote lake, or a commit this does not follow (an add without statistics, deletion
        vectors) counts from the snapshot.
        """
        uri = self.uri(table)
        total = self._totals.get((uri, version))
        if total is not None:
            return total
        try:
            if "://" not in uri:
                counted = self._counts.get(uri)
                if counted is None or counted.version > version or not counted.advance(uri, version):
                    counted = self._counts[uri] = _FileRows(version, self._snapshot_counts(uri, version))
                return counted.total
            return sum(self._snapshot_counts(uri, version).values())
        except _Uncounted:
            self._counts.pop(uri, None)
            return None
        except (DeltaError, OSError, KeyError, ValueError):
            self._counts.pop(uri, None)
            self._count_handles.pop(uri, None)
            return None

    def _remember_total(self, uri: str, dt: DeltaTable) -> None:
        """The table's rows at the version ``dt`` has just committed, summed from its add actions
        while the write handle stands there: a range run's materializations ask for each
        partition's version after the handle has moved on, and loading the table at that version
        again costs a snapshot of every file of the table."""
        try:
            counts = _live_files(dt, uri).column("num_records")
        except (_Uncounted, DeltaError, KeyError, OSError):
            return
        self._totals[(uri, dt.version())] = int(pc.sum(counts).as_py() or 0)

    def _snapshot_counts(self, uri: str, version: int) -> dict[str, int]:
        """Rows of each live data file of the table at ``version``, from its snapshot's add actions.

        Raises:
            _Uncounted: a file was written without statistics (the count would be short).
        """
        dt = self._count_handles.get(uri)
        if dt is None or dt.version() > version:  # an earlier version (a skip): a fresh handle
            dt = self._count_handles[uri] = DeltaTable(uri, version=version, storage_options=self.storage_options)
        elif dt.version() < version:
            dt.load_as_version(version)
        actions = _live_files(dt, uri)
        return {_log_path(p): int(n) for p, n in zip(actions.column("path").to_pylist(),
                                                     actions.column("num_records").to_pylist(), strict=True)}


class _Uncounted(Exception):  # noqa: N818 - internal signal, never raised to a caller
    """A table version whose row count the log does not give."""


def _live_files(dt: DeltaTable, uri: str) -> pa.Table:
    """The add actions of ``dt``'s snapshot (``path``, ``num_records``, ...).

    Raises:
        _Uncounted: a file was written without statistics (a count would be short).
    """
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.column("num_records").null_count:
        raise _Uncounted(uri)
    return actions


def _has_commits_after(uri: str, version: int) -> bool:
    """Whether the table's log holds a commit after ``version``; True when that cannot be told
    cheaply (a remote table). Every commit writes its JSON file, so for a local table a lookup
    of the next one tells, as long as the handle's own is still there: the log's cleanup removes
    the oldest commits first, so a handle whose commit is gone is taken as behind."""
    if "://" in uri:
        return True
    return os.path.exists(_commit_file(uri, version + 1)) or not os.path.exists(_commit_file(uri, version))


@dataclass(frozen=True)
class _Commit:
    """What this module reads of one commit of a local table: its commit info, its add actions
    and the paths its remove actions name."""

    info: dict
    adds: tuple[dict, ...]
    removes: tuple[str, ...]

    def made_by(self, app: str, seq: int) -> bool:
        return _made_by(self.info, app, seq)


def _made_by(info: dict, app: str, seq: int) -> bool:
    """Whether a commit's info (its custom metadata) names app transaction ``(app, seq)``: as the
    commit's one partition, or among the partitions of a write of several (:data:`APPS_KEY`)."""
    if info.get(APP_KEY) == app and str(info.get(SEQ_KEY)) == str(seq):
        return True
    several = info.get(APPS_KEY)
    if not several:
        return False
    try:
        apps = several if isinstance(several, dict) else json.loads(several)
        return app in apps and str(apps[app]) == str(seq)
    except (ValueError, TypeError):
        return False


def _what(table: str, writes: Sequence[PartitionWrite]) -> str:
    """The partitions of a write, as an error names them."""
    names = ", ".join(f"{w.region_id}/{w.day}" for w in writes[:3])
    return f"{table} {names}" + (f" (and {len(writes) - 3} more)" if len(writes) > 3 else "")


def _read_commit(uri: str, version: int) -> _Commit | None:
    """Commit ``version`` of a local table from its JSON file; None when the file is not there
    (or not JSON)."""
    info: dict = {}
    adds, removes = [], []
    try:
        with open(_commit_file(uri, version), encoding="utf-8") as f:
            for line in f:
                action = json.loads(line)
                if "commitInfo" in action:
                    info = action["commitInfo"]
                elif "add" in action:
                    adds.append(action["add"])
                elif "remove" in action:
                    removes.append(action["remove"]["path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return _Commit(info, tuple(adds), tuple(removes))


def _files_of(commit: _Commit | None, region_id: str, day: str) -> tuple[str, ...] | None:
    """The data files a partition overwrite added in ``commit`` (its partition's files at that
    version: the overwrite removed the others); None without the commit (a remote table, a
    commit no longer in the log)."""
    if commit is None:
        return None
    values = {"region_id": region_id, "day": day}
    return tuple(add["path"] for add in commit.adds if add.get("partitionValues") == values)


def _commit_file(uri: str, version: int) -> str:
    return f"{uri}/_delta_log/{version:020d}.json"


def _log_path(path: str) -> str:
    """A data file's path as the log writes it in add and remove actions (relative, percent-encoded
    the same way on both), so that both sides of :class:`_FileRows` compare equal."""
    return urllib.parse.unquote(path)


@dataclass
class _FileRows:
    """The rows of each live data file of a local table at ``version``."""

    version: int
    files: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.files.values())

    def advance(self, uri: str, version: int) -> bool:
        """Move to ``version`` by applying the add and remove actions of the commits after this
        one; False (nothing changed) when a commit cannot be followed, and the caller counts
        from the snapshot."""
        files = dict(self.files)
        try:
            for v in range(self.version + 1, version + 1):
                commit = _read_commit(uri, v)
                if commit is None:
                    return False
                for add in commit.adds:
                    if add.get("deletionVector"):
                        return False
                    rows = json.loads(add.get("stats") or "{}").get("numRecords")
                    if rows is None:
                        return False
                    files[_log_path(add["path"])] = int(rows)
                for path in commit.removes:
                    files.pop(_log_path(path), None)
        except (ValueError, KeyError, TypeError):
            return False
        self.version, self.files = version, files
        return True


# Reader features under which a data file alone does not give the rows (or their names).
_UNHANDLED_READER_FEATURES = frozenset({"deletionVectors", "columnMapping"})


def _plain(dt: DeltaTable) -> bool:
    """Whether the table's data files are read as they are (no reader feature of
    :data:`_UNHANDLED_READER_FEATURES`)."""
    return not _UNHANDLED_READER_FEATURES & set(dt.protocol().reader_features or ())


def _read_files(paths: Sequence[str], region_id: str, day: str, schema: pa.Schema, *, threads: bool) -> pa.Table:
    """A partition's rows from its Parquet files (the partition columns added back), in ``schema``."""
    parts = [_conformed(_with_partition(pq.ParquetFile(p).read(use_threads=threads), region_id, day), schema)
             for p in paths]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _conformed(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` in ``schema``'s columns and types; a column added by a later schema version, which a
    file written before it lacks, reads as null."""
    missing = [f for f in schema if f.name not in data.column_names]
    for f in missing:
        data = data.append_column(f.with_nullable(True), pa.nulls(data.num_rows, f.type))
    return data.select(schema.names).cast(pa.schema([f.with_nullable(True) if f in missing else f for f in schema]))


def _with_partition(data: pa.Table, region_id: str, day: str) -> pa.Table:
    """A data file's rows with the partition columns, which Delta keeps in the log, not the file."""
    for name, value in (("region_id", region_id), ("day", day)):
        if name not in data.column_names:
            data = data.append_column(name, pa.repeat(pa.scalar(value, pa.string()), data.num_rows))
    return data
