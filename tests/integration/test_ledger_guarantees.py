"""The ledger's guarantees hold as strongly as they read, on a real PostgreSQL.

- A COMPLETED checkpoint is frozen in every column (read from ``information_schema``, so a
  column added later is covered without touching this file); only ``superseded_at`` may be set,
  once, and the protocol's own supersede still passes.
- The idempotency key is ``sha256(partition | phase | input hash)`` (the CHECK matches
  ``idempotency_key()`` byte for byte) and names at most one live checkpoint; the skip decision
  finds the head by it, and inputs going A -> B -> A still work.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from resources.errors import LedgerError
from resources.ledger import Checkpoint, Ledger, idempotency_key
from tests.ledger_sql import query

KEY = "2026-09-01|gulf_coast"
ARGS: dict[str, Any] = dict(partition_key=KEY, region_id="gulf_coast", day="2026-09-01", phase="correlate",
                            schema_version=1, code_version="1", run_id="r")


def _completed(ledger: Ledger, input_hash: str, **overrides: Any) -> Checkpoint:
    args = {**ARGS, **overrides}
    claim = ledger.claim(**args, input_hash=input_hash).claim
    assert claim is not None
    ledger.record_call(claim, call_key="k", kind="delta_commit", name="t", input={"a": 1}, output={"version": 3})
    return ledger.complete(claim, state_hash=f"s-{input_hash}", summary={"rows": {"t": 1}}, tier=3,
                           tier_label="correlated", run_id="r")


def _columns(ledger: Ledger) -> dict[str, str]:
    rows = query(ledger, 
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = 'checkpoints' ORDER BY ordinal_position"
    )
    return {r["column_name"]: r["data_type"] for r in rows}


# An expression giving each column a value that differs from the one it has (NULL or not).
_TAMPER = {
    "bigint": "coalesce({c}, 0) + 1",
    "integer": "coalesce({c}, 0) + 1",
    "smallint": "coalesce({c}, 0) + 1",
    "numeric": "coalesce({c}, 0) + 1",
    "double precision": "coalesce({c}, 0) + 1",
    "text": "coalesce({c}, '') || '~'",
    "character varying": "coalesce({c}, '') || '~'",
    "jsonb": "coalesce({c}, '{{}}'::jsonb) || '{{\"tampered\": true}}'::jsonb",
    "json": "'{{\"tampered\": true}}'::json",
    "boolean": "NOT coalesce({c}, false)",
    "timestamp with time zone": "coalesce({c}, now()) + interval '1 second'",
    "timestamp without time zone": "coalesce({c}, localtimestamp) + interval '1 second'",
    "date": "coalesce({c}, current_date) + 1",
}


def _refused(ledger: Ledger, statement: str, params: tuple[Any, ...]) -> LedgerError | None:
    """Run ``statement`` through the ledger; the LedgerError it raised, or None if it went through."""
    try:
        query(ledger, statement, params)
    except LedgerError as exc:
        return exc
    return None


def test_every_column_of_a_completed_checkpoint_is_frozen(ledger: Ledger) -> None:
    cp = _completed(ledger, "h1")
    columns = _columns(ledger)
    # the table as the contract describes it (section 5), at least
    assert {"id", "partition_key", "phase", "input_hash", "idempotency_key", "status", "state_hash", "seq",
            "first_seq", "attempt", "tier", "tier_label", "summary", "calls", "schema_version", "code_version",
            "run_id", "error_class", "error_message", "created_at", "updated_at", "completed_at",
            "superseded_at"} <= set(columns)
    untyped = {c: t for c, t in columns.items() if t not in _TAMPER}
    assert not untyped, f"no tamper expression for the type of {untyped}: add one to _TAMPER"
    before = query(ledger, "SELECT * FROM checkpoints WHERE id = %s", (cp.id,))[0]
    wrong: dict[str, str] = {}  # column -> what happened instead of the guard's refusal
    for column, data_type in columns.items():
        if column == "superseded_at":
            continue
        exc = _refused(ledger, f"UPDATE checkpoints SET {column} = {_TAMPER[data_type].format(c=column)}"
                               " WHERE id = %s RETURNING id", (cp.id,))
        cause = exc.__cause__ if exc is not None else None
        if exc is None:
            wrong[column] = "changed"
        # the guard's own integrity violation (SQLSTATE 23000), not some other constraint's
        elif type(cause) is not psycopg.errors.IntegrityConstraintViolation:
            wrong[column] = f"refused by {type(cause).__name__}, not by the guard: {exc}"
        elif "is COMPLETED and cannot be changed" not in str(exc) or column not in str(exc):
            wrong[column] = f"refused without naming the column: {exc}"
    assert not wrong, f"UPDATEs of a COMPLETED checkpoint not refused by its guard: {wrong}"
    assert query(ledger, "SELECT * FROM checkpoints WHERE id = %s", (cp.id,))[0] == before
    # Raw SQL outside the ledger meets the same guard.
    with psycopg.connect(ledger.dsn, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="tier"):
        conn.execute("UPDATE checkpoints SET tier = 1 WHERE id = %s", (cp.id,))


def test_superseded_at_is_set_once_and_the_protocol_supersede_still_passes(ledger: Ledger) -> None:
    old = _completed(ledger, "h1")
    # The protocol: a new input hash supersedes the COMPLETED head (only superseded_at moves).
    claim = ledger.claim(**ARGS, input_hash="h2").claim
    assert claim is not None and claim.id != old.id
    new = ledger.complete(claim, state_hash="s-h2", summary={}, tier=3, tier_label="correlated", run_id="r")
    assert ledger.head(KEY, "correlate") == new
    row = query(ledger, "SELECT * FROM checkpoints WHERE id = %s", (old.id,))[0]
    assert row["superseded_at"] is not None
    assert {k: v for k, v in row.items() if k != "superseded_at"} == {
        k: v for k, v in vars(old).items() if k != "superseded_at"}
    # Once set, it never changes: not to another time, not back to NULL (which would revive it).
    for value in ("now() - interval '40 days'", "NULL"):
        exc = _refused(ledger, f"UPDATE checkpoints SET superseded_at = {value} WHERE id = %s RETURNING id",
                       (old.id,))
        assert exc is not None, f"superseded_at of a superseded checkpoint was changed to {value}"
        assert type(exc.__cause__) is psycopg.errors.IntegrityConstraintViolation
        assert "superseded_at cannot change" in str(exc)
    # The live head may be marked superseded by hand too, once (what the protocol does).
    query(ledger, "UPDATE checkpoints SET superseded_at = now() WHERE id = %s RETURNING id", (new.id,))
    assert ledger.head(KEY, "correlate") is None


def test_pending_and_failed_checkpoints_still_move_through_the_protocol(ledger: Ledger) -> None:
    first = ledger.claim(**ARGS, input_hash="h1").claim
    assert first is not None
    assert ledger.fail(first, error_class="ValueError", error_message="boom", run_id="r")
    again = ledger.claim(**ARGS, input_hash="h1")
    assert again.claim is not None and again.claim.id == first.id and again.claim.checkpoint.attempt == 2
    done = ledger.complete(again.claim, state_hash="s", summary={}, tier=3, tier_label="correlated", run_id="r")
    assert done.status == "COMPLETED" and done.error_class is None


# ---- the idempotency key -------------------------------------------------------------------------
@pytest.mark.parametrize(("partition_key", "phase", "input_hash"), [
    (KEY, "correlate", "ab" * 32),
    ("2026-09-01|région_ü", "present", "ħash|with|bars"),
    ("", "ingest", ""),
])
def test_the_key_check_matches_idempotency_key_byte_for_byte(ledger: Ledger, partition_key: str, phase: str,
                                                            input_hash: str) -> None:
    sql = query(ledger, 
        "SELECT encode(sha256(convert_to(%s || '|' || %s || '|' || %s, 'UTF8')), 'hex') AS k",
        (partition_key, phase, input_hash),
    )[0]["k"]
    assert sql == idempotency_key(partition_key, phase, input_hash)
    # And the ledger's own insert passes the CHECK with it.
    claim = ledger.claim(**{**ARGS, "partition_key": partition_key, "phase": phase}, input_hash=input_hash).claim
    assert claim is not None and claim.checkpoint.idempotency_key == sql


def _insert(key: str, *, partition_key: str = KEY, input_hash: str = "h1", superseded: bool = False) -> tuple[str, tuple]:
    return (
        "INSERT INTO checkpoints (partition_key, region_id, day, phase, input_hash, idempotency_key, status,"
        " schema_version, code_version, first_seq, seq, superseded_at)"
        " VALUES (%s, 'gulf_coast', '2026-09-01', 'correlate', %s, %s, 'FAILED', 1, '1', 1, 1, %s) RETURNING id",
        (partition_key, input_hash, key, dt.datetime.now(dt.UTC) if superseded else None),
    )


def test_the_constraints_reject_a_wrong_key_and_a_duplicate_live_identity(ledger: Ledger) -> None:
    # A key that is not sha256(partition | phase | input hash): refused, naming the constraint.
    for wrong in ("0" * 64, idempotency_key(KEY, "correlate", "h2"), idempotency_key(KEY, "enrich", "h1")):
        exc = _refused(ledger, *_insert(wrong))
        assert exc is not None, f"a checkpoint with the wrong idempotency key {wrong} was stored"
        assert isinstance(exc.__cause__, psycopg.errors.CheckViolation)
        assert exc.__cause__.diag.constraint_name == "checkpoints_idempotency_key_check"
    right = idempotency_key(KEY, "correlate", "h1")
    first = query(ledger, *_insert(right))[0]["id"]
    # A second live row of the same identity: refused. The head index (one live row per
    # partition and phase) would refuse it as well, so it is set aside here, inside a
    # transaction rolled back, to show the identity index refuses it on its own.
    with psycopg.connect(ledger.dsn) as conn:
        conn.execute("DROP INDEX checkpoints_head")
        with pytest.raises(psycopg.errors.UniqueViolation) as info:
            conn.execute(*_insert(right))
        assert info.value.diag.constraint_name == "checkpoints_live_identity"
        conn.rollback()
        # ... while a superseded row may share the key with the live one (A -> B -> A).
        conn.execute("DROP INDEX checkpoints_head")
        conn.execute(*_insert(right, superseded=True))
        conn.rollback()
    assert len(query(ledger, "SELECT 1 FROM pg_indexes WHERE indexname = 'checkpoints_head'")) == 1
    assert [r["id"] for r in query(ledger, "SELECT id FROM checkpoints")] == [first]


def test_inputs_going_a_b_a_make_a_second_live_row_under_a_key_used_before(ledger: Ledger) -> None:
    a1 = _completed(ledger, "A")
    b = _completed(ledger, "B")
    look = ledger.look(**ARGS, input_hash="A")
    assert not look.skip and look.head == b  # A's key has no live row: the head is B
    a2 = _completed(ledger, "A")
    assert a2.id not in (a1.id, b.id) and a2.idempotency_key == a1.idempotency_key
    rows = query(ledger, "SELECT id, superseded_at IS NULL AS live FROM checkpoints WHERE idempotency_key = %s"
                        " ORDER BY id", (a1.idempotency_key,))
    assert [(r["id"], r["live"]) for r in rows] == [(a1.id, False), (a2.id, True)]
    # The skip decision finds the live row by the key, with the lease and without.
    for decide in (ledger.look, ledger.claim):
        d = decide(**ARGS, input_hash="A")
        assert d.skip and d.head is not None and d.head.id == a2.id
    assert not ledger.look(**ARGS, input_hash="B").skip


def test_a_schema_version_change_supersedes_a_row_of_the_same_identity(ledger: Ledger) -> None:
    cp = _completed(ledger, "h1")
    # A COMPLETED row under another schema version is not skipped, and is superseded by a row
    # of the same identity: the live-identity index allows that because the old row goes first.
    d = ledger.claim(**{**ARGS, "schema_version": 2}, input_hash="h1")
    assert not d.skip and d.claim is not None and d.claim.id != cp.id
    assert d.claim.checkpoint.idempotency_key == cp.idempotency_key
    assert ledger.look(**ARGS, input_hash="h1").skip is False
