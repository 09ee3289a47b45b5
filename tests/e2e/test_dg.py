"""Dagster's ``dg`` CLI on the project as a Dagster user runs it, and ``stormlake ui`` (``dg dev``
behind it), all on the PostgreSQL-backed instance ``stormlake`` prepares.

- ``dg check defs`` and ``dg list defs`` from the repo root: the code location is ``stormlake``
  and every asset, job, schedule and sensor is listed.
- ``dg dev`` in a project folder whose ``.env`` ``stormlake env --dotenv`` wrote, with no
  setting in the environment: the location is ``stormlake`` and the instance is the one in
  ``$DAGSTER_HOME`` (PostgreSQL storage, the queue's limits).
- ``stormlake ui`` on the embedded server, started as a shell's background job (SIGINT
  ignored): it is ``dg dev`` (the webserver and the daemon share one code server), and SIGTERM
  has ``dg dev`` shut its services down, then stops every process it started and the embedded
  PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCATION = "stormlake"
TABLES = {  # one asset per Delta table, grouped by the phase that writes it
    "outages_raw": "ingest", "weather_raw": "ingest", "customers_ref": "ingest", "terrain_ref": "ingest",
    "quarantine": "ingest", "outages_enriched": "enrich", "cell_hour_stats": "correlate", "cell_risk": "correlate",
    "storm_clusters": "correlate", "region_day_summary": "present",
}
ASSETS = {"landing_files", *TABLES}
JOBS = {"storm_job", "observe_landing"}
SCHEDULES = {"daily_storm_schedule", "observe_landing_schedule"}
SENSORS = {"landing_sensor", "outbox_sensor"}
HANG_GUARD_S = 300  # a deadline against hanging forever, not a performance assertion
SETTINGS = ("STORMLAKE_HOME", "STORMLAKE_PG_DSN", "DAGSTER_HOME", "STORMLAKE_DAGSTER_PG_URL")

QUERY = """
query { repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } }
        instance { info runQueuingSupported } }
"""


def _run(args: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, proc: subprocess.Popen, log: Path) -> dict[str, Any]:
    """The code locations and the instance, once the webserver answers."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    else:
        raise AssertionError(f"the webserver did not answer:\n{log.read_text(errors='replace')[-4000:]}")
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": QUERY}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        payload = json.loads(resp.read())
    assert not payload.get("errors"), payload
    return payload["data"]


def _check_instance(data: dict[str, Any], dagster_home: Path) -> None:
    """The one location is ``stormlake``; the instance is stormlake's (PostgreSQL, queue, home)."""
    assert [n["location"]["name"] for n in data["repositoriesOrError"]["nodes"]] == [LOCATION], data
    info = data["instance"]["info"]
    assert "PostgresRunStorage" in info and "PostgresEventLogStorage" in info, info
    assert "max_concurrent_runs: " in info and data["instance"]["runQueuingSupported"], info  # STORMLAKE_WORKERS
    assert f"base_dir: {dagster_home}" in info, info


def _descendants(root: int) -> set[int]:
    """Every live process whose parent chain leads to ``root``."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    """The ``pids`` that still run (a zombie waiting to be reaped has stopped)."""
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGKILL to a process started in its own session and everything of its group.

    Only the `stormlake ui` test checks a graceful stop (SIGTERM, which `stormlake ui` passes on to
    dg dev as the SIGINT it expects). dg dev interrupted right after its services came up can wait
    forever on a webserver and daemon that took the interrupt too early, so a test that only needs
    it gone does not ask.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


@pytest.fixture
def prepared(sl_env: dict[str, str]) -> dict[str, str]:
    """The instance prepared as any stormlake command does; the environment ``stormlake env`` exports."""
    from pipeline.instance import prepare_dagster_home
    from resources.settings import load_settings

    prepare_dagster_home(load_settings())
    return dict(os.environ)


def test_dg_check_and_list_defs_from_the_repo_root(prepared: dict[str, str]) -> None:
    check = _run([str(BIN / "dg"), "check", "defs", "--log-level", "info"], cwd=REPO, env=prepared)
    out = check.stdout + check.stderr
    assert check.returncode == 0, out[-4000:]
    assert f"Validation successful for code location {LOCATION}." in out, out[-4000:]
    assert "Using temporary directory" not in out, out[-4000:]  # the instance in $DAGSTER_HOME, not a temporary one

    listed = _run([str(BIN / "dg"), "list", "defs", "--json"], cwd=REPO, env=prepared)
    assert listed.returncode == 0, listed.stderr[-4000:]
    defs = json.loads(listed.stdout)
    assert {a["asset_key"] for a in defs["assets"]} == ASSETS
    assets = {a["asset_key"]: a for a in defs["assets"]}
    assert {t: assets[t]["group_name"] for t in TABLES} == TABLES
    assert assets["outages_raw"]["dependency_keys"] == ["landing_files"]
    assert set(assets["outages_enriched"]["dependency_keys"]) == {"outages_raw", "weather_raw", "customers_ref",
                                                                 "terrain_ref"}
    # Each table points at its phase's function (dg.with_source_code_references).
    assert {t: assets[t]["source"].split(":")[0] for t in TABLES} == {t: f"assets/{p}.py" for t, p in TABLES.items()}
    # One grader per phase, on the phase's first table.
    assert {c["key"] for c in defs["asset_checks"]} == {
        "outages_raw:grader", "outages_enriched:grader", "cell_hour_stats:grader", "region_day_summary:grader"}
    assert {j["name"] for j in defs["jobs"]} == JOBS
    assert {s["name"] for s in defs["schedules"]} == SCHEDULES
    assert {s["name"] for s in defs["sensors"]} == SENSORS


def test_dg_dev_finds_the_instance_through_the_project_dotenv(prepared: dict[str, str], tmp_path: Path) -> None:
    # A project folder like a checkout (its pyproject.toml, the packages): the repo's own .env is
    # the user's, so the test writes its .env into a folder of its own.
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")
    for package in ("pipeline", "assets", "resources"):
        (project / package).symlink_to(REPO / package)
    wrote = _run([str(BIN / "stormlake"), "env", "--dotenv"], cwd=project, env=prepared)
    assert wrote.returncode == 0, wrote.stderr
    assert (project / ".env").is_file()

    bare = {k: v for k, v in os.environ.items() if k not in SETTINGS}  # what a new shell has
    check = _run([str(BIN / "dg"), "check", "defs", "--log-level", "info"], cwd=project, env=bare)
    out = check.stdout + check.stderr
    assert check.returncode == 0 and f"code location {LOCATION}." in out, out[-4000:]
    assert "Using temporary directory" not in out, out[-4000:]

    port = _free_port()
    log = tmp_path / "dg-dev.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(BIN / "dg"), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=project, env=bare,
                                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _check_instance(_graphql(port, proc, log), Path(prepared["DAGSTER_HOME"]))
    finally:
        _stop_group(proc)


def test_the_project_dotenv_follows_the_project_home_and_gives_way_to_the_shell(
        sl_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dotenv import dotenv_values

    from pipeline import instance
    from resources.settings import load_settings

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")
    (project / ".env").write_text("STORMLAKE_WEBHOOK_URL=http://127.0.0.1:9/hook\nDAGSTER_HOME=/elsewhere\n")
    monkeypatch.setattr(instance, "PROJECT_ROOT", project)

    instance.prepare_dagster_home(load_settings())  # a home of its own (sl_env's): the project's .env is not touched
    assert "/elsewhere" in (project / ".env").read_text()

    home = project / ".stormlake"  # the project's own home, as `stormlake ...` run in the project folder has it
    monkeypatch.setenv("STORMLAKE_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    instance.prepare_dagster_home(load_settings())
    for key in SETTINGS:
        monkeypatch.delenv(key, raising=False)
    values = dotenv_values(project / ".env")
    assert values == {"STORMLAKE_WEBHOOK_URL": "http://127.0.0.1:9/hook", "STORMLAKE_HOME": str(home),
                      "DAGSTER_HOME": str(home / "dagster"), "STORMLAKE_PG_DSN": sl_env["STORMLAKE_PG_DSN"],
                      "DAGSTER_EVENT_BATCH_SIZE": "100"}
    monkeypatch.setenv("DAGSTER_HOME", "/from/the/shell")
    assert dotenv_values(project / ".env")["DAGSTER_HOME"] == "/from/the/shell"


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A STORMLAKE_HOME for the embedded server, outside pytest's basetemp (see tests/e2e/test_cli.py)."""
    base = Path(tempfile.mkdtemp(prefix="stormlake-e2e-ui-"))
    yield base / "home"
    shutil.rmtree(base, ignore_errors=True)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell does to a background job


def test_stormlake_ui_runs_dg_dev_and_sigterm_stops_everything(embedded_home: Path, tmp_path: Path) -> None:
    from resources.pgserver import is_running

    env = {k: v for k, v in os.environ.items() if k not in SETTINGS and k != "PYTEST_CURRENT_TEST"}
    env["STORMLAKE_HOME"] = str(embedded_home)
    port = _free_port()
    log = tmp_path / "ui.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(BIN / "stormlake"), "ui", "--port", str(port)], cwd=tmp_path, env=env,
                                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_ignore_sigint)
    started: set[int] = set()
    try:
        _check_instance(_graphql(port, proc, log), embedded_home / "dagster")
        assert is_running(embedded_home / "pg")
        started = _descendants(proc.pid)
        servers = [p for p in started if b"api\0grpc" in _cmdline(p)]
        assert len(servers) == 1, f"{len(servers)} code servers: the webserver and the daemon should share dg dev's"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_GUARD_S) == 0, log.read_text(errors="replace")[-4000:]
        # dg dev stopped its services itself (it was not killed: the SIGINT it inherited is not ignored).
        assert "Dagster services shut down." in log.read_text(errors="replace"), log.read_text(errors="replace")[-4000:]
        # Everything it started was stopped before it exited (what was killed is at most being reaped).
        deadline = time.monotonic() + 10
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _alive(started)
        assert not left, {p: _cmdline(p)[:200] for p in left}
        assert not is_running(embedded_home / "pg"), "the embedded PostgreSQL is still running"
    finally:
        _stop_group(proc)
        for pid in _alive(started):
            os.kill(pid, signal.SIGKILL)
        subprocess.run([str(BIN / "stormlake"), "db", "stop"], cwd=tmp_path, env=env, capture_output=True,
                       timeout=HANG_GUARD_S)
