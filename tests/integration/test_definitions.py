"""The code location loads: job, the four phase assets, their partitions, code versions and graders;
and the observable source asset landing_files (the input of ingest) with its observe job and schedule."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.phases import PHASES

REPO = Path(__file__).resolve().parents[2]
ASSETS = ("ingested_batch", "enriched_outages", "storm_correlation", "operational_picture")


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


def test_landing_files_is_an_observable_source_outside_the_storm_group(defs: dg.Definitions) -> None:
    from assets.partitions import PARTITIONS

    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {*ASSETS, "landing_files"}
    node = graph.get(dg.AssetKey("landing_files"))
    assert node.is_observable and not node.is_materializable
    assert node.partitions_def == PARTITIONS
    assert node.group_name == "landing"
    assert {k.to_user_string() for k in graph.get(dg.AssetKey("ingested_batch")).parent_keys} == {"landing_files"}
    # The phases are the storm group; the source is not (storm_job: exactly the four phases).
    assert {k.to_user_string() for k in dg.AssetSelection.groups("storm").resolve(graph)} == set(ASSETS)

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


def test_phase_assets_are_in_protocol_order() -> None:
    assert tuple(p.asset for p in PHASES) == ASSETS
    assert [p.tier for p in PHASES] == [1, 2, 3, 4]


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
    assert len(graders) == 1, f"{name}: expected one 'grader' check, got {[s.name for s in specs]}"
    assert graders[0].asset_key == key
    assert graders[0].blocking is True


def test_assets_depend_on_the_previous_phase(defs: dg.Definitions) -> None:
    for prev, cur in zip(ASSETS, ASSETS[1:], strict=False):
        deps = {k.to_user_string() for k in defs.resolve_assets_def(cur).asset_deps[dg.AssetKey(cur)]}
        assert prev in deps, f"{cur} does not depend on {prev}: {deps}"


def test_dagster_cli_lists_all_four_assets(sl_env: dict[str, str], tmp_path: Path) -> None:
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
