"""Per-phase access enforced by PostgreSQL, and the log of every read by a person (migration 007).

For every role and phase: a read through stormlake (the views on an audited ledger) and a read in
raw SQL as that database role (``SET ROLE``). A denied read fails at the database; every attempt,
allowed or denied, is in ``checkpoint_access_log``.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from assets.phases import PHASES
from pipeline.status import write_json
from resources.errors import AccessRefused, ConfigError
from resources.ledger import PIPELINE_ROLE, Ledger
from resources.ledger_views import LedgerViews

KEY = "2026-09-01|gulf_coast"
NAMES = [p.name for p in PHASES]
#: The policy of the issue, as migration 007 seeds it.
MAY_READ = {
    "resume_worker": {"ingest", "enrich", "correlate", "present"},
    "ops_reader": {"correlate", "present"},
    "compliance_auditor": {"present"},
    "admin": {"ingest", "enrich", "correlate", "present"},
}
READERS = ["ops_reader", "compliance_auditor", "admin"]
PASSWORD = "a-login-password"


@pytest.fixture
def published(ledger: Ledger) -> Ledger:
    """One partition through all four phases by the pipeline's role: checkpoints, events, a
    recorded call per phase and three delivered receipts."""
    upstream: dict[str, str] = {}
    for i, name in enumerate(NAMES, start=1):
        claim = ledger.claim(partition_key=KEY, region_id="gulf_coast", day="2026-09-01", phase=name,
                             input_hash=f"h{i}", schema_version=1, code_version="1", run_id="r").claim
        assert claim is not None
        ledger.record_call(claim, call_key=f"delta_commit:{name}", kind="delta_commit", name=name,
                           input={"partition": KEY}, output={"version": i})
        if name == "present":
            for kind in ("summary.json", "clusters.geojson", "report.html"):
                rec = ledger.prepare_receipt(
                    artifact_id=f"gulf_coast/2026-09-01/{kind}@{'0' * 16}", target="file", partition_key=KEY,
                    region_id="gulf_coast", day="2026-09-01", kind=kind, content_hash="0" * 64, size_bytes=1,
                    target_ref="x", checkpoint_id=claim.id)
                ledger.mark_delivered(rec, {"ok": True})
        cp = ledger.complete(claim, state_hash=f"s{i}", tier=i, tier_label=PHASES[i - 1].tier_label, run_id="r",
                             summary={"upstream": dict(upstream), "delta_versions": {f"{name}_t": i}})
        upstream[name] = cp.state_hash or ""
    return ledger


def _log(dsn: str, request: int | None = None) -> list[tuple[str, str, str, bool]]:
    """(role, phase, what, allowed) of the access log (one request's), read as the tables' owner."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT role, phase, what, allowed FROM checkpoint_access_log"
                            " WHERE %(r)s::bigint IS NULL OR request_id = %(r)s ORDER BY access_id",
                            {"r": request}).fetchall()


def as_role(dsn: str, role: str) -> psycopg.Connection:
    """An autocommit session of the DSN's user that took on ``role`` with SET ROLE."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return conn


def test_the_roles_are_real_and_the_pipeline_is_neither_superuser_nor_owner(published: Ledger) -> None:
    def q(conn: psycopg.Connection):
        who = conn.execute("SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
                           ).fetchone()
        owners = conn.execute("SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class WHERE relname IN"
                              " ('checkpoints', 'checkpoint_events', 'recorded_calls', 'receipts')").fetchall()
        forced = conn.execute("SELECT relname FROM pg_class WHERE relrowsecurity AND relforcerowsecurity"
                              " AND relkind = 'r' ORDER BY relname").fetchall()
        roles = conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) ORDER BY rolname",
                             (list(MAY_READ),)).fetchall()
        return who, owners, forced, roles

    who, owners, forced, roles = published.read(q, what="inspect")
    assert who == (PIPELINE_ROLE, False)
    assert PIPELINE_ROLE not in {o[0] for o in owners}
    assert [r[0] for r in forced] == ["checkpoint_events", "checkpoints", "operator_actions", "partition_state",
                                      "receipts", "recorded_calls"]
    assert [r[0] for r in roles] == sorted(MAY_READ)


@pytest.mark.parametrize("phase", NAMES)
@pytest.mark.parametrize("role", sorted(MAY_READ))
def test_raw_sql_as_each_role_reads_only_its_phases_and_every_attempt_is_logged(published: Ledger, role: str,
                                                                               phase: str) -> None:
    dsn = published.dsn
    allowed = phase in MAY_READ[role]
    with as_role(dsn, role) as conn:
        # The base tables: the pipeline's role works on them; a reader holds no grant at all.
        if role == PIPELINE_ROLE:
            assert conn.execute("SELECT count(*) FROM checkpoints WHERE phase = %s", (phase,)).fetchone()[0] == 1
        else:
            for table in ("checkpoints", "checkpoint_events", "recorded_calls", "receipts", "partition_state"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
        # Through ledger_read: the request is logged (allowed or not) and committed, then read.
        for what in ("checkpoints", "events", "calls"):
            req = conn.execute("SELECT ledger_read.open(%s, %s)", (what, [phase])).fetchone()[0]
            assert _log(dsn, req) == [(role, phase, what, allowed)]
            view = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("ledger_read", what))
            if allowed:
                with conn.transaction():
                    assert conn.execute("SELECT ledger_read.use(%s)", (req,)).fetchone()[0] == what
                    assert conn.execute(view).fetchone()[0] >= 1
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"may not read the {what} of phase"), \
                        conn.transaction():
                    conn.execute("SELECT ledger_read.use(%s)", (req,))
            # Without a request named in its transaction a view gives nothing but an error.
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"no {what} read request"):
                conn.execute(view)
        # Receipts belong to present.
        req = conn.execute("SELECT ledger_read.open('receipts')").fetchone()[0]
        with conn.transaction():
            conn.execute("SELECT ledger_read.use(%s)", (req,))
            n = conn.execute("SELECT count(*) FROM ledger_read.receipts").fetchone()[0]
        assert n == (3 if "present" in MAY_READ[role] else 0)
        assert _log(dsn, req) == [(role, "present", "receipts", "present" in MAY_READ[role])]


@pytest.mark.parametrize("role", sorted(MAY_READ))
def test_a_read_in_the_transaction_that_logs_it_is_refused(published: Ledger, role: str) -> None:
    """No row is read before its log row is committed: a rollback cannot take the log back."""
    with as_role(published.dsn, role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not committed"), conn.transaction():
            req = conn.execute("SELECT ledger_read.open('checkpoints')").fetchone()[0]
            conn.execute("SELECT ledger_read.use(%s)", (req,))
        # Another role's request is not one's own.
        other = "admin" if role != "admin" else "ops_reader"
        with as_role(published.dsn, other) as them:
            theirs = them.execute("SELECT ledger_read.open('checkpoints')").fetchone()[0]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="no checkpoints read request"), \
                conn.transaction():
            conn.execute("SELECT ledger_read.use(%s)", (theirs,))


@pytest.mark.parametrize("role", sorted(MAY_READ))
def test_stormlake_reads_as_each_role_show_its_phases_and_say_what_they_could_not_see(published: Ledger,
                                                                                     role: str) -> None:
    reader = Ledger(published.dsn, role=role, audited=True)
    try:
        views = LedgerViews(reader)
        hidden = views.hidden_phases()
        assert hidden == [n for n in NAMES if n not in MAY_READ[role]]
        [row] = views.partitions()
        assert set(row.phases) == MAY_READ[role] and row.tier == 4
        assert len(row.deliveries) == (3 if "present" in MAY_READ[role] else 0)
        heads = {c.phase for c in views.phase_counts(stale_after=dt.timedelta(minutes=15))}
        assert heads == MAY_READ[role]
        assert {e.phase for e in views.recent_events(50)} == MAY_READ[role]
        buf = io.StringIO()
        write_json(reader, buf)
        [entry] = json.loads(buf.getvalue())["partitions"]
        assert set(entry["phases"]) == MAY_READ[role]
        # Each of those reads is in the log, every phase of it allowed or denied as the policy says.
        log = [r for r in _log(published.dsn) if r[0] == role]
        assert {(phase, what) for _, phase, what, _ in log} >= {(n, w) for n in NAMES
                                                                for w in ("partitions", "checkpoints", "events")}
        assert all(allowed == (phase in MAY_READ[role]) for _, phase, _, allowed in log)
    finally:
        reader.close()


def _claim(ledger: Ledger, key: str, phase: str):  # noqa: ANN202 - a Claim
    day, region = key.split("|")
    claim = ledger.claim(partition_key=key, region_id=region, day=day, phase=phase, input_hash=f"{phase}-in",
                         schema_version=1, code_version="1", run_id="r").claim
    assert claim is not None
    return claim


def _through(ledger: Ledger, key: str, phases: list[str]) -> None:
    """``phases`` of ``key`` COMPLETED in order, each on the state of the ones before."""
    upstream: dict[str, str] = {}
    for name in phases:
        cp = ledger.complete(_claim(ledger, key, name), state_hash=f"{name}-s", tier=NAMES.index(name) + 1,
                             tier_label=PHASES[NAMES.index(name)].tier_label, run_id="r",
                             summary={"upstream": dict(upstream)})
        upstream[name] = cp.state_hash or ""


@pytest.mark.parametrize("role", sorted(MAY_READ))
def test_failed_and_pending_count_only_the_phases_a_role_may_read(published: Ledger, role: str) -> None:
    """A failure or a claim in a phase a role may not read is not shown to it: not in the
    partitions' flags, the summary's counts, nor the partitions that need attention."""
    enrich_failed, correlate_pending = "2026-09-02|gulf_coast", "2026-09-03|gulf_coast"
    _through(published, enrich_failed, ["ingest"])
    assert published.fail(_claim(published, enrich_failed, "enrich"), error_class="BadInput",
                          error_message="enrich broke", run_id="r")
    _through(published, correlate_pending, ["ingest", "enrich"])
    _claim(published, correlate_pending, "correlate")
    both_failed = "2026-09-04|gulf_coast"  # ingest and correlate: which one a role is told of
    for phase in ("ingest", "correlate"):
        assert published.fail(_claim(published, both_failed, phase), error_class="BadInput",
                              error_message=f"{phase} broke", run_id="r")

    reader = Ledger(published.dsn, role=role, audited=role != PIPELINE_ROLE)
    try:
        views = LedgerViews(reader)
        rows = {r.partition_key: r for r in views.partitions()}
        sees = MAY_READ[role]
        assert (rows[enrich_failed].failed, rows[enrich_failed].pending) == ("enrich" in sees, False)
        assert (rows[correlate_pending].failed, rows[correlate_pending].pending) == (False, "correlate" in sees)
        assert not rows[KEY].failed and not rows[KEY].pending
        failing = [p for p in ("ingest", "correlate") if p in sees]
        assert rows[both_failed].failed == bool(failing) and not rows[both_failed].pending
        summary = views.summary()
        assert (summary.with_failure, summary.with_pending) == (
            int("enrich" in sees) + int(bool(failing)), int("correlate" in sees))
        total, attention, _ = views.attention(10)
        assert total == 3  # no partition is at the last tier, whatever the role sees
        held = {a.partition_key: a for a in attention}
        assert held[enrich_failed].state == ("FAILED" if "enrich" in sees else "not run")
        assert held[enrich_failed].phase == "enrich" and held[enrich_failed].also_failed == []
        assert held[correlate_pending].state == ("PENDING" if "correlate" in sees else "not run")
        # Held at the first failed phase the role may read, the others it may read listed beside.
        assert (held[both_failed].phase, held[both_failed].also_failed) == (
            (failing[0], failing[1:]) if failing else ("ingest", []))
        if not reader.audited:
            return
        with as_role(published.dsn, role) as conn:
            request = conn.execute("SELECT ledger_read.open('partitions')").fetchone()[0]
            with conn.transaction():
                conn.execute("SELECT ledger_read.use(%s)", (request,))
                [(failed_phases,)] = conn.execute("SELECT failed_phases FROM ledger_read.partitions"
                                                  " WHERE partition_key = %s", (both_failed,)).fetchall()
        assert sorted(failed_phases) == sorted(failing)
    finally:
        reader.close()


def test_grant_and_revoke_change_the_policy_and_are_recorded(published: Ledger) -> None:
    owner = Ledger(published.dsn, role=None)
    reader = Ledger(published.dsn, role="ops_reader", audited=True)
    login = psycopg.conninfo.conninfo_to_dict(published.dsn)["user"]
    try:
        assert owner.change_access("grant", "ops_reader", "enrich", reason="incident review")
        assert set(LedgerViews(reader).partitions()[0].phases) == {"enrich", "correlate", "present"}
        assert not owner.change_access("grant", "ops_reader", "enrich", reason="twice")
        assert owner.change_access("revoke", "ops_reader", "enrich", reason="review over")
        assert set(LedgerViews(reader).partitions()[0].phases) == {"correlate", "present"}
        assert owner.access_policy()["enrich"] == ["admin", "resume_worker"]
        with psycopg.connect(published.dsn) as conn:
            actions = conn.execute("SELECT action, phase, actor, login, reason, detail->>'role' FROM operator_actions"
                                   " ORDER BY action_id").fetchall()
        assert actions == [("grant", "enrich", login, login, "incident review", "ops_reader"),
                           ("grant", "enrich", login, login, "twice", "ops_reader"),
                           ("revoke", "enrich", login, login, "review over", "ops_reader")]
        with pytest.raises(AccessRefused, match="no database role"):
            owner.change_access("grant", f"nobody_{uuid.uuid4().hex[:6]}", "enrich", reason="y")
        with pytest.raises(AccessRefused, match="resume_worker computes every phase"):
            owner.change_access("revoke", PIPELINE_ROLE, "ingest", reason="y")
        total, rows = owner.access_log(role="ops_reader")
        assert total == len(rows) > 0 and {r.role for r in rows} == {"ops_reader"}
    finally:
        owner.close()
        reader.close()


@pytest.fixture
def limited_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A database owned by a login role that may not create roles nor take on the ledger's roles."""
    user, db = f"stormlake_lim_{uuid.uuid4().hex[:8]}", f"stormlake_lim_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(user), sql.Literal(PASSWORD)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db), sql.Identifier(user)))
    yield psycopg.conninfo.make_conninfo(pg_admin_dsn, user=user, dbname=db, password=PASSWORD)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(user)))


def test_a_user_that_may_not_create_roles_is_told_what_to_grant(published: Ledger, limited_dsn: str) -> None:
    led = Ledger(limited_dsn, role=None)
    try:
        with pytest.raises(ConfigError) as err:
            led.migrate()
    finally:
        led.close()
    message = str(err.value)
    user = psycopg.conninfo.conninfo_to_dict(limited_dsn)["user"]
    assert "007_access.sql" in message and user in message and "GRANT" in message, message
    assert "\n" not in message
