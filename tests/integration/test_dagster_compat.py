"""What ``resources/dagster_compat.py`` relies on in Dagster's internals, checked against a real
instance on PostgreSQL.

After a Dagster upgrade, run this file first: each test names the internal symbol (or table,
column, tag, behaviour) that moved, and the compat function that needs a new route.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import dagster as dg
import pytest

from resources import dagster_compat as compat

VERSION = dg.__version__


def _fail(what: str, relied_on_by: str) -> str:
    return (f"Dagster {VERSION}: {what}. resources/dagster_compat.py:{relied_on_by} relies on it; "
            f"see that function's docstring for why, and find the new route.")


# (dotted module, attribute path, parameters that must be there, compat function relying on it)
PRIVATE = [
    ("dagster._core.definitions.data_version", "DATA_VERSION_TAG", None, "data_version_tag"),
    ("dagster._core.execution.backfill", "PartitionBackfill.from_asset_partitions",
     ("backfill_id", "asset_graph", "partition_names", "asset_selection", "backfill_timestamp", "tags",
      "dynamic_partitions_store", "all_partitions", "title", "description", "run_config"), "launch_backfill"),
    ("dagster._core.instance.instance", "DagsterInstance.add_backfill", ("partition_backfill",), "launch_backfill"),
    ("dagster._core.instance.instance", "DagsterInstance.get_backfill", ("backfill_id",), "backfill_status"),
]


@pytest.mark.parametrize(("module", "path", "params", "user"), PRIVATE, ids=[f"{m}.{p}" for m, p, _, _ in PRIVATE])
def test_the_private_symbols_are_still_there(module: str, path: str, params: tuple[str, ...] | None,
                                             user: str) -> None:
    import importlib

    try:
        obj: object = importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(_fail(f"module {module} is gone ({exc})", user))
    for part in path.split("."):
        assert hasattr(obj, part), _fail(f"{module}.{path} is gone (no {part!r})", user)
        obj = getattr(obj, part)
    if params is not None:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
        missing = [p for p in params if p not in signature.parameters]
        assert not missing, _fail(f"{module}.{path}{signature} has no parameter(s) {missing}", user)


@pytest.fixture
def instance(dagster_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    """An instance on a fresh database, as ``stormlake`` writes it (``dagster.yaml`` on PostgreSQL)."""
    monkeypatch.setenv("STORMLAKE_TEST_DAGSTER_DSN", dagster_db)
    with dg.DagsterInstance.get() as inst:
        yield inst


def test_the_range_tags_are_the_ones_dagster_runs_a_key_range_by(instance: dg.DagsterInstance) -> None:
    """``resources.keys.RANGE_START_TAG``/``RANGE_END_TAG`` are Dagster's own values: a run made
    with them in process covers the key range."""
    from resources.keys import RANGE_END_TAG, RANGE_START_TAG

    parts = dg.StaticPartitionsDefinition(["a", "b", "c"])
    seen: list[list[str]] = []

    @dg.asset(partitions_def=parts)
    def ranged(context) -> None:  # noqa: ANN001 - Dagster reads the annotation, a string here
        seen.append(list(context.partition_keys))

    job = dg.Definitions(assets=[ranged]).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, tags={RANGE_START_TAG: "a", RANGE_END_TAG: "b"})
    assert result.success and seen == [["a", "b"]], (
        f"Dagster {VERSION}: a run tagged {RANGE_START_TAG}/{RANGE_END_TAG} no longer covers that key range; "
        "resources/keys.py names Dagster's range tags (dagster._core.storage.tags)")


def test_the_data_version_tag_is_the_one_dagster_reads() -> None:
    tag = compat.data_version_tag()
    obs = dg.AssetObservation(asset_key="a", tags={tag: "v1"})
    assert obs.data_version == "v1", _fail(f"an observation tagged {tag!r} no longer has that data version",
                                           "data_version_tag")


def test_an_observation_reported_before_a_run_is_the_version_its_step_reads(instance: dg.DagsterInstance) -> None:
    """What the landing sensor and the CLI rely on: an observation reported with the tag, outside
    any run, is the input version a later step of a partitioned reader records (its provenance),
    and a step's own observation of its input comes after that read."""
    tag = compat.data_version_tag()
    parts = dg.StaticPartitionsDefinition(["a", "b"])
    source = dg.AssetKey("files")

    @dg.observable_source_asset(name="files", partitions_def=parts)
    def files() -> dg.DataVersionsByPartition:  # never run: the versions are reported
        return dg.DataVersionsByPartition({})

    @dg.asset(partitions_def=parts, deps=[files])
    def reader(context) -> dg.MaterializeResult:  # noqa: ANN001 - Dagster reads the annotation
        if context.partition_key == "b":  # observing its own input, as ingest once did
            context.log_event(dg.AssetObservation(asset_key=source, partition="b", tags={tag: "b-2"}))
        return dg.MaterializeResult()

    for partition in ("a", "b"):
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=source, partition=partition,
                                                                tags={tag: f"{partition}-1"}))
    for partition in ("a", "b"):
        assert dg.materialize([files, reader], selection=[reader.key], partition_key=partition,
                              instance=instance).success
    for partition, version in (("a", "a-1"), ("b", "b-1")):
        reported = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=source, asset_partitions=[partition]), limit=2).records[-1]
        assert reported.asset_observation.data_version == version, _fail(  # Dagster reads it from the tag
            f"an observation reported with the tag has data version {reported.asset_observation.data_version}",
            "data_version_tag")
        latest = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=source, asset_partitions=[partition]), limit=1).records[0]
        mat = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=reader.key, asset_partitions=[partition]), limit=1).records[0]
        provenance = dg.DataProvenance.from_tags(mat.asset_materialization.tags)
        assert provenance is not None
        pointer = provenance.input_storage_ids.get(source)
        # (The pointer is the asset's latest observation, of any partition: dagster-io/dagster#33988.)
        assert pointer is not None and pointer >= reported.storage_id, (
            f"Dagster {VERSION}: partition {partition}'s materialization points at observation {pointer}, before "
            f"{reported.storage_id}, the one reported before its run (assets/landing_files.py observes before runs)")
        if partition == "b":  # the step's own observation is newer than what it read: it would show stale
            assert pointer < latest.storage_id, (
                f"Dagster {VERSION} now reads an input's observation logged inside the step; an observation "
                "before the run (assets/landing_files.py) is still right, but no longer the only way")


def test_launch_backfill_adds_an_asset_backfill_of_exactly_the_keys(instance: dg.DagsterInstance) -> None:
    """The backfill ``stormlake backfill`` submits: Dagster's own asset backfill (the UI lists it,
    the backfill daemon cuts it into runs), of the given assets and partition keys, with the tags
    every run of it carries; REQUESTED until a daemon has done it."""
    from assets.phases import PHASES, table_keys
    from pipeline.definitions import defs
    from resources.keys import partition_key

    keys = [partition_key("2026-09-01", "gulf_coast"), partition_key("2026-09-02", "gulf_coast")]
    assets = table_keys(PHASES[2:])
    backfill_id = compat.launch_backfill(instance, defs, assets, keys, tags={"stormlake/launched_by": "test"}, title="t")
    assert compat.backfill_status(instance, backfill_id) == ("REQUESTED", False), _fail(
        "a new backfill is not REQUESTED and unfinished", "backfill_status")
    stored = instance.get_backfill(backfill_id)
    assert stored is not None and stored.title == "t" and stored.tags == {"stormlake/launched_by": "test"}
    assert set(stored.asset_selection) == set(assets), _fail("the backfill's assets are not the given ones",
                                                            "launch_backfill")
    target = stored.asset_backfill_data.target_subset
    for key in assets:
        got = set(target.get_partitions_subset(key).get_partition_keys())
        assert got == set(keys), _fail(f"the backfill targets {sorted(got)} of {key}, not the given keys",
                                       "launch_backfill")
    assert compat.backfill_status(instance, "nosuchid") is None
