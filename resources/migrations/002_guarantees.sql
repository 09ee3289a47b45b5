-- Guarantees as strong as they read: a COMPLETED checkpoint is frozen whole, the idempotency
-- key is what it says it is and names at most one live checkpoint, and the readers of the
-- event outbox say how far they have read, so that pruning never removes an unread event.

-- 1. A COMPLETED checkpoint never changes, in any column, except that it may be marked
--    superseded once (superseded_at NULL -> a timestamp). Every column is compared, through the
--    row's JSON image, so a column added later is frozen too without touching this function.
--    superseded_at, once set, never changes on any row: a superseded checkpoint is history and
--    never becomes the head again.
CREATE OR REPLACE FUNCTION checkpoints_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text;
BEGIN
    IF OLD.superseded_at IS NOT NULL AND NEW.superseded_at IS DISTINCT FROM OLD.superseded_at THEN
        RAISE EXCEPTION 'checkpoint % (% of %) was superseded at %; superseded_at cannot change',
            OLD.id, OLD.phase, OLD.partition_key, OLD.superseded_at
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status = 'COMPLETED' THEN
        -- Compared as text, so that even an equal-valued but different jsonb (1 vs 1.0) counts.
        SELECT string_agg(n.key, ', ' ORDER BY n.key) INTO changed
          FROM jsonb_each(to_jsonb(NEW)) AS n
         WHERE n.key <> 'superseded_at'
           AND (to_jsonb(OLD) -> n.key)::text IS DISTINCT FROM n.value::text;
        IF changed IS NOT NULL THEN
            RAISE EXCEPTION 'checkpoint % (% of %) is COMPLETED and cannot be changed (column %)',
                OLD.id, OLD.phase, OLD.partition_key, changed
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- 2. The idempotency key is sha256(partition | phase | input hash) in lowercase hex, exactly as
--    resources/ledger.py idempotency_key() computes it, and at most one live (not superseded)
--    checkpoint carries a given key. A superseded row may share its key with a live one: a
--    partition whose inputs go A -> B -> A has a new live row for A after A's first was superseded.
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_idempotency_key_check CHECK (
    idempotency_key = encode(sha256(convert_to(partition_key || '|' || phase || '|' || input_hash, 'UTF8')), 'hex'));
DROP INDEX checkpoints_idem;
CREATE UNIQUE INDEX checkpoints_live_identity ON checkpoints (idempotency_key) WHERE superseded_at IS NULL;

-- 3. How far each reader of checkpoint_events (by event id) has read; prune keeps every event
--    after the lowest position recorded here.
CREATE TABLE event_readers (
    name            text        PRIMARY KEY,
    after_event_id  bigint      NOT NULL CHECK (after_event_id >= 0),  -- every event up to it was read
    updated_at      timestamptz NOT NULL DEFAULT now()
);
