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

A key range step whose phase failed for some of its partitions fails alone for them: the
partitions that succeeded are checkpointed and their materializations are logged
(:func:`_log_materializations`) before the step fails, naming the failed ones
(:func:`_fail_step`). The run's later steps are skipped for the whole range; the outbox sensor
continues the good partitions from the next phase once the run is over
(:func:`pipeline.sensors.evaluate_outbox`).
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg

from assets.checks import Check
from assets.context import Compute, Grader, PartitionRef
from assets.partitions import split_key
from assets.phases import PHASES, Phase
from assets.plan import BACKFILL_POLICY
from assets.runner import DeadLettered, Force, Outcome, PhaseRunner
from assets.schemas import DESCRIPTIONS, PARTITION_COLUMNS, SCHEMAS, table_schema
from resources.dagster_resources import LakeResource, LandingResource, PublisherResource
from resources.errors import GraderError, NotLanded, StormlakeError
from resources.keys import partition_key
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
        # The first phase's tables are not materialized for a step none of whose partitions
        # has landed (see :func:`not_landed`); Dagster then skips the later phases' steps.
        skippable=not phase.upstream_phases,
    )


def asset_options(phase: Phase, *, deps: list[Any] | None = None, kinds: set[str] | None = None) -> dict[str, Any]:
    """The ``@dg.multi_asset`` arguments of a phase: one asset per table, one op, one grader.

    The op is named after the phase (``Phase.asset``), so run and step names read as before; it
    cannot be subset, since the phase writes all its tables under one checkpoint. Partitions,
    the backfill policy, the retry policy and the pool (one per phase: the writer of its Delta
    tables) are the op's. The backfill policy gives a UI backfill's runs key ranges of up to
    ``MAX_PARTITIONS_PER_RUN`` partitions (:mod:`assets.plan`): Dagster's cost of a run (its
    creation, its start, its events) is paid once for each range instead of once for each
    partition. A partition that fails in a range fails alone: the others' materializations are
    logged, then the step fails naming it (:func:`materialize_phase`).
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
    """Run ``phase`` for every partition of the step; one materialization per table and partition.

    When every partition succeeded (COMPLETED, or SKIPPED: already done for these inputs), the
    step yields one result per table and the grader's check over them. When some failed, are
    dead-lettered, or (the first phase) have not landed while others have, the ones that
    succeeded get their materializations logged (:func:`_log_materializations`), then the step
    fails naming the others (:func:`_fail_step`). A step none of whose partitions has landed
    (:func:`_not_landed`), or all of whose partitions are dead-lettered (:func:`_dead_lettered`),
    materializes nothing and does not fail.
    """
    keys = list(context.partition_keys)
    absent = not_landed(keys, landing) if not phase.upstream_phases else []
    if len(absent) == len(keys):
        yield from _not_landed(context, phase)
        return
    to_run = [k for k in keys if k not in absent]
    # The phase's transform (and pandas) loads here, not with the definitions, and before the first claim.
    importlib.import_module(f"assets.transforms.{phase.name}")
    runner, outcomes, failures = _run_step(context, phase, compute, grader, to_run, ledger=ledger, lake=lake,
                                           landing=landing, publisher=publisher)
    if failures and not outcomes and not absent and all(isinstance(exc, DeadLettered) for _, exc in failures):
        yield from _dead_lettered(context, phase, [exc for _, exc in failures])
        return
    failures = _in_key_order(keys, [*failures, *((k, NotLanded(str(k))) for k in absent)])
    if failures:
        if outcomes:
            assert runner is not None
            _log_materializations(context, phase, outcomes, runner.lake)
        yield from _fail_step(phase, failures)
    assert runner is not None
    yield from _materializations(context, phase, outcomes, runner.lake)
    yield _grader_result(phase, [o for _, o in outcomes])


def not_landed(keys: list[str], landing: LandingResource) -> list[str]:
    """The keys of ``keys`` with none of their landing files (their folders empty or absent).

    Dagster offers every day since the first day for every region, most of them with nothing
    landed yet. A step none of whose partitions has landed is no failure and leaves no trace in
    the ledger (:func:`_not_landed`). In a range step with partitions that landed, the ones that
    did not are not read: they fail the step, one line each (:class:`~resources.errors.NotLanded`),
    after the others are materialized. A partition with some of its files is read as usual (a
    missing one fails ingest, naming it).
    """
    zone = landing.get()
    absent = []
    for key in keys:
        day, region_id = split_key(key)
        if not zone.has_partition_files(region_id, day):
            absent.append(key)
    return absent


def _not_landed(context: dg.AssetExecutionContext, phase: Phase) -> Iterator[dg.AssetCheckResult]:
    """The step's one result when none of its partitions has landed: its grader, passed, saying so.

    No table is materialized, so the later phases' steps are skipped and the partitions stay
    missing in the catalog, ready for the run that comes when their files land.
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
    pass over such partitions until ``stormlake release``. A dead-lettered partition in a range
    with partitions that succeeded fails the step instead, after their materializations
    (:func:`materialize_phase`).
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
              keys: list[str], **resources: Any
              ) -> tuple[PhaseRunner | None, list[tuple[str, Outcome]], list[tuple[str, StormlakeError]]]:
    """Run the phase for ``keys`` (the step's partitions, or those of them that landed), in order
    (:meth:`PhaseRunner.run_range`: each next one read ahead, the tables of small ones written
    together); each success and each failure with its key.

    A transient error (the ledger unreachable) fails the step, for Dagster's retry, once the
    materializations of the partitions finished before it are logged (a retry finds them done);
    any other error of one partition of a range is kept, and the other partitions go on.
    """
    outcomes: list[tuple[str, Outcome]] = []
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
        transient: StormlakeError | None = None
        for part_key, result in runner.run_range(phase, parts, compute, grader):
            key = key_of[part_key]
            if isinstance(result, Outcome):
                outcomes.append((key, result))
            elif result.transient:
                transient = transient or result
            elif len(keys) == 1:
                raise result
            else:
                failures.append((key, result))  # a range run: the other partitions went on
        if transient is not None:
            if outcomes:
                _log_materializations(context, phase, outcomes, runner.lake)
            raise transient
    except StormlakeError as exc:
        if exc.transient:
            raise
        failures.append((keys[0] if len(keys) == 1 else "?", exc))
    finally:
        if lines:
            context.log.info(f"{phase.name}: {len(lines)} of {len(keys)} partitions done\n" + "\n".join(lines))
    return runner, outcomes, failures


def _in_key_order(keys: list[str], failures: list[tuple[str, StormlakeError]]) -> list[tuple[str, StormlakeError]]:
    """The failures in the step's key order (an error of the whole range, key ``?``, last)."""
    order = {key: i for i, key in enumerate(keys)}
    return sorted(failures, key=lambda f: order.get(f[0], len(keys)))


def _failure_line(phase: Phase, key: str, exc: StormlakeError) -> str:
    """One partition's failure in one line: the phase, the partition, the error (an error that
    names the partition already is not prefixed with it again)."""
    text = str(exc)
    if key in text:
        return text if text.startswith(phase.name) else f"{phase.name}: {text}"
    return f"{phase.name} of {key} failed: {text}"


def _fail_step(phase: Phase, failures: list[tuple[str, StormlakeError]]) -> Iterator[dg.AssetCheckResult]:
    """Fail the step naming its failed partitions: the first one's line and how many more
    (every one's line in the ``failures`` metadata), and the grader's check when a grader failed.

    ``allow_retries=False``: the step's retry policy is for transient errors, and a retry would
    fail the same partitions the same way.
    """
    key, exc = failures[0]
    message = _failure_line(phase, key, exc)
    if len(failures) > 1:
        message += f" (and {len(failures) - 1} more partitions of this run)"
    if any(isinstance(e, GraderError) for _, e in failures):
        yield dg.AssetCheckResult(check_name="grader", passed=False, asset_key=grader_key(phase),
                                  severity=dg.AssetCheckSeverity.ERROR, description=message)
    raise dg.Failure(description=message, allow_retries=False,
                     metadata={"error_class": exc.__class__.__name__,
                               "failed_partitions": dg.MetadataValue.json([str(k) for k, _ in failures]),
                               "failures": dg.MetadataValue.json({str(k): _failure_line(phase, k, e)
                                                                  for k, e in failures})}) from exc


def _range_summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """What a key range step's materialization of each table says of the step: how many
    partitions it materialized, how many of them it computed and how many it found done."""
    return {
        "partitions": len(outcomes),
        "completed": sum(o.status == "COMPLETED" for o in outcomes),
        "skipped": sum(o.status == "SKIPPED" for o in outcomes),
    }


def _log_materializations(context: dg.AssetExecutionContext, phase: Phase, outcomes: list[tuple[str, Outcome]],
                          lake: Lake) -> None:
    """The materializations of the partitions that succeeded in a step that is about to fail:
    one per table and partition, logged explicitly (``context.log_event``), each with the metadata
    a successful range step gives it, the table's content hash (``table_hash``) among it.
    ``dg.AssetMaterialization`` takes no data version, so Dagster judges their staleness by time,
    as it does for any materialization without provenance.

    Dagster records them when they are logged, so the failed run still holds them: the
    partitions show materialized in the catalog, and their later phases, which the step's
    failure skips, are continued by the outbox sensor from their checkpoints.
    """
    summary = _range_summary([o for _, o in outcomes])
    for key, outcome in outcomes:
        phase_meta = outcome_metadata(outcome)
        for table in phase.tables:
            context.log_event(dg.AssetMaterialization(
                asset_key=table, partition=key, metadata={**summary, **table_metadata(outcome, table, lake, phase_meta)}))


def _materializations(context: dg.AssetExecutionContext, phase: Phase, outcomes: list[tuple[str, Outcome]],
                      lake: Lake) -> Iterator[dg.MaterializeResult]:
    """One materialization per table; for a key range, each partition's metadata on its own."""
    if len(outcomes) == 1:
        _, outcome = outcomes[0]
        phase_meta = outcome_metadata(outcome)
        for table in phase.tables:
            yield dg.MaterializeResult(asset_key=table, metadata=table_metadata(outcome, table, lake, phase_meta),
                                       data_version=dg.DataVersion(table_version(outcome, table)))
        return
    # A key range: each partition's materialization of each table carries its own outcome
    # (status, hashes, versions, rows, deliveries). Dagster takes one data version per asset
    # and step, so a range's partitions get Dagster's own (code and input versions); the
    # table's content hash is in the metadata.
    phase_metas = [outcome_metadata(o) for _, o in outcomes]
    summary = _range_summary([o for _, o in outcomes])
    for table in phase.tables:
        for (key, outcome), phase_meta in zip(outcomes, phase_metas, strict=True):
            context.add_asset_metadata(table_metadata(outcome, table, lake, phase_meta), asset_key=table,
                                       partition_key=key)
        yield dg.MaterializeResult(asset_key=table, metadata=summary)


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
