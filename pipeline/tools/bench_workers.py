"""``stormlake bench --workers``: one backfill process against N, side by side.

On ``--partitions`` partitions (default 16) of ``--rows-per-partition`` outage rows (default
20,000), generated once into ``$STORMLAKE_HOME/bench/workers/landing``, turns alternate: a
``stormlake backfill --workers 1`` and a ``stormlake backfill --workers N`` (N: ``STORMLAKE_WORKERS``,
the number of cores by default), each a whole process on a new home and new databases on the
ledger's server. A turn's speedup is its 1-worker time over its N-worker time; the median of the
turns counts, against :data:`TARGET_SPEEDUP` on a machine of 2 cores or more.

Each home is a deployment made before the clock starts (:func:`prepare_home`), as a backfill
finds it in use: Dagster's storage created and the ledger's tables migrated, nothing run. Their
creation happens once in a deployment's life (``stormlake env`` takes 2.5-3.6 s here, its process
start included).
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.tools.bench import Databases, _child_env, _say, plan_partitions
from pipeline.tools.bench_scale import _cli
from resources.keys import partition_key

TARGET_SPEEDUP = 1.6
DEFAULTS = {"partitions": 16, "rows_per_partition": 20_000, "seed": 11}


def _generate(root: Path, settings, partitions: int, rows: int, seed: int) -> tuple[Path, list[str]]:  # noqa: ANN001
    from pipeline.tools.generate import generate_scenario
    from resources.settings import load_regions

    regions = load_regions(settings.regions_file)
    n_regions, days, keys = plan_partitions(partitions, [r.region_id for r in regions], settings.first_day)
    landing = root / "landing"
    _say(f"generating {n_regions} regions x {days} days x {rows} rows")
    generate_scenario(landing, regions[:n_regions], days=days, start=settings.first_day,
                      rows_per_partition=rows, seed=seed)
    # The backfills take every partition of the landing zone: the ones past the count go.
    for rid in {r.region_id for r in regions[:n_regions]}:
        for day_dir in (landing / rid).iterdir():
            if partition_key(day_dir.name, rid) not in keys:
                shutil.rmtree(day_dir)
    return landing, keys


def prepare_home(env: dict[str, str]) -> float:
    """Make the deployment of ``env`` as a backfill finds it in use, before a clock starts:
    ``stormlake env`` writes ``dagster.yaml`` and creates Dagster's storage (the ledger's tables
    were migrated with its database, :meth:`Databases.create`). Nothing is run. Its wall seconds."""
    return _cli(env, "env")


def timed_backfill(root: Path, name: str, landing: Path, dbs: Databases, *args: str) -> float:
    """One ``stormlake backfill *args`` of the landing zone on a new home ``root / name`` with new
    databases, prepared first (:func:`prepare_home`, not timed); its wall seconds."""
    ledger_dsn, _ = dbs.create()
    env = _child_env(root / name, landing, ledger_dsn)
    prepared = prepare_home(env)
    wall = _cli(env, "backfill", *args)
    _say(f"{name}: {wall:.1f}s (its home prepared before, in {prepared:.1f}s)")
    return wall


def take_turns(settings, repeat: int, names: tuple[str, str, str],  # noqa: ANN001 - resources.settings.Settings
               first: Callable[[Databases, int], float], second: Callable[[Databases, int], float],
               ratio: Callable[[float, float], float]) -> list[dict[str, float]]:
    """``repeat`` turns of two timed runs side by side, each on fresh scratch databases (dropped
    after each turn): per turn both times (named ``names[0]``, ``names[1]``) and
    ``ratio(first, second)`` (named ``names[2]``)."""
    turns: list[dict[str, float]] = []
    dbs = Databases(settings.pg_dsn, settings.pgdata)
    try:
        for r in range(1, repeat + 1):
            a, b = first(dbs, r), second(dbs, r)
            turns.append({names[0]: round(a, 2), names[1]: round(b, 2), names[2]: round(ratio(a, b), 3)})
            dbs.drop_all()
    finally:
        dbs.drop_all()
    return turns


def measure_workers(args, settings) -> dict[str, Any]:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    """The figures of ``stormlake bench --workers`` (see the module docstring)."""
    partitions, rows = args.partitions, args.rows_per_partition
    workers = max(2, settings.workers)
    root = settings.home / "bench" / "workers"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    landing, keys = _generate(root, settings, partitions, rows, args.seed)
    turns = take_turns(settings, args.repeat, ("one_s", "many_s", "speedup"),
                       lambda dbs, r: timed_backfill(root, f"one-{r}", landing, dbs, "--workers", "1"),
                       lambda dbs, r: timed_backfill(root, f"many-{r}", landing, dbs, "--workers", str(workers)),
                       ratio=lambda one, many: one / many)
    speedup = statistics.median(t["speedup"] for t in turns)
    result = {"config": {"partitions": len(keys), "rows_per_partition": rows, "workers": workers,
                         "repeat": args.repeat},
              "turns": turns, "speedup": round(speedup, 3), "target": TARGET_SPEEDUP,
              "met": speedup >= TARGET_SPEEDUP}
    return result


def run_workers_bench(args, settings) -> int:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    result = measure_workers(args, settings)
    print(json.dumps({"workers": result}, indent=2) if args.json else render_workers(result))
    return 0 if result["met"] else 1


def render_turns(title: str, columns: tuple[str, str, str], keys: tuple[str, str, str],
                 result: dict[str, Any], verdict: str) -> str:
    """A side-by-side measurement as a table: one line per turn (two times and their ratio), then
    the median ratio against its target."""
    lines = [title, f"{'turn':<5} {columns[0]:>10} {columns[1]:>10} {columns[2]:>8}"]
    for i, t in enumerate(result["turns"], 1):
        lines.append(f"{i:<5} {t[keys[0]]:>9.1f}s {t[keys[1]]:>9.1f}s {t[keys[2]]:>8.3f}")
    lines.append(f"{verdict}: {'met' if result['met'] else 'NOT met'}")
    return "\n".join(lines)


def render_workers(result: dict[str, Any]) -> str:
    c = result["config"]
    return render_turns(
        f"backfill of {c['partitions']} partitions x {c['rows_per_partition']:,} rows: 1 process against "
        f"{c['workers']}, each on a new home prepared before the clock",
        ("1 worker", f"{c['workers']} workers", "speedup"), ("one_s", "many_s", "speedup"), result,
        f"median speedup {result['speedup']:.3f} (target >= {result['target']})")
