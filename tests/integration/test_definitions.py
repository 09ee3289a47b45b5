"""The code location loads: job, one asset per table of the four phases (grouped by phase, one op
per phase), their lineage, partitions, code versions, column schemas, code references and graders;
and the observable source asset landing_files (the input of ingest) with its observe job and schedule."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.phases import PHASES
from assets.plan import MAX_PARTITIONS_PER_RUN
from assets.schemas import SCHEMAS, table_schema

REPO = Path(__file__).resolve().parents[2]
OPS = ("ingested_batch", "enriched_outages", "storm_correlation", "operational_picture")
ASSETS = tuple(SCHEMAS)  # one asset per Delta table


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    from pipeline.definitions import defs

    return defs


def test_defs_load_and_job_resolves(defs: dg.Definitions) -> None:
    assert isinstance(defs, dg.Definitions)
    job = defs.resolve_job_def("storm_job")
    assert job.name == "storm_job"
    assert isinstance(job.partitions_def, dg.MultiPartitionsDefinition)
    keys = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    assert keys == set(ASSETS)


def test_landing_files_is_an_observable_source_outside_the_phase_groups(defs: dg.Definitions) -> None:
    from assets.partitions import PARTITIONS

    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {*ASSETS, "landing_files"}
    node = graph.get(dg.AssetKey("landing_files"))
    assert node.is_observable and not node.is_materializable
    assert node.partitions_def == PARTITIONS
    assert node.group_name == "landing"
    for table in PHASES[0].tables:  # ingest's tables
        assert {k.to_user_string() for k in graph.get(dg.AssetKey(table)).parent_keys} == {"landing_files"}
    # Each phase's tables are a group named after the phase; the source is not in them.
    for phase in PHASES:
        assert {k.to_user_string() for k in dg.AssetSelection.groups(phase.name).resolve(graph)} == set(phase.tables)

    job = defs.resolve_job_def("observe_landing")
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {"landing_files"}
    schedule = defs.resolve_schedule_def("observe_landing_schedule")
    assert schedule.job_name == "observe_landing"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == "*/15 * * * *"
    tick = schedule.evaluate_tick(dg.build_schedule_context(
        scheduled_execution_time=dt.datetime(2026, 9, 2, 3, 15, tzinfo=dt.UTC), repository_def=defs.get_repository_def()))
    # One run of the observe job over the whole landing zone (the observation reads every partition).
    assert [(r.partition_key, r.tags["stormlake/launched_by"]) for r in tick.run_requests or []] == [
        (None, "observe_landing_schedule")]


def test_phase_ops_are_in_protocol_order() -> None:
    assert tuple(p.asset for p in PHASES) == OPS
    assert [p.tier for p in PHASES] == [1, 2, 3, 4]
    assert sorted(t for p in PHASES for t in p.tables) == sorted(ASSETS)


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name)
def test_one_op_writes_every_table_of_a_phase(defs: dg.Definitions, phase) -> None:
    keys = [dg.AssetKey(t) for t in phase.tables]
    asset = defs.resolve_assets_def(keys[0])
    assert asset.op.name == phase.asset  # step and run names read as before
    assert set(asset.keys) == set(keys)
    assert not asset.can_subset  # one checkpoint covers all the phase's tables
    assert asset.op.pool is None  # the run queue is the one concurrency setting
    assert asset.backfill_policy == dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_PARTITIONS_PER_RUN)
    assert asset.op.retry_policy is not None and asset.op.retry_policy.max_retries == 2
    # One blocking grader per phase, on its first table.
    graders = [s for s in asset.check_specs if s.name == "grader"]
    assert [(s.asset_key, s.blocking) for s in graders] == [(keys[0], True)]
    assert [s.name for s in asset.check_specs] == ["grader"]
    graph = defs.resolve_asset_graph()
    for key in keys:
        node = graph.get(key)
        assert node.group_name == phase.name
        assert node.code_version == f"{phase.code_version}.s{phase.schema_version}"
        assert node.tags.get("stormlake/phase") == phase.name
        assert set(node.kinds) == ({"deltalake", "pandas", "html"} if phase.name == "present" else {"deltalake", "pandas"})
        # Table-level lineage: the tables the phase reads (ingest: the landing files).
        assert {k.to_user_string() for k in node.parent_keys} == (set(phase.input_tables) or {"landing_files"})
        meta = node.metadata
        assert meta["dagster/column_schema"].schema == table_schema(key.path[-1])
        assert meta["dagster/table_name"].value == key.path[-1]
        # The code reference is the phase function (its first line: the decorator).
        (ref,) = meta["dagster/code_references"].code_references
        lines = Path(ref.file_path).read_text().splitlines()[ref.line_number - 1:ref.line_number + 1]
        assert Path(ref.file_path) == REPO / "assets" / f"{phase.name}.py", ref
        assert lines[0].startswith("@dg.multi_asset(") and lines[1].startswith(f"def {phase.asset}("), lines


@pytest.mark.parametrize("name", ASSETS)
def test_asset_partitions_code_version_and_grader(defs: dg.Definitions, name: str) -> None:
    asset = defs.resolve_assets_def(name)
    key = dg.AssetKey(name)
    pdef = asset.partitions_def
    assert isinstance(pdef, dg.MultiPartitionsDefinition)
    assert sorted(d.name for d in pdef.partitions_defs) == ["day", "region"]
    day_def = pdef.get_partitions_def_for_dimension("day")
    region_def = pdef.get_partitions_def_for_dimension("region")
    assert isinstance(day_def, dg.DailyPartitionsDefinition)
    assert day_def.get_first_partition_key() == "2026-09-01"
    assert isinstance(region_def, dg.StaticPartitionsDefinition)
    assert {"gulf_coast", "pine_belt"} <= set(region_def.get_partition_keys())
    # A multi-partition key reads "<day>|<region>" (dimensions ordered by name).
    assert pdef.has_partition_key("2026-09-01|gulf_coast")

    code_version = asset.code_versions_by_key.get(key)
    assert code_version, f"{name} has no code_version"

    specs = list(asset.check_specs)
    graders = [s for s in specs if s.name == "grader"]
    assert len(graders) == 1, f"{name}: expected one 'grader' check on its phase, got {[s.name for s in specs]}"
    assert graders[0].blocking is True


def test_the_catalog_names_what_each_table_is_and_who_owns_it(defs: dg.Definitions) -> None:
    """Every table is a Delta table computed with pandas, owned by the one owner the project names;
    PostgreSQL holds the ledger's checkpoints, not a table, and is no table's kind."""
    from assets.materialize import OWNERS

    graph = defs.resolve_asset_graph()
    tables = [graph.get(k) for k in graph.get_all_asset_keys() if graph.get(k).is_materializable]
    assert sorted(n.key.to_user_string() for n in tables) == sorted(ASSETS)
    assert OWNERS and all(o.startswith("team:") or "@" in o for o in OWNERS)
    for node in tables:
        assert {"deltalake", "pandas"} <= set(node.kinds) and "postgres" not in node.kinds, (node.key, node.kinds)
        assert list(node.owners) == OWNERS, (node.key, node.owners)


def test_tables_depend_on_the_tables_their_phase_reads(defs: dg.Definitions) -> None:
    graph = defs.resolve_asset_graph()
    parents = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
               for k in graph.get_all_asset_keys()}
    assert parents["outages_enriched"] == {"outages_raw", "weather_raw", "customers_ref", "terrain_ref"}
    assert parents["storm_clusters"] == {"outages_enriched", "weather_raw", "customers_ref", "terrain_ref"}
    assert parents["region_day_summary"] == {"outages_enriched", "cell_hour_stats", "cell_risk", "storm_clusters",
                                             "customers_ref"}
    assert parents["quarantine"] == {"landing_files"}
    # Nothing reads quarantine: a change there makes no later table stale.
    assert not any("quarantine" in p for p in parents.values())


def test_dagster_cli_lists_all_ten_table_assets(sl_env: dict[str, str], tmp_path: Path) -> None:
    import os

    env = dict(os.environ)
    env.update(sl_env)
    Path(sl_env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    dagster = Path(sys.executable).parent / "dagster"
    proc = subprocess.run([str(dagster), "asset", "list", "-m", "pipeline.definitions"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = {line.strip() for line in proc.stdout.splitlines() if line.strip()}
    for name in ASSETS:
        assert name in listed, f"{name} missing from `dagster asset list`: {proc.stdout!r}"
    # The observable source asset is not materializable, so `asset list` (like `--select '*'`) leaves it out.
    assert "landing_files" not in listed
