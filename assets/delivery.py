"""Deliveries: every artifact to every target exactly once, guarded by receipts in the ledger.

A receipt is prepared (PENDING) before the target is called and marked DELIVERED after; the call
itself is a recorded call of the attempt, so a retried attempt never delivers twice. The mark and
the call's record are one statement. A
partition's receipts are prepared together, in one transaction, before its first delivery.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from resources import faults
from resources.errors import StormlakeError
from resources.ledger import Receipt, ReceiptRequest
from resources.publisher import Artifact, Target

if TYPE_CHECKING:
    from assets.context import PhaseContext

_log = logging.getLogger("stormlake.delivery")


def deliver(ctx: PhaseContext, targets: list[Target], artifacts: list[Artifact]) -> tuple[list[str], int]:
    """Deliver every artifact to every target exactly once, guarded by receipts.

    The receipts of all of them are prepared (PENDING, or found DELIVERED) in one transaction
    before the first target is called; each delivery is then marked DELIVERED as soon as its
    target has it, with its call recorded in the same statement (:meth:`Ledger.mark_delivered`).
    """
    delivered: list[str] = []
    part = ctx.partition
    todo = [(artifact, target) for artifact in artifacts for target in targets]
    receipts = ctx.ledger.prepare_receipts([ReceiptRequest(
        artifact_id=artifact.artifact_id, target=target.name, partition_key=part.key,
        region_id=artifact.region_id, day=artifact.day, kind=artifact.kind,
        content_hash=artifact.content_hash, size_bytes=len(artifact.data),
        target_ref=target.shown_ref(artifact), checkpoint_id=ctx.claim.id if ctx.claim else None,
    ) for artifact, target in todo])
    for (artifact, target), rec in zip(todo, receipts, strict=True):
        if rec.status == "DELIVERED":
            continue
        faults.check("after_pending", phase=ctx.phase.name, partition_key=part.key)

        def send(target: Target = target, artifact: Artifact = artifact, rec: Receipt = rec):
            try:
                response = target.deliver(artifact, supersedes=rec.supersedes,
                                          idempotency_key=rec.idempotency_key)
            except StormlakeError as exc:
                ctx.ledger.note_delivery_attempt(rec, str(exc))
                raise
            faults.check("after_delivery", phase=ctx.phase.name, partition_key=part.key)
            return {"artifact_id": artifact.artifact_id, "target": target.name,
                    "idempotency_key": rec.idempotency_key, "response": response}

        made = ctx.make_calls("deliver", [(f"{target.name}:{artifact.kind}",
                                           {"artifact_id": artifact.artifact_id, "target": target.name,
                                            "idempotency_key": rec.idempotency_key}, send)])
        records = made.records()
        # The receipt marked DELIVERED and the call recorded in one statement (a call answered
        # from an earlier attempt's record was marked with it then; a failed one is not marked).
        fenced = ctx.ledger.mark_delivered(rec, records[0].output["response"], records=records) if records else []
        made.outputs(next((f for f in fenced if f is not None), None))
        delivered.append(f"{target.name}:{rec.idempotency_key}")
        _log.info("delivered %s to %s%s", rec.idempotency_key, target.name,
                  f" (supersedes {rec.supersedes})" if rec.supersedes else "")
    return delivered, len(todo)
