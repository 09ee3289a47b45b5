"""Which login each part of stormlake connects to the ledger as, and the embedded server's logins.

A person is held by the login they connect as, not by a role the client names: each part of
stormlake has a DSN of its own (docs/SECURITY.md):

=================  ===========================  ==============================================
login              setting                      used by
=================  ===========================  ==============================================
a person           ``STORMLAKE_PG_DSN``         status, report, review, access (a member of
                                                one reader role; an admin may belong to more)
the pipeline       ``STORMLAKE_PIPELINE_DSN``   backfill, demo, release, Dagster's runs and
                                                sensors (a member of resume_worker only)
the owner          ``STORMLAKE_OWNER_DSN``      ``db migrate``, ``access add-login`` (owns the
                                                tables; the only one that runs DDL)
Dagster's storage  ``STORMLAKE_DAGSTER_DSN``    Dagster's runs, event log and schedules
=================  ===========================  ==============================================

With only ``STORMLAKE_PG_DSN`` set (the contract's one DSN), that login is all of them: it owns
the tables, migrates them on first use, and the pipeline takes on resume_worker with ``-c
role=…``. That holds an honest client only; give each part its own login to hold a person.

With none set, the embedded server is used, and its first start makes the logins itself:
``stormlake_owner`` (owns the ledger's database, may create roles), ``stormlake_pipeline``
(member of resume_worker), ``stormlake_operator`` (member of admin and of the other reader roles,
to narrow down with ``--role``) and ``stormlake_dagster`` (owns Dagster's database, which
:func:`pipeline.instance.ensure_dagster_storage` makes whole on first use); their
passwords are in ``$STORMLAKE_HOME/secrets`` (0600 files in a 0700 folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import psycopg
from psycopg import sql

from resources.errors import ConfigError, LedgerUnavailable
from resources.settings import Settings

OWNER, PIPELINE, OPERATOR, DAGSTER = "stormlake_owner", "stormlake_pipeline", "stormlake_operator", "stormlake_dagster"
GROUP_ROLES = ("resume_worker", "ops_reader", "compliance_auditor", "admin")
READER_ROLES = ("ops_reader", "compliance_auditor", "admin")
#: Bumped when the embedded logins' set-up changes, so that a home made before is set up again.
_SETUP_VERSION = "2"


@dataclass(frozen=True)
class Logins:
    """The DSN of each part of stormlake (module doc)."""

    reader: str  # a person's reads and policy changes
    pipeline: str  # the pipeline (takes on resume_worker)
    owner: str | None  # migrations and new logins; None: this process is not given it
    dagster: str  # Dagster's storage
    embedded: bool


def is_external(settings: Settings) -> bool:
    """Whether the ledger is on a server of the settings' (any ledger DSN set), not the embedded one."""
    return bool(settings.pg_dsn or settings.owner_dsn or settings.pipeline_dsn)


class _Resolved:
    cache: ClassVar[dict[tuple[int, tuple[str | None, ...], str], Logins]] = {}
    lock: ClassVar[threading.Lock] = threading.Lock()


def resolve_logins(settings: Settings) -> Logins:
    """The logins of these settings; the embedded server is started (and set up) when none is set."""
    key = (os.getpid(), (settings.pg_dsn, settings.owner_dsn, settings.pipeline_dsn, settings.dagster_dsn),
           str(settings.pgdata))
    with _Resolved.lock:
        if key in _Resolved.cache:
            return _Resolved.cache[key]
    logins = _external(settings) if is_external(settings) else embedded_logins(settings.pgdata)
    with _Resolved.lock:
        _Resolved.cache[key] = logins
    return logins


def _external(settings: Settings) -> Logins:
    from resources.pgserver import resolve_dsns

    one = not (settings.owner_dsn or settings.pipeline_dsn)  # the contract's one DSN: it is every login
    owner = settings.owner_dsn or (settings.pg_dsn if one else None)
    pipeline = settings.pipeline_dsn or settings.pg_dsn or settings.owner_dsn
    reader = settings.pg_dsn or settings.owner_dsn or pipeline
    assert pipeline is not None and reader is not None
    for name, value in (("STORMLAKE_PG_DSN", settings.pg_dsn), ("STORMLAKE_OWNER_DSN", settings.owner_dsn),
                        ("STORMLAKE_PIPELINE_DSN", settings.pipeline_dsn), ("STORMLAKE_DAGSTER_DSN", settings.dagster_dsn)):
        if value is not None:
            try:
                psycopg.conninfo.conninfo_to_dict(value)
            except psycopg.ProgrammingError:
                raise ConfigError(f"{name} is not a valid PostgreSQL connection string"
                                  " (its value is not shown: it may hold a secret)") from None
    dagster = settings.dagster_dsn or resolve_dsns(owner or pipeline, settings.pgdata)[1]
    return Logins(reader=reader, pipeline=pipeline, owner=owner, dagster=dagster, embedded=False)


@contextlib.contextmanager
def _setup_lock(pgdata: Path) -> Iterator[None]:
    fd = os.open(pgdata.parent / f".{pgdata.name}.logins.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def embedded_logins(pgdata: Path) -> Logins:
    """Start the embedded server of ``pgdata`` and return its logins, made on its first start."""
    from resources.pgserver import (
        DAGSTER_DB,
        LEDGER_DB,
        embedded_server_dsn,
        read_secret,
        secrets_dir,
        server_dsn,
    )

    pgdata = pgdata.expanduser()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    pgdata = pgdata.resolve()
    admin = embedded_server_dsn(pgdata)
    marker = secrets_dir(pgdata) / ".logins"
    if not _is(marker, _SETUP_VERSION):
        with _setup_lock(pgdata):
            if not _is(marker, _SETUP_VERSION):
                _set_up(pgdata, admin)
                marker.write_text(_SETUP_VERSION + "\n")
    missing = [name for name in (OWNER, PIPELINE, OPERATOR, DAGSTER) if read_secret(pgdata, name) is None]
    if missing:
        raise LedgerUnavailable(f"the passwords of {', '.join(missing)} are missing from {secrets_dir(pgdata)};"
                                f" remove {marker} and run again to make new ones")
    # Dagster's storage URL goes into dagster.yaml, which Dagster's own CLI reads in processes of
    # their own: it names TCP (the port is kept across starts; the socket's folder may not be) and
    # a libpq password file (0600) instead of the password.
    passfile = _dagster_passfile(pgdata)
    dagster = psycopg.conninfo.make_conninfo(server_dsn(pgdata, DAGSTER_DB, user=DAGSTER, password="", tcp=True),
                                             passfile=str(passfile))
    return Logins(reader=server_dsn(pgdata, LEDGER_DB, user=OPERATOR),
                  pipeline=server_dsn(pgdata, LEDGER_DB, user=PIPELINE),
                  owner=server_dsn(pgdata, LEDGER_DB, user=OWNER),
                  dagster=dagster, embedded=True)


def _dagster_passfile(pgdata: Path) -> Path:
    """``secrets/pgpass``: the Dagster login's password as libpq reads it (a 0600 file)."""
    from resources.files import write_atomic
    from resources.pgserver import read_secret, secrets_dir

    path = secrets_dir(pgdata) / "pgpass"
    line = f"*:*:*:{DAGSTER}:{read_secret(pgdata, DAGSTER)}\n"
    if not _is(path, line.strip()):
        write_atomic(path, line, durable=True, mode=0o600)
    return path


def _is(path: Path, text: str) -> bool:
    try:
        return path.read_text().strip() == text
    except FileNotFoundError:
        return False


def _set_up(pgdata: Path, admin: str) -> None:
    """Make (or mend) the embedded server's logins and databases, as its superuser."""
    from resources.ledger import Ledger
    from resources.pgserver import DAGSTER_DB, LEDGER_DB, new_password, read_secret, server_dsn, write_secret

    passwords = {}
    for name in (OWNER, PIPELINE, OPERATOR, DAGSTER):
        passwords[name] = read_secret(pgdata, name) or new_password()
        write_secret(pgdata, name, passwords[name])
    try:
        with _superuser(admin) as conn:
            for role in GROUP_ROLES:
                _role(conn, role, login=False)
            _role(conn, OWNER, password=passwords[OWNER], createrole=True)
            conn.execute(sql.SQL("GRANT {} TO {} WITH ADMIN OPTION").format(
                sql.SQL(", ").join(map(sql.Identifier, GROUP_ROLES)), sql.Identifier(OWNER)))
            _role(conn, DAGSTER, password=passwords[DAGSTER])
            _database(conn, LEDGER_DB, OWNER)
            # Dagster's database is made whole, later, by pipeline.instance.ensure_dagster_storage;
            # one made by an earlier version is handed to its login here.
            dagster_db = _exists(conn, DAGSTER_DB)
            if dagster_db:
                _database(conn, DAGSTER_DB, DAGSTER)
            for db in (DAGSTER_DB, "postgres") if dagster_db else ("postgres",):
                conn.execute(sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db)))
        for db, owner in ((LEDGER_DB, OWNER), (DAGSTER_DB, DAGSTER)) if dagster_db else ((LEDGER_DB, OWNER),):
            _hand_over(server_dsn(pgdata, db), owner)
        owner_ledger = Ledger(server_dsn(pgdata, LEDGER_DB, user=OWNER), role=None)
        try:
            owner_ledger.migrate()
        finally:
            owner_ledger.close()
        with _superuser(admin) as conn:
            _role(conn, PIPELINE, password=passwords[PIPELINE], member_of=("resume_worker",))
            _role(conn, OPERATOR, password=passwords[OPERATOR], member_of=READER_ROLES)
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"could not set up the embedded server's logins: {exc.__class__.__name__}:"
                                f" {' '.join(str(exc).split())[:240]}") from exc


@contextlib.contextmanager
def _superuser(admin: str) -> Iterator[psycopg.Connection]:
    """A session of the embedded server's superuser whose passwords get the server's verifiers."""
    from resources.pgserver import SCRAM_ITERATIONS

    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("SET scram_iterations = {}").format(sql.Literal(SCRAM_ITERATIONS)))
        yield conn


def _role(conn: psycopg.Connection, name: str, *, login: bool = True, password: str | None = None,
          createrole: bool = False, member_of: tuple[str, ...] = ()) -> None:
    """Make role ``name`` unless it exists; set its password; make it a member of ``member_of``."""
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is None:
        with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
    if login:
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN NOSUPERUSER {} NOCREATEDB NOBYPASSRLS PASSWORD {}").format(
            sql.Identifier(name), sql.SQL("CREATEROLE" if createrole else "NOCREATEROLE"), sql.Literal(password)))
    for group in member_of:
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(name)))


def _exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _database(conn: psycopg.Connection, name: str, owner: str) -> None:
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
        with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(owner)))
    conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(owner)))


#: Hands a database made before the logins (its objects the superuser's) over to its login.
_HAND_OVER = """
DO $$
DECLARE
    r record;
    owner text := {owner};
BEGIN
    FOR r IN SELECT n.nspname FROM pg_namespace n
             WHERE n.nspowner = 'postgres'::regrole AND n.nspname NOT LIKE 'pg\\_%'
               AND n.nspname NOT IN ('information_schema', 'public') LOOP
        EXECUTE format('ALTER SCHEMA %I OWNER TO %I', r.nspname, owner);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS obj, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relowner = 'postgres'::regrole AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
               AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
               AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                                                    AND d.objid = c.oid AND d.deptype IN ('a', 'i'))) LOOP
        EXECUTE format('ALTER %s %s OWNER TO %I',
                       CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE'
                                      ELSE 'TABLE' END, r.obj, owner);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE p.proowner = 'postgres'::regrole AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema' LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO %I', r.f, owner);
    END LOOP;
END $$
"""


def _hand_over(dsn: str, owner: str) -> None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL(_HAND_OVER).format(owner=sql.Literal(owner)))


LOGIN_NAME_RE = r"^[a-z_][a-z0-9_]{0,62}$"


def add_login(owner_dsn: str, name: str, role: str, *, folder: Path, tcp: bool = False) -> Path:
    """Make login ``name``, a member of ``role`` only, as the owner; write its DSN (with a new
    password) to ``folder/<name>.dsn``, readable by this user only, and return that path.

    The DSN names the owner's server and database (``tcp``: 127.0.0.1 and the port, for the
    embedded server, whose socket is its own user's)."""
    import re

    from resources.errors import AccessRefused
    from resources.files import write_atomic
    from resources.pgserver import new_password

    if not re.match(LOGIN_NAME_RE, name):
        raise ConfigError(f"access add-login {name!r}: a login name is lowercase letters, digits and _ (at most 63)")
    if role not in GROUP_ROLES:
        raise ConfigError(f"access add-login --role {role}: one of {', '.join(GROUP_ROLES)}")
    password = new_password()
    try:
        with psycopg.connect(owner_dsn, autocommit=True, connect_timeout=10) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is not None:
                raise ConfigError(f"access add-login {name}: a role of that name exists already")
            with conn.transaction():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name),
                                                                             sql.Literal(password)))
                conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(name)))
            info = psycopg.conninfo.conninfo_to_dict(owner_dsn)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise AccessRefused(f"access add-login {name}: the owner's login may not make it ({exc.diag.message_primary});"
                            " it needs CREATEROLE and the ADMIN option on the role") from exc
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"access add-login {name}: {exc.__class__.__name__}: {' '.join(str(exc).split())[:240]}") from exc
    keep = {k: v for k, v in info.items() if k in ("host", "hostaddr", "port", "dbname", "sslmode", "sslrootcert")}
    if tcp:
        keep["host"] = "127.0.0.1"
    dsn = psycopg.conninfo.make_conninfo(**keep, user=name, password=password)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    return write_atomic(folder / f"{name}.dsn", dsn + "\n", durable=True, mode=0o600)
