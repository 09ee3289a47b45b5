"""The Dagster internals stormlake relies on, in one module.

Outside this module, ``pipeline``, ``assets`` and ``resources`` import nothing from ``dagster._*``
and call no storage method or undocumented instance method; they use ``import dagster as dg``,
the documented ``dagster.yaml`` keys and the ``dg``/``dagster`` commands. The one exception is
``pipeline/launcher.py``: a run launcher must derive from ``RunLauncher`` and
``ConfigurableClass``, which Dagster does not export. What is here has no
public route in Dagster 1.13 (dagster-postgres 0.29); each function says why stormlake needs it
and, where there is one, which upstream issue or pull request would make it unnecessary. It
lives on the ground floor and depends on Dagster only, so every floor may import it.
``tests/integration/test_dagster_compat.py`` exercises each of them against a real instance on
PostgreSQL and names the symbol that moved when a Dagster upgrade breaks one: after an upgrade,
run that test first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

# Dagster is imported inside the functions: ``pipeline.instance`` uses this module on every
# stormlake command, and commands that never build a Dagster instance (``stormlake env``,
# ``db start``) should not pay for importing Dagster.
if TYPE_CHECKING:
    import dagster as dg
    import psycopg
    import sqlalchemy as sa


def data_version_tag() -> str:
    """The tag an observation or materialization carries its data version under.

    Dagster's staleness reads it (``dagster._core.definitions.data_version.DATA_VERSION_TAG``);
    it is not exported. stormlake needs it because a step can log an observation of its own
    input only as a plain ``dg.AssetObservation`` (``dg.ObserveResult`` and
    ``dg.DataVersionsByPartition`` are for an observation function), and a data version reaches
    such an observation only through this tag.
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


def latest_observation_versions(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                                partitions: Iterable[str]) -> dict[str, str]:
    """Partition key -> data version of the latest observation of ``asset_key`` in that partition.

    One indexed query for any number of partitions (``EventLogStorage.get_latest_tags_by_partition``,
    reached through ``instance.event_log_storage``, neither of them public). The public
    ``DagsterInstance.fetch_observations`` returns records newest first across partitions, so
    the latest of each of N partitions takes N queries, or paging through every older
    observation; the landing sensor and an observation run ask this for every partition with
    landing files on each tick. Partitions never observed (or observed without a data version)
    are left out.
    """
    import dagster as dg

    keys = [str(k) for k in partitions]
    if not keys:
        return {}
    tag = data_version_tag()
    tags = instance.event_log_storage.get_latest_tags_by_partition(
        asset_key, dg.DagsterEventType.ASSET_OBSERVATION, [tag], asset_partitions=keys)
    return {k: t[tag] for k, t in tags.items() if tag in t}


def refresh_input_version(context: dg.AssetExecutionContext, input_key: dg.AssetKey) -> None:
    """Make the running step read its input ``input_key``'s latest event again.

    Dagster reads the latest observation or materialization of each input once, when the step
    starts (the step's ``DataVersionCache``), and the materialization it records points at
    that event (its provenance). A step that logs an observation of its own input (ingest
    observes the landing files it is about to read) must have that read done again, or the new
    observation counts as a change after the materialization and the fresh partition shows
    stale. There is no public way to do that: ``get_step_execution_context()`` is documented
    for framework authors only, and the cache's ``wipe``/``maybe_fetch`` are internal. Related
    upstream: the provenance of partitioned observable sources, dagster-io/dagster#33988 (PR
    #34051).
    """
    step = context.get_step_execution_context()
    step.wipe_input_asset_version_info(input_key)
    step.maybe_fetch_and_get_input_asset_version_info(input_key)


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


def storage_tables() -> list[sa.Table]:
    """Dagster's own tables (run, event-log and schedule storage), in creation order.

    The SQLAlchemy metadata of Dagster's storage is internal (``dagster._core.storage.*.schema``).
    stormlake needs it to create the tables in one transaction (:func:`complete_storage`).
    """
    from dagster._core.storage.event_log.schema import SqlEventLogStorageMetadata
    from dagster._core.storage.runs.schema import RunStorageSqlMetadata
    from dagster._core.storage.schedules.schema import ScheduleStorageSqlMetadata

    tables: dict[str, sa.Table] = {}
    for metadata in (RunStorageSqlMetadata, SqlEventLogStorageMetadata, ScheduleStorageSqlMetadata):
        for table in metadata.sorted_tables:  # a few (secondary_indexes, kvs, ...) are in several
            tables.setdefault(table.name, table)
    return list(tables.values())


def complete_storage(url: str) -> list[str]:
    """Create whatever of Dagster's tables and indexes is missing at ``url``, in one transaction.

    dagster-postgres creates its tables on an autocommit connection, one statement at a time,
    and only when its main table (``runs``, ``event_logs``, ``jobs``) is missing. A process
    killed in the middle of that leaves some tables made; every later start sees the main table,
    skips the creation, and runs fail on a missing one (``relation "asset_keys" does not
    exist``). ``dagster instance migrate`` (``DagsterInstance.upgrade``) does not help: it runs
    the alembic migrations of tables that exist and never creates a missing one. So the tables
    are created here in one PostgreSQL transaction (DDL is transactional there), whole or not at
    all, and the alembic revision is stamped in the same transaction, as dagster-postgres does
    after creating them (``stamp_alembic_rev`` and ``pg_alembic_config`` are internal). A
    half-made storage left by an older version or by Dagster's own tools is completed. Nothing
    is ever dropped: the tables may share the ledger's database.

    Args:
        url: the SQLAlchemy URL of Dagster's storage database.

    Returns:
        The tables and indexes it created (empty when the storage was whole).
    """
    import dagster_postgres.event_log.event_log as pg_event_log
    import sqlalchemy as sa
    from dagster._core.storage.sql import stamp_alembic_rev
    from dagster_postgres.utils import pg_alembic_config

    tables = storage_tables()
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            inspector = sa.inspect(conn)
            have = set(inspector.get_table_names())
            missing_tables = [t for t in tables if t.name not in have]
            missing_indexes = []  # of tables that are there already (a new table brings its own)
            for table in tables:
                if table.name in have and table.indexes:
                    named = {ix["name"] for ix in inspector.get_indexes(table.name)}
                    missing_indexes += [ix for ix in table.indexes if ix.name not in named]
            if not missing_tables and not missing_indexes:
                return []
            stamped = "alembic_version" in have and conn.execute(
                sa.text("SELECT count(*) FROM alembic_version")).scalar()
            for table in missing_tables:
                table.create(conn)
            for index in missing_indexes:
                index.create(conn)
            if not stamped:
                stamp_alembic_rev(pg_alembic_config(pg_event_log.__file__), conn)
        return [t.name for t in missing_tables] + [ix.name for ix in missing_indexes]
    finally:
        engine.dispose()


def mark_new_storage_migrated(instance: dg.DagsterInstance) -> None:
    """Record Dagster's data migrations as done on storage :func:`complete_storage` just made.

    What dagster-postgres does right after it creates its tables: run storage ``migrate`` and
    ``optimize``, event-log ``reindex_events`` and ``reindex_assets``, schedule storage
    ``migrate`` and ``optimize`` (each marks its migrations done; empty tables have nothing to
    migrate, and a migration already marked is skipped). They are methods of the storages,
    reached through ``instance.run_storage`` etc., which are not public. ``dagster instance
    migrate`` runs part of them (not ``optimize`` or ``reindex_events``) and costs a process
    start; this runs once per new database.
    """
    instance.run_storage.migrate()
    instance.run_storage.optimize()
    instance.event_log_storage.reindex_events()
    instance.event_log_storage.reindex_assets()
    schedules = instance.schedule_storage
    if schedules is not None:
        schedules.migrate()
        schedules.optimize()


def pool_keys_with_limits(conn: psycopg.Connection, keys: list[str]) -> set[str]:
    """The ``keys`` whose concurrency pool has its limit row in Dagster's storage (``conn``).

    A plain SELECT on dagster-postgres's ``concurrency_limits`` table, so that a process whose
    pools are made answers with one query and without building a ``DagsterInstance`` (the
    storage's ``get_concurrency_keys`` is not public and needs an instance). A fresh database
    (no table yet) has none.
    """
    import psycopg

    try:
        rows = conn.execute("SELECT concurrency_key FROM concurrency_limits WHERE concurrency_key = ANY(%s)",
                            (keys,)).fetchall()
    except psycopg.errors.UndefinedTable:
        return set()
    return {r[0] for r in rows}


def init_pool_limit(instance: dg.DagsterInstance, key: str) -> None:
    """Create pool ``key``'s limit row with the instance's default limit (``concurrency.pools``).

    Dagster creates the row lazily, when the first step of the pool claims a slot; on PostgreSQL
    two runs doing that at once race, and the loser's run dies with ``InFailedSqlTransaction``
    (dagster-io/dagster#33552; fixes proposed in PRs #33557, #33890). Creating each row ahead
    of any run, one process at a time, avoids the race. The method is on the event-log storage
    and not public; ``dagster instance concurrency set`` would pin an explicit limit instead of
    following ``default_limit``.
    """
    instance.event_log_storage.initialize_concurrency_limit_to_default(key)


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

