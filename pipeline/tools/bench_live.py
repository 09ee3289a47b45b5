"""``stormlake bench --live``: from a new version of today's files landing to every superseding
artifact delivered, through the landing sensor of a real Dagster daemon.

On a new home with new databases, under ``$STORMLAKE_HOME/bench/live``:

1. a region file of ``--partitions`` regions (default 50: the shipped regions, then boxes of the
   same size beside them) and today's files as of 10:00 UTC (``generate --as-of``, ``--rows-per-partition``
   outage rows over the whole day, default 500);
2. ``stormlake ui`` (webserver and daemon; the landing sensor is on by default, at its default
   interval) runs them, and every partition is published: not timed;
3. today's files as of 12:00 UTC land (written by the generator, each renamed into place), and
   the clock starts when the last of them is in place; it stops when every partition's present
   phase has committed on the new files, which it does only once each superseding artifact is
   delivered.

The figure is printed against :data:`TARGET_S`; a run over it exits 1.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.tools.bench import Databases, _child_env, _say
from pipeline.tools.bench_ui import _free_port, stop_group, wait_for_webserver

TARGET_S = 60.0
DEFAULTS = {"partitions": 50, "rows_per_partition": 500}
HANG_GUARD_S = 1800  # against a run that never ends, not a performance bound
BOX_DEG = 1.0  # the side of an added region's box, as the shipped regions'


def write_region_file(path: Path, count: int) -> list[Any]:
    """The shipped regions, then ``region_NN`` boxes in a row east of them, up to ``count``; the regions."""
    from resources.settings import DEFAULT_REGIONS_FILE, load_regions

    shipped = load_regions(DEFAULT_REGIONS_FILE)
    rows = [(r.region_id, r.name, r.min_lat, r.max_lat, r.min_lon, r.max_lon) for r in shipped[:count]]
    for i in range(len(rows), count):
        lat = 29.2 + (i % 6) * 1.2
        lon = -83.0 + (i // 6) * 1.2
        rows.append((f"region_{i + 1:02d}", f"Region {i + 1}", lat, lat + BOX_DEG, lon, lon + BOX_DEG))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(("region_id", "name", "min_lat", "max_lat", "min_lon", "max_lon"))
        out.writerows(rows)
    return load_regions(path)


def _presented(ledger_dsn: str, times: int) -> int:
    """Partitions whose present phase has committed at least ``times`` times (a skip is no commit)."""
    import psycopg

    with psycopg.connect(ledger_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM (SELECT partition_key FROM checkpoint_events WHERE phase = 'present'"
            " AND status = 'COMPLETED' GROUP BY partition_key HAVING count(*) >= %s) p", (times,)).fetchone()
    return int(row[0]) if row else 0


def _superseding(ledger_dsn: str) -> int:
    """Receipts that name the revision they supersede, delivered."""
    import psycopg

    with psycopg.connect(ledger_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM receipts WHERE supersedes IS NOT NULL AND status = 'DELIVERED'"
                           ).fetchone()
    return int(row[0]) if row else 0


def _wait(what: str, done, proc: subprocess.Popen[bytes], log: Path) -> None:  # noqa: ANN001 - a predicate
    start = time.perf_counter()
    while not done():
        if proc.poll() is not None or time.perf_counter() - start > HANG_GUARD_S:
            raise RuntimeError(f"bench --live: no {what} (see {log})")
        time.sleep(0.2)


def measure_live(args, settings) -> dict[str, Any]:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    """The figures of ``stormlake bench --live`` (see the module docstring)."""
    from pipeline.tools.generate import generate_scenario
    from resources.landing import utc_today

    n = args.partitions or DEFAULTS["partitions"]
    rows = args.rows_per_partition or DEFAULTS["rows_per_partition"]
    root = settings.home / "bench" / "live"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    regions_file = root / "regions.csv"
    regions = write_region_file(regions_file, n)
    today = utc_today()
    landing = root / "landing"

    def land(hour: int) -> None:
        generate_scenario(landing, regions, days=1, start=today, rows_per_partition=rows, seed=args.seed,
                          as_of=dt.datetime.fromisoformat(today).replace(hour=hour, tzinfo=dt.UTC))

    _say(f"today's files of {n} regions as of 10:00 UTC ({rows} outage rows over the whole day)")
    land(10)
    dbs = Databases(settings.pg_dsn, settings.pgdata)
    try:
        ledger_dsn, _ = dbs.create()
        env = _child_env(root / "home", landing, ledger_dsn)
        env["STORMLAKE_REGIONS"] = str(regions_file)
        env.pop("STORMLAKE_LANDING_SENSOR", None)  # the default: on
        port = _free_port()
        log_path = root / "ui.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-c", "from pipeline.cli import main; raise SystemExit(main())",
                                     "ui", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_webserver(f"http://127.0.0.1:{port}", proc)
            t = time.perf_counter()
            _wait("first publication of today's partitions", lambda: _presented(ledger_dsn, 1) >= n, proc, log_path)
            first_s = time.perf_counter() - t
            _say(f"10:00's files published by the sensor's runs in {first_s:.1f}s (not the figure)")
            _say("today's files as of 12:00 UTC land")
            land(12)
            landed = time.perf_counter()
            _wait("superseding revisions", lambda: _presented(ledger_dsn, 2) >= n, proc, log_path)
            wall = time.perf_counter() - landed
            superseding = _superseding(ledger_dsn)
        finally:
            stop_group(proc)
    finally:
        dbs.drop_all()
    return {"config": {"partitions": n, "rows_per_partition": rows, "day": today},
            "land_to_delivered_s": round(wall, 2), "superseding_deliveries": superseding,
            "first_version_s": round(first_s, 2), "target_s": TARGET_S, "met": wall <= TARGET_S}


def render_live(result: dict[str, Any]) -> str:
    c = result["config"]
    verdict = "met" if result["met"] else "NOT met"
    return (f"land to delivered, {c['partitions']} regions of today ({c['day']}, {c['rows_per_partition']:,} outage rows"
            f" over the day): a new version of their files landed, every superseding artifact delivered "
            f"({result['superseding_deliveries']} deliveries) in {result['land_to_delivered_s']:.1f} s; "
            f"target <= {result['target_s']:.0f} s: {verdict}")


def run_live_bench(args, settings) -> int:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    result = measure_live(args, settings)
    print(json.dumps({"live": result}, indent=2) if args.json else render_live(result))
    return 0 if result["met"] else 1
