"""The Dagster way, end to end: a real ``dagster dev`` (webserver + daemon + code server) on the
project's PostgreSQL instance.

- A partition backfill launched through GraphQL ``launchPartitionBackfill`` (the mutation the
  UI's "Materialize" dialog sends) over 2 days x 2 regions completes in key range runs (the
  assets' backfill policy: one run for each day's two regions), and ``stormlake status --json``
  shows every partition published.
- "Materialize all" over every partition: the ones that landed are published, the ranges that
  mix them with partitions without files are cut before they run, and no run fails.
- A range with a partition whose file is unreadable: that partition fails alone. The range's
  run fails; the other partitions' ingest is materialized in it, and the outbox sensor (running
  by default) continues them, so they are published without anyone.
- The same backfill again computes nothing and delivers nothing.
- Both sensors, turned on through GraphQL ``startSensor``, get a real daemon tick each.
- The catalog holds one asset per Delta table (ten, grouped by phase, each with its column
  schema before any run), and after the backfill each table's latest materialization carries
  its row counts and column schema (GraphQL ``assetNodes``, what the UI's asset pages read).
- Headless Chromium renders the global asset graph (``/asset-groups``) with the ten tables and
  the landing files (screenshot kept under ``test-artifacts/``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from assets.phases import PHASES, TABLE_PHASE
from assets.schemas import SCHEMAS
from tests.ledger_sql import attempt_counts, query

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ARTIFACTS = REPO / "test-artifacts"
ASSETS = list(SCHEMAS)  # one asset per Delta table of the four phases
KEYS = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]
DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
HANG_GUARD_S = 900  # a deadline against hanging forever, not a performance assertion


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Dagster:
    url: str
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            payload = json.loads(resp.read())
        assert not payload.get("errors"), payload["errors"]
        return payload["data"]

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""


def _wait_up(d: Dagster) -> None:
    from pipeline.tools.bench_ui import wait_for_webserver

    try:
        wait_for_webserver(d.url, d.proc)
    except RuntimeError as exc:
        raise AssertionError(f"{exc}:\n{d.tail()}") from None


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL to dagster dev and everything of its group (webserver, daemon, code server, run workers).

    The test needs it gone, not a graceful stop: dagster dev interrupted (SIGINT or SIGTERM) soon
    after its services came up can wait forever on a child that took the interrupt too early.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


@pytest.fixture
def dagster_dev(sl_env: dict[str, str], tmp_path: Path) -> Iterator[Dagster]:
    from pipeline.instance import prepare_dagster_home
    from resources.settings import load_settings

    prepare_dagster_home(load_settings())
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # These tests launch runs themselves and turn the sensors on when they mean to.
    env["STORMLAKE_LANDING_SENSOR"] = "stopped"
    port = free_port()
    log = tmp_path / "dagster-dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "dagster"), "dev", "-m", "pipeline.definitions", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    d = Dagster(url=f"http://127.0.0.1:{port}", env=env, proc=proc, log=log)
    try:
        _wait_up(d)
        yield d
    finally:
        _stop(proc)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copyfile(log, ARTIFACTS / "dagster-dev.log")


# ---- GraphQL ----------------------------------------------------------------------------------
REPOS = """
query { repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } }
  ... on PythonError { message } } }
"""

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

BACKFILL = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { id status numPartitions partitionNames
      runs(limit: 100) { id status tags { key value } } error { message } }
    ... on PythonError { message }
  }
}
"""

SENSOR_FIELDS = """
  __typename
  ... on Sensor { name jobOriginId sensorState { id selectorId status
      typeSpecificData { ... on SensorData { lastCursor } }
      ticks(limit: 10) { id status timestamp skipReason runIds cursor error { message } } } }
  ... on PythonError { message }
"""

START_SENSOR = "mutation Start($s: SensorSelector!) { startSensor(sensorSelector: $s) {" + SENSOR_FIELDS + "} }"
SENSOR = "query Sensor($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {" + SENSOR_FIELDS + "} }"
STOP_SENSOR = """
mutation Stop($origin: String!, $selector: String!) {
  stopSensor(jobOriginId: $origin, jobSelectorId: $selector) {
    __typename ... on StopSensorMutationResult { instigationState { status } } ... on PythonError { message } }
}
"""


TABLE_NODES = """
query Tables {
  assetNodes {
    assetKey { path } groupName opNames isMaterializable
    metadataEntries { label ... on TableSchemaMetadataEntry { schema { columns { name type } } } }
    assetMaterializations(limit: 1) {
      partition
      metadataEntries { label
        ... on IntMetadataEntry { intValue }
        ... on TextMetadataEntry { text }
        ... on TableSchemaMetadataEntry { schema { columns { name type } } } }
    }
  }
}
"""


def _location(d: Dagster) -> tuple[str, str]:
    nodes = d.gql(REPOS)["repositoriesOrError"]["nodes"]
    assert len(nodes) == 1, nodes
    return nodes[0]["location"]["name"], nodes[0]["name"]


def _launch_backfill(d: Dagster, keys: list[str], title: str) -> str:
    params = {
        "assetSelection": [{"path": [a]} for a in ASSETS],
        "partitionNames": keys,
        "title": title,
    }
    res = d.gql(LAUNCH, {"params": params})["launchPartitionBackfill"]
    assert res["__typename"] == "LaunchBackfillSuccess", res
    return res["backfillId"]


def _tag(run: dict[str, Any], key: str) -> str | None:
    return next((t["value"] for t in run["tags"] if t["key"] == key), None)


def _run_keys(run: dict[str, Any]) -> list[str]:
    """The partitions of a backfill run: its key range (one day's regions or one region's days)."""
    from assets.partitions import storm_partitions

    start = _tag(run, "dagster/asset_partition_range_start") or _tag(run, "dagster/partition")
    end = _tag(run, "dagster/asset_partition_range_end") or start
    assert start is not None and end is not None, run["tags"]
    return [str(k) for k in storm_partitions().get_partition_keys_in_range(dg.PartitionKeyRange(start, end))]


def _covered(runs: list[dict[str, Any]]) -> list[str]:
    """Every partition the runs cover, once for each run that covers it, sorted."""
    return sorted(k for r in runs for k in _run_keys(r))


def _wait_backfill(d: Dagster, backfill_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        bf = d.gql(BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]
        assert bf["__typename"] == "PartitionBackfill", bf
        runs = bf["runs"]
        if bf["status"] in DONE and all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs):
            return bf
        assert d.proc.poll() is None, f"dagster dev died:\n{d.tail()}"
        time.sleep(2)
    raise AssertionError(f"backfill {backfill_id} did not finish:\n{d.tail()}")


# ---- helpers on the stormlake side -------------------------------------------------------------
def _status(env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([str(BIN / "stormlake"), "status", "--json", "--role", "admin"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _ledger_counts() -> dict[str, Any]:
    from resources.ledger import get_ledger

    led = get_ledger(os.environ["STORMLAKE_PG_DSN"], owner_dsn=os.environ["STORMLAKE_PG_DSN"])
    receipts = query(led, "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'DELIVERED') AS d FROM receipts")[0]
    attempts = {f"{k[0]}/{k[1]}": v for k, v in sorted(attempt_counts(led).items())}
    seqs = {f"{r['partition_key']}/{r['phase']}": r["seq"] for r in query(led,
        "SELECT partition_key, phase, seq FROM checkpoints WHERE superseded_at IS NULL")}
    return {"receipts": receipts["n"], "delivered": receipts["d"], "attempts": attempts, "seqs": seqs}


def _events_of(keys: list[str]) -> list[dict[str, Any]]:
    """The ledger's events of these partitions (for failure messages)."""
    from resources.ledger import get_ledger

    return query(get_ledger(os.environ["STORMLAKE_PG_DSN"]),
        "SELECT event_id, partition_key, phase, status, input_hash, seq, attempt, run_id, detail, at"
        " FROM checkpoint_events WHERE partition_key = ANY(%s) ORDER BY event_id", (keys,))


def _delta_versions() -> dict[str, int | None]:
    from resources.settings import load_settings
    from tests.helpers import table_versions

    return table_versions(load_settings().lake)


def _materialization_statuses(run_ids: list[str]) -> dict[tuple[str, str], str]:
    """(partition, asset) -> the ``status`` metadata of its materialization in these runs."""
    out: dict[tuple[str, str], str] = {}
    with dg.DagsterInstance.get() as instance:
        for run_id in run_ids:
            for rec in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
                mat = rec.asset_materialization
                assert mat is not None
                out[(str(mat.partition), mat.asset_key.to_user_string())] = str(mat.metadata["status"].value)
    return out


# ---- the test ---------------------------------------------------------------------------------
def test_backfill_rerun_sensor_tick_and_asset_graph(dagster_dev: Dagster) -> None:
    d = dagster_dev
    location, repo = _location(d)

    # 1. A backfill over 2 days x 2 regions, as the UI launches it.
    first_id = _launch_backfill(d, KEYS, "e2e: sample partitions")
    first = _wait_backfill(d, first_id)
    assert first["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), (first, d.tail())
    runs = first["runs"]
    # Backfill policy multi_run(max_partitions_per_run=8): Dagster cuts the selection by day, so
    # one run for each day's two regions, all four phases each; no run failed and was retried
    # (the phases have no concurrency pools, whose rows the first runs of a fresh instance raced
    # to create).
    assert [_tag(r, "dagster/retry_number") for r in runs] == [None] * len(runs), runs
    assert len(runs) == 2, runs
    assert all(r["status"] == "SUCCESS" for r in runs), runs
    assert _covered(runs) == sorted(KEYS)

    status = _status(d.env)
    by_key = {f"{p['day']}|{p['region']}": p for p in status["partitions"]}
    assert sorted(by_key) == sorted(KEYS)
    for key, p in by_key.items():
        assert p["tier"] == 4 and p["tier_label"] == "published", (key, p)
        assert all(p["phases"][ph.name]["status"] == "COMPLETED" for ph in PHASES), p
        assert p["deliveries"] and all(r["status"] == "DELIVERED" for r in p["deliveries"])
    firsts = _materialization_statuses([r["id"] for r in runs])
    assert set(firsts.values()) == {"COMPLETED"} and len(firsts) == len(KEYS) * len(ASSETS)
    _check_table_catalog(d)

    before = _ledger_counts()
    versions_before = _delta_versions()
    assert before["receipts"] == before["delivered"] > 0

    # 2. The same backfill again: every run only skips; nothing computed, nothing delivered.
    second_id = _launch_backfill(d, KEYS, "e2e: again")
    second = _wait_backfill(d, second_id)
    assert second["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), second
    assert _covered(second["runs"]) == sorted(KEYS) and all(r["status"] == "SUCCESS" for r in second["runs"])
    seconds = _materialization_statuses([r["id"] for r in second["runs"]])
    assert len(seconds) == len(KEYS) * len(ASSETS)
    assert set(seconds.values()) == {"SKIPPED"}, (seconds, _events_of([k for (k, _), v in seconds.items() if v != "SKIPPED"]))
    assert _ledger_counts() == before
    assert _delta_versions() == versions_before
    assert all(p["tier"] == 4 for p in _status(d.env)["partitions"])

    # 3. Real daemon ticks of both sensors.
    #    landing_sensor, turned on as the UI's toggle does: its cursor is empty, so all four
    #    folders are new to it; the ledger's preflight says every phase of them is done for these
    #    files, so the tick records their fingerprints in its cursor and launches nothing.
    #    outbox_sensor, running by default since the daemon started: a tick after the backfills
    #    reads every checkpoint event; each partition's latest event is a skip or the present
    #    phase's completion, so nothing is continued, and its cursor is the last event.
    selectors = {name: {"repositoryName": repo, "repositoryLocationName": location, "sensorName": name}
                 for name in ("landing_sensor", "outbox_sensor")}
    from resources.ledger import get_ledger

    last_event = query(get_ledger(os.environ["STORMLAKE_PG_DSN"]),
                       "SELECT max(event_id) AS m FROM checkpoint_events")[0]["m"]
    started = d.gql(START_SENSOR, {"s": selectors["landing_sensor"]})["startSensor"]
    assert started["__typename"] == "Sensor", started
    try:
        ticks = {"landing_sensor": _first_tick(d, selectors["landing_sensor"]),
                 "outbox_sensor": _outbox_tick_after(d, selectors["outbox_sensor"], last_event)}
    finally:
        stopped = d.gql(STOP_SENSOR, {"origin": started["jobOriginId"], "selector": started["sensorState"]["selectorId"]})
        assert stopped["stopSensor"]["__typename"] == "StopSensorMutationResult", stopped

    tick, state = ticks["landing_sensor"]
    assert tick["status"] == "SKIPPED" and tick["runIds"] == [], tick
    assert "4 new or changed partition(s) already done" in (tick["skipReason"] or ""), tick
    assert sorted(json.loads(state["typeSpecificData"]["lastCursor"])) == sorted(KEYS)

    tick, state = ticks["outbox_sensor"]
    assert tick["status"] == "SKIPPED" and tick["runIds"] == [], tick
    assert "nothing to continue" in (tick["skipReason"] or ""), tick
    from pipeline.sensors import OutboxCursor

    cursor = OutboxCursor.parse(state["typeSpecificData"]["lastCursor"])
    assert cursor.pending == {}
    assert 0 < cursor.after <= query(get_ledger(os.environ["STORMLAKE_PG_DSN"]),
        "SELECT max(event_id) AS m FROM checkpoint_events")[0]["m"]
    # The ledger saw the sensor's look (a preflight skip per phase) but no work.
    after = _ledger_counts()
    assert after["receipts"] == before["receipts"] and after["attempts"] == before["attempts"]

    # 4. The asset graph of this code location in a real browser.
    _check_asset_graph(d, location)


@pytest.fixture
def recent_landing(sl_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """A partition space of the last 3 days (``STORMLAKE_FIRST_DAY``) x every region, with files
    landed for 2 regions on its first day only: (landed keys, every key)."""
    import datetime as dt

    from assets.partitions import storm_partitions
    from pipeline.tools.generate import generate_scenario
    from resources.settings import load_regions, load_settings

    first = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=3)).isoformat()
    monkeypatch.setenv("STORMLAKE_FIRST_DAY", first)
    settings = load_settings()
    regions = load_regions(settings.regions_file)
    generate_scenario(settings.landing, regions[:2], days=1, start=first, rows_per_partition=300, seed=11)
    landed = [f"{first}|{r.region_id}" for r in regions[:2]]
    return landed, storm_partitions(regions, first).get_partition_keys()


def test_ui_backfill_over_all_partitions_runs_what_landed_and_passes_over_the_rest(
        recent_landing: tuple[list[str], list[str]], dagster_dev: Dagster) -> None:
    """"Materialize all" in the UI, over every partition: the two that landed are published, the
    others are never read, written or recorded. A run over partitions none of which landed ends
    successfully; the run whose range mixes the two that landed with some that did not fails
    naming those (each fails alone), and the outbox sensor continues the two that landed."""
    d = dagster_dev
    landed, every = recent_landing
    assert len(every) > len(landed) and set(landed) <= set(every)
    params = {"assetSelection": [{"path": [a]} for a in ASSETS], "allPartitions": True, "title": "e2e: all"}
    res = d.gql(LAUNCH, {"params": params})["launchPartitionBackfill"]
    assert res["__typename"] == "LaunchBackfillSuccess", res
    bf = _wait_backfill(d, res["backfillId"])
    assert bf["status"] in ("COMPLETED_SUCCESS", "COMPLETED_FAILED"), (bf, d.tail())
    assert bf["numPartitions"] == len(every), bf
    runs = bf["runs"]
    assert _covered(runs) == sorted(every)
    assert len(runs) < len(every), len(runs)
    for r in runs:  # a run fails only where landed and not-landed partitions share its range
        keys = set(_run_keys(r))
        mixed = bool(keys & set(landed)) and bool(keys - set(landed))
        assert r["status"] == ("FAILURE" if mixed else "SUCCESS"), (r["status"], sorted(keys))
    # The ledger knows the landed partitions only, both published (continued by the outbox sensor
    # where their run failed for the others).
    deadline = time.monotonic() + 300  # an outbox tick (30 s) and a run's start, with a wide margin
    while True:
        by_key = {f"{p['day']}|{p['region']}": p for p in _status(d.env)["partitions"]}
        if sorted(by_key) == sorted(landed) and all(p["tier"] == 4 for p in by_key.values()):
            break
        assert time.monotonic() < deadline, (by_key, d.tail())
        time.sleep(1)
    assert not _events_of(sorted(set(every) - set(landed)))
    with dg.DagsterInstance.get() as instance:
        done = instance.get_materialized_partitions(dg.AssetKey("region_day_summary"))
    assert sorted(done) == sorted(landed), sorted(done)


def _check_table_catalog(d: Dagster) -> None:
    """Ten table assets grouped by phase, each with its column schema and, materialized, its row counts."""
    from assets.schemas import table_schema

    nodes = {"/".join(n["assetKey"]["path"]): n for n in d.gql(TABLE_NODES)["assetNodes"]}
    assert set(nodes) == {*ASSETS, "landing_files"}, sorted(nodes)
    ops = {p.name: p.asset for p in PHASES}
    for table in ASSETS:
        node = nodes[table]
        phase = TABLE_PHASE[table]
        assert (node["groupName"], node["opNames"], node["isMaterializable"]) == (phase, [ops[phase]], True), node
        columns = [(c.name, c.type) for c in table_schema(table).columns]
        # The Columns tab before any run: the schema is definition metadata.
        (schema,) = [e for e in node["metadataEntries"] if e["label"] == "dagster/column_schema"]
        assert [(c["name"], c["type"]) for c in schema["schema"]["columns"]] == columns, table
        # The latest materialization: row counts, name and URI of the Delta table (the column
        # schema is the definition's, above, not repeated on each materialization).
        (mat,) = node["assetMaterializations"]
        assert mat["partition"] in KEYS, mat
        entries = {e["label"]: e for e in mat["metadataEntries"]}
        rows, total = entries["dagster/partition_row_count"]["intValue"], entries["dagster/row_count"]["intValue"]
        assert 0 <= rows <= total, (table, rows, total)
        assert "dagster/column_schema" not in entries, table
        assert entries["dagster/table_name"]["text"] == table
        assert entries["dagster/uri"]["text"].startswith("file://") and entries["dagster/uri"]["text"].endswith(
            f"/lake/{table}"), entries["dagster/uri"]
    # One summary row per batch: the table held between one and all the backfill's partitions when written.
    summary = {e["label"]: e for e in nodes["region_day_summary"]["assetMaterializations"][0]["metadataEntries"]}
    assert summary["dagster/partition_row_count"]["intValue"] == 1
    assert 1 <= summary["dagster/row_count"]["intValue"] <= len(KEYS)


def _first_tick(d: Dagster, selector: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sensor's first finished tick (as the daemon recorded it) and its state once the
    cursor of that tick is stored: the daemon records the tick's status and the sensor's cursor
    in two writes, so a look between them sees the finished tick with the cursor before it."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        sensor = d.gql(SENSOR, {"s": selector})["sensorOrError"]
        assert sensor["__typename"] == "Sensor", sensor
        state = sensor["sensorState"]
        done = [t for t in state["ticks"] if t["status"] in ("SUCCESS", "SKIPPED", "FAILURE")]
        if done and (done[-1]["cursor"] is None or state["typeSpecificData"]["lastCursor"] == done[-1]["cursor"]):
            return done[-1], state  # ticks are newest first
        assert d.proc.poll() is None, f"dagster dev died:\n{d.tail()}"
        time.sleep(2)
    raise AssertionError(f"no tick of {selector['sensorName']} recorded:\n{d.tail()}")


def _outbox_tick_after(d: Dagster, selector: dict[str, str], event_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The outbox sensor's newest finished tick once its cursor has read past ``event_id``, and
    its state once that tick's cursor is stored (as in :func:`_first_tick`)."""
    from pipeline.sensors import OutboxCursor

    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        sensor = d.gql(SENSOR, {"s": selector})["sensorOrError"]
        assert sensor["__typename"] == "Sensor", sensor
        state = sensor["sensorState"]
        done = [t for t in state["ticks"] if t["status"] in ("SUCCESS", "SKIPPED", "FAILURE")]
        if (done and done[0]["cursor"] and OutboxCursor.parse(done[0]["cursor"]).after >= event_id
                and state["typeSpecificData"]["lastCursor"] == done[0]["cursor"]):
            return done[0], state  # ticks are newest first
        assert d.proc.poll() is None, f"dagster dev died:\n{d.tail()}"
        time.sleep(2)
    raise AssertionError(f"no tick of {selector['sensorName']} read past event {event_id}:\n{d.tail()}")


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium is not installed (Debian: apt-get install -y chromium)"
    return path


def _browser(args: list[str], url: str, profile: Path) -> subprocess.CompletedProcess:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
           "--window-size=1600,1000", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _check_asset_graph(d: Dagster, location: str) -> None:
    """The global asset graph (one location: the landing files and the ten tables in their phase groups).

    The UI draws a graph of several groups with the groups collapsed; ``expanded`` (what its
    "Expand all groups" puts in the URL) opens the five.
    """
    groups = ",".join(f"global@global:{g}" for g in ["landing", *(p.name for p in PHASES)])
    url = f"{d.url}/asset-groups?{urllib.parse.urlencode({'expanded': groups})}"
    ARTIFACTS.mkdir(exist_ok=True)
    profile = ARTIFACTS / "chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    try:
        dom = _browser(["--dump-dom"], url, profile)
        assert dom.returncode == 0, dom.stderr[-3000:]
        (ARTIFACTS / "asset-graph.html").write_text(dom.stdout)
        missing = [a for a in [*ASSETS, "landing_files"] if a not in dom.stdout]
        assert not missing, f"asset(s) {missing} not in the rendered asset graph (see test-artifacts/asset-graph.html)"
        shot = ARTIFACTS / "asset-graph.png"
        shot.unlink(missing_ok=True)
        res = _browser([f"--screenshot={shot}"], url, profile)
        assert res.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, res.stderr[-3000:]
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def one_bad_partition(sl_env: dict[str, str]) -> tuple[list[str], str]:
    """Three regions on one day, the middle one with an unreadable weather file: (keys, bad key)."""
    from tests.consumer import generated_landing

    landing = Path(sl_env["STORMLAKE_HOME"]) / "landing"
    shutil.rmtree(landing)
    generated_landing(landing, regions=3, rows_per_partition=200, seed=5, days=1)
    keys = sorted(f"2026-09-01|{p.parent.name}" for p in landing.glob("*/2026-09-01"))
    bad = landing / "pine_belt" / "2026-09-01" / "weather.csv"
    data = bad.read_bytes()
    cut = data.index(b"\n") + 1
    bad.write_bytes(data[:cut] + b"\xff\xfe\xfd,broken\n" + data[cut:])
    return keys, "2026-09-01|pine_belt"


def test_a_bad_partition_of_a_ui_range_fails_alone(one_bad_partition: tuple[list[str], str],
                                                    dagster_dev: Dagster) -> None:
    """One range run of three partitions; the middle one's ingest fails. The step logs the other
    two's materializations and fails naming the bad one, so the run fails and its later steps
    are not run. Nobody touches anything: the outbox sensor, running by default, continues the
    two good partitions from enrich once the run is over (one run each: they are not
    neighbours), and they are published. The backfill ends failed; the ledger has the bad
    partition's ingest FAILED; the catalog shows the good ones materialized and the bad one
    failed, for the phase that failed and for the last one."""
    d = dagster_dev
    keys, bad = one_bad_partition
    assert len(keys) == 3 and bad in keys
    good = [k for k in keys if k != bad]
    bf = _wait_backfill(d, _launch_backfill(d, keys, "e2e: one bad partition"))
    assert bf["status"] in ("COMPLETED_FAILED", "FAILED"), (bf, d.tail())
    (run,) = bf["runs"]  # no retry, no cut: the range's one run
    assert run["status"] == "FAILURE" and _run_keys(run) == keys, (run["status"], _run_keys(run))
    assert _tag(run, "stormlake/failed_partitions") is None and _tag(run, "dagster/retry_on_asset_or_op_failure") is None
    failures = _step_failures(run["id"])
    assert [(step, meta["failed_partitions"]) for step, _, meta in failures] == [("ingested_batch", [bad])], failures
    assert failures[0][1].startswith(f"ingest of {bad} failed: "), failures

    # The outbox sensor's continuations: one run for each good partition, from enrich.
    continued = _wait_runs_tagged(d, "stormlake/launched_by", "outbox_sensor", len(good))
    assert sorted(_run_keys(r) for r in continued) == [[k] for k in good], [_run_keys(r) for r in continued]
    assert all(r["status"] == "SUCCESS" and _tag(r, "stormlake/resume_after") == "ingest" for r in continued), continued

    status = {f"{p['day']}|{p['region']}": p for p in _status(d.env)["partitions"]}
    assert {k: p["tier"] for k, p in status.items()} == {**dict.fromkeys(good, 4), bad: 0}, status
    assert all(status[k]["phases"]["ingest"]["attempts"] == 1 for k in good), status  # not run again
    from resources.ledger import get_ledger

    (ingest,) = query(get_ledger(os.environ["STORMLAKE_PG_DSN"]),
        "SELECT status, error_message FROM checkpoints WHERE partition_key = %s AND phase = 'ingest'"
        " AND superseded_at IS NULL", (bad,))
    assert ingest["status"] == "FAILED" and "pine_belt/2026-09-01/weather.csv" in ingest["error_message"], ingest
    # What the UI colours each partition by (GraphQL, as the asset's partitions page reads it).
    want = {**dict.fromkeys(good, "MATERIALIZED"), bad: "FAILED"}
    assert {asset: _partition_statuses(d, asset, keys) for asset in ("outages_raw", "region_day_summary")} == {
        "outages_raw": want, "region_day_summary": want}


PARTITION_STATS = """
query Partitions($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      assetPartitionStatuses {
        __typename
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges { primaryDimStartKey primaryDimEndKey
            secondaryDim { __typename
              ... on DefaultPartitionStatuses { materializedPartitions failedPartitions materializingPartitions } } }
        }
      }
    }
  }
}
"""

def _partition_statuses(d: Dagster, asset: str, keys: list[str]) -> dict[str, str]:
    """Each key's status in the asset's partition statuses (GraphQL ``assetPartitionStatuses``):
    MATERIALIZED, FAILED, MATERIALIZING or MISSING."""
    node = d.gql(PARTITION_STATS, {"key": {"path": [asset]}})["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    statuses = node["assetPartitionStatuses"]
    assert statuses["__typename"] == "MultiPartitionStatuses", statuses
    assert statuses["primaryDimensionName"] == "day", statuses
    by_key: dict[str, str] = {}
    for rng in statuses["ranges"]:  # days start..end, each with its regions' statuses
        for key in keys:
            day, _, region = key.partition("|")
            if rng["primaryDimStartKey"] <= day <= rng["primaryDimEndKey"]:
                for name, label in (("materializedPartitions", "MATERIALIZED"), ("failedPartitions", "FAILED"),
                                    ("materializingPartitions", "MATERIALIZING")):
                    if region in rng["secondaryDim"][name]:
                        by_key[key] = label
    return {k: by_key.get(k, "MISSING") for k in keys}


def _step_failures(run_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(step, description, JSON metadata) of each step failure of the run, from Dagster's event log."""
    out = []
    with dg.DagsterInstance.get() as instance:
        for rec in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
            data = rec.dagster_event.step_failure_data.user_failure_data
            assert data is not None, rec
            out.append((rec.step_key, data.description,
                        {k: v.value for k, v in data.metadata.items() if isinstance(v, dg.JsonMetadataValue)}))
    return out


LAUNCH_RUN = """
mutation LaunchRun($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message stack } ... on Error { message }
  }
}
"""

RUNS_TAGGED = """
query Runs($key: String!, $value: String!) {
  runsOrError(filter: {tags: [{key: $key, value: $value}]}) {
    ... on Runs { results { id status tags { key value } } }
  }
}
"""


def test_the_daily_schedule_s_range_runs_through_the_run_queue_as_a_backfill_s(dagster_dev: Dagster) -> None:
    """The schedule's tick for 2026-09-01 is one key range over the day's regions whose files
    landed (two of six), launched as the UI's "test tick" launches it (its tags, through the run
    queue): one run, which publishes them."""
    from pipeline.definitions import defs
    from tests.helpers import requested_keys

    d = dagster_dev
    location, repo = _location(d)
    tick = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 9, 2, 3, 0, tzinfo=dt.UTC))
    (request,) = defs.resolve_schedule_def("daily_storm_schedule")(tick)
    day = requested_keys(request)
    landed = [k for k in KEYS if k.startswith("2026-09-01|")]
    assert sorted(day) == sorted(landed)
    params = {"selector": {"repositoryLocationName": location, "repositoryName": repo, "jobName": "storm_job"},
              "runConfigData": {}, "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in request.tags.items()]}}
    res = d.gql(LAUNCH_RUN, {"params": params})["launchRun"]
    assert res["__typename"] == "LaunchRunSuccess", res
    runs = _wait_runs_tagged(d, "stormlake/launched_by", "daily_schedule", 1)
    assert [sorted(_run_keys(r)) for r in runs] == [sorted(landed)], runs
    assert all(r["status"] == "SUCCESS" for r in runs), [(r["status"], _run_keys(r)) for r in runs]
    tiers = {f"{p['day']}|{p['region']}": p["tier"] for p in _status(d.env)["partitions"]}
    assert tiers == dict.fromkeys(landed, 4), tiers


def _wait_runs_tagged(d: Dagster, key: str, value: str, count: int) -> list[dict[str, Any]]:
    """The runs with the tag once at least ``count`` of them are, and all of them are, finished."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        runs = d.gql(RUNS_TAGGED, {"key": key, "value": value})["runsOrError"]["results"]
        if len(runs) >= count and all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs):
            return runs
        assert time.monotonic() < deadline and d.proc.poll() is None, (runs, d.tail())
        time.sleep(1)


def test_the_outbox_sensor_continues_neighbours_stopped_after_ingest_in_one_range_run(dagster_dev: Dagster) -> None:
    """Two neighbouring regions of a day are ingested by a range run that selects ingest's tables
    only, and stop there. The outbox sensor, running by default (nobody turns it on), continues
    them as one key range run (the tables and graders of enrich, correlate and present) through
    the run queue; both are published and ingest is not run again."""
    from assets.phases import INGEST

    d = dagster_dev
    location, repo = _location(d)
    pair = [k for k in KEYS if k.startswith("2026-09-01|")]
    tags = {"dagster/asset_partition_range_start": pair[0], "dagster/asset_partition_range_end": pair[-1],
            "stormlake/launched_by": "e2e_ingest_only"}
    params = {"selector": {"repositoryLocationName": location, "repositoryName": repo, "jobName": "storm_job",
                           "assetSelection": [{"path": [t]} for t in INGEST.tables]},
              "runConfigData": {}, "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}
    res = d.gql(LAUNCH_RUN, {"params": params})["launchRun"]
    assert res["__typename"] == "LaunchRunSuccess", res
    (ingest_run,) = _wait_runs_tagged(d, "stormlake/launched_by", "e2e_ingest_only", 1)
    assert ingest_run["status"] == "SUCCESS", d.tail()

    (run,) = _wait_runs_tagged(d, "stormlake/launched_by", "outbox_sensor", 1)  # one run for the pair
    assert run["status"] == "SUCCESS", d.tail()
    assert _run_keys(run) == pair and _tag(run, "stormlake/resume_after") == "ingest", run["tags"]
    status = {f"{p['day']}|{p['region']}": p for p in _status(d.env)["partitions"]}
    assert {k: status[k]["tier"] for k in pair} == dict.fromkeys(pair, 4)
    assert all(status[k]["phases"]["ingest"]["attempts"] == 1 for k in pair), status  # not run again


@pytest.fixture
def worker_dies_after_ingest(sl_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The run workers of the Dagster started after this die, as a SIGKILL leaves them, right after
    ingest's checkpoint of one partition is committed."""
    monkeypatch.setenv("STORMLAKE_FAULTS", f"ingest.after_checkpoint@{KEYS[0]}=exit")
    return KEYS[0]


def test_a_partition_whose_run_died_between_phases_is_continued_without_anyone(
        worker_dies_after_ingest: str, dagster_dev: Dagster) -> None:
    """A run of one partition dies after ingest. Nobody touches anything: the code server that
    started it finds its process gone and fails the run, and the outbox sensor, running by
    default, continues the partition after ingest. Run retries are off for the run (its tag), so
    the continuation is the sensor's; ingest is not computed again."""
    d = dagster_dev
    key = worker_dies_after_ingest
    location, repo = _location(d)
    tags = {"dagster/partition": key, "dagster/max_retries": "0", "stormlake/launched_by": "e2e_dies_after_ingest"}
    params = {"selector": {"repositoryLocationName": location, "repositoryName": repo, "jobName": "storm_job"},
              "runConfigData": {}, "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}
    res = d.gql(LAUNCH_RUN, {"params": params})["launchRun"]
    assert res["__typename"] == "LaunchRunSuccess", res
    (dead,) = _wait_runs_tagged(d, "stormlake/launched_by", "e2e_dies_after_ingest", 1)
    assert dead["status"] == "FAILURE", (dead, d.tail())
    with dg.DagsterInstance.from_config(d.env["DAGSTER_HOME"]) as instance:
        said = [e.dagster_event.message or "" for e in instance.all_logs(dead["id"], of_type=dg.DagsterEventType.ENGINE_EVENT)]
    # the code server's word (Dagster's default launcher), not run monitoring's
    assert f"[DagsterApiServer] Run execution process for {dead['id']} unexpectedly exited with code 137." in said, said
    (run,) = _wait_runs_tagged(d, "stormlake/launched_by", "outbox_sensor", 1)
    assert run["status"] == "SUCCESS", d.tail()
    assert _run_keys(run) == [key] and _tag(run, "stormlake/resume_after") == "ingest", run["tags"]
    status = {f"{p['day']}|{p['region']}": p for p in _status(d.env)["partitions"]}
    assert status[key]["tier"] == 4, status[key]
    assert status[key]["phases"]["ingest"]["attempts"] == 1, status[key]
