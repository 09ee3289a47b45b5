"""A bad partition of a key range run fails alone, the Dagster way.

The range's phase step logs the materializations of the partitions that succeeded, then fails
naming the bad one; Dagster's partition status shows the good ones materialized and the bad one
failed; the outbox sensor continues the good ones from the next phase once the failed run is
over; a run of the same range again computes only the bad partition. Real Delta tables, the real
ledger and a Dagster instance on PostgreSQL (the project's ``dagster.yaml``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import PARTITIONS
from assets.phases import INGEST, PHASES, table_keys
from pipeline.sensors import OutboxCursor, evaluate_outbox
from resources.keys import RANGE_END_TAG, RANGE_START_TAG
from tests.helpers import requested_keys
from tests.ledger_sql import query

# The sample landing's two days of two regions: one key range of the four (two days x two regions).
KEYS = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]
BAD = "2026-09-01|pine_belt"
GOOD = [k for k in KEYS if k != BAD]
RANGE = {RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[-1]}
M = dg.AssetPartitionStatus.MATERIALIZED
F = dg.AssetPartitionStatus.FAILED


@pytest.fixture
def instance(sl_env: dict[str, str]) -> Iterator[dg.DagsterInstance]:
    """The project's own Dagster instance (dagster.yaml written by prepare_dagster_home)."""
    from pipeline.instance import prepare_dagster_home
    from resources.settings import load_settings

    prepare_dagster_home(load_settings())
    with dg.DagsterInstance.get() as inst:
        yield inst


def _job() -> dg.JobDefinition:
    """storm_job bound to resources built from this test's environment."""
    from pipeline.definitions import PHASE_ASSETS, build_resources
    from pipeline.jobs import storm_job

    return dg.Definitions(assets=PHASE_ASSETS, jobs=[storm_job], resources=build_resources()).resolve_job_def(
        "storm_job")


def _ledger():
    from resources.ledger import get_ledger

    dsn = os.environ["STORMLAKE_PG_DSN"]
    return get_ledger(dsn, owner_dsn=dsn)


def _landing(sl_env: dict[str, str], key: str) -> Path:
    day, _, region = key.partition("|")
    return Path(sl_env["STORMLAKE_HOME"]) / "landing" / region / day


def _break_weather(sl_env: dict[str, str], key: str) -> bytes:
    """Put undecodable bytes on the second line of the partition's weather.csv; its content before."""
    path = _landing(sl_env, key) / "weather.csv"
    data = path.read_bytes()
    cut = data.index(b"\n") + 1
    path.write_bytes(data[:cut] + b"\xff\xfe\xfd,broken\n" + data[cut:])
    return data


def _step_failures(result: dg.ExecuteInProcessResult) -> list[dg.DagsterEvent]:
    return [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]


def _statuses(instance: dg.DagsterInstance, asset: str, keys: list[str]) -> dict[str, dg.AssetPartitionStatus | None]:
    return instance.get_status_by_partition(dg.AssetKey(asset), keys, PARTITIONS)


def _events(run_id: str) -> list[tuple[str, str, str]]:
    """(partition, phase, status) of a run's checkpoint events, in their order."""
    return [(r["partition_key"], r["phase"], r["status"]) for r in query(_ledger(),
            "SELECT partition_key, phase, status FROM checkpoint_events WHERE run_id = %s ORDER BY event_id",
            (run_id,))]


def _mats(instance: dg.DagsterInstance, run_id: str) -> dict[tuple[str, str], dg.AssetMaterialization]:
    """(table, partition) -> its materialization in the run, as the instance stored it."""
    out: dict[tuple[str, str], dg.AssetMaterialization] = {}
    for table in table_keys(PHASES):
        records = instance.fetch_materializations(table, limit=100).records
        for rec in records:
            if rec.run_id == run_id and rec.asset_materialization is not None:
                out[(table.to_user_string(), str(rec.asset_materialization.partition))] = rec.asset_materialization
    return out


def test_a_bad_partition_of_a_range_fails_alone_and_the_good_ones_are_continued(
        sl_env: dict[str, str], instance: dg.DagsterInstance) -> None:
    job = _job()
    # One good partition was ingested already (a run of ingest alone): the range finds it done.
    done_before = "2026-09-02|gulf_coast"
    assert job.execute_in_process(partition_key=done_before, asset_selection=table_keys([INGEST]),
                                  instance=instance).success
    original = _break_weather(sl_env, BAD)

    # 1. The range run: ingest's step fails naming the bad partition, in one line.
    result = job.execute_in_process(instance=instance, tags=RANGE, raise_on_error=False)
    assert not result.success
    (failure,) = _step_failures(result)
    assert failure.step_key == INGEST.asset
    error = failure.step_failure_data.user_failure_data
    assert error is not None
    assert error.description.startswith(f"ingest of {BAD} failed: ") and "\n" not in error.description
    assert "pine_belt/2026-09-01/weather.csv" in error.description
    assert error.metadata["failed_partitions"].value == [BAD]
    assert set(error.metadata["failures"].value) == {BAD}
    # The later phases' steps did not start, for any partition of the range.
    started = {e.step_key for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START}
    assert started == {INGEST.asset}, started

    # The good partitions' materializations of ingest's tables are in the failed run, each with
    # the metadata of a successful range step and the table's content hash.
    mats = _mats(instance, result.run_id)
    assert sorted(mats) == sorted((t, k) for t in INGEST.tables for k in GOOD), sorted(mats)
    heads = {(cp.partition_key, cp.phase): cp for cp in _ledger().heads(KEYS)}
    for (table, key), mat in mats.items():
        cp = heads[(key, "ingest")]
        assert mat.metadata["status"].value == ("SKIPPED" if key == done_before else "COMPLETED"), (table, key)
        assert mat.metadata["seq"].value == cp.seq
        assert mat.metadata["dagster/table_name"].value == table
        assert mat.metadata["dagster/partition_row_count"].value == cp.summary["rows"][table]
        assert mat.metadata["delta_version"].value == cp.summary["delta_versions"][table]
        # The step's counts, then the partition's own entries (its ``skipped`` over the step's).
        assert (mat.metadata["partitions"].value, mat.metadata["completed"].value) == (3, 2)
        assert mat.metadata["skipped"].value is (key == done_before)
        assert mat.metadata["table_hash"].value == cp.summary["table_hashes"][table]
    assert heads[(BAD, "ingest")].status == "FAILED"
    assert "pine_belt/2026-09-01/weather.csv" in heads[(BAD, "ingest")].error_message

    # What Dagster shows of each partition: the phase that failed, good ones materialized and
    # the bad one failed; the later phases' tables failed for all (their steps were planned in
    # the failed run and did not run), except the one whose later phases are still missing.
    assert _statuses(instance, "outages_raw", KEYS) == {**dict.fromkeys(GOOD, M), BAD: F}
    downstream = _statuses(instance, "region_day_summary", KEYS)
    assert downstream == dict.fromkeys(KEYS, F), downstream

    # 2. The outbox sensor: the producing run failed and is over, so each good partition is
    # continued from enrich (the partition ingested before, after its skip); the bad one is not.
    decision = evaluate_outbox(_ledger(), instance, OutboxCursor.parse(None))
    assert sorted(k for r in decision.requests for k in requested_keys(r)) == sorted(GOOD), decision.lines
    for request in decision.requests:
        assert request.tags["stormlake/resume_after"] == "ingest"
        assert request.asset_selection == table_keys(PHASES[1:])
    for request in decision.requests:  # the runs the sensor requests, as the daemon would launch them
        run = job.execute_in_process(instance=instance, tags=request.tags, partition_key=request.partition_key,
                                     asset_selection=request.asset_selection, raise_on_error=False)
        assert run.success
    heads = {(cp.partition_key, cp.phase): cp for cp in _ledger().heads(KEYS)}
    for key in GOOD:
        assert [heads[(key, p.name)].status for p in PHASES] == ["COMPLETED"] * 4, key
        assert heads[(key, "ingest")].attempt == 1  # ingest was not run again
    assert [(k, p) for (k, p) in heads if k == BAD] == [(BAD, "ingest")]
    for table in ("outages_raw", "outages_enriched", "region_day_summary"):
        assert _statuses(instance, table, KEYS) == {**dict.fromkeys(GOOD, M), BAD: F}, table
    # The continuations' events moved the good partitions on: nothing more to continue.
    assert evaluate_outbox(_ledger(), instance, decision.cursor).requests == []

    # 3. The same range again, the bad file mended (a new backfill of it, or "from failure"):
    # the ledger skips every phase of the good partitions; only the bad one is computed.
    (_landing(sl_env, BAD) / "weather.csv").write_bytes(original)
    again = job.execute_in_process(instance=instance, tags=RANGE, raise_on_error=False)
    assert again.success
    events = _events(again.run_id)
    assert {s for k, _, s in events if k != BAD} == {"SKIPPED"}, events
    assert sorted({(k, p) for k, p, _ in events if k != BAD}) == sorted((k, p.name) for k in GOOD for p in PHASES)
    assert [(p, s) for k, p, s in events if k == BAD] == [
        (p.name, s) for p in PHASES for s in ("PENDING", "COMPLETED")]
    for table in ("outages_raw", "region_day_summary"):
        assert _statuses(instance, table, KEYS) == dict.fromkeys(KEYS, M), table


def test_a_range_that_mixes_landed_and_not_landed_partitions(sl_env: dict[str, str],
                                                               instance: dg.DagsterInstance) -> None:
    """The landed partitions are materialized and continued; the one with no landing files fails
    the step in one line, and the ledger has no trace of it."""
    keys = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-01|red_hills"]  # red_hills has no files
    assert not _landing(sl_env, keys[-1]).exists()
    job = _job()
    result = job.execute_in_process(instance=instance, raise_on_error=False,
                                    tags={RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]})
    assert not result.success
    (failure,) = _step_failures(result)
    error = failure.step_failure_data.user_failure_data
    assert error.description == "ingest: 2026-09-01|red_hills has not landed (no landing files)"
    assert error.metadata["failed_partitions"].value == [keys[-1]]
    assert sorted(_mats(instance, result.run_id)) == sorted((t, k) for t in INGEST.tables for k in keys[:2])
    assert _statuses(instance, "outages_raw", keys) == {keys[0]: M, keys[1]: M, keys[2]: F}
    assert not query(_ledger(), "SELECT 1 FROM checkpoint_events WHERE partition_key = %s", (keys[-1],))

    decision = evaluate_outbox(_ledger(), instance, OutboxCursor.parse(None))
    assert [requested_keys(r) for r in decision.requests] == [keys[:2]], decision.lines


def test_a_range_that_failed_is_run_again_from_failure(sl_env: dict[str, str], instance: dg.DagsterInstance) -> None:
    """Re-execution "from failure" (the UI's button) of a range run whose ingest failed for one
    partition: once the file is mended, the ledger skips the partitions that succeeded and the
    bad one is computed; the re-execution succeeds."""
    original = _break_weather(sl_env, BAD)
    failed = dg.execute_job(dg.reconstructable(_storm_job_for_reexecution), instance=instance, tags=RANGE)
    assert not failed.success
    (_landing(sl_env, BAD) / "weather.csv").write_bytes(original)
    options = dg.ReexecutionOptions.from_failure(failed.run_id, instance)
    # The UI's re-execution carries the parent run's tags (its key range); execute_job takes them given.
    retried = dg.execute_job(dg.reconstructable(_storm_job_for_reexecution), instance=instance, tags=RANGE,
                             reexecution_options=options)
    assert retried.success
    events = _events(retried.run_id)
    assert [(k, p, s) for k, p, s in events if p == "ingest" and k != BAD] == [
        (k, "ingest", "SKIPPED") for k in GOOD]
    assert ("2026-09-01|pine_belt", "present", "COMPLETED") in events
    assert all(_statuses(instance, t, KEYS) == dict.fromkeys(KEYS, M) for t in ("outages_raw", "region_day_summary"))


def _storm_job_for_reexecution() -> dg.JobDefinition:
    return _job()


def test_no_step_asks_dagster_for_a_retry_of_its_run(sl_env: dict[str, str], instance: dg.DagsterInstance) -> None:
    """A failed range run carries only the tags it was launched with: no retry is asked for."""
    _break_weather(sl_env, BAD)
    result = _job().execute_in_process(instance=instance, tags=RANGE, raise_on_error=False)
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None
    assert {k: v for k, v in run.tags.items() if k.startswith("stormlake/") or k in (
        "dagster/retry_on_asset_or_op_failure", "dagster/max_retries")} == {}




def test_a_transient_failure_in_a_range_logs_the_partitions_finished_before_it(
        sl_env: dict[str, str], instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    """Present's deliveries to the webhook fail for the range's second partition (5xx, tries
    exhausted: transient): the step fails for Dagster's retry, each time after logging the first
    partition's materializations (delivered, checkpointed; a retry finds it done). Once the
    retries are spent, the first partition shows materialized, the second failed."""
    from resources.publisher import ARTIFACT_KINDS
    from tests.consumer import Consumer

    keys = KEYS[:2]  # one day's two regions: one key range
    tags = {RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[1]}
    assert _job().execute_in_process(instance=instance, tags=tags, asset_selection=table_keys(PHASES[:-1])).success
    first = len(ARTIFACT_KINDS)  # the first partition's deliveries are accepted, every later one refused
    with Consumer(script=dict.fromkeys(range(first, first + 100), 500)) as consumer:
        monkeypatch.setenv("STORMLAKE_WEBHOOK_URL", consumer.url)
        monkeypatch.setenv("STORMLAKE_WEBHOOK_TRIES", "1")
        monkeypatch.setenv("STORMLAKE_WEBHOOK_BACKOFF", "0")
        result = _job().execute_in_process(instance=instance, tags=tags, asset_selection=table_keys(PHASES[-1:]),
                                           raise_on_error=False)
        posts = consumer.snapshot()
    assert not result.success
    assert sum(e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY for e in result.all_events) == 2
    assert [p.answer for p in posts[:first]] == [200] * first, [(p.path, p.answer) for p in posts]
    assert {p.headers.get("x-stormlake-region") for p in posts[:first]} == {"gulf_coast"}
    heads = {(cp.partition_key, cp.phase): cp.status for cp in _ledger().heads(keys)}
    assert (heads[(keys[0], "present")], heads[(keys[1], "present")]) == ("COMPLETED", "FAILED")
    # Logged on each of the three tries: computed on the first, found done on the retries.
    mats = [r.asset_materialization for r in instance.fetch_materializations(dg.AssetKey("region_day_summary"),
                                                                             limit=10).records
            if r.run_id == result.run_id]
    assert sorted((str(m.partition), m.metadata["status"].value) for m in mats) == [
        (keys[0], "COMPLETED"), (keys[0], "SKIPPED"), (keys[0], "SKIPPED")]
    assert _statuses(instance, "region_day_summary", keys) == {keys[0]: M, keys[1]: F}
