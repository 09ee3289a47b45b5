"""Run partitions through Dagster from the command line; each finished one is handed to the caller.

Each partition is one run of ``storm_job`` executed in this process against the instance in
``$DAGSTER_HOME`` (so the UI lists it like any other run). The ledger decides inside each phase
whether there is work; a partition that is already published costs one skip per phase.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable

import dagster as dg

from assets.context import PartitionRef
from assets.phases import BY_NAME, OP_PHASE, PHASES, TABLE_PHASE, table_keys
from assets.plan import contiguous_groups, partitions_per_run, worker_blocks
from assets.runner import Force
from pipeline.preflight import PartitionRun
from resources import dagster_compat, processes
from resources.errors import LedgerUnavailable, database_down
from resources.keys import HOST_TAG, LAUNCHED_BY, PID_STARTED_TAG, PID_TAG, RANGE_END_TAG, RANGE_START_TAG
from resources.ledger import Checkpoint, Ledger

# The phase of each table asset; a step is named after its phase's op (``OP_PHASE``).
ASSET_PHASE = dict(TABLE_PHASE)
# The CLI prints one line per partition and one per error; Dagster's console log (with its
# stack traces) stays out of the terminal. Everything is still in the run's event log.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def _root_error(err):  # (SerializableErrorInfo | None) -> SerializableErrorInfo | None
    """Unwrap Dagster's wrappers (step execution, exhausted retry policy) down to our error."""
    wrappers = dagster_compat.step_error_wrappers()
    while err is not None and err.cause is not None and err.cls_name in wrappers:
        err = err.cause
    return err


def _failure_message(event: dg.DagsterEvent) -> str:
    data = event.step_failure_data
    if data is None:
        return "failed"
    if data.user_failure_data is not None and data.user_failure_data.description:
        return data.user_failure_data.description
    err = _root_error(data.error)
    if err is None:
        return "failed"
    return f"{err.cls_name}: {err.message.strip().splitlines()[0] if err.message else ''}"


def phase_selection(first: int) -> list[dg.AssetKey] | None:
    """The table assets of the phases from the ``first``-th on (None: the whole job)."""
    if first <= 0:
        return None
    return table_keys(PHASES[first:])


def run_partition(job: dg.JobDefinition, instance: dg.DagsterInstance, key: str, *,
                  tags: dict[str, str] | None = None, first: int = 0) -> PartitionRun:
    start = time.monotonic()
    result = job.execute_in_process(partition_key=key, instance=instance, raise_on_error=False,
                                    run_config=QUIET, tags=tags or {}, asset_selection=phase_selection(first))
    run = PartitionRun(key=key, ok=result.success, run_id=result.run_id, seconds=0.0,
                       phases={p.name: "SKIPPED" for p in PHASES[:first]})
    refused: dict[str, str] = {}  # dead-lettered phases: their grader's one line
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            check = event.asset_check_evaluation_data
            mark = check.metadata.get("dead_lettered")
            phase = ASSET_PHASE.get(check.asset_key.to_user_string())
            if phase and mark is not None and mark.value is True:
                refused[phase] = check.description or f"{phase} of {key} is dead-lettered"
            continue
        if event.is_step_materialization:
            mat = event.step_materialization_data.materialization
            table = mat.asset_key.to_user_string()
            phase = ASSET_PHASE.get(table)
            if phase:
                status = mat.metadata.get("status")
                run.phases[phase] = str(status.value) if status is not None else "COMPLETED"
                # Every table of the phase carries the phase's outcome: its deliveries once.
                delivered = mat.metadata.get("delivered") if table == BY_NAME[phase].tables[0] else None
                if delivered is not None:
                    run.delivered.extend(delivered.value or [])
        elif event.is_step_failure:
            step = event.step_key or ""
            phase = OP_PHASE.get(step.split(".")[0], step)
            run.phases[phase] = "FAILED"
            run.error = run.error or _failure_message(event)
            data = event.step_failure_data
            if run.error_class is None and data is not None and data.error is not None:
                run.error_class = _root_error(data.error).cls_name
    for phase, line in refused.items():
        # The step made no attempt and ended without a failure, as a dead letter does in every run
        # (Dagster's implicit output of its tables is no outcome); the partition did not succeed.
        run.phases[phase] = "FAILED"
        run.ok = False
        run.error = run.error or line
        run.error_class = run.error_class or "DeadLettered"
    if not result.success and run.error is None:
        run.error = "run failed (see the run in the Dagster UI)"
    run.seconds = time.monotonic() - start
    return run


def reap_dead_cli_runs(instance: dg.DagsterInstance) -> int:
    """Mark runs of CLI processes that died (SIGKILL, power loss) as failed and free their slots.

    A run executed in-process by a CLI that was killed stays STARTED for ever and keeps its
    concurrency-pool slots, so later runs would wait on them. The daemon's run monitoring does
    this for the runs it launched; the CLI does it for its own, by pid and the process's start
    time on this host (a pid alone may name a later process, :mod:`resources.processes`).
    """
    host = socket.gethostname()
    reaped = 0
    records = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={LAUNCHED_BY: "cli", HOST_TAG: host}),
        limit=500,
    )
    for record in records:
        run = record.dagster_run
        try:
            pid = int(run.tags.get(PID_TAG, "0"))
        except ValueError:
            pid = 0
        if processes.alive(pid, run.tags.get(PID_STARTED_TAG)):
            continue
        dagster_compat.fail_dead_run(
            instance, run, "the stormlake process running it died; the next run resumes from the ledger")
        reaped += 1
    return reaped


def run_range(job: dg.JobDefinition, instance: dg.DagsterInstance, ledger: Ledger, group: list[str], *,
              tags: dict[str, str], on_done: Callable[[PartitionRun], None], first: int = 0) -> list[PartitionRun]:
    """One run over a key range; each partition is reported as soon as its last phase is done.

    ``first``: the index of the first phase to run (the phases before it are done for every
    partition of the range and are left out of the run). The outcomes come from ``ledger`` as
    the run's steps record them (:meth:`Ledger.watching`).
    """
    start = time.monotonic()
    runs = {k: PartitionRun(key=k, ok=False, run_id="", seconds=0.0,
                            phases={p.name: "SKIPPED" for p in PHASES[:first]}) for k in group}
    last = PHASES[-1].name

    def listen(phase: str, key: str, status: str, delivered: tuple[str, ...]) -> None:
        run = runs.get(key)
        if run is None:
            return
        run.phases[phase] = status
        run.delivered.extend(delivered)
        if phase == last and status in ("COMPLETED", "SKIPPED"):
            run.ok = True
            run.seconds = time.monotonic() - start
            on_done(run)

    with ledger.watching(listen):
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET,
                                        tags={**tags, RANGE_START_TAG: group[0], RANGE_END_TAG: group[-1]},
                                        asset_selection=phase_selection(first))
    for run in runs.values():
        run.run_id = result.run_id
    return list(runs.values())


def _open_instance() -> dg.DagsterInstance:
    """The Dagster instance of ``$DAGSTER_HOME``, with pooled storage connections."""
    try:
        instance = dg.DagsterInstance.get()
        # dagster-postgres opens a new connection per storage call by default (NullPool); a
        # CLI process running many runs back to back keeps a small pool instead.
        dagster_compat.pool_storage_connections(instance, max_overflow=4)
    except Exception as exc:
        if database_down(exc):
            raise LedgerUnavailable(
                "PostgreSQL unreachable (Dagster instance storage); start it again, then re-run"
            ) from exc
        raise
    return instance


class PartitionLauncher:
    """Launches the runs of one CLI command: a partition alone or a key range per run.

    Each run's start goes to ``on_start`` (what it covers) and every finished partition to
    :meth:`report` (and ``on_result``).
    Once PostgreSQL is gone, no further run is launched: every later partition would fail the
    same way.
    """

    def __init__(self, instance: dg.DagsterInstance, *, on_start: Callable[[str], None] | None,
                 on_result: Callable[[PartitionRun], None] | None, preflight: bool, force: Force | None = None):
        from assets.materialize import build_runner
        from pipeline.definitions import build_resources, defs
        from pipeline.jobs import STORM_JOB

        self.job = defs.resolve_job_def(STORM_JOB)
        self.runner = build_runner(None, **build_resources(resolved=True))  # type: ignore[arg-type]
        self.instance = instance
        self.on_start = on_start
        self.on_result = on_result
        self.preflight = preflight
        self.tags = {LAUNCHED_BY: "cli", PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(),
                     **({PID_STARTED_TAG: start} if (start := processes.started(os.getpid())) else {}),
                     **(force.tags() if force else {})}
        # A forced re-run keeps only the phases before the one it is forced from as they stand.
        self.keep = PHASES.index(BY_NAME[force.from_phase]) if force else len(PHASES)
        self.runs: list[PartitionRun] = []
        self.current: dict[str, list[Checkpoint]] = {}  # per key: heads of the leading phases that would skip

    @property
    def ledger_down(self) -> bool:
        return bool(self.runs) and self.runs[-1].ledger_down

    def part(self, key: str) -> PartitionRef:
        return PartitionRef.parse(key, self.runner.regions)

    def current_heads(self, key: str) -> list[Checkpoint]:
        """The heads of the leading phases that would skip (none without a preflight)."""
        return self.runner.current_heads(self.part(key))[:self.keep] if self.preflight else []

    def report(self, run: PartitionRun) -> None:
        self.runs.append(run)
        if self.on_result:
            self.on_result(run)

    def sort_out(self, keys: list[str]) -> list[str]:
        """The keys with work to do; a partition whose every phase would skip is reported here,
        with no run launched (its skips recorded)."""
        from pipeline.preflight import sort_out

        todo = sort_out(self.runner, keys, keep=self.keep, on_done=self.report) if self.preflight \
            else {key: [] for key in keys}
        self.current.update(todo)
        return list(todo)

    def single(self, key: str) -> None:
        """One run for one partition, from its first phase with work."""
        start = time.monotonic()
        if self.on_start:
            self.on_start(key)
        part = self.part(key)
        current = self.current.pop(key, None)
        if current is None:
            current = self.current_heads(key)
        self.runner.record_skips(current)
        if len(current) < len(PHASES):
            self.runner.prefetch(PHASES[len(current)], part)
        try:
            run = run_partition(self.job, self.instance, key, tags=self.tags, first=len(current))
        except Exception as exc:  # Dagster's storage failing under the run, or Dagster refusing it
            if database_down(exc):
                run = PartitionRun(key=key, ok=False, run_id="", seconds=time.monotonic() - start,
                                   error="PostgreSQL unreachable (ledger and Dagster storage); "
                                         "start it again, then re-run the same command to resume",
                                   error_class="LedgerUnavailable")
            elif isinstance(exc, dg.DagsterError):  # this partition's failure, one line; the others go on
                first_line = (str(exc).strip().splitlines() or [""])[0]
                run = PartitionRun(key=key, ok=False, run_id="", seconds=time.monotonic() - start,
                                   error=f"{exc.__class__.__name__}: {first_line}", error_class=exc.__class__.__name__)
            else:
                raise
        self.report(run)

    def ranged(self, group: list[str]) -> None:
        """One run over a key range; its unfinished partitions then run alone, for their own error."""
        if self.on_start:
            self.on_start(f"{group[0]} .. {group[-1]} ({len(group)} partitions)")
        # The range starts at the earliest phase any of its partitions needs; the phases
        # before it are current for all of them (their skips recorded here, not in a step).
        start_at = min(len(self.current[k]) for k in group)
        for key in group:
            self.runner.record_skips(self.current.pop(key)[:start_at])
        # The run's first step reads its first partition's inputs: start that read now, so
        # it overlaps the run's start-up (the step prefetches each next partition itself).
        self.runner.prefetch(PHASES[start_at], self.part(group[0]))
        try:
            runs = run_range(self.job, self.instance, self.runner.ledger, group, tags=self.tags,
                             on_done=self.report, first=start_at)
        except Exception as exc:
            if not (database_down(exc) or isinstance(exc, dg.DagsterError)):
                raise
            # Refused by Dagster as a whole: each partition runs alone below, for its own line.
            runs = [PartitionRun(key=k, ok=False, run_id="", seconds=0.0) for k in group]
        unfinished = [run for run in runs if not run.ok]
        if not unfinished or self.ledger_down:
            return
        # A partition whose phase failed runs alone, for its own error; the others of the range
        # (their later phases left undone by the failed step) run in ranges again without it.
        # (A range that failed with no partition to blame runs each of them alone, as before.)
        failed = [run.key for run in unfinished if "FAILED" in run.phases.values()]
        rest = [run.key for run in unfinished if run.key not in failed]
        self.run_groups(failed, 1)
        if self.ledger_down:
            return
        if failed:  # sorted out again: another process may have finished some of them meanwhile
            self.run_groups(self.sort_out(rest), len(group))
        else:
            self.run_groups(rest, 1)

    def run_groups(self, keys: list[str], max_per_run: int) -> None:
        """``keys`` (sorted out already) in key ranges of at most ``max_per_run``, a run each."""
        from assets.partitions import PARTITIONS

        for group in contiguous_groups(keys, PARTITIONS.get_partition_keys(), max(1, max_per_run)):
            if self.ledger_down:
                break
            if len(group) == 1:
                self.single(group[0])
            else:
                self.ranged(group)

    def launch(self, keys: list[str], max_per_run: int | None) -> list[PartitionRun]:
        todo = self.sort_out(keys)
        self.run_groups(todo, max_per_run or partitions_per_run(todo, self.runner.landing))
        return self.runs


def run_partitions(keys: list[str], *, on_start: Callable[[str], None] | None = None, preflight: bool = True,
                   max_per_run: int | None = None,
                   on_result: Callable[[PartitionRun], None] | None = None,
                   force: Force | None = None) -> list[PartitionRun]:
    """Run the partitions through ``storm_job`` in this process.

    Neighbouring partitions (the same neighbouring regions on consecutive days) share one run
    of up to ``max_per_run`` partitions (by default :func:`partitions_per_run`), a key range,
    which saves Dagster's per-run cost; if a range run fails, the partition that failed runs
    again alone, for its own error, and the range's other unfinished partitions in ranges
    without it, so a bad partition holds back no other. With ``preflight`` (the default), partitions whose every phase would
    skip launch no run at all, and a run starts at the first phase that some partition of its
    range still needs (a resumed batch does not step through its finished phases again).
    ``force``: recompute from that phase on, whatever the ledger holds (``--from``).
    """
    instance = _open_instance()
    with instance:
        reap_dead_cli_runs(instance)
        launcher = PartitionLauncher(instance, on_start=on_start, on_result=on_result, preflight=preflight,
                                     force=force)
        return launcher.launch(keys, max_per_run)


# ---- several processes ------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies (a killed CLI
    leaves no worker running on; the ledger resumes their work on the next run)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _worker(tasks, results, preflight: bool, max_per_run: int, force: Force | None) -> None:  # noqa: ANN001 - queues
    """One worker process: run blocks of keys until there are none, every finished partition
    reported on ``results``; ``None`` last (or the error that stopped it)."""
    from pipeline.console import quiet_console

    _die_with_parent()
    quiet_console()
    try:
        while (block := tasks.get()) is not None:
            runs = run_partitions(block, preflight=preflight, max_per_run=max_per_run, on_result=results.put,
                                  force=force)
            if runs and runs[-1].ledger_down:
                break
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        results.put(exc)
    results.put(None)


def _worker_context():  # -> multiprocessing context
    """How worker processes start: on Linux a fork of this process once it has imported Dagster
    and the code location and made what present makes once per process, else a fresh
    interpreter (spawn).

    A spawned worker imports Dagster and loads the code location itself: several seconds of one
    core, taken from the processes already working. Forked, it starts with all of it, shared
    copy-on-write. The fork happens before this process opens a connection, a pool or a thread
    of its own (the CLI prepares the instance and the ledger's database with connections it
    closes), so a worker inherits none.
    """
    import importlib
    import multiprocessing as mp

    from pipeline.launcher import WARM_MODULES  # what the daemon's warm process imports, too

    if not sys.platform.startswith("linux"):
        return mp.get_context("spawn")
    for module in WARM_MODULES:
        importlib.import_module(module)
    from assets.transforms.present import prepare

    prepare()  # made once, for every worker
    return mp.get_context("fork")


def run_partitions_in_workers(keys: list[str], *, workers: int, on_start: Callable[[str], None] | None = None,
                              on_result: Callable[[PartitionRun], None] | None = None,
                              preflight: bool = True, max_per_run: int | None = None,
                              force: Force | None = None) -> list[PartitionRun]:
    """Run the partitions in up to ``workers`` processes at once, each running blocks of
    neighbouring keys as :func:`run_partitions` does (range runs, preflight, skips).

    This process is one of them: it takes blocks from the same queue as the ``workers - 1``
    processes it starts (:func:`_worker_context`). A thread of this process reports what the
    others finish. Each process has its own Dagster runs, ledger sessions and leases; the ledger keeps
    every phase exactly-once whichever process runs it; the operating system places the
    processes on the cores. Once PostgreSQL is gone, no further block is started. ``max_per_run``: by default :func:`partitions_per_run` of the landing zone.
    """
    import threading

    if max_per_run is None:
        from resources.landing import Landing
        from resources.settings import load_settings

        max_per_run = partitions_per_run(keys, Landing(load_settings().landing))
    blocks = worker_blocks(keys, workers, max_per_run)
    if len(blocks) <= 1:  # one worker, or one range run's worth of keys
        return run_partitions(keys, on_start=on_start, on_result=on_result, preflight=preflight,
                              max_per_run=max_per_run, force=force)
    ctx = _worker_context()
    tasks, results = ctx.Queue(), ctx.Queue()
    for block in blocks:
        tasks.put(block)
    n = min(workers, len(blocks))
    for _ in range(n):
        tasks.put(None)  # one end marker per consumer: the n - 1 processes and this one
    procs = [ctx.Process(target=_worker, args=(tasks, results, preflight, max_per_run, force),
                         name=f"stormlake-worker-{i}")
             for i in range(1, n)]
    for proc in procs:
        proc.start()
    runs: list[PartitionRun] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def finished(run: PartitionRun) -> None:
        with lock:
            runs.append(run)
            if on_result:
                on_result(run)
        if run.ledger_down:
            _drain(tasks)

    def collect() -> None:
        running = len(procs)
        while running:
            item = results.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                errors.append(item)
                _drain(tasks)
            else:
                finished(item)

    collector = threading.Thread(target=collect, name="stormlake-worker-results", daemon=True)
    collector.start()
    try:
        while (block := tasks.get()) is not None:
            done = run_partitions(block, preflight=preflight, max_per_run=max_per_run, on_result=finished, force=force)
            if done and done[-1].ledger_down:
                _drain(tasks)
                break
    except BaseException:
        _drain(tasks)
        raise
    finally:
        collector.join()
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    if errors:
        raise errors[0]
    return runs


def _drain(tasks) -> None:  # noqa: ANN001 - a multiprocessing queue
    """Take every block not started yet off the queue, leaving the workers' end markers."""
    import queue

    left = 0
    with contextlib.suppress(queue.Empty):
        while True:
            if tasks.get_nowait() is None:
                left += 1
    for _ in range(left):
        tasks.put(None)
