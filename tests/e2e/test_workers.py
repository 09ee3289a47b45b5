"""``stormlake backfill --workers N``: key ranges in N processes at once. A killed CLI takes its
workers with it; the next backfill (again in 2 processes) finishes what they left, with every
phase computed once and every artifact delivered once, and a rerun does nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.consumer import (
    PHASE_NAMES,
    Consumer,
    check_consumer,
    check_ledger_clean,
    completed_count,
    generated_landing,
    kill_group,
    make_home,
    run,
    sql_rows,
    start,
    status,
)

pytestmark = pytest.mark.e2e

REGIONS = ("gulf_coast", "pine_belt", "red_hills", "piedmont")
DAYS = ("2026-09-01", "2026-09-02", "2026-09-03")
TWELVE = [f"{d}|{r}" for d in DAYS for r in REGIONS]
ARGS = ("backfill", "--workers", "2", "--regions", ",".join(REGIONS), "--days", "2026-09-01..2026-09-03")


@pytest.fixture(scope="module")
def twelve_landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 regions x 3 days x 300 outage rows: more partitions than one range run takes."""
    return generated_landing(tmp_path_factory.mktemp("twelve") / "landing", regions=4, days=3,
                             rows_per_partition=300, seed=5)


def check_once(dsn: str, consumer: Consumer, *, kills: int = 0) -> None:
    """Every phase of every partition completed exactly once; every artifact arrived (repeated at
    most once per kill, never under a second key)."""
    rows = sql_rows(dsn, "SELECT partition_key, phase, count(*) FROM checkpoint_events"
                         " WHERE status = 'COMPLETED' GROUP BY partition_key, phase")
    assert {(r[0], r[1]): r[2] for r in rows} == {(k, p): 1 for k in TWELVE for p in PHASE_NAMES}
    artifacts = check_consumer(consumer.snapshot(), partitions=TWELVE, max_repeats=kills)
    assert len(artifacts) == 3 * len(TWELVE)
    check_ledger_clean(dsn)


def forks_of(cli: psutil.Process) -> set[int]:
    """The CLI's direct children that run its own command line in two looks a moment apart: a
    child forked to start another program shows the CLI's command line only until its exec."""

    def look() -> set[int]:
        found = set()
        for child in cli.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.cmdline() == cli.cmdline():
                    found.add(child.pid)
        return found

    first = look()
    time.sleep(0.5)
    return first & look()


def test_a_killed_backfill_takes_its_workers_with_it_and_the_next_one_finishes(
        pg_dsn: str, twelve_landing: Path, tmp_path: Path) -> None:
    with Consumer() as consumer:
        env = make_home(tmp_path, twelve_landing, pg_dsn, webhook=consumer.url)
        proc = start(env, *ARGS, log=tmp_path / "killed.log")
        try:
            # Kill the CLI (itself alone, not its process group) once its workers have completed
            # some phases and not all: the moment comes from the ledger, not from a clock.
            deadline = time.monotonic() + 900  # against hanging forever, not a performance bound
            done = 0
            while time.monotonic() < deadline and proc.poll() is None:
                done = completed_count(env)
                if done >= 4:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, (tmp_path / "killed.log").read_text(errors="replace")
            # The CLI is one of the 2 processes; the other is a fork of it.
            cli = psutil.Process(proc.pid)
            workers = cli.children(recursive=True)
            assert len(forks_of(cli)) == 1, workers
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            gone, alive = psutil.wait_procs(workers, timeout=60)
            assert not alive, f"workers still running after the CLI was killed: {alive}"
        finally:
            if proc.poll() is None:
                kill_group(proc)
        assert done < len(TWELVE) * len(PHASE_NAMES), "the backfill finished before the kill"
        res = run(env, *ARGS, timeout=900)
        assert res.returncode == 0, str(res)
        assert "up to 2 processes" in res.stderr and "12/12 partitions in" in res.stderr, res.stderr
        final = status(env)
        assert sorted(final) == sorted(TWELVE) and all(final[k]["tier"] == 4 for k in TWELVE)
        check_once(pg_dsn, consumer, kills=2)  # each process may have died inside a delivery
        again = run(env, *ARGS, timeout=600)
        assert again.returncode == 0 and "0 phases computed, 0 artifact deliveries" in again.stdout, str(again)
        check_once(pg_dsn, consumer, kills=2)
