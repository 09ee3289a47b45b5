"""Shared fixtures: a real PostgreSQL (the one at STORMLAKE_TEST_PG_DSN, or an embedded server
started for the session), a fresh database per test, and isolated STORMLAKE_HOME folders."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from resources.pgserver import with_database

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end tests first, each group in its usual order. They are the long ones (real
    processes, kills, the daemon): started first, they spread over pytest-xdist's workers, and the
    many short tests fill in after them, rather than one long test starting last on one worker
    while the others are done."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """A DSN with the right to create databases: the external server, or an embedded one."""
    external = os.environ.get("STORMLAKE_TEST_PG_DSN")
    if external:
        yield external
        return
    from resources.pgserver import embedded_server_dsn, stop_embedded
    from tests.consumer import passfile_dsn

    base = Path(tempfile.mkdtemp(prefix="stormlake-test-pg-"))
    try:
        yield passfile_dsn(embedded_server_dsn(base / "pg"), base / "pgpass")
    finally:
        stop_embedded(base / "pg")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A fresh, empty database for one test, dropped afterwards."""
    name = f"stormlake_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield with_database(pg_admin_dsn, name)
    from resources.ledger import Ledger

    Ledger.close_shared(lambda dsn: dsn.endswith(name) or f"dbname={name}" in dsn)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for db in (name, f"{name}_dagster", f"{name}_dagster_new"):  # the ledger's, Dagster's storage next to it
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


@pytest.fixture
def ledger(pg_dsn: str):
    from resources.ledger import Ledger

    led = Ledger(pg_dsn)
    led.migrate()
    yield led
    led.close()


@pytest.fixture(scope="session")
def sample_landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated scenario (2 regions x 2 days, 3,000 outage rows each), made once."""
    from tests.consumer import generated_landing

    return generated_landing(tmp_path_factory.mktemp("sample") / "landing", regions=2, rows_per_partition=3000,
                             seed=7)


@pytest.fixture
def sl_env(tmp_path: Path, pg_dsn: str, sample_landing: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An isolated STORMLAKE_HOME with the sample landing zone and a fresh ledger database."""
    home = tmp_path / "home"
    shutil.copytree(sample_landing, home / "landing")
    env = {
        "STORMLAKE_HOME": str(home),
        "STORMLAKE_PG_DSN": pg_dsn,
        "DAGSTER_HOME": str(home / "dagster"),
    }
    for k in ("STORMLAKE_LANDING", "STORMLAKE_LAKE", "STORMLAKE_PUBLISH_DIR", "STORMLAKE_WEBHOOK_URL",
              "STORMLAKE_FAULTS", "STORMLAKE_REGIONS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def new_dagster_db(pg_admin_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The DSN of a database for Dagster's storage, not made yet, with a DAGSTER_HOME whose
    dagster.yaml points at it; dropped afterwards, with its ``_new`` (``ensure_dagster_storage``)."""
    from pipeline.instance import dagster_yaml, sqlalchemy_url
    from resources.pgserver import drop_database

    name = f"stormlake_t_{uuid.uuid4().hex[:12]}_dagster"
    dsn = with_database(pg_admin_dsn, name)
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(sqlalchemy_url(dsn)))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    yield dsn
    for db in (name, f"{name}_new"):
        drop_database(pg_admin_dsn, db)


@pytest.fixture
def dagster_db(new_dagster_db: str, pg_admin_dsn: str) -> str:
    """A database with Dagster's storage made whole, with a DAGSTER_HOME whose dagster.yaml points at it."""
    from pipeline.instance import ensure_dagster_storage

    ensure_dagster_storage(new_dagster_db, pg_admin_dsn)
    return new_dagster_db


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory):
    """A local S3 endpoint (moto[server]) for the session; each test makes buckets of its own."""
    from tests.s3 import moto_endpoint

    with moto_endpoint(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        yield endpoint
