"""The day in progress, as an operator serves it: today's partition runs from the command line, a
landing folder for tomorrow fails alone with one line, and a later version of today's files,
noticed by the landing sensor of a real Dagster daemon, is delivered once as a superseding
revision."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.consumer import REPO, Consumer, make_home, run, sql_rows, status

pytestmark = pytest.mark.e2e

REGIONS = ("gulf_coast", "pine_belt")


def _day(offset: int) -> str:
    return (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=offset)).isoformat()


def test_todays_partition_runs_and_a_folder_for_tomorrow_fails_alone(tmp_path: Path, pg_dsn: str) -> None:
    (tmp_path / "empty").mkdir()
    env = make_home(tmp_path, tmp_path / "empty", pg_dsn)
    yesterday, today, tomorrow = _day(-1), _day(0), _day(1)
    gen = run(env, "generate", "--regions", "2", "--days", "2", "--start", yesterday, "--rows-per-partition", "300")
    assert gen.returncode == 0, str(gen)
    landing = Path(env["STORMLAKE_HOME"]) / "landing"
    shutil.copytree(landing / "gulf_coast" / today, landing / "gulf_coast" / tomorrow)

    result = run(env, "backfill")
    assert result.returncode == 1, str(result)
    # One line, naming the folder and why; no traceback.
    lines = [line for line in result.stderr.splitlines() if line.startswith("stormlake:")]
    assert lines == [f"stormlake: landing folder gulf_coast/{tomorrow}: a day after today ({today} UTC): "
                     "it becomes a partition when its UTC day begins; not run"], result.stderr
    assert "Traceback" not in result.stderr
    # Every partition that is one ran, today's included.
    assert "4/4 partitions succeeded" in result.stdout, str(result)
    rows = status(env)
    assert sorted(rows) == sorted(f"{day}|{region}" for day in (yesterday, today) for region in REGIONS)
    for key, row in rows.items():
        assert row["tier"] == 4, (key, row)
        assert {d["artifact_id"].split("@")[0] for d in row["deliveries"]} == {
            f"{row['region']}/{row['day']}/{kind}" for kind in ("summary.json", "clusters.geojson", "report.html")}
    # The table says which day is open and how many revisions each partition has had.
    table = run(env, "status", "--role", "admin")
    assert table.returncode == 0, str(table)
    lines = table.stdout.splitlines()
    assert lines[0].split()[-2:] == ["revisions", "delivered"], lines[0]
    rows = [line.split() for line in lines if line[:4].isdigit()]
    assert sorted((r[0], r[1], r[-2]) for r in rows) == sorted(
        (day, region, "1") for day in (yesterday, today) for region in REGIONS), table.stdout
    assert f"open: {today} (the UTC day in progress" in table.stdout, table.stdout
    # status --json says the same: one revision each, and today's partitions open.
    doc = json.loads(run(env, "status", "--json", "--role", "admin").stdout)
    assert doc["open_days"] == [today]
    assert sorted((p["day"], p["region"], p["revisions"], p["open"]) for p in doc["partitions"]) == sorted(
        (day, region, 1, day == today) for day in (yesterday, today) for region in REGIONS), doc


# ---- the landing sensor of a real daemon ------------------------------------------------------
HANG_GUARD_S = 900  # a deadline against hanging forever, not a performance assertion
KINDS = ("summary.json", "clusters.geojson", "report.html")
SENSOR_TICKS = """
query Ticks($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { __typename
  ... on Sensor { sensorState { status ticks(limit: 20) { id status timestamp runIds skipReason } } } } }
"""


def _receipts(dsn: str) -> list[dict[str, Any]]:
    rows = sql_rows(dsn, "SELECT artifact_id, partition_key, kind, target, status, supersedes FROM receipts"
                         " ORDER BY receipt_id")
    return [dict(zip(("artifact_id", "partition_key", "kind", "target", "status", "supersedes"), r, strict=True))
            for r in rows]


def _wait(what: str, done, proc: subprocess.Popen, log: Path):  # noqa: ANN001, ANN202 - a predicate, its value
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        assert proc.poll() is None, f"dagster dev exited while waiting for {what}:\n{log.read_text()[-4000:]}"
        time.sleep(1.0)
    raise AssertionError(f"no {what} after {HANG_GUARD_S} s:\n{log.read_text(errors='replace')[-4000:]}")


def _gql(url: str, query: str, variables: dict[str, object]) -> dict[str, object]:
    body = json.dumps({"query": query, "variables": variables}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        payload = json.loads(resp.read())
    assert not payload.get("errors"), payload["errors"]
    return payload["data"]


def test_a_later_version_of_todays_files_is_delivered_once_as_a_superseding_revision(
        tmp_path: Path, pg_dsn: str) -> None:
    from pipeline.tools.bench_ui import wait_for_webserver
    from tests.e2e.test_dagster_ui import free_port

    today = _day(0)
    keys = [f"{today}|{region}" for region in REGIONS]
    (tmp_path / "empty").mkdir()
    with Consumer() as consumer:
        env = make_home(tmp_path, tmp_path / "empty", pg_dsn, webhook=consumer.url)
        landing = Path(env["STORMLAKE_HOME"]) / "landing"

        def land(hour: str) -> None:
            res = run(env, "generate", "--regions", "2", "--days", "1", "--start", today,
                      "--rows-per-partition", "400", "--as-of", f"{today}T{hour}")
            assert res.returncode == 0, str(res)

        land("10:00")
        prepared = run(env, "env")  # the Dagster instance of the home, as any stormlake command makes it
        assert prepared.returncode == 0, str(prepared)
        port = free_port()
        log = tmp_path / "dagster-dev.log"
        dev_env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
        with log.open("wb") as out:
            # The landing sensor is on by default: nothing is turned on here.
            proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "dev", "-m", "pipeline.definitions",
                                     "-h", "127.0.0.1", "-p", str(port)], cwd=REPO, env=dev_env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for_webserver(url, proc)

            def presented(times: int):  # noqa: ANN202
                """Every partition's present phase committed ``times`` times (only once all its
                artifacts are delivered); then the receipts."""
                def check():  # noqa: ANN202
                    rows = sql_rows(pg_dsn, "SELECT partition_key FROM checkpoint_events WHERE phase = 'present'"
                                            " AND status = 'COMPLETED' GROUP BY partition_key HAVING count(*) >= %s",
                                    (times,))
                    return _receipts(pg_dsn) if len(rows) == len(keys) else None
                return check

            first = [r for r in _wait("first delivery of today's partitions", presented(1), proc, log)
                     if r["target"] == "webhook"]
            assert sorted((r["partition_key"], r["kind"]) for r in first) == sorted(
                (k, kind) for k in keys for kind in KINDS)
            assert all(r["supersedes"] is None and r["status"] == "DELIVERED" for r in first)
            old = {(r["partition_key"], r["kind"]): r["artifact_id"] for r in first}

            # 12:00: longer files replace today's; the sensor notices and the day is recomputed.
            land("12:00")
            second = [r for r in _wait("superseding revisions", presented(2), proc, log) if r["target"] == "webhook"]
            new = second[len(first):]
            assert all(r["status"] == "DELIVERED" for r in second), second
            # A new revision of each artifact whose bytes changed (the summary and the page always
            # do with more rows), each naming the one it supersedes; none delivered again.
            assert {(r["partition_key"], r["kind"]) for r in new} >= {
                (k, kind) for k in keys for kind in ("summary.json", "report.html")}, new
            for r in new:
                assert r["artifact_id"] not in old.values(), r
                assert r["supersedes"] == old[(r["partition_key"], r["kind"])], r

            # Touched, not changed: the tick that first sees it launches nothing and says so. That
            # tick may have started just before the touch (the one in progress across it) or after;
            # no tick after the touch launches anything.
            outages = landing / REGIONS[0] / today / "outages.csv"
            st = outages.stat()
            touched = time.time()
            os.utime(outages, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
            selector = {"repositoryName": "__repository__", "repositoryLocationName": "pipeline.definitions",
                        "sensorName": "landing_sensor"}
            finished = ("SUCCESS", "SKIPPED", "FAILURE")

            def ticks_across_touch():  # noqa: ANN202
                sensor = _gql(url, SENSOR_TICKS, {"s": selector})["sensorOrError"]
                assert sensor["__typename"] == "Sensor", sensor
                ticks = sorted(sensor["sensorState"]["ticks"], key=lambda t: t["timestamp"])
                after = [t for t in ticks if t["timestamp"] > touched]
                if not any(t["status"] in finished for t in after):
                    return None
                return [t for t in ticks if t["timestamp"] <= touched][-1:], after

            across, after = _wait("a landing sensor tick after the touch", ticks_across_touch, proc, log)
            assert all(t["runIds"] == [] for t in after), after
            assert [t for t in across + after if t["status"] == "SKIPPED"
                    and "already done" in (t["skipReason"] or "")], (across, after)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)
        # status --json counts two revisions of each of today's partitions, still open.
        assert {k: (p["revisions"], p["open"]) for k, p in status(env).items()} == dict.fromkeys(keys, (2, True))
        # The consumer got each revision once: the first ones, then the superseding ones.
        posts = consumer.snapshot()
        assert [p.key for p in posts] == [r["artifact_id"] for r in second], [p.key for p in posts]
        assert [p.headers.get("x-stormlake-supersedes") for p in posts] == [r["supersedes"] for r in second]
        assert len(_receipts(pg_dsn)) == 2 * len(second)  # the file target's receipts, the same revisions
