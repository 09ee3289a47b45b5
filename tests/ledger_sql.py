"""Hand-written SQL on a test's ledger, through the ledger's own connection pool and error mapping
(a guard's refusal arrives as ``LedgerError``, as it would for the pipeline)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from resources.ledger import Ledger


def query(ledger: Ledger, statement: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[dict[str, Any]]:
    """Run one statement on its own (autocommit) and return its rows as dicts."""

    def run(conn: psycopg.Connection) -> list[dict[str, Any]]:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    return ledger.read(run, what="run a test statement")


def attempt_counts(ledger: Ledger) -> dict[tuple[str, str], int]:
    """(partition_key, phase) -> attempt count of the head checkpoint."""
    rows = query(ledger, "SELECT partition_key, phase, attempt FROM checkpoints WHERE superseded_at IS NULL")
    return {(r["partition_key"], r["phase"]): r["attempt"] for r in rows}


def operator_actions(ledger: Ledger, partition_key: str) -> list[dict[str, Any]]:
    """The operator actions recorded for a partition, oldest first."""
    return query(ledger, "SELECT action, phase, actor, reason, detail FROM operator_actions"
                         " WHERE partition_key = %s ORDER BY action_id", (partition_key,))


_ADVISORY_HERE = ("locktype = 'advisory' AND granted"
                  " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")


def advisory_locks(ledger: Ledger) -> int:
    """Advisory locks (leases) held in this ledger's database, by any session."""
    return int(query(ledger, f"SELECT count(*) AS n FROM pg_locks WHERE {_ADVISORY_HERE}")[0]["n"])


def advisory_lock_sessions(ledger: Ledger) -> list[int]:
    """The server processes (sessions) holding those locks."""
    return [r["pid"] for r in query(ledger, f"SELECT DISTINCT pid FROM pg_locks WHERE {_ADVISORY_HERE}")]
