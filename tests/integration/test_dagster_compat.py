"""What ``resources/dagster_compat.py`` relies on in Dagster's internals, checked against a real
instance on PostgreSQL.

After a Dagster upgrade, run this file first: each test names the internal symbol (or table,
column, tag, behaviour) that moved, and the compat function that needs a new route.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import dagster as dg
import psycopg
import pytest

from resources import dagster_compat as compat
from tests.dagster_jobs import one_asset_job

VERSION = dg.__version__


def _fail(what: str, relied_on_by: str) -> str:
    return (f"Dagster {VERSION}: {what}. resources/dagster_compat.py:{relied_on_by} relies on it; "
            f"see that function's docstring for why, and find the new route.")


# (dotted module, attribute path, parameters that must be there, compat function relying on it)
PRIVATE = [
    ("dagster._core.definitions.data_version", "DATA_VERSION_TAG", None, "data_version_tag"),
    ("dagster._core.execution.plan.utils", "RetryRequestedFromPolicy", None, "step_error_wrappers"),
    ("dagster._core.instance.instance", "DagsterInstance.report_run_failed", ("dagster_run", "message"),
     "fail_dead_run"),
    ("dagster._core.storage.event_log.base", "EventLogStorage.free_concurrency_slots_for_run", ("run_id",),
     "fail_dead_run"),
    ("dagster._core.events", "DagsterEvent.build_asset_materialization_planned_event",
     ("job_name", "step_key", "asset_materialization_planned_data"), "replan_in_failed_run"),
    ("dagster._core.events", "AssetMaterializationPlannedData", None, "replan_in_failed_run"),
    ("dagster._core.instance.instance", "DagsterInstance.optimize_for_webserver",
     ("statement_timeout", "pool_recycle", "max_overflow"), "pool_storage_connections"),
    ("dagster._core.instance.instance", "DagsterInstance.create_run",
     ("job_name", "run_id", "run_config", "status", "tags", "root_run_id", "parent_run_id", "step_keys_to_execute",
      "execution_plan_snapshot", "job_snapshot", "parent_job_snapshot", "asset_selection", "asset_check_selection",
      "resolved_op_selection", "op_selection", "remote_job_origin", "job_code_origin", "asset_graph"), "copy_run"),
    ("dagster._core.instance.instance", "DagsterInstance.get_execution_plan_snapshot", ("snapshot_id",), "copy_run"),
    ("dagster._core.instance.instance", "DagsterInstance.get_job_snapshot", ("snapshot_id",), "copy_run"),
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


def test_fail_dead_run_marks_it_failed_and_frees_its_pool_slots(instance: dg.DagsterInstance) -> None:
    job = one_asset_job()
    run = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED)
    pool = "stormlake_ingest"
    instance.event_log_storage.set_concurrency_slots(pool, 1)
    instance.event_log_storage.claim_concurrency_slot(pool, run.run_id, "one")
    assert run.run_id in instance.event_log_storage.get_concurrency_info(pool).active_run_ids

    compat.fail_dead_run(instance, run, "its process died")
    record = instance.get_run_record_by_id(run.run_id)
    assert record is not None and record.dagster_run.status == dg.DagsterRunStatus.FAILURE, _fail(
        f"the run is {record.dagster_run.status if record else None} after report_run_failed", "fail_dead_run")
    failures = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert [e.message for e in failures] == ["its process died"], _fail("the failure message is lost", "fail_dead_run")
    assert run.run_id not in instance.event_log_storage.get_concurrency_info(pool).active_run_ids, _fail(
        "the dead run still holds its pool slot", "fail_dead_run")


def _idle_connections(admin_dsn: str, database: str) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                            (database,)).fetchone()[0]


def test_pool_storage_connections_keeps_connections_open(instance: dg.DagsterInstance, pg_admin_dsn: str) -> None:
    import os

    database = str(psycopg.conninfo.conninfo_to_dict(os.environ["STORMLAKE_TEST_DAGSTER_DSN"])["dbname"])
    instance.get_runs(limit=1)
    assert _idle_connections(pg_admin_dsn, database) == 0  # dagster-postgres's default: a connection per call
    compat.pool_storage_connections(instance, max_overflow=4)
    instance.get_runs(limit=1)
    assert _idle_connections(pg_admin_dsn, database) >= 1, _fail(
        "optimize_for_webserver no longer keeps a connection pool", "pool_storage_connections")


def _range_job() -> dg.JobDefinition:
    """Two assets written by one op over three partitions, with a check: a phase in miniature."""
    parts = dg.StaticPartitionsDefinition(["a", "b", "c"])

    @dg.multi_asset(specs=[dg.AssetSpec("t1", partitions_def=parts), dg.AssetSpec("t2", partitions_def=parts)],
                    partitions_def=parts, can_subset=False, check_specs=[dg.AssetCheckSpec("grader", asset="t1")])
    def phase():  # noqa: ANN202 - never executed here: the tests only create runs of it
        yield from ()

    return dg.Definitions(assets=[phase], jobs=[dg.define_asset_job("j", partitions_def=parts)]).resolve_job_def("j")


def _run_events(dsn: str, run_id: str) -> list[tuple[str, str, str | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT dagster_event_type, asset_key, partition FROM event_logs WHERE run_id = %s"
                            " AND dagster_event_type LIKE '%%PLANNED' ORDER BY id", (run_id,)).fetchall()
        checks = conn.execute("SELECT 'check', asset_key || check_name, partition FROM asset_check_executions"
                              " WHERE run_id = %s ORDER BY id", (run_id,)).fetchall()
    return sorted(rows) + sorted(checks)


def test_the_step_error_wrappers_are_what_a_failed_step_reports(instance: dg.DagsterInstance) -> None:
    class PhaseError(Exception):
        pass

    @dg.asset(retry_policy=dg.RetryPolicy(max_retries=1))
    def failing() -> None:
        raise PhaseError("boom")

    result = dg.materialize([failing], instance=instance, raise_on_error=False)
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    err = failure.step_failure_data.error
    seen = []
    while err is not None and err.cls_name in compat.step_error_wrappers():
        seen.append(err.cls_name)
        err = err.cause
    assert err is not None and err.cls_name == "PhaseError", _fail(
        f"a failed step's error unwraps through {seen} to {err.cls_name if err else None}, not to the step's own",
        "step_error_wrappers")
    assert "RetryRequestedFromPolicy" in seen or "DagsterExecutionStepExecutionError" in seen
