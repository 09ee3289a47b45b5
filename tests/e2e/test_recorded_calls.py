"""A retried attempt answers its outside calls from the record: no second Delta commit, no second POST.

The real ``stormlake backfill`` runs in a subprocess with ``STORMLAKE_FAULTS=present.after_call=exit-always``:
the run's process dies (``os._exit(137)``) right after the present attempt's first outside call
was made and recorded, before its checkpoint commits. Dagster retries the crashed run (run
retries) with the same fault set, and the point fires only after a call the attempt makes itself
(never after one answered from the record), so each retry gets one call further: first the Delta
commit of ``region_day_summary``, then the deliveries of the first artifact (to the file target,
then to the webhook). Once a POST was made and recorded, a backfill without faults finishes the
partition.

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


def injected_exits(env: dict[str, str]) -> int:
    """How many run processes the fault killed: each says so on its stderr, which is the daemon's log
    (the daemon's code server launches the runs)."""
    log = Path(env["STORMLAKE_HOME"]) / "logs" / "daemon.log"
    return log.read_text(errors="replace").count(f"injected exit at present.after_call for {KEY}")


def test_a_killed_attempt_is_retried_from_its_recorded_calls(pg_dsn: str, sample_landing: Path,
                                                              tmp_path: Path) -> None:
    with Consumer() as consumer:  # dedupe: a key it has accepted before is answered 409 (and counted)
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)

        # With the fault set on every attempt (exit-always), the backfill's run dies after present's
        # first call, and each of Dagster's retries of it one call further; backfills go on with the
        # fault until a POST was made and recorded (the file target comes first).
        commits: list[dict[str, Any]] = []
        version = -1
        backfills = 0
        while not consumer.snapshot():
            res = run(env, *ARGS, faults="present.after_call=exit-always", timeout=600)
            backfills += 1
            assert res.returncode == 1 and KEY in res.stderr, str(res)  # its runs crashed, each retry too
            assert backfills < MAX_RUNS, "the attempts do not get further from one retry to the next"
            if not commits:
                commits, version = partition_commits(env)
                assert len(commits) == 1, commits  # present's first call: one Delta commit
            # no second Delta commit: the partition's commits and the table's version are unchanged
            assert partition_commits(env) == (commits, version), f"backfill {backfills} wrote {TABLE} again"
        kills = injected_exits(env)
        assert kills == len(present_attempts(pg_dsn)) >= 3, (kills, present_attempts(pg_dsn))
        last = run(env, *ARGS)
        assert last.returncode == 0, str(last)
        assert partition_commits(env) == (commits, version), f"the last backfill wrote {TABLE} again"

        # Every retried attempt answered the Delta commit from the record and posted nothing twice.
        attempts = present_attempts(pg_dsn)
        for attempt, _, run_id in attempts[1:]:
            messages = run_messages(env, run_id)
            assert f"present: delta_commit {TABLE} answered from the record" in messages, (
                f"attempt {attempt} did not answer the Delta commit from the record:\n" + "\n".join(messages[-30:]))
            # deliveries are never answered from the record: their DELIVERED receipts skip them first
            assert not [m for m in messages if m.startswith("present: deliver ") and "answered from the record" in m]
        repeated = {k: n for k, n in consumer.keys_count().items() if n > 1}
        assert not repeated, f"a retry posted again: {repeated}"

        # Each killed attempt made and recorded exactly one call; the last one made the rest.
        assert [a[0] for a in attempts] == list(range(1, kills + 2))
        assert len({run_id for _, _, run_id in attempts}) == kills + 1  # one run each: the killed, the retries
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
