-- The reads of one partition in the access log (`stormlake show`), for the logins that may read
-- the log (compliance_auditor, admin), as ledger_access_log (migration 009) is.
CREATE FUNCTION ledger_access_log_of(p_partition text)
    RETURNS SETOF checkpoint_access_log
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM ledger_require_log_reader();
    RETURN QUERY SELECT * FROM checkpoint_access_log l WHERE l.partition_key = p_partition ORDER BY l.access_id;
END $$;
REVOKE EXECUTE ON FUNCTION ledger_access_log_of(text) FROM PUBLIC, resume_worker;
GRANT EXECUTE ON FUNCTION ledger_access_log_of(text) TO compliance_auditor, admin;
