"""Dagster's storage on PostgreSQL: a database of its own appears whole or not at all, also after
a process making it was killed midway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from resources.pgserver import with_database

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "stormlake-test-Secret-1"


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def _databases(admin_dsn: str, like: str) -> set[str]:
    with psycopg.connect(admin_dsn) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (like + "%",))}


def _dagster_tables() -> dict[str, sa.Table]:
    """Dagster's own tables, from its (internal) storage metadata: what a whole storage holds."""
    from dagster._core.storage.event_log.schema import SqlEventLogStorageMetadata
    from dagster._core.storage.runs.schema import RunStorageSqlMetadata
    from dagster._core.storage.schedules.schema import ScheduleStorageSqlMetadata

    return {t.name: t for m in (RunStorageSqlMetadata, SqlEventLogStorageMetadata, ScheduleStorageSqlMetadata)
            for t in m.sorted_tables}


def _assert_whole(dsn: str) -> None:
    import dagster as dg

    assert set(_dagster_tables()) <= _tables(dsn)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
        marked = {r[0] for r in conn.execute("SELECT name FROM secondary_indexes WHERE migration_completed IS NOT NULL")}
    assert {"asset_key_table", "run_partitions"} <= marked  # Dagster's data migrations, marked done
    with dg.DagsterInstance.get() as instance:
        assert instance.get_asset_keys() == []  # asset_keys is there
        assert instance.get_run_records(limit=1) == []


def _name(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def test_fresh_storage_is_made_whole_under_its_name_in_one_step(new_dagster_db: str, pg_admin_dsn: str) -> None:
    from pipeline.instance import ensure_dagster_storage

    name = _name(new_dagster_db)
    assert not _databases(pg_admin_dsn, name)
    assert ensure_dagster_storage(new_dagster_db, pg_admin_dsn)
    assert _databases(pg_admin_dsn, name) == {name}  # no _new left
    _assert_whole(new_dagster_db)
    assert not ensure_dagster_storage(new_dagster_db, pg_admin_dsn)  # there: nothing more to make


def test_storage_half_made_by_a_killed_attempt_is_dropped_and_made_again(new_dagster_db: str,
                                                                         pg_admin_dsn: str) -> None:
    """dagster-postgres made ``snapshots``, ``runs`` and ``event_logs`` in ``<name>_new``, then the
    process died (autocommit DDL): Dagster alone would never complete it."""
    import dagster as dg

    from pipeline.instance import dagster_yaml, ensure_dagster_storage, sqlalchemy_url
    from resources.pgserver import create_database

    name = _name(new_dagster_db)
    new = with_database(new_dagster_db, f"{name}_new")
    create_database(pg_admin_dsn, f"{name}_new")
    tables = _dagster_tables()
    engine = sa.create_engine(sqlalchemy_url(new), isolation_level="AUTOCOMMIT")
    try:
        for table in ("snapshots", "runs", "event_logs"):
            tables[table].create(engine)
    finally:
        engine.dispose()
    # Dagster alone sees its main tables there and does not create the rest.
    home = Path(os.environ["DAGSTER_HOME"])
    yaml = (home / "dagster.yaml").read_text()
    (home / "dagster.yaml").write_text(dagster_yaml(sqlalchemy_url(new)))
    with dg.DagsterInstance.get() as instance, pytest.raises(sa.exc.SQLAlchemyError, match="asset_keys"):
        instance.get_asset_keys()
    (home / "dagster.yaml").write_text(yaml)

    assert ensure_dagster_storage(new_dagster_db, pg_admin_dsn)
    assert _databases(pg_admin_dsn, name) == {name}
    _assert_whole(new_dagster_db)


def test_a_process_killed_while_making_the_storage_leaves_no_half_made_one(new_dagster_db: str,
                                                                           pg_admin_dsn: str) -> None:
    """A real kill: the making process dies as soon as its new database has a table (wherever it
    is then); its name never shows a half-made storage, and the next start makes it whole."""
    from pipeline.instance import ensure_dagster_storage

    name = _name(new_dagster_db)
    code = ("import sys; from pipeline.instance import ensure_dagster_storage;"
            " ensure_dagster_storage(sys.argv[1], sys.argv[2])")
    proc = subprocess.Popen([sys.executable, "-c", code, new_dagster_db, pg_admin_dsn], cwd=REPO,
                            start_new_session=True)
    new = with_database(pg_admin_dsn, f"{name}_new")
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            there = _databases(pg_admin_dsn, name)
            if name in there:
                break  # renamed: it finished first
            if f"{name}_new" in there:
                try:
                    if _tables(new):
                        break
                except psycopg.OperationalError:
                    pass  # renamed meanwhile, or not open to connections yet
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    if name in _databases(pg_admin_dsn, name):  # it finished first: whole
        _assert_whole(new_dagster_db)
        return
    ensure_dagster_storage(new_dagster_db, pg_admin_dsn)
    assert _databases(pg_admin_dsn, name) == {name}
    _assert_whole(new_dagster_db)


def test_a_database_that_is_there_or_shared_is_left_to_dagster(new_dagster_db: str, pg_admin_dsn: str) -> None:
    """Made beforehand (by hand, by an earlier version), or the ledger's own database: Dagster makes
    its tables itself on the first instance (the limit in docs/OPERATIONS.md)."""
    import dagster as dg

    from pipeline.instance import ensure_dagster_storage
    from resources.pgserver import create_database

    create_database(pg_admin_dsn, _name(new_dagster_db))
    assert not ensure_dagster_storage(new_dagster_db, pg_admin_dsn)
    assert not ensure_dagster_storage(new_dagster_db, new_dagster_db)  # maker in the same database
    assert not ensure_dagster_storage(new_dagster_db, None)  # given (STORMLAKE_DAGSTER_DSN)
    assert not _tables(new_dagster_db)
    with dg.DagsterInstance.get() as instance:
        assert instance.get_asset_keys() == []
    assert set(_dagster_tables()) <= _tables(new_dagster_db)


@pytest.fixture
def login(pg_admin_dsn: str) -> Iterator[Callable[[bool], str]]:
    """Makes a login role (with or without CREATEDB) owning a ledger database of its own; its DSN."""
    made: list[tuple[str, str]] = []

    def make(createdb: bool) -> str:
        user, db = f"stormlake_t_{uuid.uuid4().hex[:10]}", f"stormlake_t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN {} PASSWORD {}").format(
                sql.Identifier(user), sql.SQL("CREATEDB" if createdb else "NOCREATEDB"), sql.Literal(PASSWORD)))
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db), sql.Identifier(user)))
        made.append((user, db))
        return psycopg.conninfo.make_conninfo(pg_admin_dsn, user=user, dbname=db, password=PASSWORD)

    yield make
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for user, db in made:
            for name in (db, f"{db}_dagster", f"{db}_dagster_new"):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(user)))


def _owner_and_public(admin_dsn: str, name: str) -> tuple[str, bool]:
    with psycopg.connect(admin_dsn) as conn:
        return conn.execute("SELECT pg_get_userbyid(datdba), has_database_privilege('public', datname, 'CONNECT')"
                            " FROM pg_database WHERE datname = %s", (name,)).fetchone()


def test_who_makes_dagster_s_database_and_who_owns_it(login: Callable[[bool], str], pg_admin_dsn: str,
                                                      tmp_path: Path) -> None:
    """A login that may create databases makes ``<ledger db>_dagster`` and owns it; one that may
    not has Dagster's tables in its ledger's database (nothing made here); a maker other than
    Dagster's login (the embedded server's superuser) gives the database to that login, closed to
    PUBLIC."""
    from pipeline.instance import ensure_dagster_storage
    from resources.pgserver import resolve_dsns

    may = login(True)
    ledger, dagster = resolve_dsns(may, tmp_path / "pg")
    assert ledger == may and _name(dagster) == f"{_name(may)}_dagster"
    assert ensure_dagster_storage(dagster, may)
    user = str(psycopg.conninfo.conninfo_to_dict(may)["user"])
    assert _owner_and_public(pg_admin_dsn, _name(dagster)) == (user, True)
    assert set(_dagster_tables()) <= _tables(dagster)

    may_not = login(False)
    assert resolve_dsns(may_not, tmp_path / "pg") == (may_not, may_not)
    assert not ensure_dagster_storage(may_not, may_not)

    other = login(False)  # Dagster's login; the superuser makes its database
    own = with_database(other, f"{_name(other)}_dagster")
    assert ensure_dagster_storage(own, pg_admin_dsn)
    assert _owner_and_public(pg_admin_dsn, _name(own)) == (str(psycopg.conninfo.conninfo_to_dict(other)["user"]), False)
    assert set(_dagster_tables()) <= _tables(own)


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


def test_the_first_backfill_of_a_new_instance_checks_for_no_daemon(sl_env: dict[str, str]) -> None:
    """A process that has just made the instance's storage asks no ``dagster-daemon liveness-check``
    (no daemon has run on it); the next process, on the same instance, asks."""
    from pipeline.backfill import Daemon
    from pipeline.instance import prepare_dagster_home
    from resources.settings import load_settings

    settings = load_settings()
    prepare_dagster_home(settings)
    first = Daemon(settings, dict(os.environ))
    first.begin()
    try:
        assert first.fd is not None and first.checking is None
    finally:
        first.cancel()

    code = ("import os; from pipeline.backfill import Daemon; from pipeline.instance import prepare_dagster_home;"
            " from resources.settings import load_settings; s = load_settings(); prepare_dagster_home(s);"
            " d = Daemon(s, dict(os.environ)); d.begin(); print(d.checking is not None, d.checking.wait()); d.cancel()")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "1"]  # asked, and no daemon is live
