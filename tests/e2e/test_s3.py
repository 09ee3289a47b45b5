"""Landing zone, lake and published artifacts on object storage (a local S3 endpoint, moto[server]).

The A->B->A revision test runs on S3 too (tests/e2e/test_revisions.py, parameter ``s3``).
"""

from __future__ import annotations

import glob
import hashlib
import sysconfig
from pathlib import Path

import pytest

from tests.consumer import check_ledger_clean, check_one_line_error, make_home, run, status
from tests.s3 import Endpoint, files_on, s3_settings

pytestmark = pytest.mark.e2e

ALL = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]


def duckdb_connection(endpoint: Endpoint):  # -> duckdb.DuckDBPyConnection
    """DuckDB with its httpfs and delta extensions loaded from their wheels (offline) and the
    endpoint's credentials as an S3 secret: a reader that shares no code with stormlake's."""
    import duckdb

    con = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false",
                                 "autoload_known_extensions": "false"})
    site = sysconfig.get_paths()["purelib"]
    for ext in ("httpfs", "delta"):
        found = glob.glob(f"{site}/duckdb_extension_{ext}/extensions/*/{ext}.duckdb_extension")
        assert found, f"the duckdb-extension-{ext} wheel is not installed"
        con.execute(f"LOAD '{found[0]}'")
    host = endpoint.url.removeprefix("http://")
    con.execute(f"CREATE SECRET endpoint (TYPE S3, KEY_ID '{endpoint.access_key_id}',"
                f" SECRET '{endpoint.secret_access_key}', REGION 'us-east-1', ENDPOINT '{host}',"
                " URL_STYLE 'path', USE_SSL false)")
    return con


def test_a_backfill_on_s3_publishes_once_and_duckdb_reads_every_table(
        pg_dsn: str, sample_landing: Path, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch, s3_endpoint: Endpoint) -> None:
    from assets.schemas import SCHEMAS
    from tests.helpers import lake

    env = make_home(tmp_path, sample_landing, pg_dsn, **files_on("s3", request, monkeypatch, sample_landing))
    home = Path(env["STORMLAKE_HOME"])
    first = run(env, "backfill")
    assert first.returncode == 0, str(first)
    assert env["AWS_SECRET_ACCESS_KEY"] not in first.stdout + first.stderr
    assert not (home / "lake").exists() and not (home / "published").exists(), "something was written locally"

    # Every artifact is one object under the publish prefix, its receipt names the target "s3".
    before = status(env)
    published = s3_endpoint.keys(env["STORMLAKE_PUBLISH_DIR"])
    delivered = [d for key in ALL for d in before[key]["deliveries"]]
    assert delivered and {d["target"] for d in delivered} == {"s3"}, delivered
    assert {d["status"] for d in delivered} == {"DELIVERED"}
    for d in delivered:
        slot = d["artifact_id"].split("@")[0]
        assert hashlib.sha256(published[slot]).hexdigest()[:16] == d["artifact_id"].rsplit("@", 1)[1], slot
    assert len(published) == len(delivered)

    # A re-run computes and delivers nothing; the objects are as they were.
    second = run(env, "backfill")
    assert second.returncode == 0, str(second)
    assert status(env) == before
    assert s3_endpoint.keys(env["STORMLAKE_PUBLISH_DIR"]) == published
    check_ledger_clean(pg_dsn)

    # An independent reader: DuckDB's delta extension reads every table from S3 and finds the
    # rows stormlake's own reader finds, partition by partition.
    con = duckdb_connection(s3_endpoint)
    lk = lake(env["STORMLAKE_LAKE"])
    for table in SCHEMAS:
        uri = lk.uri(table)
        got = dict(((day, region), n) for day, region, n in con.execute(
            f"SELECT day, region_id, count(*) FROM delta_scan('{uri}') GROUP BY ALL").fetchall())
        version = lk.table(table).version()
        want = {}
        for key in ALL:
            day, region = key.split("|")
            n = lk.read_partition(table, region, day, version=version).num_rows
            if n:
                want[(day, region)] = n
        assert got == want, f"{table}: DuckDB reads {got}, stormlake {want}"
        columns = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM delta_scan('{uri}')").fetchall()]
        assert set(columns) == set(SCHEMAS[table].names), (table, columns)


def test_a_missing_bucket_or_a_wrong_secret_is_one_line_naming_the_url(
        pg_dsn: str, sample_landing: Path, tmp_path: Path, s3_endpoint: Endpoint) -> None:
    bucket = s3_endpoint.new_bucket()
    settings = s3_settings(s3_endpoint, bucket)
    s3_endpoint.upload(sample_landing, settings["STORMLAKE_LANDING"])

    missing = make_home(tmp_path / "missing", sample_landing, pg_dsn,
                        **{**settings, "STORMLAKE_LANDING": "s3://no-such-bucket-here/landing"})
    out = run(missing, "backfill")
    assert out.returncode != 0
    line = check_one_line_error(out.stderr, must_mention=("s3://no-such-bucket-here/landing", "no such bucket"))
    assert s3_endpoint.secret_access_key not in out.stdout + out.stderr, line

    wrong = "WRONG-" + s3_endpoint.secret_access_key[6:]
    refused = make_home(tmp_path / "wrong", sample_landing, pg_dsn, **{**settings, "AWS_SECRET_ACCESS_KEY": wrong})
    out = run(refused, "backfill")
    assert out.returncode != 0
    line = check_one_line_error(out.stderr, must_mention=(f"s3://{bucket}/landing", "AWS_SECRET_ACCESS_KEY"))
    assert wrong not in out.stdout + out.stderr and s3_endpoint.secret_access_key not in out.stderr, line
    assert s3_endpoint.keys(f"s3://{bucket}/lake") == {}, "a refused login wrote something"


def test_a_missing_landing_key_fails_its_partition_naming_the_url_and_loses_nothing(
        pg_dsn: str, sample_landing: Path, tmp_path: Path, s3_endpoint: Endpoint) -> None:
    bucket = s3_endpoint.new_bucket()
    settings = s3_settings(s3_endpoint, bucket)
    s3_endpoint.upload(sample_landing, settings["STORMLAKE_LANDING"])
    gone = "landing/pine_belt/2026-09-02/weather.csv"
    kept = s3_endpoint.client().get_object(Bucket=bucket, Key=gone)["Body"].read()
    s3_endpoint.client().delete_object(Bucket=bucket, Key=gone)
    env = make_home(tmp_path, sample_landing, pg_dsn, **settings)

    out = run(env, "backfill")
    assert out.returncode == 1, str(out)
    check_one_line_error(out.stderr, must_mention=(f"s3://{bucket}/{gone}", "not found"), max_lines=2)
    st = status(env)
    assert all(st[k]["phases"]["present"]["status"] == "COMPLETED" for k in ALL if k != "2026-09-02|pine_belt"), st

    # The file arrives: the same command finishes the partition, and the others deliver nothing again.
    s3_endpoint.client().put_object(Bucket=bucket, Key=gone, Body=kept)
    again = run(env, "backfill")
    assert again.returncode == 0, str(again)
    after = status(env)
    assert after["2026-09-02|pine_belt"]["phases"]["present"]["status"] == "COMPLETED"
    for key in ALL[:3]:
        assert after[key]["deliveries"] == st[key]["deliveries"], key
    check_ledger_clean(pg_dsn)


def landing_on_s3(s3_endpoint: Endpoint, landing: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A copy of ``landing`` in a new bucket, the endpoint's variables set: (bucket, landing URL)."""
    for k, v in s3_endpoint.env().items():
        monkeypatch.setenv(k, v)
    bucket = s3_endpoint.new_bucket()
    url = f"s3://{bucket}/landing"
    s3_endpoint.upload(landing, url)
    return bucket, url


def test_landing_fingerprints_come_from_listings_and_see_a_same_size_rewrite(
        s3_endpoint: Endpoint, sample_landing: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from resources.landing import Landing

    bucket, url = landing_on_s3(s3_endpoint, sample_landing, monkeypatch)
    zone = Landing(url)
    assert zone.partitions() == [(k.split("|")[0], k.split("|")[1]) for k in ALL]
    before = zone.stat_fingerprint("gulf_coast", "2026-09-01")
    version = zone.content_version("gulf_coast", "2026-09-01")
    assert before is not None and zone.stat_fingerprint("gulf_coast", "2026-09-01") == before

    rel = "gulf_coast/2026-09-01/outages.csv"
    data = bytearray(zone.storage.read(rel))
    pos = data.index(b"\n", data.index(b"\n") + 1) - 1
    data[pos:pos + 1] = b"0" if data[pos:pos + 1] != b"0" else b"1"
    zone.storage.put(rel, bytes(data))  # same size, other bytes: another ETag
    assert zone.stat_fingerprint("gulf_coast", "2026-09-01") != before
    assert Landing(url).content_version("gulf_coast", "2026-09-01") != version
    s3_endpoint.client().delete_object(Bucket=bucket, Key=f"landing/{rel}")
    assert zone.stat_fingerprint("gulf_coast", "2026-09-01") is None


def test_the_landing_sensor_scan_on_s3_sees_new_and_rewritten_objects_once(
        s3_endpoint: Endpoint, sample_landing: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.sensors import scan_landing
    from resources.landing import Landing

    bucket, url = landing_on_s3(s3_endpoint, sample_landing, monkeypatch)
    first = scan_landing(Landing(url), {}, today="2026-12-01")
    assert first.changed == ALL and first.waiting == []
    assert scan_landing(Landing(url), first.fingerprints, today="2026-12-01").changed == []

    rel = "pine_belt/2026-09-02/weather.csv"
    zone = Landing(url)
    zone.storage.put(rel, zone.storage.read(rel) + b"\n")
    after = scan_landing(Landing(url), first.fingerprints, today="2026-12-01")
    assert after.changed == ["2026-09-02|pine_belt"], after


def test_a_put_that_fails_leaves_its_receipt_pending_and_the_next_run_delivers_it(
        pg_dsn: str, sample_landing: Path, tmp_path: Path, s3_endpoint: Endpoint) -> None:
    bucket = s3_endpoint.new_bucket()
    later = f"later-{bucket}"  # made only after the first run
    settings = {**s3_settings(s3_endpoint, bucket), "STORMLAKE_PUBLISH_DIR": f"s3://{later}/published"}
    s3_endpoint.upload(sample_landing, settings["STORMLAKE_LANDING"])
    env = make_home(tmp_path, sample_landing, pg_dsn, **settings)
    one = ("backfill", "--regions", "gulf_coast", "--days", "2026-09-01..2026-09-01")
    key = "2026-09-01|gulf_coast"

    out = run(env, *one)
    assert out.returncode == 1, str(out)
    check_one_line_error(out.stderr, must_mention=(f"s3://{later}/published/gulf_coast/2026-09-01/", "no such bucket"),
                         max_lines=2)
    assert s3_endpoint.secret_access_key not in out.stdout + out.stderr
    pending = status(env)[key]["deliveries"]
    assert pending and {d["status"] for d in pending} == {"PENDING"}, pending

    s3_endpoint.client().create_bucket(Bucket=later)
    again = run(env, *one)
    assert again.returncode == 0, str(again)
    delivered = status(env)[key]["deliveries"]
    assert {d["status"] for d in delivered} == {"DELIVERED"} and len(delivered) == len(pending), delivered
    objects = s3_endpoint.keys(f"s3://{later}/published")
    for d in delivered:
        slot = d["artifact_id"].split("@")[0]
        assert hashlib.sha256(objects[slot]).hexdigest()[:16] == d["artifact_id"].rsplit("@", 1)[1], slot
    check_ledger_clean(pg_dsn)
