-- The stormlake ledger: checkpoints per (partition, phase, input hash), their history and
-- outbox, recorded calls, and delivery receipts. Conclusions only, never the data itself.

CREATE SEQUENCE checkpoint_seq;

CREATE TABLE checkpoints (
    id               bigserial PRIMARY KEY,
    partition_key    text        NOT NULL,          -- 'YYYY-MM-DD|region_id' (Dagster's key)
    region_id        text        NOT NULL,
    day              text        NOT NULL,
    phase            text        NOT NULL CHECK (phase IN ('ingest', 'enrich', 'correlate', 'present')),
    input_hash       text        NOT NULL,
    idempotency_key  text        NOT NULL,          -- sha256(partition | phase | input hash)
    status           text        NOT NULL CHECK (status IN ('PENDING', 'COMPLETED', 'FAILED')),
    state_hash       text,
    schema_version   integer     NOT NULL,
    code_version     text        NOT NULL,
    first_seq        bigint      NOT NULL,          -- seq of the first attempt for this input hash
    seq              bigint      NOT NULL,          -- seq of the current attempt: the fencing token
    attempt          integer     NOT NULL DEFAULT 1,
    tier             integer     NOT NULL DEFAULT 0,
    tier_label       text        NOT NULL DEFAULT 'not_started',
    summary          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    calls            jsonb       NOT NULL DEFAULT '[]'::jsonb,
    run_id           text,
    error_class      text,
    error_message    text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    superseded_at    timestamptz                    -- set when a newer input hash took over
);

-- The live checkpoint ("head") of a (partition, phase): at most one not superseded.
CREATE UNIQUE INDEX checkpoints_head ON checkpoints (partition_key, phase) WHERE superseded_at IS NULL;
CREATE INDEX checkpoints_idem ON checkpoints (idempotency_key);
CREATE INDEX checkpoints_region_day ON checkpoints (region_id, day);

-- A COMPLETED checkpoint is never overwritten or downgraded; the only later change allowed
-- is marking it superseded when a newer input hash of the same (partition, phase) begins.
CREATE FUNCTION checkpoints_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'COMPLETED' THEN
        IF NEW.status IS DISTINCT FROM OLD.status
           OR NEW.state_hash IS DISTINCT FROM OLD.state_hash
           OR NEW.input_hash IS DISTINCT FROM OLD.input_hash
           OR NEW.seq IS DISTINCT FROM OLD.seq
           OR NEW.summary IS DISTINCT FROM OLD.summary
           OR NEW.calls IS DISTINCT FROM OLD.calls
           OR NEW.schema_version IS DISTINCT FROM OLD.schema_version
           OR (OLD.superseded_at IS NOT NULL AND NEW.superseded_at IS DISTINCT FROM OLD.superseded_at) THEN
            RAISE EXCEPTION 'checkpoint % is COMPLETED and cannot be changed', OLD.id
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER checkpoints_guard BEFORE UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION checkpoints_guard();

CREATE FUNCTION checkpoints_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'COMPLETED' AND OLD.superseded_at IS NULL THEN
        RAISE EXCEPTION 'checkpoint % is the current COMPLETED checkpoint and cannot be deleted', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER checkpoints_no_delete BEFORE DELETE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION checkpoints_no_delete();

-- History and outbox in one: every claim, skip, completion and failure, in commit order.
-- Sensors read it by event id (their cursor); NOTIFY stormlake_events wakes listeners.
CREATE TABLE checkpoint_events (
    event_id        bigserial PRIMARY KEY,
    checkpoint_id   bigint      REFERENCES checkpoints (id) ON DELETE SET NULL,
    partition_key   text        NOT NULL,
    region_id       text        NOT NULL,
    day             text        NOT NULL,
    phase           text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('PENDING', 'COMPLETED', 'FAILED', 'SKIPPED')),
    input_hash      text        NOT NULL,
    seq             bigint,
    attempt         integer,
    tier            integer,
    run_id          text,
    detail          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX checkpoint_events_partition ON checkpoint_events (partition_key, phase, event_id);
CREATE INDEX checkpoint_events_at ON checkpoint_events (at);

-- Calls to the outside world made by an attempt (Delta commits, deliveries, …), recorded as
-- they complete, so that a retried attempt answers them from the record instead of repeating.
CREATE TABLE recorded_calls (
    checkpoint_id   bigint      NOT NULL REFERENCES checkpoints (id) ON DELETE CASCADE,
    call_key        text        NOT NULL,           -- kind:name:sha256(input)
    kind            text        NOT NULL,
    name            text        NOT NULL,
    input           jsonb       NOT NULL,
    output          jsonb       NOT NULL,
    seq             bigint      NOT NULL,           -- attempt that made the call
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (checkpoint_id, call_key)
);

CREATE TABLE receipts (
    artifact_id     text        NOT NULL,           -- '<region>/<day>/<kind>@<sha256[:16]>'
    target          text        NOT NULL,           -- 'file' | 'webhook'
    partition_key   text        NOT NULL,
    region_id       text        NOT NULL,
    day             text        NOT NULL,
    kind            text        NOT NULL,           -- 'summary.json' | 'clusters.geojson' | 'report.html'
    content_hash    text        NOT NULL,           -- full sha256 hex of the bytes
    size_bytes      bigint      NOT NULL,
    target_ref      text        NOT NULL,           -- path or URL
    status          text        NOT NULL CHECK (status IN ('PENDING', 'DELIVERED')),
    supersedes      text,                           -- artifact id of the revision this replaces
    checkpoint_id   bigint      REFERENCES checkpoints (id) ON DELETE SET NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    response        jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    PRIMARY KEY (artifact_id, target)
);
CREATE INDEX receipts_partition ON receipts (region_id, day, kind, target);

CREATE FUNCTION receipts_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'DELIVERED' AND NEW.status IS DISTINCT FROM 'DELIVERED' THEN
        RAISE EXCEPTION 'receipt % (%) is DELIVERED and cannot be downgraded', OLD.artifact_id, OLD.target
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER receipts_guard BEFORE UPDATE ON receipts
    FOR EACH ROW EXECUTE FUNCTION receipts_guard();
