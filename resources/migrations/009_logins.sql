-- Governance that holds against a person with a login, not only against an honest client.
--
-- 1. The access log names the person: the login (session_user), the role used, the client's
--    address and the backend; a read request serves only the session (backend) that opened it.
-- 2. checkpoint_access_log and operator_actions are append-only for every login, the owner's
--    included: a trigger refuses UPDATE, DELETE and TRUNCATE. The one way to remove old rows is
--    ledger_retain(), which records its own use first (a 'retain' operator action) and deletes
--    only rows older than the cutoff that action names, in the same transaction.
-- 3. Policy changes go through ledger_change_access(), a definer function that checks the caller
--    (session_user) is a member of admin and records that login as the actor. resume_worker's
--    access is not a policy choice (the pipeline computes every phase from the ones before) and
--    is refused there, rather than changed with no effect.
-- 4. No side channels: no ledger function is executable by PUBLIC unless it must be, PUBLIC
--    loses CREATE on schema public and CONNECT/TEMPORARY on this database, and every definer
--    function resolves names in pg_catalog first (search_path = pg_catalog, public, pg_temp).
--    (The NOTIFY on each checkpoint event is gone from the ledger's statements: nothing listened,
--    and any login could LISTEN to it.)

-- ---- 1. who read ---------------------------------------------------------------------------
ALTER TABLE checkpoint_access_log
    ADD COLUMN login        text    NOT NULL DEFAULT session_user,  -- the person's login
    ADD COLUMN client_addr  inet    DEFAULT inet_client_addr(),     -- null over the Unix socket
    ADD COLUMN backend_pid  integer NOT NULL DEFAULT pg_backend_pid();
COMMENT ON COLUMN checkpoint_access_log.role IS 'the role the read was made as (SET ROLE, -c role=, else the login)';

ALTER TABLE operator_actions
    ADD COLUMN login text NOT NULL DEFAULT session_user,
    ADD COLUMN xact  xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_check
    CHECK (action IN ('release', 'force', 'grant', 'revoke', 'retain'));

CREATE OR REPLACE FUNCTION ledger_read.log_request(p_what text, p_phases text[], p_partition text)
    RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
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
    INSERT INTO checkpoint_access_log (request_id, role, phase, partition_key, what, allowed, named,
                                       login, client_addr, backend_pid)
    SELECT req, who, o.phase, p_partition, p_what, ledger_may_read(o.phase, who), p_phases IS NOT NULL,
           session_user, inet_client_addr(), pg_backend_pid()
    FROM phase_order o
    WHERE (p_phases IS NULL OR o.phase = ANY (p_phases)) AND (p_what <> 'receipts' OR o.phase = 'present')
    ORDER BY o.position;
    RETURN req;
END $$;

-- A request is the session's that opened it: same login, same role, same backend.
CREATE OR REPLACE FUNCTION ledger_read.granted(p_request bigint, p_what text, OUT phases text[], OUT partition_key text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    who text := ledger_read.caller();
    r record;
BEGIN
    -- The policy as it stands now: a grant revoked since the request was opened no longer reads.
    SELECT array_agg(l.phase) FILTER (WHERE l.allowed AND ledger_may_read(l.phase, who)) AS allowed,
           array_agg(l.phase) FILTER (WHERE NOT (l.allowed AND ledger_may_read(l.phase, who)) AND l.named) AS refused,
           bool_and(l.role = who AND l.login = session_user AND l.backend_pid = pg_backend_pid()) AS mine,
           min(l.at) AS at, max(l.xact) AS xact, min(l.partition_key) AS part, count(*) AS n
    INTO r FROM checkpoint_access_log l WHERE l.request_id = p_request AND l.what = p_what;
    IF r.n = 0 OR NOT r.mine THEN
        RAISE EXCEPTION 'no % read request % of this session (role %)', p_what, p_request, who
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

-- ---- 2. append-only, and the one retention --------------------------------------------------
CREATE FUNCTION ledger_append_only() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    -- A row older than the cutoff of a retention recorded in this very transaction may go.
    IF TG_OP = 'DELETE' AND EXISTS (
            SELECT 1 FROM operator_actions a
            WHERE a.action = 'retain' AND a.xact = pg_current_xact_id()
              AND OLD.at < (a.detail->>'before')::timestamptz) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % refused for %', TG_TABLE_NAME, TG_OP, session_user
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'old rows are removed only by SELECT ledger_retain(<age>), which records its own use';
END $$;

CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON checkpoint_access_log
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON checkpoint_access_log
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON operator_actions
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON operator_actions
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- Remove access-log rows and operator actions older than p_older_than (at least 30 days), as a
-- member of admin. Records itself first ('retain', its cutoff, the login, the reason), and that
-- row is never older than any cutoff. Returns the rows removed.
CREATE FUNCTION ledger_retain(p_older_than interval, p_reason text, OUT access_rows bigint, OUT actions bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    cutoff timestamptz := now() - p_older_than;
BEGIN
    IF NOT pg_has_role(session_user, 'admin', 'MEMBER') THEN
        RAISE EXCEPTION 'login % is not a member of admin: only admin may apply retention', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_older_than IS NULL OR p_older_than < interval '30 days' THEN
        RAISE EXCEPTION 'retention keeps at least 30 days (asked: %)', p_older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(btrim(p_reason), '') = '' THEN
        RAISE EXCEPTION 'retention needs a reason' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true);
    INSERT INTO operator_actions (action, partition_key, actor, reason, detail)
    VALUES ('retain', '*', session_user, p_reason, jsonb_build_object('before', cutoff, 'older_than', p_older_than::text));
    DELETE FROM checkpoint_access_log WHERE at < cutoff;
    GET DIAGNOSTICS access_rows = ROW_COUNT;
    DELETE FROM operator_actions WHERE at < cutoff;
    GET DIAGNOSTICS actions = ROW_COUNT;
END $$;

-- The pipeline records actions (a release, a forced re-run); it never changes or removes one.
REVOKE UPDATE, DELETE, TRUNCATE ON operator_actions FROM resume_worker;
DROP POLICY pipeline ON operator_actions;
CREATE POLICY pipeline_read ON operator_actions FOR SELECT TO resume_worker USING (true);
CREATE POLICY pipeline_record ON operator_actions FOR INSERT TO resume_worker WITH CHECK (true);
-- Only the owner holds DELETE on the table, and the trigger lets it through only under ledger_retain().
CREATE POLICY retention ON operator_actions FOR DELETE USING (true);

-- ---- 3. policy changes ------------------------------------------------------------------------
CREATE FUNCTION ledger_change_access(p_action text, p_role text, p_phase text, p_reason text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    changed integer;
BEGIN
    IF NOT pg_has_role(session_user, 'admin', 'MEMBER') THEN
        RAISE EXCEPTION 'login % is not a member of admin: only admin may change who reads which phase', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_action NOT IN ('grant', 'revoke') THEN
        RAISE EXCEPTION 'no such access change: % (grant, revoke)', p_action USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role) THEN
        RAISE EXCEPTION 'there is no database role %', p_role USING ERRCODE = 'undefined_object';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM phase_order WHERE phase = p_phase) THEN
        RAISE EXCEPTION 'there is no phase %', p_phase USING ERRCODE = 'undefined_object';
    END IF;
    IF p_role = 'resume_worker' THEN
        RAISE EXCEPTION 'resume_worker computes every phase from the ones before it and reads them all; its access is not a policy choice'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(btrim(p_reason), '') = '' THEN
        RAISE EXCEPTION 'an access change needs a reason' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_action = 'grant' THEN
        INSERT INTO phase_access (phase, role) VALUES (p_phase, p_role) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM phase_access WHERE phase = p_phase AND role = p_role;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    PERFORM set_config('synchronous_commit', 'on', true);
    INSERT INTO operator_actions (action, partition_key, phase, actor, reason, detail)
    VALUES (p_action, '*', p_phase, session_user, p_reason, jsonb_build_object('role', p_role, 'changed', changed > 0));
    RETURN changed > 0;
END $$;

-- The policy and the log for the roles that may see them (definer functions: no grant on the tables).
CREATE FUNCTION ledger_access_policy() RETURNS TABLE (phase text, roles text[])
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
    SELECT o.phase, coalesce(array_agg(a.role ORDER BY a.role) FILTER (WHERE a.role IS NOT NULL), '{}')
    FROM phase_order o LEFT JOIN phase_access a USING (phase) GROUP BY o.phase, o.position ORDER BY o.position
$$;

-- The access log, for members of compliance_auditor and admin.
-- The one check that the login (session_user, which a definer call does not change) may read it.
CREATE FUNCTION ledger_require_log_reader() RETURNS void
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT (pg_has_role(session_user, 'compliance_auditor', 'MEMBER') OR pg_has_role(session_user, 'admin', 'MEMBER')) THEN
        RAISE EXCEPTION 'login % may not read the access log (compliance_auditor and admin may)', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;
CREATE FUNCTION ledger_access_log(p_role text, p_since timestamptz, p_limit integer)
    RETURNS SETOF checkpoint_access_log
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM ledger_require_log_reader();
    RETURN QUERY SELECT * FROM checkpoint_access_log l
        WHERE (p_role IS NULL OR l.role = p_role OR l.login = p_role) AND (p_since IS NULL OR l.at >= p_since)
        ORDER BY l.access_id DESC LIMIT p_limit;
END $$;
CREATE FUNCTION ledger_access_log_count(p_role text, p_since timestamptz) RETURNS bigint
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM ledger_require_log_reader();
    RETURN (SELECT count(*) FROM checkpoint_access_log l
            WHERE (p_role IS NULL OR l.role = p_role OR l.login = p_role) AND (p_since IS NULL OR l.at >= p_since));
END $$;

-- Any login may see how far the schema is (the read commands check it, and run no DDL).
GRANT SELECT ON schema_migrations TO resume_worker, ops_reader, compliance_auditor, admin;

-- ---- 4. no side channels ----------------------------------------------------------------------
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO resume_worker, ops_reader, compliance_auditor, admin',
                   current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'the ledger''s user % does not own database %: PUBLIC keeps CONNECT and TEMPORARY on it',
        current_user, current_database()
        USING HINT = format('as its owner run: REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC;'
                            ' GRANT CONNECT ON DATABASE %I TO resume_worker, ops_reader, compliance_auditor, admin',
                            current_database(), current_database());
END $$;

-- Every definer function resolves names in pg_catalog first, then the ledger's schema.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE p.prosecdef AND n.nspname IN ('public', 'ledger_read') LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, public, pg_temp', f);
    END LOOP;
END $$;

-- Functions: none for PUBLIC. The pipeline's role runs the ledger's own; readers call the read
-- functions of ledger_read (granted in 007), the policy test and the access log.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO resume_worker;
REVOKE EXECUTE ON FUNCTION ledger_change_access(text, text, text, text), ledger_retain(interval, text),
    ledger_access_log(text, timestamptz, integer), ledger_access_log_count(text, timestamptz) FROM resume_worker;
GRANT EXECUTE ON FUNCTION ledger_may_read(text, text), ledger_access_policy() TO ops_reader, compliance_auditor, admin;
GRANT EXECUTE ON FUNCTION ledger_access_log(text, timestamptz, integer), ledger_access_log_count(text, timestamptz)
    TO compliance_auditor, admin;
GRANT EXECUTE ON FUNCTION ledger_change_access(text, text, text, text), ledger_retain(interval, text) TO admin;
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
-- (Again for the login running this migration: a ledger handed over to an owner login of its own
-- after 007 ran as another user keeps granting its new tables to the pipeline.)
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO resume_worker;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO resume_worker;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT EXECUTE ON FUNCTIONS TO resume_worker;
