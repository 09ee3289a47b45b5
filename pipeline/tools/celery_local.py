"""A deployment of Dagster's Celery executor on one machine, for the tests and ``stormlake bench
--engine``: a Redis broker, Celery workers that run as another Unix user with homes of their own,
and a launcher whose home they cannot read.

What a worker shares with the launcher, and nothing else: the ledger and Dagster's storage over
TCP, each with a login of its own (the pipeline's, made with ``stormlake access add-login``, and
Dagster's), the object store (a moto S3 endpoint), the broker and the installed code. Its
settings are its own environment's.

A backfill goes the one road (:meth:`Deployment.backfill`): ``stormlake backfill`` in the
launcher's environment submits a Dagster asset backfill and starts the daemon for its lifetime;
the daemon inherits that environment (``STORMLAKE_EXECUTOR=celery``, the broker), so the runs it
launches put their steps on the broker, and the workers run them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pipeline.tools.s3_local import Endpoint, free_port, s3_settings, stop_server, wait_for_port

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]  # the project's folder: its requirements.lock

WORKER_USER = "nobody"


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any stormlake or Dagster setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STORMLAKE_", "DAGSTER_")) and k != "PYTEST_CURRENT_TEST"}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``stormlake *args`` to its end."""
    return subprocess.run([str(BIN / "stormlake"), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO))


def _ok(res: subprocess.CompletedProcess[str]) -> None:
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(res.args[1:])} -> {res.returncode}: {res.stderr.strip()[-2000:]}")


def redis_binary() -> str:
    """The ``redis-server`` binary (``make test`` installs Debian's package: tests/ensure_redis.sh)."""
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("redis-server is missing: run tests/ensure_redis.sh (make test does), or"
                           " sudo apt-get install -y redis-server")
    return found


@contextmanager
def redis_broker(folder: Path) -> Iterator[str]:
    """A Redis server on a free port of 127.0.0.1 with a password; yields its URL (a secret)."""
    port = free_port()
    password = secrets.token_hex(16)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "redis.log"
    proc = subprocess.Popen([redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--requirepass", password, "--dir", str(folder),
                             "--logfile", str(log)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_for_port(proc, port, 30, log, f"redis-server did not start on port {port}")
        yield f"redis://:{password}@127.0.0.1:{port}/0"
    finally:
        stop_server(proc)


def other_user() -> str | None:
    """The Unix user the workers run as (``nobody``), or None without root (they then run as this user)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return None
    return WORKER_USER


def worker_python(root: Path, user: str | None) -> Path:
    """An interpreter the workers' user may run, with the project's installed packages.

    The project's environment may sit on an interpreter in a folder that user cannot reach (a
    pyenv build under /root); then a virtual environment of the system's Python 3 of the same
    version is made in ``root`` and given the project's site-packages (the installed code, nothing
    else of the launcher's)."""
    import sysconfig

    own = BIN / "python"
    if user is None or subprocess.run(["runuser", "-u", user, "--", str(own), "-c", ""],
                                      capture_output=True).returncode == 0:
        return own
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system is None:
        raise RuntimeError(f"the workers' user {user} cannot run {own}, and there is no /usr/bin/{version}")
    venv = root / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = Path(sysconfig.get_paths()["purelib"])
    (venv / "lib" / version / "site-packages" / "stormlake.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    python = venv / "bin" / "python"
    # What the lock installs only on that interpreter's version (a backport for an older patch
    # release), with no dependencies: everything else is the project's installed set.
    missing = subprocess.run([str(python), "-c", _LOCK_MISSING, str(REPO / "requirements.lock")], capture_output=True,
                             text=True, check=True).stdout.split()
    if missing:
        subprocess.run([str(BIN / "python"), "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                        *missing], check=True, capture_output=True)
    for folder, _, files in os.walk(venv):  # readable by the workers' user whatever this process's umask
        os.chmod(folder, 0o755)
        for f in files:
            path = os.path.join(folder, f)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if os.stat(path).st_mode & 0o100 else 0))
    return python


#: Prints the lock's pins whose environment marker holds for the running interpreter and that are
#: not installed.
_LOCK_MISSING = """
import importlib.metadata, sys
from packaging.markers import Marker
for line in open(sys.argv[1]):
    if line[:1] in (" ", "#", "\\n") or "==" not in line:
        continue
    spec, _, marker = line.strip().rstrip("\\\\").partition(";")
    name, _, version = spec.strip().partition("==")
    if marker.strip() and not Marker(marker.strip()).evaluate():
        continue
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        print(f"{name}=={version.strip()}")
"""


def tcp_dsn(dsn: str, **change: str) -> str:
    """``dsn`` over TCP on 127.0.0.1 (a Unix socket's folder belongs to the launcher's host)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    if str(info.get("host") or "").startswith("/") or not info.get("host"):
        info["host"] = "127.0.0.1"
    if "password" in change:
        info.pop("passfile", None)
    info.update(change)
    return psycopg.conninfo.make_conninfo(**info)


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tasks_done(self) -> int:
        """Steps this worker finished (Celery's line for each task that returned)."""
        return self.text().count("] succeeded in ")

    def kill(self) -> None:
        """SIGKILL every process of the worker (its process group: the worker and its pool)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


@dataclass
class Deployment:
    root: Path
    launcher: dict[str, str]  # the launcher's environment (its home is 0700)
    worker_env: dict[str, str]  # what every worker is given (no home: each gets its own)
    user: str | None  # the workers' Unix user (None: this user)
    ledger_dsn: str  # the owner's view of the ledger, for the test's checks
    python: Path = Path(BIN / "python")  # the workers' interpreter, with the installed code
    workers: list[Worker] = field(default_factory=list)
    launches: list[subprocess.Popen[str]] = field(default_factory=list)  # killed by stop() if still going

    @property
    def launcher_home(self) -> Path:
        return Path(self.launcher["STORMLAKE_HOME"])

    def worker_command(self, name: str, home: Path) -> list[str]:
        celery = [str(self.python), "-m", "celery", "-A", "pipeline.celery_worker", "worker", "--concurrency", "1",
                  "--loglevel", "INFO", "-n", f"{name}@%h", "--without-gossip", "--without-mingle"]
        env = ["env", f"HOME={home}", f"STORMLAKE_HOME={home / 'stormlake'}", f"DAGSTER_HOME={home / 'dagster'}"]
        if self.user is None:
            return [*env, *celery]
        return ["runuser", "-u", self.user, "--", *env, *celery]

    def start_worker(self, name: str, **extra: str) -> Worker:
        """Start a worker with a home of its own (0700, its user's), and wait until it listens."""
        home = self.root / name
        home.mkdir(mode=0o700)
        if self.user is not None:
            shutil.chown(home, self.user)
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(self.worker_command(name, home), env={**self.worker_env, **extra}, cwd=str(home),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        worker = Worker(name, proc, log)
        deadline = time.monotonic() + 120
        while " ready." not in worker.text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} did not get ready ({proc.poll()}):\n{worker.text()[-4000:]}")
            time.sleep(0.1)
        self.workers.append(worker)
        return worker

    def backfill_command(self, keys: list[str], *, runs_at_once: int = 2) -> list[str]:
        """``stormlake backfill`` of ``keys``: their regions over their days (the landing zone holds
        exactly ``keys`` there), with the run queue's limit ``runs_at_once`` for the daemon it starts."""
        from resources.keys import split_partition_key

        days, regions = zip(*(split_partition_key(k) for k in keys), strict=True)
        return [str(BIN / "stormlake"), "backfill", "--regions", ",".join(sorted(set(regions))),
                "--days", f"{min(days)}..{max(days)}", "--workers", str(runs_at_once)]

    def start_backfill(self, keys: list[str], *, runs_at_once: int = 2) -> subprocess.Popen[str]:
        return self._start(self.backfill_command(keys, runs_at_once=runs_at_once))

    def backfill(self, keys: list[str], *, timeout: float = 600, runs_at_once: int = 2) -> Launched:
        """``stormlake backfill`` of ``keys`` to its end (still going after ``timeout`` s raises)."""
        return wait_runs([self.start_backfill(keys, runs_at_once=runs_at_once)], timeout=timeout)[0]

    def execute(self, keys: list[str], *, config: Path, timeout: float = 300) -> Launched:
        """One run of ``storm_job`` over the key range ``keys`` with the run config ``config``
        (``dagster job execute -c``), to its end: a backfill carries no run config of its own."""
        tags = json.dumps({"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
        return wait_runs([self._start([str(BIN / "dagster"), "job", "execute", "-m", "pipeline.definitions", "-j",
                                       "storm_job", "--tags", tags, "-c", str(config)])], timeout=timeout)[0]

    def _start(self, cmd: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(cmd, env=self.launcher, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        self.launches.append(proc)
        return proc

    def backfill_runs(self, backfill_id: str) -> dict[str, Any]:
        """What the launcher's Dagster instance holds of backfill ``backfill_id``: its status
        (None when the instance has no such backfill) and its runs, each with its status and the
        steps that succeeded in it. Asked in a process of the launcher's environment."""
        out = subprocess.run([str(BIN / "python"), "-c", _BACKFILL_RUNS, backfill_id], env=self.launcher,
                             cwd=str(REPO), capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"reading backfill {backfill_id} from the instance failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        for p in self.launches:  # a backfill's CLI left by a failure; its daemon dies with it
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.communicate()
        for w in self.workers:
            if w.proc.poll() is None:
                try:
                    os.killpg(w.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for w in self.workers:
            try:
                w.proc.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()


@dataclass(frozen=True)
class Launched:
    """A launch command's end: its exit code and its output (stdout and stderr)."""

    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def backfill_id(output: str) -> str:
    """The id of the backfill that ``stormlake backfill`` printed it submitted."""
    found = re.findall(r"^backfill ([a-z]{8}): ", output, flags=re.M)
    if len(found) != 1:
        raise RuntimeError(f"stormlake backfill named no backfill:\n{output[-4000:]}")
    return found[0]


#: Prints the backfill's status and runs as one JSON line (see :meth:`Deployment.backfill_runs`).
_BACKFILL_RUNS = """
import json, sys
import dagster as dg
from resources import dagster_compat
from resources.keys import BACKFILL_TAG
with dg.DagsterInstance.get() as instance:
    status = dagster_compat.backfill_status(instance, sys.argv[1])
    runs = [{"run_id": r.dagster_run.run_id, "status": r.dagster_run.status.value,
             "steps_succeeded": len(instance.all_logs(r.dagster_run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS))}
            for r in instance.get_run_records(filters=dg.RunsFilter(tags={BACKFILL_TAG: sys.argv[1]}))]
print(json.dumps({"status": status and status[0], "finished": status and status[1], "runs": runs}))
"""


def wait_runs(procs: list[subprocess.Popen[str]], *, timeout: float) -> list[Launched]:
    """Wait for every launch command; one still going after ``timeout`` s stops them all and raises."""
    done = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            raise TimeoutError(f"a run was still going after {timeout:.0f} s:\n{out[-4000:]}") from None
        done.append(Launched(p.returncode, out))
    return done


@contextmanager
def deployment(admin_dsn: str, database_dsn: str, endpoint: Endpoint, landing: Path, broker: str, *,
               redeliver_after_s: int = 3600) -> Iterator[Deployment]:
    """A launcher home (0700) and everything the workers are given; the workers are started by the
    caller (:meth:`Deployment.start_worker`) and stopped on leaving, and the logins made here dropped.

    ``database_dsn``: a fresh database (the ledger's; Dagster's is made next to it).
    """
    root = Path(tempfile.mkdtemp(prefix="stormlake-celery-"))
    root.chmod(0o711)  # the workers reach their own homes below it, and nothing else
    tag = uuid.uuid4().hex[:10]
    ledger_db = psycopg.conninfo.conninfo_to_dict(database_dsn)["dbname"]
    dagster_db, dagster_login, pipeline_login = f"{ledger_db}_dagster", f"sl_dagster_{tag}", f"sl_worker_{tag}"
    dagster_password = secrets.token_hex(16)
    launcher_home = root / "launcher"
    launcher_home.mkdir(mode=0o700)
    bucket = endpoint.new_bucket("celery")
    s3 = s3_settings(endpoint, bucket)
    endpoint.upload(landing, s3["STORMLAKE_LANDING"])
    shutil.copytree(landing, launcher_home / "landing")  # the launcher's own copy: a worker cannot read it
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(dagster_login),
                                                                      sql.Literal(dagster_password)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(dagster_db),
                                                                   sql.Identifier(dagster_login)))
    from pipeline.instance import DAGSTER_URL_ENV, sqlalchemy_url

    owner = tcp_dsn(database_dsn)
    dagster = tcp_dsn(database_dsn, dbname=dagster_db, user=dagster_login, password=dagster_password)
    common = {**s3, "STORMLAKE_EXECUTOR": "celery", "STORMLAKE_BROKER_URL": broker,
              "STORMLAKE_REDELIVER_AFTER": str(redeliver_after_s), DAGSTER_URL_ENV: sqlalchemy_url(dagster),
              "STORMLAKE_DAGSTER_DSN": dagster}
    launcher = base_env(STORMLAKE_HOME=str(launcher_home), DAGSTER_HOME=str(launcher_home / "dagster"),
                        STORMLAKE_OWNER_DSN=owner, **common)
    _ok(run(launcher, "db", "migrate"))  # the ledger's tables
    _ok(run(launcher, "access", "add-login", pipeline_login, "--role", "resume_worker"))
    pipeline = (launcher_home / "logins" / f"{pipeline_login}.dsn").read_text().strip()
    launcher["STORMLAKE_PIPELINE_DSN"] = pipeline
    _ok(run(launcher, "env"))  # writes dagster.yaml
    worker_env = {k: v for k, v in base_env(**common).items() if k not in ("HOME", "STORMLAKE_HOME", "DAGSTER_HOME")}
    worker_env["STORMLAKE_PIPELINE_DSN"] = pipeline
    user = other_user()
    dep = Deployment(root, launcher, worker_env, user, owner, python=worker_python(root, user))
    try:
        yield dep
    finally:
        dep.stop()
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            for db in (dagster_db, ledger_db):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
            for role in (dagster_login, pipeline_login):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
        shutil.rmtree(root, ignore_errors=True)
