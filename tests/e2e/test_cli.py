"""The ``stormlake`` command line as a user runs it: real subprocesses, a controlled environment."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resources.landing import utc_today
from resources.pgserver import with_database
from resources.publisher import ARTIFACT_KINDS

pytestmark = pytest.mark.e2e

STORMLAKE = Path(sys.executable).parent / "stormlake"
PHASE_NAMES = ("ingest", "enrich", "correlate", "present")
TIER_LABELS = {0: "not_started", 1: "ingested", 2: "enriched", 3: "correlated", 4: "published"}
DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
REGION_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
HEX_RE = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A STORMLAKE_HOME for the embedded server, outside pytest's basetemp.

    The embedded server runs as another OS user when the tests run as root, and every new pytest
    session (of anyone) resets /tmp/pytest-of-<user> to mode 0700, which would lock that user
    out of a data directory below it.
    """
    base = Path(tempfile.mkdtemp(prefix="stormlake-e2e-"))
    yield base / "home"
    shutil.rmtree(base, ignore_errors=True)


def base_env(home: Path, **extra: str) -> dict[str, str]:
    """The parent's environment without any stormlake or Dagster setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STORMLAKE_") and k not in ("DAGSTER_HOME", "PYTEST_CURRENT_TEST")}
    env["STORMLAKE_HOME"] = str(home)
    env.update(extra)
    return env


def stormlake(*args: str, env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(STORMLAKE), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def stderr_digest(proc: subprocess.CompletedProcess) -> str:
    """The distinct lines of stderr (a failing run can repeat one error many times)."""
    seen: list[str] = []
    for ln in err_lines(proc):
        if ln not in seen:
            seen.append(ln)
    return "\n".join(seen)[-4000:]


def err_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


def status_json(env: dict[str, str], cwd: Path) -> dict[str, Any]:
    proc = stormlake("status", "--json", "--role", "admin", env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate_status(doc)
    return doc


def validate_status(doc: Any) -> None:
    """The shape of contract section 8, and its optional extensions that say which days are open."""
    assert isinstance(doc, dict) and set(doc) == {"partitions", "open_days"}, doc
    assert isinstance(doc["partitions"], list)
    assert isinstance(doc["open_days"], list) and all(DAY_RE.match(d) for d in doc["open_days"]), doc["open_days"]
    for p in doc["partitions"]:
        assert p["open"] is (p["day"] in doc["open_days"]), p
        assert isinstance(p["revisions"], int) and p["revisions"] >= 0, p
        assert {"region", "day", "tier", "tier_label", "phases", "deliveries"} <= set(p), p
        assert REGION_RE.match(p["region"]) and DAY_RE.match(p["day"]), p
        assert isinstance(p["tier"], int) and p["tier"] in TIER_LABELS
        assert p["tier_label"] == ("held_for_review" if p.get("held") else TIER_LABELS[p["tier"]])
        assert isinstance(p["phases"], dict) and set(p["phases"]) <= set(PHASE_NAMES)
        for name, ph in p["phases"].items():
            assert ph["status"] in ("PENDING", "COMPLETED", "FAILED", "SKIPPED"), (name, ph)
            assert isinstance(ph["seq"], int) and isinstance(ph["attempts"], int) and ph["attempts"] >= 1
            assert isinstance(ph["input_hash"], str) and ph["input_hash"]
            assert isinstance(ph["schema_version"], int)
            assert isinstance(ph["delta_versions"], dict)
            assert all(isinstance(k, str) and isinstance(v, int) for k, v in ph["delta_versions"].items())
            if ph["status"] == "COMPLETED":
                assert isinstance(ph["state_hash"], str) and ph["state_hash"]
        assert isinstance(p["deliveries"], list)
        for d in p["deliveries"]:
            assert {"artifact_id", "target", "status", "content_hash"} <= set(d), d
            assert d["status"] in ("PENDING", "DELIVERED")
            m = re.match(r"^([a-z][a-z0-9_]*)/(\d{4}-\d{2}-\d{2})/([a-z.]+)@([0-9a-f]{16})$", d["artifact_id"])
            assert m, d["artifact_id"]
            assert (m.group(1), m.group(2)) == (p["region"], p["day"]) and m.group(3) in ARTIFACT_KINDS
            assert HEX_RE.match(d["content_hash"]) and d["content_hash"][:16] == m.group(4)


def published_state(home: Path) -> dict[str, tuple[int, bytes]]:
    root = home / "published"
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def landing_partitions(home: Path) -> set[tuple[str, str]]:
    root = home / "landing"
    return {(d.name, r.name) for r in root.iterdir() if r.is_dir() and REGION_RE.match(r.name) and r.name != "reference"
            for d in r.iterdir() if d.is_dir() and DAY_RE.match(d.name)}


def check_demo_twice(env: dict[str, str], home: Path, cwd: Path) -> dict[str, Any]:
    first = stormlake("demo", env=env, cwd=cwd)
    assert first.returncode == 0, stderr_digest(first)
    assert "Traceback" not in first.stderr
    parts = landing_partitions(home)
    assert parts, "demo wrote no landing partitions"

    doc = status_json(env, cwd)
    by_key = {(p["day"], p["region"]): p for p in doc["partitions"]}
    assert set(by_key) == parts
    for key, p in by_key.items():
        assert p["tier"] == 4 and p["tier_label"] == "published", (key, p["tier"], p["phases"])
        assert set(p["phases"]) == set(PHASE_NAMES)
        assert all(ph["status"] == "COMPLETED" and ph["attempts"] == 1 for ph in p["phases"].values()), key
        assert sorted(d["artifact_id"].split("/")[2].split("@")[0] for d in p["deliveries"]) == sorted(ARTIFACT_KINDS)
        for d in p["deliveries"]:
            assert d["status"] == "DELIVERED" and d["target"] == "file"
            kind = d["artifact_id"].split("/")[2].split("@")[0]
            data = (home / "published" / key[1] / key[0] / kind).read_bytes()
            assert hashlib.sha256(data).hexdigest() == d["content_hash"], d
    files = published_state(home)
    assert len(files) == len(parts) * len(ARTIFACT_KINDS), sorted(files)

    second = stormlake("demo", env=env, cwd=cwd)
    assert second.returncode == 0, stderr_digest(second)
    assert "nothing to do" in second.stdout, second.stdout
    after = status_json(env, cwd)
    assert after == doc, "the second demo changed the ledger's view (attempts, seqs or deliveries)"
    assert published_state(home) == files
    check_status_table(env, cwd, doc)
    return doc


def check_status_table(env: dict[str, str], cwd: Path, doc: dict[str, Any]) -> None:
    """`stormlake status`: a header, one row per partition with its tier and phases, a total line."""
    table = stormlake("status", env=env, cwd=cwd)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["day", "region", "tier"] and all(p in lines[0] for p in PHASE_NAMES)
    for p in doc["partitions"]:
        row = [ln for ln in lines if ln.startswith(p["day"]) and f" {p['region']} " in ln]
        assert len(row) == 1, (p["day"], p["region"], lines)
        label = f"{p['tier']} {p['tier_label']}"
        assert label in row[0], row[0]
        delivered = sum(d["status"] == "DELIVERED" for d in p["deliveries"])
        assert row[0].split()[-1] == str(delivered), row[0]
    n = len(doc["partitions"])
    published = sum(p["tier"] == 4 for p in doc["partitions"])
    assert lines[-1] == f"{n} partitions; {published} published"


def test_demo_twice_on_the_embedded_server(tmp_path: Path, embedded_home: Path) -> None:
    home = embedded_home
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = base_env(home)
    assert "STORMLAKE_PG_DSN" not in env and "STORMLAKE_TEST_PG_DSN" not in env
    try:
        check_demo_twice(env, home, cwd)
        assert (home / "pg").is_dir() and (home / "pg" / "PG_VERSION").exists()
        assert (home / "dagster" / "dagster.yaml").exists()
        assert not (cwd / ".stormlake").exists()
    finally:
        stop = stormlake("db", "stop", env=env, cwd=cwd, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert not (home / "pg" / "postmaster.pid").exists(), "the embedded server is still running"


def test_status_of_an_empty_ledger(tmp_path: Path, pg_dsn: str) -> None:
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=pg_dsn)
    # A read command runs no DDL: on a ledger nobody migrated yet it says who must, then reads.
    assert_one_line_error(stormlake("status", env=env, cwd=tmp_path), 2, "stormlake db migrate")
    migrate = stormlake("db", "migrate", env=env, cwd=tmp_path)
    assert migrate.returncode == 0 and "schema is at version" in migrate.stdout, migrate.stderr
    assert status_json(env, tmp_path) == {"partitions": [], "open_days": [utc_today()]}
    proc = stormlake("status", env=env, cwd=tmp_path)
    assert proc.returncode == 0 and "no partitions" in proc.stdout


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = err_lines(proc)
    assert len(lines) == 1, lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_unknown_region_is_a_usage_error(tmp_path: Path, pg_dsn: str) -> None:
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=pg_dsn)
    assert_one_line_error(stormlake("backfill", "--regions", "nope", env=env, cwd=tmp_path), 2, "nope")


@pytest.mark.parametrize(("args", "needle"), [
    (("bench", "--partitions", "0"), "--partitions 0"),
    (("bench", "--workers", "--repeat", "0"), "--repeat 0"),
    (("bench", "--ui", "--rows-per-partition", "-1"), "--rows-per-partition -1"),
    (("generate", "--seed", "-1"), "--seed -1"),
    (("access", "log", "--limit", "-1"), "--limit -1"),
    (("prune", "--older-than", "99999999999"), "--older-than 99999999999"),
    (("release", "2026-13-01|gulf_coast", "--reason", "x"), "not a partition key"),
    (("release", "2025-01-01|gulf_coast", "--reason", "x"), "STORMLAKE_FIRST_DAY"),
], ids=["bench-no-partitions", "bench-no-turns", "bench-negative-rows", "generate-negative-seed",
        "access-log-negative-limit", "prune-beyond-the-calendar", "release-no-such-day", "release-before-the-first-day"])
def test_a_number_argument_out_of_range_is_a_usage_error_before_any_work(tmp_path: Path, pg_dsn: str,
                                                                         args: tuple[str, ...], needle: str) -> None:
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=pg_dsn)
    assert_one_line_error(stormlake(*args, env=env, cwd=tmp_path), 2, needle)
    assert not (tmp_path / "home" / "bench").exists() and not (tmp_path / "home" / "landing").exists()


def test_a_path_that_cannot_be_used_is_a_usage_error_naming_it(tmp_path: Path, pg_dsn: str) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    env = base_env(a_file, STORMLAKE_PG_DSN=pg_dsn)  # STORMLAKE_HOME is a file
    assert_one_line_error(stormlake("backfill", env=env, cwd=tmp_path), 2, f"{a_file}/")
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=pg_dsn)
    assert_one_line_error(stormlake("report", "--role", "admin", "--out", str(tmp_path), env=env, cwd=tmp_path), 2,
                          f"--out {tmp_path}: is a folder")


def test_a_landing_zone_that_is_not_there_is_a_usage_error_naming_it(tmp_path: Path, pg_dsn: str) -> None:
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=pg_dsn, STORMLAKE_LANDING=str(tmp_path / "nowhere"))
    assert_one_line_error(stormlake("backfill", env=env, cwd=tmp_path), 2, f"{tmp_path / 'nowhere'} is not a folder")


def test_a_dsn_naming_a_database_that_does_not_exist_says_so_and_names_the_setting(tmp_path: Path, pg_dsn: str) -> None:
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=with_database(pg_dsn, "stormlake_no_such_database"))
    assert_one_line_error(stormlake("status", env=env, cwd=tmp_path), 1, "stormlake_no_such_database",
                          "does not exist", "check STORMLAKE_PG_DSN")


def test_bad_days_is_a_usage_error(tmp_path: Path, pg_dsn: str) -> None:
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=pg_dsn)
    assert_one_line_error(stormlake("backfill", "--days", "2026-13-01..x", env=env, cwd=tmp_path), 2, "--days")


def test_invalid_region_file_names_file_and_line(tmp_path: Path, pg_dsn: str) -> None:
    regions = tmp_path / "my-regions.csv"
    regions.write_text("region_id,name,min_lat,max_lat,min_lon,max_lon\n"
                       "gulf_coast,Gulf Coast,29.20,30.20,-90.60,-89.40\n"
                       "Bad-Region,Bad,30.40,31.40,-89.60,-88.40\n", encoding="utf-8")
    env = base_env(tmp_path / "home", STORMLAKE_PG_DSN=pg_dsn, STORMLAKE_REGIONS=str(regions))
    for args in (("backfill",), ("demo",)):
        line = assert_one_line_error(stormlake(*args, env=env, cwd=tmp_path), 2, str(regions))
        assert re.search(re.escape(str(regions)) + r":3\b", line), line
        assert "Bad-Region" in line


def test_unreadable_landing_file_fails_backfill_naming_the_file(tmp_path: Path, sample_landing: Path,
                                                                 embedded_home: Path) -> None:
    home = embedded_home
    shutil.copytree(sample_landing, home / "landing")
    bad = home / "landing" / "gulf_coast" / "2026-09-01" / "weather.csv"
    data = bad.read_bytes()
    cut = data.index(b"\n") + 1
    bad.write_bytes(data[:cut] + b"\xff\xfe\xfd,broken\n" + data[cut:])
    env = base_env(home)  # embedded server (see test_demo_against_an_external_server for the DSN path)
    try:
        _check_unreadable(env, home, tmp_path)
    finally:
        stop = stormlake("db", "stop", env=env, cwd=tmp_path, timeout=120)
    assert stop.returncode == 0, stop.stderr


def test_a_dead_lettered_partition_is_reported_failed_not_succeeded(tmp_path: Path, sample_landing: Path,
                                                                    pg_dsn: str) -> None:
    """A partition whose phase is dead-lettered makes no attempt in the next backfill, and that
    backfill says so: the phase FAIL, the partition failed with the dead letter's one line (what
    to run), exit 1. The run itself ends without a failure, so the CLI reads the phase's grader."""
    home = tmp_path / "home"
    shutil.copytree(sample_landing, home / "landing")
    bad = home / "landing" / "gulf_coast" / "2026-09-01" / "weather.csv"
    data = bad.read_bytes()
    cut = data.index(b"\n") + 1
    bad.write_bytes(data[:cut] + b"\xff\xfe\xfd,broken\n" + data[cut:])
    env = base_env(home, STORMLAKE_PG_DSN=pg_dsn, STORMLAKE_DEAD_LETTER_AFTER="1")
    first = stormlake("backfill", "--regions", "gulf_coast", "--days", "2026-09-01", env=env, cwd=tmp_path)
    assert first.returncode == 1 and "weather.csv" in first.stderr, (first.stdout, first.stderr)
    again = stormlake("backfill", "--regions", "gulf_coast", "--days", "2026-09-01", env=env, cwd=tmp_path)
    assert again.returncode == 1, (again.stdout, again.stderr)
    assert "Traceback" not in again.stderr and "Traceback" not in again.stdout
    assert "0/1 partitions succeeded" in again.stdout, again.stdout
    assert "ingest:FAIL" in again.stderr + again.stdout
    [error] = [ln for ln in err_lines(again) if ln.startswith("stormlake:")]
    assert "dead-lettered after 1 failures" in error and "weather.csv" in error and "stormlake release" in error, error
    doc = status_json(env, tmp_path)
    [entry] = doc["partitions"]
    assert entry["dead_lettered"] == ["ingest"] and entry["phases"]["ingest"]["failures"] == 1  # no attempt made again


def _check_unreadable(env: dict[str, str], home: Path, tmp_path: Path) -> None:
    proc = stormlake("backfill", "--regions", "gulf_coast,pine_belt", "--days", "2026-09-01", env=env, cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    errors = [ln for ln in err_lines(proc) if ln.startswith("stormlake:")]
    assert len(errors) == 1, proc.stderr
    assert "gulf_coast/2026-09-01/weather.csv" in errors[0] and "UTF-8" in errors[0], errors[0]
    assert "1/2 partitions succeeded" in proc.stdout, proc.stdout

    doc = status_json(env, tmp_path)
    by_key = {(p["day"], p["region"]): p for p in doc["partitions"]}
    assert by_key[("2026-09-01", "pine_belt")]["tier"] == 4
    failed = by_key[("2026-09-01", "gulf_coast")]
    assert failed["tier"] == 0 and set(failed["phases"]) == {"ingest"}
    assert failed["phases"]["ingest"]["status"] == "FAILED"
    assert "weather.csv" in failed["phases"]["ingest"].get("error", "")
    assert not (home / "published" / "gulf_coast").exists()


def test_a_bad_partition_of_a_range_run_fails_alone_and_the_others_finish(tmp_path: Path, pg_dsn: str) -> None:
    """Nine small partitions, in key range runs cut by Dagster. One of them has an unreadable
    file: its ingest fails, and that partition alone is reported failed, with its own error; the
    eight others are published (their later phases continued within the same command)."""
    from tests.consumer import generated_landing

    home = tmp_path / "home"
    generated_landing(home / "landing", regions=3, rows_per_partition=200, seed=3, days=3)
    bad = home / "landing" / "gulf_coast" / "2026-09-01" / "weather.csv"
    data = bad.read_bytes()
    cut = data.index(b"\n") + 1
    bad.write_bytes(data[:cut] + b"\xff\xfe\xfd,broken\n" + data[cut:])
    env = base_env(home, STORMLAKE_PG_DSN=pg_dsn, STORMLAKE_WORKERS="1")
    proc = stormlake("backfill", env=env, cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "8/9 partitions succeeded" in proc.stdout, (proc.stdout, proc.stderr)
    errors = [ln for ln in err_lines(proc) if ln.startswith("stormlake:")]
    assert len(errors) == 1 and "gulf_coast/2026-09-01/weather.csv" in errors[0], proc.stderr

    doc = status_json(env, tmp_path)
    tiers = {(p["day"], p["region"]): p["tier"] for p in doc["partitions"]}
    assert tiers.pop(("2026-09-01", "gulf_coast")) == 0
    assert sorted(tiers.values()) == [4] * 8, tiers


# Last in the file: with ``-x`` a failure here does not hide the other CLI tests.
def test_demo_against_an_external_server(tmp_path: Path, pg_dsn: str) -> None:
    home = tmp_path / "home"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = base_env(home, STORMLAKE_PG_DSN=pg_dsn)
    check_demo_twice(env, home, cwd)
    assert not (home / "pg").exists(), "an embedded server was started although STORMLAKE_PG_DSN is set"


def test_backfill_from_a_phase_recomputes_it_and_the_later_ones_and_delivers_nothing_new(
        tmp_path: Path, sample_landing: Path, pg_dsn: str) -> None:
    home = tmp_path / "home"
    shutil.copytree(sample_landing, home / "landing")
    env = base_env(home, STORMLAKE_PG_DSN=pg_dsn, STORMLAKE_OPERATOR="ops-on-call")
    args = ("backfill", "--regions", "gulf_coast", "--days", "2026-09-01")
    assert stormlake(*args, env=env, cwd=tmp_path).returncode == 0
    files = published_state(home)

    assert_one_line_error(stormlake(*args, "--from", "correlate", env=env, cwd=tmp_path), 2, "--reason")
    forced = stormlake(*args, "--from", "correlate", "--reason", "review of the cluster rule", env=env, cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "1/1 partitions succeeded; 2 phases computed, 0 artifact deliveries" in forced.stdout, forced.stdout
    assert "ingest:skip enrich:skip correlate:done present:done" in forced.stderr, forced.stderr
    assert published_state(home) == files  # the same bytes: nothing published again
    rows = [r for r in status_json(env, tmp_path)["partitions"] if (r["day"], r["region"]) == ("2026-09-01", "gulf_coast")]
    assert rows and rows[0]["tier"] == 4
    # The rerun is decided by the ledger alone (no backfill): the process never imports Dagster, the code
    # location or the phases' libraries (PYTHONPROFILEIMPORTTIME lists every import on stderr).
    again = stormlake(*args, env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, cwd=tmp_path)
    assert "0 phases computed, 0 artifact deliveries" in again.stdout, again.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time:")}
    assert "assets.runner" in imported, sorted(imported)[:20]
    assert not imported & {"dagster", "pipeline.definitions", "matplotlib"}, sorted(imported)
