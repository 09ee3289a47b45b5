"""The ledger's own guarantees, on a real PostgreSQL: fencing, immutability, migrations."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from psycopg import sql

from resources.errors import FencingError, LedgerError
from resources.ledger import CallRecord, Ledger, ReceiptRequest
from resources.ledger_views import LedgerViews
from tests.ledger_sql import advisory_lock_sessions, advisory_locks, query

KEY = "2026-09-01|gulf_coast"
ARGS = dict(partition_key=KEY, region_id="gulf_coast", day="2026-09-01", phase="correlate",
            input_hash="h1", schema_version=1, code_version="1", run_id="r")


def test_a_writer_whose_lease_was_taken_over_cannot_commit(ledger: Ledger) -> None:
    first = ledger.claim(**ARGS).claim
    # The first attempt lost its lease (its process hung, say); a newer attempt claims the phase.
    second = ledger.claim(**ARGS).claim
    assert first is not None and second is not None
    assert second.seq > first.seq and second.checkpoint.attempt == 2
    with pytest.raises(FencingError):
        ledger.record_call(first, call_key="k", kind="delta_commit", name="t", input={}, output={})
    with pytest.raises(FencingError):
        ledger.complete(first, state_hash="late", summary={}, tier=3, tier_label="correlated", run_id="r")
    done = ledger.complete(second, state_hash="s2", summary={}, tier=3, tier_label="correlated", run_id="r")
    assert done.status == "COMPLETED" and done.state_hash == "s2"
    # The late writer cannot record a failure over the completed checkpoint either.
    assert ledger.fail(first, error_class="X", error_message="late", run_id="r") is False
    assert ledger.head(KEY, "correlate").state_hash == "s2"


def test_attempts_claimed_together_are_decided_as_each_alone(ledger: Ledger) -> None:
    """``claim_all`` decides each pair as ``claim`` would, in one transaction: a new partition
    gets a new attempt, a COMPLETED head on the same inputs a skip, a FAILED attempt of the same
    work is taken over (its recorded calls kept), a head on other inputs is superseded."""
    def args(key: str, ih: str) -> dict:
        return {**ARGS, "partition_key": key, "region_id": key.split("|")[1], "input_hash": ih}

    new, same, failed, other = (f"2026-09-0{d}|gulf_coast" for d in (1, 2, 3, 4))
    done = ledger.claim(**args(same, "h1")).claim
    ledger.complete(done, state_hash="s", summary={}, tier=3, tier_label="correlated", run_id="r")
    broken = ledger.claim(**args(failed, "h1")).claim
    ledger.record_call(broken, call_key="delta_commit:t:1", kind="delta_commit", name="t", input={}, output={"v": 1})
    ledger.fail(broken, error_class="X", error_message="boom", run_id="r")
    old = ledger.claim(**args(other, "h1")).claim
    ledger.complete(old, state_hash="s", summary={}, tier=3, tier_label="correlated", run_id="r")

    requests = [args(new, "h1"), args(same, "h1"), args(failed, "h1"), args(other, "h2")]
    # A look from the heads read already says what the ledger's own look says.
    for r in requests:
        assert Ledger.look_at(ledger.head(r["partition_key"], "correlate"), partition_key=r["partition_key"],
                              phase="correlate", input_hash=r["input_hash"], schema_version=1) == ledger.look(**r)
    out = ledger.claim_all(requests)
    assert [d.skip for d in out] == [False, True, False, False]
    assert out[1].head.id == done.id and out[1].claim is None
    taken = out[2].claim
    assert taken.id == broken.id and taken.checkpoint.attempt == 2 and taken.seq > broken.seq
    assert taken.recorded == {"delta_commit:t:1": {"v": 1}}
    fresh = [out[0].claim, out[3].claim]
    assert all(c.checkpoint.status == "PENDING" and c.checkpoint.first_seq == c.seq and c.recorded == {}
               for c in fresh)
    assert len({c.seq for c in (*fresh, taken)}) == 3
    assert ledger.head(other, "correlate").id == fresh[1].id  # the old head is superseded
    assert query(ledger, "SELECT superseded_at IS NOT NULL AS s FROM checkpoints WHERE id = %s", (old.id,))[0]["s"]
    events = [(e["partition_key"], e["status"], e["detail"]) for e in query(
        ledger, "SELECT partition_key, status, detail FROM checkpoint_events WHERE run_id = 'r' AND event_id >"
                " (SELECT max(event_id) FROM checkpoint_events WHERE checkpoint_id = %s) ORDER BY event_id", (old.id,))]
    assert events == [(same, "SKIPPED", {}), (failed, "PENDING", {"superseded": None}),
                      (new, "PENDING", {"superseded": None}), (other, "PENDING", {"superseded": old.id})]
    states = {r["partition_key"]: r["status"] for r in query(
        ledger, "SELECT partition_key, phases->'correlate'->>'status' AS status FROM partition_state")}
    assert states == {new: "PENDING", same: "COMPLETED", failed: "PENDING", other: "PENDING"}
    # Each claimed attempt commits as any other.
    for c in (*fresh, taken):
        ledger.complete(c, state_hash="s2", summary={}, tier=3, tier_label="correlated", run_id="r")


def test_calls_recorded_together_are_each_fenced_on_their_own(ledger: Ledger) -> None:
    """``record_calls`` records the calls of several attempts in one statement: each one of an
    attempt that holds its lease (kept in its claim's ``recorded``), a lost lease for the call of
    an attempt that lost it; a repeat after a lost reply records nothing twice."""
    keys = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt"]
    claims = [ledger.claim(**{**ARGS, "partition_key": k, "region_id": k.split("|")[1]}).claim for k in keys]
    assert all(c is not None for c in claims)
    lost = claims[1]
    newer = ledger.claim(**{**ARGS, "partition_key": keys[1], "region_id": "pine_belt"}).claim  # a newer attempt
    assert newer is not None
    calls = [CallRecord(claims[0], "delta_commit:a:1", "delta_commit", "a", {"n": 1}, {"version": 1}),
             CallRecord(lost, "delta_commit:a:1", "delta_commit", "a", {"n": 1}, {"version": 1}),
             CallRecord(claims[0], "delta_commit:b:1", "delta_commit", "b", {"n": 1}, {"version": 2}),
             # the attempt that took over records the same call in the same batch: only it is credited
             CallRecord(newer, "delta_commit:a:1", "delta_commit", "a", {"n": 1}, {"version": 7}),
             # the same call twice in one batch: its last output stands, as two statements would leave it
             CallRecord(claims[0], "delta_commit:b:1", "delta_commit", "b", {"n": 1}, {"version": 3})]
    out = ledger.record_calls(calls)
    assert [o is None for o in out] == [True, False, True, True, True] and isinstance(out[1], FencingError), out
    assert claims[0].recorded == {"delta_commit:a:1": {"version": 1}, "delta_commit:b:1": {"version": 3}}
    assert lost.recorded == {} and newer.recorded == {"delta_commit:a:1": {"version": 7}}
    assert ledger.record_calls(calls[:1]) == [None]  # the same record again: still one row
    rows = query(ledger, "SELECT checkpoint_id, call_key, seq, output FROM recorded_calls ORDER BY checkpoint_id, call_key")
    assert [(r["checkpoint_id"], r["call_key"], r["seq"], r["output"]) for r in rows] == [
        (claims[0].id, "delta_commit:a:1", claims[0].seq, {"version": 1}),
        (claims[0].id, "delta_commit:b:1", claims[0].seq, {"version": 3}),
        (newer.id, "delta_commit:a:1", newer.seq, {"version": 7})]
    with pytest.raises(FencingError, match="lost its lease"):
        ledger.record_call(lost, call_key="deliver:x:1", kind="deliver", name="x", input={}, output={})


def test_a_delivery_is_marked_and_its_call_recorded_in_one_statement(ledger: Ledger) -> None:
    """``mark_delivered`` with the delivery's call: the receipt DELIVERED and the call recorded
    together, in a statement whose commit waits for the WAL flush; an attempt that lost its lease
    gets its receipt marked all the same (the target has the artifact) but its call refused."""
    keys = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt"]
    held, lost = (ledger.claim(**{**ARGS, "partition_key": k, "region_id": k.split("|")[1]}).claim for k in keys)
    assert held is not None and lost is not None
    assert ledger.claim(**{**ARGS, "partition_key": keys[1], "region_id": "pine_belt"}).claim is not None  # takes over
    recs = ledger.prepare_receipts([_request("a" * 16, "summary.json"), _request("b" * 16, "report.html")])
    call = CallRecord(held, "deliver:file:summary.json:1", "deliver", "file:summary.json", {"n": 1}, {"response": {}})
    assert ledger.mark_delivered(recs[0], {"path": "/a"}, records=[call]) == [None]
    assert held.recorded == {call.call_key: {"response": {}}}
    late = CallRecord(lost, "deliver:file:report.html:1", "deliver", "file:report.html", {"n": 1}, {"response": {}})
    (fenced,) = ledger.mark_delivered(recs[1], {"path": "/b"}, records=[late])
    assert isinstance(fenced, FencingError) and lost.recorded == {}
    rows = query(ledger, "SELECT status, response FROM receipts ORDER BY receipt_id")
    assert [(r["status"], r["response"]) for r in rows] == [("DELIVERED", {"path": "/a"}), ("DELIVERED", {"path": "/b"})]
    calls = query(ledger, "SELECT checkpoint_id, call_key FROM recorded_calls")
    assert [(r["checkpoint_id"], r["call_key"]) for r in calls] == [(held.id, call.call_key)]
    # The statement's own setting makes its commit durable; the session's stays as it was.
    assert query(ledger, "SHOW synchronous_commit")[0]["synchronous_commit"] == "off"


def test_checkpoints_committed_together_are_each_fenced_on_their_own(ledger: Ledger) -> None:
    """``complete_all`` commits the attempts that still hold their lease in one statement, each as
    ``complete`` would (its recorded calls, its COMPLETED event, the partition's state), and
    reports a lost lease for the attempt that lost it; a repeat after a lost reply is success."""
    keys = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-01|red_hills"]

    def claim(key: str):  # noqa: ANN202
        c = ledger.claim(**{**ARGS, "partition_key": key, "region_id": key.split("|")[1]}).claim
        assert c is not None
        return c

    claims = [claim(k) for k in keys]
    ledger.record_call(claims[0], call_key="delta_commit:t:1", kind="delta_commit", name="t", input={"n": 1},
                       output={"version": 3})
    newer = claim(keys[1])  # the second attempt lost its lease to a newer one
    items = [(c, f"s-{i}", {"rows": {"t": i}}, 3, "correlated") for i, c in enumerate(claims)]
    out = ledger.complete_all(items, run_id="r")
    assert [type(o).__name__ for o in out] == ["Checkpoint", "FencingError", "Checkpoint"]
    assert "lost its lease" in str(out[1])
    first, third = out[0], out[2]
    assert (first.status, first.state_hash, first.summary, first.tier, first.run_id) == (
        "COMPLETED", "s-0", {"rows": {"t": 0}}, 3, "r")
    assert [c["key"] for c in first.calls] == ["delta_commit:t:1"] and third.calls == []
    assert ledger.head(keys[0], "correlate") == first and ledger.head(keys[2], "correlate") == third
    assert ledger.head(keys[1], "correlate").id == newer.id and ledger.head(keys[1], "correlate").status == "PENDING"
    events = query(ledger, "SELECT partition_key, status FROM checkpoint_events WHERE status = 'COMPLETED'"
                           " ORDER BY event_id")
    assert sorted(e["partition_key"] for e in events) == [keys[0], keys[2]]
    states = {r["partition_key"]: r["status"] for r in query(
        ledger, "SELECT partition_key, phases->'correlate'->>'status' AS status FROM partition_state")}
    assert states == {keys[0]: "COMPLETED", keys[1]: "PENDING", keys[2]: "COMPLETED"}
    # The same statement again (its reply lost): both are found committed, nothing is written twice.
    again = ledger.complete_all([items[0], items[2]], run_id="r")
    assert again == [first, third]
    assert len(query(ledger, "SELECT 1 FROM checkpoint_events WHERE status = 'COMPLETED'")) == 2


def test_a_completed_checkpoint_is_never_overwritten(ledger: Ledger, pg_dsn: str) -> None:
    claim = ledger.claim(**ARGS).claim
    assert claim is not None
    ledger.complete(claim, state_hash="s1", summary={"rows": {}}, tier=3, tier_label="correlated", run_id="r")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
            conn.execute("UPDATE checkpoints SET status = 'FAILED' WHERE partition_key = %s", (KEY,))
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
            conn.execute("DELETE FROM checkpoints WHERE partition_key = %s", (KEY,))
    # The same input hash again is a skip, not a new attempt.
    assert ledger.claim(**ARGS).skip


def test_migrations_rerun_is_a_no_op(ledger: Ledger) -> None:
    version = ledger.schema_version()
    assert version >= 1
    assert ledger.migrate() == []
    assert ledger.schema_version() == version


def test_a_receipt_is_never_downgraded(ledger: Ledger) -> None:
    rec = ledger.prepare_receipt(artifact_id="gulf_coast/2026-09-01/summary.json@0123456789abcdef", target="file",
                                 partition_key=KEY, region_id="gulf_coast", day="2026-09-01", kind="summary.json",
                                 content_hash="0" * 64, size_bytes=1, target_ref="/x", checkpoint_id=None)
    assert rec.status == "PENDING"
    ledger.mark_delivered(rec, {"path": "/x"})
    with pytest.raises(LedgerError):
        query(ledger, "UPDATE receipts SET status = 'PENDING' RETURNING artifact_id")


def _request(artifact: str, kind: str, target: str = "file") -> ReceiptRequest:
    return ReceiptRequest(artifact_id=f"gulf_coast/2026-09-01/{kind}@{artifact}", target=target, partition_key=KEY,
                          region_id="gulf_coast", day="2026-09-01", kind=kind, content_hash="0" * 64, size_bytes=1,
                          target_ref="/x", checkpoint_id=None)


def test_receipts_prepared_together_are_each_decided_as_alone(ledger: Ledger) -> None:
    """``prepare_receipts`` prepares a partition's receipts in one transaction, each as
    ``prepare_receipt`` would: a new slot gets a PENDING receipt; the slot's own artifact again
    gets its receipt as it stands (DELIVERED: nothing to do); another artifact overtakes a
    PENDING one (SUPERSEDED) and names the slot's last delivered revision."""
    first = ledger.prepare_receipts([_request("a" * 16, "summary.json"), _request("b" * 16, "report.html")])
    assert [r.status for r in first] == ["PENDING", "PENDING"] and [r.generation for r in first] == [1, 1]
    assert len({r.created_at for r in first}) == 1  # one transaction
    ledger.mark_delivered(first[0], {"path": "/x"})
    again = ledger.prepare_receipts([_request("a" * 16, "summary.json"), _request("c" * 16, "report.html"),
                                     _request("d" * 16, "cells.geojson")])
    assert again[0] == dataclasses.replace(first[0], status="DELIVERED", response={"path": "/x"},
                                           delivered_at=again[0].delivered_at)
    assert (again[1].status, again[1].supersedes, again[2].status) == ("PENDING", None, "PENDING")
    rows = {r["artifact_id"].split("@")[1]: r["status"] for r in query(ledger, "SELECT artifact_id, status FROM receipts")}
    assert rows == {"a" * 16: "DELIVERED", "b" * 16: "SUPERSEDED", "c" * 16: "PENDING", "d" * 16: "PENDING"}
    # A new revision of the delivered slot names it; going back to it is a new generation.
    (newer,) = ledger.prepare_receipts([_request("e" * 16, "summary.json")])
    assert newer.supersedes == first[0].artifact_id
    ledger.mark_delivered(newer, {"path": "/x"})
    (back,) = ledger.prepare_receipts([_request("a" * 16, "summary.json")])
    assert (back.generation, back.supersedes, back.idempotency_key) == (2, newer.artifact_id, f"{back.artifact_id}#2")


def test_phase_seconds_count_the_time_a_phase_was_in_flight_once(ledger: Ledger) -> None:
    """Partitions claimed together (a range step) have overlapping claim-to-completion spans: the
    bench's phase seconds are the union of the spans, not their sum."""
    def args(key: str) -> dict:
        return {**ARGS, "partition_key": key, "region_id": key.split("|")[1]}

    together = ledger.claim_all([args("2026-09-01|gulf_coast"), args("2026-09-01|pine_belt")])
    for d in together:
        ledger.complete(d.claim, state_hash="s", summary={}, tier=3, tier_label="correlated", run_id="r")
    alone = ledger.claim(**args("2026-09-02|gulf_coast")).claim
    ledger.complete(alone, state_hash="s", summary={}, tier=3, tier_label="correlated", run_id="r")

    rows = query(ledger, "SELECT created_at, completed_at FROM checkpoints WHERE superseded_at IS NULL"
                         " AND phase = 'correlate' ORDER BY created_at, completed_at")
    union, end = 0.0, None
    for r in rows:
        s, e = r["created_at"], r["completed_at"]
        if end is None or s > end:
            union += (e - s).total_seconds()
            end = e
        elif e > end:
            union += (e - end).total_seconds()
            end = e
    summed = sum((r["completed_at"] - r["created_at"]).total_seconds() for r in rows)
    assert rows[0]["created_at"] == rows[1]["created_at"]  # one claim transaction: the spans overlap
    assert union < summed
    assert LedgerViews(ledger).phase_seconds()["correlate"] == pytest.approx(union, abs=1e-6)




def test_leases_taken_together_share_one_session_and_are_let_go_each_on_its_own(ledger: Ledger, pg_dsn: str) -> None:
    keys = [f"2026-09-0{d}|gulf_coast" for d in (1, 2, 3)]
    other = Ledger(pg_dsn)
    try:
        with other.lease(keys[1], "ingest", timeout_s=0):  # held elsewhere
            taken = ledger.try_leases([(k, "ingest") for k in keys])
            assert [t is not None for t in taken] == [True, False, True]
            with taken[0], taken[2]:
                assert advisory_locks(ledger) == 3
                assert len(advisory_lock_sessions(ledger)) == 2  # the group's two leases on one session
                assert other.try_leases([(keys[0], "ingest"), (keys[2], "ingest")]) == [None, None]
        assert advisory_locks(ledger) == 0
        assert len(ledger._lease_conns) == 1  # the group's session serves the next leases
        again = ledger.try_leases([(k, "ingest") for k in keys])
        assert all(t is not None for t in again) and ledger._lease_conns == []
        with again[0]:
            pass
        assert advisory_locks(ledger) == 2 and ledger._lease_conns == []  # two still held on it
        with again[1], again[2]:
            pass
        assert advisory_locks(ledger) == 0 and len(ledger._lease_conns) == 1
    finally:
        other.close()


def _end_kept_lease_sessions(ledger: Ledger) -> None:
    """The server ends the lease sessions the ledger keeps between leases (a restart, an idle-session
    timeout), as the DSN's own user; the ledger does not know until it uses one."""
    import time

    pids = [c.info.backend_pid for c in ledger._lease_conns]
    assert pids
    with psycopg.connect(ledger.dsn, autocommit=True) as conn:
        for pid in pids:
            assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        for _ in range(600):  # the server ends them after answering; bounded only for a failure
            if not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()[0]:
                break
            time.sleep(0.05)


def test_a_kept_lease_session_the_server_ended_is_replaced_not_a_failure(ledger: Ledger) -> None:
    """A session kept for the next leases and ended by the server meanwhile held no lock: the
    next leases, a group's or one alone, are taken on a new session instead of failing."""
    keys = [f"2026-09-0{d}|gulf_coast" for d in (1, 2)]
    for t in ledger.try_leases([(k, "ingest") for k in keys]):
        with t:
            pass
    kept = list(ledger._lease_conns)
    _end_kept_lease_sessions(ledger)
    taken = ledger.try_leases([(k, "enrich") for k in keys])
    assert all(t is not None for t in taken)
    with taken[0], taken[1]:
        assert advisory_locks(ledger) == 2
    assert advisory_locks(ledger) == 0 and all(c.closed for c in kept)
    _end_kept_lease_sessions(ledger)
    with ledger.lease(keys[0], "correlate", timeout_s=0):
        assert advisory_locks(ledger) == 1
    assert advisory_locks(ledger) == 0 and len(ledger._lease_conns) == 1


def test_leases_taken_together_die_with_their_session(ledger: Ledger, pg_dsn: str) -> None:
    import time

    from resources.errors import LedgerUnavailable

    keys = [f"2026-09-0{d}|gulf_coast" for d in (1, 2)]
    taken = ledger.try_leases([(k, "ingest") for k in keys])
    assert all(t is not None for t in taken)
    for t in taken:
        t.__enter__()
    (pid,) = advisory_lock_sessions(ledger)
    # The session is gone, as with a killed process or a lost connection (as the DSN's own user:
    # the ledger's sessions take on a role that may not end another's).
    with psycopg.connect(ledger.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    for _ in range(600):  # the server ends the session after answering; bounded only for a failure
        if advisory_locks(ledger) == 0:
            break
        time.sleep(0.05)
    assert advisory_locks(ledger) == 0
    other = Ledger(pg_dsn)
    try:
        free = other.try_leases([(k, "ingest") for k in keys])
        assert all(t is not None for t in free)
        for t in free:
            with t:
                pass
    finally:
        other.close()
    for t in taken:  # letting go on the dead session says so; the lock died with it
        with pytest.raises(LedgerUnavailable):
            t.__exit__(None, None, None)
    assert ledger._lease_conns == []  # the dead session is not kept


def _partition_done(ledger: Ledger, key: str) -> None:
    """Every phase of ``key`` claimed and completed, and its report delivered, as a run does it."""
    day, region = key.split("|")
    for tier, phase in enumerate(("ingest", "enrich", "correlate", "present"), start=1):
        claim = ledger.claim(partition_key=key, region_id=region, day=day, phase=phase, input_hash="h1",
                             schema_version=1, code_version="1", run_id="r").claim
        ledger.complete(claim, state_hash=f"s{tier}", summary={}, tier=tier, tier_label=phase, run_id="r")
    (receipt,) = ledger.prepare_receipts([ReceiptRequest(
        artifact_id=f"{region}/{day}/report.html@a1", target="file", partition_key=key, region_id=region, day=day,
        kind="report.html", content_hash="0" * 64, size_bytes=1, target_ref="/x", checkpoint_id=None)])
    ledger.mark_delivered(receipt, {"path": "/x"})


def _other_sessions(conn: psycopg.Connection) -> int:
    """Client sessions on the database besides ``conn``'s (an autovacuum worker coming and going
    must not pass for one of them ending)."""
    return int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchone()[0])


def _wait_sessions(conn: psycopg.Connection, most: int) -> None:
    import time

    deadline = time.monotonic() + 60  # a session ending is quick; this only bounds a hang
    while _other_sessions(conn) > most:
        assert time.monotonic() < deadline, "the sessions did not end"
        time.sleep(0.05)


def test_a_session_that_lives_as_the_ledger_grows_does_not_read_its_tables_whole(pg_dsn: str) -> None:
    """A process's ledger sessions live as long as it does (a daemon, a backfill of a year). The
    plans they cache while the ledger is small (the partition state's refresh, prepared
    statements) must not keep scanning whole tables once the ledger holds thousands of
    partitions, also where no ANALYZE has run (autovacuum off). Autovacuum is off for the
    ledger's tables here: an ANALYZE of the small ledger followed by none of the grown one (the
    clone grows it forty-fold at once, where a real ledger grows by days and autovacuum analyzes
    it again) would count estimates made for the small ledger, not cached plans."""
    from resources.ledger_fixtures import clone_partitions

    ledger = Ledger(pg_dsn)
    ledger.migrate()
    with psycopg.connect(pg_dsn, autocommit=True) as watch:
        for (table,) in watch.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall():
            watch.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(table)))
        try:
            templates = [f"2026-09-{d:02d}|region_{i:02d}" for d in (1, 2) for i in range(20)]
            for key in templates:  # more uses than PostgreSQL's before it may settle on a generic plan
                _partition_done(ledger, key)
            live = _other_sessions(watch)
            grid = [(f"{day}|region_{i:02d}", f"region_{i:02d}", day, templates[i % len(templates)], "ok")
                    for day in (f"2026-{m:02d}-{d:02d}" for m in (10, 11) for d in range(1, 29)) for i in range(50)]
            clone_partitions(pg_dsn, grid, analyze=False)  # the ledger grows under the live sessions
            _wait_sessions(watch, live)  # the clone's own sessions have ended, their counts published
            watch.execute("SELECT pg_stat_reset()")

            _partition_done(ledger, "2026-12-01|region_00")  # on the sessions that cached their plans

            ledger.close()
            _wait_sessions(watch, 0)  # a session's counts are published when it ends
            watch.execute("SELECT pg_stat_clear_snapshot()")
            read = watch.execute("SELECT relname, seq_tup_read FROM pg_stat_user_tables WHERE relname IN"
                                 " ('checkpoints', 'partition_state', 'receipts')").fetchall()
        finally:
            ledger.close()
    # One partition's work reads no table of the ledger whole (each holds a row or more a partition).
    assert sum(n for _, n in read) < len(grid), read
