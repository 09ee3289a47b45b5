"""The lake's pinned reads and crash-safe overwrites, on real Delta tables (no Dagster, no ledger)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from assets.phases import TABLE_PHASE
from assets.schemas import PARTITION_COLUMNS, SCHEMAS
from resources.errors import LakeError
from resources.lake import Lake, PartitionCache
from tests.helpers import latest_version

SCHEMA = SCHEMAS["weather_raw"]


def _rows(region: str, day: str, n: int, base: float) -> pa.Table:
    return pa.table({
        "station_id": [f"S{i:03d}" for i in range(n)],
        "observed_at": pa.array([1_788_220_800_000_000 + i * 3_600_000_000 for i in range(n)],
                                pa.timestamp("us", tz="UTC")),
        "lat": [30.0 + i / 100 for i in range(n)],
        "lon": [-90.0 - i / 100 for i in range(n)],
        "wind_gust_ms": [base + i for i in range(n)],
        "rain_mm": [0.5 * i for i in range(n)],
        "pressure_hpa": [1000.0 - i for i in range(n)],
        "source_line": list(range(2, n + 2)),
        "region_id": [region] * n,
        "day": [day] * n,
    }).select(SCHEMA.names).cast(SCHEMA)


def _scan(lk: Lake, version: int, region: str, day: str) -> pa.Table:
    """The reference read: deltalake's own dataset at that version, filtered to the partition."""
    ds = lk.table("weather_raw", version).to_pyarrow_dataset()
    flt = (pads.field("region_id") == region) & (pads.field("day") == day)
    return ds.to_table(filter=flt, use_threads=False).cast(SCHEMA)


@pytest.fixture()
def lk(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"), SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())


def test_pinned_reads_from_the_files_equal_deltas_own_scan(lk: Lake) -> None:
    a1 = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", _rows("gulf_coast", "2026-09-01", 50, 10.0),
                                seq=1, first_seq=1)
    lk.overwrite_partition("weather_raw", "pine_belt", "2026-09-01", _rows("pine_belt", "2026-09-01", 30, 20.0),
                           seq=2, first_seq=2)
    a2 = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", _rows("gulf_coast", "2026-09-01", 40, 30.0),
                                seq=3, first_seq=3)
    assert a1.written and a2.written and a2.version > a1.version
    lk.cache.clear()  # read from the files, not from what this process wrote

    old = lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=a1.version)
    new = lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=a2.version)
    other = lk.read_partition("weather_raw", "pine_belt", "2026-09-01", version=a2.version)
    assert old.equals(_scan(lk, a1.version, "gulf_coast", "2026-09-01"))
    assert new.equals(_scan(lk, a2.version, "gulf_coast", "2026-09-01"))
    assert other.equals(_scan(lk, a2.version, "pine_belt", "2026-09-01"))
    # The overwrite replaced the partition at the later version; the pinned earlier one is intact.
    assert old.num_rows == 50 and new.num_rows == 40 and other.num_rows == 30
    assert old.column("wind_gust_ms")[0].as_py() == 10.0 and new.column("wind_gust_ms")[0].as_py() == 30.0
    assert old.schema == SCHEMA and set(old.column("region_id").to_pylist()) == {"gulf_coast"}
    # A partition with no rows at that version reads as an empty table of the schema.
    empty = lk.read_partition("weather_raw", "tidewater", "2026-09-01", version=a2.version)
    assert empty.num_rows == 0 and empty.schema == SCHEMA


def test_a_repeated_attempt_of_the_same_checkpoint_is_recognised(lk: Lake) -> None:
    data = _rows("gulf_coast", "2026-09-01", 10, 5.0)
    first = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", data, seq=7, first_seq=7)
    # A later attempt (seq 9) of the same checkpoint (first_seq 7) finds the earlier commit.
    again = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", data, seq=9, first_seq=7)
    assert first.written and not again.written and again.version == first.version
    assert latest_version(lk, "weather_raw") == first.version


def test_several_partitions_are_replaced_in_one_commit_each_recognised_on_its_own(lk: Lake) -> None:
    from resources.lake import PartitionWrite, _read_commit, app_id

    days = ("2026-09-01", "2026-09-02", "2026-09-03")
    lk.overwrite_partition("weather_raw", "pine_belt", "2026-09-01", _rows("pine_belt", "2026-09-01", 7, 1.0),
                           seq=1, first_seq=1)
    old = [PartitionWrite("gulf_coast", d, _rows("gulf_coast", d, 5 + i, 2.0), 10 + i, 10 + i) for i, d in enumerate(days)]
    first = lk.overwrite_partitions("weather_raw", old)
    assert len({r.version for r in first}) == 1 and all(r.written for r in first)
    assert [r.rows for r in first] == [5, 6, 7]
    commit = _read_commit(lk.uri("weather_raw"), first[0].version)
    assert commit is not None and all(commit.made_by(app_id("weather_raw", "gulf_coast", d), 10 + i)
                                      for i, d in enumerate(days))
    assert not commit.made_by(app_id("weather_raw", "gulf_coast", days[0]), 11)
    for w, r in zip(old, first, strict=True):  # each partition's own files, read as deltalake reads it
        assert r.files and all(f.startswith(f"region_id=gulf_coast/day={w.day}/") for f in r.files)
        lk.cache.clear()
        got = lk.read_partition("weather_raw", "gulf_coast", w.day, version=r.version, files=r.files)
        assert got.equals(_scan(lk, r.version, "gulf_coast", w.day)) and got.num_rows == w.data.num_rows
    # Written again (new checkpoints: new rows): each partition is replaced, never appended to,
    # and the partition the write does not name keeps its rows.
    new = [PartitionWrite("gulf_coast", d, _rows("gulf_coast", d, 2, 9.0), 20 + i, 20 + i) for i, d in enumerate(days)]
    second = lk.overwrite_partitions("weather_raw", new)
    version = second[0].version
    assert version == first[0].version + 1
    for d in days:
        assert _scan(lk, version, "gulf_coast", d).column("wind_gust_ms").to_pylist() == [9.0, 10.0]
    assert _scan(lk, version, "pine_belt", "2026-09-01").num_rows == 7
    # Later attempts of the same checkpoints: the one partition whose commit is there is
    # recognised, the others are written, in a commit of their own.
    again = lk.overwrite_partitions("weather_raw", [
        PartitionWrite("gulf_coast", days[0], new[0].data, 31, 20),
        PartitionWrite("gulf_coast", "2026-09-04", _rows("gulf_coast", "2026-09-04", 3, 1.0), 32, 32),
    ])
    assert not again[0].written and again[0].version == version and again[0].files == second[0].files
    assert again[1].written and again[1].version == version + 1
    with pytest.raises(LakeError, match="named twice"):
        lk.overwrite_partitions("weather_raw", [new[0], new[0]])


def test_the_process_cache_keeps_a_partition_until_its_last_reader(lk: Lake) -> None:
    data = _rows("gulf_coast", "2026-09-01", 10, 5.0)
    kept = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", data, seq=1, first_seq=1)
    key = (lk.uri("weather_raw"), "gulf_coast", "2026-09-01", kept.version)
    assert key in lk.cache
    first = lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=kept.version)
    assert first is lk.cache.take(key, last_use=False)  # served from memory, still there for a later reader
    last = lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=kept.version, last_use=True)
    assert last is first and key not in lk.cache and lk.cache.nbytes == 0
    # A table no later phase reads is not kept; a last read from the files is not kept either.
    other = lk.overwrite_partition("weather_raw", "pine_belt", "2026-09-01", _rows("pine_belt", "2026-09-01", 5, 1.0),
                                   seq=2, first_seq=2, keep=False)
    assert not lk.cache.nbytes
    again = lk.read_partition("weather_raw", "pine_belt", "2026-09-01", version=other.version, last_use=True)
    assert again.num_rows == 5 and not lk.cache.nbytes


def test_every_table_a_phase_reads_is_written_by_an_earlier_phase() -> None:
    from assets.phases import LAST_READER, PHASES

    order = {p.name: i for i, p in enumerate(PHASES)}
    for phase in PHASES:
        for table in phase.input_tables:
            owner = TABLE_PHASE[table]
            assert order[owner] < order[phase.name] and owner in phase.upstream_phases, (phase.name, table)
    assert LAST_READER == {"outages_raw": "enrich", "weather_raw": "correlate", "terrain_ref": "correlate",
                           "customers_ref": "present", "outages_enriched": "present",
                           "cell_hour_stats": "present", "cell_risk": "present", "storm_clusters": "present"}


def test_a_prefetched_partition_is_read_once_in_the_background(lk: Lake) -> None:
    w = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", _rows("gulf_coast", "2026-09-01", 20, 2.0),
                               seq=1, first_seq=1, keep=False)
    assert not lk.cache.nbytes
    lk.prefetch("weather_raw", "gulf_coast", "2026-09-01", version=w.version)
    lk.prefetch("weather_raw", "gulf_coast", "2026-09-01", version=w.version)  # already in flight: nothing more
    assert lk.cache.reads_in_flight <= 1
    got = lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=w.version)  # waits for it
    assert got.equals(_scan(lk, w.version, "gulf_coast", "2026-09-01"))
    assert not lk.cache.reads_in_flight
    key = (lk.uri("weather_raw"), "gulf_coast", "2026-09-01", w.version)
    assert lk.cache.take(key, last_use=False) is got
    # A prefetch of a version that does not exist fails in the background; the read says why.
    lk.prefetch("weather_raw", "gulf_coast", "2026-09-01", version=w.version + 5)
    with pytest.raises(LakeError, match="version"):
        lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=w.version + 5)
    assert not lk.cache.reads_in_flight


def test_a_column_of_a_newer_schema_version_is_added_to_the_stored_table(tmp_path: Path) -> None:
    """A phase's schema bump that adds a column writes into a table made at the older version:
    the column is added (nullable), older partitions read it as null, new writes carry it."""
    old_schema = pa.schema([f for f in SCHEMA if f.name != "pressure_hpa"])
    root = str(tmp_path / "lake")
    old = Lake(root, {**SCHEMAS, "weather_raw": old_schema}, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    v1 = old.overwrite_partition("weather_raw", "pine_belt", "2026-09-01",
                                 _rows("pine_belt", "2026-09-01", 5, 1.0).select(old_schema.names).cast(old_schema),
                                 seq=1, first_seq=1)
    new = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    v2 = new.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", _rows("gulf_coast", "2026-09-01", 4, 2.0),
                                 seq=2, first_seq=2)
    assert v2.written and v2.version > v1.version
    stored = {f.name: f.nullable for f in new.table("weather_raw").schema().fields}
    assert stored["pressure_hpa"] is True
    assert new.read_partition("weather_raw", "pine_belt", "2026-09-01", version=v2.version).column(
        "pressure_hpa").null_count == 5
    assert new.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=v2.version).column(
        "pressure_hpa").to_pylist() == [1000.0, 999.0, 998.0, 997.0]


def _snapshot_rows(lk: Lake, table: str, version: int) -> int:
    """The reference count: deltalake's own dataset at that version, read whole."""
    return lk.table(table, version).to_pyarrow_dataset().count_rows()


def test_the_row_count_follows_the_log_and_equals_the_tables_rows_at_every_version(tmp_path: Path) -> None:
    """Counts moved forward commit by commit (overwrites, a column added by a newer schema, a
    table written by another process) equal the rows of the table at each version, and so do
    counts asked again for earlier versions (a skip) or by a process that counts later."""
    root = str(tmp_path / "lake")
    old_schema = pa.schema([f for f in SCHEMA if f.name != "pressure_hpa"])
    old = Lake(root, {**SCHEMAS, "weather_raw": old_schema}, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    lk = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    other = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    versions = []
    writes = [(old, "pine_belt", 5), (old, "red_hills", 7), (lk, "gulf_coast", 50), (other, "pine_belt", 3),
              (lk, "gulf_coast", 40), (other, "gulf_coast", 2)]
    for seq, (writer, region, n) in enumerate(writes, 1):
        schema = writer.schemas["weather_raw"]
        data = _rows(region, "2026-09-01", n, 1.0).select(schema.names).cast(schema)
        versions.append(writer.overwrite_partition("weather_raw", region, "2026-09-01", data, seq=seq, first_seq=seq).version)
        assert lk.row_count("weather_raw", versions[-1]) == _snapshot_rows(lk, "weather_raw", versions[-1])
    every = range(0, versions[-1] + 1)  # the column added by lk's first write is a commit of its own
    assert [lk.row_count("weather_raw", v) for v in every] == [_snapshot_rows(lk, "weather_raw", v) for v in every]
    assert lk.row_count("weather_raw", versions[-1]) == 3 + 7 + 2  # pine_belt and gulf_coast overwritten
    fresh = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    assert fresh.row_count("weather_raw", versions[2]) == 5 + 7 + 50


def test_a_version_this_process_committed_is_counted_without_loading_the_table(lk: Lake) -> None:
    """The rows at a version this process committed are summed as it commits, another writer's
    commits before it included: asked after the write handle has moved on (a range run's
    materializations), the count loads no snapshot and follows no log."""
    def write(writer: Lake, region: str, n: int, seq: int) -> int:
        data = _rows(region, "2026-09-01", n, 1.0)
        return writer.overwrite_partition("weather_raw", region, "2026-09-01", data, seq=seq, first_seq=seq).version

    other = Lake(lk.root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    mine = [write(lk, "gulf_coast", 9, 1), write(lk, "pine_belt", 4, 2)]
    write(other, "red_hills", 7, 3)
    mine.append(write(lk, "gulf_coast", 5, 4))
    assert [lk.row_count("weather_raw", v) for v in mine] == [9, 13, 5 + 4 + 7]
    assert not lk._count_handles and not lk._counts  # noqa: SLF001 - nothing loaded or followed to count
    assert [lk.row_count("weather_raw", v) for v in mine] == [_snapshot_rows(lk, "weather_raw", v) for v in mine]


def test_a_commit_without_file_statistics_gives_no_row_count(lk: Lake) -> None:
    """An add action without ``numRecords`` (another writer that keeps no statistics) leaves the
    count unknown, as counting only the other files would give a short one."""
    first = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", _rows("gulf_coast", "2026-09-01", 9, 1.0),
                                   seq=1, first_seq=1)
    assert lk.row_count("weather_raw", first.version) == 9
    other = Lake(lk.root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())  # the other writer
    second = other.overwrite_partition("weather_raw", "pine_belt", "2026-09-01", _rows("pine_belt", "2026-09-01", 4, 1.0),
                                       seq=2, first_seq=2)
    commit = Path(lk.uri("weather_raw")) / "_delta_log" / f"{second.version:020d}.json"
    lines = commit.read_text().splitlines()
    stripped = []
    for line in lines:
        action = json.loads(line)
        if "add" in action:
            action["add"].pop("stats", None)
        stripped.append(json.dumps(action))
    commit.write_text("\n".join(stripped) + "\n")
    assert lk.row_count("weather_raw", second.version) is None
    again = Lake(lk.root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    assert again.row_count("weather_raw", second.version) is None
    assert again.row_count("weather_raw", first.version) == 9


def test_a_write_handle_sees_another_processs_commits_before_it_writes(tmp_path: Path) -> None:
    """Two writers of one table, each keeping its handle: every write lands on the latest version,
    with the other's partitions intact, and a handle with nothing new is not reloaded."""
    root = str(tmp_path / "lake")
    a = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    b = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    w1 = a.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", _rows("gulf_coast", "2026-09-01", 6, 1.0),
                               seq=1, first_seq=1)
    w2 = b.overwrite_partition("weather_raw", "pine_belt", "2026-09-01", _rows("pine_belt", "2026-09-01", 4, 1.0),
                               seq=2, first_seq=2)
    w3 = a.overwrite_partition("weather_raw", "red_hills", "2026-09-01", _rows("red_hills", "2026-09-01", 3, 1.0),
                               seq=3, first_seq=3)
    assert w1.version < w2.version < w3.version == latest_version(a, "weather_raw")
    handle = a._write_handles[a.uri("weather_raw")]
    assert handle.version() == w3.version
    assert a.read_partition("weather_raw", "pine_belt", "2026-09-01", version=w3.version).num_rows == 4
    assert _snapshot_rows(a, "weather_raw", w3.version) == 6 + 4 + 3
    assert a._latest("weather_raw") is handle and handle.version() == w3.version  # nothing new: kept as it is


def test_a_pinned_read_by_the_recorded_files_outlives_the_logs_cleanup(lk: Lake) -> None:
    from deltalake import DeltaTable

    first = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01",
                                   _rows("gulf_coast", "2026-09-01", 12, 1.0), seq=1, first_seq=1, keep=False)
    assert first.files and all(f.startswith("region_id=gulf_coast/day=2026-09-01/") for f in first.files)
    for n in range(2, 6):  # later commits of other partitions and a rewrite of this one
        region = "pine_belt" if n % 2 else "gulf_coast"
        lk.overwrite_partition("weather_raw", region, "2026-09-01", _rows(region, "2026-09-01", n, 10.0 * n),
                               seq=n, first_seq=n, keep=False)
    uri = lk.uri("weather_raw")
    dt = DeltaTable(uri)
    assert dt.metadata().configuration["delta.logRetentionDuration"] == "interval 2 minutes"  # the default
    # What delta-rs does at a checkpoint once the commits are older than the retention.
    dt.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    dt = DeltaTable(uri)
    dt.create_checkpoint()
    dt.cleanup_metadata()
    with pytest.raises(LakeError):  # the version itself can no longer be loaded ...
        lk.table("weather_raw", first.version)
    # ... but the partition as that commit left it is read from its files
    got = lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=first.version, files=first.files)
    assert got.equals(_rows("gulf_coast", "2026-09-01", 12, 1.0))


def test_an_older_table_gets_the_lakes_properties_at_its_first_write(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    uri = str(tmp_path / "lake" / "weather_raw")
    DeltaTable.create(uri, SCHEMA, partition_by=PARTITION_COLUMNS)  # as an earlier release made it
    assert "delta.logRetentionDuration" not in DeltaTable(uri).metadata().configuration
    for minutes in (2, 30):  # then an operator sets STORMLAKE_LAKE_LOG_RETENTION_MINUTES=30
        lk = Lake(str(tmp_path / "lake"), SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache(),
                  log_retention_minutes=minutes)
        res = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01",
                                     _rows("gulf_coast", "2026-09-01", 3, 1.0), seq=minutes, first_seq=minutes)
        assert res.written
        got = DeltaTable(uri).metadata().configuration.get("delta.logRetentionDuration")
        assert got == f"interval {minutes} minutes" == lk.configuration["delta.logRetentionDuration"]


def test_a_write_records_its_row_count_and_no_column_statistics(tmp_path: Path) -> None:
    """A commit's cost grows with the statistics of every live file of the table: the lake's data
    files carry their row count only, which the row count and the pinned reads need, and an older
    table (made with every column's statistics) gets the property at a process's first write."""
    from deltalake import DeltaTable, write_deltalake

    uri = str(tmp_path / "lake" / "weather_raw")
    write_deltalake(uri, _rows("pine_belt", "2026-09-01", 4, 1.0), partition_by=PARTITION_COLUMNS)  # an older table
    old_add = next(a for a in _log_actions(uri, 0) if "add" in a)["add"]
    assert json.loads(old_add["stats"])["minValues"]  # what delta-rs writes by default
    lk = Lake(str(tmp_path / "lake"), SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())

    res = lk.overwrite_partition("weather_raw", "gulf_coast", "2026-09-01", _rows("gulf_coast", "2026-09-01", 7, 1.0),
                                 seq=1, first_seq=1)

    assert DeltaTable(uri).metadata().configuration["delta.dataSkippingNumIndexedCols"] == "0"
    (add,) = [a["add"] for a in _log_actions(uri, res.version) if "add" in a]
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 7
    assert not stats.get("minValues") and not stats.get("maxValues") and not stats.get("nullCount")
    assert lk.row_count("weather_raw", res.version) == 4 + 7
    assert lk.read_partition("weather_raw", "gulf_coast", "2026-09-01", version=res.version,
                             files=res.files).equals(_rows("gulf_coast", "2026-09-01", 7, 1.0))


def _log_actions(uri: str, version: int) -> list[dict]:
    path = Path(uri) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_at_once_keeps_the_order_and_hands_back_each_failure() -> None:
    import threading

    from resources.lake import at_once

    seen: set[int] = set()
    barrier = threading.Barrier(3, timeout=30)

    def call(n: int) -> int:
        barrier.wait()  # all three run at the same time, or this times out
        seen.add(threading.get_ident())
        if n == 1:
            raise LakeError("the second write failed")
        return n * 10

    out = at_once([lambda n=n: call(n) for n in range(3)])
    assert out[0] == 0 and out[2] == 20 and isinstance(out[1], LakeError)
    assert len(seen) == 3


def _write_days(root: str, region: str, days: int, first_seq: int, out, batch: int = 1) -> None:  # noqa: ANN001 - a Queue
    """One writer process: ``days`` partitions of ``region``, each partition's five tables at once;
    ``batch`` partitions a write (:meth:`Lake.overwrite_partitions`) when more than one."""
    from resources.lake import PartitionWrite, at_once

    lk = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
    tables = ["weather_raw", "outages_raw", "customers_ref", "terrain_ref", "quarantine"]
    results = []
    for start in range(0, days, batch):
        group = [(f"2026-09-{i + 1:02d}", first_seq + 2 * i, i) for i in range(start, min(days, start + batch))]

        def rows(t: str, day: str, i: int) -> pa.Table:
            return _rows(region, day, 3, float(i)) if t == "weather_raw" else SCHEMAS[t].empty_table()

        writes = [partial(lk.overwrite_partitions, t, [PartitionWrite(region, day, rows(t, day, i), seq, seq)
                                                      for day, seq, i in group], keep=False)
                  for t in tables]
        for table, res in zip(tables, at_once(writes), strict=True):
            if isinstance(res, BaseException):
                raise res
            results.extend((table, region, day, seq, r.version, r.files) for (day, seq, _), r in zip(group, res, strict=True))
    out.put(results)


@pytest.mark.parametrize("batch", [1, 4])
def test_two_processes_writing_the_same_tables_each_get_their_own_commits_version_and_files(tmp_path: Path,
                                                                                           batch: int) -> None:
    """Each write's version is the commit that carries its app transaction, and its files are that
    partition's, while another process commits to the same tables between and during its writes;
    also when each commit writes four partitions at once."""
    import multiprocessing

    from resources.lake import _read_commit, app_id

    root = str(tmp_path / "lake")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_write_days, args=(root, region, 28, n, out, batch))
             for n, region in enumerate(("gulf_coast", "pine_belt"), 1)]
    for p in procs:
        p.start()
    results = [row for _ in procs for row in out.get(timeout=600)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(results) == 2 * 28 * 5
    for table, region, day, seq, version, files in results:
        commit = _read_commit(f"{root}/{table}", version)
        assert commit is not None and commit.made_by(app_id(table, region, day), seq), (table, region, day, version)
        if table == "weather_raw":
            assert files and all(f.startswith(f"region_id={region}/day={day}/") for f in files), files
    if batch > 1:  # four partitions a commit: every table ends with each partition's rows once
        lk = Lake(root, SCHEMAS, partition_by=PARTITION_COLUMNS, cache=PartitionCache())
        assert lk.table("weather_raw").to_pyarrow_dataset().count_rows() == 2 * 28 * 3
        assert len({v for t, *_, v, _f in results if t == "weather_raw"}) == 2 * 28 // batch
