"""The Dagster side of a phase: builds the runner from resources, yields the results.

Each phase is one ``@dg.multi_asset`` (one op, named after the phase's ``Phase.asset``) with one
asset per Delta table it writes (:func:`asset_options`): the tables of a phase are written
together under one checkpoint, so the op cannot be subset. Every phase body is one call to
:func:`materialize_phase`, which runs the phase once per partition and reports one
materialization per table, with the table's standard metadata (row counts, name, URI, Delta
version) next to the phase's outcome; the column schema is the asset's definition metadata
(:func:`table_spec`), not repeated on every partition's materialization. Errors a retry can
fix (ledger unreachable, webhook 5xx exhausted, lease timeout) propagate so that the op's retry
policy applies; a user's bad input or a failed grader becomes ``dg.Failure`` with
``allow_retries=False`` and a one-line description.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg

from assets.checks import Check
from assets.context import Compute, Grader, PartitionRef
from assets.partitions import split_key
from assets.phases import PHASES, Phase
from assets.plan import BACKFILL_POLICY, MAX_PARTITIONS_PER_RUN
from assets.runner import DeadLettered, Force, Outcome, PhaseRunner
from assets.schemas import DESCRIPTIONS, PARTITION_COLUMNS, SCHEMAS, table_schema
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.errors import StormlakeError
from resources.keys import (
    FAILED_PARTITIONS_TAG,
    LAUNCHED_BY,
    MAX_RETRIES_TAG,
    PARENT_RUN_TAG,
    RETRY_ON_FAILURE_TAG,
    failed_partitions,
    partition_key,
)
from resources.lake import Lake
from resources.ledger_resource import LedgerResource
from resources.settings import load_settings

# Dagster-level retries of transient errors, on top of the ledger's and the webhook target's own
# bounded retries: a step is tried at most 3 times, 1 s and then about 2 s apart.
TRANSIENT_RETRY = dg.RetryPolicy(max_retries=2, delay=1, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)


# What the catalog shows of a table: a Delta table computed with pandas. The ledger on PostgreSQL
# holds checkpoints about the tables, not the tables, so it is not a kind of theirs.
TABLE_KINDS = {"deltalake", "pandas"}
# Who answers for every table of the pipeline: a team, or a person's email address.
OWNERS = ["team:stormlake"]
PRESENT_PHASE = PHASES[-1].name  # the operational picture: what consumers are delivered
#: How fresh the operational picture (present's table) must be. With the landing sensor on, a
#: changed landing file is delivered after its next tick and a run, so a storm whose files land
#: every few minutes keeps the picture inside the warning window; past it the UI shows the picture
#: WARN, past the fail window FAIL: landed files are waiting, or the storm has gone quiet
#: (docs/LIVE.md).
PICTURE_WARN_AFTER = dt.timedelta(minutes=5)
PICTURE_FAIL_AFTER = dt.timedelta(minutes=15)
PICTURE_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=PICTURE_FAIL_AFTER, warn_window=PICTURE_WARN_AFTER)


def table_spec(phase: Phase, table: str, *, deps: list[Any], kinds: set[str]) -> dg.AssetSpec:
    """The asset of one table of ``phase``: its lineage, group, versions and column schema.

    Its dependencies are the tables the phase reads (``Phase.input_tables``, at the versions its
    upstream checkpoints pinned) plus ``deps`` (ingest: the ``landing_files`` source).
    """
    from assets.partitions import PARTITIONS

    return dg.AssetSpec(
        key=table,
        deps=[*deps, *phase.input_tables],
        description=f"{DESCRIPTIONS[table]} Written by the {phase.name} phase (op {phase.asset}).",
        group_name=phase.name,
        code_version=f"{phase.code_version}.s{phase.schema_version}",
        kinds=kinds,
        owners=OWNERS,
        tags={"stormlake/phase": phase.name},
        metadata={
            "phase": dg.MetadataValue.text(phase.name),
            "tier": dg.MetadataValue.int(phase.tier),
            "dagster/table_name": dg.MetadataValue.text(table),
            "dagster/column_schema": dg.MetadataValue.table_schema(table_schema(table)),
        },
        partitions_def=PARTITIONS,
        freshness_policy=PICTURE_FRESHNESS if phase.name == PRESENT_PHASE else None,
        # The first phase's tables are not materialized for a partition whose files have not
        # landed (see :func:`not_landed`); Dagster then skips the later phases' steps.
        skippable=not phase.upstream_phases,
    )


def asset_options(phase: Phase, *, deps: list[Any] | None = None, kinds: set[str] | None = None) -> dict[str, Any]:
    """The ``@dg.multi_asset`` arguments of a phase: one asset per table, one op, one grader.

    The op is named after the phase (``Phase.asset``), so run and step names read as before; it
    cannot be subset, since the phase writes all its tables under one checkpoint. Partitions,
    the backfill policy, the retry policy and the pool (one per phase: the writer of its Delta
    tables) are the op's. The backfill policy gives a UI backfill's runs key ranges of up to
    ``MAX_PARTITIONS_PER_RUN`` partitions (:mod:`assets.plan`), as the CLI's runs of big partitions: Dagster's cost
    of a run (its creation, its start, its events) is paid once for each range instead of once
    for each partition. A range's failure stays with its partitions (:func:`_fail_step`).
    """
    from assets.partitions import PARTITIONS

    return dict(
        name=phase.asset,
        specs=[table_spec(phase, table, deps=deps or [], kinds=kinds or TABLE_KINDS) for table in phase.tables],
        partitions_def=PARTITIONS,
        can_subset=False,
        backfill_policy=BACKFILL_POLICY,
        retry_policy=TRANSIENT_RETRY,
        check_specs=[grader_spec(phase)],
    )


def grader_key(phase: Phase) -> dg.AssetKey:
    """The asset the phase's grader check is reported on: its first table.

    A check belongs to one asset; the grader judges the whole phase (every table's schema and
    the phase's invariants) before any of its tables is written, and its verdict holds for all
    of them. It sits on the first table, the phase's main output (``outages_raw``,
    ``outages_enriched``, ``cell_hour_stats``, ``region_day_summary``).
    """
    return dg.AssetKey(phase.tables[0])


def grader_spec(phase: Phase) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        "grader",
        asset=grader_key(phase),
        blocking=True,
        description=f"Schema and invariants of every table {phase.name} hands on "
                    f"({', '.join(phase.tables)}); the checkpoint commits only if it passes.",
    )


def build_runner(context: dg.AssetExecutionContext | None, *, ledger: LedgerResource, lake: LakeResource,
                 landing: LandingResource, publisher: PublisherResource,
                 outcome_log: Callable[[str], None] | None = None) -> PhaseRunner:
    log = context.log.info if context is not None else None
    settings = load_settings()
    return PhaseRunner(
        outcome_log=outcome_log,
        ledger=ledger.get(),
        lake=lake.get(SCHEMAS, partition_by=PARTITION_COLUMNS),
        landing=landing.get(),
        targets=publisher.targets(),
        regions=landing.regions(),
        run_id=context.run.run_id if context is not None else None,
        log=log,
        force=Force.from_tags(context.run.tags, context.run.run_id) if context is not None else None,
        dead_letter_after=settings.dead_letter_after,
        write_together=settings.write_together,
    )


def outcome_metadata(outcome: Outcome) -> dict[str, Any]:
    """The phase's outcome for one partition: status, checkpoint, hashes, versions, rows, deliveries."""
    cp = outcome.checkpoint
    summary = cp.summary or {}
    figures = summary.get("figures", {})
    meta: dict[str, Any] = {
        "status": outcome.status,
        "skipped": outcome.status == "SKIPPED",
        "tier": cp.tier,
        "tier_label": cp.tier_label,
        "seq": cp.seq,
        "attempt": cp.attempt,
        "input_hash": cp.input_hash,
        "state_hash": cp.state_hash or "",
        "delta_versions": dg.MetadataValue.json(summary.get("delta_versions", {})),
        "row_counts": dg.MetadataValue.json(summary.get("rows", {})),
        "delivered": dg.MetadataValue.json(list(outcome.delivered)),
    }
    if "quarantined" in figures:
        meta["quarantined_rows"] = int(figures["quarantined"])
    if "quality" in figures:
        meta["signal_quality"] = figures["quality"]["grade"]
        meta["quality_measures"] = dg.MetadataValue.json(figures["quality"]["measures"])
        meta["held_for_review"] = "held" in summary
        if "held" in summary:
            meta["held_reasons"] = dg.MetadataValue.json(summary["held"].get("reasons", []))
    return meta


def table_version(outcome: Outcome, table: str) -> str:
    """The data version of one table of the outcome: the content hash of what the phase wrote.

    A table's data version changes only when its content does, so a table downstream shows
    stale only when a table it reads changed. A checkpoint committed before table hashes were
    recorded gives the phase's state hash (what every table of the phase reported then).
    """
    return outcome.table_hashes.get(table) or outcome.state_hash


def table_uri(lake: Lake, table: str) -> str:
    """The table's URI (``dagster/uri``): a ``file://`` URI for a local lake, else the lake's own."""
    uri = lake.uri(table)
    return uri if "://" in uri else Path(uri).resolve().as_uri()


def table_metadata(outcome: Outcome, table: str, lake: Lake, phase_meta: dict[str, Any]) -> dict[str, Any]:
    """One table's materialization metadata for one partition: the standard table entries
    (row counts, name, URI) and its Delta version and content hash, then the phase's outcome
    (``phase_meta``, :func:`outcome_metadata` of the partition, made once for all its tables).

    The column schema is the asset's definition metadata (:func:`table_spec`) and changes only
    with the table's schema version, which is the asset's code version: it is not repeated
    here: repeated, it was a large share of every stored event, and of the time Dagster spends
    serialising a range run's events."""
    summary = outcome.checkpoint.summary or {}
    version = summary.get("delta_versions", {}).get(table)
    meta: dict[str, Any] = {
        "dagster/table_name": table,
        "dagster/uri": table_uri(lake, table),
    }
    rows = summary.get("rows", {}).get(table)
    if rows is not None:
        meta["dagster/partition_row_count"] = dg.MetadataValue.int(int(rows))
    if version is not None:
        total = lake.row_count(table, int(version))
        if total is not None:
            meta["dagster/row_count"] = dg.MetadataValue.int(total)
        meta["delta_version"] = dg.MetadataValue.int(int(version))
    meta["table_hash"] = table_version(outcome, table)
    meta.update(phase_meta)
    return meta


def materialize_phase(context: dg.AssetExecutionContext, phase: Phase, compute: Compute, grader: Grader | None, *,
                      ledger: LedgerResource, lake: LakeResource, landing: LandingResource,
                      publisher: PublisherResource) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    """Run ``phase`` for every partition of the step; one materialization per table and partition."""
    if not phase.upstream_phases and not_landed(context, landing):
        yield from _not_landed(context, phase)
        return
    runner, outcomes, failures = _run_step(context, phase, compute, grader, ledger=ledger, lake=lake,
                                           landing=landing, publisher=publisher)
    if failures and not outcomes and all(isinstance(exc, DeadLettered) for _, exc in failures):
        yield from _dead_lettered(context, phase, [exc for _, exc in failures])
        return
    if failures:
        _ask_for_regrouping(context, failures)
        yield from _fail_step(phase, failures)
    assert runner is not None
    yield from _materializations(context, phase, outcomes, runner.lake)
    yield _grader_result(phase, outcomes)


def not_landed(context: dg.AssetExecutionContext, landing: LandingResource) -> bool:
    """Whether none of the step's partitions has any of its landing files (folders empty or absent).

    Dagster offers every day since the first day for every region, most of them with nothing
    landed yet; a run over such partitions is no failure and leaves no trace in the ledger. A
    partition with some of its files is read as usual (a missing one fails ingest, naming it).
    A UI backfill's range that mixes partitions that landed with some that did not is cut in
    two before it runs (``pipeline.range_runs``); a range that still mixes them (launched in
    process over a key range) fails ingest for the ones that did not land, naming their files.
    """
    zone = landing.get()
    return not any(zone.has_partition_files(region_id, day) for day, region_id in map(split_key, context.partition_keys))


def _not_landed(context: dg.AssetExecutionContext, phase: Phase) -> Iterator[dg.AssetCheckResult]:
    """The step's one result for a partition that has not landed: its grader, passed, saying so.

    No table is materialized, so the later phases' steps are skipped and the partition stays
    missing in the catalog, ready for the run that comes when its files land.
    """
    keys = context.partition_keys
    what = f"{keys[0]} has" if len(keys) == 1 else f"{keys[0]} .. {keys[-1]} ({len(keys)} partitions) have"
    context.log.info(f"{phase.name}: {what} not landed (no landing files yet); nothing to do")
    yield dg.AssetCheckResult(check_name="grader", asset_key=grader_key(phase), passed=True,
                              description=f"{what} not landed: no landing files yet, nothing was read or written",
                              metadata={"landed": False})


def _dead_lettered(context: dg.AssetExecutionContext, phase: Phase,
                   refusals: list[DeadLettered]) -> Iterator[dg.AssetCheckResult]:
    """The step's one result when every partition of it is dead-lettered: skipped, its grader
    saying why in one line.

    No attempt is made and no table is materialized, so the later phases' steps are skipped and
    the run ends without a failure: backfills, schedule ticks, sensor requests and UI runs all
    pass over such partitions until ``stormlake release``. (A UI backfill's range is cut before
    it runs so that its dead-lettered partitions are a range of their own, ``pipeline.range_runs``.)
    """
    lines = [str(exc) for exc in refusals]
    for line in lines:
        context.log.warning(f"skipped: {line}")
    keys = list(context.partition_keys)
    if len(lines) == 1:
        description = f"skipped: {lines[0]}"
    else:
        description = f"skipped {len(lines)} dead-lettered partitions ({keys[0]} .. {keys[-1]}); the first: {lines[0]}"
    yield dg.AssetCheckResult(check_name="grader", asset_key=grader_key(phase), passed=False,
                              severity=dg.AssetCheckSeverity.WARN, description=description,
                              metadata={"dead_lettered": True, **({"partition": keys[0]} if len(keys) == 1 else
                                                                  {"partitions": dg.MetadataValue.json(keys)})})


def _run_step(context: dg.AssetExecutionContext, phase: Phase, compute: Compute, grader: Grader | None,
              **resources: Any) -> tuple[PhaseRunner | None, list[Outcome], list[tuple[str, StormlakeError]]]:
    """Run the phase for the step's partitions, in order (:meth:`PhaseRunner.run_range`: each
    next one read ahead, the tables of small ones written together).

    A transient error (the ledger unreachable) fails the step, for Dagster's retry; any other
    error of one partition of a range is kept, and the other partitions go on.
    """
    keys = context.partition_keys
    outcomes: list[Outcome] = []
    failures: list[tuple[str, StormlakeError]] = []
    runner: PhaseRunner | None = None
    # A key range's outcome lines go to the run's log together, as one event at the step's end
    # (its materializations come then too): each log line is a row Dagster writes on its own, and
    # one per partition and phase was about a tenth of Dagster's cost of a small partition.
    lines: list[str] = []
    try:
        runner = build_runner(context, **resources, outcome_log=lines.append if len(keys) > 1 else None)
        parts = [PartitionRef.parse(partition_key(*split_key(key)), runner.regions) for key in keys]
        key_of = {part.key: key for part, key in zip(parts, keys, strict=True)}
        for part_key, result in runner.run_range(phase, parts, compute, grader):
            key = key_of[part_key]
            if isinstance(result, Outcome):
                outcomes.append(result)
            elif result.transient or len(keys) == 1:
                raise result
            else:
                failures.append((key, result))  # a range run: the other partitions went on
    except StormlakeError as exc:
        if exc.transient:
            raise
        failures.append((keys[0] if len(keys) == 1 else "?", exc))
    finally:
        if lines:
            context.log.info(f"{phase.name}: {len(lines)} of {len(keys)} partitions done\n" + "\n".join(lines))
    return runner, outcomes, failures


def _ask_for_regrouping(context: dg.AssetExecutionContext, failures: list[tuple[str, StormlakeError]]) -> None:
    """Have Dagster retry a queued range run whose phase failed for some of its partitions only.

    A failed step fails the run's later steps for every partition of its range. The CLI runs
    the range's other partitions again without the failed ones (``pipeline.orchestrate``); a
    run from the queue (a UI backfill, ``dg launch``) asks for the same through Dagster's run
    retries: its tags name the failed partitions (``FAILED_PARTITIONS_TAG``) and allow a retry
    on a step failure (the documented ``dagster/retry_on_asset_or_op_failure`` tag; the instance
    retries only crashed runs) while its run group is not much bigger than now
    (``dagster/max_retries``: Dagster counts a group's runs when the run fails, and a range's
    other runs may have failed and been retried meanwhile; each retry leaves at least one
    failed partition out, so the retries of a range end).
    The retry, from the failed step on, reaches stormlake's run coordinator, which turns it
    into runs over the range's other partitions (``pipeline.range_runs``); a backfill waits
    for them and ends with only the failed partitions failed. A run that still holds a
    partition its parent named as failed was not cut (an instance without stormlake's
    coordinator): it asks for nothing more, so a range is retried at most once that way.
    """
    keys = list(context.partition_keys)
    failed = [k for k, _ in failures]
    if len(keys) < 2 or context.run.tags.get(LAUNCHED_BY) == "cli" or not set(keys) - set(failed) \
            or not set(failed) <= set(keys):
        return
    instance = context.instance
    parent_id = context.run.tags.get(PARENT_RUN_TAG)
    parent = instance.get_run_by_id(parent_id) if parent_id else None
    if parent is not None and failed_partitions(parent.tags) & set(keys):
        return  # not cut without its parent's failed partitions: a retry would fail the same way
    group = instance.get_run_group(context.run_id)
    runs_in_group = len(group[1]) if group else 1
    instance.add_run_tags(context.run_id, {
        FAILED_PARTITIONS_TAG: json.dumps(failed),
        RETRY_ON_FAILURE_TAG: "true",
        MAX_RETRIES_TAG: str(runs_in_group + MAX_PARTITIONS_PER_RUN),
    })


def _fail_step(phase: Phase, failures: list[tuple[str, StormlakeError]]) -> Iterator[dg.AssetCheckResult]:
    """Fail the step with the first error (and the grader's check, when a grader failed)."""
    key, exc = failures[0]
    message = f"{phase.name} of {key} failed: {exc}"
    if len(failures) > 1:
        message += f" (and {len(failures) - 1} more partitions of this run)"
    if any(e.__class__.__name__ == "GraderError" for _, e in failures):
        yield dg.AssetCheckResult(check_name="grader", passed=False, asset_key=grader_key(phase),
                                  severity=dg.AssetCheckSeverity.ERROR, description=message)
    raise dg.Failure(description=message, allow_retries=False,
                     metadata={"error_class": exc.__class__.__name__,
                               "failed_partitions": dg.MetadataValue.json([k for k, _ in failures])}) from exc


def _materializations(context: dg.AssetExecutionContext, phase: Phase, outcomes: list[Outcome],
                      lake: Lake) -> Iterator[dg.MaterializeResult]:
    """One materialization per table; for a key range, each partition's metadata on its own."""
    if len(outcomes) == 1:
        outcome = outcomes[0]
        phase_meta = outcome_metadata(outcome)
        for table in phase.tables:
            yield dg.MaterializeResult(asset_key=table, metadata=table_metadata(outcome, table, lake, phase_meta),
                                       data_version=dg.DataVersion(table_version(outcome, table)))
        return
    # A key range: each partition's materialization of each table carries its own outcome
    # (status, hashes, versions, rows, deliveries). Dagster takes one data version per asset
    # and step, so a range's partitions get Dagster's own (code and input versions); the
    # table's content hash is in the metadata.
    phase_metas = [outcome_metadata(o) for o in outcomes]
    keys = context.partition_keys
    for table in phase.tables:
        for key, outcome, phase_meta in zip(keys, outcomes, phase_metas, strict=True):
            context.add_asset_metadata(table_metadata(outcome, table, lake, phase_meta), asset_key=table,
                                       partition_key=key)
        yield dg.MaterializeResult(asset_key=table, metadata={
            "partitions": len(outcomes),
            "completed": sum(o.status == "COMPLETED" for o in outcomes),
            "skipped": sum(o.status == "SKIPPED" for o in outcomes),
        })


def _grader_result(phase: Phase, outcomes: list[Outcome]) -> dg.AssetCheckResult:
    """The phase's grader check over the step's partitions (a skip: the checks its checkpoint recorded)."""
    checks: list[Check] = []
    for o in outcomes:
        if o.status == "SKIPPED":  # the grader passed when the checkpoint was committed
            recorded = (o.checkpoint.summary or {}).get("checks", {})
            checks.extend(Check(name, bool(ok), "recorded in the checkpoint") for name, ok in recorded.items())
        else:
            checks.extend(o.checks)
    return dg.AssetCheckResult(
        check_name="grader",
        asset_key=grader_key(phase),
        passed=all(c.passed for c in checks),
        metadata={
            "checks": dg.MetadataValue.json({c.name: {"passed": c.passed, "detail": c.detail} for c in checks}),
            "from_checkpoint": all(o.status == "SKIPPED" for o in outcomes),
        },
    )
