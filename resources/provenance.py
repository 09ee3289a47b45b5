"""One partition's history, read as a person reads the ledger: the queries behind ``stormlake show``.

Every attempt of every phase (superseded checkpoints too), the events that mark them, their
recorded calls, the deliveries and the operator actions of the partition are read through the
logged views of ``ledger_read`` (migration 007) as the reader's role: each kind of read is one
request opened for this partition alone, so the access log names the partition, and a phase the
role may not read is left out by the database itself (:meth:`ProvenanceViews.hidden_phases`
names it). The reads of the partition in the access log are the one exception: readers have no
view of the log, so they are read as its owner, and only the rows of the phases the role may see
are returned.

Nothing here interprets a summary: :mod:`pipeline.show` checks each against its phase's model.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from resources.errors import AccessRefused
from resources.ledger import AccessRow, Checkpoint, Event, Ledger, Receipt
from resources.ledger_views import LedgerViews


@dataclass(frozen=True)
class CallRow:
    """A recorded call of a checkpoint's attempts: what was asked of the outside world, and its answer."""

    checkpoint_id: int
    call_key: str
    kind: str
    name: str
    input: Any
    output: Any
    seq: int
    recorded_at: dt.datetime


@dataclass(frozen=True)
class ActionRow:
    """An operator action on the partition (a release, a forced re-run, …)."""

    action_id: int
    at: dt.datetime
    action: str
    phase: str | None
    actor: str
    reason: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class History:
    """What the ledger holds of one partition, as one role may see it."""

    partition_key: str
    role: str | None
    hidden: list[str]  # phases the role may not read: left out of everything below
    checkpoints: list[Checkpoint]  # in phase order, then oldest first
    events: list[Event]  # oldest first
    calls: list[CallRow]
    receipts: list[Receipt]
    actions: list[ActionRow]
    reads: list[AccessRow] | None  # reads of this partition by a person, oldest first; None: the login may not read the log


class ProvenanceViews(LedgerViews):
    """:class:`LedgerViews` with the recorded calls and operator actions, each read request opened
    for one partition (the views then return that partition's rows only)."""

    SOURCES = {**LedgerViews.SOURCES, "ca": ("recorded_calls", "calls"), "ac": ("operator_actions", "actions")}

    def __init__(self, ledger: Ledger, partition_key: str):
        super().__init__(ledger)
        self.partition_key = partition_key

    def _request(self, conn: psycopg.Connection, what: str) -> int:
        """The session's logged request of kind ``what``, for this partition only."""
        key = (conn.info.backend_pid, what)
        if key not in self._requests:
            self._requests[key] = int(conn.execute("SELECT ledger_read.open(%s, NULL, %s)",
                                                   (what, self.partition_key)).fetchone()[0])
        return self._requests[key]

    def history(self) -> History:
        key = self.partition_key
        order = "(SELECT o.position FROM phase_order o WHERE o.phase = {t}.phase)"
        checkpoints = self._rows(self._q("SELECT c.* FROM {cp} c WHERE c.partition_key = %s"
                                         f" ORDER BY {order.format(t='c')}, c.first_seq, c.id"),
                                 Checkpoint, f"read the checkpoints of {key}", (key,))
        events = self._rows(self._q("SELECT e.* FROM {ev} e WHERE e.partition_key = %s ORDER BY e.event_id"),
                            Event, f"read the events of {key}", (key,))
        ids = [cp.id for cp in checkpoints]
        calls = self._rows(self._q("SELECT r.checkpoint_id, r.call_key, r.kind, r.name, r.input, r.output, r.seq,"
                                   " r.recorded_at FROM {ca} r WHERE r.checkpoint_id = ANY(%s)"
                                   " ORDER BY r.checkpoint_id, r.recorded_at, r.call_key"),
                           CallRow, f"read the recorded calls of {key}", (ids,)) if ids else []
        hidden = self.hidden_phases()
        receipts: list[Receipt] = []
        if "present" not in hidden:
            receipts = self._rows(self._q("SELECT r.artifact_id, r.target, r.partition_key, r.region_id, r.day,"
                                          " r.kind, r.content_hash, r.size_bytes, r.target_ref, r.checkpoint_id,"
                                          " r.generation, r.idempotency_key, r.receipt_id, r.status, r.supersedes,"
                                          " r.attempts, r.last_error, r.response, r.created_at, r.delivered_at"
                                          " FROM {rc} r WHERE r.partition_key = %s ORDER BY r.receipt_id"),
                                  Receipt, f"read the deliveries of {key}", (key,))
        actions = self._rows(self._q("SELECT a.action_id, a.at, a.action, a.phase, a.actor, a.reason, a.detail"
                                     " FROM {ac} a WHERE a.partition_key = %s ORDER BY a.action_id"),
                             ActionRow, f"read the operator actions on {key}", (key,))
        return History(key, self.ledger.role if self.ledger.audited else None, hidden, checkpoints, events, calls,
                       receipts, actions, reads_of(self.ledger, key, hidden))


def reads_of(ledger: Ledger, partition_key: str, hidden: list[str]) -> list[AccessRow] | None:
    """The access log's rows of reads that named this partition, but those of ``hidden`` phases;
    None when the login may not read the log (only compliance_auditor and admin may)."""

    def q(conn: psycopg.Connection) -> list[AccessRow]:
        with conn.cursor(row_factory=class_row(AccessRow)) as cur:
            return cur.execute(
                "SELECT access_id, request_id, at, role, phase, partition_key, what, allowed, named, login,"
                " host(client_addr) AS client_addr, backend_pid FROM ledger_access_log_of(%s)"
                " WHERE NOT (phase = ANY(%s))", (partition_key, hidden)).fetchall()

    try:
        return ledger._as_login(q, what=f"read the access log of {partition_key}")
    except AccessRefused:
        return None


def history(ledger: Ledger, partition_key: str) -> History:
    """The partition's history as ``ledger``'s role may see it (every read logged when it is audited)."""
    return ProvenanceViews(ledger, partition_key).history()
