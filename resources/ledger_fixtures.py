"""Bulk writes of the ledger for tools: ``stormlake bench --scale`` clones real partitions over a
year's grid (see :mod:`pipeline.tools.bench_scale`). Nothing in the pipeline calls this."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psycopg

_CLONE_CHECKPOINTS = """
WITH src AS (
    SELECT g.partition_key, g.region_id, g.day, g.kind, c.phase, c.input_hash, c.status, c.state_hash,
           c.schema_version, c.code_version, c.attempt, c.tier, c.tier_label, c.summary, c.calls, c.run_id,
           c.created_at, c.updated_at, c.completed_at,
           (g.kind = 'failed' AND c.phase = 'correlate') AS planted_failure,
           (g.kind = 'pending' AND c.phase = 'present') AS planted_pending
    FROM scale_grid g JOIN checkpoints c ON c.partition_key = g.template AND c.superseded_at IS NULL
    WHERE NOT (g.kind = 'failed' AND c.phase = 'present')
), numbered AS (
    SELECT src.*, nextval('checkpoint_seq') AS new_seq FROM src
), ins AS (
    INSERT INTO checkpoints (partition_key, region_id, day, phase, input_hash, idempotency_key, status, state_hash,
                             schema_version, code_version, first_seq, seq, attempt, tier, tier_label, summary, calls,
                             run_id, error_class, error_message, created_at, updated_at, completed_at)
    SELECT n.partition_key, n.region_id, n.day, n.phase, n.input_hash,
           encode(sha256(convert_to(n.partition_key || '|' || n.phase || '|' || n.input_hash, 'UTF8')), 'hex'),
           CASE WHEN n.planted_failure THEN 'FAILED' WHEN n.planted_pending THEN 'PENDING' ELSE n.status END,
           CASE WHEN n.planted_failure OR n.planted_pending THEN NULL ELSE n.state_hash END,
           n.schema_version, n.code_version, n.new_seq, n.new_seq,
           CASE WHEN n.planted_failure THEN 3 ELSE n.attempt END, n.tier, n.tier_label, n.summary, n.calls, n.run_id,
           CASE WHEN n.planted_failure THEN 'GraderError' END,
           CASE WHEN n.planted_failure THEN 'correlate of ' || n.partition_key
                || ' failed its grader: risk.range: 3 cells outside [0, 1] (planted by bench --scale)' END,
           n.created_at, n.updated_at, CASE WHEN n.planted_failure OR n.planted_pending THEN NULL ELSE n.completed_at END
    FROM numbered n
    RETURNING id, partition_key, region_id, day, phase, status, seq, attempt, tier, run_id
)
INSERT INTO checkpoint_events (checkpoint_id, partition_key, region_id, day, phase, status, input_hash, seq, attempt,
                               tier, run_id, detail, at)
SELECT i.id, i.partition_key, i.region_id, i.day, i.phase, e.status, e.input_hash, i.seq, e.attempt, e.tier, e.run_id,
       e.detail, e.at
FROM ins i JOIN scale_grid g ON g.partition_key = i.partition_key
JOIN checkpoints t ON t.partition_key = g.template AND t.phase = i.phase AND t.superseded_at IS NULL
JOIN checkpoint_events e ON e.checkpoint_id = t.id
WHERE i.status = 'COMPLETED' OR e.status = 'PENDING'
"""

_FAILED_EVENTS = """
INSERT INTO checkpoint_events (checkpoint_id, partition_key, region_id, day, phase, status, input_hash, seq, attempt,
                               tier, run_id, detail, at)
SELECT id, partition_key, region_id, day, phase, 'FAILED', input_hash, seq, attempt, tier, run_id,
       jsonb_build_object('error_class', error_class), updated_at
FROM checkpoints WHERE status = 'FAILED' AND superseded_at IS NULL
"""

_CLONE_RECEIPTS = """
INSERT INTO receipts (artifact_id, target, generation, idempotency_key, partition_key, region_id, day, kind, content_hash,
                      size_bytes, target_ref, status, supersedes, checkpoint_id, attempts, last_error, response,
                      created_at, delivered_at)
SELECT a.artifact_id, a.target, a.generation,
       CASE WHEN a.generation = 1 THEN a.artifact_id ELSE a.artifact_id || '#' || a.generation END,
       a.partition_key, a.region_id, a.day, a.kind, a.content_hash, a.size_bytes, a.target_ref, a.status, NULL, NULL,
       a.attempts, a.last_error, a.response, a.created_at, a.delivered_at
FROM (
    SELECT g.region_id || '/' || g.day || '/' || r.kind || '@' || split_part(r.artifact_id, '@', 2) AS artifact_id,
           r.target, r.generation, g.partition_key, g.region_id, g.day, r.kind, r.content_hash, r.size_bytes,
           replace(r.target_ref, r.region_id || '/' || r.day, g.region_id || '/' || g.day) AS target_ref,
           r.status, r.attempts, r.last_error, r.response, r.created_at, r.delivered_at, r.receipt_id
    FROM scale_grid g JOIN receipts r ON r.partition_key = g.template
    WHERE g.kind = 'ok'
    ORDER BY g.day, g.region_id, r.receipt_id
) a
"""



def clone_partitions(dsn: str, grid: Iterable[tuple[str, str, str, str, str]], *,
                     analyze: bool = True) -> dict[str, int]:
    """Give every (partition key, region, day, template key, kind) of ``grid`` a copy of the
    template partition's head checkpoints, their events and receipts, under its own key.

    ``kind`` is ``ok``, ``failed`` (correlate FAILED after 3 attempts, no present) or ``pending``
    (present PENDING). ``analyze`` False leaves the ledger as it grew, not vacuumed or analyzed
    (as where autovacuum does not run). Returns the row counts of the ledger afterwards.
    """
    with psycopg.connect(dsn, autocommit=False) as conn:
        conn.execute("CREATE TEMP TABLE scale_grid (partition_key text PRIMARY KEY, region_id text, day text,"
                     " template text, kind text) ON COMMIT DROP")
        with conn.cursor().copy("COPY scale_grid FROM STDIN") as copy:
            for row in grid:
                copy.write_row(row)
        conn.execute(_CLONE_CHECKPOINTS)
        conn.execute(_FAILED_EVENTS)
        conn.execute(_CLONE_RECEIPTS)
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A year's ledger has long been vacuumed; without this, autovacuum starts on the fresh rows
        # during the timings, and index-only scans find no page marked all-visible.
        if analyze:
            conn.execute("VACUUM (ANALYZE)")
        try:
            conn.execute("CHECKPOINT")  # the clone's pages written now, not by the checkpointer mid-timing
        except psycopg.errors.InsufficientPrivilege:
            pass  # needs pg_checkpoint (PostgreSQL 15) or a superuser; the timings only get noisier
        counts = {
            "checkpoints": conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0],
            "checkpoint_events": conn.execute("SELECT count(*) FROM checkpoint_events").fetchone()[0],
            "receipts": conn.execute("SELECT count(*) FROM receipts").fetchone()[0],
            "partitions": conn.execute("SELECT count(*) FROM partition_state").fetchone()[0],
        }
        # This session's reads are published before it returns (a session publishes them when it
        # ends, which a reader of the statistics cannot tell apart from its leaving the list).
        with contextlib.suppress(psycopg.errors.UndefinedFunction):  # PostgreSQL 15 and later
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT 1")
    return counts
