"""Webhook trouble (contract section 6): retried answers, 409, a refusal, a consumer that never answers.

Real ``stormlake backfill`` subprocesses deliver one partition to the test consumer
(tests/consumer.py), which is programmed per artifact kind or for every request.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.consumer import (
    KINDS,
    ONE_BACKFILL,
    ONE_KEY,
    Consumer,
    check_consumer,
    check_headers,
    check_ledger_clean,
    check_one_line_error,
    make_home,
    run,
    sql_rows,
    status,
)

pytestmark = pytest.mark.e2e

KEY, ARGS = ONE_KEY, ONE_BACKFILL


def receipts(dsn: str, target: str = "webhook") -> dict[str, tuple[str, int]]:
    """artifact id -> (status, attempts) of the target's receipts."""
    rows = sql_rows(dsn, "SELECT artifact_id, status, attempts FROM receipts WHERE target = %s", (target,))
    return {r[0]: (r[1], r[2]) for r in rows}


def failed_present_events(dsn: str) -> int:
    return sql_rows(dsn, "SELECT count(*) FROM checkpoint_events WHERE phase = 'present' AND status = 'FAILED'")[0][0]


def test_5xx_twice_then_200_is_delivered_once_under_one_key(pg_dsn: str, sample_landing: Path,
                                                               tmp_path: Path) -> None:
    with Consumer(script={kind: [500, 503, 200] for kind in KINDS}) as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)
        res = run(env, *ARGS)
        assert res.returncode == 0, str(res)
        posts = consumer.snapshot()
        assert len(posts) == 9, [p.as_dict() for p in posts]
        by_kind: dict[str, list] = {}
        for p in posts:
            check_headers(p)
            by_kind.setdefault(p.kind, []).append(p)
        for kind, ps in by_kind.items():
            assert [p.answer for p in ps] == [500, 503, 200], kind
            assert len({p.key for p in ps}) == 1, f"{kind}: retries changed the key"
            assert len({p.sha256 for p in ps}) == 1, f"{kind}: retries changed the body"
        artifacts = check_consumer(posts, partitions=[KEY])
        assert receipts(pg_dsn) == {a: ("DELIVERED", 0) for a in artifacts.values()}
        check_ledger_clean(pg_dsn)
        assert status(env)[KEY]["tier"] == 4


def test_409_counts_as_delivered(pg_dsn: str, sample_landing: Path, tmp_path: Path) -> None:
    with Consumer(default=409) as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)
        res = run(env, *ARGS)
        assert res.returncode == 0, str(res)
        posts = consumer.snapshot()
        assert sorted(p.kind for p in posts) == sorted(KINDS), [p.as_dict() for p in posts]
        artifacts = check_consumer(posts, partitions=[KEY])
        assert receipts(pg_dsn) == {a: ("DELIVERED", 0) for a in artifacts.values()}
        check_ledger_clean(pg_dsn)
        again = run(env, *ARGS)
        assert again.returncode == 0, str(again)
        assert len(consumer.snapshot()) == 3, "a re-run delivered again"


def test_400_fails_the_phase_then_a_rerun_delivers_the_pending_ones(pg_dsn: str, sample_landing: Path,
                                                                      tmp_path: Path) -> None:
    with Consumer(default=400) as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)
        res = run(env, *ARGS)
        assert res.returncode == 1, str(res)
        check_one_line_error(res.stderr, must_mention=("400", KEY))
        posts = consumer.snapshot()
        assert len(posts) == 1 and posts[0].answer == 400, "a 400 is not retried"
        rejected = posts[0].key
        st = status(env)[KEY]
        assert st["tier"] == 3 and st["phases"]["present"]["status"] == "FAILED", st
        assert "400" in st["phases"]["present"]["error"], st
        # The refused artifact stays PENDING; the partition's other receipts were prepared with
        # it, before the first delivery, and stay PENDING too, never sent.
        got = receipts(pg_dsn)
        assert got.pop(rejected) == ("PENDING", 1), "the refused artifact must stay PENDING"
        assert len(got) == len(KINDS) - 1 and set(got.values()) == {("PENDING", 0)}, got

        consumer.program(default=200)
        fixed = run(env, *ARGS)
        assert fixed.returncode == 0, str(fixed)
        later = consumer.snapshot()[1:]
        assert later[0].key == rejected, "the PENDING receipt is delivered first, under its key"
        artifacts = check_consumer(consumer.snapshot(), partitions=[KEY])
        assert rejected in artifacts.values()
        assert sorted(p.key for p in later) == sorted(artifacts.values()), "each artifact delivered exactly once"
        assert {a: s for a, (s, _) in receipts(pg_dsn).items()} == {a: "DELIVERED" for a in artifacts.values()}
        check_ledger_clean(pg_dsn)


def test_consumer_that_never_answers_is_retried_then_fails(pg_dsn: str, sample_landing: Path,
                                                           tmp_path: Path) -> None:
    tries = 3
    with Consumer(default="hang", hang_s=5.0) as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url,
                        STORMLAKE_WEBHOOK_TIMEOUT="0.5", STORMLAKE_WEBHOOK_TRIES=str(tries))
        res = run(env, *ARGS)
        assert res.returncode == 1, str(res)
        # the line names what failed (the webhook timing out), not only Dagster's retry bookkeeping
        check_one_line_error(res.stderr, must_mention=("webhook", "timed out", f"after {tries} tries"))
        posts = consumer.snapshot()
        keys = {p.key for p in posts}
        assert len(keys) == 1, "only the first artifact was tried"
        hung = keys.pop()
        # every attempt of the phase (Dagster may retry a transient failure) made exactly `tries` POSTs
        attempts = failed_present_events(pg_dsn)
        assert attempts >= 1
        assert len(posts) == tries * attempts, (len(posts), attempts)
        got = receipts(pg_dsn)  # the others prepared with it, never sent
        assert got.pop(hung) == ("PENDING", attempts)
        assert len(got) == len(KINDS) - 1 and set(got.values()) == {("PENDING", 0)}, got
        st = status(env)[KEY]
        assert st["phases"]["present"]["status"] == "FAILED" and st["tier"] == 3, st

        consumer.program(default=200)
        fixed = run(env, *ARGS)
        assert fixed.returncode == 0, str(fixed)
        later = [p for p in consumer.snapshot() if p.answer != "hang"]
        assert later[0].key == hung, "the PENDING artifact goes first, under the same key"
        artifacts = check_consumer(consumer.snapshot(), partitions=[KEY])
        assert sorted(p.key for p in later) == sorted(artifacts.values())
        check_ledger_clean(pg_dsn)
