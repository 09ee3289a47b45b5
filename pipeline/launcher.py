"""How the daemon starts runs: Dagster's run queue, which cuts a key range run first, and a run
launcher that forks each run from a warm process instead of starting a fresh interpreter.

Both are named in ``dagster.yaml`` (:func:`pipeline.instance.dagster_yaml`), so every run the
daemon launches gets them: a backfill from the UI, a schedule tick, a sensor's request, ``dg
launch``, "Materialize" in the asset graph. The CLI's runs execute in its own process and use
neither.

**Why a warm launcher.** Dagster's default launcher asks the code server to start each run in a
spawned interpreter, which imports Dagster, pandas, pyarrow, deltalake and matplotlib and loads
the code location before the run's first step: several times what a small partition's four
phases take; a year's backfill from the UI, in runs of
up to 8 partitions, would pay that start more than 2,000 times. :class:`WarmRunLauncher` keeps one process (the *zygote*) with all of that imported and the code
location loaded, and forks it for each run; the fork executes the run exactly as Dagster's own
run worker does (:func:`resources.dagster_compat.execute_launched_run`), so the run's events,
status, retries and pools are Dagster's. The zygote holds no connection, pool, open table or
thread of its own when it forks, so a run starts from a clean copy.

- The zygote is started by the launcher on the first run (in the daemon's process) and reads
  one request a line on its stdin; it exits when that pipe closes, which happens when the
  daemon stops or dies. A run in progress is not stopped with it (as a run of Dagster's own
  launcher outlives a daemon restart); run monitoring fails a run whose process died.
- Each run's process id and host are run tags (:data:`PID_TAG`, :data:`HOST_TAG`): run
  monitoring asks :meth:`WarmRunLauncher.check_run_worker_health` whether it is alive, and
  "Terminate" in the UI sends it SIGINT, which Dagster turns into a cancelled run.
- Code changes: a new code location version in the code server does not reach an old zygote.
  The launcher compares the code's modification stamp (:func:`code_stamp`) before each launch
  and starts a new zygote when it changed.

**Why a run coordinator of its own.** Every queued run passes through it before it starts, so it
is where a key range run is cut: one that mixes partitions that landed with some that did not,
or the retry of a range whose phase failed for some of its partitions (:mod:`pipeline.range_runs`).
Otherwise it is Dagster's queued coordinator: every run waits in the queue and the queue daemon
starts it. How often the backfill daemon looks at new backfills is Dagster's (30 s): no
``dagster.yaml`` key sets it (dagster-io/dagster#11649).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

# A run launcher and a configurable class have no public route in Dagster 1.13 (its own launchers
# derive from these); tests/integration/test_launcher.py builds both from a real dagster.yaml.
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._serdes import ConfigurableClass, ConfigurableClassData

from resources import dagster_compat, processes
from resources.keys import HOST_TAG, PID_STARTED_TAG, PID_TAG

if TYPE_CHECKING:
    from resources.settings import Settings

#: The modules the zygote imports before its first fork: the code location and what its phases
#: import only when they run (the report's drawing, Delta writes).
WARM_MODULES = ("pipeline.definitions", "assets.materialize", "assets.transforms.pictures",
                "assets.transforms.present", "deltalake", "resources.pgserver",
                # what Dagster imports only when it executes a run
                "dagster._cli", "dagster._utils.test", "dagster._core.system_config.composite_descent",
                "dagster._core.storage.local_compute_log_manager", "dagster._core.execution.plan.active")
PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: Connections the daemon's storage pool may open beyond the one it keeps: its threads (backfill
#: iterations and submissions, the queue, sensors, schedules, run monitoring) at once.
DAEMON_POOL_OVERFLOW = 8


def in_daemon() -> bool:
    """Whether this process is Dagster's daemon (``python -m dagster._daemon run``, as ``dg dev``
    starts it, or ``dagster-daemon run``)."""
    prog = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return prog.name == "dagster-daemon" or (prog.name == "__main__.py" and prog.parent.name == "_daemon")


def code_stamp() -> str:
    """The newest modification time of the project's Python files (a new one means new code)."""
    newest = 0
    for folder in ("pipeline", "assets", "resources"):
        for path in (PROJECT_ROOT / folder).rglob("*.py"):
            newest = max(newest, path.stat().st_mtime_ns)
    return str(newest)


class StormlakeRunCoordinator(dg.QueuedRunCoordinator, ConfigurableClass):
    """Dagster's queued run coordinator, which cuts a key range run before it queues it."""

    def register_instance(self, instance: dg.DagsterInstance) -> None:
        """In the daemon, also start the run launcher's warm process now, on a thread of its own:
        the first run of a backfill then finds it ready instead of waiting the seconds its
        imports take. The daemon builds its coordinator before it starts its loops; the webserver,
        which only queues runs, starts none."""
        super().register_instance(instance)
        if in_daemon():
            # The daemon writes each new run's planned events (one per table asset and partition)
            # and polls runs and backfills; dagster-postgres would open a connection for each.
            dagster_compat.pool_storage_connections(instance, max_overflow=DAEMON_POOL_OVERFLOW)
            launcher = instance.run_launcher  # made here, before the daemon's loops could make it too
            if isinstance(launcher, WarmRunLauncher):
                threading.Thread(target=launcher.prestart, name="stormlake-warm-process", daemon=True).start()

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        """Queue the run, cut first into runs of one kind of work when it is a key range that
        mixes partitions to run with some that have not landed or are dead-lettered, or the
        retry of a range whose phase failed for some partitions (:mod:`pipeline.range_runs`). The copies are submitted right
        after it, in the same backfill, each on its own: a copy that cannot be submitted is
        failed (its partitions then count as failed in the backfill, which does not wait for it
        forever), and the others still go."""
        from pipeline.range_runs import cut
        from resources.landing import Landing
        from resources.settings import load_settings

        settings = load_settings()
        first, *copies = cut(self._instance, context.workspace, context.dagster_run, Landing(settings.landing),
                             lambda keys: dead_lettered(settings, keys))
        try:
            return super().submit_run(dg.SubmitRunContext(first, context.workspace))
        finally:
            for copy in copies:
                try:
                    super().submit_run(dg.SubmitRunContext(copy, context.workspace))
                except (dg.DagsterError, OSError) as exc:
                    latest = self._instance.get_run_by_id(copy.run_id) or copy
                    if not latest.is_finished:
                        self._instance.report_run_failed(latest, f"stormlake: the run could not be submitted: {exc}")


def dead_lettered(settings: Settings, keys: list[str]) -> dict[str, str]:
    """Of ``keys``, the partitions with a head checkpoint that failed ``dead_letter_after`` times,
    each with the first such phase (in protocol order).

    One quick read (:func:`resources.ledger.dead_lettered_phases`: no migration, no retry, 2 s
    at most), on the configured server or on the embedded one if it runs (never started for
    this). When the ledger cannot be read the answer is empty, said in the daemon's log, and
    the cut goes by landing files only: a dead-lettered partition in a range then fails it, and
    the range's retry leaves it out.
    """
    import logging

    import psycopg

    from assets.phases import PHASES
    from resources.errors import StormlakeError
    from resources.ledger import dead_lettered_phases
    from resources.logins import is_external, resolve_logins
    from resources.pgserver import is_running

    order = [phase.name for phase in PHASES]
    try:
        if is_external(settings) or is_running(settings.pgdata):
            dsn = resolve_logins(settings).pipeline
        else:
            return {}
        phases = dead_lettered_phases(dsn, keys, settings.dead_letter_after)
    except (psycopg.Error, OSError, StormlakeError) as exc:
        logging.getLogger(__name__).warning(
            "stormlake: the run coordinator could not read the dead letters (%s: %s); ranges are cut by landing"
            " files only", exc.__class__.__name__, exc)
        return {}
    return {key: min(names, key=lambda n: order.index(n) if n in order else len(order)) for key, names in phases.items()}


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in a fork of a process that has the code location loaded (module docstring)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None):
        self._inst_data = inst_data
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen[str] | None = None
        self._stamp = ""
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> WarmRunLauncher:
        return cls(inst_data=inst_data)

    # ---- the zygote -----------------------------------------------------------------------------
    def _start_zygote(self) -> subprocess.Popen[str]:
        self._stop_zygote()
        self._stamp = code_stamp()
        self._zygote = subprocess.Popen([sys.executable, "-m", "pipeline.launcher"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1, cwd=str(PROJECT_ROOT))
        ready = self._zygote.stdout.readline() if self._zygote.stdout else ""
        if not ready.startswith("ready"):
            self._stop_zygote()
            raise dg.DagsterError(f"stormlake's run launcher: its warm process did not start ({ready.strip() or 'no answer'})")
        return self._zygote

    def _stop_zygote(self) -> None:
        proc, self._zygote = self._zygote, None
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _fork(self, run_id: str) -> int:
        """The pid of a fresh fork of the zygote executing ``run_id`` (a new zygote when needed)."""
        with self._lock:
            for attempt in (1, 2):
                proc = self._zygote
                if proc is None or proc.poll() is not None or code_stamp() != self._stamp:
                    proc = self._start_zygote()
                try:
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(json.dumps({"run_id": run_id}) + "\n")
                    proc.stdin.flush()
                    answer = proc.stdout.readline()
                    return int(json.loads(answer)["pid"])
                except (OSError, ValueError, KeyError):
                    self._stop_zygote()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def prestart(self) -> None:
        """Start the warm process unless it runs already (its failure is left to the first launch,
        which starts it again and reports it)."""
        with self._lock, contextlib.suppress(OSError, dg.DagsterError):
            if self._zygote is None or self._zygote.poll() is not None:
                self._start_zygote()

    # ---- RunLauncher ----------------------------------------------------------------------------
    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        pid = self._fork(run.run_id)
        start = processes.started(pid)
        self._instance.add_run_tags(run.run_id, {PID_TAG: str(pid), HOST_TAG: socket.gethostname(),
                                                 **({PID_STARTED_TAG: start} if start else {})})
        self._instance.report_engine_event(f"Started a warm run worker for the run (pid {pid}).", run,
                                           cls=self.__class__)

    def _worker(self, run_id: str) -> int | None:
        """The pid of the run's worker if it runs on this host; 0 if it is gone (its pid free or
        taken by a later process, :mod:`resources.processes`)."""
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.tags.get(HOST_TAG) != socket.gethostname():
            return None
        try:
            pid = int(run.tags.get(PID_TAG, ""))
        except ValueError:
            return None
        return pid if processes.alive(pid, run.tags.get(PID_STARTED_TAG)) else 0

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        pid = self._worker(run_id)
        if run is None or not pid or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        try:
            os.kill(pid, signal.SIGINT)  # Dagster ends the run as CANCELED
        except ProcessLookupError:
            return False
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        pid = self._worker(run.run_id)
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, "the run's worker is not on this host")
        if not pid:
            return CheckRunHealthResult(WorkerStatus.FAILED,
                                        f"the run's worker (pid {run.tags.get(PID_TAG)}) is gone")
        return CheckRunHealthResult(WorkerStatus.RUNNING)

    def dispose(self) -> None:
        with self._lock:
            self._stop_zygote()


# ---- the zygote's own process ---------------------------------------------------------------------
def _execute(run_id: str) -> int:
    """In a fork of the zygote: execute the run, as Dagster's run worker does."""
    try:
        with dg.DagsterInstance.get() as instance:
            # A pool of storage connections for the run's events, as a CLI process keeps
            # (dagster-postgres opens a connection per event otherwise).
            dagster_compat.pool_storage_connections(instance, max_overflow=2)
            return dagster_compat.execute_launched_run(run_id, instance)
    except BaseException:  # noqa: BLE001 - the process ends here; the run's failure is in its events
        traceback.print_exc()
        return 1


def zygote_main() -> None:
    """Import the code location, say ``ready``, then fork one run worker per request line.

    The requests come on stdin; the answers (``{"pid": N}``) go to the original stdout, which is
    kept on a file descriptor of its own, while everything printed goes to stderr. Forked
    children are reaped by the kernel (SIGCHLD ignored here, restored in the child).
    """
    import importlib

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from assets.runner import prepare_process

    for module in WARM_MODULES:
        importlib.import_module(module)
    importlib.import_module("pipeline.definitions").defs.get_repository_def()
    # The instance's storage modules are imported when an instance is made; its connections
    # are not kept (dagster-postgres opens one per call unless pooled, which only a run does).
    with dg.DagsterInstance.get():
        pass
    # What present makes once per process (the page template) is made here, for every run.
    from assets.transforms.present import prepare

    prepare()
    # The allocator settings and the frozen heap (gc.freeze: what every run shares is never
    # walked by a run's collections, nor copied by them) are inherited by every fork.
    prepare_process()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon stops it by closing the pipe
    answers.write("ready\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        run_id = json.loads(line)["run_id"]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                answers.close()
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                code = _execute(run_id)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        answers.write(json.dumps({"pid": pid}) + "\n")


if __name__ == "__main__":
    zygote_main()
