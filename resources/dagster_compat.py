"""The Dagster internals stormlake relies on, in one module.

Outside this module, ``pipeline``, ``assets`` and ``resources`` import nothing from ``dagster._*``
and call no storage method or undocumented instance method; they use ``import dagster as dg``,
the documented ``dagster.yaml`` keys and the ``dg``/``dagster`` commands. What is here has no
public route in Dagster 1.13 (dagster-postgres 0.29); each function says why stormlake needs it
and, where there is one, which upstream issue or pull request would make it unnecessary. It
lives on the ground floor and depends on Dagster only, so every floor may import it.
``tests/integration/test_dagster_compat.py`` exercises each of them against a real instance on
PostgreSQL and names the symbol that moved when a Dagster upgrade breaks one: after an upgrade,
run that test first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

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


def launch_backfill(instance: dg.DagsterInstance, asset_keys: Iterable[dg.AssetKey], partition_keys: Iterable[str], *,
                    tags: dict[str, str], title: str) -> str:
    """Add an asset backfill of ``asset_keys`` for exactly ``partition_keys`` to the instance; its id.

    The backfill is Dagster's own: the backfill daemon cuts it into runs by the assets' backfill
    policy, the run queue launches them, and the UI lists it (Overview, Backfills) with its runs,
    each carrying ``tags`` and ``dagster/backfill=<id>``. Dagster 1.13 has no public route to
    create one from Python: the public route is the GraphQL mutation ``launchPartitionBackfill``,
    which needs a running webserver. What that mutation does is done here:
    ``PartitionBackfill.from_asset_partitions`` (``dagster._core.execution.backfill``, not
    exported) over the code location's asset graph (``Definitions.resolve_asset_graph``, not
    public), then ``DagsterInstance.add_backfill`` (not public). The id has the shape of
    Dagster's own (eight lowercase letters).
    """
    import random
    import string
    import time

    from dagster._core.execution.backfill import PartitionBackfill

    from pipeline.definitions import defs

    backfill_id = "".join(random.choices(string.ascii_lowercase, k=8))
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id, asset_graph=defs.resolve_asset_graph(), partition_names=list(partition_keys),
        asset_selection=list(asset_keys), backfill_timestamp=time.time(), tags=dict(tags),
        dynamic_partitions_store=instance, all_partitions=False, title=title, description=None, run_config=None)
    instance.add_backfill(backfill)
    return backfill_id


def backfill_status(instance: dg.DagsterInstance, backfill_id: str) -> tuple[str, bool] | None:
    """``(status, finished)`` of the backfill ``backfill_id`` (None when the instance has none):
    Dagster's status name (``REQUESTED``, ``COMPLETED_SUCCESS``, ``COMPLETED_FAILED``,
    ``CANCELED``, ...) and whether the backfill daemon is done with it. ``instance.get_backfill``
    is not public; the public route is the GraphQL query ``partitionBackfillOrError``, which needs
    a running webserver."""
    backfill = instance.get_backfill(backfill_id)
    if backfill is None:
        return None
    return backfill.status.value, backfill.status.value not in ("REQUESTED", "CANCELING", "FAILING")
