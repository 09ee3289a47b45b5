"""``stormlake bench``: what Dagster and the ledger cost on top of the bare transforms.

All measurements run side by side in one invocation, on the same generated data, in a scratch
home ``$STORMLAKE_HOME/bench`` (wiped at the start):

``bench/landing``
    the generated scenario (``--partitions`` partitions of ``--rows-per-partition`` outage rows:
    the first ``ceil(P / days)`` regions of the region list over ``days`` days, 2 unless more
    are needed; the first P keys in (day, region) order are run). Generated once, before any
    timed run, and shared read-only by every run (``STORMLAKE_LANDING``).
``bench/bare-<n>``
    (a) **bare**: a plain loop over the partitions calling the transform functions
    (``ingest_partition``, ``enrich_outages``, ``correlate_storm``, ``summarize``,
    ``render_artifacts``) with the data passed in memory (as Arrow tables, converted to pandas
    exactly as the phases read them), the same predicate overwrite (``write_deltalake``) of each
    partition of the ten tables into its own lake, and the artifacts written by the same file
    target. No Dagster, no ledger.
``bench/pipeline-<n>``
    (b) **pipeline**: :func:`pipeline.orchestrate.run_partitions` (the code path of
    ``stormlake backfill``), then (c) **rerun**: the same call again over the published
    partitions of the fastest pipeline sample (every phase skips; the preflight launches no run).
``bench/resume-<n>``
    (d) **resume**: a fresh home and database. A first run with
    ``STORMLAKE_FAULTS=correlate.mid_transform=raise`` fails every partition inside correlate
    (ingest and enrich completed); the timed second run, without the fault, completes them.
    ``resume_target`` is the share of correlate + present in the clean run (b), from the
    ledger's checkpoints (``completed_at - created_at`` of each head, summed per phase), + 0.05.

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
sample of a fast minute with one of a slow minute. A failed sample fails the bench.

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
from pathlib import Path
from typing import Any

SKIPPABLE = ("resume", "commit")
COMMIT_WRITERS = 4
COMMIT_ITERATIONS = 250
FAULT = "correlate.mid_transform=raise"
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
        """Create a ledger and a Dagster-storage database; return their DSNs (ledger migrated)."""
        import psycopg

        from resources.errors import ConfigError
        from resources.ledger import Ledger
        from resources.pgserver import create_database, with_database

        self.count += 1
        ledger_db = f"{self.prefix}_{self.count}"
        dsns = []
        for name in (ledger_db, f"{ledger_db}_dagster"):
            try:
                create_database(self.admin, name)
            except psycopg.Error as exc:
                raise ConfigError(f"bench: cannot create the scratch database {name} on the ledger's server "
                                  f"({exc.__class__.__name__}); the bench needs the CREATEDB right") from exc
            self.names.append(name)
            dsns.append(with_database(self.admin, name))
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
    """Seconds per phase summed over the partitions: ``completed_at - created_at`` of each head."""
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


def _child_bare(spec: dict[str, Any]) -> dict[str, Any]:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from assets.schemas import (
        CELL_HOUR_STATS,
        CELL_RISK,
        OUTAGES_ENRICHED,
        PARTITION_COLUMNS,
        REGION_DAY_SUMMARY,
        SCHEMAS,
        STORM_CLUSTERS,
    )
    from assets.transforms.correlate import correlate_storm
    from assets.transforms.enrich import enrich_outages
    from assets.transforms.ingest import ingest_partition
    from assets.transforms.present import render_artifacts, summarize
    from resources.publisher import Artifact, FileTarget
    from resources.settings import load_settings

    settings = load_settings()
    regions = _regions_by_id()
    known = sorted(regions)
    lake = settings.lake
    target = FileTarget(settings.publish_dir)
    phases = {"ingest": 0.0, "enrich": 0.0, "correlate": 0.0, "present": 0.0}

    def write(table: str, data: pa.Table, region_id: str, day: str) -> None:
        schema = SCHEMAS[table]
        data = data.select(schema.names).cast(schema)
        predicate = f"region_id = '{region_id}' AND day = '{day}'"
        write_deltalake(f"{lake}/{table}", data, mode="overwrite", predicate=predicate,
                        partition_by=PARTITION_COLUMNS)

    t0 = time.perf_counter()
    Path(lake).mkdir(parents=True, exist_ok=True)
    for table, schema in SCHEMAS.items():
        DeltaTable.create(f"{lake}/{table}", schema, mode="ignore", partition_by=PARTITION_COLUMNS)
    rows = 0
    for n, key in enumerate(spec["keys"], 1):
        day, _, rid = key.partition("|")
        region = regions[rid]
        t = time.perf_counter()
        res = ingest_partition(settings.landing, region, day, known_regions=known)
        ingest_tables = {"outages_raw": res.outages, "weather_raw": res.weather, "customers_ref": res.customers,
                         "terrain_ref": res.terrain, "quarantine": res.quarantine}
        for table, data in ingest_tables.items():
            write(table, data, rid, day)
        rows += res.outages.num_rows + res.quarantine.num_rows
        t1 = time.perf_counter()
        outages, weather = res.outages.to_pandas(), res.weather.to_pandas()
        customers, terrain = res.customers.to_pandas(), res.terrain.to_pandas()
        enriched_t = pa.Table.from_pandas(
            enrich_outages(outages, weather, customers, terrain, region=region, day=day),
            schema=OUTAGES_ENRICHED, preserve_index=False)
        write("outages_enriched", enriched_t, rid, day)
        t2 = time.perf_counter()
        enriched = enriched_t.to_pandas()
        cell_hour, cell_risk, clusters = correlate_storm(enriched, weather, customers, terrain, region=region, day=day)
        corr = {"cell_hour_stats": pa.Table.from_pandas(cell_hour, schema=CELL_HOUR_STATS, preserve_index=False),
                "cell_risk": pa.Table.from_pandas(cell_risk, schema=CELL_RISK, preserve_index=False),
                "storm_clusters": pa.Table.from_pandas(clusters, schema=STORM_CLUSTERS, preserve_index=False)}
        for table, data in corr.items():
            write(table, data, rid, day)
        t3 = time.perf_counter()
        cell_hour, cell_risk, clusters = (corr[t].to_pandas() for t in ("cell_hour_stats", "cell_risk", "storm_clusters"))
        summary = summarize(region=region, day=day, enriched=enriched, cell_hour=cell_hour, cell_risk=cell_risk,
                            clusters=clusters, customers=customers, quarantined_rows=res.quarantine.num_rows)
        rendered = render_artifacts(region=region, day=day, summary=summary, cell_hour=cell_hour,
                                    cell_risk=cell_risk, clusters=clusters, enriched=enriched)
        write("region_day_summary", pa.Table.from_pandas(summary, schema=REGION_DAY_SUMMARY, preserve_index=False),
              rid, day)
        for kind in sorted(rendered):
            target.deliver(Artifact(rid, day, kind, rendered[kind]), supersedes=None)
        t4 = time.perf_counter()
        for name, sec in zip(phases, (t1 - t, t2 - t1, t3 - t2, t4 - t3), strict=True):
            phases[name] += sec
        sys.stderr.write(f"bench: bare {n}/{len(spec['keys'])} {key} {t4 - t:.1f}s\n")
    wall = time.perf_counter() - t0
    return {"ok": True, "wall_s": wall, "peak_rss_mb": _rss_mb(), "phases": phases, "rows_read": rows}


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
    from pipeline.orchestrate import Progress, run_partitions

    with dg.DagsterInstance.get():
        pass  # storage schema created and connection checked before the clock starts
    keys = spec["keys"]
    t = time.perf_counter()
    runs = run_partitions(keys, progress=Progress(len(keys)))
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
        "launched": sum(bool(r.run_id) for r in runs),
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
    import warnings

    warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    p = argparse.ArgumentParser(prog="pipeline.tools.bench")
    p.add_argument("--child", required=True)
    p.add_argument("spec")
    ns = p.parse_args(argv)
    spec = json.loads(Path(ns.spec).read_text())
    kind = spec.get("kind", ns.child)
    result = CHILDREN[kind](spec)
    tmp = Path(spec["out"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, spec["out"])
    return 0


# ---- the parent --------------------------------------------------------------------------
def _run_figures(res: dict[str, Any] | None, rows: int) -> dict[str, float] | None:
    if not res or not res.get("ok") or not res.get("wall_s"):
        return None
    wall = float(res["wall_s"])
    return {"wall_s": round(wall, 3), "rows_per_s": round(rows / wall, 1), "peak_rss_mb": round(float(res["peak_rss_mb"]), 1)}


def _ratio(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
    if not a or not b or not b["wall_s"]:
        return None
    return round(a["wall_s"] / b["wall_s"], 4)


def _resume_sample(r: int, of: str, keys: list[str], dbs: Databases, bench: Path, landing: Path,
                   work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(d), sample ``r``: a run failing every partition in correlate, then the timed resume; their results."""
    ledger_dsn, dagster_dsn = dbs.create()
    spec = {"kind": "pipeline", "keys": keys, "dagster_dsn": dagster_dsn}
    home = bench / f"resume-{r}"
    _say(f"(d) resume{of}: first run with STORMLAKE_FAULTS={FAULT} (fails in correlate, as intended)")
    fault = run_child(f"resume-fault-{r}", spec, _child_env(home, landing, ledger_dsn, faults=FAULT), work)
    st = fault.get("statuses", {})
    if fault.get("ok") or st.get("correlate", {}).get("FAILED", 0) != len(keys):
        _say(f"warning: the faulted run did not fail every partition in correlate: {st}")
    _say(f"(d) resume{of}: the second run, timed")
    res = run_child(f"resume-{r}", spec, _child_env(home, landing, ledger_dsn), work)
    _report_stage("resume", res)
    shutil.rmtree(home, ignore_errors=True)
    return fault, res


def run_bench(args: argparse.Namespace, settings) -> int:  # noqa: ANN001  (resources.settings.Settings)
    """Run the benchmark of the module docstring; print the table or the JSON; 0 when every run succeeded."""
    from pipeline.tools.generate import generate_scenario
    from resources.errors import ConfigError
    from resources.settings import load_regions

    skip = {s.strip() for s in (args.skip or "").split(",") if s.strip()}
    unknown = sorted(skip - set(SKIPPABLE))
    if unknown:
        raise ConfigError(f"--skip: unknown measurement(s) {', '.join(unknown)} (known: {', '.join(SKIPPABLE)})")
    if args.rows_per_partition < 1:
        raise ConfigError("--rows-per-partition must be at least 1")
    if args.repeat < 1:
        raise ConfigError("--repeat must be at least 1")
    regions = load_regions(settings.regions_file)
    n_regions, days, keys = plan_partitions(args.partitions, [r.region_id for r in regions], settings.first_day)
    rows = len(keys) * args.rows_per_partition

    bench = settings.home / "bench"
    shutil.rmtree(bench, ignore_errors=True)
    bench.mkdir(parents=True)
    landing = bench / "landing"
    work = Path(tempfile.mkdtemp(prefix="work-", dir=bench))
    t = time.perf_counter()
    _say(f"generating {n_regions} regions x {days} days x {args.rows_per_partition:,} outage rows into {landing}")
    generate_scenario(landing, regions[:n_regions], days=days, start=settings.first_day,
                      rows_per_partition=args.rows_per_partition, seed=args.seed,
                      progress=lambda _s, done, total: _say(f"generated {done}/{total} partitions"))
    _say(f"generated in {time.perf_counter() - t:.1f}s; running {len(keys)} partitions")

    results: dict[str, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
    samples: dict[str, list[float | None]] = {"bare": [], "pipeline": []}
    repeat = args.repeat
    dbs = Databases(settings.pg_dsn, settings.pgdata)
    try:
        turn_phases: list[dict[str, float] | None] = []  # each turn's pipeline phase seconds
        if "resume" not in skip:
            samples["resume"] = []
        best_pipeline: tuple[Path, dict[str, Any], str] | None = None  # home, spec, ledger DSN of results["pipeline"]
        for r in range(1, repeat + 1):
            of = f" ({r}/{repeat})" if repeat > 1 else ""
            _say(f"(a) bare{of}: transforms + Delta writes, no Dagster, no ledger")
            bare = run_child(f"bare-{r}", {"kind": "bare", "keys": keys}, _child_env(bench / f"bare-{r}", landing, None), work)
            _report_stage("bare", bare)
            shutil.rmtree(bench / f"bare-{r}", ignore_errors=True)
            samples["bare"].append(bare.get("wall_s") if bare.get("ok") else None)
            results["bare"] = _faster(results.get("bare"), bare)

            ledger_dsn, dagster_dsn = dbs.create()
            home = bench / f"pipeline-{r}"
            spec = {"kind": "pipeline", "keys": keys, "dagster_dsn": dagster_dsn}
            _say(f"(b) pipeline{of}: run_partitions through Dagster with the ledger")
            pipe = run_child(f"pipeline-{r}", spec, _child_env(home, landing, ledger_dsn), work)
            _report_stage("pipeline", pipe)
            samples["pipeline"].append(pipe.get("wall_s") if pipe.get("ok") else None)
            turn_phases.append(phase_seconds(ledger_dsn) if pipe.get("ok") else None)
            if _faster(results.get("pipeline"), pipe) is pipe:
                if best_pipeline is not None:
                    shutil.rmtree(best_pipeline[0], ignore_errors=True)
                best_pipeline = (home, spec, ledger_dsn)
                results["pipeline"] = pipe
                extra["pipeline_phases"] = turn_phases[-1]
            else:
                shutil.rmtree(home, ignore_errors=True)
            if "resume" in samples:
                extra["resume_fault"], res = _resume_sample(r, of, keys, dbs, bench, landing, work)
                samples["resume"].append(res.get("wall_s") if res.get("ok") else None)
                results["resume"] = _faster(results.get("resume"), res)
        assert best_pipeline is not None
        home, spec, ledger_dsn = best_pipeline
        _say("(c) rerun: the same partitions again")
        results["rerun"] = run_child("rerun", spec, _child_env(home, landing, ledger_dsn), work)
        _report_stage("rerun", results["rerun"])

        if "commit" not in skip:
            commit_dsn, _ = dbs.create()
            _say(f"(e) checkpoint commits: {COMMIT_WRITERS} writers x {COMMIT_ITERATIONS} claim+complete cycles")
            results["commit"] = run_child(
                "commit", {"kind": "commit", "ledger_dsn": commit_dsn, "writers": COMMIT_WRITERS,
                           "iterations": COMMIT_ITERATIONS, "day": settings.first_day},
                _child_env(bench / "commit", landing, commit_dsn), work)
            _report_stage("commit", results["commit"])

    finally:
        dbs.drop_all()

    runs = {name: _run_figures(results.get(name), rows) for name in ("bare", "pipeline", "rerun", "resume")
            if name in results}
    turns = turn_ratios(samples, turn_phases)
    ratios: dict[str, float | None] = {
        "pipeline_vs_bare": _median([t.get("pipeline_vs_bare") for t in turns]),
        "rerun_vs_pipeline": _ratio(runs.get("rerun"), runs.get("pipeline")),
    }
    if "resume" in results:
        ratios["resume_vs_pipeline"] = _median([t.get("resume_vs_pipeline") for t in turns])
        ratios["resume_target"] = _median([t.get("resume_target") for t in turns])
    out: dict[str, Any] = {"config": {"partitions": len(keys), "rows_per_partition": args.rows_per_partition,
                                      "repeat": repeat},
                           "runs": runs, "ratios": ratios, "turns": turns,
                           "samples": {name: [None if w is None else round(w, 3) for w in ws]
                                       for name, ws in samples.items()}}
    if "commit" in results:
        c = results["commit"]
        out["checkpoint_commit_ms"] = ({"p50": round(c["p50"], 3), "p99": round(c["p99"], 3)}
                                       if c.get("ok") else None)

    table = render_table(out, results, extra, embedded=dbs.embedded)
    if args.json:
        sys.stderr.write(table + "\n")
        print(json.dumps(out, indent=2))
    else:
        print(table)
    failed = [name for name, res in results.items() if not res.get("ok")]
    failed += [f"{name} (sample {i})" for name, ws in samples.items() for i, w in enumerate(ws, 1)
               if w is None and name not in failed]
    for name in failed:
        res = results.get(name, {})
        _say(f"{name} failed: {res.get('error') or res.get('errors') or 'see the output above'}")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def _share_target(phases: dict[str, float] | None) -> float | None:
    """Share of correlate + present in a clean run's phase seconds, + 0.05: the resume target."""
    total = sum((phases or {}).values())
    if not phases or not total:
        return None
    return round((phases.get("correlate", 0.0) + phases.get("present", 0.0)) / total + 0.05, 4)


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


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def render_table(out: dict[str, Any], results: dict[str, dict[str, Any]], extra: dict[str, Any], *,
                 embedded: bool) -> str:
    """The human-readable report: runs, phase seconds, targets."""
    cfg = out["config"]
    lines = [f"stormlake bench: {cfg['partitions']} partitions x {cfg['rows_per_partition']:,} outage rows "
             f"({cfg['partitions'] * cfg['rows_per_partition']:,} rows); ledger on "
             f"{'the embedded PostgreSQL' if embedded else 'STORMLAKE_PG_DSN'}", ""]
    lines.append(f"{'run':<10}{'wall s':>10}{'rows/s':>14}{'peak RSS MB':>14}  samples (s)")
    samples = out.get("samples", {})
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
    bare_ph = results.get("bare", {}).get("phases") or {}
    pipe_ph = extra.get("pipeline_phases") or {}
    if bare_ph or pipe_ph:
        lines += ["", f"{'phase seconds (all partitions)':<34}" + "".join(f"{p:>11}" for p in
                                                                        ("ingest", "enrich", "correlate", "present"))]
        for label, ph in (("bare (in the loop)", bare_ph), ("pipeline (ledger claim->commit)", pipe_ph)):
            if ph:
                lines.append(f"{label:<34}" + "".join(f"{ph.get(p, 0.0):>11.2f}" for p in
                                                      ("ingest", "enrich", "correlate", "present")))
    r = out["ratios"]
    runs = out["runs"]
    rows = []

    def add(label: str, value: float | None, target: str, ok: bool | None, fmt: str = "{:.3f}") -> None:
        rows.append((label, "-" if value is None else fmt.format(value), target, _mark(ok)))

    v = r.get("pipeline_vs_bare")
    add("pipeline / bare (wall)", v, f"<= {TARGETS['pipeline_vs_bare']}", None if v is None else v <= TARGETS["pipeline_vs_bare"])
    v = r.get("rerun_vs_pipeline")
    add("rerun / pipeline (wall)", v, f"<= {TARGETS['rerun_vs_pipeline']}", None if v is None else v <= TARGETS["rerun_vs_pipeline"])
    p = runs.get("pipeline")
    v = p["peak_rss_mb"] if p else None
    add("pipeline peak RSS (MB)", v, f"<= {TARGETS['pipeline_peak_rss_mb']:.0f}",
        None if v is None else v <= TARGETS["pipeline_peak_rss_mb"], "{:.0f}")
    if "resume_vs_pipeline" in r:
        v, tgt = r.get("resume_vs_pipeline"), r.get("resume_target")
        add("resume / pipeline (wall)", v, "-" if tgt is None else f"<= {tgt:.3f} (share+0.05)",
            None if v is None or tgt is None else v <= tgt)
    if "checkpoint_commit_ms" in out:
        c = out["checkpoint_commit_ms"] or {}
        add("checkpoint commit p50 (ms)", c.get("p50"), f"<= {TARGETS['commit_p50_ms']}",
            None if c.get("p50") is None else c["p50"] <= TARGETS["commit_p50_ms"])
        add("checkpoint commit p99 (ms)", c.get("p99"), f"<= {TARGETS['commit_p99_ms']}",
            None if c.get("p99") is None else c["p99"] <= TARGETS["commit_p99_ms"])
    lines += ["", f"{'target':<30}{'value':>10}  {'target':<26}{'':>2}"]
    lines += [f"{a:<30}{b:>10}  {c:<26}{d}" for a, b, c, d in rows]
    turns = out.get("turns") or []
    if len(turns) > 1:
        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        lines += ["", "per turn (side by side)   pipeline/bare   resume/pipeline   resume target"]
        lines += [f"turn {i:<21}{fmt(t.get('pipeline_vs_bare')):>14}{fmt(t.get('resume_vs_pipeline')):>18}"
                  f"{fmt(t.get('resume_target')):>16}" for i, t in enumerate(turns, 1)]
    rerun = results.get("rerun", {})
    if rerun.get("ok"):
        lines += ["", f"rerun: {rerun.get('launched', 0)} Dagster runs launched, phases {rerun.get('statuses')}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
