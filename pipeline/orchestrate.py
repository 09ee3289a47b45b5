"""Run partitions through Dagster from the command line, with a progress display.

Each partition is one run of ``storm_job`` executed in this process against the instance in
``$DAGSTER_HOME`` (so the UI lists it like any other run). The ledger decides inside each phase
whether there is work; a partition that is already published costs one skip per phase.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from assets.phases import PHASES
from resources.errors import LedgerUnavailable

ASSET_PHASE = {p.asset: p.name for p in PHASES}
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
# Errors that mean PostgreSQL (ledger and Dagster storage live on the same server) is gone:
# later partitions would fail the same way, so a backfill stops at the first one.
DB_DOWN_CLASSES = {"LedgerUnavailable", "OperationalError", "PoolTimeout", "InterfaceError"}


def _db_down(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if seen.__class__.__name__ in DB_DOWN_CLASSES:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass
class PartitionRun:
    key: str
    ok: bool
    run_id: str
    seconds: float
    phases: dict[str, str] = field(default_factory=dict)  # phase -> COMPLETED | SKIPPED | FAILED
    delivered: list[str] = field(default_factory=list)
    error: str | None = None
    error_class: str | None = None

    @property
    def ledger_down(self) -> bool:
        return self.error_class in DB_DOWN_CLASSES


def _failure_message(event: dg.DagsterEvent) -> str:
    data = event.step_failure_data
    if data is None:
        return "failed"
    if data.user_failure_data is not None and data.user_failure_data.description:
        return data.user_failure_data.description
    err = data.error
    while err is not None and err.cause is not None and err.cls_name in ("DagsterExecutionStepExecutionError",):
        err = err.cause
    if err is None:
        return "failed"
    return f"{err.cls_name}: {err.message.strip().splitlines()[0] if err.message else ''}"


def run_partition(job: dg.JobDefinition, instance: dg.DagsterInstance, key: str, *,
                  tags: dict[str, str] | None = None) -> PartitionRun:
    start = time.monotonic()
    result = job.execute_in_process(partition_key=key, instance=instance, raise_on_error=False,
                                    run_config=QUIET, tags=tags or {})
    run = PartitionRun(key=key, ok=result.success, run_id=result.run_id, seconds=0.0)
    for event in result.all_events:
        if event.is_step_materialization:
            mat = event.step_materialization_data.materialization
            phase = ASSET_PHASE.get(mat.asset_key.to_user_string())
            if phase:
                status = mat.metadata.get("status")
                run.phases[phase] = str(status.value) if status is not None else "COMPLETED"
                delivered = mat.metadata.get("delivered")
                if delivered is not None:
                    run.delivered.extend(delivered.value or [])
        elif event.is_step_failure:
            step = event.step_key or ""
            phase = ASSET_PHASE.get(step.split(".")[0], step)
            run.phases[phase] = "FAILED"
            run.error = run.error or _failure_message(event)
            data = event.step_failure_data
            if run.error_class is None and data is not None and data.error is not None:
                err = data.error
                while err.cause is not None and err.cls_name == "DagsterExecutionStepExecutionError":
                    err = err.cause
                run.error_class = err.cls_name
    if not result.success and run.error is None:
        run.error = "run failed (see the run in the Dagster UI)"
    run.seconds = time.monotonic() - start
    return run


class Progress:
    """A one-line-per-partition progress display on stderr (bar redrawn in place on a TTY)."""

    MARK = {"COMPLETED": "done", "SKIPPED": "skip", "FAILED": "FAIL"}

    def __init__(self, total: int, *, stream=sys.stderr):
        self.total = total
        self.done = 0
        self.stream = stream
        self.tty = stream.isatty()
        self.start = time.monotonic()

    def _bar(self) -> str:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        return "[" + "#" * filled + "." * (width - filled) + f"] {self.done}/{self.total}"

    def starting(self, key: str) -> None:
        if self.tty:
            self.stream.write(f"\r{self._bar()} running {key} ...\033[K")
            self.stream.flush()

    def finished(self, run: PartitionRun) -> None:
        self.done += 1
        phases = " ".join(f"{p.name}:{self.MARK.get(run.phases.get(p.name, ''), '-')}" for p in PHASES)
        line = f"{self._bar()} {run.key:<28} {phases}  {run.seconds:5.1f}s"
        if run.delivered:
            line += f"  delivered {len(run.delivered)}"
        if run.error:
            line += f"\n    error: {run.error}"
        self.stream.write(("\r" if self.tty else "") + line + ("\033[K" if self.tty else "") + "\n")
        self.stream.flush()

    def close(self) -> None:
        elapsed = time.monotonic() - self.start
        self.stream.write(f"{self.done}/{self.total} partitions in {elapsed:.1f}s\n")
        self.stream.flush()


def run_partitions(keys: list[str], *, progress: Progress | None = None, preflight: bool = True,
                   on_result: Callable[[PartitionRun], None] | None = None) -> list[PartitionRun]:
    """Run each partition key through ``storm_job``, in order, in this process.

    With ``preflight`` (the default), a partition whose every phase would skip launches no run.
    """
    from assets.materialize import build_runner
    from assets.runner import PartitionRef
    from pipeline.definitions import build_resources, defs
    from pipeline.jobs import STORM_JOB

    job = defs.resolve_job_def(STORM_JOB)
    runner = build_runner(None, **build_resources(resolved=True))  # type: ignore[arg-type]
    runs: list[PartitionRun] = []
    try:
        instance = dg.DagsterInstance.get()
        # dagster-postgres opens a new connection per storage call by default (NullPool); a
        # CLI process running many runs back to back keeps a small pool instead.
        instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=4)
    except Exception as exc:
        if _db_down(exc):
            raise LedgerUnavailable(
                "PostgreSQL unreachable (Dagster instance storage); start it again, then re-run"
            ) from exc
        raise
    with instance:
        for key in keys:
            if progress:
                progress.starting(key)
            start = time.monotonic()
            if preflight and runner.preflight(PartitionRef.parse(key, runner.regions)):
                # Every phase is already done for these inputs: no run to launch.
                run = PartitionRun(key=key, ok=True, run_id="", seconds=time.monotonic() - start,
                                   phases={p.name: "SKIPPED" for p in PHASES})
            else:
                try:
                    run = run_partition(job, instance, key, tags={"stormlake/launched_by": "cli"})
                except Exception as exc:  # Dagster's storage failing under the run
                    if not _db_down(exc):
                        raise
                    run = PartitionRun(key=key, ok=False, run_id="", seconds=time.monotonic() - start,
                                       error="PostgreSQL unreachable (ledger and Dagster storage); "
                                             "start it again, then re-run the same command to resume",
                                       error_class="LedgerUnavailable")
            runs.append(run)
            if progress:
                progress.finished(run)
            if on_result:
                on_result(run)
            if run.ledger_down:
                break  # every later partition would fail the same way
    if progress:
        progress.close()
    return runs
