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

A database of Dagster's own appears whole or not at all (:func:`ensure_dagster_storage`).

Every run waits in Dagster's run queue, at most ``STORMLAKE_WORKERS`` at once, and the daemon
launches it with Dagster's default run launcher. Runs whose process crashed are retried (safe:
every phase is idempotent); a run that failed in a step is not (transient step errors already
have the assets' retry policy, and a failed grader or bad input would only fail again).

Dagster's own CLI finds this instance through ``DAGSTER_HOME``. ``dg dev``, ``dg launch``, ``dg
check defs``, ``dg list defs`` (and ``dagster ...``) read the ``.env`` of the folder they run in
before they make their instance, so stormlake keeps one in the project folder
(:func:`write_dotenv`): whenever a stormlake command prepares the project folder's own home
(``./.stormlake``, the default), and on ``stormlake env --dotenv`` for any other settings. Its
values are defaults: a variable set in the shell wins.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

from resources.errors import LedgerUnavailable
from resources.files import write_atomic
from resources.logins import Logins, resolve_logins
from resources.pgserver import hold_advisory_lock, with_database
from resources.settings import Settings

DEQUEUE_INTERVAL_S = 1
#: How often run monitoring looks at started runs (Dagster's default: 120 s). With a launcher that
#: checks a run's worker (``K8sRunLauncher``) it bounds, with the outbox sensor's interval, how
#: long a partition stopped by a dead run waits; the default launcher's code server fails such a
#: run at once.
RUN_MONITORING_POLL_S = 30
#: How long a launched run may take to start before run monitoring fails it (Dagster's default):
#: a run whose worker died with the database before it started holds a slot of the queue that long.
RUN_START_TIMEOUT_S = 180
DAGSTER_URL_ENV = "STORMLAKE_DAGSTER_PG_URL"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DOTENV_MARK = "# written by stormlake"
_STORAGE_LOCK = 7_406_002  # advisory lock id serialising the making of Dagster's storage database
#: How long a new storage database may stay in use after its instance closed before its rename
#: gives up (the server ends a closed connection's session at once; this is a generous bound).
RENAME_DEADLINE_S = 60
#: The Dagster storage databases this process made, by server and name (:func:`ensure_dagster_storage`):
#: no daemon can have run on one yet (:func:`made_here`).
_MADE: set[tuple[str, str, str]] = set()


def sqlalchemy_url(dsn: str) -> str:
    """A psycopg DSN as the ``postgresql://`` URL dagster-postgres takes (sockets via ``?host=``)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    user = urllib.parse.quote(str(info.get("user") or "postgres"), safe="")
    password = info.get("password")
    auth = user + (":" + urllib.parse.quote(str(password), safe="") if password else "")
    host = str(info.get("host") or "")
    db = urllib.parse.quote(str(info.get("dbname") or "postgres"), safe="")
    passfile = f"passfile={urllib.parse.quote(str(info['passfile']), safe='/')}" if info.get("passfile") else ""
    if host.startswith("/"):
        port = f"&port={info['port']}" if info.get("port") else ""
        return (f"postgresql+psycopg2://{auth}@/{db}?host={urllib.parse.quote(host, safe='/')}{port}"
                + (f"&{passfile}" if passfile else ""))
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql+psycopg2://{auth}@{host or 'localhost'}{port}/{db}" + (f"?{passfile}" if passfile else "")


def dagster_yaml(url_literal: str | None, *, workers: int = 2) -> str:
    """The instance config; ``url_literal`` None means the URL is read from $STORMLAKE_DAGSTER_PG_URL.

    ``workers`` (``STORMLAKE_WORKERS``, or ``stormlake backfill --workers N`` for the daemon a
    backfill starts) is the run queue's limit: runs at once, whoever launched them.
    """
    url = f'"{url_literal}"' if url_literal else f"\n      env: {DAGSTER_URL_ENV}"
    return f"""# Written by stormlake; run `stormlake ui` or any stormlake command to refresh it.
# Every run waits in Dagster's run queue (QueuedRunCoordinator), which the daemon looks at every
# second (Dagster's default, 5 s, leaves a backfill's next run waiting that long after each run
# ends) and launches with Dagster's default run launcher, a process of its own per run.
# max_concurrent_runs (STORMLAKE_WORKERS) is the one concurrency setting.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: {DEQUEUE_INTERVAL_S}
backfills:
  use_threads: true
  num_workers: 2
  num_submit_workers: 2
auto_materialize:
  minimum_interval_seconds: 30
storage:
  postgres:
    postgres_url: {url}
concurrency:
  runs:
    max_concurrent_runs: {workers}
run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
run_monitoring:
  enabled: true
  poll_interval_seconds: {RUN_MONITORING_POLL_S}
  start_timeout_seconds: {RUN_START_TIMEOUT_S}
  max_resume_run_attempts: 0
telemetry:
  enabled: false
nux:
  enabled: false
"""


#: Dagster writes the materializations of a key-range step's partitions (one event each) in one
#: insert when this variable is above 0 (``EventMethods.handle_new_event``); its default, 0,
#: writes them one statement each. A CLI range run of 8 partitions has about 80 of them.
EVENT_BATCH_ENV = "DAGSTER_EVENT_BATCH_SIZE"
EVENT_BATCH_SIZE = 100


def prepare_dagster_home(settings: Settings) -> tuple[Path, str]:
    """Write ``dagster.yaml`` for the current settings; return (DAGSTER_HOME, the pipeline's ledger DSN).

    Sets ``DAGSTER_HOME`` (and the storage URL variable when the DSN has a password) in this
    process's environment so that Dagster and any child process find the instance, and
    :data:`EVENT_BATCH_ENV` unless it is set.
    """
    logins = resolve_logins(settings)
    ledger_dsn, dagster_dsn = logins.pipeline, logins.dagster
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    url = sqlalchemy_url(dagster_dsn)
    has_secret = bool(psycopg.conninfo.conninfo_to_dict(dagster_dsn).get("password"))
    if has_secret:
        os.environ[DAGSTER_URL_ENV] = url
    text = dagster_yaml(None if has_secret else url, workers=settings.workers)
    target = home / "dagster.yaml"
    if not target.exists() or target.read_text() != text:
        write_atomic(target, text)
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ.setdefault(EVENT_BATCH_ENV, str(EVENT_BATCH_SIZE))
    ensure_dagster_storage(dagster_dsn, storage_maker(settings, logins))
    if settings.home.resolve() == (PROJECT_ROOT / ".stormlake").resolve() and is_dg_project(PROJECT_ROOT):
        write_dotenv(PROJECT_ROOT, settings)
    return home, ledger_dsn


def is_dg_project(folder: Path) -> bool:
    """Whether ``folder`` is a Dagster project (``[tool.dg]`` in its pyproject.toml), as in a checkout."""
    pyproject = folder / "pyproject.toml"
    return pyproject.is_file() and "[tool.dg]" in pyproject.read_text(encoding="utf-8")


def dotenv_settings(settings: Settings) -> dict[str, str]:
    """The variables the project's ``.env`` sets for Dagster's CLI (no secret among them).

    ``STORMLAKE_PG_DSN`` is there only without a password; a DSN with one stays in the shell.
    """
    values = {"STORMLAKE_HOME": str(settings.home), "DAGSTER_HOME": str(settings.dagster_home),
              EVENT_BATCH_ENV: str(EVENT_BATCH_SIZE)}
    if settings.pg_dsn and not psycopg.conninfo.conninfo_to_dict(settings.pg_dsn).get("password"):
        values["STORMLAKE_PG_DSN"] = settings.pg_dsn
    return values


def write_dotenv(folder: Path, settings: Settings) -> Path:
    """Write (or update) ``folder/.env`` so that Dagster's CLI run there uses this instance.

    Each value is written as ``KEY="${KEY:-value}"``: Dagster's CLI loads the file over the
    environment (python-dotenv expands the default), so a variable set in the shell still wins.
    Lines of other variables are kept; lines stormlake wrote before (marked) are replaced.
    Written only when it changes, to a temporary name first (several processes may write).
    """
    target = folder / ".env"
    values = dotenv_settings(settings)
    kept: list[str] = []
    if target.exists():
        for line in target.read_text(encoding="utf-8").splitlines():
            key = line.split("=", 1)[0].strip().removeprefix("export ").strip()
            if line.rstrip().endswith(DOTENV_MARK) or key in values:
                continue
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()

    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    ours = [f"# Dagster's CLI run in this folder (dg dev, dg launch, ...) uses stormlake's instance  {DOTENV_MARK}"]
    ours += [f'{key}="${{{key}:-{quoted(value)}}}"  {DOTENV_MARK}' for key, value in values.items()]
    text = "\n".join([*kept, *([""] if kept else []), *ours]) + "\n"
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        write_atomic(target, text)
    return target


def storage_maker(settings: Settings, logins: Logins) -> str | None:
    """The login that makes Dagster's storage database, or None when stormlake makes none.

    The embedded server's superuser (the database is then owned by Dagster's login); with
    ``STORMLAKE_PG_DSN`` (and no ``STORMLAKE_DAGSTER_DSN``), the ledger's login that Dagster's
    storage is named after and connects as (:func:`resources.pgserver.resolve_dsns`). None with
    ``STORMLAKE_DAGSTER_DSN``: that database is given.
    """
    if logins.embedded:
        from resources.pgserver import server_dsn

        return server_dsn(settings.pgdata, "postgres")
    if settings.dagster_dsn:
        return None
    return logins.owner or logins.pipeline


def _dbname(dsn: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(info.get("dbname") or info.get("user") or "postgres")


def ensure_dagster_storage(dagster_dsn: str, maker_dsn: str | None) -> bool:
    """Make Dagster's storage database in one step unless it is there; whether it made it.

    dagster-postgres creates its tables when an instance first connects, on an autocommit
    connection, one statement at a time, and only when its main tables are missing: a process
    killed midway leaves a half-made storage (``relation "asset_keys" does not exist``) that
    Dagster never completes. So the database is made under another name, ``<name>_new``:
    Dagster makes its whole storage there (:func:`make_storage`), and ``ALTER DATABASE ...
    RENAME`` gives it its name, which is atomic. Whoever finds ``<name>`` finds it whole. A
    ``<name>_new`` left by a killed attempt is dropped and made again. One process at a time
    (an advisory lock in ``maker_dsn``'s database); when the database is there, one query.

    ``maker_dsn``: a login that may create databases (:func:`storage_maker`). When it is None
    or names ``dagster_dsn``'s own database (Dagster's tables in the ledger's database), or
    the database exists already (made by an earlier version, or by hand), nothing is made here:
    Dagster creates its tables itself, with the limit above (docs/OPERATIONS.md). When Dagster's
    login is another than the maker's (the embedded server's), the new database is owned by it
    and closed to PUBLIC.
    """
    name = _dbname(dagster_dsn)
    if maker_dsn is None or _dbname(maker_dsn) == name:
        return False
    new = name[:59] + "_new"  # PostgreSQL cuts names at 63 bytes
    try:
        conn = psycopg.connect(maker_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        return False  # unreachable: the command that needs the instance reports it
    exists = "SELECT 1 FROM pg_database WHERE datname = %s"
    try:
        with conn:
            if conn.execute(exists, (name,)).fetchone():
                return False
            hold_advisory_lock(conn, _STORAGE_LOCK)  # the others wait here, then find it made
            if conn.execute(exists, (name,)).fetchone():
                return False
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(new)))
            user = psycopg.conninfo.conninfo_to_dict(dagster_dsn).get("user")
            maker = conn.execute("SELECT current_user").fetchone()[0]
            owner = str(user) if user and user != maker else None
            conn.execute(sql.SQL("CREATE DATABASE {}{}").format(
                sql.Identifier(new), sql.SQL(" OWNER {}").format(sql.Identifier(owner)) if owner else sql.SQL("")))
            if owner:
                conn.execute(sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(sql.Identifier(new)))
            make_storage(with_database(dagster_dsn, new))
            _rename_database(conn, new, name)
            _MADE.add(_where(dagster_dsn))
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"could not make Dagster's storage database {name}: {exc.__class__.__name__}:"
                                f" {' '.join(str(exc).split())[:240]}") from exc
    return True


def made_here(settings: Settings) -> bool:
    """Whether this process made the settings' Dagster storage database (so it has never had a daemon)."""
    return _where(resolve_logins(settings).dagster) in _MADE


def _where(dsn: str) -> tuple[str, str, str]:
    """A database's server (host, port) and name."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(info.get("host") or ""), str(info.get("port") or ""), _dbname(dsn)


def make_storage(dagster_dsn: str) -> None:
    """Have Dagster make its run, event-log and schedule storage in ``dagster_dsn``'s database.

    An instance made on it does (dagster-postgres creates its tables, stamps their alembic
    revision and marks its data migrations done when it first connects): ``DagsterInstance.get``
    on a ``dagster.yaml`` in a temporary ``DAGSTER_HOME`` that names this database. A URL with
    a password reaches that file through an environment variable, not in its text.
    """
    import dagster as dg

    url = sqlalchemy_url(dagster_dsn)
    secret = bool(psycopg.conninfo.conninfo_to_dict(dagster_dsn).get("password"))
    variable = "STORMLAKE_NEW_DAGSTER_PG_URL"
    literal = f"\n      env: {variable}" if secret else f'"{url}"'
    with tempfile.TemporaryDirectory(prefix="stormlake-dagster-") as home:
        Path(home, "dagster.yaml").write_text(
            f"storage:\n  postgres:\n    postgres_url: {literal}\ntelemetry:\n  enabled: false\n")
        with _environ({"DAGSTER_HOME": home, **({variable: url} if secret else {})}), dg.DagsterInstance.get():
            pass


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set, restored afterwards."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _rename_database(conn: psycopg.Connection, old: str, new: str) -> None:
    """``ALTER DATABASE old RENAME TO new``, waiting (up to :data:`RENAME_DEADLINE_S`) while the
    sessions of the instance that made it end."""
    deadline = time.monotonic() + RENAME_DEADLINE_S
    while True:
        try:
            conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(old), sql.Identifier(new)))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def write_workspace(dagster_home: Path) -> Path:
    """``$DAGSTER_HOME/workspace.yaml``: the code location, for the daemon and ``stormlake ui``.

    The location is named ``stormlake`` everywhere (workspace.yaml, pyproject.toml): Dagster keys
    sensor and schedule state by it, so every daemon of the instance shares that state."""
    workspace = dagster_home / "workspace.yaml"
    text = ("load_from:\n  - python_module:\n      module_name: pipeline.definitions\n"
            "      location_name: stormlake\n")
    if not workspace.exists() or workspace.read_text() != text:
        workspace.write_text(text)
    return workspace
