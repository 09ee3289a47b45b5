"""A retried attempt answers its outside calls from the record: no second Delta commit, no second POST.

The real ``stormlake backfill`` runs in a subprocess with ``STORMLAKE_FAULTS=present.after_call``:
the process dies (``os._exit(137)``) right after the present attempt's first outside call was made
and recorded, before its checkpoint commits. The same fault stays set on the retries, and the
point fires only after a call the attempt makes itself (never after one answered from the
record), so each retry gets one call further: first the Delta commit of ``region_day_summary``,
then the deliveries of the first artifact (to the file target, then to the webhook). Once a POST
was made and recorded, a run without faults finishes the partition.

On each retry the Delta commit is answered from the record (the run's log says so, and the
table's history keeps exactly one commit of the partition), and the consumer never receives a
key twice. For the deliveries, the mechanism is the receipt: a delivery made and recorded also
left its receipt DELIVERED, and a DELIVERED receipt is skipped before the recorded call would be
consulted, so a retry never reaches the call at all (the test checks that too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

from tests.consumer import (
    ONE_BACKFILL,
    ONE_KEY,
    Consumer,
    check_consumer,
    check_ledger_clean,
    lake_root,
    make_home,
    run,
    sql_rows,
    status,
)

pytestmark = pytest.mark.e2e

KEY, ARGS = ONE_KEY, ONE_BACKFILL
TABLE = "region_day_summary"  # the table present writes
MAX_RUNS = 20


def partition_commits(env: dict[str, str]) -> tuple[list[dict[str, Any]], int]:
    """The commits of ``TABLE`` that wrote this partition (by their app id), and the table's version."""
    from resources.lake import APP_KEY, app_id

    day, _, region = KEY.partition("|")
    table = DeltaTable(str(Path(lake_root(env)) / TABLE))
    return [h for h in table.history() if h.get(APP_KEY) == app_id(TABLE, region, day)], table.version()


def run_messages(env: dict[str, str], run_id: str) -> list[str]:
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        return [e.user_message for e in instance.all_logs(run_id) if e.user_message]


def present_attempts(dsn: str) -> list[tuple[int, int, str]]:
    """(attempt, seq, run id) of every claim of present for KEY, in order."""
    return [(r[0], r[1], r[2]) for r in sql_rows(
        dsn, "SELECT attempt, seq, run_id FROM checkpoint_events WHERE partition_key = %s AND phase = 'present'"
             " AND status = 'PENDING' ORDER BY event_id", (KEY,))]


def test_a_killed_attempt_is_retried_from_its_recorded_calls(pg_dsn: str, sample_landing: Path,
                                                              tmp_path: Path) -> None:
    with Consumer() as consumer:  # dedupe: a key it has accepted before is answered 409 (and counted)
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)
        first = run(env, *ARGS, faults="present.after_call")
        assert first.returncode == 137 and "injected exit at present.after_call" in first.stderr, str(first)
        # killed right after the Delta commit (present's first call) was recorded
        commits, version = partition_commits(env)
        assert len(commits) == 1 and consumer.snapshot() == [], (commits, consumer.snapshot())

        def check_retry() -> None:
            attempt, _, run_id = present_attempts(pg_dsn)[-1]
            # no second Delta commit: the partition's commits and the table's version are unchanged
            assert partition_commits(env) == (commits, version), f"retry {attempt} wrote {TABLE} again"
            # no second POST: every key the consumer got, it got once
            repeated = {k: n for k, n in consumer.keys_count().items() if n > 1}
            assert not repeated, f"retry {attempt} posted again: {repeated}"
            messages = run_messages(env, run_id)
            assert f"present: delta_commit {TABLE} answered from the record" in messages, (
                f"retry {attempt} did not answer the Delta commit from the record:\n" + "\n".join(messages[-30:]))
            # deliveries are never answered from the record: their DELIVERED receipts skip them first
            assert not [m for m in messages if m.startswith("present: deliver ") and "answered from the record" in m]

        # Retries with the fault still set, each killed after one more call, until a POST was
        # made and recorded (the file target comes first); then one without faults finishes.
        kills = 1
        while not consumer.snapshot():
            res = run(env, *ARGS, faults="present.after_call")
            assert res.returncode == 137 and "injected exit at present.after_call" in res.stderr, str(res)
            kills += 1
            assert kills < MAX_RUNS, "the attempts do not get further from one retry to the next"
            check_retry()
        assert len(consumer.snapshot()) == 1
        last = run(env, *ARGS)
        assert last.returncode == 0, str(last)
        check_retry()

        # Each killed attempt made and recorded exactly one call; the last one made the rest.
        attempts = present_attempts(pg_dsn)
        assert [a[0] for a in attempts] == list(range(1, kills + 2))
        calls = sql_rows(pg_dsn, "SELECT calls FROM checkpoints WHERE partition_key = %s AND phase = 'present'"
                                 " AND superseded_at IS NULL", (KEY,))[0][0]
        assert [c["kind"] for c in calls] == ["delta_commit"] + ["deliver"] * 6, calls
        by_seq = [c["seq"] for c in calls]
        assert by_seq[:kills] == [seq for _, seq, _ in attempts[:kills]], calls
        assert set(by_seq[kills:]) == {attempts[-1][1]}, calls
        # The end state is a clean one: one commit, every artifact delivered exactly once.
        check_consumer(consumer.snapshot(), partitions=[KEY], max_repeats=0)
        assert len(consumer.snapshot()) == 3
        check_ledger_clean(pg_dsn)
        assert status(env)[KEY]["tier"] == 4
