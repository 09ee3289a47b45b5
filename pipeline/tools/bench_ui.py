"""``stormlake bench --ui``: a backfill from the Dagster UI against ``stormlake backfill``, side by side.

On ``--partitions`` partitions (default 20) of ``--rows-per-partition`` outage rows (default
500), generated once into ``$STORMLAKE_HOME/bench/ui/landing``, each turn times:

- **cli**: ``stormlake backfill`` of the partitions, a whole process on a new home and new
  databases, prepared before the clock starts as a deployment in use is
  (:func:`pipeline.tools.bench_workers.prepare_home`: Dagster's storage and the ledger's tables);
- **ui**: on another new home, ``stormlake ui`` (webserver and daemon) is started, which
  prepares the deployment alike, and once it answers, the backfill is launched through GraphQL
  ``launchPartitionBackfill`` (what the UI's "Materialize" of a partition range sends) for
  every table asset; the time runs from the launch until every partition is published in the
  ledger (tier 4). Starting the UI is not timed.

Neither side counts the deployment's one-time creation; the CLI's side counts its process's
start (imports, the code location), which a person running ``stormlake backfill`` waits for.

A turn's ratio is its ui over its cli; the median of the turns counts, against
:data:`TARGET_RATIO`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.tools.bench import Databases, _child_env, _say, plan_partitions
from pipeline.tools.bench_workers import take_turns, timed_backfill

TARGET_RATIO = 1.5
DEFAULTS = {"partitions": 20, "rows_per_partition": 500}
HANG_GUARD_S = 1800  # against a run that never ends, not a performance bound

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } ... on Error { message }
  }
}
"""


def _gql(url: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        payload = json.loads(resp.read())
    if payload.get("errors"):
        raise RuntimeError(f"GraphQL: {payload['errors']}")
    return payload["data"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _published(ledger) -> int:  # noqa: ANN001 - a resources.ledger.Ledger
    """Partitions at tier 4 (published) in the ledger."""
    from assets.phases import PHASES
    from resources.ledger_views import LedgerViews

    return LedgerViews(ledger).summary().by_tier.get(PHASES[-1].tier, 0)


def wait_for_webserver(url: str, proc: subprocess.Popen[bytes], *, timeout_s: float = 300) -> None:
    """Wait until the webserver at ``url`` answers ``/server_info`` (``proc``: the process serving it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Dagster webserver's process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the Dagster webserver at {url} did not answer /server_info")


def _ui_backfill(root: Path, name: str, landing: Path, dbs: Databases, keys: list[str]) -> float:
    """Start ``stormlake ui`` on a fresh home with new databases, launch the backfill, time it to
    the last publication."""
    ledger_dsn, _ = dbs.create()
    return ui_backfill(root, name, _child_env(root / name, landing, ledger_dsn), keys)


def ui_backfill(root: Path, name: str, env: dict[str, str], keys: list[str], *,
                progress: Callable[[int], None] | None = None, hang_guard_s: float = HANG_GUARD_S) -> float:
    """Start ``stormlake ui`` with ``env`` (its home, landing zone and ledger), launch a backfill of
    ``keys`` through GraphQL, and time it from the launch to the last of them published in the
    ledger; ``progress`` is told the partitions published at every look. Its output goes to
    ``root / f"{name}.log"``."""
    from assets.phases import PHASES, table_keys
    from resources.ledger import Ledger

    ledger = Ledger(env["STORMLAKE_PG_DSN"])  # one pool for the whole poll, not a new one every look
    env = dict(env, STORMLAKE_LANDING_SENSOR="stopped")  # the UI's backfill alone, not the sensor's runs of the same files
    port = _free_port()
    log = (root / f"{name}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", "from pipeline.cli import main; raise SystemExit(main())",
                             "ui", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_webserver(url, proc)
        params = {"assetSelection": [{"path": k.path} for k in table_keys(PHASES)], "partitionNames": keys,
                  "title": "bench --ui"}
        t = time.perf_counter()
        res = _gql(url, LAUNCH, {"params": params})["launchPartitionBackfill"]
        if res["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"launchPartitionBackfill: {res}")
        while (done := _published(ledger)) < len(keys):
            if progress is not None:
                progress(done)
            if time.perf_counter() - t > hang_guard_s or proc.poll() is not None:
                raise RuntimeError(f"the UI backfill did not publish all {len(keys)} partitions (see {log.name})")
            time.sleep(0.25)
        wall = time.perf_counter() - t
        if progress is not None:
            progress(done)
    finally:
        ledger.close()
        stop_group(proc)
        log.close()
    _say(f"{name}: {wall:.1f}s")
    return wall


def measure_ui(args, settings) -> dict[str, Any]:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    """The figures of ``stormlake bench --ui`` (see the module docstring)."""
    from pipeline.tools.generate import generate_scenario
    from resources.settings import load_regions

    root = settings.home / "bench" / "ui"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    regions = load_regions(settings.regions_file)
    n_regions, days, keys = plan_partitions(args.partitions, [r.region_id for r in regions], settings.first_day)
    _say(f"generating {n_regions} regions x {days} days x {args.rows_per_partition} rows")
    landing = root / "landing"
    generate_scenario(landing, regions[:n_regions], days=days, start=settings.first_day,
                      rows_per_partition=args.rows_per_partition, seed=args.seed)
    turns = take_turns(settings, args.repeat, ("cli_s", "ui_s", "ratio"),
                       lambda dbs, r: timed_backfill(root, f"cli-{r}", landing, dbs),
                       lambda dbs, r: _ui_backfill(root, f"ui-{r}", landing, dbs, keys),
                       ratio=lambda cli, ui: ui / cli)
    ratio = statistics.median(t["ratio"] for t in turns)
    result = {"config": {"partitions": len(keys), "rows_per_partition": args.rows_per_partition,
                         "repeat": args.repeat},
              "turns": turns, "ratio": round(ratio, 3), "target": TARGET_RATIO, "met": ratio <= TARGET_RATIO}
    return result


def run_ui_bench(args, settings) -> int:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    result = measure_ui(args, settings)
    print(json.dumps({"ui": result}, indent=2) if args.json else render_ui(result))
    return 0 if result["met"] else 1


def render_ui(result: dict[str, Any]) -> str:
    from pipeline.tools.bench_workers import render_turns

    c = result["config"]
    return render_turns(
        f"backfill of {c['partitions']} partitions x {c['rows_per_partition']:,} rows: the Dagster UI "
        "(launchPartitionBackfill, launch to last publication) against stormlake backfill",
        ("cli", "ui", "ui/cli"), ("cli_s", "ui_s", "ratio"), result,
        f"median ui/cli {result['ratio']:.3f} (target <= {result['target']})")


def stop_group(proc: subprocess.Popen) -> None:
    """Stop ``stormlake ui`` and everything it started (its process group): SIGTERM lets it stop
    its servers in order; what is left after a while is killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
