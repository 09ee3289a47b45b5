"""``stormlake bench --engine``: a backfill's steps on 1 Celery worker against 2, side by side.

Each measurement is a deployment of Dagster's Celery executor on this machine
(pipeline/tools/celery_local.py): a Redis broker, a local S3 endpoint (``moto[server]``) holding
the landing zone, the lake and the published files, the ledger and Dagster's storage in new
databases on the ledger's server, each with a login of its own, and the workers, each one
process (``--concurrency 1``), as another Unix user when run as root. Everything is prepared
before the clock starts; the clock runs over one ``stormlake backfill`` of every partition in the
launcher's environment (``STORMLAKE_EXECUTOR=celery``): the Dagster asset backfill, the daemon it
starts, the key range runs Dagster cuts by the backfill policy (``MAX_PARTITIONS_PER_RUN``), at
most :data:`RUNS_AT_ONCE` at once, their steps on the workers. It includes the daemon's start and
its first look at the backfill, the same for 1 worker and 2.

On ``--partitions`` partitions (default 16) of ``--rows-per-partition`` outage rows (default
2,000), turns alternate a deployment with 1 worker and one with 2; per turn the wall seconds of
each, the partitions each worker completes a second (partitions / wall seconds / workers), and
2 workers' speedup over 1. The medians of the turns are printed. No target: the figure says what
a second worker gives on this machine, whose two cores also run the runs' processes, Redis,
the S3 endpoint and PostgreSQL.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from pipeline.tools.bench import Databases, _say
from resources.errors import StormlakeError

DEFAULTS = {"partitions": 16, "rows_per_partition": 2_000, "seed": 11}
WORKERS = (1, 2)
#: The run queue's limit (``stormlake backfill --workers``), the same for 1 Celery worker and 2.
RUNS_AT_ONCE = 2


def timed_deployment(root: Path, name: str, admin_dsn: str, endpoint, landing: Path,  # noqa: ANN001 - Endpoint
                     keys: list[str], workers: int) -> dict[str, Any]:
    """Backfill ``keys`` on a new deployment with ``workers`` workers; its wall seconds, the
    steps each worker ran and the backfill's runs."""
    import uuid

    from pipeline.tools.celery_local import backfill_id, deployment, redis_broker
    from resources.pgserver import create_database, with_database

    db = f"stormlake_bench_engine_{uuid.uuid4().hex[:10]}"
    create_database(admin_dsn, db)
    with redis_broker(root / name / "redis") as broker, \
            deployment(admin_dsn, with_database(admin_dsn, db), endpoint, landing, broker) as dep:
        started = [dep.start_worker(f"{name}-w{i + 1}") for i in range(workers)]
        t = time.perf_counter()
        done = dep.backfill(keys, timeout=1800, runs_at_once=RUNS_AT_ONCE)
        wall = time.perf_counter() - t
        if not done.ok:
            raise StormlakeError(f"bench --engine: the backfill of {name} failed: "
                                 f"{(done.output.strip().splitlines() or [''])[-1]}")
        runs = len(dep.backfill_runs(backfill_id(done.output))["runs"])
        steps = [w.tasks_done() for w in started]
        user = dep.user or "this user"
    _say(f"{name}: {wall:.1f}s, {runs} runs, steps per worker {steps} (workers as {user})")
    return {"wall_s": round(wall, 2), "steps": steps, "runs": runs, "user": user}


def measure_engine(args, settings) -> dict[str, Any]:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    """The figures of ``stormlake bench --engine`` (see the module docstring)."""
    from pipeline.tools.bench_workers import _generate
    from pipeline.tools.s3_local import moto_endpoint

    root = settings.home / "bench" / "engine"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    landing, keys = _generate(root, settings, args.partitions, args.rows_per_partition, args.seed)
    dbs = Databases(settings.pg_dsn, settings.pgdata)
    turns: list[dict[str, Any]] = []
    with moto_endpoint(root / "moto.log") as endpoint:
        for r in range(1, args.repeat + 1):
            turn = {f"w{n}": timed_deployment(root, f"turn{r}-{n}w", dbs.admin, endpoint, landing, keys, n)
                    for n in WORKERS}
            for n in WORKERS:
                turn[f"w{n}"]["per_worker_per_s"] = round(len(keys) / turn[f"w{n}"]["wall_s"] / n, 3)
            turn["speedup"] = round(turn["w1"]["wall_s"] / turn["w2"]["wall_s"], 3)
            turns.append(turn)
    med = {n: statistics.median(t[f"w{n}"]["wall_s"] for t in turns) for n in WORKERS}
    return {"config": {"partitions": len(keys), "rows_per_partition": args.rows_per_partition,
                       "runs": turns[0]["w1"]["runs"], "runs_at_once": RUNS_AT_ONCE, "repeat": args.repeat, "workers_user": turns[0]["w1"]["user"]},
            "turns": turns,
            "wall_s": {f"w{n}": round(med[n], 2) for n in WORKERS},
            "per_worker_per_s": {f"w{n}": round(len(keys) / med[n] / n, 3) for n in WORKERS},
            "speedup": round(statistics.median(t["speedup"] for t in turns), 3)}


def render_engine(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [f"steps on Celery workers: {c['partitions']} partitions x {c['rows_per_partition']} rows in "
             f"{c['runs']} runs of one backfill ({c.get('runs_at_once', RUNS_AT_ONCE)} at once), median of {c['repeat']} turns (workers as {c['workers_user']})",
             "workers  wall s  partitions/s  partitions/s per worker"]
    for n in WORKERS:
        wall = result["wall_s"][f"w{n}"]
        lines.append(f"{n:>7}  {wall:>6.1f}  {c['partitions'] / wall:>12.3f}  {result['per_worker_per_s'][f'w{n}']:>23.3f}")
    lines.append(f"2 workers against 1: {result['speedup']:.3f}x (turns "
                 + " / ".join(f"{t['speedup']:.3f}" for t in result["turns"]) + ")")
    return "\n".join(lines)


def run_engine_bench(args, settings) -> int:  # noqa: ANN001  (argparse.Namespace, resources.settings.Settings)
    result = measure_engine(args, settings)
    print(json.dumps({"engine": result}, indent=2) if args.json else render_engine(result))
    return 0
