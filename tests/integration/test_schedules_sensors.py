"""The daily schedule, the landing sensor and the outbox sensor, evaluated against a real ledger
(PostgreSQL), a real landing folder and a real Dagster instance on PostgreSQL; and a failing
blocking grader that stops the phases after it."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from assets.partitions import region_ids
from assets.phases import ENRICH, INGEST, PHASES, table_keys
from assets.plan import MAX_PARTITIONS_PER_RUN
from pipeline.sensors import OutboxCursor, evaluate_outbox, landing_run_key, landing_sensor, outbox_sensor
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.ledger_resource import LedgerResource
from resources.pgserver import with_database
from tests.helpers import KEY, materialize, requested_keys
from tests.ledger_sql import query

UTC = dt.UTC
OTHER = "2026-09-01|pine_belt"


@pytest.fixture
def instance(sl_env: dict[str, str]) -> Iterator[dg.DagsterInstance]:
    """The project's own Dagster instance (dagster.yaml written by prepare_dagster_home)."""
    from pipeline.instance import prepare_dagster_home
    from resources.settings import load_settings

    prepare_dagster_home(load_settings())
    with dg.DagsterInstance.get() as inst:
        yield inst


def _resources() -> dict[str, object]:
    from pipeline.definitions import build_resources

    return dict(build_resources())


def _storm_job() -> dg.JobDefinition:
    """storm_job bound to resources built from this test's environment (not the import-time ones)."""
    from pipeline.definitions import PHASE_ASSETS, build_resources
    from pipeline.jobs import storm_job

    return dg.Definitions(assets=PHASE_ASSETS, jobs=[storm_job], resources=build_resources()).resolve_job_def(
        "storm_job")


def _ledger():
    from resources.ledger import get_ledger

    dsn = os.environ["STORMLAKE_PG_DSN"]
    return get_ledger(dsn, owner_dsn=dsn)  # the contract's one DSN owns the ledger: migrated on first use


def _heads(key: str) -> dict[str, object]:
    return {cp.phase: cp for cp in _ledger().heads([key])}


# ---- the daily schedule ------------------------------------------------------------------------
def daily_storm_schedule(ctx: dg.ScheduleEvaluationContext):
    """The daily schedule as the code location resolves it (its cadence comes from the job's assets)."""
    from pipeline.definitions import defs

    return defs.resolve_schedule_def("daily_storm_schedule")(ctx)


def _landed(day: str) -> list[str]:
    """The keys of ``day`` whose landing files are there, in the region file's order."""
    from resources.landing import Landing
    from resources.settings import load_settings

    zone = Landing(load_settings().landing)
    return [f"{day}|{r}" for r in region_ids() if zone.has_partition_files(r, day)]


def test_daily_schedule_requests_yesterday_s_landed_regions_in_key_ranges(sl_env: dict[str, str], instance) -> None:
    ctx = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 9, 3, 3, 0, tzinfo=UTC))
    requests = daily_storm_schedule(ctx)
    landed = _landed("2026-09-02")
    # Every region of yesterday whose files landed, once, in runs of neighbouring regions as a UI
    # backfill's (none over the backfill policy's size); the others are not requested.
    assert landed and len(landed) < len(region_ids())
    assert [k for r in requests for k in requested_keys(r)] == landed
    assert len(requests) == -(-len(landed) // MAX_PARTITIONS_PER_RUN)
    assert all(len(requested_keys(r)) <= MAX_PARTITIONS_PER_RUN for r in requests)
    # The run key is the range: a tick evaluated twice never launches a partition twice.
    assert [r.run_key for r in requests] == ["..".join(dict.fromkeys((requested_keys(r)[0], requested_keys(r)[-1])))
                                             for r in requests]
    assert all(r.tags["stormlake/launched_by"] == "daily_schedule" for r in requests)


def test_daily_schedule_uses_the_utc_day_and_is_stable_within_a_tick(sl_env: dict[str, str]) -> None:
    # 23:30 on Sept 2 in Chicago is 04:30 UTC on Sept 3: yesterday is Sept 2 (UTC days).
    chicago = dt.timezone(dt.timedelta(hours=-5))
    ctx = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 9, 2, 23, 30, tzinfo=chicago))
    first = daily_storm_schedule(ctx)
    again = daily_storm_schedule(ctx)
    assert {k.split("|")[0] for r in first for k in requested_keys(r)} == {"2026-09-02"}
    assert [r.run_key for r in first] == [r.run_key for r in again]  # same tick, same run keys


def test_daily_schedule_skips_days_before_the_first_day() -> None:
    ctx = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 9, 1, 3, 0, tzinfo=UTC))
    result = daily_storm_schedule(ctx)  # yesterday, 2026-08-31, is before the first day
    assert isinstance(result, dg.SkipReason)
    assert "no partitions" in (result.skip_message or "")


def test_daily_schedule_evaluates_through_the_code_location(sl_env: dict[str, str]) -> None:
    from pipeline.definitions import defs

    schedule = defs.resolve_schedule_def("daily_storm_schedule")
    assert schedule.cron_schedule == "5 0 * * *"  # the day just closed, five minutes after midnight UTC
    assert schedule.execution_timezone == "UTC"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    data = schedule.evaluate_tick(dg.build_schedule_context(
        scheduled_execution_time=dt.datetime(2026, 9, 2, 3, 0, tzinfo=UTC), repository_def=defs.get_repository_def()))
    assert {k for r in data.run_requests or [] for k in requested_keys(r)} == set(_landed("2026-09-01"))


# ---- the landing sensor ------------------------------------------------------------------------
def _landing_tick(cursor: str | None, instance: dg.DagsterInstance) -> dg.SensorResult:
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources=_resources())
    result = landing_sensor(ctx)
    assert isinstance(result, dg.SensorResult)
    return result


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_landing_sensor_requests_new_and_changed_partitions_only(sl_env: dict[str, str], instance) -> None:
    landing = Path(sl_env["STORMLAKE_HOME"]) / "landing"
    # Folders that are not partitions: an unknown region, a day before the first day, tomorrow.
    tomorrow = (dt.datetime.now(UTC).date() + dt.timedelta(days=1)).isoformat()
    for folder in ("atlantis/2026-09-01", "gulf_coast/2026-08-31", f"gulf_coast/{tomorrow}"):
        for name in ("outages.csv", "weather.csv"):
            _write(landing / folder / name, (landing / "gulf_coast/2026-09-01" / name).read_text())
    # A complete past day still missing its weather file: waits, is not requested, not in the cursor.
    _write(landing / "gulf_coast/2026-09-03/outages.csv", (landing / "gulf_coast/2026-09-01/outages.csv").read_text())

    first = _landing_tick(None, instance)
    keys = sorted(k for r in first.run_requests for k in requested_keys(r))
    assert keys == ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]
    assert len(first.run_requests) == 2  # a day's two neighbouring regions a run
    cursor = json.loads(first.cursor)
    assert sorted(cursor) == keys
    for r in first.run_requests:
        assert r.run_key == landing_run_key(requested_keys(r), cursor)
        assert r.run_key.startswith(f"landing:{requested_keys(r)[0]}..{requested_keys(r)[-1]}:")
        assert r.tags["stormlake/launched_by"] == "landing_sensor"

    # Nothing changed: nothing requested, same cursor.
    second = _landing_tick(first.cursor, instance)
    assert second.run_requests == []
    assert "no new or changed landing files" in (second.skip_reason.skip_message or "")
    assert json.loads(second.cursor) == cursor

    # Publish KEY, then touch its outages file without changing it: the fingerprint changes, but the
    # ledger says every phase would skip, so no run is launched (and the cursor moves on).
    assert materialize(KEY, instance=instance).success
    outages = landing / "gulf_coast/2026-09-01/outages.csv"
    st = outages.stat()
    os.utime(outages, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    third = _landing_tick(second.cursor, instance)
    assert third.run_requests == []
    assert "1 new or changed partition(s) already done" in (third.skip_reason.skip_message or "")
    assert json.loads(third.cursor)[KEY] != cursor[KEY]

    # Change the content of one partition and complete the waiting one: exactly those two.
    weather = landing / "pine_belt/2026-09-01/weather.csv"
    lines = weather.read_text().splitlines(keepends=True)
    weather.write_text("".join(lines[:-1]))
    _write(landing / "gulf_coast/2026-09-03/weather.csv", (landing / "gulf_coast/2026-09-01/weather.csv").read_text())
    fourth = _landing_tick(third.cursor, instance)
    assert sorted(k for r in fourth.run_requests for k in requested_keys(r)) == ["2026-09-01|pine_belt", "2026-09-03|gulf_coast"]
    new_cursor = json.loads(fourth.cursor)
    pine = next(r for r in fourth.run_requests if r.partition_key == "2026-09-01|pine_belt")
    assert pine.run_key == f"landing:2026-09-01|pine_belt:{new_cursor['2026-09-01|pine_belt']}"
    assert pine.run_key not in {r.run_key for r in first.run_requests}
    assert "atlantis" not in fourth.cursor and "2026-08-31" not in fourth.cursor and tomorrow not in fourth.cursor


def test_a_range_the_landing_sensor_requests_runs_each_of_its_partitions(sl_env: dict[str, str], instance) -> None:
    (request, *_) = _landing_tick(None, instance).run_requests
    assert len(requested_keys(request)) == 2
    result = _storm_job().execute_in_process(instance=instance, tags=request.tags, raise_on_error=False)
    assert result.success
    for key in requested_keys(request):
        assert {phase: cp.status for phase, cp in _heads(key).items()} == {p.name: "COMPLETED" for p in PHASES}


def test_landing_sensor_changed_reference_file_requests_every_partition(sl_env: dict[str, str], instance) -> None:
    landing = Path(sl_env["STORMLAKE_HOME"]) / "landing"
    first = _landing_tick(None, instance)
    ref = landing / "reference/customers.csv"
    ref.write_text(ref.read_text() + "\n")
    again = _landing_tick(first.cursor, instance)
    assert len([k for r in again.run_requests for k in requested_keys(r)]) == 4
    assert {r.run_key for r in again.run_requests}.isdisjoint({r.run_key for r in first.run_requests})
    # The reference files are part of every partition's landing_files version: all four are observed anew.
    versions = [{e.partition: e.tags["dagster/data_version"] for e in t.asset_events} for t in (first, again)]
    assert sorted(versions[0]) == sorted(versions[1]) == sorted(k for r in again.run_requests for k in requested_keys(r))
    assert all(versions[0][k] != versions[1][k] for k in versions[0])


# ---- the outbox sensor -------------------------------------------------------------------------
def _outbox_tick(instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult:
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"ledger": LedgerResource(dsn=os.environ["STORMLAKE_PG_DSN"])})
    result = outbox_sensor(ctx)
    assert isinstance(result, dg.SensorResult)
    return result


def _completed_event(key: str, phase: str) -> int:
    rows = query(_ledger(), 
        "SELECT max(event_id) AS id FROM checkpoint_events WHERE partition_key = %s AND phase = %s"
        " AND status = 'COMPLETED'", (key, phase))
    return int(rows[0]["id"])


def test_outbox_continues_a_partition_stopped_between_phases(sl_env: dict[str, str], instance) -> None:
    # One partition all the way through (nothing to continue), one stopped after ingest.
    assert materialize(OTHER, instance=instance).success
    assert materialize(KEY, selection=table_keys(INGEST), instance=instance).success
    ingest_event = _completed_event(KEY, "ingest")

    first = _outbox_tick(instance, None)
    assert len(first.run_requests) == 1
    req = first.run_requests[0]
    assert req.partition_key == KEY
    assert req.run_key == f"outbox:{ingest_event}"
    # Every table of enrich, correlate and present, and their graders.
    assert req.asset_selection == table_keys(PHASES[1:])
    assert sorted(k.to_user_string() for k in req.asset_check_keys) == sorted(
        f"{p.tables[0]}:grader" for p in PHASES[1:])
    cursor = OutboxCursor.parse(first.cursor)
    assert cursor.pending == {}
    assert cursor.after == int(query(_ledger(), "SELECT max(event_id) AS m FROM checkpoint_events")[0]["m"])

    # No new events: nothing again (the run key would also stop a duplicate).
    assert _outbox_tick(instance, first.cursor).run_requests == []

    # The requested run is a valid run of storm_job: it finishes the partition.
    done = _storm_job().execute_in_process(partition_key=KEY, asset_selection=req.asset_selection, instance=instance,
                                  tags=req.tags, raise_on_error=False)
    assert done.success
    heads = _heads(KEY)
    assert [heads[p.name].status for p in PHASES] == ["COMPLETED"] * 4
    assert heads["ingest"].attempt == 1  # ingest was not run again
    # Its events (enrich..present) come after: the partition moved on, nothing to request.
    after = _outbox_tick(instance, first.cursor)
    assert after.run_requests == []
    assert OutboxCursor.parse(after.cursor).pending == {}


def test_outbox_continues_neighbours_stopped_after_the_same_phase_in_one_key_range(
        sl_env: dict[str, str], instance) -> None:
    # Two neighbouring regions of a day stopped after ingest, a third partition after enrich.
    third = "2026-09-02|gulf_coast"
    for key in (KEY, OTHER):
        assert materialize(key, selection=table_keys(INGEST), instance=instance).success
    assert materialize(third, selection=table_keys([INGEST, ENRICH]), instance=instance).success
    events = {key: _completed_event(key, "ingest") for key in (KEY, OTHER)}
    enrich_event = _completed_event(third, "enrich")

    tick = _outbox_tick(instance, None)
    assert len(tick.run_requests) == 2
    pair, alone = tick.run_requests
    assert requested_keys(pair) == [KEY, OTHER]  # one run for the range, not one a partition
    assert pair.run_key == f"outbox:{events[KEY]},{events[OTHER]}"
    assert pair.tags["stormlake/outbox_event"] == f"{events[KEY]},{events[OTHER]}"
    assert pair.tags["stormlake/resume_after"] == "ingest"
    assert pair.asset_selection == table_keys(PHASES[1:])
    assert sorted(k.to_user_string() for k in pair.asset_check_keys) == sorted(f"{p.tables[0]}:grader" for p in PHASES[1:])
    assert (alone.partition_key, alone.run_key) == (third, f"outbox:{enrich_event}")
    assert alone.asset_selection == table_keys(PHASES[2:])

    # The range's request is a valid run of storm_job: both partitions finish, ingest is not run again.
    done = _storm_job().execute_in_process(instance=instance, tags=pair.tags, asset_selection=pair.asset_selection,
                                           raise_on_error=False)
    assert done.success
    for key in (KEY, OTHER):
        heads = _heads(key)
        assert [heads[p.name].status for p in PHASES] == ["COMPLETED"] * 4
        assert heads["ingest"].attempt == 1
    # Both moved on: the next tick from the same cursor continues only the third.
    again = _outbox_tick(instance, None)
    assert [r.run_key for r in again.run_requests] == [f"outbox:{enrich_event}"]


def test_outbox_waits_while_the_producing_run_is_in_progress(sl_env: dict[str, str], instance) -> None:
    from assets import ingest
    from assets.context import PartitionRef
    from assets.materialize import build_runner
    run = instance.create_run_for_job(_storm_job(), status=dg.DagsterRunStatus.STARTED,
                                      tags={"dagster/partition": KEY})
    with dg.build_resources(_resources()) as res:  # resolves the EnvVar DSN like a run would
        runner = build_runner(None, ledger=res.ledger, lake=res.lake, landing=res.landing, publisher=res.publisher)
        runner.run_id = run.run_id
        runner.run(INGEST, PartitionRef.parse(KEY, runner.regions), ingest.compute, ingest.grade)
    ingest_event = _completed_event(KEY, "ingest")

    first = _outbox_tick(instance, None)
    assert first.run_requests == []
    cursor = OutboxCursor.parse(first.cursor)
    assert cursor.after >= ingest_event
    assert set(cursor.pending or {}) == {KEY}
    assert cursor.pending[KEY].event_id == ingest_event and cursor.pending[KEY].run_id == run.run_id

    # Still running: still pending, across ticks, though no new event arrives.
    second = _outbox_tick(instance, first.cursor)
    assert second.run_requests == []
    assert set(OutboxCursor.parse(second.cursor).pending or {}) == {KEY}

    # The worker died between phases: the run is marked failed; the next tick continues the partition.
    instance.report_run_failed(instance.get_run_by_id(run.run_id), "its worker died")  # as run monitoring does
    third = _outbox_tick(instance, second.cursor)
    assert [r.run_key for r in third.run_requests] == [f"outbox:{ingest_event}"]
    assert third.run_requests[0].asset_selection == table_keys(PHASES[1:])
    assert OutboxCursor.parse(third.cursor).pending == {}


def test_outbox_reads_an_event_committed_late_behind_a_higher_id(sl_env: dict[str, str], instance) -> None:
    """Event ids are handed out at insert, not at commit: a transaction that inserts its event first
    and commits last holds the lower id. A tick between the two commits must not move past it;
    the next tick reads it, and both partitions are continued."""
    _ledger().migrate()
    with psycopg.connect(os.environ["STORMLAKE_PG_DSN"]) as late:  # open until late.commit()
        (late_id,) = late.execute(
            "INSERT INTO checkpoint_events (partition_key, region_id, day, phase, status, input_hash)"
            " VALUES (%s, 'gulf_coast', '2026-09-01', 'ingest', 'COMPLETED', 'late') RETURNING event_id",
            (KEY,)).fetchone()
        assert materialize(OTHER, selection=table_keys(INGEST), instance=instance).success
        early_id = _completed_event(OTHER, "ingest")
        assert early_id > late_id  # committed first, with the higher id
        first = _outbox_tick(instance, None)
        late.commit()
    second = _outbox_tick(instance, first.cursor)
    ticks = (first, second)
    assert {k for t in ticks for r in t.run_requests for k in requested_keys(r)} == {KEY, OTHER}
    seen = {int(i) for t in ticks for r in t.run_requests for i in r.run_key.removeprefix("outbox:").split(",")}
    assert seen == {late_id, early_id}
    # The late event is behind the cursor now: a third tick reads nothing new.
    third = _outbox_tick(instance, second.cursor)
    assert third.run_requests == [] and OutboxCursor.parse(third.cursor).position == OutboxCursor.parse(
        second.cursor).position


def test_outbox_reads_a_cursor_stored_before_the_ledger_kept_transaction_ids(sl_env: dict[str, str],
                                                                             instance) -> None:
    """A cursor without ``after_txid`` (stored before migration 010) reads on from its event id:
    the events written before the migration carry txid 0, every later one comes after them."""
    assert materialize(KEY, selection=table_keys(INGEST), instance=instance).success
    old = json.dumps({"after": 0, "pending": {}})
    (req,) = _outbox_tick(instance, old).run_requests
    assert req.run_key == f"outbox:{_completed_event(KEY, 'ingest')}"


def test_outbox_reports_failures_and_reads_in_batches(sl_env: dict[str, str], instance) -> None:
    result = _materialize_with_failing_enrich_grader(KEY, instance)
    assert not result.success
    ledger = _ledger()
    decision = evaluate_outbox(ledger, instance, OutboxCursor.parse(None), batch=2)
    # Batch of two events (ingest PENDING, ingest COMPLETED): the ingest completion is a candidate,
    # but it is not the partition's latest event (enrich came after), so nothing is requested.
    assert decision.cursor.after == 2
    assert decision.requests == []
    rest = evaluate_outbox(ledger, instance, decision.cursor)
    failed = [line for line in rest.lines if line.startswith("FAILED")]
    assert len(failed) == 1 and "enrich" in failed[0] and "GraderError" in failed[0]
    assert rest.requests == []


# ---- a failing grader stops the phases after it -------------------------------------------------
def _failing_enrich_asset() -> dg.AssetsDefinition:
    from assets import enrich
    from assets.checks import Check
    from assets.materialize import asset_options, materialize_phase

    def failing_grade(io, out):
        yield from enrich.grade(io, out)
        yield Check("one_row_per_outage", False,
                    f"{out.figures['outages'] + 1} enriched rows for {out.figures['input_outages']} ingested outages")

    @dg.multi_asset(**asset_options(ENRICH))
    def enriched_outages(context, ledger: LedgerResource, lake: LakeResource,
                         landing: LandingResource, publisher: PublisherResource):
        yield from materialize_phase(context, ENRICH, enrich.compute, failing_grade, ledger=ledger, lake=lake,
                                     landing=landing, publisher=publisher)

    return enriched_outages


def _materialize_with_failing_enrich_grader(key: str, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    from assets.correlate import storm_correlation
    from assets.ingest import ingested_batch
    from assets.present import operational_picture

    return dg.materialize([ingested_batch, _failing_enrich_asset(), storm_correlation, operational_picture],
                          partition_key=key, resources=_resources(), instance=instance, raise_on_error=False)


def test_failing_grader_stops_downstream_and_commits_nothing(sl_env: dict[str, str], instance) -> None:
    from tests.helpers import table_versions

    result = _materialize_with_failing_enrich_grader(KEY, instance)
    assert not result.success

    # Dagster: ingest's tables materialized, enrich failed, correlate and present never ran.
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert materialized == set(INGEST.tables)
    failed_steps = {e.step_key for e in result.all_events if e.is_step_failure}
    assert failed_steps == {ENRICH.asset}
    started = {e.step_key for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START}
    assert started == {INGEST.asset, ENRICH.asset}

    # The asset check evaluation is recorded as failed, in the run and in the instance.
    evals = {(e.asset_check_key.asset_key.to_user_string(), e.passed) for e in result.get_asset_check_evaluations()}
    assert ("outages_enriched", False) in evals
    record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(dg.AssetKey("outages_enriched"),
                                                                                "grader"))
    assert record is not None and record.status.value == "FAILED"
    assert record.evaluation is not None and record.evaluation.passed is False
    assert "one_row_per_outage" in (record.evaluation.description or "")

    # The ledger: enrich FAILED with the grader's error, no COMPLETED enrich, nothing after it.
    heads = _heads(KEY)
    assert heads["ingest"].status == "COMPLETED"
    assert heads["enrich"].status == "FAILED"
    assert heads["enrich"].error_class == "GraderError"
    assert "one_row_per_outage" in heads["enrich"].error_message
    assert "correlate" not in heads and "present" not in heads
    completed = query(_ledger(), 
        "SELECT count(*) AS n FROM checkpoints WHERE partition_key = %s AND phase <> 'ingest' AND status = 'COMPLETED'",
        (KEY,))
    assert completed[0]["n"] == 0
    # Nothing of enrich reached the lake (the grade runs before any write).
    from resources.settings import load_settings

    assert table_versions(load_settings().lake)["outages_enriched"] is None
    assert _ledger().receipts(partition_key=KEY) == []

    # With the real grader, the same partition goes on from enrich: ingest is reused.
    again = materialize(KEY, instance=instance)
    assert again.success
    heads = _heads(KEY)
    assert [heads[p.name].status for p in PHASES] == ["COMPLETED"] * 4
    assert heads["ingest"].attempt == 1
    assert heads["enrich"].attempt == 2


def test_both_sensors_are_registered_running() -> None:
    """Landed files are run as they come (the day in progress); work already started is continued
    without a person."""
    from pipeline.definitions import defs

    status = {name: defs.resolve_sensor_def(name).default_status for name in ("landing_sensor", "outbox_sensor")}
    assert status == {"landing_sensor": dg.DefaultSensorStatus.RUNNING, "outbox_sensor": dg.DefaultSensorStatus.RUNNING}
    assert {defs.resolve_sensor_def(name).job_name for name in status} == {"storm_job"}


def test_a_dead_run_is_found_within_the_stated_bound(sl_env: dict[str, str], instance) -> None:
    """The bounds the docs state for a partition stopped by a dead run: the outbox sensor's
    interval (30 s) after the default launcher's code server fails the run, which the instance
    launches with; run monitoring's poll before that (a minute in all) for a launcher that checks
    workers. Both are what the instance and the sensor are configured with."""
    import yaml

    from pipeline.instance import RUN_MONITORING_POLL_S
    from pipeline.sensors import SENSOR_INTERVAL_S

    assert type(instance.run_launcher) is dg.DefaultRunLauncher
    assert outbox_sensor.minimum_interval_seconds == SENSOR_INTERVAL_S <= 30
    config = yaml.safe_load((Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml").read_text())
    assert config["run_monitoring"]["enabled"] is True
    assert config["run_monitoring"]["poll_interval_seconds"] == RUN_MONITORING_POLL_S
    assert RUN_MONITORING_POLL_S + SENSOR_INTERVAL_S <= 60


def test_stormlake_landing_sensor_stopped_registers_it_stopped(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = "from pipeline.definitions import defs; print(defs.resolve_sensor_def('landing_sensor').default_status)"
    env = {**os.environ, "STORMLAKE_LANDING_SENSOR": "stopped", "STORMLAKE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("STOPPED"), out.stdout


# ---- the instance ------------------------------------------------------------------------------
def test_the_run_queue_is_the_one_concurrency_setting(sl_env: dict[str, str], instance) -> None:
    """No phase has a concurrency pool: the queue's limits on runs are what bounds the work."""
    from pipeline.definitions import defs

    assert {defs.resolve_assets_def(p.tables[0]).op.pool for p in PHASES} == {None}
    assert instance.get_concurrency_config().run_queue_config.max_concurrent_runs >= 1
    # Dagster's own queue and launcher: every run waits in the queue, and is launched in a process of its own.
    assert type(instance.run_coordinator) is dg.QueuedRunCoordinator
    assert type(instance.run_launcher) is dg.DefaultRunLauncher
    # Dagster's storage is on the ledger's server, in a database of its own named after the ledger's.
    tables_sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    ledger_tables = {r["table_name"] for r in query(_ledger(), tables_sql)}
    assert {"checkpoints", "checkpoint_events", "receipts", "recorded_calls"} <= ledger_tables
    assert "runs" not in ledger_tables
    dagster_dsn = with_database(sl_env["STORMLAKE_PG_DSN"],
                                psycopg.conninfo.conninfo_to_dict(sl_env["STORMLAKE_PG_DSN"])["dbname"] + "_dagster")
    with psycopg.connect(dagster_dsn) as conn:
        dagster_tables = {r[0] for r in conn.execute(tables_sql)}
    assert {"runs", "event_logs", "concurrency_limits"} <= dagster_tables
