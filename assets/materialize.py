"""The Dagster side of a phase: builds the runner from resources, yields the results.

Every phase asset body is one call to :func:`materialize_phase`. Errors a retry can fix
(ledger unreachable, webhook 5xx exhausted, lease timeout) propagate so that the asset's
retry policy applies; a user's bad input or a failed grader becomes ``dg.Failure`` with
``allow_retries=False`` and a one-line description.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg

from assets.partitions import split_key
from assets.phases import Phase
from assets.runner import Check, Compute, Grader, Outcome, PartitionRef, PhaseRunner
from assets.schemas import PARTITION_COLUMNS, TABLES
from resources.errors import StormlakeError
from resources.lake import LakeResource
from resources.landing import LandingResource
from resources.ledger_resource import LedgerResource
from resources.publisher import PublisherResource

# Dagster-level retries of transient errors, on top of the ledger's and the webhook target's own
# bounded retries: a step is tried at most 3 times, 1 s and then about 2 s apart.
TRANSIENT_RETRY = dg.RetryPolicy(max_retries=2, delay=1, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)


def asset_options(phase: Phase, *, deps: list[Any] | None = None, kinds: set[str] | None = None) -> dict[str, Any]:
    """The ``@dg.asset`` arguments every phase asset shares (partitions, versions, policies)."""
    from assets.partitions import PARTITIONS

    return dict(
        name=phase.asset,
        partitions_def=PARTITIONS,
        deps=deps or [],
        code_version=f"{phase.code_version}.s{phase.schema_version}",
        group_name="storm",
        kinds=kinds or {"deltalake", "postgres"},
        tags={"stormlake/phase": phase.name},
        metadata={"tables": list(phase.tables), "tier": phase.tier},
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=1),
        retry_policy=TRANSIENT_RETRY,
        check_specs=[grader_spec(phase)],
        pool=f"stormlake_{phase.name}",  # one pool per phase: the writer of its Delta tables
    )


def grader_spec(phase: Phase) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        "grader",
        asset=phase.asset,
        blocking=True,
        description=f"Schema and invariants of what {phase.name} hands on; the checkpoint commits only if it passes.",
    )


def build_runner(context: dg.AssetExecutionContext | None, *, ledger: LedgerResource, lake: LakeResource,
                 landing: LandingResource, publisher: PublisherResource) -> PhaseRunner:
    schemas = {name: schema for name, (_, schema) in TABLES.items()}
    log = context.log.info if context is not None else None
    return PhaseRunner(
        ledger=ledger.get(),
        lake=lake.get(schemas, partition_by=PARTITION_COLUMNS),
        landing=landing.get(),
        targets=publisher.targets(),
        regions=landing.regions(),
        run_id=context.run.run_id if context is not None else None,
        log=log,
    )


def outcome_metadata(outcome: Outcome) -> dict[str, Any]:
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
    return meta


def materialize_phase(context: dg.AssetExecutionContext, phase: Phase, compute: Compute, grader: Grader | None, *,
                      ledger: LedgerResource, lake: LakeResource, landing: LandingResource,
                      publisher: PublisherResource) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    keys = context.partition_keys
    outcomes: list[Outcome] = []
    failures: list[tuple[str, StormlakeError]] = []
    try:
        runner = build_runner(context, ledger=ledger, lake=lake, landing=landing, publisher=publisher)
        regions = runner.regions
        parts = [PartitionRef.parse("{}|{}".format(*split_key(key)), regions) for key in keys]
        for i, (key, part) in enumerate(zip(keys, parts, strict=True)):
            if i + 1 < len(parts):
                runner.prefetch(phase, parts[i + 1])  # read the next partition while this one computes
            try:
                outcomes.append(runner.run(phase, part, compute, grader))
            except StormlakeError as exc:
                if exc.transient or len(keys) == 1:
                    raise
                failures.append((key, exc))  # a range run: the other partitions go on
    except StormlakeError as exc:
        if exc.transient:
            raise
        failures.append((keys[0] if len(keys) == 1 else "?", exc))
    if failures:
        key, exc = failures[0]
        message = f"{phase.name} of {key} failed: {exc}"
        if len(failures) > 1:
            message += f" (and {len(failures) - 1} more partitions of this run)"
        if any(e.__class__.__name__ == "GraderError" for _, e in failures):
            yield dg.AssetCheckResult(check_name="grader", passed=False, asset_key=phase.asset,
                                      severity=dg.AssetCheckSeverity.ERROR, description=message)
        raise dg.Failure(description=message, allow_retries=False,
                         metadata={"error_class": exc.__class__.__name__,
                                   "failed_partitions": dg.MetadataValue.json([k for k, _ in failures])}) from exc

    if len(outcomes) == 1:
        outcome = outcomes[0]
        yield dg.MaterializeResult(metadata=outcome_metadata(outcome),
                                   data_version=dg.DataVersion(outcome.state_hash))
    else:
        # A key range: each partition's materialization carries its own outcome (status, hashes,
        # versions, rows, deliveries). Dagster takes one data version per step, so a range's
        # partitions get Dagster's own (code and input versions); the state hash is in the metadata.
        for key, outcome in zip(keys, outcomes, strict=True):
            context.add_asset_metadata(outcome_metadata(outcome), partition_key=key)
        yield dg.MaterializeResult(metadata={
            "partitions": len(outcomes),
            "completed": sum(o.status == "COMPLETED" for o in outcomes),
            "skipped": sum(o.status == "SKIPPED" for o in outcomes),
        })
    checks: list[Check] = []
    for o in outcomes:
        if o.status == "SKIPPED":  # the grader passed when the checkpoint was committed
            recorded = (o.checkpoint.summary or {}).get("checks", {})
            checks.extend(Check(name, bool(ok), "recorded in the checkpoint") for name, ok in recorded.items())
        else:
            checks.extend(o.checks)
    yield dg.AssetCheckResult(
        check_name="grader",
        asset_key=phase.asset,
        passed=all(c.passed for c in checks),
        metadata={
            "checks": dg.MetadataValue.json({c.name: {"passed": c.passed, "detail": c.detail} for c in checks}),
            "from_checkpoint": all(o.status == "SKIPPED" for o in outcomes),
        },
    )
