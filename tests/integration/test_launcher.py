"""stormlake's run queue and run launcher (pipeline/launcher.py) on a real instance.

The runs the daemon launches through them are exercised end to end by tests/e2e/test_dagster_ui.py
(UI backfills); these tests check the parts one by one: the instance builds them from its
``dagster.yaml``, the coordinator sets the backfill daemon's interval and keeps the queue's
limits, the warm process forks a worker per request and is replaced when the code changes, and
the health check and termination find a run's worker by its tags.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import dagster as dg
import pytest

from tests.dagster_jobs import one_asset_job

HANG_GUARD_S = 120  # a deadline against hanging forever, not a performance assertion


@pytest.fixture
def instance(dagster_db: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - a DagsterInstance
    from dagster._daemon import controller

    # The coordinator sets a module constant of Dagster's daemon (any instance built earlier in
    # this process set it already): start from Dagster's value, and put it back after the test.
    monkeypatch.setattr(controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", 30)
    with dg.DagsterInstance.get() as inst:
        yield inst


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not _gone(pid):
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.1)


def test_the_instance_builds_the_queue_and_launcher_of_its_dagster_yaml(instance) -> None:  # noqa: ANN001
    from pipeline.instance import DEQUEUE_INTERVAL_S, MAX_CONCURRENT_RUNS
    from pipeline.launcher import StormlakeRunCoordinator, WarmRunLauncher

    coordinator = instance.run_coordinator
    assert isinstance(coordinator, StormlakeRunCoordinator)
    assert isinstance(instance.run_launcher, WarmRunLauncher)
    queue = instance.get_concurrency_config().run_queue_config
    assert queue is not None and queue.max_concurrent_runs == MAX_CONCURRENT_RUNS
    assert [dict(lim) for lim in queue.tag_concurrency_limits] == [{"key": "dagster/backfill", "limit": 2}]
    assert coordinator.dequeue_interval_seconds == DEQUEUE_INTERVAL_S
    # The daemon would run the queue (a QueuedRunCoordinator) and the backfills.
    assert {"QUEUED_RUN_COORDINATOR", "BACKFILL", "MONITORING"} <= set(instance.get_required_daemon_types())


def test_the_warm_process_forks_a_worker_per_run_and_is_replaced_when_the_code_changes(
        instance, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import pipeline.launcher as launcher

    warm = instance.run_launcher
    try:
        # A run id the instance does not know: the worker starts, finds no run, and exits.
        first = warm._fork(str(uuid.uuid4()))
        zygote = warm._zygote
        assert zygote is not None and zygote.poll() is None
        second = warm._fork(str(uuid.uuid4()))
        assert first != second and warm._zygote is zygote  # one warm process, a worker each
        assert os.getpid() not in (first, second) and zygote.pid not in (first, second)
        _wait_gone(first)
        _wait_gone(second)
        assert zygote.poll() is None  # the warm process outlives its workers
        # New code: the next launch starts a new warm process and stops the old one.
        monkeypatch.setattr(launcher, "code_stamp", lambda: "changed")
        third = warm._fork(str(uuid.uuid4()))
        assert warm._zygote is not zygote and zygote.poll() is not None
        _wait_gone(third)
        # A warm process that died is replaced on the next launch.
        replaced = warm._zygote
        replaced.kill()
        replaced.wait()
        fourth = warm._fork(str(uuid.uuid4()))
        assert warm._zygote is not replaced and warm._zygote.poll() is None
        _wait_gone(fourth)
    finally:
        warm.dispose()
    assert warm._zygote is None


def test_health_and_termination_find_the_worker_by_its_tags(instance) -> None:  # noqa: ANN001
    from resources.keys import HOST_TAG, PID_STARTED_TAG, PID_TAG

    warm = instance.run_launcher
    here = socket.gethostname()
    # The worker stands in for a run's: it handles SIGINT as Python does (even if this process
    # ignores it, which a child would inherit) and says so before the test goes on, so the
    # interrupt never lands in its start-up.
    sleeper = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                                "print('ready', flush=True)\ntime.sleep(600)"], stdout=subprocess.PIPE, text=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def run(tags: dict[str, str]) -> dg.DagsterRun:
        return instance.add_run(dg.DagsterRun(job_name="storm_job", run_id=str(uuid.uuid4()), tags=tags,
                                              status=dg.DagsterRunStatus.STARTED))

    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"
        alive = run({PID_TAG: str(sleeper.pid), HOST_TAG: here})
        gone = run({PID_TAG: str(dead.pid), HOST_TAG: here})
        elsewhere = run({PID_TAG: str(sleeper.pid), HOST_TAG: here + "-other"})
        untagged = run({})
        # A dead worker whose pid now belongs to a later process (the sleeper): its start time differs.
        reused = run({PID_TAG: str(sleeper.pid), HOST_TAG: here, PID_STARTED_TAG: "1"})
        status = {name: warm.check_run_worker_health(r).status.value
                  for name, r in (("alive", alive), ("gone", gone), ("elsewhere", elsewhere), ("untagged", untagged),
                                  ("reused", reused))}
        assert status == {"alive": "RUNNING", "gone": "FAILED", "elsewhere": "UNKNOWN", "untagged": "UNKNOWN",
                          "reused": "FAILED"}
        assert warm.supports_check_run_worker_health
        assert warm.terminate(reused.run_id) is False  # the later process is not the run's: left alone
        assert sleeper.poll() is None
        # Terminate: the run is marked canceling and its worker gets SIGINT (Dagster's interrupt).
        assert warm.terminate(alive.run_id) is True
        assert sleeper.wait(HANG_GUARD_S) == -signal.SIGINT or sleeper.returncode == 1
        assert instance.get_run_by_id(alive.run_id).status == dg.DagsterRunStatus.CANCELING
        assert warm.terminate(gone.run_id) is False  # nothing to stop
        assert warm.terminate(elsewhere.run_id) is False  # not on this host
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        sleeper.stdout.close()


def test_a_cli_run_is_reaped_when_its_process_is_gone_or_its_pid_taken(instance) -> None:  # noqa: ANN001
    """``reap_dead_cli_runs`` fails the STARTED runs of CLI processes that died, and only those: a
    run whose pid a later process got (another start time) is dead too; a run of a live process,
    or of another host, is kept. A run tagged before start times were recorded goes by its pid."""
    from pipeline.orchestrate import reap_dead_cli_runs
    from resources.keys import HOST_TAG, LAUNCHED_BY, PID_STARTED_TAG, PID_TAG
    from resources.processes import started

    here = socket.gethostname()
    me, my_start = str(os.getpid()), started(os.getpid())
    assert my_start is not None and my_start == started(os.getpid())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def run(**tags: str) -> str:
        return instance.add_run(dg.DagsterRun(job_name="storm_job", run_id=str(uuid.uuid4()),
                                              tags={LAUNCHED_BY: "cli", HOST_TAG: here, **tags},
                                              status=dg.DagsterRunStatus.STARTED)).run_id

    runs = {
        "mine": run(**{PID_TAG: me, PID_STARTED_TAG: my_start}),
        "untimed": run(**{PID_TAG: me}),
        "taken": run(**{PID_TAG: me, PID_STARTED_TAG: str(int(my_start) - 1)}),
        "gone": run(**{PID_TAG: str(dead.pid), PID_STARTED_TAG: my_start}),
        "elsewhere": run(**{PID_TAG: str(dead.pid), HOST_TAG: here + "-other"}),
    }
    assert reap_dead_cli_runs(instance) == 2
    status = {name: instance.get_run_by_id(run_id).status.value for name, run_id in runs.items()}
    assert status == {"mine": "STARTED", "untimed": "STARTED", "taken": "FAILURE", "gone": "FAILURE",
                      "elsewhere": "STARTED"}


def test_in_the_daemon_the_warm_process_starts_with_the_coordinator(
        instance, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The daemon builds its coordinator when it starts; there the warm process starts too, so a
    backfill's first run does not wait for its imports, and its storage keeps a pool of
    connections (dagster-postgres's default opens one for every call: each planned event of a
    new run, each look at the queue). Elsewhere (the webserver) neither happens."""
    import sqlalchemy.pool

    import pipeline.launcher as launcher

    assert not launcher.in_daemon()
    instance.run_coordinator  # noqa: B018 - built outside the daemon
    assert instance.run_launcher._zygote is None
    assert isinstance(instance.event_log_storage._engine.pool, sqlalchemy.pool.NullPool)
    monkeypatch.setattr(sys, "argv", [str(launcher.Path(dg.__file__).parent / "_daemon" / "__main__.py"), "run"])
    assert launcher.in_daemon()
    with dg.DagsterInstance.get() as daemon_instance:
        daemon_instance.run_coordinator  # noqa: B018 - as the daemon builds it
        for storage in (daemon_instance.event_log_storage, daemon_instance.run_storage,
                        daemon_instance.schedule_storage):
            assert isinstance(storage._engine.pool, sqlalchemy.pool.QueuePool), storage
        warm = daemon_instance.run_launcher
        try:
            deadline = time.monotonic() + HANG_GUARD_S
            while warm._zygote is None or warm._lock.locked():  # started on its own thread
                assert time.monotonic() < deadline, "the warm process did not start"
                time.sleep(0.1)
            assert warm._zygote.poll() is None
            zygote = warm._zygote
            pid = warm._fork(str(uuid.uuid4()))  # the first launch uses it
            assert warm._zygote is zygote
            _wait_gone(pid)
        finally:
            warm.dispose()


def test_only_dagster_s_own_retry_leaves_the_failed_partitions_out(instance) -> None:  # noqa: ANN001
    """A range run's automatic retry runs without the partitions its parent named as failed; a
    re-execution a person launches (the bad file mended) runs them all again."""
    import json

    from pipeline.range_runs import failed_in_parent
    from resources.keys import FAILED_PARTITIONS_TAG

    job = one_asset_job()
    failed = ["2026-09-01|pine_belt"]
    parent = instance.create_run_for_job(job, status=dg.DagsterRunStatus.FAILURE,
                                         tags={FAILED_PARTITIONS_TAG: json.dumps(failed)})
    family = {"dagster/parent_run_id": parent.run_id, "dagster/root_run_id": parent.run_id}
    retry = instance.create_run_for_job(job, status=dg.DagsterRunStatus.NOT_STARTED, tags=family,
                                        root_run_id=parent.run_id, parent_run_id=parent.run_id)
    manual = instance.create_run_for_job(job, status=dg.DagsterRunStatus.NOT_STARTED, tags=family,
                                         root_run_id=parent.run_id, parent_run_id=parent.run_id)
    instance.add_run_tags(parent.run_id, {"dagster/auto_retry_run_id": retry.run_id})
    assert failed_in_parent(instance, retry) == frozenset(failed)
    assert failed_in_parent(instance, manual) == frozenset()


