-- partition_state: the ledger's view of each partition (contract section 8), kept current by the
-- database itself, so that status, the report and the sensors read one row a partition instead
-- of aggregating every head checkpoint and receipt on each look (a year of 50 regions is 18,250
-- partitions, 73,000 head checkpoints).
--
-- A statement that changes checkpoints or receipts refreshes the partitions it touched, in the
-- same transaction: it locks their partition_state rows (in key order, so two refreshes never
-- deadlock), and only then computes them, in a statement of its own. Under READ COMMITTED that
-- statement sees everything committed before the lock was granted, so of two transactions that
-- change one partition at once the second to commit always writes the later state.

CREATE TABLE phase_order (
    phase       text    PRIMARY KEY,
    position    integer NOT NULL UNIQUE CHECK (position >= 1),   -- also the tier it reaches
    tier_label  text    NOT NULL
);
INSERT INTO phase_order VALUES ('ingest', 1, 'ingested'), ('enrich', 2, 'enriched'),
                               ('correlate', 3, 'correlated'), ('present', 4, 'published');

CREATE TABLE partition_state (
    partition_key  text        PRIMARY KEY,
    region_id      text        NOT NULL,
    day            text        NOT NULL,
    tier           integer     NOT NULL,
    tier_label     text        NOT NULL,
    failed         boolean     NOT NULL,   -- a head checkpoint is FAILED
    pending        boolean     NOT NULL,   -- a head checkpoint is PENDING
    phases         jsonb       NOT NULL,   -- phase -> the contract's entry
    deliveries     jsonb       NOT NULL,   -- the contract's list, in receipt order
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX partition_state_order ON partition_state (day, region_id);
CREATE INDEX partition_state_region ON partition_state (region_id, day);
CREATE INDEX partition_state_attention ON partition_state (tier, day, region_id)
    WHERE failed OR tier < 4;

CREATE INDEX receipts_partition_key ON receipts (partition_key, receipt_id);

-- Tier: the number of leading phases whose head is COMPLETED on the current state of every phase
-- it read (its summary.upstream is contained in the partition's current state hashes).
CREATE FUNCTION refresh_partition_state(keys text[]) RETURNS void LANGUAGE plpgsql AS $$
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
               c.error_class, c.error_message, o.position
        FROM checkpoints c JOIN phase_order o USING (phase)
        WHERE c.partition_key = ANY(keys) AND c.superseded_at IS NULL
    ), st AS (
        SELECT partition_key, jsonb_object_agg(phase, state_hash) AS states FROM h GROUP BY partition_key
    ), ok AS (
        SELECT h.*, (h.status = 'COMPLETED' AND coalesce(h.upstream, '{}'::jsonb) <@ st.states) AS good
        FROM h JOIN st USING (partition_key)
    ), p AS (
        SELECT partition_key, min(region_id) AS region_id, min(day) AS day,
               coalesce(array_agg(position) FILTER (WHERE good), '{}') AS good_positions,
               bool_or(status = 'FAILED') AS failed, bool_or(status = 'PENDING') AS pending,
               jsonb_object_agg(phase,
                   jsonb_build_object('status', status, 'seq', seq, 'attempts', attempt, 'input_hash', input_hash,
                                      'state_hash', state_hash, 'schema_version', schema_version,
                                      'delta_versions', coalesce(delta_versions, '{}'::jsonb))
                   || CASE WHEN status = 'FAILED' THEN jsonb_build_object('error',
                          coalesce(error_class, 'None') || ': ' || coalesce(error_message, 'None'))
                      ELSE '{}'::jsonb END) AS phases
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
        tier_label = coalesce((SELECT tier_label FROM phase_order WHERE position = t.tier), 'not_started'),
        failed = t.failed, pending = t.pending, phases = t.phases, deliveries = coalesce(d.deliveries, '[]'),
        updated_at = now()
    FROM t LEFT JOIN d USING (partition_key)
    WHERE s.partition_key = t.partition_key;

    -- a partition with no head checkpoint left (never the case in normal operation) has no state
    DELETE FROM partition_state s WHERE s.partition_key = ANY(keys)
        AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.partition_key = s.partition_key AND c.superseded_at IS NULL);
END $$;

CREATE FUNCTION partition_state_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM refresh_partition_state(ARRAY(SELECT DISTINCT partition_key FROM new_rows));
    RETURN NULL;
END $$;
CREATE FUNCTION partition_state_after_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM refresh_partition_state(ARRAY(SELECT partition_key FROM new_rows UNION SELECT partition_key FROM old_rows));
    RETURN NULL;
END $$;
CREATE FUNCTION partition_state_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM refresh_partition_state(ARRAY(SELECT DISTINCT partition_key FROM old_rows));
    RETURN NULL;
END $$;

CREATE TRIGGER checkpoints_state_insert AFTER INSERT ON checkpoints
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION partition_state_after_insert();
CREATE TRIGGER checkpoints_state_update AFTER UPDATE ON checkpoints
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION partition_state_after_update();
CREATE TRIGGER checkpoints_state_delete AFTER DELETE ON checkpoints
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION partition_state_after_delete();
CREATE TRIGGER receipts_state_insert AFTER INSERT ON receipts
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION partition_state_after_insert();
CREATE TRIGGER receipts_state_update AFTER UPDATE ON receipts
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION partition_state_after_update();
CREATE TRIGGER receipts_state_delete AFTER DELETE ON receipts
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION partition_state_after_delete();

-- The state of every partition already in the ledger.
SELECT refresh_partition_state(ARRAY(SELECT DISTINCT partition_key FROM checkpoints WHERE superseded_at IS NULL));
