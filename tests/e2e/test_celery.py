"""Steps on the workers of Dagster's Celery executor (docs/OPERATIONS.md, "Steps on Celery workers").

A Redis broker, a local S3 endpoint (pipeline/tools/celery_local.py), the ledger and Dagster's storage over TCP, each with its
login, and Celery workers started as another Unix user (``nobody``) with homes of their own:
they cannot read the launcher's files. The backfill goes the one road: ``stormlake backfill`` in
the launcher's environment (``STORMLAKE_EXECUTOR=celery``, the broker) submits a Dagster asset
backfill, the daemon it starts launches the runs, and their steps run on the workers.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.tools.celery_local import Deployment, Launched, backfill_id, deployment, redis_broker, wait_runs
from tests.consumer import (
    check_lake_equal,
    check_ledger_clean,
    database,
    generated_landing,
    lake_snapshot,
    make_home,
    run,
    sql_rows,
)
from tests.s3 import Endpoint

pytestmark = pytest.mark.e2e

PHASES = ("ingest", "enrich", "correlate", "present")
KINDS = 3  # artifacts a partition publishes


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 regions x 4 days, small partitions: 16 partitions."""
    return generated_landing(tmp_path_factory.mktemp("celery") / "landing", regions=4, rows_per_partition=150,
                             seed=29, days=4)


def regions_and_days(landing: Path) -> tuple[list[str], list[str]]:
    from resources.settings import DEFAULT_REGIONS_FILE, load_regions

    regions = [r.region_id for r in load_regions(DEFAULT_REGIONS_FILE) if (landing / r.region_id).is_dir()]
    days = sorted(p.name for p in (landing / regions[0]).iterdir())
    return regions, days


def keys_of(landing: Path, *, days: int | None = None) -> list[str]:
    """Every region's keys over the first ``days`` days (all of them by default)."""
    regions, all_days = regions_and_days(landing)
    return [f"{d}|{r}" for d in all_days[:days] for r in regions]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    with redis_broker(tmp_path / "redis") as url:
        yield url


def completed(dep: Deployment) -> dict[tuple[str, str], int]:
    return {(k, p): n for k, p, n in sql_rows(dep.ledger_dsn, "SELECT partition_key, phase, count(*) FROM checkpoints"
                                                              " WHERE status = 'COMPLETED' GROUP BY 1, 2")}


def check_exactly_once(dep: Deployment, endpoint: Endpoint, keys: list[str]) -> None:
    """One COMPLETED checkpoint per phase and partition; every artifact delivered, one receipt and
    one object each."""
    assert completed(dep) == {(k, p): 1 for k in keys for p in PHASES}
    check_ledger_clean(dep.ledger_dsn)
    receipts = sql_rows(dep.ledger_dsn, "SELECT artifact_id, status, target FROM receipts")
    assert len(receipts) == KINDS * len(keys), receipts
    assert {(s, t) for _, s, t in receipts} == {("DELIVERED", "s3")}
    published = endpoint.keys(dep.launcher["STORMLAKE_PUBLISH_DIR"])
    assert sorted(published) == sorted(a.split("@")[0] for a, _, _ in receipts)


def check_backfill_on_workers(dep: Deployment, done: Launched, workers: list) -> dict:  # noqa: ANN001 - Worker
    """The backfill is in the launcher's instance, finished, with runs that all succeeded; each
    step of its runs ran on a worker (the workers' finished tasks are the runs' succeeded steps)."""
    assert done.ok, done.output[-4000:]
    assert "its daemon started for it" in done.output, done.output[-4000:]
    facts = dep.backfill_runs(backfill_id(done.output))
    assert facts["status"] is not None, "the backfill is not in the instance's backfills"
    # Finished, or still to be marked so by the next daemon's first pass (its own daemon has stopped).
    assert (facts["status"], facts["finished"]) in (("COMPLETED_SUCCESS", True), ("REQUESTED", False)), facts
    assert facts["runs"] and all(r["status"] == "SUCCESS" for r in facts["runs"]), facts
    steps = sum(r["steps_succeeded"] for r in facts["runs"])
    assert steps and sum(w.tasks_done() for w in workers) == steps, ([w.tasks_done() for w in workers], facts)
    return facts


def test_two_workers_backfill_16_partitions_once_and_cannot_read_the_launchers_files(
        pg_admin_dsn: str, pg_dsn: str, s3_endpoint: Endpoint, landing: Path, broker: str) -> None:
    keys = keys_of(landing)
    assert len(keys) == 16
    with deployment(pg_admin_dsn, pg_dsn, s3_endpoint, landing, broker) as dep:
        if dep.user is None:
            print("not root: the workers ran as this same user (with homes of their own)")
        w1, w2 = dep.start_worker("w1"), dep.start_worker("w2")
        start = time.monotonic()
        done = dep.backfill(keys, runs_at_once=2)  # Dagster cuts it into runs of the backfill policy, 2 at once
        print(f"16 partitions on 2 workers: {time.monotonic() - start:.1f} s")
        assert "16/16 partitions succeeded; 64 phases computed, 48 artifact deliveries" in done.output, done.output
        facts = check_backfill_on_workers(dep, done, [w1, w2])
        assert len(facts["runs"]) >= 2, facts
        assert w1.tasks_done() and w2.tasks_done(), (w1.tasks_done(), w2.tasks_done())
        check_exactly_once(dep, s3_endpoint, keys)
        assert not (dep.launcher_home / "lake").exists() and not (dep.launcher_home / "published").exists()
        password = broker.split("@")[0].rsplit(":", 1)[1]  # redis://:PASSWORD@host:port/0
        daemon_log = (dep.launcher_home / "logs" / "daemon.log").read_text(errors="replace")
        for text in (done.output, daemon_log, w1.text(), w2.text()):
            assert password not in text, "the broker's password was printed"

        if dep.user is None:
            return
        # A worker cannot read the launcher's files: a run whose landing is the launcher's own
        # copy (a local path in its 0700 home) fails on the worker, in one line naming the path.
        local = dep.launcher_home / "landing"
        direct = subprocess.run(["runuser", "-u", dep.user, "--", str(dep.python), "-c",
                                 f"open({str(next(local.rglob('*.csv')))!r}).read()"], capture_output=True, text=True)
        assert direct.returncode != 0 and "PermissionError" in direct.stderr, direct
        config = dep.root / "local-landing.yaml"
        from resources.settings import DEFAULT_REGIONS_FILE

        config.write_text(f"resources:\n  landing:\n    config:\n      root: {local}\n"
                          f"      regions_file: {DEFAULT_REGIONS_FILE}\n")
        # A backfill carries no run config and a worker reads its settings from its own environment,
        # so only a run's config (``dagster job execute -c``) points one run at the launcher's path.
        refused = dep.execute(keys[:1], config=config)
        assert not refused.ok, refused.output[-4000:]
        out = refused.output
        lines = [ln for ln in out.splitlines() if str(local) in ln]
        assert lines and "Permission" in lines[0], out[-6000:]
        print("the worker's error:", lines[0][:600])
        assert completed(dep) == {(k, p): 1 for k in keys for p in PHASES}, "the refused run changed the ledger"


def test_a_worker_killed_mid_phase_its_step_finishes_on_another_worker(
        pg_admin_dsn: str, pg_dsn: str, s3_endpoint: Endpoint, landing: Path, broker: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    keys = keys_of(landing, days=1)  # a day's 4 partitions: one run
    regions, days = regions_and_days(landing)
    # The broker hands a lost worker's step to another after this many seconds.
    with deployment(pg_admin_dsn, pg_dsn, s3_endpoint, landing, broker, redeliver_after_s=10) as dep:
        doomed = dep.start_worker("w1", STORMLAKE_FAULTS="correlate.mid_transform=hang")
        launched = dep.start_backfill(keys, runs_at_once=1)
        deadline = time.monotonic() + 240
        while "injected hang at correlate.mid_transform" not in doomed.text():
            assert launched.poll() is None, "the backfill ended before the worker reached correlate"
            assert time.monotonic() < deadline, doomed.text()[-4000:]
            time.sleep(0.1)
        assert completed(dep) == {(k, p): 1 for k in keys for p in PHASES[:2]}
        survivor = dep.start_worker("w2")
        doomed.kill()  # SIGKILL, the worker and its process: its step is neither done nor acknowledged
        killed = time.monotonic()
        done = wait_runs([launched], timeout=300)[0]
        assert done.ok, done.output[-4000:]
        print(f"the backfill finished {time.monotonic() - killed:.1f} s after the kill")
        assert "4/4 partitions succeeded" in done.output, done.output[-4000:]
        assert survivor.tasks_done() == 2, survivor.text()[-4000:]  # correlate, then present
        facts = dep.backfill_runs(backfill_id(done.output))
        assert facts["status"] is not None, "the backfill is not in the instance's backfills"
        assert len(facts["runs"]) == 1 and facts["runs"][0]["status"] == "SUCCESS", facts
        # Every step of the run succeeded on a worker: ingest and enrich on the killed one, the rest on the survivor.
        assert facts["runs"][0]["steps_succeeded"] == doomed.tasks_done() + survivor.tasks_done() == 4, facts
        check_exactly_once(dep, s3_endpoint, keys)
        # Resumed from the checkpoints: ingest and enrich, done before the kill, ran once.
        attempts = dict(((k, p), n) for k, p, n in sql_rows(
            dep.ledger_dsn, "SELECT partition_key, phase, max(attempt) FROM checkpoints GROUP BY 1, 2"))
        assert all(attempts[(k, p)] == 1 for k in keys for p in ("ingest", "enrich")), attempts

        # The lake equals a clean run's (in process, on a local lake).
        for k, v in s3_endpoint.env().items():
            monkeypatch.setenv(k, v)
        with database(pg_admin_dsn) as clean_dsn:
            clean = make_home(tmp_path / "clean", landing, clean_dsn)
            res = run(clean, "backfill", "--regions", ",".join(regions), "--days", f"{days[0]}..{days[0]}")
            assert res.returncode == 0, str(res)
            check_lake_equal(dep.launcher, lake_snapshot(clean, keys), keys)
