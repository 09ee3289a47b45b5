"""``stormlake bench --workers``: one backfill process against N, side by side.

On ``--partitions`` partitions (default 16) of ``--rows-per-partition`` outage rows (default
20,000), generated once into ``$STORMLAKE_HOME/bench/workers/landing``, turns alternate: a
``stormlake backfill --workers 1`` and a ``stormlake backfill --workers N`` (N: ``STORMLAKE_WORKERS``,
the number of cores by default), each a whole process on a new home and new databases on the
ledger's server. A turn's speedup is its 1-worker time over its N-worker time; the median of the
turns counts, against :data:`TARGET_SPEEDUP` on a machine of 2 cores or more.

Each turn first measures what the host's cores give at that moment (:func:`host_ceiling`): a
CPU-bound loop in one process against the same loop split over N processes at once. A shared
host's second core is not a whole core (its neighbours, its clock), and the loop's speedup is the
most the backfills' could be if all of their work ran in parallel; the table prints both, and
the workers' speedup as a share of the host's. It also times the start that every backfill
process pays on one core before any work can be shared (:func:`start_seconds`: the modules a
worker is forked with), and from the two the most the workers' speedup could be in that turn
(:func:`speedup_bound`). Where ``/proc/stat`` tells (Linux), it also reads what the
machine's cores did while each backfill ran (:func:`cpu_seconds`): how much work both took in
all (PostgreSQL's included), how long the cores sat idle, which with N workers beyond the
start's (N - 1) x S is work the workers did not share out, and the most N workers could gain
if they did no more work than one (:func:`work_bound`), a tighter bound, since one worker
already keeps more than one core busy.

Each home is a deployment made before the clock starts (:func:`prepare_home`), as a backfill
finds it in use: Dagster's storage created and the ledger's tables migrated, nothing run. Their
creation happens once in a deployment's life, so timing it would measure a cost no backfill in
use pays.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.tools.bench import Databases, _child_env, _say, plan_partitions
from pipeline.tools.bench_scale import _cli
from resources.errors import StormlakeError
from resources.keys import partition_key

TARGET_SPEEDUP = 1.6
DEFAULTS = {"partitions": 16, "rows_per_partition": 20_000, "seed": 11}
#: Steps of the host ceiling's loop in all: long enough that the processes' start is a small part.
CEILING_STEPS = 10_000_000
_LOOP = "import sys\nx = 0\nfor i in range(int(sys.argv[1])):\n    x = (x * 31 + i) % 1000003\n"


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


def host_ceiling(processes: int, steps: int = CEILING_STEPS) -> dict[str, float]:
    """How much faster ``processes`` processes at once finish a CPU-bound loop of ``steps`` steps,
    split evenly between them, than one process doing all of it: whole processes (an isolated
    interpreter each, quick to start), timed as the backfills are. ``one_s``, ``many_s`` and
    their ratio ``speedup``; on an idle machine with a core per process, about ``processes``."""
    def run(n: int) -> float:
        t = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-I", "-c", _LOOP, str(steps // n)]) for _ in range(n)]
        if any([p.wait() for p in procs]):
            raise StormlakeError("bench --workers: the host ceiling's loop failed")
        return time.perf_counter() - t

    one, many = run(1), run(processes)
    return {"one_s": round(one, 2), "many_s": round(many, 2), "speedup": round(one / many, 3)}


#: What a run's process imports and makes before its first phase: the code location and what
#: its phases import only when they run.
_START = ("import importlib\n"
          "for m in ('pipeline.definitions', 'assets.materialize', 'assets.transforms.pictures',"
          " 'assets.transforms.present', 'deltalake'):\n    importlib.import_module(m)\n"
          "import dagster_postgres\nfrom assets.transforms.present import prepare\nprepare()\n")
#: The least of it that any backfill process pays: it runs its partitions as Dagster runs
#: recorded in Dagster's PostgreSQL storage, so it imports both before its first run.
_FLOOR = "import dagster\nimport dagster_postgres\n"


def _import_seconds(code: str, what: str) -> float:
    from pipeline.instance import PROJECT_ROOT

    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True)
    if done.returncode:
        raise StormlakeError(f"bench --workers: importing {what} failed: {done.stderr.strip()[-300:]}")
    return round(time.perf_counter() - t, 2)


def start_seconds() -> float:
    """Wall seconds of a new process importing and making what a backfill's workers are forked with:
    the part of every backfill, with one worker or several, that runs on one core."""
    return _import_seconds(_START, "the backfill's modules")


def floor_seconds() -> float:
    """Wall seconds of a new process importing Dagster and its PostgreSQL storage, nothing else:
    the least of :func:`start_seconds` that no backfill can do without (:func:`floor_bound`)."""
    return _import_seconds(_FLOOR, "Dagster and its PostgreSQL storage")


def speedup_bound(one_s: float, start_s: float, ceiling: float) -> float:
    """The most ``N`` workers could gain over one in a backfill of ``one_s`` seconds whose first
    ``start_s`` run on one core, the rest going ``ceiling`` times faster on N cores.

    Example:
        >>> speedup_bound(12.0, 3.0, 2.0)  # 12 s against 3 + 9 / 2 = 7.5 s
        1.6
    """
    return round(one_s / (start_s + (one_s - start_s) / ceiling), 3)


def work_bound(one_s: float, start_s: float, one_busy_s: float, ceiling: float) -> float:
    """The most ``N`` workers could gain over one in a backfill of ``one_s`` seconds that kept
    the machine's cores busy ``one_busy_s`` core-seconds in all (PostgreSQL's and every helper
    thread's work counted, :func:`cpu_seconds`), if N workers did no more work than one: the start
    (``start_s``, one core) first, then the rest of that work on N cores giving ``ceiling`` times
    one core's.

    :func:`speedup_bound` takes one worker for one core; it is more (the lake's writers, the
    flush behind and PostgreSQL run beside its steps), so this bound is the tighter one. Both
    hold only as far as the host gives during the backfills what it gave the ceiling's loop just
    before: on a shared host whose neighbours come and go, a turn can beat its bound.

    Example:
        >>> work_bound(7.6, 2.1, 8.6, 1.953)  # 7.6 s against 2.1 + 6.5 / 1.953 = 5.43 s
        1.4
        >>> work_bound(7.6, 2.1, 7.6, 1.953) == speedup_bound(7.6, 2.1, 1.953)  # one worker, one core
        True
    """
    return round(one_s / (start_s + max(0.0, one_busy_s - start_s) / ceiling), 3)


def floor_bound(one_s: float, start_s: float, one_busy_s: float, ceiling: float, floor_s: float) -> float:
    """:func:`work_bound` with the start cut to its floor (``floor_s``, :func:`floor_seconds`):
    the most ``N`` workers could gain over one if every backfill process started as soon as
    Dagster and its PostgreSQL storage are imported and N workers did no more work than one.
    The 1-worker backfill would then take ``one_s - start_s + floor_s``, the N workers at
    least ``floor_s`` and the rest of the 1-worker backfill's work at ``ceiling`` times one core.

    No change to the start (imports made lazily, fewer modules, less made before the fork) can
    take the workers' speedup above this bound; only less work, or work that one worker leaves
    to a second core, can.

    Example:
        >>> floor_bound(7.6, 2.1, 8.6, 1.953, 1.3)  # 6.8 s against 1.3 + 6.5 / 1.953 = 4.63 s
        1.469
        >>> floor_bound(7.6, 2.1, 8.6, 1.953, 2.1) == work_bound(7.6, 2.1, 8.6, 1.953)  # the start is its floor
        True
    """
    cut = start_s - floor_s  # what the 1-worker backfill would take less, in wall and busy seconds alike
    return work_bound(one_s - cut, floor_s, one_busy_s - cut, ceiling)


def cpu_seconds(stat: Path = Path("/proc/stat")) -> dict[str, float] | None:
    """Seconds that all of this machine's cores spent busy, idle (waiting for I/O included) and
    stolen by the host for other machines since it started, from ``stat`` (Linux), or None where
    there is no such file. The difference of two readings is what the cores did between them,
    every process's work counted, PostgreSQL's too.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     f = Path(d) / "stat"
        ...     _ = f.write_text("cpu  300 0 100 500 100 0 0 50 0 0\\ncpu0 150 0 50 250 50 0 0 25 0 0\\n")
        ...     ticks = os.sysconf("SC_CLK_TCK")
        ...     {k: round(v * ticks) for k, v in cpu_seconds(f).items()}
        {'busy_s': 400, 'idle_s': 600, 'stolen_s': 50}
    """
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if len(first) < 9 or first[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    hz = os.sysconf("SC_CLK_TCK")
    return {"busy_s": (user + nice + system + irq + softirq) / hz, "idle_s": (idle + iowait) / hz,
            "stolen_s": steal / hz}


def prepare_home(env: dict[str, str]) -> float:
    """Make the deployment of ``env`` as a backfill finds it in use, before a clock starts:
    ``stormlake env`` writes ``dagster.yaml`` and creates Dagster's storage (the ledger's tables
    were migrated with its database, :meth:`Databases.create`). Nothing is run. Its wall seconds."""
    return _cli(env, "env")


def timed_backfill(root: Path, name: str, landing: Path, dbs: Databases, *args: str,
                   cpu: dict[str, float] | None = None) -> float:
    """One ``stormlake backfill *args`` of the landing zone on a new home ``root / name`` with new
    databases, prepared first (:func:`prepare_home`, not timed); its wall seconds. ``cpu``, when
    given, takes what the machine's cores did meanwhile (:func:`cpu_seconds`), where that is known."""
    ledger_dsn, _ = dbs.create()
    env = _child_env(root / name, landing, ledger_dsn)
    prepared = prepare_home(env)
    before = cpu_seconds()
    wall = _cli(env, "backfill", *args)
    after = cpu_seconds()
    if cpu is not None and before and after:
        cpu.update({k: round(after[k] - before[k], 2) for k in before})
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
    ceilings: list[dict[str, float]] = []
    cores: list[dict[str, Any]] = []  # per turn, what the cores did during each backfill, and the work bound

    def one_worker(dbs: Databases, r: int) -> float:
        ceilings.append(dict(host_ceiling(workers), start_s=start_seconds(), floor_s=floor_seconds()))
        c = ceilings[-1]
        _say(f"host ceiling {r}: {c['one_s']:.1f}s in one process, {c['many_s']:.1f}s in {workers} at once "
             f"({c['speedup']:.3f}); a backfill's start {c['start_s']:.1f}s, of which Dagster and its"
             f" PostgreSQL storage {c['floor_s']:.1f}s")
        cores.append({"one": {}, "many": {}})
        return timed_backfill(root, f"one-{r}", landing, dbs, "--workers", "1", cpu=cores[-1]["one"])

    def many_workers(dbs: Databases, r: int) -> float:
        wall = timed_backfill(root, f"many-{r}", landing, dbs, "--workers", str(workers), cpu=cores[-1]["many"])
        if all(cores[-1].values()):
            _say(f"the cores in turn {r}: " + "; ".join(
                f"{name} busy {c['busy_s']:.1f}s, idle {c['idle_s']:.1f}s, stolen {c['stolen_s']:.1f}s"
                for name, c in cores[-1].items()))
        return wall

    turns = take_turns(settings, args.repeat, ("one_s", "many_s", "speedup"), one_worker, many_workers,
                       ratio=lambda one, many: one / many)
    speedup = statistics.median(t["speedup"] for t in turns)
    ceiling = statistics.median(c["speedup"] for c in ceilings)
    for t, c in zip(turns, ceilings, strict=True):
        c["bound"] = speedup_bound(t["one_s"], c["start_s"], c["speedup"])
    result = {"config": {"partitions": len(keys), "rows_per_partition": rows, "workers": workers,
                         "repeat": args.repeat},
              "turns": turns, "speedup": round(speedup, 3), "target": TARGET_SPEEDUP,
              "met": speedup >= TARGET_SPEEDUP,
              "host": {"turns": ceilings, "speedup": round(ceiling, 3),
                       "bound": round(statistics.median(c["bound"] for c in ceilings), 3),
                       "share": round(statistics.median(t["speedup"] / c["speedup"] for t, c in zip(turns, ceilings, strict=True)), 3)}}
    if cores and all(c["one"] and c["many"] for c in cores):
        idle_beyond_start = []
        for t, c, h in zip(turns, cores, ceilings, strict=True):
            c["bound"] = work_bound(t["one_s"], h["start_s"], c["one"]["busy_s"], h["speedup"])
            c["floor_bound"] = floor_bound(t["one_s"], h["start_s"], c["one"]["busy_s"], h["speedup"], h["floor_s"])
            idle_beyond_start.append(c["many"]["idle_s"] - (workers - 1) * h["start_s"])
        result["cores"] = {"turns": cores,
                           "work": round(statistics.median(c["many"]["busy_s"] / c["one"]["busy_s"] for c in cores), 3),
                           "bound": round(statistics.median(c["bound"] for c in cores), 3),
                           "floor_bound": round(statistics.median(c["floor_bound"] for c in cores), 3),
                           "floor_s": round(statistics.median(h["floor_s"] for h in ceilings), 2),
                           "idle_beyond_start_s": round(statistics.median(idle_beyond_start), 2)}
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
    """The workers' turns against the target, then the host's own ceiling in the same turns.

    Example:
        >>> result = {"config": {"partitions": 16, "rows_per_partition": 20000, "workers": 2},
        ...     "turns": [{"one_s": 9.0, "many_s": 6.0, "speedup": 1.5}], "speedup": 1.5, "target": 1.6, "met": False,
        ...     "host": {"turns": [{"one_s": 2.0, "many_s": 1.1, "speedup": 1.818, "start_s": 3.0, "bound": 1.402}],
        ...              "speedup": 1.818, "bound": 1.402, "share": 0.825}}
        >>> print(render_workers(result))
        backfill of 16 partitions x 20,000 rows: 1 process against 2, each on a new home prepared before the clock
        turn    1 worker  2 workers  speedup
        1           9.0s       6.0s    1.500
        median speedup 1.500 (target >= 1.6): NOT met
        this host's ceiling in the same turns: a CPU-bound loop split over 2 processes at once; a backfill's start on one core; the most the workers could gain
        1           2.0s       1.1s    1.818      3.0s    1.402
        median 1.818; the workers' speedup is 0.825 of it; the most they could gain 1.402

    Where the cores' time was read (Linux), a third table:

        >>> result["cores"] = {"turns": [{"one": {"busy_s": 10.0, "idle_s": 8.0, "stolen_s": 0.0},
        ...                               "many": {"busy_s": 11.0, "idle_s": 3.5, "stolen_s": 0.0}, "bound": 1.25,
        ...                               "floor_bound": 1.4}],
        ...                    "work": 1.1, "bound": 1.25, "floor_bound": 1.4, "floor_s": 1.3, "idle_beyond_start_s": 0.5}
        >>> print(render_workers(result).split("\\n", 7)[7])
        the machine's cores during each backfill, in seconds of all cores (PostgreSQL's work included); the most the workers could gain doing no more work than 1
        turn  1 worker busy    idle  2 workers busy    idle    bound at floor
        1             10.0s    8.0s           11.0s    3.5s    1.250    1.400
        median: 2 workers took 1.100 x the work of 1; their cores sat idle 0.5s beyond 1 x the start, while one core ran it
        with no more work than 1 worker's, shared at the host's ceiling after the start, 2 workers could gain at most 1.250
        and with the start cut to its floor (1.3s: Dagster and its PostgreSQL storage imported, nothing else), at most 1.400
    """
    c = result["config"]
    text = render_turns(
        f"backfill of {c['partitions']} partitions x {c['rows_per_partition']:,} rows: 1 process against "
        f"{c['workers']}, each on a new home prepared before the clock",
        ("1 worker", f"{c['workers']} workers", "speedup"), ("one_s", "many_s", "speedup"), result,
        f"median speedup {result['speedup']:.3f} (target >= {result['target']})")
    host = result.get("host")
    if not host:
        return text
    lines = [text, f"this host's ceiling in the same turns: a CPU-bound loop split over {c['workers']} processes at once;"
                   " a backfill's start on one core; the most the workers could gain"]
    lines += [f"{i:<5} {t['one_s']:>9.1f}s {t['many_s']:>9.1f}s {t['speedup']:>8.3f} {t['start_s']:>8.1f}s {t['bound']:>8.3f}"
              for i, t in enumerate(host["turns"], 1)]
    lines.append(f"median {host['speedup']:.3f}; the workers' speedup is {host['share']:.3f} of it;"
                 f" the most they could gain {host['bound']:.3f}")
    cores = result.get("cores")
    if cores:
        n = c["workers"]
        lines += ["the machine's cores during each backfill, in seconds of all cores (PostgreSQL's work included);"
                  " the most the workers could gain doing no more work than 1",
                  f"{'turn':<5} {'1 worker busy':>13} {'idle':>7} {f'{n} workers busy':>15} {'idle':>7} {'bound':>8}"
                  f" {'at floor':>8}"]
        lines += [f"{i:<5} {t['one']['busy_s']:>12.1f}s {t['one']['idle_s']:>6.1f}s {t['many']['busy_s']:>14.1f}s"
                  f" {t['many']['idle_s']:>6.1f}s {t['bound']:>8.3f} {t['floor_bound']:>8.3f}"
                  for i, t in enumerate(cores["turns"], 1)]
        lines.append(f"median: {n} workers took {cores['work']:.3f} x the work of 1; their cores sat idle"
                     f" {cores['idle_beyond_start_s']:.1f}s beyond {n - 1} x the start, while one core ran it")
        lines.append(f"with no more work than 1 worker's, shared at the host's ceiling after the start, {n} workers"
                     f" could gain at most {cores['bound']:.3f}")
        lines.append(f"and with the start cut to its floor ({cores['floor_s']:.1f}s: Dagster and its PostgreSQL"
                     f" storage imported, nothing else), at most {cores['floor_bound']:.3f}")
    return "\n".join(lines)
