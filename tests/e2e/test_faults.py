"""Crashes at every point of the phase protocol, and at random moments: never start over, never publish twice.

Every test runs the real ``stormlake backfill`` in a subprocess against a fresh ledger database,
a lake under ``tmp_path`` and the test consumer (tests/consumer.py) as webhook. A crash is either
a fault point (``STORMLAKE_FAULTS``, ``exit`` = ``os._exit(137)`` of the run's process, once per
point and partition of a home) or a SIGKILL of the CLI's process group. After a fault crash
Dagster finds the run failed and retries it (run retries, dagster.yaml), and the retry resumes:
the one backfill exits 0. After a kill of the CLI the same command is run again until it
succeeds. Then the consumer's record, the ledger and the lake are checked against a clean run's
(another home and database, no faults).

Every crash test has a home and a ledger of its own. The data is small (:func:`fault_landing`):
what is checked (a resume never starts over, never publishes twice) does not depend on its size,
and each run costs mostly its fixed start. The fault-point tests' databases are copies of a
ledger migrated and a Dagster storage made once a module (:func:`fresh_dsn`), what a first run
makes before its first phase; their kills all come later.

The random kills run on the embedded server of a fresh home, as a user's first backfill does:
no server is started beforehand, so a kill can land in the server's first start too. Their
moments are uniform fractions of the measured length of an uninterrupted run (see
:func:`kill_loop`), and only a kill of a run still at work counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pipeline.instance import RUN_START_TIMEOUT_S
from resources.pgserver import with_database
from tests.consumer import (
    PHASE_NAMES,
    Consumer,
    Outcome,
    check_consumer,
    check_lake_equal,
    check_ledger_clean,
    check_one_line_error,
    completed_count,
    database,
    embedded_root,
    generated_landing,
    lake_snapshot,
    ledger_dsn,
    make_home,
    python,
    reap_home,
    run,
    run_and_kill,
    run_until_ok,
    sql_rows,
    status,
    stop_servers,
)

pytestmark = pytest.mark.e2e

KEY = "2026-09-01|gulf_coast"
ONE = [KEY]
ONE_ARGS = ("backfill", "--regions", "gulf_coast", "--days", "2026-09-01..2026-09-01")
ALL = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]
ALL_ARGS = ("backfill", "--regions", "gulf_coast,pine_belt", "--days", "2026-09-01..2026-09-02")


@dataclass(frozen=True)
class Clean:
    """What a clean run (no faults) of the same partitions leaves behind."""

    lake: dict[tuple[str, str], Any]
    artifacts: dict[str, str]  # "<region>/<day>/<kind>" -> artifact id
    status: dict[str, dict[str, Any]]
    wall_s: float = 0.0  # how long the clean run took: the measure of the kill loops' moments
    noop_s: float = 0.0  # how long a second run of it took, which had nothing left to do


def _clean_run(admin_dsn: str | None, landing: Path, root: Path, args: tuple[str, ...],
               partitions: list[str]) -> Clean:
    """A run without faults; ``admin_dsn`` None: on the embedded server of a fresh home (first start included)."""
    with Consumer() as consumer, contextlib.ExitStack() as stack:
        if admin_dsn is None:
            root, dsn = stack.enter_context(embedded_root()), None
        else:
            dsn = stack.enter_context(database(admin_dsn, "stormlake_clean"))
        env = make_home(root, landing, dsn, webhook=consumer.url)
        t = time.monotonic()
        res = run(env, *args)
        wall = time.monotonic() - t
        assert res.returncode == 0, str(res)
        artifacts = check_consumer(consumer.snapshot(), partitions=partitions)
        t = time.monotonic()
        again = run(env, *args)
        noop = time.monotonic() - t
        assert again.returncode == 0 and "0 phases computed, 0 artifact deliveries" in again.stdout, str(again)
        return Clean(lake_snapshot(env, partitions), artifacts, status(env), wall, noop)


@pytest.fixture(scope="module")
def fault_landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The crash tests' scenario: the sample's regions and days, with fewer rows a partition."""
    return generated_landing(tmp_path_factory.mktemp("fault") / "landing", regions=2, rows_per_partition=600, seed=7)


@pytest.fixture(scope="module")
def template_dsn(pg_admin_dsn: str, fault_landing: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[str]:
    """A ledger database migrated and its Dagster storage database made,
    by the code a first run uses, once a module: the template of :func:`fresh_dsn`."""
    with database(pg_admin_dsn, "stormlake_tpl") as dsn:
        env = make_home(tmp_path_factory.mktemp("template"), fault_landing, dsn)
        subprocess.run([python(), "-c", "from pipeline.instance import prepare_dagster_home;"
                        " from resources.ledger import Ledger; from resources.settings import load_settings;"
                        " _, dsn = prepare_dagster_home(load_settings()); led = Ledger(dsn); led.migrate(); led.close()"],
                       env=env, check=True, timeout=120)
        yield dsn


@pytest.fixture
def fresh_dsn(pg_admin_dsn: str, template_dsn: str) -> Iterator[str]:
    """A crash test's own ledger and Dagster storage, copies of :func:`template_dsn`'s."""
    template = psycopg.conninfo.conninfo_to_dict(template_dsn)["dbname"]
    name = f"stormlake_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for db, source in ((name, template), (f"{name}_dagster", f"{template}_dagster")):
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(db), sql.Identifier(source)))
    try:
        yield with_database(pg_admin_dsn, name)
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            for db in (name, f"{name}_dagster"):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


@pytest.fixture(scope="module")
def clean_one(pg_admin_dsn: str, fault_landing: Path, tmp_path_factory: pytest.TempPathFactory) -> Clean:
    return _clean_run(pg_admin_dsn, fault_landing, tmp_path_factory.mktemp("clean_one"), ONE_ARGS, ONE)


@pytest.fixture(scope="module")
def clean_all(fault_landing: Path, tmp_path_factory: pytest.TempPathFactory) -> Clean:
    """All sample partitions on the embedded server of a fresh home, as the kill loops run them."""
    return _clean_run(None, fault_landing, tmp_path_factory.mktemp("clean_all"), ALL_ARGS, ALL)


@pytest.fixture(autouse=True)
def nothing_left_behind(tmp_path: Path) -> Iterator[None]:
    """No process of a test's homes outlives the test (a CLI killed on a timeout leaves its runs)."""
    yield
    reap_home(tmp_path, wait_s=0)


def completed_events(dsn: str) -> dict[tuple[str, str], int]:
    rows = sql_rows(dsn, "SELECT partition_key, phase, count(*) FROM checkpoint_events WHERE status = 'COMPLETED'"
                         " GROUP BY partition_key, phase")
    return {(r[0], r[1]): r[2] for r in rows}


def check_published_files(env: dict[str, str], artifacts: dict[str, str]) -> None:
    """The publish target (a folder or S3) holds exactly the bytes the consumer accepted."""
    from resources.storage import open_storage

    publish = open_storage(env.get("STORMLAKE_PUBLISH_DIR") or Path(env["STORMLAKE_HOME"]) / "published")
    for slot, artifact_id in artifacts.items():
        st = publish.stat(slot)
        assert st is not None, f"{publish.url(slot)} was not published"
        assert hashlib.sha256(publish.read(slot)).hexdigest()[:16] == artifact_id.rsplit("@", 1)[1], publish.url(slot)


def check_against_clean(env: dict[str, str], dsn: str, consumer: Consumer, clean: Clean, partitions: list[str],
                        *, crashes_in_delivery_window: int, final: dict[str, dict[str, Any]] | None = None
                        ) -> dict[str, str]:
    artifacts = check_consumer(consumer.snapshot(), partitions=partitions, max_repeats=crashes_in_delivery_window)
    assert artifacts == clean.artifacts, "the consumer got other artifacts than a clean run delivers"
    check_published_files(env, artifacts)
    check_lake_equal(env, clean.lake, partitions)
    check_ledger_clean(dsn)
    final = final if final is not None else status(env)
    for key in partitions:
        assert final[key]["tier"] == 4, final[key]
        for phase in PHASE_NAMES:
            assert final[key]["phases"][phase]["state_hash"] == clean.status[key]["phases"][phase]["state_hash"], (
                f"{phase} of {key}: another state than a clean run's")
    return artifacts


# ---- 1. the kill matrix --------------------------------------------------------------------------
DEFAULT_CASES = [
    ("ingest", "after_lease"),
    ("correlate", "mid_transform"),
    ("correlate", "after_delta_commit"),
    ("ingest", "after_checkpoint"),
    ("present", "after_pending"),
    ("present", "after_delivery"),
]
# The same kinds of points in the other phases: `make test-all` (each case is a whole backfill
# with a crash and Dagster's retry of its run).
SLOW_CASES = [
    ("correlate", "after_lease"),
    ("ingest", "mid_transform"),
    ("ingest", "after_delta_commit"),
    ("correlate", "after_checkpoint"),
    ("enrich", "after_lease"),
    ("enrich", "mid_transform"),
    ("enrich", "after_delta_commit"),
    ("enrich", "after_checkpoint"),
    ("present", "after_lease"),
    ("present", "mid_transform"),
    ("present", "after_delta_commit"),
    ("present", "after_checkpoint"),
]
# On object storage (landing, lake and published on a local S3 endpoint): a kill between the
# Delta commit and the checkpoint, and both sides of a delivery.
S3_CASES = [
    ("correlate", "after_delta_commit"),
    ("present", "after_pending"),
    ("present", "after_delivery"),
]
MATRIX = [pytest.param(ph, pt, "local", id=f"{ph}.{pt}") for ph, pt in DEFAULT_CASES] + [
    pytest.param(ph, pt, "local", id=f"{ph}.{pt}", marks=pytest.mark.slow) for ph, pt in SLOW_CASES] + [
    pytest.param(ph, pt, "s3", id=f"s3-{ph}.{pt}") for ph, pt in S3_CASES
]


def resume_timeout(clean: Clean) -> float:
    """How long a backfill whose run crashed once may take: the crashed run, Dagster's retry of it
    and the retry's run together are generously four clean runs (never less than any run's 180 s)."""
    return max(180.0, 4 * clean.wall_s)


def fault_fired(env: dict[str, str], phase: str, point: str, key: str) -> bool:
    """Whether the ``exit`` fault at ``phase.point`` killed a run process of ``key`` in this home."""
    from resources.faults import MARKERS

    return any(f.name.startswith(f"{phase}.{point}@") for f in (Path(env["STORMLAKE_HOME"]) / MARKERS).glob("*"))


def attempt_runs(dsn: str, key: str, phase: str) -> list[tuple[int, str]]:
    """(attempt, run id) of every claim of ``phase`` for ``key``, in order."""
    return [(r[0], r[1]) for r in sql_rows(
        dsn, "SELECT attempt, run_id FROM checkpoint_events WHERE partition_key = %s AND phase = %s"
             " AND status = 'PENDING' ORDER BY event_id", (key, phase))]


@pytest.mark.parametrize(("phase", "point", "where"), MATRIX)
def test_kill_at_fault_point_then_resume(phase: str, point: str, where: str, fresh_dsn: str, fault_landing: Path,
                                         tmp_path: Path, clean_one: Clean, request: pytest.FixtureRequest,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's process dies at the point (``os._exit(137)``, once); Dagster finds the run failed and
    retries it (run retries), and the retry resumes from the ledger: one backfill ends with exit 0."""
    from tests.s3 import files_on

    killed_at = PHASE_NAMES.index(phase)
    with Consumer() as consumer:
        env = make_home(tmp_path, fault_landing, fresh_dsn, webhook=consumer.url,
                        **files_on(where, request, monkeypatch, fault_landing))
        res = run(env, *ONE_ARGS, faults=f"{phase}.{point}=exit", timeout=resume_timeout(clean_one))
        assert res.returncode == 0, str(res)
        assert fault_fired(env, phase, point, KEY), f"the fault {phase}.{point} never fired\n{res}"

        final = status(env)
        after = final[KEY]["phases"]
        for name in PHASE_NAMES:
            want = 2 if (name == phase and point != "after_checkpoint") else 1
            assert after[name]["attempts"] == want, (name, after[name], str(res))
        # never started over: every phase claimed as often as it was computed, each completed once;
        # the killed attempt and its resume ran in two runs (the killed one and Dagster's retry)
        claims = attempt_runs(fresh_dsn, KEY, phase)
        if point != "after_checkpoint":
            assert [a for a, _ in claims] == [1, 2] and claims[0][1] != claims[1][1], claims
        for name in PHASE_NAMES[:killed_at]:
            assert [a for a, _ in attempt_runs(fresh_dsn, KEY, name)] == [1], name
        events = completed_events(fresh_dsn)
        assert events == {(KEY, name): 1 for name in PHASE_NAMES}, f"a phase completed more than once: {events}"
        check_against_clean(env, fresh_dsn, consumer, clean_one, ONE,
                            crashes_in_delivery_window=1 if point == "after_delivery" else 0, final=final)
        reap_home(env["STORMLAKE_HOME"], wait_s=0)


def test_injected_raise_fails_the_run_then_resumes(fresh_dsn: str, fault_landing: Path, tmp_path: Path,
                                                   clean_one: Clean) -> None:
    """The ``raise`` action: a failure, not a crash: exit 1, FAILED recorded with the error, then a resume."""
    with Consumer() as consumer:
        env = make_home(tmp_path, fault_landing, fresh_dsn, webhook=consumer.url)
        failed = run(env, *ONE_ARGS, faults="correlate.after_delta_commit=raise")
        assert failed.returncode == 1, str(failed)
        check_one_line_error(failed.stderr, must_mention=("injected fault at correlate.after_delta_commit",))
        before = status(env)[KEY]
        assert before["tier"] == 2, before
        cp = before["phases"]["correlate"]
        assert cp["status"] == "FAILED" and cp["attempts"] == 1, cp
        assert "InjectedFault" in cp["error"], cp
        assert "present" not in before["phases"], before
        assert consumer.snapshot() == [], "something was delivered although correlate failed"
        rows = sql_rows(fresh_dsn, "SELECT error_class, error_message FROM checkpoints WHERE phase = 'correlate'")
        assert rows == [("InjectedFault", f"injected fault at correlate.after_delta_commit for {KEY}")], rows

        run_until_ok(env, *ONE_ARGS)
        final = status(env)
        after = final[KEY]["phases"]
        for name in ("ingest", "enrich"):
            assert after[name] == before["phases"][name], name
        assert after["correlate"]["attempts"] == 2 and after["present"]["attempts"] == 1, after
        assert after["correlate"]["seq"] > cp["seq"], after
        # The resume recomputed correlate and present only: ingest and enrich skipped, once each,
        # in the one run of the resumed backfill.
        skips = sql_rows(fresh_dsn, "SELECT phase, run_id FROM checkpoint_events WHERE status = 'SKIPPED'"
                                 " ORDER BY event_id")
        assert sorted(phase for phase, _ in skips) == ["enrich", "ingest"], skips
        assert len({run_id for _, run_id in skips}) == 1 and skips[0][1], skips
        check_against_clean(env, fresh_dsn, consumer, clean_one, ONE, crashes_in_delivery_window=0, final=final)


def test_kill_inside_the_webhook_delivery_window(fresh_dsn: str, fault_landing: Path, tmp_path: Path,
                                                 clean_one: Clean) -> None:
    """A crash after the consumer accepted a POST but before the receipt says so: one repeat, same key,
    by Dagster's retry of the killed run.

    ``present.after_delivery`` fires after the first delivery of the loop, which is the file
    target's. To put the crash after a *webhook* delivery, a first run leaves the first artifact
    DELIVERED to the file target and PENDING for the webhook (the consumer answers 400).
    """
    with Consumer(default=400) as consumer:
        env = make_home(tmp_path, fault_landing, fresh_dsn, webhook=consumer.url)
        first = run(env, *ONE_ARGS)
        assert first.returncode == 1 and "400" in first.stderr, str(first)
        rejected = consumer.snapshot()
        assert len(rejected) == 1 and rejected[0].answer == 400, [p.as_dict() for p in rejected]
        key = rejected[0].key

        consumer.program(default=200)
        res = run(env, *ONE_ARGS, faults="present.after_delivery=exit", timeout=resume_timeout(clean_one))
        assert res.returncode == 0, str(res)  # the run died once; Dagster's retry finished it
        assert fault_fired(env, "present", "after_delivery", KEY), str(res)
        counts = consumer.keys_count()
        assert counts[key] == 3, counts  # the 400, the accepted POST before the crash, its one repeat
        assert [p.answer for p in consumer.snapshot() if p.key == key] == [400, 200, 409]
        assert all(n == 1 for k, n in counts.items() if k != key), counts
        check_against_clean(env, fresh_dsn, consumer, clean_one, ONE, crashes_in_delivery_window=1)


# ---- 2. random kills -----------------------------------------------------------------------------
def kill_loop(*, kills: int, seed: int, landing: Path, root: Path, logs: Path, clean: Clean,
              crash_server: bool = False) -> list[Outcome]:
    """Kill ``stormlake backfill`` of all sample partitions ``kills`` times, then check every home.

    Each home is fresh, with its own embedded server (under ``root``, from
    :func:`tests.consumer.embedded_root`), which the home's first run starts. A kill's moment is
    a uniform fraction of the length a run is expected to have, from the clean run's measured
    lengths: a second run with nothing to do (``noop_s``) plus the clean run's work
    (``wall_s - noop_s``) in the share of phases still to complete (after a kill of the run alone
    the ledger tells; after a server crash it is taken as all), and at least half again the
    latest moment at which a kill found that the run had completed nothing yet (a run with work
    left starts it later than one with nothing to do). A whole run of the loop on a
    fresh home (its first run, when it ended on its own) is a new measurement of a clean run,
    and the shortest of them is used: a busy machine only ever makes a run longer, and a
    window longer than the run lets it end before its kill. The moments thus follow this
    machine's speed and the work that remains. Only a kill of a run still at work counts (see
    :func:`tests.consumer.run_and_kill`); ``crash_server`` kills the home's server with the run.
    A home is done when a run ended on its own or every phase completed: then a plain backfill
    must succeed and leave what a clean run leaves (:func:`finish_home`), and the next kill
    goes to a fresh home. A kill ends the CLI and the daemon it started (which dies with it), not
    the runs already launched: they go on meanwhile, beside the next backfill of the home (the
    ledger's leases keep each phase to one attempt at a time), and are waited for before the
    home is checked.
    """
    rng = random.Random(seed)
    phases = len(ALL) * len(PHASE_NAMES)
    fulls = [clean.wall_s]  # measured lengths of whole runs on a fresh home: the clean one, then the loop's
    outcomes: list[Outcome] = []
    runs_log = logs / "runs.log"
    homes = 0
    while sum(o.killed for o in outcomes) < kills:
        homes += 1
        with Consumer() as consumer:
            env = make_home(root / f"home{homes}", landing, None, webhook=consumer.url)
            home_kills = 0
            progress = [0]  # COMPLETED phases after each run (kills of the run alone)
            stalled = 0.0  # the latest kill moment since the last progress that found nothing done
            while sum(o.killed for o in outcomes) < kills and progress[-1] < phases:
                done = sum(o.killed for o in outcomes)
                assert len(outcomes) < kills * 4, f"only {done} kills in {len(outcomes)} runs"
                i = len(outcomes)
                full = min(fulls)
                noop = clean.noop_s * full / clean.wall_s
                length = max(noop + (full - noop) * (phases - progress[-1]) / phases, 1.5 * stalled)
                delay = rng.uniform(0.0, length)
                out = run_and_kill(env, ALL_ARGS, delay=delay, log=logs / f"run-{i}.log", crash_server=crash_server)
                outcomes.append(out)
                if out.killed:
                    home_kills += 1
                    what = f"killed after {out.seconds:.2f} s" + ("" if out.server_ready else " (server not ready)")
                else:
                    text = (logs / f"run-{i}.log").read_text(errors="replace")
                    # a run that ended on its own must have succeeded, or failed for a reason worth reading
                    assert out.returncode == 0, f"run {i} exited {out.returncode}:\n{text[-4000:]}"
                    what = f"ended on its own after {out.seconds:.2f} s"
                    if home_kills == 0:  # a whole run on a fresh home: the machine's speed now
                        fulls.append(out.seconds)
                if not crash_server:  # a crashed server stays down until the next run restarts it
                    progress.append(completed_count(env))
                    stalled = max(stalled, delay) if out.killed and progress[-1] == progress[-2] else 0.0
                with runs_log.open("a") as fh:
                    fh.write(f"run {i} (home {homes}, delay {delay:.2f} of {length:.2f} s): {what}"
                             + ("" if crash_server else f"; {progress[-1]} phases COMPLETED") + "\n")
                if not out.killed:
                    break
            # never started over: a kill of the run alone never takes back a completed phase
            assert progress == sorted(progress), f"COMPLETED phases went down after a kill: {progress}"
            finish_home(env, consumer, clean, kills=home_kills, ended=not outcomes[-1].killed)
        stop_servers(root / f"home{homes}")
    return outcomes


def finish_home(env: dict[str, str], consumer: Consumer, clean: Clean, *, kills: int, ended: bool = False) -> None:
    """A plain backfill after the kills succeeds and leaves what a clean run leaves.

    The lake equals the clean run's; the consumer got the same keys, never one key with two
    bodies, and at most one repeat per kill; no checkpoint or receipt is PENDING; every phase
    of every partition completed exactly once. ``ended``: the home's last run was that plain
    backfill already (it ended on its own, with exit 0).
    """
    # A run launched just before a crash of the server can stay STARTING, holding a slot of the
    # run queue, until run monitoring fails it: the plain backfill may wait that long first.
    if not ended:
        res = run(env, *ALL_ARGS, timeout=180 + RUN_START_TIMEOUT_S)
        assert res.returncode == 0, str(res)
    # The runs a killed CLI's daemon had launched go on without it (a run is Dagster's, not the
    # CLI's): they are waited for, as long as a clean run of everything takes and as long again
    # (they can only find their phases done, or finish them), and killed if still there.
    killed = reap_home(env["STORMLAKE_HOME"], wait_s=2 * clean.wall_s)
    assert not killed, (f"processes of the home still running {2 * clean.wall_s:.0f} s after its last backfill:\n"
                        + "\n".join(killed))
    dsn = ledger_dsn(env)
    assert dsn is not None, "no embedded server runs after a successful backfill"
    final = status(env)
    check_against_clean(env, dsn, consumer, clean, ALL, crashes_in_delivery_window=kills, final=final)
    keys = {p.key for p in consumer.snapshot()}
    assert keys == set(clean.artifacts.values()), f"other keys than a clean run's: {sorted(keys)}"
    for key in ALL:
        assert set(final[key]["phases"]) == set(PHASE_NAMES)
    events = completed_events(dsn)
    assert set(events) == {(k, p) for k in ALL for p in PHASE_NAMES}, events
    assert all(n == 1 for n in events.values()), f"a phase completed twice: {events}"


#: Kills of the default loop: each killed backfill costs a daemon's start and its runs' launch
#: (a whole backfill of the sample is about a minute), so the default suite takes few of them;
#: ``test_random_kills_long`` (test-all) takes 60. Their deadlines are generous bounds of that.
RANDOM_KILLS = 5


@pytest.mark.timeout(1800)
def test_random_kills(fault_landing: Path, tmp_path: Path, clean_all: Clean) -> None:
    with embedded_root() as root:
        outcomes = kill_loop(kills=RANDOM_KILLS, seed=20260901, landing=fault_landing, root=root, logs=tmp_path,
                             clean=clean_all)
    assert sum(o.killed for o in outcomes) == RANDOM_KILLS


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_random_kills_long(fault_landing: Path, tmp_path: Path, clean_all: Clean) -> None:
    with embedded_root() as root:
        outcomes = kill_loop(kills=60, seed=7, landing=fault_landing, root=root, logs=tmp_path, clean=clean_all)
    assert sum(o.killed for o in outcomes) == 60
