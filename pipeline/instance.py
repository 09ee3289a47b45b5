"""The Dagster instance stormlake runs in: ``$DAGSTER_HOME/dagster.yaml`` on PostgreSQL.

Run, event-log and schedule storage live on the same PostgreSQL server as the ledger:

- with the embedded server (``STORMLAKE_PG_DSN`` unset), in a database of their own
  (``dagster``) next to the ledger's (``stormlake``); the server belongs to one
  ``STORMLAKE_HOME``, so nothing else shares it;
- with ``STORMLAKE_PG_DSN`` set, in a database of their own named after the ledger's
  (``<ledger db>_dagster``). One DSN is then one whole stormlake world: two deployments (or two
  test runs) on one server with different ledger databases never see each other's runs,
  backfills or sensor cursors. Without the right to create that database, Dagster's tables go
  into the ledger's database (``runs``, ``event_logs``, ``jobs``, ... do not collide with the
  ledger's tables).

Runs are queued (at most ``MAX_CONCURRENT_RUNS`` at once, at most ``MAX_BACKFILL_RUNS`` of them
from backfills), every phase writes through a concurrency pool of its own, and runs whose
worker crashed are retried (safe: every phase is idempotent). A run that failed in a step is
not retried by the daemon: transient step errors already have the assets' retry policy, and a
failed grader or bad input would only fail again.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import psycopg

from resources.pgserver import resolve_dsns
from resources.settings import Settings

MAX_CONCURRENT_RUNS = 4
MAX_BACKFILL_RUNS = 2
POOL_LIMIT = 2
DAGSTER_URL_ENV = "STORMLAKE_DAGSTER_PG_URL"
_POOLS_LOCK = 7_406_002  # advisory lock id serialising the creation of the pool rows


def sqlalchemy_url(dsn: str) -> str:
    """A psycopg DSN as the ``postgresql://`` URL dagster-postgres takes (sockets via ``?host=``)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    user = urllib.parse.quote(str(info.get("user") or "postgres"), safe="")
    password = info.get("password")
    auth = user + (":" + urllib.parse.quote(str(password), safe="") if password else "")
    host = str(info.get("host") or "")
    db = urllib.parse.quote(str(info.get("dbname") or "postgres"), safe="")
    if host.startswith("/"):
        return f"postgresql+psycopg2://{auth}@/{db}?host={urllib.parse.quote(host, safe='/')}"
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql+psycopg2://{auth}@{host or 'localhost'}{port}/{db}"


def dagster_yaml(url_literal: str | None) -> str:
    """The instance config; ``url_literal`` None means the URL is read from $STORMLAKE_DAGSTER_PG_URL."""
    url = f'"{url_literal}"' if url_literal else f"\n      env: {DAGSTER_URL_ENV}"
    return f"""# Written by stormlake; run `stormlake ui` or any stormlake command to refresh it.
storage:
  postgres:
    postgres_url: {url}
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
concurrency:
  runs:
    max_concurrent_runs: {MAX_CONCURRENT_RUNS}
    tag_concurrency_limits:
      - key: dagster/backfill
        limit: {MAX_BACKFILL_RUNS}
  pools:
    default_limit: {POOL_LIMIT}
run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  max_resume_run_attempts: 0
telemetry:
  enabled: false
nux:
  enabled: false
"""


def prepare_dagster_home(settings: Settings) -> tuple[Path, str]:
    """Write ``dagster.yaml`` for the current settings; return (DAGSTER_HOME, ledger DSN).

    Sets ``DAGSTER_HOME`` (and the storage URL variable when the DSN has a password) in this
    process's environment so that Dagster and any child process find the instance.
    """
    ledger_dsn, dagster_dsn = resolve_dsns(settings.pg_dsn, settings.pgdata)
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    url = sqlalchemy_url(dagster_dsn)
    has_secret = bool(psycopg.conninfo.conninfo_to_dict(dagster_dsn).get("password"))
    if has_secret:
        os.environ[DAGSTER_URL_ENV] = url
    text = dagster_yaml(None if has_secret else url)
    target = home / "dagster.yaml"
    if not target.exists() or target.read_text() != text:
        tmp = target.with_name(f".dagster.yaml.{os.getpid()}.tmp")  # several processes may write at once
        tmp.write_text(text)
        os.replace(tmp, target)
    os.environ["DAGSTER_HOME"] = str(home)
    ensure_pools(dagster_dsn)
    return home, ledger_dsn


def pool_keys() -> list[str]:
    """The concurrency pools of the phase assets (``pool=`` on each asset)."""
    from assets.phases import PHASES

    return [f"stormlake_{p.name}" for p in PHASES]


def ensure_pools(dagster_dsn: str) -> None:
    """Create the phase pools' limit rows once, before any run needs them.

    Dagster creates a pool's row lazily when the first step of that pool claims a slot. On
    PostgreSQL two runs doing that at once race: the loser's INSERT hits the unique key, which
    aborts its transaction, and the run dies with ``InFailedSqlTransaction`` (a backfill's
    first runs all start together; see dagster-io/dagster#33557). Creating the rows here, one
    process and one key at a time, leaves no race. Cheap when done: one SELECT.

    Before the first instance is made on a database, Dagster's tables are created (or a
    half-made set completed) in one transaction by :func:`complete_dagster_storage`.
    """
    keys = pool_keys()
    try:
        conn = psycopg.connect(dagster_dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        return  # unreachable: the command that needs the instance reports it
    with conn:
        # One process at a time: the others wait here, then find the rows made.
        conn.execute("SELECT pg_advisory_lock(%s)", (_POOLS_LOCK,))
        try:
            have = {r[0] for r in conn.execute(
                "SELECT concurrency_key FROM concurrency_limits WHERE concurrency_key = ANY(%s)", (keys,))}
        except psycopg.errors.UndefinedTable:
            have = set()  # a fresh instance: Dagster creates its tables below
        missing = [k for k in keys if k not in have]
        if not missing:
            return
        import dagster as dg

        complete_dagster_storage(dagster_dsn)
        with dg.DagsterInstance.get() as instance:
            # What Dagster does after creating its tables: mark its data migrations done (nothing
            # to migrate in empty tables). Each one already marked is skipped.
            instance.run_storage.migrate()
            instance.run_storage.optimize()
            instance.event_log_storage.reindex_events()
            instance.event_log_storage.reindex_assets()
            instance.schedule_storage.migrate()
            instance.schedule_storage.optimize()
            for key in missing:
                instance.event_log_storage.initialize_concurrency_limit_to_default(key)


def _dagster_metadata() -> list:
    from dagster._core.storage.event_log.schema import SqlEventLogStorageMetadata
    from dagster._core.storage.runs.schema import RunStorageSqlMetadata
    from dagster._core.storage.schedules.schema import ScheduleStorageSqlMetadata

    return [RunStorageSqlMetadata, SqlEventLogStorageMetadata, ScheduleStorageSqlMetadata]


def complete_dagster_storage(dagster_dsn: str) -> list[str]:
    """Create whatever of Dagster's tables and indexes is missing, all in one transaction.

    dagster-postgres creates its tables on an autocommit connection, one statement at a time,
    and only when its main table (``runs``, ``event_logs``, ``jobs``) is missing. A process
    killed in the middle of that (a backfill stopped in its first second on a fresh database)
    leaves some tables made; every later start sees the main table, skips the creation, and
    runs fail on a missing one (``relation "asset_keys" does not exist``). Here the creation
    is one PostgreSQL transaction (DDL is transactional there), so it happens whole or not at
    all, and a half-made storage left by an earlier version or by Dagster's own tools is
    completed. Nothing is ever dropped: the tables may share the ledger's database.

    Called under the advisory lock of :func:`ensure_pools`. Returns the tables and indexes
    it created.
    """
    import dagster_postgres.event_log.event_log as pg_event_log
    import sqlalchemy as sa
    from dagster._core.storage.sql import stamp_alembic_rev
    from dagster_postgres.utils import pg_alembic_config

    metadata = _dagster_metadata()
    engine = sa.create_engine(sqlalchemy_url(dagster_dsn), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            inspector = sa.inspect(conn)
            have = set(inspector.get_table_names())
            tables = [t for m in metadata for t in m.sorted_tables]
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
            for m in metadata:
                m.create_all(conn, tables=[t for t in missing_tables if t.metadata is m])
            for index in missing_indexes:
                index.create(conn)
            if not stamped:
                stamp_alembic_rev(pg_alembic_config(pg_event_log.__file__), conn)
        return [t.name for t in missing_tables] + [ix.name for ix in missing_indexes]
    finally:
        engine.dispose()
