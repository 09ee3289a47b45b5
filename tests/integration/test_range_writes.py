"""A range step's small partitions: their tables written together, each partition still on its own.

Real Delta tables, the real ledger, the phases' real compute; the runner driven directly, as a
range step drives it (``assets.materialize._run_step``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pyarrow.dataset as pads
import pytest

from assets import enrich, ingest
from assets.context import PartitionRef, pinned_files
from assets.materialize import build_runner
from assets.phases import ENRICH, INGEST
from assets.runner import Force, Outcome, PhaseRunner
from resources.errors import InjectedFault
from resources.ledger import Ledger
from tests.ledger_sql import advisory_locks, query

REPO = Path(__file__).resolve().parents[2]
KEYS = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]


@pytest.fixture
def runner(sl_env: dict[str, str]) -> Iterator[PhaseRunner]:
    from pipeline.definitions import build_resources

    with dg.build_resources(dict(build_resources())) as res:
        yield build_runner(None, ledger=res.ledger, lake=res.lake, landing=res.landing, publisher=res.publisher)


def _parts(runner: PhaseRunner) -> list[PartitionRef]:
    return [PartitionRef.parse(k, runner.regions) for k in KEYS]


def _commits(runner: PhaseRunner, table: str) -> int:
    """The table's commits that wrote partitions (its creation left out)."""
    return runner.lake.table(table).version()


def _assert_each_partition_holds_what_it_computed(runner: PhaseRunner, outcomes: list[Outcome]) -> None:
    """Every partition's rows in each table, read from the files its checkpoint pinned, are the
    rows Delta itself reads for the partition at that version, as many as it recorded: the write
    together put each partition's own rows under its name."""
    for o in outcomes:
        part = PartitionRef.parse(o.partition_key, runner.regions)
        summary = o.checkpoint.summary or {}
        for table, version in summary["delta_versions"].items():
            runner.lake.cache.clear()
            files = pinned_files(summary, table, part)
            got = runner.lake.read_partition(table, part.region.region_id, part.day, version=version, files=files)
            flt = (pads.field("region_id") == part.region.region_id) & (pads.field("day") == part.day)
            scan = runner.lake.table(table, version).to_pyarrow_dataset().to_table(filter=flt)
            assert got.num_rows == scan.num_rows == summary["rows"][table], (o.partition_key, table)
            assert got.sort_by("source_line" if "source_line" in got.column_names else got.column_names[0]).equals(
                scan.cast(got.schema).sort_by("source_line" if "source_line" in got.column_names
                                              else got.column_names[0])), (o.partition_key, table)


def test_a_range_writes_each_table_once_and_every_partition_gets_its_own_rows(runner: PhaseRunner) -> None:
    results = runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)
    assert [k for k, _ in results] == KEYS
    outcomes = [r for _, r in results]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in outcomes), outcomes
    for table in INGEST.tables:  # one commit a table for the four partitions
        assert _commits(runner, table) == 1, table
        assert {o.checkpoint.summary["delta_versions"][table] for o in outcomes} == {1}
        assert all(o.checkpoint.summary["delta_written"][table] for o in outcomes)
    _assert_each_partition_holds_what_it_computed(runner, outcomes)
    # The first partition is claimed alone (its size unknown); once it is known to be small, the
    # others are claimed together, in one transaction (their PENDING events share its time).
    claimed = query(runner.ledger, "SELECT partition_key, at FROM checkpoint_events WHERE status = 'PENDING'"
                                   " ORDER BY event_id")
    assert [c["partition_key"] for c in claimed] == KEYS
    assert claimed[0]["at"] < claimed[1]["at"] and len({c["at"] for c in claimed[1:]}) == 1
    # The four partitions' writes are recorded in one statement (their records share its time),
    # each as a call of its own attempt, in the checkpoint it commits.
    records = query(runner.ledger, "SELECT c.partition_key, r.name, r.seq = c.seq AS own, r.recorded_at"
                                   " FROM recorded_calls r JOIN checkpoints c ON c.id = r.checkpoint_id"
                                   " WHERE r.kind = 'delta_commit'")
    assert sorted((r["partition_key"], r["name"]) for r in records) == sorted(
        (k, t) for k in KEYS for t in INGEST.tables)
    assert all(r["own"] for r in records) and len({r["recorded_at"] for r in records}) == 1
    assert [sorted(c["name"] for c in o.checkpoint.calls) for o in outcomes] == [sorted(INGEST.tables)] * 4
    enriched = [r for _, r in runner.run_range(ENRICH, _parts(runner), enrich.compute, enrich.grade)]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in enriched), enriched
    assert _commits(runner, "outages_enriched") == 1
    _assert_each_partition_holds_what_it_computed(runner, enriched)
    # Run again: every partition skips, nothing is written.
    again = [r for _, r in runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)]
    assert [o.status for o in again] == ["SKIPPED"] * 4
    assert all(_commits(runner, t) == 1 for t in INGEST.tables)


def test_a_partition_that_fails_fails_alone_and_the_others_are_written_together(
        runner: PhaseRunner, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORMLAKE_FAULTS", f"ingest.mid_transform@{KEYS[1]}=raise")
    results = dict(runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade))
    assert isinstance(results[KEYS[1]], InjectedFault)
    done = [results[k] for k in KEYS if k != KEYS[1]]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in done)
    assert all(_commits(runner, t) == 1 for t in INGEST.tables)  # the three others in one commit
    assert ledger.head(KEYS[1], "ingest").status == "FAILED"
    monkeypatch.delenv("STORMLAKE_FAULTS")
    retried = dict(runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade))
    assert [retried[k].status for k in KEYS] == ["COMPLETED" if k == KEYS[1] else "SKIPPED" for k in KEYS]
    assert all(_commits(runner, t) == 2 for t in INGEST.tables)


_CRASH = """
import dagster as dg
from assets import ingest
from assets.context import PartitionRef
from assets.materialize import build_runner
from assets.phases import INGEST
from pipeline.definitions import build_resources
with dg.build_resources(dict(build_resources())) as res:
    r = build_runner(None, ledger=res.ledger, lake=res.lake, landing=res.landing, publisher=res.publisher)
    r.run_range(INGEST, [PartitionRef.parse(k, r.regions) for k in {keys!r}], ingest.compute, ingest.grade)
"""


@pytest.mark.parametrize(("point", "recorded"), [("after_write", 0), ("after_call", len(KEYS) * len(INGEST.tables))])
def test_a_process_killed_after_the_write_together_is_resumed_without_writing_again(
        runner: PhaseRunner, ledger: Ledger, sl_env: dict[str, str], point: str, recorded: int) -> None:
    """Killed once the four partitions' tables are written together, before any checkpoint
    commits: every partition's rows are in the tables. Killed before the records
    (``after_write``), the next run recognises each partition's commit by its app transaction;
    killed once they are recorded (one statement for the four partitions, ``after_call``), it
    answers each write from its record. Either way it writes nothing again."""
    env = {**os.environ, **sl_env, "STORMLAKE_FAULTS": f"ingest.{point}@{KEYS[0]}=exit"}
    proc = subprocess.run([sys.executable, "-c", _CRASH.format(keys=KEYS)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 137, proc.stderr[-2000:]
    assert all(_commits(runner, t) == 1 for t in INGEST.tables)
    assert {ledger.head(k, "ingest").status for k in KEYS} == {"PENDING"}
    assert query(ledger, "SELECT count(*) AS n FROM recorded_calls")[0]["n"] == recorded
    results = [r for _, r in runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in results), results
    assert all(_commits(runner, t) == 1 for t in INGEST.tables)  # nothing written twice
    for o in results:
        assert o.checkpoint.attempt == 2
        assert not any(o.checkpoint.summary["delta_written"].values()), o.partition_key
    _assert_each_partition_holds_what_it_computed(runner, results)


def test_a_lease_held_elsewhere_is_waited_for_only_after_the_partitions_held_are_finished(
        runner: PhaseRunner, ledger: Ledger, pg_dsn: str) -> None:
    """Another run holds the third partition's lease until it sees the first two COMPLETED: a
    runner that waited for it while holding theirs (uncommitted) would wait for ever."""
    other = Ledger(pg_dsn)
    held, seen = threading.Event(), threading.Event()

    def hold() -> None:
        with other.lease(KEYS[2], "ingest", timeout_s=60):
            held.set()
            while not (seen.is_set() or done.is_set()):
                heads = [ledger.head(k, "ingest") for k in KEYS[:2]]
                if all(h is not None and h.status == "COMPLETED" for h in heads):
                    seen.set()
                time.sleep(0.05)

    done = threading.Event()
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(60)
        runner.lease_timeout_s = 120.0  # the failure this test guards against: a wait till then
        results = [r for _, r in runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)]
    finally:
        done.set()
        holder.join()
        other.close()
    assert seen.is_set()
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in results), results
    # The first two partitions were written before the wait, the last two together after it.
    assert all(_commits(runner, t) == 2 for t in INGEST.tables)


def test_stormlake_write_together_sets_how_many_partitions_share_a_commit(
        sl_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.definitions import build_resources

    for setting, commits in (("1", 4), ("3", 2)):  # each alone; three, then the fourth
        monkeypatch.setenv("STORMLAKE_WRITE_TOGETHER", setting)
        with dg.build_resources(dict(build_resources())) as res:
            r = build_runner(None, ledger=res.ledger, lake=res.lake, landing=res.landing, publisher=res.publisher)
            assert r.write_together == int(setting)
            r.force = Force("ingest", "test", "pytest", f"write-together-{setting}")  # computed again each time
            results = [o for _, o in r.run_range(INGEST, _parts(r), ingest.compute, ingest.grade)]
            assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in results), results
            before = 0 if setting == "1" else 4
            assert all(_commits(r, t) == before + commits for t in INGEST.tables), setting


def test_a_bug_in_one_partition_is_raised_after_the_partitions_held_are_finished(
        runner: PhaseRunner, ledger: Ledger) -> None:
    def compute(ctx):  # noqa: ANN001, ANN202 - a phase's compute with a bug for one partition
        if ctx.partition.key == KEYS[2]:
            raise ValueError("a bug")
        return ingest.compute(ctx)

    with pytest.raises(ValueError, match="a bug"):
        runner.run_range(INGEST, _parts(runner), compute, ingest.grade)
    heads = {k: ledger.head(k, "ingest") for k in KEYS}
    assert [heads[k].status for k in KEYS[:3]] == ["COMPLETED", "COMPLETED", "FAILED"], heads
    assert heads[KEYS[2]].error_class == "ValueError"
    # Claimed with the third, never computed: let go, FAILED without counting toward a dead letter.
    assert (heads[KEYS[3]].status, heads[KEYS[3]].error_class, heads[KEYS[3]].failures) == (
        "FAILED", "RangeAbandoned", 0)
    assert all(_commits(runner, t) == 1 for t in INGEST.tables)  # the two held, together
    assert advisory_locks(ledger) == 0
    # The next run takes it over and finishes it.
    again = dict(runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade))
    assert again[KEYS[3]].status == "COMPLETED" and again[KEYS[3]].checkpoint.attempt == 2
    assert advisory_locks(ledger) == 0


def test_a_partition_whose_lease_cannot_be_taken_fails_with_the_error_not_silently(runner: PhaseRunner) -> None:
    """The ledger takes no new session (here: the database refuses connections, and the lease
    session kept from the range before was ended by the server) while the connections already
    open still answer: the partition whose lease could not be taken ends with the transient
    error, which fails the step for Dagster's retry, instead of ending the range with no result
    and no error (which the step took for success with fewer partitions than keys)."""
    import psycopg

    from resources.errors import LedgerUnavailable
    from resources.pgserver import with_database

    parts = _parts(runner)
    first = runner.run_range(INGEST, parts[:2], ingest.compute, ingest.grade)
    assert [o.status for _, o in first] == ["COMPLETED", "COMPLETED"]
    kept = [c.info.backend_pid for c in runner.ledger._lease_conns]
    db = psycopg.conninfo.conninfo_to_dict(runner.ledger.dsn)["dbname"]
    with psycopg.connect(with_database(runner.ledger.dsn, "postgres"), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        try:
            for pid in kept:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            results = runner.run_range(INGEST, parts[2:], ingest.compute, ingest.grade)
        finally:
            admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    assert [k for k, _ in results] == [KEYS[2]]  # the first of the range; the range ended there
    assert isinstance(results[0][1], LedgerUnavailable) and results[0][1].transient
    assert advisory_locks(runner.ledger) == 0


def test_a_second_interrupt_while_the_flush_in_flight_is_waited_for_still_lets_the_held_ones_go(
        runner: PhaseRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C, then Ctrl-C again while the step waits for the flush in flight: the partition held
    for the next flush is let go all the same (recorded FAILED, its lease free) while the
    traceback is still alive, and the flush in flight finishes its own partitions."""
    runner.write_together = 2  # the first two flushed behind while the third computes
    parts = _parts(runner)

    def second_interrupt() -> None:
        raise KeyboardInterrupt("the second Ctrl-C, while waiting for the flush in flight")

    def compute(ctx):  # noqa: ANN001, ANN202
        if ctx.partition.key == KEYS[3]:
            monkeypatch.setattr(runner, "_settle_behind", second_interrupt)
            raise KeyboardInterrupt("the first Ctrl-C")
        return ingest.compute(ctx)

    with pytest.raises(KeyboardInterrupt, match="second") as raised:
        runner.run_range(INGEST, parts, compute, ingest.grade)
    assert runner._behind is not None
    runner._behind.result()  # the flush the step did not wait for, finished
    heads = {k: runner.ledger.head(k, "ingest") for k in KEYS}
    assert [heads[k].status for k in KEYS[:2]] == ["COMPLETED", "COMPLETED"]
    assert (heads[KEYS[2]].status, heads[KEYS[2]].error_class) == ("FAILED", "RangeAbandoned")
    assert advisory_locks(runner.ledger) == 0
    assert raised.value is not None  # the traceback (and the step's frames) still alive


def test_an_interrupt_while_writing_together_lets_every_lease_go(
        runner: PhaseRunner, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_write_together", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)
    assert advisory_locks(ledger) == 0
    heads = [ledger.head(k, "ingest") for k in KEYS]
    assert {(h.status, h.error_class) for h in heads} == {("FAILED", "RangeAbandoned")}
    assert {h.failures for h in heads} == {0}  # not counted toward a dead letter
    monkeypatch.undo()
    again = [r for _, r in runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in again), again


def test_a_table_whose_write_together_fails_is_written_by_each_partition_alone(
        runner: PhaseRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    from resources.errors import LakeError

    together = runner.lake.overwrite_partitions

    def weather_fails(table: str, writes, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if table == "weather_raw" and len(writes) > 1:
            raise LakeError("weather_raw: the write together failed")
        return together(table, writes, **kwargs)

    monkeypatch.setattr(runner.lake, "overwrite_partitions", weather_fails)
    results = [r for _, r in runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in results), results
    assert {t: _commits(runner, t) for t in INGEST.tables} == {t: 4 if t == "weather_raw" else 1 for t in INGEST.tables}
    _assert_each_partition_holds_what_it_computed(runner, results)


def test_a_failed_record_statement_fails_only_the_partitions_that_had_writes_to_record(
        runner: PhaseRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The group's records are one statement; when it fails as a whole, a partition that had
    nothing to record (every write answered from the record) keeps its own outcome."""
    from types import SimpleNamespace

    from assets.context import MadeCalls
    from resources.errors import LedgerUnavailable

    claim = SimpleNamespace(id=1, seq=1, recorded={})
    answered = MadeCalls(SimpleNamespace(claim=claim), "delta_commit", [("t", {"n": 1})], ["k"], {})
    made = MadeCalls(SimpleNamespace(claim=claim), "delta_commit", [("t", {"n": 2})], ["k2"], {0: {"version": 1}})
    down = LedgerUnavailable("ledger unreachable while trying to record 1 calls")

    def record_calls(calls):  # noqa: ANN001, ANN202 - the statement fails as a whole
        assert [c.call_key for c in calls] == ["k2"]
        raise down

    monkeypatch.setattr(runner.ledger, "record_calls", record_calls)
    assert runner._record_writes([(None, answered), (None, made)]) == [None, down]  # type: ignore[list-item]


# ---- the flush behind: a partition finished while the next one computes --------------------
def test_each_partition_is_finished_in_the_flusher_while_the_next_one_computes(
        runner: PhaseRunner, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written one at a time (as big partitions are), a partition's flush (writes, records,
    commit) waits here until the next partition's compute has started: it can only finish if
    the two overlap. The last one is finished on the step's own thread."""
    runner.write_together = 1
    started = {k: threading.Event() for k in KEYS}
    flushes: list[tuple[str, str, bool]] = []  # (partition, thread, whether the next one had started)
    flush = runner._flush

    def compute(ctx):  # noqa: ANN001, ANN202
        started[ctx.partition.key].set()
        return ingest.compute(ctx)

    def watched(held, results):  # noqa: ANN001, ANN202
        if not held:
            return flush(held, results)
        (p,) = held
        i = KEYS.index(p.part.key)
        overlapped = i + 1 < len(KEYS) and started[KEYS[i + 1]].wait(60)
        flushes.append((p.part.key, threading.current_thread().name, overlapped))
        return flush(held, results)

    monkeypatch.setattr(runner, "_flush", watched)
    results = [r for _, r in runner.run_range(INGEST, _parts(runner), compute, ingest.grade)]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in results), results
    assert [(k, t.startswith("stormlake-flush"), o) for k, t, o in flushes] == [
        (KEYS[0], True, True), (KEYS[1], True, True), (KEYS[2], True, True), (KEYS[3], False, False)]
    assert all(_commits(runner, t) == 4 for t in INGEST.tables)
    assert [o.checkpoint.attempt for o in results] == [1] * 4
    _assert_each_partition_holds_what_it_computed(runner, results)
    assert advisory_locks(ledger) == 0


def _run_with_a_bug_in_the_first_commit(runner: PhaseRunner, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the range with a bug in the first partition's commit (made behind, each partition
    flushed alone): the bug is raised by the step; the first partition is FAILED with it, the
    second (computed while the first was flushed) finished, the others never started, no lease
    held."""
    commit = runner._commit

    def broken(p, made, fenced):  # noqa: ANN001, ANN202
        if p.part.key == KEYS[0]:
            raise ValueError("a bug in a flush")
        return commit(p, made, fenced)

    monkeypatch.setattr(runner, "_commit", broken)
    with pytest.raises(ValueError, match="a bug in a flush"):
        runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)
    heads = {k: ledger.head(k, "ingest") for k in KEYS}
    assert (heads[KEYS[0]].status, heads[KEYS[0]].error_class) == ("FAILED", "ValueError")
    assert heads[KEYS[1]].status == "COMPLETED"
    assert heads[KEYS[2]] is None and heads[KEYS[3]] is None
    assert advisory_locks(ledger) == 0


def test_a_bug_in_a_flush_behind_is_raised_once_the_partition_computed_meanwhile_is_finished(
        runner: PhaseRunner, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    runner.write_together = 1
    _run_with_a_bug_in_the_first_commit(runner, ledger, monkeypatch)
    monkeypatch.undo()
    again = dict(runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade))
    assert [again[k].status for k in KEYS] == ["COMPLETED", "SKIPPED", "COMPLETED", "COMPLETED"]


def test_a_transient_error_in_a_flush_behind_ends_the_range_after_the_partition_computed_meanwhile(
        runner: PhaseRunner, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    from resources.errors import LedgerUnavailable

    runner.write_together = 1
    complete_all = ledger.complete_all
    calls = []

    def down_once(items, run_id):  # noqa: ANN001, ANN202 - the ledger gone for the first commit
        calls.append([c.checkpoint.partition_key for c, *_ in items])
        if len(calls) == 1:
            raise LedgerUnavailable("ledger unreachable while trying to commit (test)")
        return complete_all(items, run_id)

    monkeypatch.setattr(runner.ledger, "complete_all", down_once)
    results = dict(runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade))
    assert list(results) == KEYS[:2]
    assert isinstance(results[KEYS[0]], LedgerUnavailable) and results[KEYS[0]].transient
    assert isinstance(results[KEYS[1]], Outcome) and results[KEYS[1]].status == "COMPLETED"
    assert calls == [[KEYS[0]], [KEYS[1]]]
    assert ledger.head(KEYS[2], "ingest") is None and ledger.head(KEYS[3], "ingest") is None
    assert advisory_locks(ledger) == 0


@pytest.mark.parametrize("phase_name", ["ingest", "enrich"])
def test_a_table_s_recorded_hash_is_the_hash_of_what_was_written(runner: PhaseRunner, phase_name: str) -> None:
    """The content hash a checkpoint records for a table is taken of the table conformed to its
    schema (the one written), not of the phase's raw output (other columns, pandas metadata)."""
    from assets.hashing import table_hash
    from assets.schemas import SCHEMAS

    if phase_name == "enrich":
        runner.run_range(INGEST, _parts(runner), ingest.compute, ingest.grade)
    phase, mod = (INGEST, ingest) if phase_name == "ingest" else (ENRICH, enrich)
    outputs = {}

    def compute(ctx):  # noqa: ANN001, ANN202 - the phase's own, its output kept
        outputs[ctx.partition.key] = out = mod.compute(ctx)
        return out

    results = [r for _, r in runner.run_range(phase, _parts(runner), compute, mod.grade)]
    assert all(isinstance(o, Outcome) and o.status == "COMPLETED" for o in results), results
    for o in results:
        out = outputs[o.partition_key]
        for table in phase.tables:
            assert out.tables[table].schema == SCHEMAS[table], (o.partition_key, table)  # conformed: written so
            assert o.table_hashes[table] == table_hash(out.tables[table]), (o.partition_key, table)


def test_a_big_partition_computed_while_a_flush_behind_fails_with_a_bug_is_finished_not_lost(
        runner: PhaseRunner, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition counts as big (written alone): the second is computed while the first's
    flush runs behind, and that flush raises a bug. The second is then finished by the step's
    error path (committed, its lease let go), not left claimed."""
    import assets.runner as runner_module

    monkeypatch.setattr(runner_module, "RANGE_WRITE_ROWS", 1)
    _run_with_a_bug_in_the_first_commit(runner, ledger, monkeypatch)
