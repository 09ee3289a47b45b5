-- Per-phase access, enforced by the database, and a log of every read by a person.
--
-- 1. Roles. resume_worker (the pipeline), ops_reader, compliance_auditor and admin are real
--    PostgreSQL roles (NOLOGIN; roles belong to the whole server, so a second ledger database on
--    it finds them made). The ledger's own user becomes a member of each, so that it can take
--    them on: the pipeline connects with the startup option role=resume_worker and so works as a
--    role that is neither a superuser nor the owner of the tables.
-- 2. The policy is data: phase_access says which roles may read which phase's checkpoints,
--    events, recorded calls and receipts (receipts belong to present). `stormlake access
--    grant/revoke` changes it, each change an operator action (who, when, why).
-- 3. Row-level security, forced (the table owner is no exception), on every ledger table that
--    carries a phase: checkpoints, checkpoint_events, recorded_calls (through its checkpoint),
--    receipts (present) and operator_actions; and on partition_state, which holds every phase's
--    entry. resume_worker reads and writes every row; any other role holding a grant on a table
--    sees the rows of the phases the policy gives it.
-- 4. Reader roles hold no grant on those tables. They read through the views of schema
--    ledger_read, a read in two transactions:
--      SELECT ledger_read.open('checkpoints', ARRAY['present']);   -- one transaction: the log
--      BEGIN; SELECT ledger_read.use(<request>); SELECT * FROM ledger_read.checkpoints; COMMIT;
--    open() writes one checkpoint_access_log row per phase asked for, allowed or denied, and
--    returns the request id. A view serves a request only once the transaction that logged it
--    has committed, so no read happens without a log row that a rollback can no longer take
--    back. A request that names a denied phase fails at use() (the denial is logged already); a
--    request for every phase reads the rows of the allowed ones.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['resume_worker', 'ops_reader', 'compliance_auditor', 'admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN NULL;  -- made meanwhile for another database
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'the ledger''s user % may not create roles', current_user
                        USING ERRCODE = 'insufficient_privilege',
                              HINT = format('as a superuser run: CREATE ROLE resume_worker NOLOGIN; CREATE ROLE ops_reader NOLOGIN;'
                                            ' CREATE ROLE compliance_auditor NOLOGIN; CREATE ROLE admin NOLOGIN;'
                                            ' GRANT resume_worker, ops_reader, compliance_auditor, admin TO %I;'
                                            ' (or ALTER ROLE %I CREATEROLE), then run again', current_user, current_user);
            END;
        END IF;
        IF NOT pg_has_role(current_user, r, 'MEMBER') THEN
            BEGIN
                EXECUTE format('GRANT %I TO %I', r, current_user);
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'the ledger''s user % may not take on the role %', current_user, r
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = format('as a superuser run: GRANT %I TO %I; then run again', r, current_user);
            END;
        END IF;
    END LOOP;
END $$;

-- ---- the policy ----------------------------------------------------------------------------
CREATE TABLE phase_access (
    phase  text NOT NULL REFERENCES phase_order (phase),
    role   text NOT NULL,
    PRIMARY KEY (phase, role)
);
INSERT INTO phase_access (phase, role) VALUES
    ('ingest', 'resume_worker'), ('ingest', 'admin'),
    ('enrich', 'resume_worker'), ('enrich', 'admin'),
    ('correlate', 'resume_worker'), ('correlate', 'ops_reader'), ('correlate', 'admin'),
    ('present', 'resume_worker'), ('present', 'ops_reader'), ('present', 'compliance_auditor'), ('present', 'admin');

-- Whether ``who`` may read ``phase`` (a member of a role the policy names). Runs as its owner, so
-- a caller needs no grant on phase_access; the policies pass current_user.
CREATE FUNCTION ledger_may_read(p_phase text, who text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM phase_access a
                   WHERE a.phase = p_phase AND pg_has_role(who, a.role, 'MEMBER'))
$$;

ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_check
    CHECK (action IN ('release', 'force', 'grant', 'revoke'));

-- ---- the access log ------------------------------------------------------------------------
CREATE SEQUENCE checkpoint_access_request;
CREATE TABLE checkpoint_access_log (
    access_id      bigserial   PRIMARY KEY,
    request_id     bigint      NOT NULL,
    at             timestamptz NOT NULL DEFAULT now(),
    role           text        NOT NULL,      -- the role that read (or tried to)
    phase          text        NOT NULL,
    partition_key  text,                      -- null: every partition the read selects
    what           text        NOT NULL,      -- checkpoints | events | calls | receipts | partitions | actions
    allowed        boolean     NOT NULL,
    named          boolean     NOT NULL,      -- the phase was named (a denial then fails the read)
    xact           xid8        NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX checkpoint_access_log_request ON checkpoint_access_log (request_id);
CREATE INDEX checkpoint_access_log_at ON checkpoint_access_log (at);
CREATE INDEX checkpoint_access_log_role ON checkpoint_access_log (role, at);

-- ---- grants: the pipeline's role works on every table; readers on none --------------------
GRANT USAGE ON SCHEMA public TO resume_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO resume_worker;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO resume_worker;
REVOKE ALL ON phase_access, checkpoint_access_log FROM resume_worker;
REVOKE ALL ON SEQUENCE checkpoint_access_request FROM resume_worker;
GRANT SELECT ON phase_order TO ops_reader, compliance_auditor, admin;  -- the order of the phases, no state
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO resume_worker;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO resume_worker;

-- ---- row-level security --------------------------------------------------------------------
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['checkpoints', 'checkpoint_events', 'recorded_calls', 'receipts', 'operator_actions',
                             'partition_state'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY pipeline ON %I FOR ALL TO resume_worker USING (true) WITH CHECK (true)', t);
    END LOOP;
END $$;
CREATE POLICY phase_readers ON checkpoints FOR SELECT USING (ledger_may_read(phase, current_user));
CREATE POLICY phase_readers ON checkpoint_events FOR SELECT USING (ledger_may_read(phase, current_user));
CREATE POLICY phase_readers ON recorded_calls FOR SELECT
    USING (EXISTS (SELECT 1 FROM checkpoints c WHERE c.id = checkpoint_id));  -- the checkpoint's own policy decides
CREATE POLICY phase_readers ON receipts FOR SELECT USING (ledger_may_read('present', current_user));
CREATE POLICY phase_readers ON operator_actions FOR SELECT
    USING (phase IS NULL OR ledger_may_read(phase, current_user));

-- ---- the read functions ----------------------------------------------------------------------
CREATE SCHEMA ledger_read;
REVOKE ALL ON SCHEMA ledger_read FROM PUBLIC;
GRANT USAGE ON SCHEMA ledger_read TO resume_worker, ops_reader, compliance_auditor, admin;

-- Who is reading: the role the session took on (SET ROLE, or the startup option role=…), else the
-- user it logged in as. A SECURITY DEFINER function changes current_user, never these.
CREATE FUNCTION ledger_read.caller() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text ELSE current_setting('role') END
$$;

CREATE FUNCTION ledger_read.log_request(p_what text, p_phases text[], p_partition text)
    RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    req bigint := nextval('checkpoint_access_request');
    who text := ledger_read.caller();
BEGIN
    IF p_what NOT IN ('checkpoints', 'events', 'calls', 'receipts', 'partitions', 'actions') THEN
        RAISE EXCEPTION 'no such ledger read: % (checkpoints, events, calls, receipts, partitions, actions)', p_what
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_phases IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(p_phases) p WHERE p NOT IN (SELECT phase FROM phase_order)) THEN
        RAISE EXCEPTION 'no such phase among %', p_phases USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO checkpoint_access_log (request_id, role, phase, partition_key, what, allowed, named)
    SELECT req, who, o.phase, p_partition, p_what, ledger_may_read(o.phase, who), p_phases IS NOT NULL
    FROM phase_order o
    WHERE (p_phases IS NULL OR o.phase = ANY (p_phases)) AND (p_what <> 'receipts' OR o.phase = 'present')
    ORDER BY o.position;
    RETURN req;
END $$;

-- Log a read request (one row per phase asked for) and return its id. The transaction's commit
-- waits for the WAL flush whatever the session says, so a committed log row survives a crash.
-- (A plain SQL function: a function with a SET clause undoes every setting made inside it.)
CREATE FUNCTION ledger_read.open(p_what text, p_phases text[] DEFAULT NULL, p_partition text DEFAULT NULL)
    RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT ledger_read.log_request(p_what, p_phases, p_partition)
    FROM pg_catalog.set_config('synchronous_commit', 'on', true) AS durable
$$;

-- The phases a committed request of the caller's may read (and its partition, if it named one).
CREATE FUNCTION ledger_read.granted(p_request bigint, p_what text, OUT phases text[], OUT partition_key text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    who text := ledger_read.caller();
    r record;
BEGIN
    -- The policy as it stands now: a grant revoked since the request was opened no longer reads.
    SELECT array_agg(l.phase) FILTER (WHERE l.allowed AND ledger_may_read(l.phase, who)) AS allowed,
           array_agg(l.phase) FILTER (WHERE NOT (l.allowed AND ledger_may_read(l.phase, who)) AND l.named) AS refused,
           bool_and(l.role = who) AS mine, min(l.at) AS at, max(l.xact) AS xact, min(l.partition_key) AS part,
           count(*) AS n
    INTO r FROM checkpoint_access_log l WHERE l.request_id = p_request AND l.what = p_what;
    IF r.n = 0 OR NOT r.mine THEN
        RAISE EXCEPTION 'no % read request % of role %', p_what, p_request, who
            USING ERRCODE = 'insufficient_privilege', HINT = format('call ledger_read.open(%L) first', p_what);
    END IF;
    IF pg_xact_status(r.xact) IS DISTINCT FROM 'committed' THEN
        RAISE EXCEPTION 'read request % is not committed: open it in a transaction of its own, then read', p_request
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF r.at < clock_timestamp() - interval '10 minutes' THEN
        RAISE EXCEPTION 'read request % has expired (opened %); open a new one', p_request, r.at
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF r.refused IS NOT NULL THEN
        RAISE EXCEPTION 'role % may not read the % of phase %', who, p_what, array_to_string(r.refused, ', ')
            USING ERRCODE = 'insufficient_privilege', DETAIL = format('read request %s (its log rows say what was asked)', p_request);
    END IF;
    phases := coalesce(r.allowed, '{}');
    partition_key := r.part;
END $$;

-- Makes request p_request the one this transaction reads its kind through (the views below).
-- Transaction-local: every transaction that reads names its request again. (The setting is made
-- by a plain SQL function: a function with a SET clause undoes every setting made inside it.)
CREATE FUNCTION ledger_read.checked(p_request bigint) RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    w text := (SELECT min(l.what) FROM checkpoint_access_log l WHERE l.request_id = p_request);
BEGIN
    IF w IS NULL THEN
        RAISE EXCEPTION 'no read request %', p_request USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM ledger_read.granted(p_request, w);  -- the caller's, committed, not expired, no denied phase
    RETURN w;
END $$;
CREATE FUNCTION ledger_read.use(p_request bigint) RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT x.w FROM (SELECT ledger_read.checked(p_request) AS w) x,
                    LATERAL pg_catalog.set_config('stormlake.read.' || x.w, p_request::text, true) AS done
$$;

-- The grant a view reads through: the request this transaction uses for p_what (checked again).
CREATE FUNCTION ledger_read.grant_for(p_what text, OUT phases text[], OUT hidden text[], OUT partition_key text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    req bigint := nullif(current_setting('stormlake.read.' || p_what, true), '')::bigint;
BEGIN
    IF req IS NULL THEN
        RAISE EXCEPTION 'no % read request in this transaction', p_what USING ERRCODE = 'insufficient_privilege',
            HINT = format('SELECT ledger_read.open(%L) in a transaction of its own, then in the reading transaction'
                          ' SELECT ledger_read.use(<its request id>)', p_what);
    END IF;
    SELECT g.phases, g.partition_key INTO phases, partition_key FROM ledger_read.granted(req, p_what) g;
    hidden := ARRAY(SELECT o.phase FROM phase_order o WHERE o.phase <> ALL (phases));
END $$;

-- The views: the rows of the granted phases only. They run with their owner's rights on the
-- tables (readers hold none). Each is a subquery behind OFFSET 0, an optimization fence: no
-- condition of the reader's query is pushed down to the table's scan, so none is evaluated on a
-- row the view has not let through (not even a leakproof one, whose outcome could otherwise be
-- told from whether the view's own check ran). The request is checked first, once, by a
-- condition without columns (a one-time filter, before any row is read), and the grant is read
-- once more as an InitPlan for the phase test.
CREATE FUNCTION ledger_read.phases_of(p_what text) RETURNS text[]
    LANGUAGE sql STABLE AS $$ SELECT g.phases FROM ledger_read.grant_for(p_what) g $$;
CREATE FUNCTION ledger_read.partition_of(p_what text) RETURNS text
    LANGUAGE sql STABLE AS $$ SELECT g.partition_key FROM ledger_read.grant_for(p_what) g $$;

CREATE VIEW ledger_read.checkpoints WITH (security_barrier) AS
    SELECT * FROM (
        SELECT c.* FROM checkpoints c
        WHERE ledger_read.phases_of('checkpoints') IS NOT NULL
          AND c.phase = ANY ((SELECT ledger_read.phases_of('checkpoints'))::text[])
          AND coalesce(c.partition_key = (SELECT ledger_read.partition_of('checkpoints')), true)
        OFFSET 0) v;

CREATE VIEW ledger_read.events WITH (security_barrier) AS
    SELECT * FROM (
        SELECT e.* FROM checkpoint_events e
        WHERE ledger_read.phases_of('events') IS NOT NULL
          AND e.phase = ANY ((SELECT ledger_read.phases_of('events'))::text[])
          AND coalesce(e.partition_key = (SELECT ledger_read.partition_of('events')), true)
        OFFSET 0) v;

CREATE VIEW ledger_read.calls WITH (security_barrier) AS
    SELECT * FROM (
        SELECT rc.* FROM recorded_calls rc JOIN checkpoints c ON c.id = rc.checkpoint_id
        WHERE ledger_read.phases_of('calls') IS NOT NULL
          AND c.phase = ANY ((SELECT ledger_read.phases_of('calls'))::text[])
          AND coalesce(c.partition_key = (SELECT ledger_read.partition_of('calls')), true)
        OFFSET 0) v;

CREATE VIEW ledger_read.receipts WITH (security_barrier) AS
    SELECT * FROM (
        SELECT r.* FROM receipts r
        WHERE ledger_read.phases_of('receipts') IS NOT NULL
          AND 'present' = ANY ((SELECT ledger_read.phases_of('receipts'))::text[])
          AND coalesce(r.partition_key = (SELECT ledger_read.partition_of('receipts')), true)
        OFFSET 0) v;

-- An action with no phase (the release of dead letters names them in its detail) is shown only
-- to a role that may read every phase.
CREATE VIEW ledger_read.actions WITH (security_barrier) AS
    SELECT * FROM (
        SELECT a.* FROM operator_actions a
        WHERE ledger_read.phases_of('actions') IS NOT NULL
          AND (a.phase = ANY ((SELECT ledger_read.phases_of('actions'))::text[])
               OR (a.phase IS NULL AND (SELECT count(*) FROM phase_order)
                                       = cardinality((SELECT ledger_read.phases_of('actions')))))
          AND coalesce(a.partition_key = (SELECT ledger_read.partition_of('actions')), true)
        OFFSET 0) v;

-- partition_state with only the allowed phases' entries: the deliveries, quality and hold belong
-- to present (a role that may not read present sees the tier's own label, not "held"); failed and
-- pending say what the allowed phases show. The tier is the partition's, shown to every role.
CREATE VIEW ledger_read.partitions WITH (security_barrier) AS
    SELECT * FROM (
        SELECT s.partition_key, s.region_id, s.day, s.tier,
               CASE WHEN 'present' = ANY (g.phases) THEN s.tier_label
                    ELSE coalesce((SELECT o.tier_label FROM phase_order o WHERE o.position = s.tier), 'not_started')
               END AS tier_label,
               CASE WHEN g.hidden = '{}' THEN s.failed
                    ELSE EXISTS (SELECT 1 FROM unnest(g.phases) p WHERE s.phases->p->>'status' = 'FAILED') END AS failed,
               CASE WHEN g.hidden = '{}' THEN s.pending
                    ELSE EXISTS (SELECT 1 FROM unnest(g.phases) p WHERE s.phases->p->>'status' = 'PENDING') END AS pending,
               s.phases - g.hidden AS phases,
               CASE WHEN 'present' = ANY (g.phases) THEN s.deliveries ELSE '[]'::jsonb END AS deliveries,
               s.updated_at,
               CASE WHEN 'present' = ANY (g.phases) THEN s.signal_quality END AS signal_quality,
               CASE WHEN 'present' = ANY (g.phases) THEN s.held ELSE false END AS held
        FROM partition_state s
        CROSS JOIN (SELECT g0.phases, g0.hidden, g0.partition_key FROM ledger_read.grant_for('partitions') g0) g
        WHERE ledger_read.phases_of('partitions') IS NOT NULL
          AND coalesce(s.partition_key = g.partition_key, true)
        OFFSET 0) v;

GRANT SELECT ON ALL TABLES IN SCHEMA ledger_read TO resume_worker, ops_reader, compliance_auditor, admin;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ledger_read FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ledger_read TO resume_worker, ops_reader, compliance_auditor, admin;
