-- Deliveries follow the ledger's current revision, even back to earlier bytes.
--
-- When a partition's inputs go A -> B -> A, the consumer must end on A again although A's
-- artifact ids were delivered before. A receipt is therefore one delivery of an artifact to a
-- target: (artifact_id, target, generation), where generation counts how often that artifact
-- became the current revision there. Its idempotency key, the webhook's Idempotency-Key, is the
-- artifact id for the first generation (so every existing key keeps its meaning) and
-- '<artifact id>#<generation>' for a later one. receipt_id orders the receipts of a slot
-- (region, day, kind, target): the last one is what the target was last sent or is being sent.

ALTER TABLE receipts ADD COLUMN generation integer NOT NULL DEFAULT 1 CHECK (generation >= 1);
ALTER TABLE receipts ADD COLUMN idempotency_key text;
UPDATE receipts SET idempotency_key = artifact_id;
ALTER TABLE receipts ALTER COLUMN idempotency_key SET NOT NULL;
ALTER TABLE receipts ADD COLUMN receipt_id bigserial NOT NULL;
-- existing rows get their ids in delivery order, so "the last receipt of a slot" holds for them
WITH ordered AS (
    SELECT artifact_id, target, row_number() OVER (ORDER BY created_at, artifact_id, target) AS n FROM receipts
)
UPDATE receipts r SET receipt_id = o.n FROM ordered o WHERE o.artifact_id = r.artifact_id AND o.target = r.target;
SELECT setval(pg_get_serial_sequence('receipts', 'receipt_id'), greatest((SELECT max(receipt_id) FROM receipts), 1));

ALTER TABLE receipts DROP CONSTRAINT receipts_pkey;
ALTER TABLE receipts ADD PRIMARY KEY (artifact_id, target, generation);
ALTER TABLE receipts ADD CONSTRAINT receipts_receipt_id_key UNIQUE (receipt_id);
ALTER TABLE receipts ADD CONSTRAINT receipts_idempotency_key_key UNIQUE (idempotency_key, target);
ALTER TABLE receipts ADD CONSTRAINT receipts_idempotency_key_shape CHECK (
    idempotency_key = CASE WHEN generation = 1 THEN artifact_id ELSE artifact_id || '#' || generation END);

-- SUPERSEDED: a PENDING delivery overtaken by a newer revision of its slot before it was
-- confirmed. It is final: the newer revision is what the target must end on.
ALTER TABLE receipts DROP CONSTRAINT receipts_status_check;
ALTER TABLE receipts ADD CONSTRAINT receipts_status_check CHECK (status IN ('PENDING', 'DELIVERED', 'SUPERSEDED'));

DROP INDEX receipts_partition;
CREATE INDEX receipts_slot ON receipts (region_id, day, kind, target, receipt_id);

CREATE OR REPLACE FUNCTION receipts_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('DELIVERED', 'SUPERSEDED') AND NEW.status IS DISTINCT FROM OLD.status THEN
        RAISE EXCEPTION 'receipt % (%, generation %) is % and cannot change status',
            OLD.artifact_id, OLD.target, OLD.generation, OLD.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.artifact_id IS DISTINCT FROM OLD.artifact_id OR NEW.target IS DISTINCT FROM OLD.target
       OR NEW.generation IS DISTINCT FROM OLD.generation OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR NEW.content_hash IS DISTINCT FROM OLD.content_hash OR NEW.receipt_id IS DISTINCT FROM OLD.receipt_id THEN
        RAISE EXCEPTION 'receipt % (%): its identity and content cannot change', OLD.artifact_id, OLD.target
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
