"""Every non-public Dagster symbol stormlake uses, in one module.

Outside this module, ``assets``, ``pipeline`` and ``resources`` use Dagster's public API only:
``import dagster as dg``, the documented ``dagster.yaml`` keys and the ``dg``/``dagster``
commands. ``tests/unit/test_public_api.py`` lists the symbols used here, exactly.

Each function has no public route in Dagster 1.13 (dagster-postgres 0.29); its docstring says
why stormlake needs it and names the upstream issue or pull request it waits for:

- :func:`data_version_tag`: the tag an observation of ``landing_files`` made outside an
  observation function carries its data version under (no parameter on ``dg.AssetObservation``;
  the REST endpoint has one, dagster-io/dagster#33919).

``tests/integration/test_dagster_compat.py`` checks each of them against a real instance on
PostgreSQL and names the symbol that moved when a Dagster upgrade breaks one: after an upgrade,
run that test first. The module depends on Dagster only, so every floor may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

# Dagster is imported inside the functions: importing this module costs nothing to a command
# that never builds a Dagster instance.
if TYPE_CHECKING:
    import dagster as dg


def data_version_tag() -> str:
    """The tag an asset observation carries its data version under.

    Dagster's staleness reads an observation's data version from this tag
    (``dagster._core.definitions.data_version.DATA_VERSION_TAG``, not exported). stormlake
    observes ``landing_files`` outside an observation function: the landing sensor returns the
    observations with its run requests (``dg.SensorResult(asset_events=...)``) and the CLI
    reports them before it submits a backfill (``instance.report_runless_asset_event``), so that
    the runs read the new version when they start. Both take a plain ``dg.AssetObservation``,
    which has no data version parameter; ``dg.ObserveResult`` and ``dg.DataVersionsByPartition``
    carry one, but only as the return value of an observation function. The latest versions
    are read back from the observations' tags (``assets.landing_files.latest_versions``).

    Upstream: no issue asks for a data version on ``dg.AssetObservation``; the webserver's REST
    endpoint ``/report_asset_observation/`` takes one (``data_version``), and
    dagster-io/dagster#33919 (tags on that endpoint) is about the same tag.
    """
    from dagster._core.definitions.data_version import DATA_VERSION_TAG

    return DATA_VERSION_TAG


def step_error_wrappers() -> frozenset[str]:
    """Class names Dagster wraps a step's own exception in.

    A step failure event carries a ``SerializableErrorInfo`` (class names, not classes), so the
    CLI unwraps by name down to the error the phase raised. ``RetryRequestedFromPolicy`` (what
    an exhausted retry policy leaves, ``dagster._core.execution.plan.utils``) is not exported;
    the other two are public classes, named here so that the set stays whole.
    """
    import dagster as dg
    from dagster._core.execution.plan.utils import RetryRequestedFromPolicy

    return frozenset({dg.DagsterExecutionStepExecutionError.__name__, dg.RetryRequested.__name__,
                      RetryRequestedFromPolicy.__name__})


def fail_dead_run(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> None:
    """Mark a run whose process died as failed and free the concurrency-pool slots it held.

    A run executed in process by a CLI that was killed stays STARTED and keeps its pool slots.
    Dagster's run monitoring does this for runs the daemon launched (and frees slots only with
    ``free_slots_after_run_end_seconds``, in the daemon); nothing public does it for a run
    executed in process, and the CLI must not depend on a daemon running. The GraphQL
    ``terminateRun`` mutation needs a webserver and marks the run CANCELED, not failed.
    ``DagsterInstance.report_run_failed`` and ``EventLogStorage.free_concurrency_slots_for_run``
    are not public.
    """
    instance.report_run_failed(run, message)
    instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)


def pool_storage_connections(instance: dg.DagsterInstance, *, max_overflow: int) -> None:
    """Keep a small pool of connections to Dagster's storage in this process.

    dagster-postgres opens a new connection for every storage call (``NullPool``); a CLI
    process that runs many runs back to back pays that on each event. The webserver keeps a
    pool through ``DagsterInstance.optimize_for_webserver`` (exposed publicly only as the
    ``--db-pool-*`` options of ``dagster-webserver``/``dg dev``); no public API does it for any
    other process. No statement timeout (0): a phase's storage calls may wait on the pools.
    """
    instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=max_overflow)


def execute_launched_run(run_id: str, instance: dg.DagsterInstance) -> int:
    """Execute a run the queue launched, in this process, as ``dagster api execute_run`` does.

    stormlake's run launcher (``pipeline.launcher.WarmRunLauncher``) forks a process that has
    Dagster and the code location imported already, instead of starting a fresh interpreter per
    run; the forked process then does exactly what Dagster's own run worker does: it reports
    the process as started, executes the run (``core_execute_run``, which records STARTED,
    SUCCESS or FAILURE), and stops the run's cancellation and metrics threads.
    ``dagster._cli.api._execute_run_command_body`` is that body; the public route to it is the
    ``dagster api execute_run`` command, which is the fresh interpreter this avoids. Returns 0,
    or 1 when the run failed.
    """
    from dagster._cli.api import _execute_run_command_body

    return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=True)


def run_snapshots(instance: dg.DagsterInstance, run: dg.DagsterRun) -> tuple[Any, Any]:
    """The run's stored execution plan and job snapshots (None where it has none), read once for
    everything made from one run (:func:`copy_run`, :func:`replan_in_failed_run`)."""
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id) if run.execution_plan_snapshot_id else None
    job = instance.get_job_snapshot(run.job_snapshot_id) if run.job_snapshot_id else None
    return plan, job


def replan_in_failed_run(instance: dg.DagsterInstance, failed_run_id: str, retry: dg.DagsterRun,
                         keys: Iterable[str], *, plan: Any = None) -> int:
    """Plan ``keys`` again in the run that failed them, for every asset ``retry`` plans; how many
    planned events that wrote. ``plan``: the retry's execution plan snapshot, when already read.

    Dagster's UI tells a partition's status by its latest planned materialization: failed when
    that run failed, in progress while it runs, nothing once it succeeded without materializing
    it. Dagster's automatic retry of a failed key range run plans the whole range when it is
    created, the failed partitions too; stormlake's run coordinator then takes them out of it
    (``pipeline.range_runs``). Once the retry succeeded, the failed partitions read as never
    run. Written again in the failed run (the run that did plan them and failed them), its plan
    is the latest and they read as failed, as they are in the ledger. The events are Dagster's
    own planned materializations, one per asset and partition, built as Dagster builds them
    (``DagsterEvent.build_asset_materialization_planned_event``, not exported), and handed over
    as one batch, as Dagster hands over a new run's.
    """
    from dagster._core.events import (
        AssetMaterializationPlannedData,
        DagsterEvent,
        DagsterEventBatchMetadata,
        generate_event_batch_id,
    )

    plan = plan if plan is not None else run_snapshots(instance, retry)[0]
    if plan is None:
        return 0
    events = [DagsterEvent.build_asset_materialization_planned_event(
                  retry.job_name, step.key, AssetMaterializationPlannedData(output.properties.asset_key, partition=key))
              for step in plan.steps if step.key in plan.step_keys_to_execute
              for output in step.outputs if output.properties and output.properties.asset_key
              for key in keys]
    batch = generate_event_batch_id()
    for i, event in enumerate(events):
        instance.report_dagster_event(event, failed_run_id,
                                      batch_metadata=DagsterEventBatchMetadata(batch, i == len(events) - 1))
    return len(events)


def copy_run(instance: dg.DagsterInstance, workspace: object, run: dg.DagsterRun, tags: dict[str, str], *,
             snapshots: tuple[Any, Any] | None = None) -> dg.DagsterRun:
    """A new run (NOT_STARTED) like ``run``, with ``tags``: same job, selection, steps, snapshots,
    origins, parent and root run, run config. ``snapshots``: :func:`run_snapshots` of ``run``,
    when already read.

    stormlake's run coordinator cuts a queued key range run into several (``pipeline.range_runs``)
    when it reaches the queue: Dagster's public ways to make a run (a ``RunRequest``, a
    re-execution, ``execute_in_process``) start from a code location or from the job's
    definition, neither of which the coordinator holds. ``DagsterInstance.create_run`` with the
    stored snapshots makes the run as the backfill daemon made the original: it writes the
    planned materializations of the copy's own range, which a backfill reads to tell which
    partitions a failed run left unmaterialized. ``workspace`` is the submitting request
    context (``SubmitRunContext.workspace``), whose asset graph the planned events are resolved
    against. ``tests/e2e/test_dagster_ui.py`` (a bad partition of a UI range) runs it in a real
    daemon.
    """
    import dagster as dg

    plan, job = snapshots if snapshots is not None else run_snapshots(instance, run)
    return instance.create_run(
        job_name=run.job_name,
        run_id=None,
        run_config=run.run_config,
        status=dg.DagsterRunStatus.NOT_STARTED,
        tags=tags,
        root_run_id=run.root_run_id,
        parent_run_id=run.parent_run_id,
        step_keys_to_execute=run.step_keys_to_execute,
        execution_plan_snapshot=plan,
        job_snapshot=job,
        parent_job_snapshot=None,
        asset_selection=run.asset_selection,
        asset_check_selection=run.asset_check_selection,
        resolved_op_selection=run.resolved_op_selection,
        op_selection=run.op_selection,
        remote_job_origin=run.remote_job_origin,
        job_code_origin=run.job_code_origin,
        asset_graph=workspace.asset_graph,  # type: ignore[attr-defined]
    )

