-- The reads of one partition in the access log (`stormlake show`), for the logins that may read
-- the log (compliance_auditor, admin), as ledger_access_log (migration 009) is.
CREATE FUNCTION ledger_access_log_of(p_partition text)
    RETURNS SETOF checkpoint_access_log
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT (pg_has_role(session_user, 'compliance_auditor', 'MEMBER') OR pg_has_role(session_user, 'admin', 'MEMBER')) THEN
        RAISE EXCEPTION 'login % may not read the access log (compliance_auditor and admin may)', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT * FROM checkpoint_access_log l WHERE l.partition_key = p_partition ORDER BY l.access_id;
END $$;
REVOKE EXECUTE ON FUNCTION ledger_access_log_of(text) FROM PUBLIC, resume_worker;
GRANT EXECUTE ON FUNCTION ledger_access_log_of(text) TO compliance_auditor, admin;
