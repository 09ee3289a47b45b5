"""``stormlake bench --json``: the contract section 9 shape, on a tiny scenario (no timing targets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from resources.errors import StormlakeError
from tests.conftest import REPO

RUN_KEYS = {"wall_s", "rows_per_s", "peak_rss_mb"}


@pytest.mark.e2e
def test_bench_json_shape(tmp_path: Path, pg_dsn: str) -> None:
    """One turn of the real bench, end to end; the arithmetic over several turns is
    :func:`test_the_figures_of_several_turns_are_their_medians_and_each_run_s_fastest`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMLAKE_", "DAGSTER_"))}
    env.update({"STORMLAKE_HOME": str(tmp_path / "home"), "STORMLAKE_PG_DSN": pg_dsn})
    exe = Path(sys.executable).with_name("stormlake")
    proc = subprocess.Popen([str(exe), "bench", "--json", "--partitions", "2", "--rows-per-partition", "500",
                             "--repeat", "1"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=540)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    out = json.loads(stdout)

    assert set(out) == {"config", "runs", "ratios", "turns", "checkpoint_commit_ms", "samples"}
    assert out["config"] == {"partitions": 2, "rows_per_partition": 500, "repeat": 1}
    assert set(out["runs"]) == {"bare", "pipeline", "rerun", "resume"}
    for name, run in out["runs"].items():
        assert set(run) == RUN_KEYS, name
        assert all(isinstance(v, (int, float)) and v > 0 for v in run.values()), (name, run)
    ratios = out["ratios"]
    assert set(ratios) == {"pipeline_vs_bare", "rerun_vs_pipeline", "resume_vs_pipeline", "resume_target"}
    assert all(v > 0 for v in ratios.values()), ratios
    assert set(out["samples"]) == {"bare", "pipeline", "resume"}
    for name, walls in out["samples"].items():
        assert len(walls) == 1 and walls[0] > 0, (name, walls)
        assert out["runs"][name]["wall_s"] == pytest.approx(walls[0], abs=0.002), name
    (turn,) = out["turns"]
    assert turn["pipeline_vs_bare"] == pytest.approx(out["samples"]["pipeline"][0] / out["samples"]["bare"][0],
                                                     rel=2e-3)
    assert turn["resume_vs_pipeline"] == pytest.approx(out["samples"]["resume"][0] / out["samples"]["pipeline"][0],
                                                       rel=2e-3)
    for key in ("pipeline_vs_bare", "resume_vs_pipeline", "resume_target"):
        assert ratios[key] == pytest.approx(turn[key], abs=2e-4), key
    # The re-run found every partition published: it did no work, so it is far cheaper.
    assert ratios["rerun_vs_pipeline"] < 1
    assert 0.05 < ratios["resume_target"] <= 1.05
    commit = out["checkpoint_commit_ms"]
    assert set(commit) == {"p50", "p99"}
    assert 0 < commit["p50"] <= commit["p99"]
    # The scratch databases are gone.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'stormlake_bench_%'").fetchall()
    assert not [d for (d,) in left if d.split("_")[2] == str(proc.pid)]


def test_the_figures_of_several_turns_are_their_medians_and_each_run_s_fastest() -> None:
    """Every sample is listed; each run's figure is its fastest sample; each ratio is the median of
    the turns' side-by-side ratios (a failed sample counts in no turn)."""
    from pipeline.tools.bench import Tally, bench_json

    walls = {"bare": [10.0, 8.0, 12.0], "pipeline": [11.0, 9.6, 12.0], "resume": [5.0, None, 6.6]}
    tally = Tally(samples={name: [] for name in walls})
    for i in range(3):
        for name, ws in walls.items():
            res = {"ok": ws[i] is not None, "wall_s": ws[i], "peak_rss_mb": 100.0 + i}
            tally.add(name, res)
        tally.turn_phases.append({"ingest": 3.0, "enrich": 3.0, "correlate": 1.0, "present": 3.0})
    tally.results["rerun"] = {"ok": True, "wall_s": 0.5, "peak_rss_mb": 90.0}  # one run, no turn

    out = bench_json(tally, partitions=2, rows_per_partition=500, repeat=3)
    assert out["samples"] == walls
    assert {name: run["wall_s"] for name, run in out["runs"].items()} == {
        "bare": 8.0, "pipeline": 9.6, "rerun": 0.5, "resume": 5.0}
    assert [t["pipeline_vs_bare"] for t in out["turns"]] == [1.1, 1.2, 1.0]
    assert [t["resume_vs_pipeline"] for t in out["turns"]] == [0.4545, None, 0.55]
    assert out["ratios"]["pipeline_vs_bare"] == 1.1
    assert out["ratios"]["resume_vs_pipeline"] == pytest.approx((0.4545 + 0.55) / 2, abs=1e-4)
    assert out["ratios"]["resume_target"] == out["turns"][0]["resume_target"]
    assert out["ratios"]["rerun_vs_pipeline"] == pytest.approx(0.5 / 9.6, abs=1e-4)


def test_the_scale_grid_is_a_year_of_fifty_regions_around_the_real_partitions() -> None:
    from pipeline.tools.bench_scale import DAYS, FAILED_EVERY, PENDING_EVERY, REGIONS, scale_grid

    real = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt"]
    grid = scale_grid(["gulf_coast", "pine_belt", "red_hills"], "2026-09-01", real)
    keys = [g[0] for g in grid]
    assert len(keys) == len(set(keys)) == DAYS * REGIONS - len(real)
    assert not set(real) & set(keys)
    assert {g[1] for g in grid} == {"gulf_coast", "pine_belt", "red_hills"} | {
        f"region_{i:02d}" for i in range(4, REGIONS + 1)}
    assert {g[3] for g in grid} == set(real)
    kinds = [g[4] for g in grid]
    assert kinds.count("failed") == len(grid) // FAILED_EVERY
    assert 0 < kinds.count("pending") <= len(grid) // PENDING_EVERY
    assert grid[-1][2] == "2027-08-31"


def test_a_lake_cloned_to_a_year_holds_every_partition_once_and_its_real_rows_unchanged(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from pipeline.tools.bench_scale import clone_lake, scale_grid

    real = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt"]
    rows = pa.table({"region_id": ["gulf_coast", "gulf_coast", "pine_belt"], "day": ["2026-09-01"] * 3,
                     "event_id": ["a", "b", "c"], "customers_out": pa.array([5, 7, 9], pa.int64())})
    write_deltalake(str(tmp_path / "outages_raw"), rows, partition_by=["region_id", "day"])
    write_deltalake(str(tmp_path / "quarantine"), rows.slice(0, 0), partition_by=["region_id", "day"])
    (tmp_path / "not_a_table").mkdir()
    grid = scale_grid(["gulf_coast", "pine_belt", "red_hills"], "2026-09-01", real)[:120]

    held = clone_lake(tmp_path, grid)

    assert held == {"outages_raw": 2 + 120, "quarantine": 0}  # a table without rows is left as it is
    table = DeltaTable(str(tmp_path / "outages_raw"))
    assert table.version() == 1  # one commit for the whole grid
    data = table.to_pyarrow_table().to_pylist()
    by_key: dict[str, list[dict]] = {}
    for row in data:
        by_key.setdefault(f"{row['day']}|{row['region_id']}", []).append(row)
    assert sorted(r["event_id"] for r in by_key.pop(real[0])) == ["a", "b"]  # the real partitions unchanged
    assert [r["event_id"] for r in by_key.pop(real[1])] == ["c"]
    assert set(by_key) == {g[0] for g in grid}  # every cloned partition, one row each
    assert all(len(v) == 1 for v in by_key.values())
    copied = {(v[0]["event_id"], v[0]["customers_out"]) for v in by_key.values()}
    assert len(copied) == 1 and copied <= {("a", 5), ("b", 7), ("c", 9)}  # a copy of one real row


def test_the_bare_loop_runs_every_phase_through_its_own_compute(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from assets.context import PartitionRef
    from assets.phases import PHASES
    from pipeline.tools.bench import BareLoop
    from pipeline.tools.generate import generate_scenario
    from resources.landing import Landing
    from resources.publisher import FileTarget
    from resources.settings import DEFAULT_REGIONS_FILE, load_regions

    regions = load_regions(DEFAULT_REGIONS_FILE)
    generate_scenario(tmp_path / "landing", regions[:1], days=1, start="2026-09-01", rows_per_partition=300, seed=11)
    loop = BareLoop(str(tmp_path / "lake"), Landing(tmp_path / "landing"), sorted(r.region_id for r in regions),
                    FileTarget(tmp_path / "published"), log_retention_minutes=2)
    loop.create_tables()
    part = PartitionRef.parse(f"2026-09-01|{regions[0].region_id}", {r.region_id: r for r in regions})

    seconds = loop.run_partition(part)

    assert list(seconds) == [p.name for p in PHASES] and all(s > 0 for s in seconds.values())
    for table in (t for p in PHASES for t in p.tables):
        rows = DeltaTable(str(tmp_path / "lake" / table)).to_pyarrow_dataset().to_table(use_threads=False)
        assert set(rows.column("day").to_pylist()) <= {"2026-09-01"}, table
    summary = DeltaTable(str(tmp_path / "lake" / "region_day_summary")).to_pyarrow_dataset().to_table(use_threads=False)
    quarantine = DeltaTable(str(tmp_path / "lake" / "quarantine")).to_pyarrow_dataset().to_table(use_threads=False)
    assert summary.num_rows == 1
    assert summary.column("quarantined_rows").to_pylist() == [quarantine.num_rows]  # present saw ingest's count
    published = tmp_path / "published" / regions[0].region_id / "2026-09-01"
    assert sorted(f.name for f in published.iterdir()) == ["clusters.geojson", "report.html", "summary.json"]


def test_bench_all_lists_every_figure_against_its_target() -> None:
    """``stormlake bench --all``: one row per figure, met or not from the measured values."""
    import doctest

    import pipeline.tools.bench_year as year

    assert doctest.testmod(year).failed == 0
    small = {"ratios": {"pipeline_vs_bare": 1.05}, "runs": {"bare": {"wall_s": 10.0}},
             "config": {"partitions": 40, "rows_per_partition": 500}}
    workers = {"speedup": 1.5, "target": 1.6, "config": {"partitions": 16, "rows_per_partition": 20_000}}
    ui = {"ratio": 1.4, "target": 1.5, "config": {"partitions": 20, "rows_per_partition": 500}}
    scale = {"ledger": {"partitions": 18_250},
             "views": {"status": {"median_s": 0.5, "target_s": 1.0, "met": True},
                       "report": {"median_s": 3.5, "target_s": 3.0, "met": False}}}
    rows = {r["figure"]: r for r in year.figures(small, workers, ui, scale)}
    assert {k: v["met"] for k, v in rows.items()} == {
        "status (18,250 partitions)": True, "report (18,250 partitions)": False,
        "pipeline / bare (40 x 500)": True, "bare seconds per partition (40 x 500)": False,
        "UI backfill / CLI (20 x 500)": True, "workers speedup (16 x 20,000)": False}
    assert rows["bare seconds per partition (40 x 500)"]["value"] == "0.250 s"
    table = year.render(list(rows.values()))
    assert table.count("\n") == len(rows) + 1 and "workers speedup (16 x 20,000)" in table


def test_the_host_ceiling_times_the_same_loop_in_one_process_and_split_over_several(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench --workers`` sets the workers' speedup beside the host's own for CPU-bound work: the
    split loop is the same work, so two processes take about as long as one each on a core, and a
    loop that fails is an error, not a figure."""
    import doctest

    import pipeline.tools.bench_workers as workers

    assert doctest.testmod(workers).failed == 0
    ceiling = workers.host_ceiling(2, steps=400_000)
    assert set(ceiling) == {"one_s", "many_s", "speedup"} and ceiling["one_s"] > 0 and ceiling["many_s"] > 0
    one, many, half = ceiling["one_s"], ceiling["many_s"], 0.005  # both rounded to 10 ms
    assert (one - half) / (many + half) <= ceiling["speedup"] <= (one + half) / (many - half)
    monkeypatch.setattr(workers.sys, "executable", "/bin/false")  # an interpreter that fails at once
    with pytest.raises(StormlakeError, match="host ceiling"):
        workers.host_ceiling(2, steps=400_000)


def test_the_start_s_floor_is_a_part_of_the_start_and_a_failed_import_is_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench --workers`` bounds the speedup with the start cut to its floor: importing Dagster and
    its PostgreSQL storage. Every module of the floor is one the start imports too (else the
    floor would not be a part of it), and an import that fails is an error, not a figure."""
    import subprocess
    import sys

    import pipeline.tools.bench_workers as workers
    from pipeline.instance import PROJECT_ROOT

    def modules(code: str) -> set[str]:
        listed = code + "import sys\nprint('\\n'.join(sys.modules))\n"
        done = subprocess.run([sys.executable, "-c", listed], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              check=True)
        return set(done.stdout.split())

    floor, start = modules(workers._FLOOR), modules(workers._START)
    assert {"dagster", "dagster_postgres", "sqlalchemy"} <= floor
    assert floor <= start and "pandas" in start - floor and "deltalake" in start - floor
    assert workers.floor_seconds() > 0
    monkeypatch.setattr(workers.sys, "executable", "/bin/false")
    with pytest.raises(StormlakeError, match="importing Dagster and its PostgreSQL storage failed"):
        workers.floor_seconds()
    with pytest.raises(StormlakeError, match="importing the backfill's modules failed"):
        workers.start_seconds()


def test_the_cores_time_during_a_backfill_is_read_from_proc_stat(tmp_path: Path) -> None:
    """``bench --workers`` reads what the machine's cores did while each backfill ran: two readings
    differ by the wall time on every core (busy, idle or stolen), and this process's own work is in
    the busy part. Where there is no such file, or not in that form, there is no figure and no error."""
    import time

    import pipeline.tools.bench_workers as workers

    assert workers.cpu_seconds(tmp_path / "missing") is None
    (tmp_path / "stat").write_text("intr 1 2 3\ncpu0 1 2 3 4 5 6 7 8\n")
    assert workers.cpu_seconds(tmp_path / "stat") is None
    stat = Path("/proc/stat")
    if not stat.exists():  # not Linux: the bench prints no table of the cores, and goes on
        assert workers.cpu_seconds() is None
        return
    cores = sum(1 for line in stat.read_text().splitlines() if line.startswith("cpu") and line[3:4].isdigit())
    before, wall, cpu = workers.cpu_seconds(), time.perf_counter(), time.process_time()
    while time.process_time() - cpu < 0.5:  # this process's own work, however fast the machine
        sum(range(10_000))
    after, wall, cpu = workers.cpu_seconds(), time.perf_counter() - wall, time.process_time() - cpu
    spent = {k: after[k] - before[k] for k in after}
    assert all(v >= 0 for v in spent.values()), spent
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert spent["busy_s"] + spent["stolen_s"] >= cpu - 5 * tick, (spent, cpu)
    assert abs(sum(spent.values()) - wall * cores) <= cores * (0.1 + wall * 0.05), (spent, wall, cores)


def test_a_prepared_home_has_dagster_s_storage_and_no_run(pg_admin_dsn: str, tmp_path: Path) -> None:
    """What the workers' and UI benches time against: a deployment in use, nothing run yet."""
    from pipeline.tools.bench import Databases, _child_env
    from pipeline.tools.bench_workers import prepare_home

    dbs = Databases(pg_admin_dsn, tmp_path / "pgdata")
    try:
        ledger_dsn, dagster_dsn = dbs.create()
        seconds = prepare_home(_child_env(tmp_path / "home", tmp_path / "landing", ledger_dsn))
        assert seconds > 0
        with psycopg.connect(dagster_dsn) as conn:
            tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
            assert {"runs", "event_logs", "asset_keys"} <= tables
            assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        with psycopg.connect(ledger_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == (0,)
    finally:
        dbs.drop_all()
