"""Dagster's own command lines on the project (contract section 7): ``dagster asset materialize``
and ``dg launch``, as a shell runs them, against the instance ``stormlake`` prepares."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from assets.phases import INGEST, PHASES
from assets.schemas import SCHEMAS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ASSETS = set(SCHEMAS)  # one asset per table of the four phases


@pytest.fixture
def cli_env(sl_env: dict[str, str]) -> dict[str, str]:
    from pipeline.instance import prepare_dagster_home
    from resources.settings import load_settings

    home, _ = prepare_dagster_home(load_settings())
    assert (home / "dagster.yaml").exists()
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _shell(cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _status(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    proc = subprocess.run([str(BIN / "stormlake"), "status", "--json", "--role", "admin"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {f"{p['day']}|{p['region']}": p for p in json.loads(proc.stdout)["partitions"]}


def _runs_of(key: str) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.get() as instance:
        return [r for r in instance.get_runs() if r.tags.get("dagster/partition") == key]


def _statuses(run_id: str) -> dict[str, str]:
    with dg.DagsterInstance.get() as instance:
        out = {}
        for rec in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
            mat = rec.asset_materialization
            assert mat is not None
            out[mat.asset_key.to_user_string()] = str(mat.metadata["status"].value)
        return out


def _landing_observations(key: str) -> tuple[list[dg.EventLogRecord], set[int | None]]:
    """The observations of landing_files for ``key``, and the ones the latest ingest's tables point at."""
    with dg.DagsterInstance.get() as instance:
        flt = dg.AssetRecordsFilter(asset_key=dg.AssetKey("landing_files"), asset_partitions=[key])
        observations = list(instance.fetch_observations(flt, limit=10).records)
        pointers: set[int | None] = set()
        for table in INGEST.tables:
            mats = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(table), asset_partitions=[key]), limit=1).records
            provenance = dg.DataProvenance.from_tags(mats[0].asset_materialization.tags) if mats else None
            pointers.add(provenance.input_storage_ids.get(dg.AssetKey("landing_files")) if provenance else None)
        return observations, pointers


def test_dagster_asset_materialize_from_a_shell(cli_env: dict[str, str]) -> None:
    key = "2026-09-01|gulf_coast"
    cmd = (f"{shlex.quote(str(BIN / 'dagster'))} asset materialize -m pipeline.definitions "
           f"--select '*' --partition '{key}'")
    proc = _shell(cmd, cli_env)
    assert proc.returncode == 0, proc.stderr[-4000:]

    status = _status(cli_env)
    assert list(status) == [key]
    assert status[key]["tier"] == 4 and status[key]["tier_label"] == "published"
    assert all(status[key]["phases"][p.name]["status"] == "COMPLETED" for p in PHASES)

    runs = _runs_of(key)
    assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
    first_run = runs[0].run_id
    assert _statuses(first_run) == {a: "COMPLETED" for a in ASSETS}
    listed = _shell(f"{shlex.quote(str(BIN / 'dagster'))} run list --limit 5", cli_env)
    assert listed.returncode == 0 and first_run in listed.stdout, listed.stderr[-2000:]
    # '*' selects the ten tables, not the observable source landing_files, and ingest observes
    # nothing itself (the landing sensor, the CLI and "Observe sources" do, before runs): the
    # tables' materializations point at no observation.
    observations, pointers = _landing_observations(key)
    assert observations == [] and pointers == {None}

    # The same command again is a second Dagster run that computes nothing.
    again = _shell(cmd, cli_env)
    assert again.returncode == 0, again.stderr[-4000:]
    runs = _runs_of(key)
    assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    (newest,) = [r for r in runs if r.run_id != first_run]
    assert _statuses(newest.run_id) == {a: "SKIPPED" for a in ASSETS}
    after = _status(cli_env)[key]
    assert {n: p["attempts"] for n, p in after["phases"].items()} == {p.name: 1 for p in PHASES}
    assert _landing_observations(key)[0] == []
    assert after["deliveries"] == status[key]["deliveries"]


def test_dg_launch_in_the_project(cli_env: dict[str, str]) -> None:
    # pyproject.toml's [tool.dg] (directory_type project, root_module pipeline,
    # code_location_target_module pipeline.definitions) is all dg needs to find the code location.
    key = "2026-09-01|pine_belt"
    proc = _shell(f"{shlex.quote(str(BIN / 'dg'))} launch --assets '*' --partition '{key}'", cli_env)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    status = _status(cli_env)
    assert status[key]["tier"] == 4
    runs = _runs_of(key)
    assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
    assert _statuses(runs[0].run_id) == {a: "COMPLETED" for a in ASSETS}
