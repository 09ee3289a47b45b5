-- Signal quality and held batches.
--
-- Present grades every batch high | medium | low | noisy (assets/quality.py) and records the
-- grade in its checkpoint summary (figures.quality). A noisy batch is held: present commits with
-- summary.held (why) and delivers nothing. A held head does not count toward the tier, so the
-- partition stays at tier 3, labelled held_for_review, until an operator releases it (the next
-- present delivers) or its inputs change.
--
-- partition_state gains the batch's signal_quality (its present head's grade) and held; a FAILED
-- phase's entry gains its failures (toward the dead-letter limit, migration 005).

ALTER TABLE partition_state ADD COLUMN signal_quality text;
ALTER TABLE partition_state ADD COLUMN held boolean NOT NULL DEFAULT false;
CREATE INDEX partition_state_held ON partition_state (day, region_id) WHERE held;

-- the runner looks up the release of a held head by partition, phase and input hash
CREATE INDEX operator_actions_release ON operator_actions (partition_key, phase, (detail->'held'->>'input_hash'))
    WHERE action = 'release';

CREATE OR REPLACE FUNCTION refresh_partition_state(keys text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    last_tier integer := (SELECT max(position) FROM phase_order);
BEGIN
    INSERT INTO partition_state (partition_key, region_id, day, tier, tier_label, failed, pending, phases, deliveries)
    SELECT k, split_part(k, '|', 2), split_part(k, '|', 1), 0, 'not_started', false, false, '{}', '[]'
    FROM unnest(keys) AS k
    ON CONFLICT (partition_key) DO NOTHING;
    PERFORM 1 FROM partition_state WHERE partition_key = ANY(keys) ORDER BY partition_key FOR UPDATE;

    WITH h AS (
        SELECT c.partition_key, c.region_id, c.day, c.phase, c.status, c.seq, c.attempt, c.input_hash, c.state_hash,
               c.schema_version, c.summary->'upstream' AS upstream, c.summary->'delta_versions' AS delta_versions,
               c.summary->'figures'->'quality'->>'grade' AS quality,
               (c.status = 'COMPLETED' AND c.summary ? 'held') AS held,
               c.error_class, c.error_message, c.failures, o.position
        FROM checkpoints c JOIN phase_order o USING (phase)
        WHERE c.partition_key = ANY(keys) AND c.superseded_at IS NULL
    ), st AS (
        SELECT partition_key, jsonb_object_agg(phase, state_hash) AS states FROM h GROUP BY partition_key
    ), ok AS (
        SELECT h.*, (h.status = 'COMPLETED' AND NOT h.held AND coalesce(h.upstream, '{}'::jsonb) <@ st.states) AS good
        FROM h JOIN st USING (partition_key)
    ), p AS (
        SELECT partition_key, min(region_id) AS region_id, min(day) AS day,
               coalesce(array_agg(position) FILTER (WHERE good), '{}') AS good_positions,
               bool_or(status = 'FAILED') AS failed, bool_or(status = 'PENDING') AS pending,
               bool_or(held) AS held, max(quality) AS quality,
               jsonb_object_agg(phase,
                   jsonb_build_object('status', status, 'seq', seq, 'attempts', attempt, 'input_hash', input_hash,
                                      'state_hash', state_hash, 'schema_version', schema_version,
                                      'delta_versions', coalesce(delta_versions, '{}'::jsonb))
                   || CASE WHEN status = 'FAILED' THEN jsonb_build_object('error',
                          coalesce(error_class, 'None') || ': ' || coalesce(error_message, 'None'), 'failures', failures)
                      ELSE '{}'::jsonb END
                   || CASE WHEN held THEN jsonb_build_object('held', true) ELSE '{}'::jsonb END) AS phases
        FROM ok GROUP BY partition_key
    ), d AS (
        SELECT r.partition_key,
               jsonb_agg(jsonb_build_object('artifact_id', r.artifact_id, 'target', r.target, 'status', r.status,
                                            'content_hash', r.content_hash)
                         || CASE WHEN r.supersedes IS NULL THEN '{}'::jsonb
                                 ELSE jsonb_build_object('supersedes', r.supersedes) END
                         || CASE WHEN r.generation = 1 THEN '{}'::jsonb
                                 ELSE jsonb_build_object('idempotency_key', r.idempotency_key) END
                         ORDER BY r.receipt_id) AS deliveries
        FROM receipts r WHERE r.partition_key = ANY(keys) GROUP BY r.partition_key
    ), t AS (
        SELECT p.*, coalesce((SELECT min(o.position) - 1 FROM phase_order o WHERE o.position <> ALL(p.good_positions)),
                             last_tier) AS tier
        FROM p
    )
    UPDATE partition_state s SET
        region_id = t.region_id, day = t.day, tier = t.tier,
        tier_label = CASE WHEN t.held AND t.tier = last_tier - 1 THEN 'held_for_review'
                          ELSE coalesce((SELECT tier_label FROM phase_order WHERE position = t.tier), 'not_started') END,
        failed = t.failed, pending = t.pending, phases = t.phases, deliveries = coalesce(d.deliveries, '[]'),
        signal_quality = t.quality, held = t.held,
        updated_at = now()
    FROM t LEFT JOIN d USING (partition_key)
    WHERE s.partition_key = t.partition_key;

    DELETE FROM partition_state s WHERE s.partition_key = ANY(keys)
        AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.partition_key = s.partition_key AND c.superseded_at IS NULL);
END $$;
