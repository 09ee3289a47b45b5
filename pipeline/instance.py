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

import os
import urllib.parse
from pathlib import Path

import psycopg

from resources import dagster_compat
from resources.files import write_atomic
from resources.logins import resolve_logins
from resources.pgserver import hold_advisory_lock
from resources.settings import Settings

DEQUEUE_INTERVAL_S = 1
#: How often run monitoring looks for runs whose worker died (Dagster's default: 120 s); with the
#: outbox sensor's interval it bounds how long a partition stopped by a dead run waits.
RUN_MONITORING_POLL_S = 30
POOL_LIMIT = 2
DAGSTER_URL_ENV = "STORMLAKE_DAGSTER_PG_URL"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DOTENV_MARK = "# written by stormlake"
_POOLS_LOCK = 7_406_002  # advisory lock id serialising the creation of the pool rows


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
  pools:
    default_limit: {POOL_LIMIT}
run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
run_monitoring:
  enabled: true
  poll_interval_seconds: {RUN_MONITORING_POLL_S}
  start_timeout_seconds: 180
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
    ensure_pools(dagster_dsn)
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


def pool_keys() -> list[str]:
    """The concurrency pools of the phase assets (``pool=`` on each asset)."""
    from assets.phases import PHASES

    return [p.pool for p in PHASES]


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
        hold_advisory_lock(conn, _POOLS_LOCK)
        have = dagster_compat.pool_keys_with_limits(conn, keys)  # none on a fresh instance
        missing = [k for k in keys if k not in have]
        if not missing:
            return
        import dagster as dg

        complete_dagster_storage(dagster_dsn)
        with dg.DagsterInstance.get() as instance:
            # What Dagster does after creating its tables: mark its data migrations done (nothing
            # to migrate in empty tables). Each one already marked is skipped.
            dagster_compat.mark_new_storage_migrated(instance)
            for key in missing:
                dagster_compat.init_pool_limit(instance, key)


def complete_dagster_storage(dagster_dsn: str) -> list[str]:
    """Create whatever of Dagster's tables and indexes is missing, all in one transaction.

    A process killed while dagster-postgres creates its tables (one autocommit statement at a
    time) leaves a half-made storage that Dagster never completes; here the creation is one
    PostgreSQL transaction, whole or not at all, and a half-made storage is completed (see
    :func:`resources.dagster_compat.complete_storage`). Nothing is ever dropped.

    Called under the advisory lock of :func:`ensure_pools`. Returns the tables and indexes
    it created.
    """
    return dagster_compat.complete_storage(sqlalchemy_url(dagster_dsn))
