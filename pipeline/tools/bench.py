"""``stormlake bench``: what Dagster and the ledger cost on top of the bare transforms.

All measurements run side by side in one invocation, on the same generated data, in a scratch
home ``$STORMLAKE_HOME/bench`` (wiped at the start):

``bench/landing``
    the generated scenario (``--partitions`` partitions of ``--rows-per-partition`` outage rows:
    the first ``ceil(P / days)`` regions of the region list over ``days`` days, 2 unless more
    are needed; the first P keys in (day, region) order are run). Generated once, before any
    timed run, and shared read-only by every run (``STORMLAKE_LANDING``).
``bench/bare-<n>``
    (a) **bare**: a plain loop over the partitions calling each phase's own ``compute`` (in the
    order of :data:`assets.phases.PHASES`) with a :class:`BareContext`: a read is the partition
    of a table as this loop wrote it, kept in memory (as the pipeline's lake keeps a partition
    it wrote for a later reader in the same process), outside calls are made directly, and no
    fault is injected. Each partition of every table a phase returns is written by a predicate
    overwrite (``write_deltalake``) into the run's own lake, through one table handle kept per
    table and with a phase's tables written at once (:func:`resources.lake.at_once`), as the
    pipeline writes them; the artifacts by the same file target as the pipeline's. No Dagster
    run, no ledger.
``bench/pipeline-<n>``
    (b) **pipeline**: :func:`pipeline.backfill.run_backfill` (``stormlake backfill``: a Dagster
    backfill, with a daemon started for it), then (c) **rerun**: the same call again over the
    published partitions of the fastest pipeline sample (every phase skips: no backfill).
``bench/resume-<n>``
    (d) **resume**: a fresh home and database. A first run with
    ``STORMLAKE_FAULTS=correlate.mid_transform=raise`` fails every partition inside correlate
    (ingest and enrich completed); the timed second run, without the fault, completes them.
    ``resume_target`` is the share of the phases from correlate on in the clean run (b), from
    the ledger's checkpoints (``completed_at - created_at`` of each head, summed per phase), + 0.05.

(e) **checkpoint_commit_ms**: 4 writer processes, each with its own :class:`Ledger` (own pool),
claim (``Ledger.claim``), record the phase's calls, then ``complete()`` checkpoints of
distinct partitions, :data:`COMMIT_ITERATIONS` times each; the latency of ``complete()`` (the
checkpoint commit transaction) gives p50 and p99. Same server as (b), its own database.

``--repeat N`` (default 3): (a), (b) and (d) take turns N times (bare, pipeline, resume, bare,
pipeline, resume, ...), each time on a fresh lake, home and database; each run's figures are
those of its fastest sample (as ``timeit`` reports the best of its repeats: on a shared machine
the slower samples measure the neighbours), and every sample's wall time is listed (``samples``
in the JSON, a column of the table). The ratios ``pipeline_vs_bare`` and ``resume_vs_pipeline``
are measured side by side: each turn's own (its pipeline over its bare, its resume over its
pipeline, and its target from its pipeline's phase seconds) are listed under ``turns``, and
``ratios`` holds their median. A machine that changes speed during the bench (a shared host
does) then moves both sides of a ratio together, where fastest-over-fastest could pair a
sample of a fast minute with one of a slow minute. A failed sample fails the bench, and so does
a turn whose bare and pipeline lakes hold different rows of the last phase's tables
(``region_day_summary``).

Every run is its own child process (``python -m pipeline.tools.bench --child STAGE SPEC``), so that
its peak RSS (``ru_maxrss``) is its own; the child reports through a JSON file (its stdout goes
to stderr). The timed section of a child starts after its imports and set-up (the Dagster
instance and the ledger schema exist already) and ends when its last partition is done; rows/s
is outage rows (partitions x rows per partition) / wall seconds.

The ledger of each stage is a fresh database ``stormlake_bench_<n>`` (and Dagster's run and
event storage a fresh ``stormlake_bench_<n>_dagster``) on the server of ``STORMLAKE_PG_DSN``,
or on the embedded server in ``$STORMLAKE_HOME/pg`` when it is not set; all are dropped at the
end. ``STORMLAKE_WEBHOOK_URL`` is not passed to the runs: a benchmark delivers to files only.

``--json`` prints contract section 9: ``config`` (with ``repeat``), ``runs`` (``bare``, ``pipeline``, ``rerun``,
``resume``), ``ratios`` (``pipeline_vs_bare``, ``rerun_vs_pipeline``, ``resume_vs_pipeline``,
``resume_target``), ``turns`` (each turn's ratios) and, at the top level, ``checkpoint_commit_ms`` (``p50``, ``p99``) and
``samples`` (the wall seconds of every sample of ``bare``, ``pipeline`` and ``resume``).
``--skip resume,commit`` leaves those measurements (and their keys) out. Without ``--json`` a
table with the figures and the targets (met / not met) is printed; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assets.context import PartitionRef, PhaseInputs
from assets.phases import PHASES, Phase
from resources.files import write_atomic
from resources.lake import at_once, table_configuration

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from resources.landing import Landing
    from resources.publisher import FileTarget

DEFAULTS = {"partitions": 8, "rows_per_partition": 200_000}
SKIPPABLE = ("resume", "commit")
COMMIT_WRITERS = 4
COMMIT_ITERATIONS = 250
FAULT_PHASE = "correlate"  # the phase every partition of the resume measurement first fails in
FAULT = f"{FAULT_PHASE}.mid_transform=raise"
# The phases a resumed run still has to do: the faulted one and those after it.
RESUMED_PHASES = tuple(p.name for p in PHASES[[p.name for p in PHASES].index(FAULT_PHASE):])
TARGETS = {
    "pipeline_vs_bare": 1.15,
    "rerun_vs_pipeline": 0.05,
    "pipeline_peak_rss_mb": 2048.0,
    "commit_p50_ms": 2.0,
    "commit_p99_ms": 10.0,
}
# Settings a run must not inherit from the caller: the scratch home decides them.
_SCRUB = ("STORMLAKE_LANDING", "STORMLAKE_LAKE", "STORMLAKE_PUBLISH_DIR", "STORMLAKE_WEBHOOK_URL",
          "STORMLAKE_FAULTS", "STORMLAKE_DAGSTER_PG_URL", "DAGSTER_HOME")


def _say(msg: str) -> None:
    sys.stderr.write(f"bench: {msg}\n")
    sys.stderr.flush()


# ---- partitions and data -----------------------------------------------------------------
def plan_partitions(count: int, region_ids: list[str], first_day: str) -> tuple[int, int, list[str]]:
    """``(regions, days, keys)``: the regions × days to generate and the ``count`` keys to run.

    Example:
        >>> plan_partitions(8, ["a", "b", "c", "d", "e", "f"], "2026-09-01")[:2]
        (4, 2)
    """
    from resources.errors import ConfigError

    if count < 1:
        raise ConfigError("--partitions must be at least 1")
    days = 1 if count == 1 else max(2, math.ceil(count / len(region_ids)))
    n_regions = math.ceil(count / days)
    start = dt.date.fromisoformat(first_day)
    keys = [f"{(start + dt.timedelta(days=d)).isoformat()}|{rid}"
            for d in range(days) for rid in region_ids[:n_regions]]
    return n_regions, days, keys[:count]


# ---- databases ---------------------------------------------------------------------------
class Databases:
    """Fresh databases for the bench on the ledger's server, dropped by :meth:`drop_all`."""

    def __init__(self, pg_dsn: str | None, pgdata: Path):
        from resources.pgserver import embedded_server_dsn

        self.embedded = not pg_dsn
        self.admin = pg_dsn or embedded_server_dsn(pgdata)
        self.prefix = f"stormlake_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.count = 0
        self.names: list[str] = []

    def create(self) -> tuple[str, str]:
        """Create a ledger database (migrated); return its DSN and that of Dagster's storage next to
        it, which the deployment's first command makes (``pipeline.instance.ensure_dagster_storage``)."""
        import psycopg

        from resources.errors import ConfigError
        from resources.ledger import Ledger
        from resources.pgserver import create_database, with_database

        self.count += 1
        ledger_db = f"{self.prefix}_{self.count}"
        try:
            create_database(self.admin, ledger_db)
        except psycopg.Error as exc:
            raise ConfigError(f"bench: cannot create the scratch database {ledger_db} on the ledger's server "
                              f"({exc.__class__.__name__}); the bench needs the CREATEDB right") from exc
        self.names += [ledger_db, f"{ledger_db}_dagster", f"{ledger_db}_dagster_new"]
        dsns = [with_database(self.admin, ledger_db), with_database(self.admin, f"{ledger_db}_dagster")]
        led = Ledger(dsns[0])
        try:
            led.migrate()
        finally:
            led.close()
        return dsns[0], dsns[1]

    def drop_all(self) -> None:
        import psycopg

        from resources.pgserver import drop_database

        for name in reversed(self.names):
            try:
                drop_database(self.admin, name)
            except psycopg.Error as exc:
                _say(f"could not drop the scratch database {name}: {exc.__class__.__name__}: {exc}")
        self.names.clear()


def phase_seconds(ledger_dsn: str) -> dict[str, float]:
    """Seconds per phase: the time one or more of its partitions was in flight (claim to commit)."""
    from resources.ledger import Ledger
    from resources.ledger_views import LedgerViews

    ledger = Ledger(ledger_dsn)
    try:
        return LedgerViews(ledger).phase_seconds()
    finally:
        ledger.close()


# ---- children ----------------------------------------------------------------------------
def _child_env(home: Path, landing: Path, ledger_dsn: str | None, faults: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update({
        "STORMLAKE_HOME": str(home),
        "STORMLAKE_LANDING": str(landing),
        "STORMLAKE_LAKE": str(home / "lake"),
        "STORMLAKE_PUBLISH_DIR": str(home / "published"),
        "DAGSTER_HOME": str(home / "dagster"),
        "PYTHONUNBUFFERED": "1",
    })
    if ledger_dsn:
        env["STORMLAKE_PG_DSN"] = ledger_dsn
    else:
        env.pop("STORMLAKE_PG_DSN", None)
    if faults:
        env["STORMLAKE_FAULTS"] = faults
    return env


def run_child(stage: str, spec: dict[str, Any], env: dict[str, str], workdir: Path) -> dict[str, Any]:
    """Run one stage in a fresh interpreter; return its result (``ok`` False when it broke)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"{stage}.spec.json"
    out_path = workdir / f"{stage}.result.json"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(dict(spec, stage=stage, out=str(out_path))))
    cmd = [sys.executable, "-m", "pipeline.tools.bench", "--child", stage, str(spec_path)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=sys.stderr.fileno(), stderr=None, check=False)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0 or not out_path.exists():
        return {"ok": False, "error": f"child {stage} exited with {proc.returncode} after {elapsed:.1f}s"}
    return json.loads(out_path.read_text())


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _regions_by_id() -> dict[str, Any]:
    from resources.settings import load_regions, load_settings

    return {r.region_id: r for r in load_regions(load_settings().regions_file)}


# ---- (a) bare: the phases' compute functions in a plain loop ---------------------------------
@dataclass(frozen=True)
class BareCheckpoint:
    """What a later phase reads of an earlier one's checkpoint: ``summary["rows"]`` (rows per table)
    and ``summary["figures"]`` (what the phase measured)."""

    summary: dict[str, Any]


class BareContext(PhaseInputs):
    """What a phase's compute function uses, served by the bare loop instead of the ledger.

    A read is the partition of a table as the loop wrote it, kept in memory, as the pipeline's
    lake keeps a partition it wrote for a later reader in the same process; ``upstream`` holds
    the checkpoints of the phases already run for the partition; an outside call is made
    directly and no fault is injected.
    """

    def __init__(self, phase: Phase, landing: Landing, partition: PartitionRef, known_regions: list[str],
                 written: dict[str, pa.Table], upstream: dict[str, BareCheckpoint]):
        self.phase = phase
        self.landing = landing
        self.partition = partition
        self.known_regions = known_regions
        self.written = written
        self.upstream = upstream

    def read_arrow(self, table: str) -> pa.Table:
        """This partition of ``table``, as written to the loop's lake (in the table's schema)."""
        return self.written[table]

    def fault_point(self) -> None:
        """No fault is injected in the bare loop."""

    def call(self, kind: str, name: str, input: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Make the call: the bare loop records nothing."""
        return fn()


class BareLoop:
    """Runs every phase of a partition through its ``compute`` and writes what it returns."""

    def __init__(self, lake: str, landing: Landing, known_regions: list[str], target: FileTarget,
                 log_retention_minutes: int):
        import importlib

        self.lake = lake
        self.landing = landing
        self.known_regions = known_regions
        self.target = target
        self.configuration = table_configuration(log_retention_minutes)  # the pipeline's tables' properties
        self.handles: dict[str, Any] = {}  # one DeltaTable per table, kept: this loop is its only writer
        # A phase's compute function lives in the module of the phase's name (assets/ingest.py, ...).
        self.steps = [(phase, importlib.import_module(f"assets.{phase.name}").compute) for phase in PHASES]

    def create_tables(self) -> None:
        from deltalake import DeltaTable

        from assets.schemas import PARTITION_COLUMNS, SCHEMAS

        Path(self.lake).mkdir(parents=True, exist_ok=True)
        for table, schema in SCHEMAS.items():
            DeltaTable.create(f"{self.lake}/{table}", schema, mode="ignore", partition_by=PARTITION_COLUMNS,
                              configuration=self.configuration)
            self.handles[table] = DeltaTable(f"{self.lake}/{table}")

    def run_partition(self, part: PartitionRef) -> dict[str, float]:
        """Every phase of the partition in order; the seconds each took (compute, writes, deliveries)."""
        written: dict[str, pa.Table] = {}
        upstream: dict[str, BareCheckpoint] = {}
        seconds: dict[str, float] = {}
        for phase, compute in self.steps:
            t = time.perf_counter()
            out = compute(BareContext(phase, self.landing, part, self.known_regions, written, upstream))
            # the phase's tables written at once, as the pipeline writes them (resources.lake.at_once)
            done = at_once([partial(self.write, table, out.tables[table], part) for table in phase.tables])
            for table, data in zip(phase.tables, done, strict=True):
                if isinstance(data, BaseException):
                    raise data
                written[table] = data
            for artifact in out.artifacts:
                self.target.deliver(artifact, supersedes=None)
            upstream[phase.name] = BareCheckpoint({"rows": {t: d.num_rows for t, d in out.tables.items()},
                                                   "figures": out.figures})
            seconds[phase.name] = time.perf_counter() - t
        return seconds

    def write(self, table: str, data: pa.Table, part: PartitionRef) -> pa.Table:
        """Replace the partition of ``table`` with ``data`` (a predicate overwrite); the rows written."""
        from deltalake import write_deltalake

        from assets.schemas import PARTITION_COLUMNS, SCHEMAS

        schema = SCHEMAS[table]
        data = data.select(schema.names).cast(schema)
        predicate = f"region_id = '{part.region.region_id}' AND day = '{part.day}'"
        write_deltalake(self.handles[table], data, mode="overwrite", predicate=predicate,
                        partition_by=PARTITION_COLUMNS)
        return data


def _child_bare(spec: dict[str, Any]) -> dict[str, Any]:
    from assets.context import PartitionRef
    from assets.runner import prepare_process
    from resources.landing import Landing
    from resources.publisher import FileTarget
    from resources.settings import load_settings

    prepare_process()  # the same allocator and collector settings as a process running the pipeline
    settings = load_settings()
    regions = _regions_by_id()
    loop = BareLoop(settings.lake, Landing(settings.landing), sorted(regions), FileTarget(settings.publish_dir),
                    settings.lake_log_retention_minutes)
    keys = spec["keys"]
    phases = dict.fromkeys((p.name for p in PHASES), 0.0)
    t0 = time.perf_counter()
    loop.create_tables()
    for n, key in enumerate(keys, 1):
        t = time.perf_counter()
        for name, sec in loop.run_partition(PartitionRef.parse(key, regions)).items():
            phases[name] += sec
        _say(f"bare {n}/{len(keys)} {key} {time.perf_counter() - t:.1f}s")
    wall = time.perf_counter() - t0
    return {"ok": True, "wall_s": wall, "peak_rss_mb": _rss_mb(), "phases": phases}


def _point_dagster(dagster_dsn: str) -> None:
    """Aim this process's Dagster instance at the bench's own storage database."""
    import psycopg

    from pipeline.instance import DAGSTER_URL_ENV, dagster_yaml, sqlalchemy_url

    url = sqlalchemy_url(dagster_dsn)
    secret = bool(psycopg.conninfo.conninfo_to_dict(dagster_dsn).get("password"))
    if secret:
        os.environ[DAGSTER_URL_ENV] = url
    (Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml").write_text(dagster_yaml(None if secret else url))


def _child_pipeline(spec: dict[str, Any]) -> dict[str, Any]:
    from resources.settings import load_settings

    settings = load_settings()  # the environment was set by the parent before this process started
    from pipeline.instance import prepare_dagster_home

    prepare_dagster_home(settings)
    _point_dagster(spec["dagster_dsn"])
    import dagster as dg

    import pipeline.definitions  # noqa: F401  (builds the resources from the scratch environment)
    from pipeline.backfill import run_backfill
    from pipeline.progress import Progress

    with dg.DagsterInstance.get():
        pass  # storage schema created and connection checked before the clock starts
    keys = spec["keys"]
    t = time.perf_counter()
    progress = Progress(len(keys))
    runs, _lines = run_backfill(settings, keys, workers=None, force=None, progress=progress)
    progress.close()
    wall = time.perf_counter() - t
    statuses: dict[str, dict[str, int]] = {}
    for run in runs:
        for phase, status in run.phases.items():
            statuses.setdefault(phase, {}).setdefault(status, 0)
            statuses[phase][status] += 1
    return {
        "ok": all(r.ok for r in runs),
        "wall_s": wall,
        "peak_rss_mb": _rss_mb(),
        "statuses": statuses,
        "launched": sum(any(st == "COMPLETED" for st in r.phases.values()) for r in runs),
        "errors": sorted({r.error for r in runs if r.error})[:3],
        "partition_seconds": [round(r.seconds, 3) for r in runs],
    }


def _commit_worker(dsn: str, writer: int, iterations: int, day: str, start, queue) -> None:  # noqa: ANN001
    import hashlib

    from assets.phases import PHASES
    from resources.ledger import Ledger

    led = Ledger(dsn)
    led.heads(["warm-up"])  # opens the pool before the clock
    latencies: list[float] = []
    start.wait()
    try:
        for i in range(iterations):
            phase = PHASES[i % len(PHASES)]
            region = f"bench_w{writer}_{i // len(PHASES)}"
            key = f"{day}|{region}"
            ih = hashlib.sha256(f"{key}|{phase.name}".encode()).hexdigest()
            decision = led.claim(partition_key=key, region_id=region, day=day, phase=phase.name, input_hash=ih,
                                  schema_version=phase.schema_version, code_version=phase.code_version,
                                  run_id=None)
            claim = decision.claim
            assert claim is not None
            for table in phase.tables:  # the phase's recorded Delta commits, as a real attempt has them
                led.record_call(claim, call_key=f"delta_commit:{table}:{i}", kind="delta_commit", name=table,
                                input={"partition": key, "content": ih},
                                output={"version": i, "written": True, "rows": 200_000})
            summary = {
                "rows": {t: 200_000 for t in phase.tables},
                "delta_versions": {t: i for t in phase.tables},
                "delta_written": {t: True for t in phase.tables},
                "figures": {"outages": 200_000, "cells": 1800, "customers_out": 123_456},
                "upstream": {name: ih for name in phase.upstream_phases},
                "artifacts": [], "delivered": [], "receipts": 0,
                "checks": {f"{t}.schema": True for t in phase.tables},
            }
            t = time.perf_counter()
            led.complete(claim, state_hash=ih, summary=summary, tier=phase.tier, tier_label=phase.tier_label,
                         run_id=None)
            latencies.append((time.perf_counter() - t) * 1000.0)
    finally:
        led.close()
        queue.put((writer, latencies))


def _child_commit(spec: dict[str, Any]) -> dict[str, Any]:
    import multiprocessing as mp

    import numpy as np

    from pipeline.tools.bench import _commit_worker  # by its module name, so that spawned workers find it

    ctx = mp.get_context("spawn")
    start = ctx.Event()
    queue = ctx.Queue()
    procs = [ctx.Process(target=_commit_worker, args=(spec["ledger_dsn"], w, spec["iterations"], spec["day"], start,
                                                      queue))
             for w in range(spec["writers"])]
    for p in procs:
        p.start()
    time.sleep(0.1)
    # Give every writer time to import and open its pool, then start them together.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _all_warm(spec["ledger_dsn"], spec["writers"]):
        time.sleep(0.2)
    t = time.perf_counter()
    start.set()
    results = [queue.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t
    for p in procs:
        p.join(30)
    lat = np.array([x for _, xs in results for x in xs])
    ok = all(p.exitcode == 0 for p in procs) and len(lat) == spec["writers"] * spec["iterations"]
    return {"ok": ok, "wall_s": wall, "peak_rss_mb": _rss_mb(), "samples": int(len(lat)),
            "p50": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99": float(np.percentile(lat, 99)) if len(lat) else None,
            "max": float(lat.max()) if len(lat) else None}


def _all_warm(dsn: str, writers: int) -> bool:
    """Whether ``writers`` client connections (one pool each) are open on the bench database."""
    from resources.ledger import Ledger
    from resources.ledger_views import LedgerViews

    ledger = Ledger(dsn)
    try:
        return LedgerViews(ledger).other_connections() >= writers
    finally:
        ledger.close()


CHILDREN = {"bare": _child_bare, "pipeline": _child_pipeline, "commit": _child_commit}


def child_main(argv: list[str]) -> int:
    """Entry point of a child: ``python -m pipeline.tools.bench --child STAGE SPEC``."""
    from pipeline.console import quiet_console

    quiet_console()
    p = argparse.ArgumentParser(prog="pipeline.tools.bench")
    p.add_argument("--child", required=True)
    p.add_argument("spec")
    ns = p.parse_args(argv)
    spec = json.loads(Path(ns.spec).read_text())
    kind = spec.get("kind", ns.child)
    result = CHILDREN[kind](spec)
    write_atomic(spec["out"], json.dumps(result))
    return 0


# ---- the parent --------------------------------------------------------------------------
@dataclass
class Scratch:
    """Where one bench's runs happen: the scenario they share, their homes and databases."""

    bench: Path  # $STORMLAKE_HOME/bench: a home per run below it
    landing: Path  # the generated scenario, read-only for every run
    work: Path  # the children's spec and result files
    keys: list[str]  # the partitions every run runs
    dbs: Databases

    def env(self, home: Path, ledger_dsn: str | None, faults: str | None = None) -> dict[str, str]:
        return _child_env(home, self.landing, ledger_dsn, faults)

    def run(self, stage: str, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        """Run one child and report it on stderr under its measurement (``stage`` up to a ``-``); its result."""
        res = run_child(stage, spec, env, self.work)
        _report_stage(stage.split("-")[0], res)
        return res


@dataclass
class Tally:
    """What the runs gave: each measurement's fastest result and the wall seconds of every sample."""

    samples: dict[str, list[float | None]]  # the measurements taking turns, sample by sample
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    turn_phases: list[dict[str, float] | None] = field(default_factory=list)  # each turn's pipeline phase seconds
    extra: dict[str, Any] = field(default_factory=dict)
    best_pipeline: tuple[Path, dict[str, Any], str] | None = None  # home, spec, ledger DSN of the fastest
    disagreements: list[str] = field(default_factory=list)

    def add(self, name: str, res: dict[str, Any]) -> bool:
        """Count a sample of ``name``; whether it is now that measurement's fastest."""
        self.samples[name].append(res.get("wall_s") if res.get("ok") else None)
        self.results[name] = _faster(self.results.get(name), res)
        return self.results[name] is res


def _run_figures(res: dict[str, Any] | None, rows: int) -> dict[str, float] | None:
    if not res or not res.get("ok") or not res.get("wall_s"):
        return None
    wall = float(res["wall_s"])
    return {"wall_s": round(wall, 3), "rows_per_s": round(rows / wall, 1), "peak_rss_mb": round(float(res["peak_rss_mb"]), 1)}


def _ratio(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
    if not a or not b or not b["wall_s"]:
        return None
    return round(a["wall_s"] / b["wall_s"], 4)


def _published_rows(home: Path) -> dict[str, list[dict[str, Any]]]:
    """The rows of the last phase's tables in a run's lake, in partition order."""
    from deltalake import DeltaTable

    from assets.schemas import SCHEMAS

    rows = {}
    for table in PHASES[-1].tables:
        data = DeltaTable(str(home / "lake" / table)).to_pyarrow_dataset().to_table(use_threads=False)
        rows[table] = sorted(data.select(SCHEMAS[table].names).to_pylist(), key=lambda r: (r["region_id"], r["day"]))
    return rows


def _same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two lists of rows are equal, NaN equal to NaN."""
    def same(x: Any, y: Any) -> bool:
        return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))

    return len(a) == len(b) and all(ra.keys() == rb.keys() and all(same(ra[k], rb[k]) for k in ra)
                                    for ra, rb in zip(a, b, strict=True))


def _compare_lakes(r: int, bare: dict[str, list[dict[str, Any]]] | None,
                   pipeline: dict[str, list[dict[str, Any]]] | None, tally: Tally) -> None:
    """Turn ``r``: the bare and the pipeline run must have written the same rows of the last phase."""
    if bare is None or pipeline is None:
        return  # a failed run is reported as such
    for table in PHASES[-1].tables:
        if _same_rows(bare[table], pipeline[table]):
            _say(f"turn {r}: bare and pipeline wrote the same {table} rows ({len(bare[table])})")
        else:
            tally.disagreements.append(f"turn {r}: bare and pipeline wrote different {table} rows")


def _bare_sample(r: int, of: str, scratch: Scratch, tally: Tally) -> dict[str, list[dict[str, Any]]] | None:
    """(a), sample ``r``; the rows of the last phase's tables it wrote."""
    home = scratch.bench / f"bare-{r}"
    _say(f"(a) bare{of}: the phases' compute functions + Delta writes, no Dagster run, no ledger")
    bare = scratch.run(f"bare-{r}", {"kind": "bare", "keys": scratch.keys}, scratch.env(home, None))
    rows = _published_rows(home) if bare.get("ok") else None
    shutil.rmtree(home, ignore_errors=True)
    tally.add("bare", bare)
    return rows


def _pipeline_sample(r: int, of: str, scratch: Scratch, tally: Tally) -> dict[str, list[dict[str, Any]]] | None:
    """(b), sample ``r``; the rows of the last phase's tables it wrote. The fastest sample's home is kept."""
    ledger_dsn, dagster_dsn = scratch.dbs.create()
    home = scratch.bench / f"pipeline-{r}"
    spec = {"kind": "pipeline", "keys": scratch.keys, "dagster_dsn": dagster_dsn}
    _say(f"(b) pipeline{of}: run_partitions through Dagster with the ledger")
    pipe = scratch.run(f"pipeline-{r}", spec, scratch.env(home, ledger_dsn))
    rows = _published_rows(home) if pipe.get("ok") else None
    tally.turn_phases.append(phase_seconds(ledger_dsn) if pipe.get("ok") else None)
    if tally.add("pipeline", pipe):
        if tally.best_pipeline is not None:
            shutil.rmtree(tally.best_pipeline[0], ignore_errors=True)
        tally.best_pipeline = (home, spec, ledger_dsn)
        tally.extra["pipeline_phases"] = tally.turn_phases[-1]
    else:
        shutil.rmtree(home, ignore_errors=True)
    return rows


def _resume_sample(r: int, of: str, scratch: Scratch, tally: Tally) -> None:
    """(d), sample ``r``: a run failing every partition in the faulted phase, then the timed resume."""
    ledger_dsn, dagster_dsn = scratch.dbs.create()
    spec = {"kind": "pipeline", "keys": scratch.keys, "dagster_dsn": dagster_dsn}
    home = scratch.bench / f"resume-{r}"
    _say(f"(d) resume{of}: first run with STORMLAKE_FAULTS={FAULT} (fails in {FAULT_PHASE}, as intended)")
    fault = run_child(f"resume-fault-{r}", spec, scratch.env(home, ledger_dsn, faults=FAULT), scratch.work)
    st = fault.get("statuses", {})
    if fault.get("ok") or st.get(FAULT_PHASE, {}).get("FAILED", 0) != len(scratch.keys):
        _say(f"warning: the faulted run did not fail every partition in {FAULT_PHASE}: {st}")
    tally.extra["resume_fault"] = fault
    _say(f"(d) resume{of}: the second run, timed")
    tally.add("resume", scratch.run(f"resume-{r}", spec, scratch.env(home, ledger_dsn)))
    shutil.rmtree(home, ignore_errors=True)


def _take_turn(r: int, repeat: int, scratch: Scratch, tally: Tally) -> None:
    """Turn ``r``: bare, pipeline (and resume), side by side; then compare what bare and pipeline wrote."""
    of = f" ({r}/{repeat})" if repeat > 1 else ""
    bare_rows = _bare_sample(r, of, scratch, tally)
    pipeline_rows = _pipeline_sample(r, of, scratch, tally)
    _compare_lakes(r, bare_rows, pipeline_rows, tally)
    if "resume" in tally.samples:
        _resume_sample(r, of, scratch, tally)


def _rerun(scratch: Scratch, tally: Tally) -> None:
    """(c): the fastest pipeline sample's partitions again, on its home and ledger."""
    assert tally.best_pipeline is not None
    home, spec, ledger_dsn = tally.best_pipeline
    _say("(c) rerun: the same partitions again")
    tally.results["rerun"] = scratch.run("rerun", spec, scratch.env(home, ledger_dsn))


def _measure_commits(scratch: Scratch, tally: Tally, day: str) -> None:
    """(e): concurrent writers committing checkpoints in a database of their own."""
    commit_dsn, _ = scratch.dbs.create()
    _say(f"(e) checkpoint commits: {COMMIT_WRITERS} writers x {COMMIT_ITERATIONS} claim+complete cycles")
    spec = {"kind": "commit", "ledger_dsn": commit_dsn, "writers": COMMIT_WRITERS,
            "iterations": COMMIT_ITERATIONS, "day": day}
    tally.results["commit"] = scratch.run("commit", spec, scratch.env(scratch.bench / "commit", commit_dsn))


def _parse_skip(args: argparse.Namespace) -> set[str]:
    """The measurements ``--skip`` leaves out, after checking the arguments."""
    from resources.errors import ConfigError

    skip = {s.strip() for s in (args.skip or "").split(",") if s.strip()}
    unknown = sorted(skip - set(SKIPPABLE))
    if unknown:
        raise ConfigError(f"--skip: unknown measurement(s) {', '.join(unknown)} (known: {', '.join(SKIPPABLE)})")
    if args.rows_per_partition < 1:
        raise ConfigError("--rows-per-partition must be at least 1")
    if args.repeat < 1:
        raise ConfigError("--repeat must be at least 1")
    return skip


def _prepare(args: argparse.Namespace, settings) -> Scratch:  # noqa: ANN001  (resources.settings.Settings)
    """A wiped ``$STORMLAKE_HOME/bench`` with the scenario generated into its landing zone."""
    from pipeline.tools.generate import generate_scenario
    from resources.settings import load_regions

    regions = load_regions(settings.regions_file)
    n_regions, days, keys = plan_partitions(args.partitions, [r.region_id for r in regions], settings.first_day)
    bench = settings.home / "bench"
    shutil.rmtree(bench, ignore_errors=True)
    bench.mkdir(parents=True)
    landing = bench / "landing"
    t = time.perf_counter()
    _say(f"generating {n_regions} regions x {days} days x {args.rows_per_partition:,} outage rows into {landing}")
    generate_scenario(landing, regions[:n_regions], days=days, start=settings.first_day,
                      rows_per_partition=args.rows_per_partition, seed=args.seed,
                      progress=lambda _s, done, total: _say(f"generated {done}/{total} partitions"))
    _say(f"generated in {time.perf_counter() - t:.1f}s; running {len(keys)} partitions")
    work = Path(tempfile.mkdtemp(prefix="work-", dir=bench))
    return Scratch(bench, landing, work, keys, Databases(settings.pg_dsn, settings.pgdata))


def bench_json(tally: Tally, partitions: int, rows_per_partition: int, repeat: int) -> dict[str, Any]:
    """The report of contract section 9 (plus ``samples``) from what the runs gave."""
    rows = partitions * rows_per_partition
    runs = {name: _run_figures(tally.results.get(name), rows) for name in ("bare", "pipeline", "rerun", "resume")
            if name in tally.results}
    turns = turn_ratios(tally.samples, tally.turn_phases)
    ratios: dict[str, float | None] = {
        "pipeline_vs_bare": _median([t.get("pipeline_vs_bare") for t in turns]),
        "rerun_vs_pipeline": _ratio(runs.get("rerun"), runs.get("pipeline")),
    }
    if "resume" in tally.results:
        ratios["resume_vs_pipeline"] = _median([t.get("resume_vs_pipeline") for t in turns])
        ratios["resume_target"] = _median([t.get("resume_target") for t in turns])
    out: dict[str, Any] = {"config": {"partitions": partitions, "rows_per_partition": rows_per_partition,
                                      "repeat": repeat},
                           "runs": runs, "ratios": ratios, "turns": turns,
                           "samples": {name: [None if w is None else round(w, 3) for w in ws]
                                       for name, ws in tally.samples.items()}}
    if "commit" in tally.results:
        c = tally.results["commit"]
        out["checkpoint_commit_ms"] = ({"p50": round(c["p50"], 3), "p99": round(c["p99"], 3)}
                                       if c.get("ok") else None)
    return out


def _failures(tally: Tally) -> list[str]:
    """What went wrong, one line each: failed runs, failed samples, bare and pipeline disagreeing."""
    failed = [name for name, res in tally.results.items() if not res.get("ok")]
    lines = [f"{name} failed: {tally.results[name].get('error') or tally.results[name].get('errors') or 'see the output above'}"
             for name in failed]
    lines += [f"{name} (sample {i}) failed: see the output above" for name, ws in tally.samples.items()
              for i, w in enumerate(ws, 1) if w is None and name not in failed]
    return lines + tally.disagreements


def run_bench(args: argparse.Namespace, settings) -> int:  # noqa: ANN001  (resources.settings.Settings)
    """Run the benchmark of the module docstring; print the table or the JSON; 0 when every run succeeded."""
    out, table, failures = measure_bench(args, settings)
    if args.json:
        sys.stderr.write(table + "\n")
        print(json.dumps(out, indent=2))
    else:
        print(table)
    for line in failures:
        _say(line)
    return 1 if failures else 0


def measure_bench(args: argparse.Namespace, settings) -> tuple[dict[str, Any], str, list[str]]:  # noqa: ANN001
    """The benchmark's figures (:func:`bench_json`), its table, and what went wrong (one line each)."""
    skip = _parse_skip(args)
    scratch = _prepare(args, settings)
    dbs = scratch.dbs
    tally = Tally(samples={name: [] for name in ("bare", "pipeline", "resume") if name not in skip})
    try:
        for r in range(1, args.repeat + 1):
            _take_turn(r, args.repeat, scratch, tally)
        _rerun(scratch, tally)
        if "commit" not in skip:
            _measure_commits(scratch, tally, settings.first_day)
    finally:
        dbs.drop_all()
    out = bench_json(tally, len(scratch.keys), args.rows_per_partition, args.repeat)
    table = render_table(out, tally.results, tally.extra, embedded=dbs.embedded)
    shutil.rmtree(scratch.work, ignore_errors=True)
    return out, table, _failures(tally)


def _share_target(phases: dict[str, float] | None) -> float | None:
    """Share of the resumed phases in a clean run's phase seconds, + 0.05: the resume target."""
    total = sum((phases or {}).values())
    if not phases or not total:
        return None
    return round(sum(phases.get(name, 0.0) for name in RESUMED_PHASES) / total + 0.05, 4)


def turn_ratios(samples: dict[str, list[float | None]],
                turn_phases: list[dict[str, float] | None]) -> list[dict[str, float | None]]:
    """Each turn's ratios, from the samples of that turn only (measured side by side).

    Example:
        >>> turn_ratios({"bare": [10.0], "pipeline": [11.0], "resume": [5.0]},
        ...             [{"ingest": 3.0, "enrich": 3.0, "correlate": 1.0, "present": 3.0}])
        [{'pipeline_vs_bare': 1.1, 'resume_vs_pipeline': 0.4545, 'resume_target': 0.45}]
    """
    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 4) if a and b else None

    out: list[dict[str, float | None]] = []
    for i, (bare, pipe) in enumerate(zip(samples["bare"], samples["pipeline"], strict=True)):
        turn: dict[str, float | None] = {"pipeline_vs_bare": ratio(pipe, bare)}
        if "resume" in samples:  # one of each per turn
            turn["resume_vs_pipeline"] = ratio(samples["resume"][i], pipe)
            turn["resume_target"] = _share_target(turn_phases[i])
        out.append(turn)
    return out


def _median(values: list[float | None]) -> float | None:
    """The median of the known values; None if there are none."""
    import statistics

    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def _faster(best: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The faster of two results of the same measurement; a failed one never wins over a good one."""
    if best is None or (not best.get("ok") and new.get("ok")):
        return new
    if new.get("ok") and float(new["wall_s"]) < float(best["wall_s"]):
        return new
    return best


def _report_stage(name: str, res: dict[str, Any]) -> None:
    if not res.get("ok"):
        _say(f"{name}: FAILED {res.get('error') or res.get('errors')}")
    else:
        _say(f"{name}: {res['wall_s']:.2f}s, peak RSS {res['peak_rss_mb']:.0f} MB")


# ---- the table ---------------------------------------------------------------------------
def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def _run_lines(out: dict[str, Any]) -> list[str]:
    """One line per run: its fastest sample's figures, and every sample when there are several."""
    cfg = out["config"]
    samples = out.get("samples", {})
    lines = [f"{'run':<10}{'wall s':>10}{'rows/s':>14}{'peak RSS MB':>14}  samples (s)"]
    for name, fig in out["runs"].items():
        each = ", ".join("failed" if w is None else f"{w:.2f}" for w in samples.get(name, []))
        if fig is None:
            lines.append(f"{name:<10}{'failed':>10}")
        else:
            lines.append(f"{name:<10}{fig['wall_s']:>10.2f}{fig['rows_per_s']:>14,.0f}{fig['peak_rss_mb']:>14.0f}"
                         + (f"  {each}" if len(samples.get(name, [])) > 1 else ""))
    if cfg.get("repeat", 1) > 1:
        turns = "bare, pipeline and resume" if "resume" in out["runs"] else "bare and pipeline"
        lines.append(f"({turns} took turns {cfg['repeat']} times; each run's figures are its fastest sample;"
                     " the ratios are the median of each turn's own)")
    return lines


def _phase_lines(bare: dict[str, float], pipeline: dict[str, float]) -> list[str]:
    """Seconds per phase of the bare run (summed over its partitions, one at a time) and of the
    pipeline (the time the phase had a partition in flight)."""
    if not bare and not pipeline:
        return []
    names = [p.name for p in PHASES]
    lines = ["", f"{'phase seconds (all partitions)':<34}" + "".join(f"{name:>11}" for name in names)]
    for label, ph in (("bare (in the loop)", bare), ("pipeline (in flight, ledger)", pipeline)):
        if ph:
            lines.append(f"{label:<34}" + "".join(f"{ph.get(name, 0.0):>11.2f}" for name in names))
    return lines


def _target_rows(out: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(label, value, target, met?) of every figure that has a target."""
    r, runs = out["ratios"], out["runs"]
    rows = []

    def add(label: str, value: float | None, target: str, limit: float | None, fmt: str = "{:.3f}") -> None:
        ok = None if value is None or limit is None else value <= limit
        rows.append((label, "-" if value is None else fmt.format(value), target, _mark(ok)))

    add("pipeline / bare (wall)", r.get("pipeline_vs_bare"), f"<= {TARGETS['pipeline_vs_bare']}",
        TARGETS["pipeline_vs_bare"])
    add("rerun / pipeline (wall)", r.get("rerun_vs_pipeline"), f"<= {TARGETS['rerun_vs_pipeline']}",
        TARGETS["rerun_vs_pipeline"])
    p = runs.get("pipeline")
    add("pipeline peak RSS (MB)", p["peak_rss_mb"] if p else None, f"<= {TARGETS['pipeline_peak_rss_mb']:.0f}",
        TARGETS["pipeline_peak_rss_mb"], "{:.0f}")
    if "resume_vs_pipeline" in r:
        tgt = r.get("resume_target")
        add("resume / pipeline (wall)", r.get("resume_vs_pipeline"),
            "-" if tgt is None else f"<= {tgt:.3f} (share+0.05)", tgt)
    if "checkpoint_commit_ms" in out:
        c = out["checkpoint_commit_ms"] or {}
        add("checkpoint commit p50 (ms)", c.get("p50"), f"<= {TARGETS['commit_p50_ms']}", TARGETS["commit_p50_ms"])
        add("checkpoint commit p99 (ms)", c.get("p99"), f"<= {TARGETS['commit_p99_ms']}", TARGETS["commit_p99_ms"])
    return rows


def _turn_lines(turns: list[dict[str, float | None]]) -> list[str]:
    """Each turn's own ratios, when there was more than one turn."""
    if len(turns) < 2:
        return []

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    return ["", "per turn (side by side)   pipeline/bare   resume/pipeline   resume target"] + [
        f"turn {i:<21}{fmt(t.get('pipeline_vs_bare')):>14}{fmt(t.get('resume_vs_pipeline')):>18}"
        f"{fmt(t.get('resume_target')):>16}" for i, t in enumerate(turns, 1)]


def render_table(out: dict[str, Any], results: dict[str, dict[str, Any]], extra: dict[str, Any], *,
                 embedded: bool) -> str:
    """The human-readable report: runs, phase seconds, targets."""
    cfg = out["config"]
    lines = [f"stormlake bench: {cfg['partitions']} partitions x {cfg['rows_per_partition']:,} outage rows "
             f"({cfg['partitions'] * cfg['rows_per_partition']:,} rows); ledger on "
             f"{'the embedded PostgreSQL' if embedded else 'STORMLAKE_PG_DSN'}", ""]
    lines += _run_lines(out)
    lines += _phase_lines(results.get("bare", {}).get("phases") or {}, extra.get("pipeline_phases") or {})
    lines += ["", f"{'target':<30}{'value':>10}  {'target':<26}{'':>2}"]
    lines += [f"{a:<30}{b:>10}  {c:<26}{d}" for a, b, c, d in _target_rows(out)]
    lines += _turn_lines(out.get("turns") or [])
    rerun = results.get("rerun", {})
    if rerun.get("ok"):
        lines += ["", f"rerun: {rerun.get('launched', 0)} partitions computed, phases {rerun.get('statuses')}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
