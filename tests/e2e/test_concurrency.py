"""Four ``stormlake backfill --workers 2`` on the same twelve partitions at once, four Dagster
backfills on one instance (one daemon, started by whichever came first, then by the next when
it ends): each phase computed once, each artifact delivered once (leases, fencing and receipts in
the ledger)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.consumer import (
    PHASE_NAMES,
    Consumer,
    check_consumer,
    check_ledger_clean,
    generated_landing,
    kill_group,
    make_home,
    sql_rows,
    start,
    status,
)

pytestmark = pytest.mark.e2e

REGIONS = ("gulf_coast", "pine_belt", "red_hills", "piedmont")
DAYS = ("2026-09-01", "2026-09-02", "2026-09-03")
TWELVE = [f"{d}|{r}" for d in DAYS for r in REGIONS]  # more than one range run
ARGS = ("backfill", "--workers", "2", "--regions", ",".join(REGIONS), "--days", "2026-09-01..2026-09-03")


@pytest.fixture(scope="module")
def twelve_landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 regions x 3 days x 300 outage rows."""
    return generated_landing(tmp_path_factory.mktemp("twelve") / "landing", regions=4, days=3,
                             rows_per_partition=300, seed=11)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_four_backfills_at_once_compute_and_deliver_everything_once(where: str, pg_dsn: str, twelve_landing: Path,
                                                                     tmp_path: Path, request: pytest.FixtureRequest,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``s3``, the landing zone, the lake and the published files are on a local S3 endpoint:
    the Delta commits of eight processes race on conditional writes, with no lock table."""
    from tests.s3 import files_on

    with Consumer(dedupe=True) as consumer:
        env = make_home(tmp_path, twelve_landing, pg_dsn, webhook=consumer.url,
                        **files_on(where, request, monkeypatch, twelve_landing))
        procs = [start(env, *ARGS, log=tmp_path / f"backfill-{i}.log") for i in range(4)]
        try:
            codes = [p.wait(600) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    kill_group(p)
        logs = {i: (tmp_path / f"backfill-{i}.log").read_text(errors="replace") for i in range(4)}
        assert codes == [0, 0, 0, 0], "\n".join(f"--- backfill {i} exited {codes[i]}\n{logs[i][-3000:]}"
                                                for i in range(4))
        assert all(re.search(r"^backfill [a-z]{8}: 12 partitions through Dagster", log, re.M) for log in logs.values()), logs

        final = status(env)
        assert sorted(final) == sorted(TWELVE)
        for key in TWELVE:
            assert final[key]["tier"] == 4, final[key]
            for phase in PHASE_NAMES:
                cp = final[key]["phases"][phase]
                assert cp["status"] == "COMPLETED" and cp["attempts"] == 1, (key, phase, cp)
        rows = sql_rows(pg_dsn, "SELECT partition_key, phase, count(*) FROM checkpoint_events"
                                " WHERE status = 'COMPLETED' GROUP BY partition_key, phase")
        completed = {(r[0], r[1]): r[2] for r in rows}
        assert completed == {(k, p): 1 for k in TWELVE for p in PHASE_NAMES}, f"computed more than once: {completed}"
        claims = sql_rows(pg_dsn, "SELECT partition_key, phase, count(*) FROM checkpoint_events"
                                  " WHERE status = 'PENDING' GROUP BY partition_key, phase HAVING count(*) > 1")
        assert claims == [], f"phases claimed more than once: {claims}"

        posts = consumer.snapshot()
        counts = consumer.keys_count()
        assert all(n == 1 for n in counts.values()), f"keys POSTed more than once: {counts}"
        artifacts = check_consumer(posts, partitions=TWELVE)
        assert len(posts) == len(artifacts) == 3 * len(TWELVE)
        delivered = sql_rows(pg_dsn, "SELECT target, status, count(*) FROM receipts GROUP BY target, status")
        kind = "s3" if where == "s3" else "file"
        assert sorted(delivered) == sorted([(kind, "DELIVERED", 36), ("webhook", "DELIVERED", 36)]), delivered
        check_ledger_clean(pg_dsn)
