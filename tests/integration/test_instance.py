"""Dagster's storage on PostgreSQL: created whole, and a half-made one (a kill during creation) completed."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def _expected_tables() -> set[str]:
    from resources.dagster_compat import storage_tables

    return {t.name for t in storage_tables()}


def _assert_usable(dsn: str) -> None:
    import dagster as dg

    from pipeline.instance import pool_keys

    assert _expected_tables() <= _tables(dsn)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
        marked = {r[0] for r in conn.execute("SELECT name FROM secondary_indexes WHERE migration_completed IS NOT NULL")}
    with dg.DagsterInstance.get() as instance:
        assert instance.event_log_storage.get_asset_keys() == []  # asset_keys is there
        assert instance.get_runs() == []
        assert set(pool_keys()) <= set(instance.event_log_storage.get_concurrency_keys())
        assert instance.event_log_storage.has_secondary_index("asset_key_table")
        assert instance.run_storage.has_built_index("run_partitions")
    assert {"asset_key_table", "run_partitions"} <= marked


def test_fresh_storage_is_created_in_one_go(dagster_db: str) -> None:
    from pipeline.instance import ensure_pools

    assert not _tables(dagster_db)
    ensure_pools(dagster_db)
    _assert_usable(dagster_db)


def test_storage_half_made_by_a_killed_process_is_completed(dagster_db: str) -> None:
    """dagster-postgres made ``snapshots``, ``runs`` and ``event_logs``, then the process died (autocommit DDL)."""
    import dagster as dg

    from pipeline.instance import complete_dagster_storage, ensure_pools, sqlalchemy_url
    from resources.dagster_compat import storage_tables

    tables = {t.name: t for t in storage_tables()}
    engine = sa.create_engine(sqlalchemy_url(dagster_db), isolation_level="AUTOCOMMIT")
    try:
        tables["snapshots"].create(engine)
        tables["runs"].create(engine)
        tables["event_logs"].create(engine)
        with engine.connect() as conn:  # and one index of a table that exists was not made yet
            conn.execute(sa.text("DROP INDEX IF EXISTS idx_step_key"))
    finally:
        engine.dispose()
    assert _tables(dagster_db) == {"snapshots", "runs", "event_logs"}
    # Dagster alone sees its main tables and does not create the rest.
    with dg.DagsterInstance.get() as instance, pytest.raises(sa.exc.SQLAlchemyError, match="asset_keys"):
        instance.event_log_storage.get_asset_keys()

    ensure_pools(dagster_db)
    _assert_usable(dagster_db)
    with psycopg.connect(dagster_db) as conn:
        assert conn.execute("SELECT to_regclass('idx_step_key')").fetchone()[0] is not None
    assert complete_dagster_storage(dagster_db) == []  # whole now: nothing more to make


def test_stormlake_workers_is_the_run_queue_s_limit(sl_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """One setting: the run queue's ``max_concurrent_runs``, whoever launched the runs (a CLI or UI
    backfill, the schedule, a sensor)."""
    import dagster as dg

    from pipeline.instance import EVENT_BATCH_ENV, prepare_dagster_home
    from resources.settings import load_settings

    monkeypatch.setenv("STORMLAKE_WORKERS", "3")
    monkeypatch.delenv(EVENT_BATCH_ENV, raising=False)  # prepare_dagster_home sets it; restored afterwards
    settings = load_settings()
    assert settings.workers == 3
    prepare_dagster_home(settings)
    with dg.DagsterInstance.get() as instance:
        queue = instance.get_concurrency_config().run_queue_config
    assert queue.max_concurrent_runs == 3 and not queue.tag_concurrency_limits
