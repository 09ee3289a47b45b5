"""``stormlake bench --scale``: the views of a year of 50 regions, measured against their targets.

How the ledger is built (in a fresh database on the ledger's server, dropped at the end):

1. **Real runs.** A small scenario (2 regions x 2 days x 500 outage rows) is generated and run
   through ``stormlake backfill``: real checkpoints, events, recorded calls and receipts.
2. **Cloned rows.** Every other (day, region) of :data:`DAYS` days x :data:`REGIONS` regions
   gets a copy of one real partition's head checkpoints, their events and their receipts, made
   in SQL under the new partition key (ids, sequence numbers, idempotency keys and artifact ids
   are the new partition's own). One partition in 97 is planted with correlate FAILED (three
   attempts, no present) and one in 101 with present PENDING, so the views have something to
   point at. The regions are the region list's, then ``region_NN`` up to :data:`REGIONS`.

Then each view is timed as a person runs it, a whole ``stormlake`` process from start to exit
(``status``, ``status --json`` into a file, ``report``), :data:`REPEATS` times, the median
counting; plus a rerun of the real partitions on the big ledger (the backfill preflight: every
phase skips, no run is launched) and one outbox sensor tick over the last 500 events
(``evaluate_outbox``, in this process, against a Dagster instance in a scratch folder).

**Writes on a lake of a year.** A Delta commit costs more the more files its table holds
(docs/DESIGN.md, "Limits at a year's scale"), and a year of 50 regions is 18,250 partitions a
table. Before the ledger is cloned, the real partitions are re-run whole (``stormlake backfill
--from ingest``: every phase computed, each of its ten tables written) :data:`REPEATS` times on
their own lake; then every table of the lake gets every other partition of the year's grid (one
row each, a copy of the table's first row: a write's cost follows the table's files, not its
rows; one commit a table, an append into partitions nobody else writes, in this scratch lake
only), and the same re-runs are timed again. The difference, per real partition, is what a
partition's writes cost more at a year's scale. It has no target; it is printed beside the views.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DAYS = 365
REGIONS = 50
REAL = {"regions": 2, "days": 2, "rows_per_partition": 500, "seed": 11}
REPEATS = 3
FAILED_EVERY = 97
PENDING_EVERY = 101
#: Seconds, whole process, on a ledger of a year of 50 regions.
TARGETS = {"status": 1.0, "status_json": 1.0, "report": 3.0, "rerun": 1.8, "sensor_tick": 1.0}


def _say(msg: str) -> None:
    sys.stderr.write(f"bench --scale: {msg}\n")
    sys.stderr.flush()


def _cli(env: dict[str, str], *args: str, stdout: Any = subprocess.DEVNULL) -> float:
    """Run ``stormlake *args`` to its end; its wall seconds."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", "from pipeline.cli import main; raise SystemExit(main())", *args],
                          env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        from resources.errors import StormlakeError

        raise StormlakeError(f"bench --scale: stormlake {' '.join(args)} exited {proc.returncode}: "
                             f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    return wall


def scale_grid(region_ids: list[str], first_day: str, real: list[str]) -> list[tuple[str, str, str, str, str]]:
    """(partition key, region, day, template key, kind) of every cloned partition.

    Example:
        >>> rows = scale_grid(["a", "b"], "2026-09-01", ["2026-09-01|a"])
        >>> len(rows) == DAYS * REGIONS - 1 and rows[0][:3] == ("2026-09-01|b", "b", "2026-09-01")
        True
    """
    regions = list(region_ids[:REGIONS]) + [f"region_{i:02d}" for i in range(len(region_ids) + 1, REGIONS + 1)]
    start = dt.date.fromisoformat(first_day)
    taken = set(real)
    rows = []
    n = 0
    for d in range(DAYS):
        day = (start + dt.timedelta(days=d)).isoformat()
        for region in regions:
            key = f"{day}|{region}"
            if key in taken:
                continue
            n += 1
            kind = "failed" if n % FAILED_EVERY == 0 else "pending" if n % PENDING_EVERY == 0 else "ok"
            rows.append((key, region, day, real[n % len(real)], kind))
    return rows


def clone_lake(lake: Path, grid: list[tuple[str, str, str, str, str]]) -> dict[str, int]:
    """Give every table of ``lake`` the partitions of ``grid`` (:func:`scale_grid`), one row each,
    in one commit a table; the partitions each table holds afterwards, by table.

    The row is a copy of the table's first row under the partition's ``region_id`` and ``day``. A
    table without rows is left as it is (there is no row to copy).
    """
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from assets.schemas import PARTITION_COLUMNS

    regions = pa.array([g[1] for g in grid], pa.string())
    days = pa.array([g[2] for g in grid], pa.string())
    held: dict[str, int] = {}
    for path in sorted(p for p in lake.iterdir() if (p / "_delta_log").is_dir()):
        table = DeltaTable(str(path))
        first = table.to_pyarrow_dataset().head(1)
        if first.num_rows and grid:
            copies = first.take(pa.array([0] * len(grid)))
            for name, values in (("region_id", regions), ("day", days)):
                i = copies.schema.get_field_index(name)
                copies = copies.set_column(i, copies.schema.field(i), values.cast(copies.schema.field(i).type))
            write_deltalake(table, copies, mode="append", partition_by=PARTITION_COLUMNS)
        held[path.name] = len(table.partitions())
    return held


def time_writes_on_a_year(env: dict[str, str], lake: Path, grid: list[tuple[str, str, str, str, str]],
                          real: list[str]) -> dict[str, Any]:
    """The real partitions re-run whole on their own lake, then on the lake cloned to a year
    (:func:`clone_lake`): the medians of :data:`REPEATS` runs each and what a partition costs more."""
    def forced_rerun() -> float:
        return _cli(env, "backfill", "--from", "ingest", "--reason", "bench --scale: writes on a lake of a year")

    _say(f"timing a forced re-run of the {len(real)} real partitions on their own lake ({REPEATS} times)")
    small, small_samples = _median_of(forced_rerun)
    _say(f"cloning the lake over {DAYS} days x {REGIONS} regions (one commit a table)")
    t = time.perf_counter()
    most = max(clone_lake(lake, grid).values(), default=0)
    clone_s = time.perf_counter() - t
    _say(f"lake: {most:,} partitions a table ({clone_s:.1f} s); timing the re-run again")
    year, year_samples = _median_of(forced_rerun)
    return {"partitions_a_table": most, "clone_s": round(clone_s, 2),
            "real_partitions": len(real),
            "own_lake_s": round(small, 3), "own_lake_samples_s": [round(x, 3) for x in small_samples],
            "year_lake_s": round(year, 3), "year_lake_samples_s": [round(x, 3) for x in year_samples],
            "more_a_partition_s": round((year - small) / max(len(real), 1), 3)}


def _median_of(fn, repeats: int = REPEATS) -> tuple[float, list[float]]:  # noqa: ANN001
    samples = [fn() for _ in range(repeats)]
    return statistics.median(samples), samples


def sensor_tick_seconds(ledger_dsn: str, scratch: Path) -> float:
    """One outbox tick over the ledger's last 500 events (a busy minute's worth), in this process."""
    import dagster as dg
    import psycopg

    from pipeline.sensors import OUTBOX_BATCH, OutboxCursor, evaluate_outbox
    from resources.ledger import Ledger

    ledger = Ledger(ledger_dsn)
    try:
        with psycopg.connect(ledger_dsn) as conn:  # the position before the last batch, in the outbox's order
            row = conn.execute("SELECT txid::text::bigint, event_id FROM checkpoint_events"
                               " ORDER BY txid DESC, event_id DESC OFFSET %s LIMIT 1", (OUTBOX_BATCH,)).fetchone()
        txid, event_id = row if row else (0, 0)
        scratch.mkdir(parents=True, exist_ok=True)
        with dg.DagsterInstance.local_temp(tempdir=str(scratch)) as instance:
            t = time.perf_counter()
            evaluate_outbox(ledger, instance, OutboxCursor(int(event_id), {}, int(txid)))
            return time.perf_counter() - t
    finally:
        ledger.close()


def _figure(name: str, fn) -> dict[str, Any]:  # noqa: ANN001 - a callable returning seconds
    _say(f"timing {name} ({REPEATS} times)")
    median, samples = _median_of(fn)
    return {"median_s": round(median, 3), "samples_s": [round(s, 3) for s in samples],
            "target_s": TARGETS[name], "met": median <= TARGETS[name]}


def time_views(env: dict[str, str], root: Path, ledger_dsn: str) -> dict[str, dict[str, Any]]:
    """Each view as a person runs it (a whole process), :data:`REPEATS` times; the median counts."""
    out = root / "status.json"

    def status_json() -> float:
        with out.open("w") as fh:
            return _cli(env, "status", "--json", stdout=fh)

    figures = {"status": _figure("status", lambda: _cli(env, "status")),
               "status_json": _figure("status_json", status_json)}
    figures["status_json"]["bytes"] = out.stat().st_size
    figures["status_json"]["partitions"] = len(json.loads(out.read_text())["partitions"])
    figures["report"] = _figure("report", lambda: _cli(env, "report", "--out", str(root / "report.html")))
    figures["report"]["bytes"] = (root / "report.html").stat().st_size
    figures["rerun"] = _figure("rerun", lambda: _cli(env, "backfill"))
    scratch = Path(tempfile.mkdtemp(prefix="sensor-", dir=root))
    figures["sensor_tick"] = _figure("sensor_tick", lambda: sensor_tick_seconds(ledger_dsn, scratch))
    return figures


def run_real_partitions(root: Path, ledger_dsn: str, settings) -> tuple[dict[str, str], list[str], float]:  # noqa: ANN001
    """Generate the small scenario and backfill it: (the CLI environment, the real partition
    keys, the backfill's wall seconds)."""
    from pipeline.tools.bench import _child_env
    from pipeline.tools.generate import generate_scenario
    from resources.settings import load_regions

    regions = load_regions(settings.regions_file)[:REAL["regions"]]
    landing = root / "landing"
    _say(f"generating {REAL['regions']} regions x {REAL['days']} days x {REAL['rows_per_partition']} rows")
    generate_scenario(landing, regions, days=REAL["days"], start=settings.first_day,
                      rows_per_partition=REAL["rows_per_partition"], seed=REAL["seed"])
    env = _child_env(root / "home", landing, ledger_dsn)
    _say(f"real runs: stormlake backfill of the {REAL['regions'] * REAL['days']} partitions")
    first_run = _cli(env, "backfill")
    start = dt.date.fromisoformat(settings.first_day)
    real = [f"{(start + dt.timedelta(days=d)).isoformat()}|{r.region_id}" for d in range(REAL["days"]) for r in regions]
    return env, real, first_run


def clone_ledger(ledger_dsn: str, grid: list[tuple[str, str, str, str, str]]) -> tuple[dict[str, int], float]:
    """Clone the real partitions of the ledger over ``grid`` (:func:`scale_grid`): the row
    counts and the seconds it took."""
    from resources.ledger_fixtures import clone_partitions

    _say(f"cloning them over {DAYS} days x {REGIONS} regions")
    t = time.perf_counter()
    counts = clone_partitions(ledger_dsn, grid)
    build_s = time.perf_counter() - t
    _say(f"ledger: {counts['partitions']} partitions, {counts['checkpoints']} checkpoints, "
         f"{counts['checkpoint_events']} events, {counts['receipts']} receipts ({build_s:.1f} s)")
    return counts, build_s


def measure_scale(args, settings) -> dict[str, Any]:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    """The figures of ``stormlake bench --scale`` (see the module docstring): the real runs, the
    writes on their own lake and on a lake of a year, the ledger cloned, then the views."""
    import shutil

    from pipeline.tools.bench import Databases
    from resources.settings import load_regions

    root = settings.home / "bench" / "scale"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    dbs = Databases(settings.pg_dsn, settings.pgdata)
    try:
        ledger_dsn, _ = dbs.create()
        env, real, first_run = run_real_partitions(root, ledger_dsn, settings)
        grid = scale_grid([r.region_id for r in load_regions(settings.regions_file)], settings.first_day, real)
        lake = time_writes_on_a_year(env, Path(env["STORMLAKE_LAKE"]), grid, real)
        counts, build_s = clone_ledger(ledger_dsn, grid)
        figures = time_views(env, root, ledger_dsn)
    finally:
        dbs.drop_all()
    config = {"days": DAYS, "regions": REGIONS, "real_partitions": len(real), "repeat": REPEATS,
              "first_backfill_s": round(first_run, 2), "build_s": round(build_s, 2)}
    return {"config": config, "ledger": counts, "views": figures, "lake": lake}


def run_scale_bench(args, settings) -> int:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    result = measure_scale(args, settings)
    print(json.dumps({"scale": result}, indent=2) if args.json else render_scale(result))
    return 0 if all(f["met"] for f in result["views"].values()) else 1


def render_scale(result: dict[str, Any]) -> str:
    led = result["ledger"]
    lines = [f"views on a ledger of {led['partitions']:,} partitions ({result['config']['days']} days x "
             f"{result['config']['regions']} regions): {led['checkpoints']:,} checkpoints, "
             f"{led['checkpoint_events']:,} events, {led['receipts']:,} receipts",
             f"{'view':<14} {'median':>8}  {'target':>7}  met  samples"]
    for name, f in result["views"].items():
        extra = f"  ({f['bytes'] / 1e6:.1f} MB)" if "bytes" in f else ""
        lines.append(f"{name:<14} {f['median_s']:>7.3f}s  {f['target_s']:>6.1f}s  {'yes' if f['met'] else 'NO ':<3}  "
                     + ", ".join(f"{s:.3f}" for s in f["samples_s"]) + extra)
    lake = result.get("lake")
    if lake:
        lines.append(f"writes on a lake of a year (no target): a forced re-run of the {lake['real_partitions']} real "
                     f"partitions took {lake['own_lake_s']:.2f} s on their own lake and {lake['year_lake_s']:.2f} s "
                     f"with {lake['partitions_a_table']:,} partitions a table: "
                     f"{lake['more_a_partition_s']:+.3f} s a partition")
    return "\n".join(lines)

