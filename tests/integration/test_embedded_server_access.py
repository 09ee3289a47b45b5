"""The embedded PostgreSQL admits only its own user: another Unix user (``nobody``) cannot connect
over its socket or over TCP, with a short home and with one too deep for a socket name."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from resources.pgserver import _bin_path, embedded_server_dsn, read_secret, stop_embedded


def _home(deep: bool) -> Path:
    """A new STORMLAKE_HOME outside pytest's folders (which are private to the user running the
    tests), short or about 120 characters deep (its socket then cannot live in the data folder)."""
    base = Path(tempfile.mkdtemp(prefix="sl-auth-"))
    if not deep:
        return base / "home"
    home = base / ("d" * 50) / ("e" * 50)
    home = home / ("f" * max(1, 120 - len(str(home)) - 1))
    assert len(str(home)) >= 118
    return home


@pytest.fixture(params=["short", "deep"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[Path, dict[str, str]]]:
    home = _home(request.param == "deep")
    pgdata = home / "pg"
    try:
        dsn = embedded_server_dsn(pgdata)
        yield pgdata, psycopg.conninfo.conninfo_to_dict(dsn)
    finally:
        stop_embedded(pgdata)
        shutil.rmtree(Path(*home.parts[:3]), ignore_errors=True)


def _as_nobody(*args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/", "PGCONNECT_TIMEOUT": "5"}
    return subprocess.run(["runuser", "-u", "nobody", "--", str(_bin_path() / "psql"), "-w", "-X", *args],
                          capture_output=True, text=True, env=env, timeout=60, cwd="/")


def test_the_socket_folder_and_the_socket_are_private(server: tuple[Path, dict[str, str]]) -> None:
    pgdata, info = server
    folder = Path(info["host"])
    assert len(str(folder / f".s.PGSQL.{info['port']}")) < 108
    mode = folder.lstat().st_mode
    assert stat.S_ISDIR(mode) and not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077 == 0, oct(mode)
    assert stat.S_IMODE((folder / f".s.PGSQL.{info['port']}").stat().st_mode) == 0o700
    assert stat.S_IMODE((pgdata.parent / "secrets").stat().st_mode) == 0o700
    assert stat.S_IMODE((pgdata.parent / "secrets" / "postgres").stat().st_mode) == 0o600
    # The server's own user gets in with the password, over the socket and over TCP.
    for host in (info["host"], "127.0.0.1"):
        with psycopg.connect(**{**info, "host": host}) as conn:
            assert conn.execute("SELECT current_setting('unix_socket_permissions')").fetchone()[0] == "0700"
    # Without it, nobody does, not even this user.
    no_password = {k: v for k, v in info.items() if k != "password"}
    for host in (info["host"], "127.0.0.1"):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(**{**no_password, "host": host}, connect_timeout=5)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root and runuser to try the server as another Unix user")
def test_another_unix_user_cannot_connect(server: tuple[Path, dict[str, str]]) -> None:
    pgdata, info = server
    port = str(info["port"])
    socket = _as_nobody("-h", info["host"], "-p", port, "-U", "postgres", "-c", "SELECT rolsuper FROM pg_roles")
    assert socket.returncode != 0 and "Permission denied" in socket.stderr, socket.stderr
    tcp = _as_nobody("-h", "127.0.0.1", "-p", port, "-U", "postgres", "-c", "SELECT 1")
    assert tcp.returncode != 0 and "password" in tcp.stderr, tcp.stderr
    guessed = _as_nobody(f"host=127.0.0.1 port={port} user=postgres password=postgres dbname=postgres", "-c", "SELECT 1")
    assert guessed.returncode != 0 and "password authentication failed" in guessed.stderr, guessed.stderr
    # nobody cannot read the password either.
    peek = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(pgdata.parent / "secrets" / "postgres")],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert peek.returncode != 0 and read_secret(pgdata, "postgres") not in peek.stdout


def test_the_logins_are_made_with_random_passwords_whose_verifiers_are_cheap_to_check(
        server: tuple[Path, dict[str, str]]) -> None:
    """Each login the first start makes gets in with its own password (Dagster's through its
    libpq password file), and none with another; their verifiers and the superuser's use
    SCRAM_ITERATIONS."""
    from resources.logins import DAGSTER, OPERATOR, OWNER, PIPELINE, embedded_logins
    from resources.pgserver import SCRAM_ITERATIONS

    pgdata, info = server
    logins = embedded_logins(pgdata)
    for dsn in (logins.owner, logins.pipeline, logins.reader):
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] in (OWNER, PIPELINE, OPERATOR)
    # Dagster's database is made on the instance's first use: getting that far is getting in.
    with pytest.raises(psycopg.OperationalError, match='database "dagster" does not exist'):
        psycopg.connect(logins.dagster, connect_timeout=5)
        wrong = {**psycopg.conninfo.conninfo_to_dict(dsn), "password": "not-the-password", "passfile": os.devnull}
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(**wrong, connect_timeout=5)
    with psycopg.connect(**info) as conn:
        verifiers = dict(conn.execute("SELECT rolname, rolpassword FROM pg_authid WHERE rolpassword IS NOT NULL").fetchall())
    assert {name: v.split(":")[0] for name, v in verifiers.items()} == {
        name: f"SCRAM-SHA-256${SCRAM_ITERATIONS}" for name in (OWNER, PIPELINE, OPERATOR, DAGSTER, "postgres")}


def test_a_server_started_again_in_the_same_process_is_the_one_stopped(server: tuple[Path, dict[str, str]]) -> None:
    """Stopping, starting and stopping again from one process stops the server that runs."""
    from resources.pgserver import is_running

    pgdata, _ = server
    assert stop_embedded(pgdata) and not is_running(pgdata)
    embedded_server_dsn(pgdata)
    assert is_running(pgdata)
    assert stop_embedded(pgdata)
    assert not is_running(pgdata)
