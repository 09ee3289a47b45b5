"""A real HTTP consumer for the end-to-end tests, and the harness those tests share.

:class:`Consumer` is an ``http.server`` on 127.0.0.1 in a thread. It records every POST (headers,
sha256 and size of the body, the answer it gave) in memory and, when asked, in a JSON file, and
answers as the test programs it:

- ``default``: the status of any request no rule below decides (200);
- ``script``: statuses by global request index (``{0: 500, 1: 500}``), by artifact kind or by
  Idempotency-Key (``{"summary.json": [500, 500, 200]}``: the n-th request of that kind gets the
  n-th entry, the last entry repeats);
- ``dedupe``: answer 409 to a key it has already accepted (what a careful consumer does);
- the status ``"hang"``: read the request, then never answer (until the consumer is stopped or
  ``hang_s`` passed), so the client times out;
- ``on_request``: a callback run after the answer was sent (the random-kill test does not need
  it; the delivery-window test uses it to kill the client right after a 200).

The rest of the module is the harness of the e2e tests: running ``stormlake`` in a subprocess
against an isolated home, reading ``stormlake status --json`` and the ledger, comparing a lake
with a clean run's, and the consumer-side invariants of contract section 6.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
STORMLAKE = str(BIN / "stormlake")
KINDS = ("clusters.geojson", "report.html", "summary.json")
# One partition, and the backfill that runs just it.
ONE_KEY = "2026-09-01|gulf_coast"
ONE_BACKFILL = ("backfill", "--regions", "gulf_coast", "--days", "2026-09-01..2026-09-01")
ARTIFACT_ID_RE = re.compile(r"^(?P<region>[a-z][a-z0-9_]{0,31})/(?P<day>\d{4}-\d{2}-\d{2})/(?P<kind>[a-z.]+)@(?P<hash>[0-9a-f]{16})$")
CONTENT_TYPES = {
    "summary.json": "application/json",
    "clusters.geojson": "application/geo+json",
    "report.html": "text/html; charset=utf-8",
}

Answer = int | str  # an HTTP status, or "hang"
PHASE_NAMES = ("ingest", "enrich", "correlate", "present")  # assets.phases.PHASES, in order


def generated_landing(root: Path, *, regions: int, rows_per_partition: int, seed: int, days: int = 2) -> Path:
    """A generated scenario in ``root``: the first ``regions`` regions over ``days`` days from 2026-09-01."""
    from pipeline.tools.generate import generate_scenario
    from resources.settings import DEFAULT_REGIONS_FILE, load_regions

    generate_scenario(root, load_regions(DEFAULT_REGIONS_FILE)[:regions], days=days, start="2026-09-01",
                      rows_per_partition=rows_per_partition, seed=seed)
    return root


# ---- the consumer ----------------------------------------------------------------------------
@dataclass
class Post:
    index: int
    path: str
    headers: dict[str, str]  # names lower-cased: HTTP header names are case-insensitive
    sha256: str
    size: int
    answer: Answer
    at: float

    @property
    def key(self) -> str:
        return self.headers.get("idempotency-key", "")

    @property
    def kind(self) -> str:
        return self.headers.get("x-stormlake-kind", "")

    @property
    def accepted(self) -> bool:
        return isinstance(self.answer, int) and (200 <= self.answer < 300 or self.answer == 409)

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "path": self.path, "headers": self.headers, "sha256": self.sha256,
                "size": self.size, "answer": self.answer, "at": self.at}


class Consumer:
    """See the module docstring. Use as a context manager: ``with Consumer() as c: c.url``."""

    def __init__(self, *, default: Answer = 200, script: dict[Any, Any] | None = None, dedupe: bool = True,
                 hang_s: float = 30.0, record_file: Path | None = None,
                 on_request: Callable[[Post], None] | None = None):
        self.default = default
        self.script: dict[Any, Any] = dict(script or {})
        self.dedupe = dedupe
        self.hang_s = hang_s
        self.record_file = record_file
        self.on_request = on_request
        self.posts: list[Post] = []
        self.accepted_keys: set[str] = set()
        self._seen: dict[str, int] = {}  # script selector -> requests seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- programming ------------------------------------------------------------------------
    def program(self, *, default: Answer | None = None, script: dict[Any, Any] | None = None,
                dedupe: bool | None = None) -> None:
        """Change the answers (``script`` replaces the old script and its counters)."""
        with self._lock:
            if default is not None:
                self.default = default
            if script is not None:
                self.script = dict(script)
                self._seen.clear()
            if dedupe is not None:
                self.dedupe = dedupe

    def _answer(self, index: int, key: str, kind: str) -> Answer:
        # caller holds the lock
        if index in self.script:
            return self.script[index]
        for selector in (key, kind):
            if selector and selector in self.script:
                n = self._seen.get(selector, 0)
                self._seen[selector] = n + 1
                answers = self.script[selector]
                if not isinstance(answers, list | tuple):
                    return answers
                return answers[min(n, len(answers) - 1)]
        if self.dedupe and key in self.accepted_keys:
            return 409
        return self.default

    # -- server -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/artifacts"

    def start(self) -> Consumer:
        consumer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if len(body) < length:
                    # the client went away mid-body (a killed producer): like any HTTP server, the
                    # consumer never saw a request, so it neither records nor answers one
                    self.close_connection = True
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                with consumer._lock:
                    index = len(consumer.posts)
                    key = headers.get("idempotency-key", "")
                    answer = consumer._answer(index, key, headers.get("x-stormlake-kind", ""))
                    post = Post(index, self.path, headers, hashlib.sha256(body).hexdigest(), len(body), answer,
                                time.time())
                    consumer.posts.append(post)
                    if post.accepted:
                        consumer.accepted_keys.add(key)
                    consumer._save()
                if answer == "hang":
                    consumer._stop.wait(consumer.hang_s)
                    self.close_connection = True
                    return
                payload = json.dumps({"status": answer, "key": key}).encode()
                self.send_response(int(answer))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                if consumer.on_request is not None:
                    consumer.on_request(post)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="test-consumer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _save(self) -> None:
        if self.record_file is not None:
            tmp = self.record_file.with_suffix(".tmp")
            tmp.write_text(json.dumps([p.as_dict() for p in self.posts], indent=1))
            os.replace(tmp, self.record_file)

    # -- views ------------------------------------------------------------------------------
    def snapshot(self) -> list[Post]:
        with self._lock:
            return list(self.posts)

    def keys_count(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self.snapshot():
            counts[p.key] = counts.get(p.key, 0) + 1
        return counts


# ---- consumer-side invariants ----------------------------------------------------------------
def check_headers(post: Post) -> None:
    """The contract headers of one POST (section 6)."""
    h = post.headers
    key = h.get("idempotency-key")
    assert key, f"POST #{post.index} without Idempotency-Key: {h}"
    artifact_id, _, generation = key.partition("#")
    assert h.get("x-stormlake-artifact-id") == artifact_id, h
    assert not generation or (generation.isdigit() and int(generation) >= 2), f"key {key!r}: bad generation"
    m = ARTIFACT_ID_RE.match(artifact_id)
    assert m, f"artifact id {key!r} is not <region>/<day>/<kind>@<16 hex>"
    assert h.get("x-stormlake-content-sha256") == post.sha256, f"{key}: header sha256 is not the body's"
    assert post.sha256[:16] == m["hash"], f"{key}: the id's hash is not the body's sha256 prefix"
    assert h.get("x-stormlake-region") == m["region"], h
    assert h.get("x-stormlake-day") == m["day"], h
    assert h.get("x-stormlake-kind") == m["kind"], h
    assert m["kind"] in KINDS, h
    assert h.get("content-type") == CONTENT_TYPES[m["kind"]], h


def check_consumer(posts: list[Post], *, partitions: list[str], max_repeats: int = 0) -> dict[str, str]:
    """Every artifact of every partition arrived, under one key per content, repeated at most as allowed.

    Returns ``{"<region>/<day>/<kind>": artifact id}`` of the accepted artifacts (one per kind).
    ``max_repeats`` is the number of crashes inside the delivery window the test caused: the total
    number of extra POSTs of an already-received key may not exceed it, and no key may be repeated
    more than once per crash.
    """
    for p in posts:
        check_headers(p)
    by_key: dict[str, list[Post]] = {}
    for p in posts:
        by_key.setdefault(p.key, []).append(p)
    # the same content never travels under two artifact ids, and a key always carries the same content
    # (one artifact id may travel under several keys: '<id>#<generation>' when it became current again)
    by_sha: dict[str, set[str]] = {}
    for p in posts:
        by_sha.setdefault(p.sha256, set()).add(p.key.partition("#")[0])
    dup_content = {sha: keys for sha, keys in by_sha.items() if len(keys) > 1}
    assert not dup_content, f"the same content under several keys: {dup_content}"
    for key, ps in by_key.items():
        assert len({p.sha256 for p in ps}) == 1, f"{key} carried different bodies"
    # repeats: only the accepted deliveries count (a retry after a 5xx or a timeout is not a repeat)
    repeats = {k: sum(p.accepted for p in ps) - 1 for k, ps in by_key.items() if sum(p.accepted for p in ps) > 1}
    assert sum(repeats.values()) <= max_repeats, (
        f"keys delivered more than once: {repeats} (allowed: {max_repeats} repeats for {max_repeats} crashes "
        "inside the delivery window)")
    accepted: dict[str, str] = {}
    for key, ps in by_key.items():
        if any(p.accepted for p in ps):
            m = ARTIFACT_ID_RE.match(key)
            assert m
            slot = f"{m['region']}/{m['day']}/{m['kind']}"
            assert slot not in accepted, f"two revisions of {slot} accepted: {accepted[slot]} and {key}"
            accepted[slot] = key
    for part in partitions:
        day, _, region = part.partition("|")
        for kind in KINDS:
            assert f"{region}/{day}/{kind}" in accepted, f"{region}/{day}/{kind} never arrived at the consumer"
    return accepted


# ---- running stormlake -----------------------------------------------------------------------
@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (f"stormlake {' '.join(self.args)} -> {self.returncode}\n--- stdout\n{self.stdout[-3000:]}"
                f"\n--- stderr\n{self.stderr[-5000:]}")


def base_env(**extra: str) -> dict[str, str]:
    """The parent's environment without any stormlake setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STORMLAKE_") and k not in ("DAGSTER_HOME", "PYTEST_CURRENT_TEST")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(env: dict[str, str], *args: str, timeout: float = 180, faults: str | None = None) -> Result:
    """Run ``stormlake *args`` to its end; a run still going after ``timeout`` s is killed and fails the test."""
    e = dict(env)
    if faults:
        e["STORMLAKE_FAULTS"] = faults
    else:
        e.pop("STORMLAKE_FAULTS", None)
    proc = subprocess.Popen([STORMLAKE, *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(REPO), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        raise AssertionError(
            f"stormlake {' '.join(args)} hung: still running after {timeout:.0f} s (killed)\n"
            f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-5000:]}"
        ) from None
    return Result(list(args), proc.returncode, out, err)


def start(env: dict[str, str], *args: str, log: Path, faults: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``stormlake *args`` in its own process group, output to ``log``."""
    e = dict(env)
    if faults:
        e["STORMLAKE_FAULTS"] = faults
    else:
        e.pop("STORMLAKE_FAULTS", None)
    fh = log.open("wb")
    try:
        return subprocess.Popen([STORMLAKE, *args], env=e, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO),
                                start_new_session=True)
    finally:
        fh.close()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of ``proc`` (started with a session of its own) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def run_until_ok(env: dict[str, str], *args: str, tries: int = 3, timeout: float = 180) -> list[Result]:
    """Run the command until it exits 0 (bounded); returns every result, the last one successful."""
    results = []
    for _ in range(tries):
        res = run(env, *args, timeout=timeout)
        results.append(res)
        if res.returncode == 0:
            return results
    raise AssertionError(f"no success in {tries} runs; the last:\n{results[-1]}")


def status(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``stormlake status --json`` by partition key."""
    res = run(env, "status", "--json", "--role", "admin", timeout=120)
    assert res.returncode == 0, str(res)
    data = json.loads(res.stdout)
    return {f"{p['day']}|{p['region']}": p for p in data["partitions"]}


def sql_rows(dsn: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        return conn.execute(statement, params).fetchall()  # type: ignore[arg-type]


def check_ledger_clean(dsn: str) -> None:
    """No checkpoint and no receipt left PENDING."""
    pending = sql_rows(dsn, "SELECT partition_key, phase, attempt FROM checkpoints WHERE status = 'PENDING'")
    assert not pending, f"checkpoints left PENDING: {pending}"
    assert sql_rows(dsn, "SELECT count(*) FROM checkpoints WHERE status = 'PENDING'")[0][0] == 0
    receipts = sql_rows(dsn, "SELECT artifact_id, target FROM receipts WHERE status = 'PENDING'")
    assert not receipts, f"receipts left PENDING: {receipts}"


@contextmanager
def database(admin_dsn: str, prefix: str = "stormlake_e2e") -> Iterator[str]:
    """A fresh database on the server of ``admin_dsn``, dropped afterwards."""
    from resources.pgserver import with_database

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            for db in (name, f"{name}_dagster"):  # the ledger's, and Dagster's storage next to it
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


def make_home(root: Path, landing: Path, dsn: str | None, *, webhook: str | None = None,
              **settings: str) -> dict[str, str]:
    """An isolated STORMLAKE_HOME under ``root`` with a copy of ``landing``; returns its environment.

    ``dsn`` None leaves STORMLAKE_PG_DSN unset: the home's embedded server (started by the first
    command that needs it; ``root`` should then come from :func:`embedded_root`).
    """
    home = root / "home"
    shutil.copytree(landing, home / "landing")
    env = base_env(STORMLAKE_HOME=str(home), DAGSTER_HOME=str(home / "dagster"),
                   STORMLAKE_WEBHOOK_BACKOFF="0.05", STORMLAKE_WEBHOOK_TIMEOUT="5")
    if dsn is not None:
        env["STORMLAKE_PG_DSN"] = dsn
    if webhook:
        env["STORMLAKE_WEBHOOK_URL"] = webhook
    env.update(settings)
    return env


# ---- the embedded server of a test home ------------------------------------------------------
@contextmanager
def embedded_root(prefix: str = "stormlake-e2e-") -> Iterator[Path]:
    """A folder for homes with embedded servers; every server under it is stopped at the end, then it goes.

    It lies outside pytest's basetemp: as root the server runs as another OS user, and a new
    pytest session (of anyone) resets /tmp/pytest-of-<user> to mode 0700, which would lock that
    user out of a data directory below it.
    """
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        reap_home(root, wait_s=0)  # runs a killed CLI left, whose homes go now
        stop_servers(root)
        if os.environ.get("STORMLAKE_TEST_KEEP_HOMES"):  # to read a failed test's homes afterwards
            sys.stderr.write(f"homes kept in {root}\n")
        else:
            shutil.rmtree(root, ignore_errors=True)


def server_processes(under: Path) -> list[int]:
    """Pids of the PostgreSQL processes whose data directory (their working directory) is below ``under``."""
    import psutil

    under = under.resolve()
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "postgres":
            continue
        try:
            cwd = Path(proc.cwd())
        except psutil.Error:
            continue
        if cwd == under or under in cwd.parents:
            found.append(proc.pid)
    return found


def stop_servers(root: Path, *, wait_s: float = 30.0) -> None:
    """Stop every embedded server of a home under ``root`` at once, then kill whatever is left.

    The homes are thrown away, so the servers get PostgreSQL's immediate shutdown (SIGQUIT to
    the postmaster: no shutdown checkpoint, which costs seconds on a busy disk).
    """
    postmasters = [pm[0] for pid_file in root.glob("**/pg/postmaster.pid")
                   if (pm := postmaster(pid_file.parent)) is not None]
    signal_all(postmasters, signal.SIGQUIT)
    deadline = time.monotonic() + wait_s
    while server_processes(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_all(server_processes(root), signal.SIGKILL)  # a server that did not stop, or one a kill left half-started


def home_pgdata(env: dict[str, str]) -> Path:
    return Path(env["STORMLAKE_HOME"]) / "pg"


def postmaster(pgdata: Path) -> tuple[int, list[str]] | None:
    """(pid, lines of ``postmaster.pid``) of the live postmaster of ``pgdata``, or None.

    Read here rather than through resources.pgserver, so that the tests observe the server
    without the code under test: a postmaster is a live, non-zombie ``postgres`` process whose
    working directory is ``pgdata`` and whose pid (positive) heads ``postmaster.pid``.
    """
    import psutil

    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or proc.name() != "postgres":
            return None
        if Path(proc.cwd()).resolve() != pgdata.resolve():
            return None
    except psutil.Error:
        return None
    return pid, lines


def server_ready(pgdata: Path) -> bool:
    """Whether the embedded server of ``pgdata`` runs and says ``ready`` in ``postmaster.pid``."""
    pm = postmaster(pgdata)
    return pm is not None and len(pm[1]) > 7 and pm[1][7].strip() == "ready"


def passfile_dsn(dsn: str, passfile: Path) -> str:
    """``dsn`` with its password moved to a libpq password file (0600), as a person keeps it: a DSN
    without a secret goes into dagster.yaml as it is, for every process to read."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    password = info.pop("password", None)
    if not password:
        return dsn
    fd = os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"*:*:*:{info.get('user') or 'postgres'}:{password}\n")
    return psycopg.conninfo.make_conninfo(**info, passfile=str(passfile))


def ledger_dsn(env: dict[str, str], *, wait_s: float = 60.0) -> str | None:
    """The ledger DSN of ``env``: STORMLAKE_PG_DSN, or its home's embedded server once that is ready.

    None when no embedded server runs (a kill stopped its first start before it got going). A
    server still starting (a kill landed in ``pg_ctl start``) is waited for. The embedded
    server listens on a Unix socket in the folder and with the port ``postmaster.pid`` names,
    and asks for the password kept in the home's secrets; the ledger's database is ``stormlake``.
    """
    if env.get("STORMLAKE_PG_DSN"):
        return env["STORMLAKE_PG_DSN"]
    pgdata = home_pgdata(env)
    deadline = time.monotonic() + wait_s
    while True:
        pm = postmaster(pgdata)
        if pm is None:
            return None
        if server_ready(pgdata):
            from resources.pgserver import server_dsn

            return server_dsn(pgdata, "stormlake")
        assert time.monotonic() < deadline, f"the embedded server in {pgdata} did not get ready in {wait_s:.0f} s"
        time.sleep(0.05)


def completed_count(env: dict[str, str]) -> int:
    """Current COMPLETED checkpoints of the ledger (0 when no server, database or table exists yet)."""
    dsn = ledger_dsn(env)
    if dsn is None:
        return 0
    try:
        return sql_rows(dsn, "SELECT count(*) FROM checkpoints WHERE status = 'COMPLETED'"
                             " AND superseded_at IS NULL")[0][0]
    except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
        return 0  # the first start was killed before the database or the migrations were made


# ---- kills ----------------------------------------------------------------------------------
#: The last line a backfill prints once all its work is done (pipeline/cli.py, cmd_backfill).
FINISHED_RE = re.compile(r"^\d+/\d+ partitions succeeded", re.MULTILINE)


def server_pids(pgdata: Path) -> list[int]:
    """Every process of the embedded server in ``pgdata``: its postmaster first, then the rest.

    PostgreSQL's children each start a session of their own, so no process group holds them
    all; they are the postmaster's children and run in the data directory.
    """
    import psutil

    pids: list[int] = []
    pm = postmaster(pgdata)
    if pm is not None:
        pids.append(pm[0])
        try:
            pids += [c.pid for c in psutil.Process(pm[0]).children(recursive=True)]
        except psutil.Error:
            pass
    return pids + [p for p in server_processes(pgdata) if p not in pids]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class Outcome:
    """One run of a kill loop: killed inside its work, or ended on its own."""

    killed: bool
    seconds: float  # to the kill, or to the end
    returncode: int | None
    server_ready: bool  # the home's server was up and ready at the moment of the kill (or the end)
    seen: Any = None  # what ``inspect`` returned at the moment of the kill


def run_and_kill(env: dict[str, str], args: tuple[str, ...], *, delay: float, log: Path,
                 crash_server: bool = False, finished: re.Pattern[str] = FINISHED_RE,
                 inspect: Callable[[], Any] | None = None) -> Outcome:
    """Start ``stormlake *args``; after ``delay`` s SIGKILL its process group if it is still at work.

    At the moment the run (and with ``crash_server`` the embedded server, every process of it)
    is frozen with SIGSTOP first, then judged: a run that has exited or printed its last line
    (``finished``) has finished, and is let go on (a kill after the work is no kill); otherwise
    everything frozen is killed with SIGKILL, the server as a power loss would (its unwritten WAL
    is lost). ``inspect`` looks at the frozen state (its result is the outcome's ``seen``).
    """
    pgdata = home_pgdata(env)
    proc = start(env, *args, log=log)
    t0 = time.monotonic()
    while time.monotonic() - t0 < delay and proc.poll() is None:
        time.sleep(0.01)
    if proc.poll() is not None:
        return Outcome(False, time.monotonic() - t0, proc.returncode, server_ready(pgdata))
    try:
        os.killpg(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    frozen: list[int] = []
    if crash_server:
        first = server_pids(pgdata)[:1]
        signal_all(first, signal.SIGSTOP)  # the postmaster first: then it forks no more
        frozen = first + [p for p in server_pids(pgdata) if p not in first]
        signal_all(frozen, signal.SIGSTOP)
    elapsed = time.monotonic() - t0
    ready = server_ready(pgdata) if not env.get("STORMLAKE_PG_DSN") else True
    seen = inspect() if inspect is not None else None
    text = log.read_text(errors="replace")
    if proc.poll() is not None or finished.search(text):
        signal_all(frozen, signal.SIGCONT)
        try:
            os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        proc.wait(120)
        return Outcome(False, time.monotonic() - t0, proc.returncode, ready, seen)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    signal_all(frozen, signal.SIGKILL)
    proc.wait(30)
    return Outcome(True, elapsed, None, ready, seen)


def home_processes(home: Path | str) -> list[int]:
    """Pids of the processes of a home (``STORMLAKE_HOME`` in their environment is ``home`` or below
    it), its embedded server's excepted: a CLI, its daemon and code server, and the run processes
    they launched, which outlive a killed CLI (a run belongs to Dagster, not to the CLI)."""
    import psutil

    home = str(Path(home).resolve())
    found = []
    for proc in psutil.process_iter(["name", "pid"]):
        if proc.info["pid"] == os.getpid() or proc.info["name"] in ("postgres", "pg_ctl", "initdb"):
            continue
        try:
            value = proc.environ().get("STORMLAKE_HOME")
            if value is None or proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if value == home or value.startswith(home + os.sep):
            found.append(proc.pid)
    return found


def reap_home(home: Path | str, *, wait_s: float) -> list[str]:
    """Wait up to ``wait_s`` for every process of ``home`` (:func:`home_processes`) to end, then
    SIGKILL what is left; each killed one's pid, parent and command line. No process of a test's
    home outlives the test."""
    import psutil

    deadline = time.monotonic() + wait_s
    while (left := home_processes(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for pid in left:
        try:
            p = psutil.Process(pid)
            described.append(f"{pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            described.append(f"{pid} (gone)")
    signal_all(left, signal.SIGKILL)
    return described


def crash_server(pgdata: Path) -> list[int]:
    """Kill every process of the embedded server in ``pgdata`` at once (SIGSTOP all, then SIGKILL)."""
    first = server_pids(pgdata)[:1]
    signal_all(first, signal.SIGSTOP)  # the postmaster first: then it forks no more
    pids = first + [p for p in server_pids(pgdata) if p not in first]
    signal_all(pids, signal.SIGSTOP)
    signal_all(pids, signal.SIGKILL)
    return pids


def lake_root(env: dict[str, str]) -> str:
    return env.get("STORMLAKE_LAKE") or str(Path(env["STORMLAKE_HOME"]) / "lake")


def lake_snapshot(env: dict[str, str], partitions: list[str]) -> dict[tuple[str, str], Any]:
    """Every table of every partition, as sorted DataFrames (tests.helpers.read_table)."""
    from assets.schemas import SCHEMAS
    from tests.helpers import read_table

    root = lake_root(env)
    return {(t, k): read_table(root, t, k) for t in SCHEMAS for k in partitions}


def check_lake_equal(env: dict[str, str], clean: dict[tuple[str, str], Any], partitions: list[str]) -> None:
    """The lake of ``env`` equals a clean run's, table by table, row for row."""
    import pandas as pd

    got = lake_snapshot(env, partitions)
    for (table, key), want in clean.items():
        have = got[(table, key)]
        assert len(have) == len(want), f"{table} {key}: {len(have)} rows, a clean run has {len(want)}"
        pd.testing.assert_frame_equal(have, want, check_like=True, obj=f"{table} {key}")


def python() -> str:
    return str(BIN / "python") if (BIN / "python").exists() else sys.executable


def check_one_line_error(stderr: str, *, must_mention: tuple[str, ...] = (), max_lines: int = 1) -> str:
    """Contract section 7: an error is one ``stormlake:`` line on stderr, never a traceback or stack trace.

    ``max_lines`` allows a summary line after the failed partition's line; every line must then
    mention the words of ``must_mention``.
    """
    assert "Traceback" not in stderr and "Stack Trace" not in stderr, f"a traceback on stderr:\n{stderr[-6000:]}"
    assert not [ln for ln in stderr.splitlines() if ln.lstrip().startswith('File "')], stderr[-6000:]
    errors = [ln for ln in stderr.splitlines() if ln.startswith("stormlake:")]
    assert 1 <= len(errors) <= max_lines, f"expected one error line, got {errors}:\n{stderr[-3000:]}"
    for line in errors:
        for word in must_mention:
            assert word.lower() in line.lower(), f"the error line does not mention {word!r}: {line}"
    return errors[0]


# ---- landing data ------------------------------------------------------------------------------
def add_outages(landing: Path | str, region: str, day: str, *, tag: str = "late", n: int = 2) -> None:
    """Append ``n`` valid outage rows to the partition's outages.csv: new inputs for it.

    ``landing``: a folder or an ``s3://`` URL (the AWS variables of this process reach it)."""
    from resources.settings import DEFAULT_REGIONS_FILE, load_regions
    from resources.storage import open_storage

    box = {r.region_id: r for r in load_regions(DEFAULT_REGIONS_FILE)}[region]
    zone, rel = open_storage(landing), f"{region}/{day}/outages.csv"
    text = zone.read(rel).decode("utf-8")
    header = next(csv.reader(io.StringIO(text)))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    for i in range(n):
        writer.writerow({
            "event_id": f"{tag}-{i:04d}", "region_id": region, "reported_at": f"{day}T2{i}:15:00+00:00",
            "lat": f"{(box.min_lat + box.max_lat) / 2 + 0.01 * i:.5f}",
            "lon": f"{(box.min_lon + box.max_lon) / 2 - 0.01 * i:.5f}",
            "customers_out": str(40 + i), "cause": "vegetation", "restored_at": "",
        })
    zone.put(rel, (text + ("" if text.endswith("\n") else "\n") + buf.getvalue()).encode("utf-8"))
