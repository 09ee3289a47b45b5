"""A changed landing file shows its partition of ingest stale in Dagster's UI once it is observed.

Real PostgreSQL (ledger and Dagster storage), the project's own Dagster instance, the real
resources. The stale view is asked the way the UI asks it: Dagster's GraphQL schema
(``staleStatus`` / ``staleCauses`` of the asset nodes, per partition) over an in-process
workspace of the code location ``pipeline.definitions``, which resolves them with Dagster's
``CachingStaleStatusResolver``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import in_process_test_workspace
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster_graphql.test.utils import execute_dagster_graphql

from assets.landing_files import (
    DATA_VERSION_TAG,
    LANDING_FILES,
    LANDING_KEY,
    landing_version,
    latest_versions,
    observe,
)
from assets.phases import INGEST, PHASES, table_keys
from resources.landing import Landing
from tests.helpers import KEY, requested_keys

REPO = Path(__file__).resolve().parents[2]
OTHER = "2026-09-01|pine_belt"
INGEST_KEYS = table_keys(INGEST)  # ingest's tables: one step, each depends on landing_files
OUTAGES_RAW = dg.AssetKey("outages_raw")
TABLE_KEYS = table_keys(PHASES)


@pytest.fixture
def instance(sl_env: dict[str, str]) -> Iterator[dg.DagsterInstance]:
    """The project's own Dagster instance (dagster.yaml written by prepare_dagster_home)."""
    from pipeline.instance import prepare_dagster_home
    from resources.settings import load_settings

    prepare_dagster_home(load_settings())
    with dg.DagsterInstance.get() as inst:
        yield inst


def _defs() -> dg.Definitions:
    """The code location's assets and jobs, with resources built from this test's environment."""
    from pipeline.definitions import PHASE_ASSETS, SOURCE_ASSETS, build_resources
    from pipeline.jobs import observe_landing, storm_job

    return dg.Definitions(assets=[*SOURCE_ASSETS, *PHASE_ASSETS], jobs=[storm_job, observe_landing],
                          resources=build_resources())


STALE_QUERY = """
query Stale($keys: [AssetKeyInput!], $partition: String!) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    staleStatus(partition: $partition)
    staleCauses(partition: $partition) { key { path } partitionKey reason dependency { path } dependencyPartitionKey }
  }
}
"""


@contextmanager
def _workspace(instance: dg.DagsterInstance) -> Iterator[object]:
    origin = LoadableTargetOrigin(module_name="pipeline.definitions", working_directory=str(REPO))
    with in_process_test_workspace(instance, origin) as ctx:
        yield ctx


def _ui(instance: dg.DagsterInstance, partition: str) -> dict[str, tuple[str, list[tuple]]]:
    """Table -> (stale status, root causes as (asset, partition, reason)) of every table, as the UI gets them."""
    with _workspace(instance) as ctx:
        result = execute_dagster_graphql(ctx, STALE_QUERY, {"keys": [{"path": k.path} for k in TABLE_KEYS],
                                                              "partition": partition})
    assert not result.errors, result.errors
    return {"/".join(n["assetKey"]["path"]): (n["staleStatus"], sorted(
        ("/".join(c["key"]["path"]), c["partitionKey"], c["reason"]) for c in n["staleCauses"]))
        for n in result.data["assetNodes"]}


def _status(instance: dg.DagsterInstance, key: str) -> dict[str, str]:
    return {name: status for name, (status, _) in _ui(instance, key).items()}


def _ingest_status(instance: dg.DagsterInstance, key: str) -> str:
    """The stale status of ingest's tables in a partition (they always agree: same step, same input)."""
    statuses = {_status(instance, key)[k.to_user_string()] for k in INGEST_KEYS}
    assert len(statuses) == 1, statuses
    return statuses.pop()


def _direct_causes(instance: dg.DagsterInstance, asset: dg.AssetKey, partition: str) -> list[tuple]:
    """The direct stale causes (dependency, its partition, reason) from the workspace's resolver."""
    with _workspace(instance) as ctx:
        causes = ctx.stale_status_loader.get_stale_causes(asset, partition)
    return [(c.dependency_asset_key, c.dependency_partition_key, c.reason) for c in causes]


def _landing() -> Landing:
    from resources.settings import load_settings

    return Landing(Path(load_settings().landing))


def _version(key: str) -> str:
    day, region = key.split("|")
    return landing_version(_landing(), region, day)


def _observations(instance: dg.DagsterInstance, key: str | None = None) -> list[dg.EventLogRecord]:
    flt = dg.AssetRecordsFilter(asset_key=LANDING_KEY, asset_partitions=[key] if key else None)
    return list(instance.fetch_observations(flt, limit=1000).records)


def _data_version(record: dg.EventLogRecord) -> str:
    obs = record.asset_observation
    assert obs is not None
    return obs.tags[DATA_VERSION_TAG]


def _change_outages(key: str) -> None:
    """A content change of the partition's outages.csv: its last data row dropped."""
    day, region = key.split("|")
    path = _landing().partition_dir(region, day) / "outages.csv"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))


def _touch(key: str) -> None:
    day, region = key.split("|")
    path = _landing().partition_dir(region, day) / "outages.csv"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def _run_ingest(defs: dg.Definitions, instance: dg.DagsterInstance, key: str, **kwargs) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def("storm_job").execute_in_process(
        partition_key=key, asset_selection=INGEST_KEYS, instance=instance, **kwargs)
    assert result.success
    return result


def test_changed_landing_file_observed_shows_ingest_stale_in_the_ui(sl_env: dict[str, str], instance) -> None:
    defs = _defs()
    # What the CLI does before it submits its backfill: observe the selected partitions' files.
    assert observe(instance, _landing(), [KEY, OTHER]) == {KEY: _version(KEY), OTHER: _version(OTHER)}
    done = defs.resolve_job_def("storm_job").execute_in_process(partition_key=KEY, instance=instance)
    assert done.success
    _run_ingest(defs, instance, OTHER)

    # Fresh after the run: the observation of the files came before it, ingest observed nothing
    # itself, and its materialization points at that observation.
    assert not [e for e in done.all_events if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
    assert set(_status(instance, KEY).values()) == {"FRESH"}
    assert _ingest_status(instance, OTHER) == "FRESH"
    (obs,) = _observations(instance, KEY)
    assert _data_version(obs) == _version(KEY)
    assert not obs.run_id  # reported outside any run
    assert observe(instance, _landing(), [KEY, OTHER]) == {}  # the same files: nothing to record
    for table in INGEST_KEYS:
        mat = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=table, asset_partitions=[KEY]), limit=1).records[0]
        provenance = dg.DataProvenance.from_tags(mat.asset_materialization.tags)
        assert provenance is not None and provenance.input_storage_ids[LANDING_KEY] >= obs.storage_id, table

    # Ingest again (it skips in the ledger): no second observation, still fresh.
    _run_ingest(defs, instance, KEY)
    assert len(_observations(instance, KEY)) == 1
    assert set(_status(instance, KEY).values()) == {"FRESH"}

    # An observation with no change (nothing new) records nothing.
    observe_job = defs.resolve_job_def("observe_landing")
    first = observe_job.execute_in_process(instance=instance)
    assert first.success
    observed = {e.event_specific_data.asset_observation.partition for e in first.all_events
                if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION}
    # the two partitions never ingested are observed for the first time; KEY and OTHER are not
    assert observed == {"2026-09-02|gulf_coast", "2026-09-02|pine_belt"}
    assert set(_status(instance, KEY).values()) == {"FRESH"}

    # A changed landing file, observed (the observe_landing job, no phase runs): ingest of that
    # partition is stale, naming the landing_files partition; OTHER is not.
    _change_outages(KEY)
    again = observe_job.execute_in_process(instance=instance)
    assert again.success
    assert [r.partition_key for r in _observations(instance)][:1] == [KEY]
    assert _data_version(_observations(instance, KEY)[0]) == _version(KEY)
    ui = _ui(instance, KEY)
    for table in INGEST_KEYS:
        assert ui[table.to_user_string()] == ("STALE", [(LANDING_FILES, KEY, "has a new data version")]), table
        assert _direct_causes(instance, table, KEY) == [(LANDING_KEY, KEY, "has a new dependency data version")]
    assert _ingest_status(instance, OTHER) == "FRESH"
    # Dagster 1.13's stale status is not transitive: a table is stale when its own direct input
    # changed, so the tables of enrich..present still show in sync with the ingest they read.
    assert {t: ui[t.to_user_string()] for t in TABLE_KEYS if t not in INGEST_KEYS} == {
        t: ("FRESH", []) for t in TABLE_KEYS if t not in INGEST_KEYS}

    # Ingest again: it reads the new files and is fresh (the observation already carried them).
    # One outage less changed outages_raw only: each table's data version is its own content
    # hash, so the tables reading outages_raw (outages_enriched) are stale, naming it, and no
    # table is stale for weather_raw or the reference tables, which came out the same.
    n = len(_observations(instance, KEY))
    _run_ingest(defs, instance, KEY)
    assert len(_observations(instance, KEY)) == n
    ui = _ui(instance, KEY)
    assert {t: ui[t.to_user_string()] for t in INGEST_KEYS} == {t: ("FRESH", []) for t in INGEST_KEYS}
    assert ui["outages_enriched"] == ("STALE", [("outages_raw", KEY, "has a new data version")])
    assert _direct_causes(instance, dg.AssetKey("outages_enriched"), KEY) == [
        (OUTAGES_RAW, KEY, "has a new dependency data version")]
    assert {name for name, (status, _) in ui.items() if status != "FRESH"} == {"outages_enriched"}


def test_a_range_run_observed_before_it_is_fresh_in_each_partition(sl_env: dict[str, str], instance) -> None:
    """The CLI's road: observe the selected partitions, then a key range run over them; a file
    changed later shows its partition stale once observed, and the next run makes it fresh."""
    defs = _defs()
    keys = [KEY, OTHER]  # neighbours: one key range of two partitions in one step
    range_tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}

    def run_range() -> dg.ExecuteInProcessResult:
        result = defs.resolve_job_def("storm_job").execute_in_process(
            asset_selection=INGEST_KEYS, instance=instance, tags=range_tags)
        assert result.success
        assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
        return result

    assert observe(instance, _landing(), keys) == {k: _version(k) for k in keys}
    result = run_range()
    for key in keys:
        assert _ingest_status(instance, key) == "FRESH", key
    # Each partition's materialization of each table of the range carries its own outcome.
    all_mats = [e.step_materialization_data.materialization for e in result.all_events if e.is_step_materialization]
    assert sorted((m.asset_key.to_user_string(), m.partition) for m in all_mats) == sorted(
        (t, k) for t in INGEST.tables for k in keys)
    mats = {m.partition: m.metadata for m in all_mats if m.asset_key == OUTAGES_RAW}
    for m in all_mats:  # the table's own rows and version, the phase's outcome
        meta = m.metadata
        assert meta["dagster/partition_row_count"].value == meta["row_counts"].value[m.asset_key.path[-1]]
        assert meta["state_hash"] == mats[m.partition]["state_hash"]
    assert mats[KEY]["status"].value == "COMPLETED" and mats[OTHER]["status"].value == "COMPLETED"
    assert mats[KEY]["attempt"].value == 1 and mats[KEY]["seq"].value != mats[OTHER]["seq"].value
    assert mats[KEY]["state_hash"].value != mats[OTHER]["state_hash"].value
    # The range's outcome lines are one entry of the run's log, a line for each partition.
    outcome_logs = [r.user_message for r in instance.all_logs(result.run_id)
                    if r.user_message and r.user_message.startswith("ingest: ")]
    assert len(outcome_logs) == 1, outcome_logs
    assert outcome_logs[0].splitlines() == [
        "ingest: 2 of 2 partitions done",
        f"ingest {KEY}: COMPLETED (seq {mats[KEY]['seq'].value}, state {mats[KEY]['state_hash'].value[:12]})",
        f"ingest {OTHER}: COMPLETED (seq {mats[OTHER]['seq'].value}, state {mats[OTHER]['state_hash'].value[:12]})"]

    _change_outages(KEY)
    assert observe(instance, _landing(), keys) == {KEY: _version(KEY)}  # OTHER's files are the same
    assert _ingest_status(instance, KEY) == "STALE" and _ingest_status(instance, OTHER) == "FRESH"
    run_range()
    assert all(_ingest_status(instance, k) == "FRESH" for k in keys)
    # Observing now finds nothing new for them.
    counts = {k: len(_observations(instance, k)) for k in keys}
    assert counts == {KEY: 2, OTHER: 1}
    assert defs.resolve_job_def("observe_landing").execute_in_process(instance=instance).success
    assert {k: len(_observations(instance, k)) for k in keys} == counts
    assert all(_ingest_status(instance, k) == "FRESH" for k in keys)


def test_a_run_before_its_files_were_observed_shows_stale_until_run_again(sl_env: dict[str, str],
                                                                          instance) -> None:
    """``dg launch`` or the UI right after a file changed: the run reads the new files before anyone
    observed them; their observation then shows it stale, and a run after it (the phases skip in
    the ledger) fresh again."""
    defs = _defs()
    observe(instance, _landing(), [KEY])
    _run_ingest(defs, instance, KEY)
    _change_outages(KEY)
    changed = _run_ingest(defs, instance, KEY)  # reads the new files; ingest observes nothing itself
    assert not [e for e in changed.all_events if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
    assert _ingest_status(instance, KEY) == "FRESH"
    assert observe(instance, _landing(), [KEY]) == {KEY: _version(KEY)}
    assert _ingest_status(instance, KEY) == "STALE"
    again = _run_ingest(defs, instance, KEY)
    assert {e.step_materialization_data.materialization.metadata["status"].value
            for e in again.all_events if e.is_step_materialization} == {"SKIPPED"}
    assert _ingest_status(instance, KEY) == "FRESH"


def test_latest_versions_pages_through_the_asked_partitions_only(dagster_db: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The latest observation's version of each asked partition, newest first, page by page; a
    partition never observed, or observed without a version, is left out."""
    import assets.landing_files as landing_files

    with dg.DagsterInstance.get() as instance:
        for partition, version in [("a", "1"), ("b", "1"), ("a", "2"), ("x", "9"), ("b", "2"), ("a", "3")]:
            instance.report_runless_asset_event(dg.AssetObservation(asset_key=LANDING_KEY, partition=partition,
                                                                    tags={DATA_VERSION_TAG: version}))
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=LANDING_KEY, partition="c"))
        assert latest_versions(instance, ["a", "b", "c", "never"]) == {"a": "3", "b": "2"}
        monkeypatch.setattr(landing_files, "PAGE", 1)  # one record a page: the paging itself
        assert latest_versions(instance, ["b", "a", "c", "never"]) == {"a": "3", "b": "2"}
        assert latest_versions(instance, ["x"]) == {"x": "9"}
        assert latest_versions(instance, []) == {}
        monkeypatch.undo()
        # a year of 50 regions at once: more partitions than Dagster returns records in one query
        year = [f"d{i:05d}" for i in range(18_250)]
        assert latest_versions(instance, [*year, "a"]) == {"a": "3"}
        monkeypatch.setattr(landing_files, "CHUNK", 2)  # a few partitions a query
        assert latest_versions(instance, ["never", "c", "b", "x", "a"]) == {"a": "3", "b": "2", "x": "9"}


def test_landing_sensor_observes_changed_contents_only(sl_env: dict[str, str], instance) -> None:
    from pipeline.definitions import build_resources
    from pipeline.sensors import landing_sensor

    def tick(cursor: str | None) -> dg.SensorResult:
        result = landing_sensor(dg.build_sensor_context(instance=instance, cursor=cursor,
                                                        resources=dict(build_resources())))
        assert isinstance(result, dg.SensorResult)
        for event in result.asset_events:  # what the sensor daemon does with them, before any run
            instance.report_runless_asset_event(event)
        return result

    def observed(result: dg.SensorResult) -> dict[str, str]:
        assert all(isinstance(e, dg.AssetObservation) and e.asset_key == LANDING_KEY for e in result.asset_events)
        return {e.partition: e.tags[DATA_VERSION_TAG] for e in result.asset_events}

    all_keys = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]
    first = tick(None)
    assert observed(first) == {k: _version(k) for k in all_keys}
    assert sorted(k for r in first.run_requests for k in requested_keys(r)) == all_keys

    defs = _defs()
    _run_ingest(defs, instance, KEY)  # its files were observed by the tick: nothing more logged
    assert len(_observations(instance, KEY)) == 1
    assert _ingest_status(instance, KEY) == "FRESH"

    second = tick(first.cursor)  # nothing changed
    assert observed(second) == {} and second.run_requests == []

    _touch(KEY)  # stat fingerprint changes, content does not: same data version, no observation
    third = tick(second.cursor)
    assert observed(third) == {}
    assert _ingest_status(instance, KEY) == "FRESH"

    _change_outages(KEY)
    fourth = tick(third.cursor)
    assert observed(fourth) == {KEY: _version(KEY)}
    assert [k for r in fourth.run_requests for k in requested_keys(r)] == [KEY]
    # Stale in the UI as soon as the tick's observation is stored, before the requested run.
    assert _ingest_status(instance, KEY) == "STALE"
    assert _ingest_status(instance, OTHER) == "MISSING"
