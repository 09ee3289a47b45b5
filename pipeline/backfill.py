"""``stormlake backfill`` and ``demo``: one Dagster asset backfill of the selected partitions, watched
to its end.

- **Submission.** The table assets of the phases (from ``--from PHASE`` on, with the force tags
  of :class:`assets.runner.Force`) for exactly the selected keys become one asset backfill
  (:func:`resources.dagster_compat.launch_backfill`), listed in the UI with its runs. Dagster
  cuts it into key range runs by the phases' backfill policy (:data:`assets.plan.BACKFILL_POLICY`),
  and the run queue launches them, at most ``max_concurrent_runs`` at once (dagster.yaml).
- **The daemon.** Backfills, the run queue and the outbox sensor are the daemon's. When none is
  live on the instance, ``dagster-daemon run`` is started for the backfill's lifetime
  (:class:`Daemon`): in a session of its own, with this process's environment, killed by the
  kernel if this process dies (``PR_SET_PDEATHSIG``), its log in ``$STORMLAKE_HOME/logs/``.
- **Watching.** Progress and errors come from the ledger (each phase's head checkpoint and its
  newest event since the backfill began) and from the instance (the runs tagged
  ``dagster/backfill=<id>``, :func:`watch`).

A selection whose every phase would skip is no backfill: the ledger says so first
(:func:`pipeline.preflight.all_current`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from assets.phases import BY_NAME, PHASES, table_keys
from pipeline.progress import PartitionRun, Progress
from resources.errors import LedgerUnavailable, database_down
from resources.keys import AUTO_RETRY_TAG, BACKFILL_TAG, LAUNCHED_BY, WILL_RETRY_TAG
from resources.settings import Settings

if TYPE_CHECKING:
    import dagster as dg

    from assets.runner import Force
    from resources.ledger import Checkpoint, Ledger

#: How long the outbox sensor may take to continue a partition left between phases once the
#: backfill's runs are over: one tick of it (``pipeline.sensors.SENSOR_INTERVAL_S``) and its run's start.
OUTBOX_WAIT_S = 45
POLL_S = 1.0
POLL_SPREAD = 20  # after a poll of t s the next waits 20 t: watching a year stays a small share of a core
DAEMON_STOP_S = 60
BIN = Path(sys.executable).parent


def _die_with_parent() -> None:
    """In the daemon's process before it runs: the kernel sends it SIGKILL when the process that
    started it dies (a killed CLI leaves no daemon behind)."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Daemon:
    """The instance's daemon for one backfill: a live one, or ``dagster-daemon run`` started here.

    Whether a daemon is live is Dagster's public check, ``dagster-daemon liveness-check``, which
    goes by the daemons' heartbeats in the instance's storage. Heartbeats outlive their daemon (the
    check tolerates half an hour), so the heartbeats of a daemon started here must not count once
    it is gone. A daemon started here holds a lock on ``logs/daemon.lock`` for its whole life (the
    file descriptor is inherited, so the lock goes when the daemon's process ends, however it
    ends), and the file is touched while its backfill is watched: another backfill that finds the
    lock held uses that daemon (and starts its own when the lock comes free); one that finds it
    free asks the check for heartbeats newer than the file only (``DAGSTER_DAEMON_HEARTBEAT_TOLERANCE``
    is how far back the check looks beyond one heartbeat interval).
    """

    HEARTBEAT_INTERVAL_S = 30  # Dagster's; liveness-check allows one interval plus the tolerance
    #: Dagster's own tolerance (half an hour) would take a daemon stopped minutes ago for a live one.
    HEARTBEAT_TOLERANCE_S = 30
    RECHECK_S = 60  # how often a borrowed daemon of the instance is checked again

    def __init__(self, settings: Settings, env: dict[str, str]):
        self.settings = settings
        self.env = env
        self.logs = settings.home / "logs"
        self.lock_file = self.logs / "daemon.lock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.fd: int | None = None
        self.checking: subprocess.Popen[bytes] | None = None
        self.checked = 0.0
        self.borrowed = ""  # "cli": another backfill's daemon; "instance": a daemon of stormlake ui, dg dev, ...

    def _lock(self) -> int | None:
        """The lock file, locked by this process; None when a live daemon of another backfill holds it."""
        self.logs.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def begin(self) -> None:
        """Start finding out which daemon serves the backfill (the check runs meanwhile). An
        instance whose storage this process has just made has had no daemon: no check."""
        from pipeline.instance import made_here

        self.fd = self._lock()
        if self.fd is not None and not made_here(self.settings):
            self.checking = self._liveness()

    def _liveness(self) -> subprocess.Popen[bytes]:
        """``dagster-daemon liveness-check``, counting only heartbeats of the last
        :data:`HEARTBEAT_TOLERANCE_S` beyond one interval, and none from before the last daemon
        started here was last seen (the lock file's time)."""
        tolerance = self.HEARTBEAT_TOLERANCE_S
        with contextlib.suppress(OSError):
            if self.lock_file.stat().st_size:
                tolerance = min(tolerance, int(time.time() - self.lock_file.stat().st_mtime) - self.HEARTBEAT_INTERVAL_S - 1)
        return subprocess.Popen([str(BIN / "dagster-daemon"), "liveness-check"],
                                env=dict(self.env, DAGSTER_DAEMON_HEARTBEAT_TOLERANCE=str(tolerance)),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def cancel(self) -> None:
        """No backfill after all: stop the check, let the lock go."""
        if self.checking is not None and self.checking.poll() is None:
            self.checking.kill()
            self.checking.wait()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def ensure(self, workers: int | None) -> str:
        """Make sure a daemon serves the instance; one line on which (empty: one started here)."""
        if self.fd is None:
            self.borrowed = "cli"
            return "the daemon of another stormlake backfill runs it"
        live = self.checking is not None and self.checking.wait() == 0
        self.checking, self.checked = None, time.monotonic()
        if live:
            os.close(self.fd)
            self.fd = None
            self.borrowed = "instance"
            return "a live Dagster daemon on the instance runs it (stormlake ui, dg dev)"
        self._start(workers)
        return ""

    def _start(self, workers: int | None) -> None:
        from pipeline.instance import prepare_dagster_home, write_workspace

        assert self.fd is not None
        if workers is not None:  # the queue's limit for this daemon (dagster.yaml is read when it starts)
            import dataclasses

            prepare_dagster_home(dataclasses.replace(self.settings, workers=workers))
        workspace = write_workspace(Path(self.env["DAGSTER_HOME"]))
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"running, started by {os.getpid()}\n".encode(), 0)
        with open(self.logs / "daemon.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], env=self.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(self.fd,),
                preexec_fn=_die_with_parent)  # noqa: PLW1509 - from the main thread, before any thread
        self.borrowed = ""

    def check(self, workers: int | None) -> str:
        """Between polls: the lock file touched while a daemon started here runs; a daemon used
        here that went away replaced by one started here (one line when that happened)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.utime(self.lock_file)
                return ""
            self.proc = None
            self._start(workers)
            return f"the daemon started for this backfill ended (its log: {self.logs / 'daemon.log'}); started it again"
        if self.borrowed == "instance":
            if self.checking is None and time.monotonic() - self.checked > self.RECHECK_S:
                self.checking = self._liveness()
            if self.checking is None or self.checking.poll() is None:
                return ""
            live, self.checking, self.checked = self.checking.returncode == 0, None, time.monotonic()
            if live:
                return ""
        self.fd = self._lock()
        if self.fd is None:
            return ""
        self._start(workers)
        return "the daemon this backfill used stopped; started one for it"

    def stop(self) -> None:
        """Stop the daemon started here (it stops its code server); a daemon that does not stop in
        time goes with what is left of its session. Runs in progress are Dagster's: a run outlives
        the daemon that launched it."""
        self.cancel()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(DAEMON_STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(OSError):
            self.lock_file.write_text("stopped\n")  # its heartbeats end here


def _instance() -> dg.DagsterInstance:
    """The Dagster instance of ``$DAGSTER_HOME``; its PostgreSQL gone is the one-line LedgerUnavailable."""
    import dagster as dg

    try:
        return dg.DagsterInstance.get()
    except Exception as exc:
        if database_down(exc):
            raise LedgerUnavailable("PostgreSQL unreachable (Dagster instance storage); start it again, then re-run"
                                    ) from exc
        raise


def _error(head: Checkpoint) -> str:
    """A failed attempt's error as the ledger stores it, one line."""
    message = (head.error_message or "").strip().splitlines()[0] if head.error_message else ""
    cls = head.error_class or "Error"
    return message if message.startswith(f"{cls}:") else f"{cls}: {message}"


class Watch:
    """What a backfill has done to each selected partition so far: the ledger's heads and newest
    events since it began (``mark``), and the instance's runs of it."""

    def __init__(self, instance: dg.DagsterInstance, ledger: Ledger, backfill_id: str, keys: list[str], *,
                 first: int, mark: int, dead_letter_after: int):
        from resources.ledger_views import LedgerViews

        self.instance = instance
        self.ledger = ledger
        self.views = LedgerViews(ledger)
        self.backfill_id = backfill_id
        self.pending = list(keys)
        self.first = first
        self.mark = mark
        self.dead_letter_after = dead_letter_after
        self.start = time.monotonic()
        self.in_progress = 0
        self.left: list[PartitionRun] = []  # the keys not terminal at the last poll, as they stood
        self.failed_runs: list[dg.DagsterRun] = []
        self.ended_at: float | None = None

    def runs(self) -> tuple[int, int, bool, bool]:
        """(runs of the backfill, those queued or in progress, whether a failed one will be retried,
        whether an outbox sensor run is in progress)."""
        import dagster as dg

        going = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
                 dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
        records = self.instance.get_run_records(filters=dg.RunsFilter(tags={BACKFILL_TAG: self.backfill_id}))
        self.failed_runs = [r.dagster_run for r in records if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
        in_progress = sum(r.dagster_run.status in going for r in records)
        retry = any(r.dagster_run.status == dg.DagsterRunStatus.FAILURE and r.dagster_run.tags.get(WILL_RETRY_TAG) == "true"
                    and not r.dagster_run.tags.get(AUTO_RETRY_TAG) for r in records)
        outbox = bool(self.instance.get_run_records(
            filters=dg.RunsFilter(tags={LAUNCHED_BY: "outbox_sensor"}, statuses=going), limit=1))
        return len(records), in_progress, retry, outbox

    def failed_run_of(self, key: str) -> str | None:
        """The id of a failed run of the backfill that covered ``key`` (its error is the run's, not
        the ledger's: the run failed before the phase recorded an attempt)."""
        import dagster as dg

        from assets.partitions import PARTITIONS
        from resources.keys import PARTITION_TAG, RANGE_END_TAG, RANGE_START_TAG

        for run in self.failed_runs:
            start, end = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
            if run.tags.get(PARTITION_TAG) == key or (start and end and key in PARTITIONS.get_partition_keys_in_range(
                    dg.PartitionKeyRange(start, end))):
                return run.run_id
        return None

    def partition(self, key: str, heads: dict[tuple[str, str], Checkpoint], events: dict[tuple[str, str], str],
                  *, settled: bool, ended: bool) -> tuple[PartitionRun, bool]:
        """The key's outcome so far, and whether it is terminal in the ledger. ``settled``: no run of
        the backfill is queued, in progress or about to be retried; ``ended``: and Dagster marked
        the backfill finished."""
        run = PartitionRun(key=key, ok=False, seconds=time.monotonic() - self.start,
                           phases={p.name: "SKIPPED" for p in PHASES[:self.first]})
        for phase in PHASES[self.first:]:
            status = events.get((key, phase.name))
            head = heads.get((key, phase.name))
            if status in ("COMPLETED", "SKIPPED", "FAILED"):
                run.phases[phase.name] = status
            if status == "COMPLETED" and head is not None and head.status == "COMPLETED":
                run.delivered.extend((head.summary or {}).get("delivered") or [])
            if status == "FAILED" and head is not None and head.status == "FAILED":
                run.error, run.error_class = f"{phase.name} failed: {_error(head)}", head.error_class
                return run, settled
            if (status is None and ended and head is not None and head.status == "FAILED"
                    and head.failures >= self.dead_letter_after):  # refused: no attempt, no event
                from assets.runner import dead_letter_line

                run.phases[phase.name] = "FAILED"
                run.error, run.error_class = dead_letter_line(head), "DeadLettered"
                return run, True
            if status not in ("COMPLETED", "SKIPPED"):
                return run, False
        run.ok = True
        return run, True

    def poll(self, progress: Progress, results: list[PartitionRun]) -> bool:
        """Report the partitions that became terminal; whether the watch is over (then the keys
        left are in :attr:`left`)."""
        from resources import dagster_compat

        made, in_progress, retry, outbox = self.runs()
        if in_progress != self.in_progress:
            self.in_progress = in_progress
            progress.starting(f"{in_progress} run{'s' if in_progress != 1 else ''} of backfill {self.backfill_id}"
                              " in progress")
        status = dagster_compat.backfill_status(self.instance, self.backfill_id)
        finished = status is not None and status[1]
        # Settled: the backfill's runs are made (or it is finished) and none is going or to be retried.
        settled = bool(made or finished) and not (in_progress or retry)
        ended = settled and finished and not outbox
        heads = {(cp.partition_key, cp.phase): cp for cp in self.ledger.heads(self.pending)}
        events = {(e.partition_key, e.phase): e.status for e in self.views.latest_events(self.pending, self.mark)}
        self.left = []
        for key in list(self.pending):
            run, terminal = self.partition(key, heads, events, settled=settled, ended=ended)
            if terminal:
                self.pending.remove(key)
                results.append(run)
                progress.finished(run)
            else:
                self.left.append(run)
        if not self.pending and settled:
            return True
        if not ended:
            self.ended_at = None
            return False
        # The backfill is over: a partition left between phases waits for the outbox sensor's run.
        self.ended_at = self.ended_at or time.monotonic()
        return not self.between() or time.monotonic() - self.ended_at > OUTBOX_WAIT_S

    def between(self) -> list[str]:
        """The keys left that some phase of the backfill finished: stopped between phases."""
        return [r.key for r in self.left if any(r.phases.get(p.name) in ("COMPLETED", "SKIPPED") for p in PHASES[self.first:])]


def run_backfill(settings: Settings, keys: list[str], *, workers: int | None, force: Force | None,
                 progress: Progress) -> tuple[list[PartitionRun], list[str]]:
    """Run ``keys`` through one Dagster asset backfill and watch it to its end: each partition's
    outcome, and the lines to say on stderr (which daemon, a partition left between phases)."""
    from pipeline.preflight import all_current, light_runner
    from resources.ledger_views import LedgerViews

    env = dict(os.environ, STORMLAKE_HOME=str(settings.home),
               # The daemon started for a backfill serves it: landed files outside the selection wait
               # for `stormlake ui` (the landing sensor keeps its default, unless started in the UI).
               STORMLAKE_LANDING_SENSOR="stopped")
    daemon = Daemon(settings, env)
    daemon.begin()  # the check runs while the ledger is asked
    try:
        runner = light_runner(settings)
        if force is None and all_current(runner, keys):
            daemon.cancel()
            runs = [PartitionRun(key=k, ok=True, seconds=0.0, phases={p.name: "SKIPPED" for p in PHASES}) for k in keys]
            for run in runs:
                progress.finished(run)
            return runs, []
        instance = _instance()
    except BaseException:
        daemon.cancel()
        raise
    lines: list[str] = []
    with instance:  # its storage connections closed at the end
        try:
            said = daemon.ensure(workers)
            if said:
                lines.append(f"stormlake: {said}" + (f"; the instance's max_concurrent_runs holds, not --workers {workers}"
                                                      if workers is not None else ""))
            first = PHASES.index(BY_NAME[force.from_phase]) if force else 0
            mark = LedgerViews(runner.ledger).last_event_id()
            tags = {LAUNCHED_BY: "cli", **(force.tags() if force else {})}
            from assets.landing_files import observe
            from pipeline.definitions import defs
            from resources import dagster_compat

            # The landing files' versions are observed before the runs read them (ingest does not
            # observe its own input), so a fresh ingest does not show stale.
            observe(instance, runner.landing, keys)
            title = f"stormlake backfill of {len(keys)} partitions" + (f" from {force.from_phase}" if force else "")
            backfill_id = dagster_compat.launch_backfill(instance, defs, table_keys(PHASES[first:]), keys, tags=tags,
                                                         title=title)
            sys.stderr.write(f"backfill {backfill_id}: {len(keys)} partitions through Dagster (instance "
                             f"{os.environ['DAGSTER_HOME']}{'' if daemon.borrowed else ', its daemon started for it'})\n")
            watch = Watch(instance, runner.ledger, backfill_id, keys, first=first, mark=mark,
                          dead_letter_after=settings.dead_letter_after)
            results: list[PartitionRun] = []
            while True:
                began = time.monotonic()
                if watch.poll(progress, results):
                    break
                said = daemon.check(workers)
                if said:
                    sys.stderr.write(f"stormlake: {said}\n")
                time.sleep(max(POLL_S, POLL_SPREAD * (time.monotonic() - began)))
            stopped = watch.between()
            for run in watch.left:
                failed = None if run.key in stopped else watch.failed_run_of(run.key)
                if failed:
                    run.error = (f"run {failed} of backfill {backfill_id} failed before the phase recorded an attempt"
                                 " (the run's log in the Dagster UI has its error)")
                elif run.key not in stopped:
                    run.error = f"backfill {backfill_id} ended without running it (see the backfill in the Dagster UI)"
                progress.finished(run)
                results.append(run)
            if stopped:
                lines.append(f"stormlake: {len(stopped)} partition{'s' if len(stopped) > 1 else ''} stopped between phases"
                             f" ({', '.join(stopped[:5])}{', ...' if len(stopped) > 5 else ''}); the outbox sensor"
                             " continues them while a daemon runs (stormlake ui)")
            # A backfill's own daemon stops with its partitions done: Dagster marks the backfill
            # finished on the next daemon's first pass (stormlake ui, the next backfill).
            return results, lines
        except Exception as exc:
            if database_down(exc) and not isinstance(exc, LedgerUnavailable):
                raise LedgerUnavailable("PostgreSQL unreachable (ledger and Dagster storage); start it again, then re-run"
                                        " the same command to resume") from exc
            raise
        finally:
            daemon.stop()
