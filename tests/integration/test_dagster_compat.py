"""What ``resources/dagster_compat.py`` relies on in Dagster's internals, checked against a real
instance on PostgreSQL.

After a Dagster upgrade, run this file first: each test names the internal symbol (or table,
column, tag, behaviour) that moved, and the compat function that needs a new route.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from psycopg import sql

from resources import dagster_compat as compat
from resources.pgserver import with_database

VERSION = dg.__version__


def _fail(what: str, relied_on_by: str) -> str:
    return (f"Dagster {VERSION}: {what}. resources/dagster_compat.py:{relied_on_by} relies on it; "
            f"see that function's docstring for why, and find the new route.")


# (dotted module, attribute path, parameters that must be there, compat function relying on it)
PRIVATE = [
    ("dagster._core.definitions.data_version", "DATA_VERSION_TAG", None, "data_version_tag"),
    ("dagster._core.storage.event_log.base", "EventLogStorage.get_latest_tags_by_partition",
     ("asset_key", "event_type", "tag_keys", "asset_partitions"), "latest_observation_versions"),
    ("dagster._core.execution.context.asset_execution_context", "AssetExecutionContext.get_step_execution_context",
     (), "refresh_input_version"),
    ("dagster._core.execution.context.system", "StepExecutionContext.wipe_input_asset_version_info", ("key",),
     "refresh_input_version"),
    ("dagster._core.execution.context.system", "StepExecutionContext.maybe_fetch_and_get_input_asset_version_info",
     ("key",), "refresh_input_version"),
    ("dagster._core.storage.event_log.schema", "SqlEventLogStorageMetadata", None, "storage_tables"),
    ("dagster._core.storage.runs.schema", "RunStorageSqlMetadata", None, "storage_tables"),
    ("dagster._core.storage.schedules.schema", "ScheduleStorageSqlMetadata", None, "storage_tables"),
    ("dagster._core.storage.sql", "stamp_alembic_rev", ("alembic_config", "conn"), "complete_storage"),
    ("dagster_postgres.utils", "pg_alembic_config", None, "complete_storage"),
    ("dagster._core.storage.runs.base", "RunStorage.migrate", (), "mark_new_storage_migrated"),
    ("dagster._core.storage.runs.base", "RunStorage.optimize", (), "mark_new_storage_migrated"),
    ("dagster._core.storage.event_log.base", "EventLogStorage.reindex_events", (), "mark_new_storage_migrated"),
    ("dagster._core.storage.event_log.base", "EventLogStorage.reindex_assets", (), "mark_new_storage_migrated"),
    ("dagster._core.storage.schedules.base", "ScheduleStorage.migrate", (), "mark_new_storage_migrated"),
    ("dagster._core.storage.schedules.base", "ScheduleStorage.optimize", (), "mark_new_storage_migrated"),
    ("dagster._core.storage.event_log.base", "EventLogStorage.initialize_concurrency_limit_to_default",
     ("concurrency_key",), "init_pool_limit"),
    ("dagster._core.execution.backfill", "PartitionBackfill.from_asset_partitions",
     ("backfill_id", "asset_graph", "partition_names", "asset_selection", "backfill_timestamp", "tags",
      "dynamic_partitions_store", "all_partitions", "title", "description", "run_config"), "launch_backfill"),
    ("dagster._core.instance.instance", "DagsterInstance.add_backfill", ("partition_backfill",), "launch_backfill"),
    ("dagster._core.instance.instance", "DagsterInstance.get_backfill", ("backfill_id",), "backfill_status"),
]


@pytest.mark.parametrize(("module", "path", "params", "user"), PRIVATE, ids=[f"{m}.{p}" for m, p, _, _ in PRIVATE])
def test_the_private_symbols_are_still_there(module: str, path: str, params: tuple[str, ...] | None,
                                             user: str) -> None:
    import importlib

    try:
        obj: object = importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(_fail(f"module {module} is gone ({exc})", user))
    for part in path.split("."):
        assert hasattr(obj, part), _fail(f"{module}.{path} is gone (no {part!r})", user)
        obj = getattr(obj, part)
    if params is not None:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
        missing = [p for p in params if p not in signature.parameters]
        assert not missing, _fail(f"{module}.{path}{signature} has no parameter(s) {missing}", user)


@pytest.fixture
def instance(dagster_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    """An instance on a fresh database, as ``stormlake`` writes it (``dagster.yaml`` on PostgreSQL)."""
    from pipeline.instance import ensure_pools

    monkeypatch.setenv("STORMLAKE_TEST_DAGSTER_DSN", dagster_db)
    ensure_pools(dagster_db)
    with dg.DagsterInstance.get() as inst:
        yield inst


def test_the_range_tags_are_the_ones_dagster_runs_a_key_range_by(instance: dg.DagsterInstance) -> None:
    """``resources.keys.RANGE_START_TAG``/``RANGE_END_TAG`` are Dagster's own values: a run made
    with them in process covers the key range."""
    from resources.keys import RANGE_END_TAG, RANGE_START_TAG

    parts = dg.StaticPartitionsDefinition(["a", "b", "c"])
    seen: list[list[str]] = []

    @dg.asset(partitions_def=parts)
    def ranged(context) -> None:  # noqa: ANN001 - Dagster reads the annotation, a string here
        seen.append(list(context.partition_keys))

    job = dg.Definitions(assets=[ranged]).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, tags={RANGE_START_TAG: "a", RANGE_END_TAG: "b"})
    assert result.success and seen == [["a", "b"]], (
        f"Dagster {VERSION}: a run tagged {RANGE_START_TAG}/{RANGE_END_TAG} no longer covers that key range; "
        "resources/keys.py names Dagster's range tags (dagster._core.storage.tags)")


def test_the_data_version_tag_is_the_one_dagster_reads() -> None:
    tag = compat.data_version_tag()
    obs = dg.AssetObservation(asset_key="a", tags={tag: "v1"})
    assert obs.data_version == "v1", _fail(f"an observation tagged {tag!r} no longer has that data version",
                                           "data_version_tag")


def test_latest_observation_versions_reads_the_latest_per_partition(instance: dg.DagsterInstance) -> None:
    key = dg.AssetKey("source")
    tag = compat.data_version_tag()
    for partition, version in [("a", "1"), ("b", "1"), ("a", "2")]:
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=key, partition=partition,
                                                                tags={tag: version}))
    instance.report_runless_asset_event(dg.AssetObservation(asset_key=key, partition="c"))  # no version
    got = compat.latest_observation_versions(instance, key, ["a", "b", "c", "never"])
    assert got == {"a": "2", "b": "1"}, _fail(f"the latest observed versions read {got}",
                                              "latest_observation_versions")
    assert compat.latest_observation_versions(instance, key, []) == {}


def _provenance_pointer(instance: dg.DagsterInstance, asset: str, source: dg.AssetKey) -> int | None:
    mat = instance.fetch_materializations(dg.AssetKey(asset), limit=1).records[0]
    provenance = dg.DataProvenance.from_tags(mat.asset_materialization.tags)
    return provenance.input_storage_ids.get(source) if provenance else None


def test_refresh_input_version_points_the_materialization_at_the_step_s_own_observation(
        instance: dg.DagsterInstance) -> None:
    source = dg.AssetKey("files")
    tag = compat.data_version_tag()

    @dg.observable_source_asset(name="files")
    def files() -> dg.DataVersion:
        return dg.DataVersion("old")

    def reader(refresh: bool):  # an asset that observes its own input first, as ingest does
        @dg.asset(name=f"reader_{'refreshed' if refresh else 'plain'}", deps=[files])
        def _reader(context) -> dg.MaterializeResult:  # (a string annotation would not resolve here)
            context.log_event(dg.AssetObservation(asset_key=source, tags={tag: f"new-{refresh}"}))
            if refresh:
                compat.refresh_input_version(context, source)
            return dg.MaterializeResult()

        return _reader

    instance.report_runless_asset_event(dg.AssetObservation(asset_key=source, tags={tag: "old"}))
    for refresh in (True, False):
        asset = reader(refresh)
        result = dg.materialize([files, asset], selection=[asset.key], instance=instance)
        assert result.success
        latest = instance.fetch_observations(source, limit=1).records[0].storage_id
        pointer = _provenance_pointer(instance, asset.key.to_user_string(), source)
        if refresh:
            assert pointer == latest, _fail(
                f"after refresh_input_version the materialization points at {pointer}, not at the step's own "
                f"observation {latest}", "refresh_input_version")
        else:
            assert pointer is not None and pointer < latest, (
                f"Dagster {VERSION} now reads an input's latest observation after the step logged one "
                f"(pointer {pointer}, latest {latest}): resources/dagster_compat.py:refresh_input_version may "
                f"not be needed any more")


def test_the_storage_is_created_whole_stamped_and_marked(pg_admin_dsn: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from alembic.script import ScriptDirectory
    from dagster_postgres.event_log import event_log as pg_event_log
    from dagster_postgres.utils import pg_alembic_config

    from pipeline.instance import dagster_yaml, sqlalchemy_url

    name = f"stormlake_t_{uuid.uuid4().hex[:12]}_dagster"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_database(pg_admin_dsn, name)
    try:
        names = {t.name for t in compat.storage_tables()}
        for table in ("runs", "event_logs", "asset_keys", "jobs", "concurrency_limits", "concurrency_slots"):
            assert table in names, _fail(f"Dagster's storage metadata has no table {table}", "storage_tables")
        with psycopg.connect(dsn) as conn:
            assert compat.pool_keys_with_limits(conn, ["k"]) == set()  # no table yet

        created = compat.complete_storage(sqlalchemy_url(dsn))
        assert names <= set(created)
        assert compat.complete_storage(sqlalchemy_url(dsn)) == []
        head = ScriptDirectory.from_config(pg_alembic_config(pg_event_log.__file__)).get_current_head()
        with psycopg.connect(dsn) as conn:
            stamped = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
        assert stamped == [head], _fail(f"the storage is stamped {stamped}, the alembic head is {head}",
                                        "complete_storage")

        home = tmp_path / "dagster"
        home.mkdir()
        (home / "dagster.yaml").write_text(dagster_yaml(sqlalchemy_url(dsn)))
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        with dg.DagsterInstance.get() as inst:
            compat.mark_new_storage_migrated(inst)
            assert inst.event_log_storage.has_secondary_index("asset_key_table"), _fail(
                "reindex_assets no longer marks asset_key_table", "mark_new_storage_migrated")
            assert inst.run_storage.has_built_index("run_partitions"), _fail(
                "the run storage's migrate/optimize no longer marks run_partitions", "mark_new_storage_migrated")
            compat.init_pool_limit(inst, "k")
            info = inst.event_log_storage.get_concurrency_info("k")
            assert info.slot_count == inst.global_op_concurrency_default_limit == 2, _fail(
                f"pool k has {info.slot_count} slots, not the default limit", "init_pool_limit")
        with psycopg.connect(dsn) as conn:
            assert compat.pool_keys_with_limits(conn, ["k", "other"]) == {"k"}, _fail(
                "concurrency_limits (concurrency_key) does not list the pool", "pool_keys_with_limits")
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_launch_backfill_adds_an_asset_backfill_of_exactly_the_keys(instance: dg.DagsterInstance) -> None:
    """The backfill ``stormlake backfill`` submits: Dagster's own asset backfill (the UI lists it,
    the backfill daemon cuts it into runs), of the given assets and partition keys, with the tags
    every run of it carries; REQUESTED until a daemon has done it."""
    from assets.phases import PHASES, table_keys
    from resources.keys import partition_key

    keys = [partition_key("2026-09-01", "gulf_coast"), partition_key("2026-09-02", "gulf_coast")]
    assets = table_keys(PHASES[2:])
    backfill_id = compat.launch_backfill(instance, assets, keys, tags={"stormlake/launched_by": "test"}, title="t")
    assert compat.backfill_status(instance, backfill_id) == ("REQUESTED", False), _fail(
        "a new backfill is not REQUESTED and unfinished", "backfill_status")
    stored = instance.get_backfill(backfill_id)
    assert stored is not None and stored.title == "t" and stored.tags == {"stormlake/launched_by": "test"}
    assert set(stored.asset_selection) == set(assets), _fail("the backfill's assets are not the given ones",
                                                            "launch_backfill")
    target = stored.asset_backfill_data.target_subset
    for key in assets:
        got = set(target.get_partitions_subset(key).get_partition_keys())
        assert got == set(keys), _fail(f"the backfill targets {sorted(got)} of {key}, not the given keys",
                                       "launch_backfill")
    assert compat.backfill_status(instance, "nosuchid") is None
