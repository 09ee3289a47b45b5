"""``stormlake backfill`` is a Dagster asset backfill: the instance lists it with its runs, the run
queue launches them (at most ``STORMLAKE_WORKERS`` at once), and the daemon started for it ends
with it."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pytest

from tests.e2e.test_cli import base_env, stderr_digest, stormlake

pytestmark = pytest.mark.e2e


def _backfill_id(stderr: str) -> str:
    found = re.findall(r"^backfill ([a-z]{8}): ", stderr, flags=re.M)
    assert len(found) == 1, stderr
    return found[0]


def test_a_cli_backfill_is_a_dagster_backfill_whose_runs_the_queue_launches_one_at_a_time(
        tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from resources import dagster_compat
    from resources.keys import BACKFILL_TAG, LAUNCHED_BY
    from tests.consumer import generated_landing

    home = tmp_path / "home"
    generated_landing(home / "landing", regions=3, rows_per_partition=200, seed=5, days=3)
    env = base_env(home, STORMLAKE_PG_DSN=pg_dsn, STORMLAKE_WORKERS="1", STORMLAKE_PARTITIONS_PER_RUN="4")
    proc = stormlake("backfill", env=env, cwd=tmp_path)
    assert proc.returncode == 0, stderr_digest(proc)
    assert "9/9 partitions succeeded; 36 phases computed, 27 artifact deliveries" in proc.stdout, proc.stdout
    backfill_id = _backfill_id(proc.stderr)
    assert "its daemon started for it" in proc.stderr
    assert (home / "logs" / "daemon.log").is_file()

    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    with dg.DagsterInstance.get() as instance:
        status = dagster_compat.backfill_status(instance, backfill_id)
        assert status is not None, "the backfill is not in the instance's backfills"
        # Finished, or still to be marked so by the next daemon's first pass (its own daemon has stopped).
        assert status in (("COMPLETED_SUCCESS", True), ("REQUESTED", False)), status
        records = instance.get_run_records(filters=dg.RunsFilter(tags={BACKFILL_TAG: backfill_id}))
        # Dagster cut the nine keys into key ranges by the backfill policy: several runs, not one a key.
        assert 2 <= len(records) < 9, [r.dagster_run.tags for r in records]
        for record in records:
            run = record.dagster_run
            assert run.status == dg.DagsterRunStatus.SUCCESS and run.tags[LAUNCHED_BY] == "cli"
            assert instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED), (
                f"run {run.run_id} did not wait in the run queue")
        # max_concurrent_runs 1: no run started before the one before it ended.
        spans = sorted((r.start_time, r.end_time) for r in records)
        assert all(start is not None and end is not None for start, end in spans), spans
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, spans

    # The daemon ended with the backfill: a second, clean invocation starts its own and has nothing to do.
    again = stormlake("backfill", env=env, cwd=tmp_path)
    assert again.returncode == 0, stderr_digest(again)
    assert "0 phases computed, 0 artifact deliveries" in again.stdout, again.stdout
    assert "backfill " not in again.stderr  # the ledger said every phase would skip: no backfill


def test_a_killed_backfill_takes_its_daemon_with_it_and_the_next_one_finishes(tmp_path: Path, pg_dsn: str) -> None:
    """The daemon a backfill started dies with its CLI (SIGKILL of the CLI alone); the next
    backfill starts its own and finishes what was left: every phase computed once, every artifact
    delivered once at most twice (a delivery accepted just before the kill), and a rerun does nothing."""
    import os
    import signal
    import time

    import psutil

    from tests.consumer import (
        PHASE_NAMES,
        Consumer,
        check_consumer,
        completed_count,
        generated_landing,
        kill_group,
        make_home,
        run,
        sql_rows,
        start,
        status,
    )

    landing = generated_landing(tmp_path / "landing", regions=3, days=2, rows_per_partition=300, seed=5)
    keys = [f"{d}|{r}" for d in ("2026-09-01", "2026-09-02") for r in ("gulf_coast", "pine_belt", "red_hills")]
    with Consumer() as consumer:
        env = make_home(tmp_path / "run", landing, pg_dsn, webhook=consumer.url)
        proc = start(env, "backfill", log=tmp_path / "killed.log")
        try:
            deadline = time.monotonic() + 600  # against hanging forever, not a performance bound
            while time.monotonic() < deadline and proc.poll() is None and completed_count(env) < 2:
                time.sleep(0.05)
            assert proc.poll() is None, (tmp_path / "killed.log").read_text(errors="replace")
            daemons = [c for c in psutil.Process(proc.pid).children() if "dagster-daemon" in " ".join(c.cmdline())]
            assert len(daemons) == 1, psutil.Process(proc.pid).children()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            _gone, alive = psutil.wait_procs(daemons, timeout=60)
            assert not alive, f"the daemon still runs after the CLI was killed: {alive}"
        finally:
            if proc.poll() is None:
                kill_group(proc)
        res = run(env, "backfill", timeout=900)
        assert res.returncode == 0, str(res)
        assert "its daemon started for it" in res.stderr, res.stderr
        final = status(env)
        assert sorted(final) == sorted(keys) and all(final[k]["tier"] == 4 for k in keys), final
        rows = sql_rows(env["STORMLAKE_PG_DSN"], "SELECT partition_key, phase, count(*) FROM checkpoint_events"
                                                 " WHERE status = 'COMPLETED' GROUP BY partition_key, phase")
        assert {(r[0], r[1]): r[2] for r in rows} == {(k, p): 1 for k in keys for p in PHASE_NAMES}
        assert len(check_consumer(consumer.snapshot(), partitions=keys, max_repeats=1)) == 3 * len(keys)
        again = run(env, "backfill", timeout=300)
        assert again.returncode == 0 and "0 phases computed, 0 artifact deliveries" in again.stdout, str(again)
