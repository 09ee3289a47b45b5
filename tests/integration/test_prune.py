"""`stormlake prune` on a real ledger: history past the window goes, nothing anyone still reads does.

Runs the real ``stormlake backfill``/``prune``/``status`` in subprocesses and the real outbox
sensor in this process, against a fresh PostgreSQL database. "Old" rows are made by moving
timestamps back 40 days in SQL. ``superseded_at`` of a COMPLETED checkpoint cannot be changed
once set (the guard of migration 002), so the test setup moves it back with the guard trigger
disabled inside one transaction (``ALTER TABLE ... DISABLE TRIGGER``, as the table's owner),
and enables it again before committing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest

from resources.ledger import Ledger
from tests.consumer import Consumer, add_outages, base_env, make_home, run, sql_rows

pytestmark = pytest.mark.e2e

D1, D2 = "2026-09-01|gulf_coast", "2026-09-02|gulf_coast"
ARGS = ("backfill", "--regions", "gulf_coast", "--days", "2026-09-01..2026-09-02")
PHASES = ("ingest", "enrich", "correlate", "present")


# ---- helpers --------------------------------------------------------------------------------------
def backdate(dsn: str, days: int = 40) -> None:
    """Move every timestamp of the ledger ``days`` back (their order and distances stay)."""
    shift = f"{days} days"
    with psycopg.connect(dsn) as conn:  # one transaction: the guard is off only inside it
        conn.execute("UPDATE checkpoint_events SET at = at - %s::interval", (shift,))
        conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER checkpoints_guard")
        conn.execute("UPDATE checkpoints SET created_at = created_at - %s::interval,"
                     " updated_at = updated_at - %s::interval, completed_at = completed_at - %s::interval,"
                     " superseded_at = superseded_at - %s::interval", (shift,) * 4)
        conn.execute("ALTER TABLE checkpoints ENABLE TRIGGER checkpoints_guard")
        conn.execute("UPDATE receipts SET created_at = created_at - %s::interval,"
                     " delivered_at = delivered_at - %s::interval", (shift, shift))


def outbox_tick(env: dict[str, str], dsn: str, cursor: str | None) -> str:
    """One tick of the real outbox sensor on the home's Dagster instance; returns its new cursor."""
    from pipeline.sensors import outbox_sensor
    from resources.ledger_resource import LedgerResource

    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"ledger": LedgerResource(dsn=dsn)})
        result = outbox_sensor(ctx)
    assert isinstance(result, dg.SensorResult) and not result.run_requests
    assert result.cursor is not None
    return result.cursor


def status_text(env: dict[str, str]) -> str:
    res = run(env, "status", "--json", "--role", "admin", timeout=120)
    assert res.returncode == 0, str(res)
    return res.stdout


def report_content(dsn: str) -> dict[str, Any]:
    """What `stormlake report` shows (pipeline.report.collect), less the time it was made."""
    from pipeline.report import collect

    led = Ledger(dsn)
    try:
        data = dataclasses.asdict(collect(led))
    finally:
        led.close()
    data.pop("now")
    return data


def heads(dsn: str) -> list[tuple[Any, ...]]:
    return sql_rows(dsn, "SELECT * FROM checkpoints WHERE superseded_at IS NULL ORDER BY id")


def events(dsn: str) -> dict[int, tuple[Any, ...]]:
    """event id -> (checkpoint id, partition, phase, status)."""
    return {r[0]: r[1:] for r in sql_rows(dsn, "SELECT event_id, checkpoint_id, partition_key, phase, status"
                                               " FROM checkpoint_events ORDER BY event_id")}


def prune(env: dict[str, str], *args: str) -> str:
    res = run(env, "prune", "--older-than", "30", *args, timeout=120)
    assert res.returncode == 0, str(res)
    return res.stdout


# ---- tests ----------------------------------------------------------------------------------------
def test_prune_leaves_status_the_report_and_a_resume_unchanged(pg_dsn: str, sample_landing: Path,
                                                              tmp_path: Path) -> None:
    with Consumer() as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)
        # D1 published; D2 failed in present (to be resumed after the prune).
        first = run(env, *ARGS, faults=f"present.mid_transform@{D2}=raise")
        assert first.returncode == 1, str(first)
        assert run(env, "backfill", "--regions", "gulf_coast", "--days", "2026-09-01").returncode == 0  # skips
        # The outbox sensor has read every event: only the rule for current checkpoints keeps them.
        outbox_tick(env, pg_dsn, outbox_tick(env, pg_dsn, None))
        backdate(pg_dsn)
        before = (status_text(env), report_content(pg_dsn), heads(pg_dsn), events(pg_dsn))
        assert before[1]["event_counts"][("present", "FAILED")] >= 1
        assert before[1]["event_counts"][("ingest", "SKIPPED")] >= 1

        out = prune(env)
        after = (status_text(env), report_content(pg_dsn), heads(pg_dsn), events(pg_dsn))
        assert after[0] == before[0], "stormlake status --json changed"
        changed = {k for k in before[1] if before[1][k] != after[1][k]}
        assert not changed, f"the report's content changed: {changed}\nprune said: {out}"
        assert after[2] == before[2], "a head checkpoint changed or went"
        assert after[3] == before[3], "events of current checkpoints were deleted"
        assert f"kept {len(before[3])} older events of current checkpoints" in out, out

        # The resume after the prune: present of D2 only, once; D1 untouched, nothing delivered twice.
        posts = len(consumer.snapshot())
        last_event = max(before[3])
        resume = run(env, *ARGS)
        assert resume.returncode == 0, str(resume)
        new = [e for i, e in events(pg_dsn).items() if i > last_event]
        assert {(e[1], e[2], e[3]) for e in new if e[3] != "SKIPPED"} == {(D2, "present", "PENDING"),
                                                                          (D2, "present", "COMPLETED")}
        final = json.loads(status_text(env))["partitions"]
        assert [p["tier"] for p in final] == [4, 4]
        attempts = {(f"{p['day']}|{p['region']}", ph): p["phases"][ph]["attempts"] for p in final for ph in PHASES}
        was = {(f"{p['day']}|{p['region']}", ph): p["phases"][ph]["attempts"]
               for p in json.loads(before[0])["partitions"] for ph in p["phases"]}
        assert attempts == {**was, (D2, "present"): was[(D2, "present")] + 1}
        sent = consumer.snapshot()[posts:]
        assert sorted(p.key.split("/")[1] for p in sent) == ["2026-09-02"] * 3, [p.key for p in sent]
        assert len({p.key for p in consumer.snapshot()}) == len(consumer.snapshot())  # each key once


def test_prune_removes_superseded_history_but_no_head_no_unread_event_and_no_receipt_of_the_window(
        pg_dsn: str, sample_landing: Path, tmp_path: Path) -> None:
    with Consumer() as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)
        landing = Path(env["STORMLAKE_HOME"]) / "landing"
        assert run(env, *ARGS).returncode == 0  # inputs A of both days
        # The outbox sensor reads everything so far; it records its position on its next tick.
        cursor = outbox_tick(env, pg_dsn, outbox_tick(env, pg_dsn, None))
        read_up_to = max(events(pg_dsn))
        assert sql_rows(pg_dsn, "SELECT after_event_id FROM event_readers WHERE name = 'outbox_sensor'") == [
            (read_up_to,)]
        # D1's inputs change twice (A -> B -> C): A's and B's checkpoints are superseded; B's
        # events come after the sensor's position.
        for tag in ("b", "c"):
            add_outages(landing, "gulf_coast", "2026-09-01", tag=tag)
            res = run(env, *ARGS)
            assert res.returncode == 0, str(res)
        backdate(pg_dsn)
        ev_before, heads_before = events(pg_dsn), heads(pg_dsn)
        st_before = json.loads(status_text(env))["partitions"]
        superseded = {r[0]: r[1] for r in sql_rows(pg_dsn, "SELECT id, day FROM checkpoints"
                                                           " WHERE superseded_at IS NOT NULL")}
        assert len(superseded) == 8 and set(superseded.values()) == {"2026-09-01"}
        head_ids = {h[0] for h in heads_before}
        receipts_before = sql_rows(pg_dsn, "SELECT artifact_id, target, day, kind, created_at FROM receipts")

        # The sensor of the backfills' own daemons recorded its own reading meanwhile; the sensor
        # whose cursor read A records its position again, as its next tick would.
        outbox_tick(env, pg_dsn, cursor)
        assert sql_rows(pg_dsn, "SELECT after_event_id FROM event_readers WHERE name = 'outbox_sensor'") == [
            (read_up_to,)]
        out = prune(env, "--keep-from", "2026-09-02")

        ev_after = events(pg_dsn)
        deleted = set(ev_before) - set(ev_after)
        # deleted: exactly the events the sensor had read that belong to superseded checkpoints (A of D1)
        assert deleted == {i for i, e in ev_before.items() if i <= read_up_to and e[0] in superseded}
        assert deleted and all(ev_before[i][1] == D1 for i in deleted)
        unread = {i for i in ev_before if i > read_up_to}
        assert unread <= set(ev_after), "an event the outbox sensor had not read was deleted"
        assert {i for i, e in ev_before.items() if e[0] in head_ids} <= set(ev_after), "an event of a head went"
        kept_unread = {i for i in unread if ev_before[i][0] not in head_ids}
        assert kept_unread and f"kept {len(kept_unread)} older events not yet read by every event reader" in out
        assert f"event reader outbox_sensor: read up to event {read_up_to}" in out, out
        # checkpoints: every superseded one (all before the window) went, every head stayed as it was
        assert heads(pg_dsn) == heads_before
        assert sql_rows(pg_dsn, "SELECT count(*) FROM checkpoints WHERE superseded_at IS NOT NULL") == [(0,)]
        assert f"pruned {len(superseded)} superseded checkpoints, {len(deleted)} events" in out, out
        # receipts: all of the window (D2) kept; before it, the latest of each slot kept
        receipts_after = sql_rows(pg_dsn, "SELECT artifact_id, target, day, kind, created_at FROM receipts")
        latest: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        for r in sorted(receipts_before, key=lambda r: r[4]):
            latest[(r[2], r[3], r[1])] = r
        assert sorted(receipts_after) == sorted(r for r in receipts_before
                                                if r[2] >= "2026-09-02" or latest[(r[2], r[3], r[1])] == r)
        assert len(receipts_after) < len(receipts_before)
        # status: every phase as before; deliveries of the window as before; before it, the current ones
        st_after = json.loads(status_text(env))["partitions"]
        assert [p["phases"] for p in st_after] == [p["phases"] for p in st_before]
        assert st_after[1]["deliveries"] == st_before[1]["deliveries"]
        current = {r[0] for r in latest.values()}
        assert st_after[0]["deliveries"] == [d for d in st_before[0]["deliveries"] if d["artifact_id"] in current]
        # the sensor goes on from its cursor over the same events; a re-run does nothing
        outbox_tick(env, pg_dsn, cursor)
        rerun = run(env, *ARGS)
        assert rerun.returncode == 0 and "0 phases computed, 0 artifact deliveries" in rerun.stdout, str(rerun)


def test_prune_keeps_every_old_event_until_a_reader_records_its_position(pg_dsn: str, tmp_path: Path) -> None:
    ledger = Ledger(pg_dsn)
    try:
        ledger.migrate()
        args: dict[str, Any] = dict(partition_key=D1, region_id="gulf_coast", day="2026-09-01",
                                    schema_version=1, code_version="1", run_id="r")
        for input_hash in ("A", "B"):  # ingest: A completed, then superseded by B
            claim = ledger.claim(**args, phase="ingest", input_hash=input_hash).claim
            assert claim is not None
            ledger.complete(claim, state_hash=input_hash, summary={}, tier=1, tier_label="ingested", run_id="r")
        claim = ledger.claim(**args, phase="enrich", input_hash="E").claim
        assert claim is not None
        ledger.fail(claim, error_class="ValueError", error_message="bad", run_id="r")  # a FAILED head
        backdate(pg_dsn)
        before = events(pg_dsn)
        old_ingest = sql_rows(pg_dsn, "SELECT id FROM checkpoints WHERE superseded_at IS NOT NULL")
        env = base_env(STORMLAKE_HOME=str(tmp_path / "home"), STORMLAKE_PG_DSN=pg_dsn,
                       DAGSTER_HOME=str(tmp_path / "home" / "dagster"))

        out = prune(env, "--keep-from", "2026-09-02")
        assert events(pg_dsn) == {i: (None if e[0] == old_ingest[0][0] else e[0], *e[1:]) for i, e in before.items()}
        assert "kept all 2 older events of superseded checkpoints: no event reader has recorded how far it read" in out
        assert "kept 4 older events of current checkpoints" in out, out
        assert sorted(cp.phase + cp.status for cp in ledger.heads()) == ["enrichFAILED", "ingestCOMPLETED"]

        # Once the reader says how far it read, the old events it read of history go; a head's stay.
        (last,) = sql_rows(pg_dsn, "SELECT txid::text::bigint, event_id FROM checkpoint_events"
                                   " ORDER BY txid DESC, event_id DESC LIMIT 1")
        assert last[1] == max(before)
        ledger.record_reader("outbox_sensor", last)
        out = prune(env, "--keep-from", "2026-09-02")
        assert "pruned 0 superseded checkpoints, 2 events" in out, out
        assert set(events(pg_dsn)) == set(before) - {i for i, e in before.items() if e[0] == old_ingest[0][0]}
    finally:
        ledger.close()
