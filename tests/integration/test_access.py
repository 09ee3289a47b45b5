"""Per-phase access enforced by PostgreSQL, and the log of every read by a person (migration 007).

For every role and phase: a read through stormlake (the views on an audited ledger) and a read in
raw SQL as that database role (``SET ROLE``). A denied read fails at the database; every attempt,
allowed or denied, is in ``checkpoint_access_log``.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from assets.phases import PHASES
from pipeline.status import write_json
from resources.errors import AccessRefused, ConfigError, LedgerError
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


# ---- as real logins, over the socket and over TCP (never SET ROLE from the owner) -------------

#: The relations of the ledger a login could try, and which of them the pipeline's login may read.
PIPELINE_TABLES_REFUSED = {"phase_access", "checkpoint_access_log", "checkpoint_access_request"}


@dataclass(frozen=True)
class Login:
    name: str
    role: str  # the one group role it is a member of
    dsn: str


def _transports(admin_dsn: str) -> dict[str, dict[str, str]]:
    """How a login reaches the server: its Unix socket (when the server has one) and TCP."""
    info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    host = str(info.get("host") or "")
    out = {"tcp": {"host": "127.0.0.1", "port": str(info.get("port") or 5432)}}
    if host.startswith("/"):
        out["socket"] = {"host": host, "port": str(info.get("port") or 5432)}
    return out


def _transport_names() -> list[str]:
    """The ways the test server has (:func:`_transports`): the embedded server a socket and TCP; a
    server at ``STORMLAKE_TEST_PG_DSN`` a socket only when its DSN names a socket folder."""
    external = os.environ.get("STORMLAKE_TEST_PG_DSN")
    return sorted(_transports(external)) if external else ["socket", "tcp"]


@pytest.fixture(params=_transport_names())
def transport(request: pytest.FixtureRequest, pg_admin_dsn: str) -> dict[str, str]:
    return _transports(pg_admin_dsn)[request.param]


@pytest.fixture
def logins(published: Ledger, pg_admin_dsn: str, transport: dict[str, str]) -> Iterator[dict[str, Login]]:
    """A login for each group role (a member of that one role only) and one that belongs to none,
    each with a password, reaching the published ledger the way ``transport`` says."""
    tag = uuid.uuid4().hex[:8]
    db = psycopg.conninfo.conninfo_to_dict(published.dsn)["dbname"]
    made: dict[str, Login] = {}
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for role in [*MAY_READ, None]:
            name = f"t{tag}_{role or 'nobody'}"
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(PASSWORD)))
            if role:
                conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(name)))
            dsn = psycopg.conninfo.make_conninfo(**transport, dbname=db, user=name, password=PASSWORD)
            made[role or "nobody"] = Login(name, role or "", dsn)
    yield made
    Ledger.close_shared(lambda dsn: f"t{tag}_" in dsn)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for login in made.values():
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login.name)))


def _relations(dsn: str) -> list[tuple[str, str]]:
    """(schema, name) of every table, view and sequence of the ledger, read as the owner."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                            " WHERE n.nspname IN ('public', 'ledger_read') AND c.relkind IN ('r', 'p', 'v', 'S')"
                            " ORDER BY 1, 2").fetchall()


@pytest.mark.parametrize("role", [*MAY_READ, "nobody"])
def test_a_login_reads_no_relation_directly_but_through_a_logged_request(published: Ledger, logins: dict[str, Login],
                                                                        role: str) -> None:
    login = logins[role]
    relations = _relations(published.dsn)
    assert ("public", "checkpoints") in relations and ("ledger_read", "partitions") in relations
    if role == "nobody":  # a login of no ledger role may not even connect to the ledger's database
        with pytest.raises(psycopg.OperationalError, match="CONNECT privilege"):
            psycopg.connect(login.dsn)
        return
    with psycopg.connect(login.dsn, autocommit=True) as conn:
        for schema, name in relations:
            query = sql.SQL("SELECT * FROM {} LIMIT 1").format(sql.Identifier(schema, name))
            pipeline_may = role == PIPELINE_ROLE and schema == "public" and name not in PIPELINE_TABLES_REFUSED
            if pipeline_may or (schema, name) in {("public", "phase_order"), ("public", "schema_migrations")}:
                conn.execute(query)  # the pipeline's own tables; the phases' order and the schema version
                continue
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(query)
        # RESET ROLE is the login itself: nothing more than it had.
        conn.execute("RESET ROLE")
        if role != PIPELINE_ROLE:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM checkpoints")
        # SET ROLE only to a role it is a member of: never another group role, the owner, or a superuser.
        owner = psycopg.conninfo.conninfo_to_dict(published.dsn)["user"]
        for other in [*MAY_READ, owner, "postgres"]:
            if other == role:
                continue
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(other)))
        if role in READERS:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))  # narrowing to its own role is fine
            conn.execute("RESET ROLE")
    # Each read request a login opens is logged with the login, the role used, its address and backend.
    with psycopg.connect(login.dsn, autocommit=True) as conn:
        req = conn.execute("SELECT ledger_read.open('checkpoints')").fetchone()[0]
        pid = conn.info.backend_pid
        with conn.transaction():
            conn.execute("SELECT ledger_read.use(%s)", (req,))
            phases = {r[0] for r in conn.execute("SELECT DISTINCT phase FROM ledger_read.checkpoints")}
    assert phases == MAY_READ[role]
    with psycopg.connect(published.dsn) as conn:
        rows = conn.execute("SELECT login, role, host(client_addr), backend_pid, phase, allowed, at <= now()"
                            " FROM checkpoint_access_log WHERE request_id = %s ORDER BY access_id", (req,)).fetchall()
    tcp = not str(psycopg.conninfo.conninfo_to_dict(login.dsn)["host"]).startswith("/")
    assert rows == [(login.name, login.name, "127.0.0.1" if tcp else None, pid, p, p in MAY_READ[role], True)
                    for p in NAMES]


@pytest.mark.parametrize("role", READERS)
def test_a_request_serves_only_the_session_that_opened_it(published: Ledger, logins: dict[str, Login],
                                                          role: str) -> None:
    login = logins[role]
    with psycopg.connect(login.dsn, autocommit=True) as mine:
        req = mine.execute("SELECT ledger_read.open('partitions')").fetchone()[0]
        # The same login in another session: not its request.
        with psycopg.connect(login.dsn, autocommit=True) as again, \
                pytest.raises(psycopg.errors.InsufficientPrivilege, match="of this session"), again.transaction():
            again.execute("SELECT ledger_read.use(%s)", (req,))
        # Another login that may read more: not its request either.
        with psycopg.connect(logins["admin"].dsn, autocommit=True) as other, \
                pytest.raises(psycopg.errors.InsufficientPrivilege, match="of this session"), other.transaction():
            other.execute("SELECT ledger_read.use(%s)", (req,))
        # The same session narrowed to its role: the request was the login's, not the role's.
        mine.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege), mine.transaction():
            mine.execute("SELECT ledger_read.use(%s)", (req,))
        mine.execute("RESET ROLE")
        with mine.transaction():
            mine.execute("SELECT ledger_read.use(%s)", (req,))
            assert mine.execute("SELECT count(*) FROM ledger_read.partitions").fetchone()[0] == 1


@pytest.mark.parametrize("role", list(MAY_READ))
def test_no_login_hears_checkpoint_events_or_rewrites_the_log(published: Ledger, logins: dict[str, Login],
                                                             role: str) -> None:
    login = logins[role]
    heard: list[psycopg.Notify] = []
    with psycopg.connect(login.dsn, autocommit=True) as conn:
        conn.add_notify_handler(heard.append)
        conn.execute("LISTEN stormlake_events")  # PostgreSQL lets any login listen: the ledger says nothing
        _through(published, "2026-09-02|gulf_coast", NAMES)  # committed before the next statement below
        conn.execute("SELECT 1")  # a notification committed before this would be delivered with its answer
        assert heard == []
        for statement in ("DELETE FROM checkpoint_access_log", "UPDATE checkpoint_access_log SET allowed = true",
                          "TRUNCATE checkpoint_access_log", "DELETE FROM operator_actions",
                          "UPDATE operator_actions SET reason = 'x'", "TRUNCATE operator_actions",
                          "INSERT INTO phase_access VALUES ('ingest', 'ops_reader')",
                          "SELECT ledger_change_access('grant', 'ops_reader', 'ingest', 'x')",
                          "SELECT ledger_retain('40 days', 'x')",
                          "CREATE TABLE public.planted (x int)", "CREATE TEMP TABLE planted (x int)"):
            if role == "admin" and ("ledger_change_access" in statement or "ledger_retain" in statement):
                continue  # admin's, tried below
            with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.InvalidParameterValue)):
                conn.execute(statement)


def test_the_log_and_the_actions_are_append_only_for_the_owner_too(published: Ledger,
                                                                  logins: dict[str, Login]) -> None:
    """The owner (here a superuser, which no privilege stops) is stopped by the trigger; old rows go
    only through ledger_retain, called by a member of admin, which records itself first."""
    reader = Ledger(logins["ops_reader"].dsn, role=None, audited=True)
    try:
        LedgerViews(reader).partitions()
    finally:
        reader.close()
    published.record_action("release", KEY, actor="someone", reason="a row to try to change")
    with psycopg.connect(published.dsn, autocommit=True) as owner:
        for statement in ("DELETE FROM checkpoint_access_log", "UPDATE checkpoint_access_log SET allowed = true",
                          "TRUNCATE checkpoint_access_log", "DELETE FROM operator_actions",
                          "UPDATE operator_actions SET reason = 'x'", "TRUNCATE operator_actions"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                owner.execute(statement)
        # An old row (inserting is allowed: the log only grows), for the retention to remove.
        owner.execute("INSERT INTO checkpoint_access_log (request_id, at, role, phase, what, allowed, named)"
                      " VALUES (0, now() - interval '40 days', 'ops_reader', 'present', 'partitions', true, false)")
        n = owner.execute("SELECT count(*) FROM checkpoint_access_log").fetchone()[0]
    with psycopg.connect(logins["ops_reader"].dsn, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT ledger_retain('40 days', 'not mine')")
    admin = Ledger(logins["admin"].dsn, role=None)
    try:
        with pytest.raises(AccessRefused, match="at least 30 days"):
            admin.retain(older_than_days=1, reason="too soon")
        assert admin.retain(older_than_days=30, reason="yearly clean-up") == (1, 0)  # the release is new
        total, rows = admin.access_log()
        assert total == n - 1 and all(r.request_id != 0 for r in rows)
    finally:
        admin.close()
    with psycopg.connect(published.dsn) as owner:
        assert owner.execute("SELECT action, actor, login, reason FROM operator_actions WHERE action = 'retain'"
                             ).fetchall() == [("retain", logins["admin"].name, logins["admin"].name, "yearly clean-up")]


@pytest.mark.parametrize("role", READERS)
def test_policy_changes_need_a_member_of_admin_and_name_the_login(published: Ledger, logins: dict[str, Login],
                                                                  role: str) -> None:
    led = Ledger(logins[role].dsn, role=None)
    try:
        if role != "admin":
            with pytest.raises(AccessRefused, match="not a member of admin|permission denied for function"):
                led.change_access("grant", role, "ingest", reason="let me")
            return
        assert led.change_access("grant", "compliance_auditor", "correlate", reason="audit of the storm")
        assert led.access_policy()["correlate"] == ["admin", "compliance_auditor", "ops_reader", "resume_worker"]
    finally:
        led.close()
    with psycopg.connect(published.dsn) as owner:
        assert owner.execute("SELECT actor, login FROM operator_actions WHERE action = 'grant'").fetchall() == [
            (logins["admin"].name, logins["admin"].name)]


@pytest.mark.parametrize("role", [r for r in MAY_READ if r not in ("compliance_auditor", "admin")])
def test_the_access_log_is_read_by_auditors_and_admins_only(published: Ledger, logins: dict[str, Login],
                                                            role: str) -> None:
    led = Ledger(logins[role].dsn, role=None)
    try:
        with pytest.raises(AccessRefused, match="may not read the access log|permission denied for function"):
            led.access_log()
    finally:
        led.close()


def test_the_pipelines_login_works_as_resume_worker_and_is_nothing_more(published: Ledger,
                                                                        logins: dict[str, Login]) -> None:
    login = logins[PIPELINE_ROLE]
    pipe = Ledger(login.dsn)
    try:
        _through(pipe, "2026-09-05|gulf_coast", NAMES)
        who = pipe.read(lambda c: c.execute(
            "SELECT session_user::text, current_user::text, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls,"
            " ARRAY(SELECT b.rolname::text FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid"
            "       WHERE m.member = r.oid ORDER BY 1)"
            " FROM pg_roles r WHERE r.rolname = session_user").fetchone(), what="inspect")
        assert who == (login.name, PIPELINE_ROLE, False, False, False, False, [PIPELINE_ROLE])
        with pytest.raises(LedgerError, match="append-only|permission denied"):
            pipe.read(lambda c: c.execute("DELETE FROM operator_actions"), what="delete the actions")
    finally:
        pipe.close()


def test_nothing_of_the_ledger_is_left_to_public(published: Ledger) -> None:
    with psycopg.connect(published.dsn) as conn:
        public_functions = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname IN ('public', 'ledger_read') AND has_function_privilege('public', p.oid, 'EXECUTE')"
        ).fetchall()
        definers = conn.execute(
            "SELECT p.oid::regprocedure::text, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname IN ('public', 'ledger_read') AND p.prosecdef").fetchall()
        db = conn.execute("SELECT has_schema_privilege('public', 'public', 'CREATE'),"
                          " has_database_privilege('public', current_database(), 'CONNECT'),"
                          " has_database_privilege('public', current_database(), 'TEMPORARY')").fetchone()
    assert public_functions == []
    assert definers and all(cfg == ["search_path=pg_catalog, public, pg_temp"] for _, cfg in definers), definers
    assert db == (False, False, False)


def test_a_person_with_a_login_of_their_own_uses_the_cli(pg_dsn: str, pg_admin_dsn: str, tmp_path,  # noqa: ANN001
                                                        monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    """The owner migrates and makes a login for a person; the person reads with it, as their own role only,
    and may neither widen it nor change the policy; their reads are logged under their name."""
    import stat

    from pipeline.cli import main

    name = f"alice_{uuid.uuid4().hex[:6]}"
    home = tmp_path / "home"
    monkeypatch.setenv("STORMLAKE_HOME", str(home))
    for var in ("STORMLAKE_OWNER_DSN", "STORMLAKE_PIPELINE_DSN", "STORMLAKE_DAGSTER_DSN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("STORMLAKE_PG_DSN", pg_dsn)  # the contract's one DSN: here the owner's
    try:
        assert main(["db", "migrate"]) == 0
        assert main(["access", "add-login", name, "--role", "ops_reader"]) == 0
        out = capsys.readouterr().out
        path = home / "logins" / f"{name}.dsn"
        dsn = path.read_text().strip()
        password = psycopg.conninfo.conninfo_to_dict(dsn)["password"]
        assert str(path) in out and password not in out
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        _through(Ledger.shared(pg_dsn), KEY, NAMES)

        monkeypatch.setenv("STORMLAKE_PG_DSN", dsn)  # from here on, the person
        assert main(["status", "--json"]) == 0
        [entry] = json.loads(capsys.readouterr().out)["partitions"]
        assert set(entry["phases"]) == {"correlate", "present"}
        assert main(["status", "--role", "admin"]) == 2
        assert f"the login {name} is not a member of admin" in capsys.readouterr().err
        assert main(["access", "grant", "ops_reader", "ingest", "--reason", "let me"]) == 2
        assert main(["access", "log"]) == 2
        capsys.readouterr()
        assert main(["db", "migrate"]) == 0  # nothing to apply: no DDL tried
        assert "nothing to apply" in capsys.readouterr().out
        with psycopg.connect(pg_dsn) as conn:
            logged = conn.execute("SELECT DISTINCT login, role FROM checkpoint_access_log").fetchall()
            ddl = conn.execute("SELECT has_schema_privilege(%s, 'public', 'CREATE'),"
                               " has_database_privilege(%s, current_database(), 'CREATE')", (name, name)).fetchone()
        assert logged == [(name, name)]
        assert ddl == (False, False)
    finally:
        Ledger.close_shared(lambda d: name in d)
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
