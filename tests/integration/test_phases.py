"""The four phases through ``dg.materialize`` with the real resources: PostgreSQL ledger, Delta
tables under a temporary STORMLAKE_HOME and the filesystem publish target."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dagster as dg
import pandas as pd
import psycopg
import pytest
from pandas.testing import assert_frame_equal
from psycopg import sql

from assets.partitions import PARTITIONS
from assets.phases import CORRELATE, INGEST, PHASES, TABLE_PHASE, table_keys
from assets.schemas import SCHEMAS, table_schema
from pipeline.status import write_json
from resources.ledger import Ledger
from resources.ledger_views import LedgerViews
from resources.pgserver import with_database
from resources.publisher import ARTIFACT_KINDS
from resources.settings import load_settings
from tests.helpers import KEY, lake, latest_version, materialize, read_table, step_outcomes, table_versions
from tests.ledger_sql import attempt_counts, operator_actions, query

DAY, REGION = KEY.split("|")
ALL_KEYS = [f"{d}|{r}" for d in ("2026-09-01", "2026-09-02") for r in ("gulf_coast", "pine_belt")]
ASSETS = [p.asset for p in PHASES]
INGEST_TABLES = list(INGEST.tables)


# ---- helpers -------------------------------------------------------------------------------
def home(env: dict[str, str]) -> Path:
    return Path(env["STORMLAKE_HOME"])


def lake_root(env: dict[str, str]) -> str:
    return str(home(env) / "lake")


def landing_file(env: dict[str, str], name: str, key: str = KEY) -> Path:
    day, region = key.split("|")
    return home(env) / "landing" / region / day / name


def publish_dir(env: dict[str, str], key: str = KEY) -> Path:
    day, region = key.split("|")
    return home(env) / "published" / region / day


def data_rows(path: Path) -> int:
    """Data rows of a CSV file as the contract counts them: non-empty lines after the header."""
    lines = [ln for ln in path.read_bytes().split(b"\n") if ln.strip()]
    return len(lines) - 1


def partition_rows(root: str, table: str, key: str = KEY) -> int:
    """Rows of one partition at the table's latest version (0 when the table does not exist)."""
    lk = lake(root)
    version = latest_version(lk, table)
    if version is None:
        return 0
    day, region = key.split("|")
    return lk.read_partition(table, region, day, version=version).num_rows


def read(root: str, table: str, key: str = KEY) -> pd.DataFrame:
    """helpers.read_table, guarded: it cannot be used on an empty partition (see the report)."""
    return read_table(root, table, key) if partition_rows(root, table, key) else pd.DataFrame()


def heads_by_phase(ledger: Ledger, key: str = KEY) -> dict[str, Any]:
    return {cp.phase: cp for cp in ledger.heads([key])}


def failure_descriptions(result: dg.ExecuteInProcessResult) -> list[str]:
    out = []
    for ev in result.all_events:
        if ev.is_step_failure:
            data = ev.step_failure_data
            if data.user_failure_data is not None and data.user_failure_data.description:
                out.append(data.user_failure_data.description)
            else:
                out.append(data.error.message if data.error else "")
    return out


def published_state(env: dict[str, str]) -> dict[str, tuple[int, bytes]]:
    root = home(env) / "published"
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def normalized(df: pd.DataFrame) -> pd.DataFrame:
    """A table partition in a canonical order; list columns as tuples so they compare and sort."""
    df = df.copy()
    for col in df.columns:
        if len(df) and df[col].map(lambda v: isinstance(v, list | tuple) or hasattr(v, "tolist")).any():
            df[col] = df[col].map(lambda v: tuple(v.tolist() if hasattr(v, "tolist") else v))
    if len(df):
        df = df.sort_values(list(df.columns), kind="mergesort")
    return df.reset_index(drop=True)


def assert_completed_all(result: dg.ExecuteInProcessResult) -> None:
    assert result.success, failure_descriptions(result)
    assert step_outcomes(result) == dict.fromkeys(ASSETS, "COMPLETED")


def append_lines(path: Path, lines: list[str]) -> list[int]:
    """Append physical lines to a CSV file; return their 1-based line numbers."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data += b"\n"
    first = data.count(b"\n") + 1
    path.write_bytes(data + "".join(ln + "\n" for ln in lines).encode())
    return list(range(first, first + len(lines)))


def csv_line(values: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(values)
    return buf.getvalue()


def read_header_and_first_row(path: Path) -> tuple[list[str], dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        row = next(reader)
        return list(reader.fieldnames or []), row


@pytest.fixture
def other_pg_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A second fresh database (for a clean run in another STORMLAKE_HOME)."""
    name = f"stormlake_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_database(pg_admin_dsn, name)
    yield dsn
    from resources.ledger import Ledger

    Ledger.close_shared(lambda shared: shared == dsn)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for db in (name, f"{name}_dagster"):  # the ledger's, and Dagster's storage next to it
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


# ---- a full run ----------------------------------------------------------------------------
def test_all_phases_complete_with_ledger_lake_and_deliveries(sl_env: dict[str, str], ledger: Ledger) -> None:
    result = materialize(KEY)
    assert_completed_all(result)

    # Ledger: one COMPLETED head per phase at tiers 1..4.
    heads = heads_by_phase(ledger)
    assert set(heads) == {p.name for p in PHASES}
    for phase in PHASES:
        cp = heads[phase.name]
        assert cp.status == "COMPLETED", (phase.name, cp.status, cp.error_message)
        assert (cp.tier, cp.tier_label) == (phase.tier, phase.tier_label)
        assert cp.attempt == 1
        assert cp.state_hash and cp.input_hash
        assert set(cp.summary["delta_versions"]) == set(phase.tables)

    # Grader checks reported to Dagster and passed.
    evals = result.get_asset_check_evaluations()
    assert {e.asset_key.to_user_string() for e in evals if e.check_name == "grader"} == {p.tables[0] for p in PHASES}
    assert all(e.passed for e in evals)

    # Lake: the checkpoint's pinned versions are the tables' versions (one partition written).
    versions = table_versions(lake_root(sl_env))
    for phase in PHASES:
        for table, v in heads[phase.name].summary["delta_versions"].items():
            assert versions[table] == v, table
    # ... and its files, recorded for the pinned reads, are that version's files of the partition.
    from deltalake import DeltaTable

    from assets.context import pinned_files
    for phase in PHASES:
        summary = heads[phase.name].summary
        assert set(summary["delta_files"]) == set(phase.tables)
        for table in phase.tables:
            dt = DeltaTable(f"{lake_root(sl_env)}/{table}", version=summary["delta_versions"][table])
            want = {f.rsplit("/", 1)[-1] for f in dt.file_uris([("region_id", "=", REGION), ("day", "=", DAY)])}
            got = pinned_files(summary, table, SimpleNamespace(region=SimpleNamespace(region_id=REGION), day=DAY))
            assert {f.rsplit("/", 1)[-1] for f in got} == want, table
            assert all(f.startswith(f"region_id={REGION}/day={DAY}/") for f in got), got

    # Row accounting per landing file, as reported in the ingest checkpoint and found in Delta.
    files = {f["source_file"]: f for f in heads["ingest"].summary["figures"]["files"]}
    quarantine = read(lake_root(sl_env), "quarantine")
    for name, table in (("outages.csv", "outages_raw"), ("weather.csv", "weather_raw")):
        rel = f"{REGION}/{DAY}/{name}"
        rows = read_table(lake_root(sl_env), table)
        q = int((quarantine["source_file"] == rel).sum()) if len(quarantine) else 0
        n = data_rows(landing_file(sl_env, name))
        assert n > 0
        assert len(rows) + q == n, f"{rel}: {len(rows)} accepted + {q} quarantined != {n} rows read"
        rep = files[rel]
        assert rep["rows_read"] == n
        assert rep["rows_accepted"] == len(rows)
        assert rep["rows_quarantined"] == q
        assert set(rows["region_id"]) == {REGION} and set(rows["day"]) == {DAY}
    for rep in files.values():
        assert rep["rows_read"] == rep["rows_accepted"] + rep["rows_quarantined"] + rep["rows_other_regions"]
    assert heads["ingest"].summary["rows"]["quarantine"] == len(quarantine)
    enriched = read_table(lake_root(sl_env), "outages_enriched")
    assert len(enriched) == len(read_table(lake_root(sl_env), "outages_raw"))
    summary = read_table(lake_root(sl_env), "region_day_summary")
    assert len(summary) == 1 and int(summary["outages"].iloc[0]) == len(enriched)

    # Published files and their receipts.
    out_dir = publish_dir(sl_env)
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(ARTIFACT_KINDS), "stray or missing files (temp names?)"
    receipts = ledger.receipts(partition_key=KEY)
    assert sorted(r.kind for r in receipts) == sorted(ARTIFACT_KINDS)
    for r in receipts:
        data = (out_dir / r.kind).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        assert r.status == "DELIVERED"
        assert r.target == "file"
        assert r.artifact_id == f"{REGION}/{DAY}/{r.kind}@{digest[:16]}"
        assert r.content_hash == digest
        assert r.supersedes is None
        assert r.size_bytes == len(data)
    assert sorted(heads["present"].summary["artifacts"]) == sorted(r.artifact_id for r in receipts)
    assert b"<svg " in (out_dir / "report.html").read_bytes()  # the pictures, inline


def test_rerun_of_a_completed_partition_skips_everything(sl_env: dict[str, str], ledger: Ledger) -> None:
    assert_completed_all(materialize(KEY))
    versions = table_versions(lake_root(sl_env))
    receipts = [(r.artifact_id, r.status, r.delivered_at) for r in ledger.receipts()]
    files = published_state(sl_env)
    attempts = attempt_counts(ledger)
    heads = {cp.phase: (cp.id, cp.seq, cp.input_hash, cp.state_hash) for cp in ledger.heads([KEY])}

    result = materialize(KEY)
    assert result.success
    assert step_outcomes(result) == dict.fromkeys(ASSETS, "SKIPPED")
    for ev in result.get_asset_materialization_events():
        meta = ev.step_materialization_data.materialization.metadata
        assert meta["skipped"].value is True
    assert table_versions(lake_root(sl_env)) == versions
    assert [(r.artifact_id, r.status, r.delivered_at) for r in ledger.receipts()] == receipts
    assert published_state(sl_env) == files
    assert attempt_counts(ledger) == attempts
    assert {cp.phase: (cp.id, cp.seq, cp.input_hash, cp.state_hash) for cp in ledger.heads([KEY])} == heads
    skipped = query(ledger, "SELECT phase FROM checkpoint_events WHERE status = 'SKIPPED' AND partition_key = %s",
                           (KEY,))
    assert sorted(r["phase"] for r in skipped) == sorted(p.name for p in PHASES)


# ---- one asset per table, with the standard table metadata -----------------------------------
def _materializations(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetMaterialization]:
    return {m.asset_key.to_user_string(): m for m in (e.step_materialization_data.materialization
                                                      for e in result.get_asset_materialization_events())}


def test_every_table_is_materialized_with_its_rows_schema_uri_version_and_hash(sl_env: dict[str, str],
                                                                               ledger: Ledger) -> None:
    from assets.landing_files import DATA_VERSION_TAG

    other = "2026-09-01|pine_belt"
    assert_completed_all(materialize(KEY))
    result = materialize(other)
    assert_completed_all(result)
    mats = _materializations(result)
    assert set(mats) == set(SCHEMAS)  # one materialization per table, none for a phase as a whole
    root = lake_root(sl_env)
    heads = heads_by_phase(ledger, other)
    for table, mat in mats.items():
        owner = TABLE_PHASE[table]
        cp = heads[owner]
        meta = {k: v.value for k, v in mat.metadata.items()}
        here, there = len(read_table(root, table, other)), len(read_table(root, table, KEY))
        assert meta["dagster/partition_row_count"] == here == cp.summary["rows"][table], table
        # The whole table at the version written: this partition and the one written before.
        assert meta["dagster/row_count"] == here + there, table
        # The column schema is the asset's definition metadata, not repeated on each materialization.
        assert "dagster/column_schema" not in mat.metadata, table
        assert [c.name for c in table_schema(table).columns] == SCHEMAS[table].names
        assert meta["dagster/table_name"] == table
        assert meta["dagster/uri"] == (Path(root) / table).resolve().as_uri()
        assert meta["delta_version"] == cp.summary["delta_versions"][table] == table_versions(root)[table]
        # The phase's outcome is on each of its tables; the data version is the table's own content hash.
        assert (meta["status"], meta["seq"], meta["input_hash"], meta["state_hash"]) == (
            "COMPLETED", cp.seq, cp.input_hash, cp.state_hash), table
        assert meta["table_hash"] == cp.summary["table_hashes"][table] == mat.tags[DATA_VERSION_TAG], table
    # Tables of one phase have data versions of their own.
    assert len({mats[t].tags[DATA_VERSION_TAG] for t in ("outages_raw", "weather_raw", "quarantine")}) == 3

    # A re-run skips: the same tables, rows and data versions, from the checkpoint.
    again = _materializations(materialize(other))
    for table, mat in again.items():
        assert mat.metadata["status"].value == "SKIPPED"
        for key in ("dagster/partition_row_count", "dagster/row_count", "delta_version", "table_hash"):
            assert mat.metadata[key] == mats[table].metadata[key], (table, key)
        assert mat.tags[DATA_VERSION_TAG] == mats[table].tags[DATA_VERSION_TAG]


# ---- resume after a failure ----------------------------------------------------------------
def test_resume_after_injected_fault_equals_clean_run(sl_env: dict[str, str], ledger: Ledger, other_pg_dsn: str,
                                                      sample_landing: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A clean run in another STORMLAKE_HOME with its own database.
    clean_home = tmp_path / "clean"
    shutil.copytree(sample_landing, clean_home / "landing")
    monkeypatch.setenv("STORMLAKE_HOME", str(clean_home))
    monkeypatch.setenv("STORMLAKE_PG_DSN", other_pg_dsn)
    monkeypatch.setenv("DAGSTER_HOME", str(clean_home / "dagster"))
    assert_completed_all(materialize(KEY))
    for k, v in sl_env.items():
        monkeypatch.setenv(k, v)

    # The faulted run: correlate raises halfway through its computation.
    monkeypatch.setenv("STORMLAKE_FAULTS", "correlate.mid_transform=raise")
    failed = materialize(KEY)
    assert not failed.success
    assert step_outcomes(failed) == {"ingested_batch": "COMPLETED", "enriched_outages": "COMPLETED"}
    descs = failure_descriptions(failed)
    assert any("InjectedFault" in d or "injected fault" in d for d in descs), descs
    heads = heads_by_phase(ledger)
    assert heads["correlate"].status == "FAILED"
    assert heads["correlate"].error_class == "InjectedFault"
    assert "present" not in heads
    assert heads["ingest"].status == heads["enrich"].status == "COMPLETED"
    attempts = attempt_counts(ledger)
    before = table_versions(lake_root(sl_env))
    assert partition_rows(lake_root(sl_env), "cell_hour_stats") == 0

    monkeypatch.delenv("STORMLAKE_FAULTS")
    resumed = materialize(KEY)
    assert resumed.success, failure_descriptions(resumed)
    assert step_outcomes(resumed) == {"ingested_batch": "SKIPPED", "enriched_outages": "SKIPPED",
                                      "storm_correlation": "COMPLETED", "operational_picture": "COMPLETED"}
    after_attempts = attempt_counts(ledger)
    for phase in ("ingest", "enrich"):
        assert after_attempts[(KEY, phase)] == attempts[(KEY, phase)] == 1
    assert after_attempts[(KEY, "correlate")] == 2  # the failed attempt and the resumed one
    after = table_versions(lake_root(sl_env))
    for table in (*INGEST_TABLES, "outages_enriched"):
        assert after[table] == before[table], table
    heads = heads_by_phase(ledger)
    assert all(cp.status == "COMPLETED" for cp in heads.values()) and len(heads) == 4

    for table in SCHEMAS:
        got = normalized(read(lake_root(sl_env), table))
        want = normalized(read(str(clean_home / "lake"), table))
        assert len(want) > 0 or table == "quarantine", table
        assert_frame_equal(got, want, obj=table)
    # Same content, same artifacts.
    for kind in ARTIFACT_KINDS:
        assert (publish_dir(sl_env) / kind).read_bytes() == (clean_home / "published" / REGION / DAY / kind).read_bytes()


# ---- a changed landing file ----------------------------------------------------------------
def test_later_phases_read_their_pinned_inputs_after_the_delta_log_dropped_those_versions(
        sl_env: dict[str, str], ledger: Ledger) -> None:
    from deltalake import DeltaTable

    from assets.phases import ENRICH
    from resources.lake import PartitionCache

    first = materialize(KEY, selection=table_keys(INGEST) + table_keys(ENRICH))
    assert step_outcomes(first) == {"ingested_batch": "COMPLETED", "enriched_outages": "COMPLETED"}
    heads = heads_by_phase(ledger)
    pinned = {t: v for phase in ("ingest", "enrich") for t, v in heads[phase].summary["delta_versions"].items()}
    # What delta-rs does at a checkpoint once the retention has passed: the commits before it leave
    # the log, so the versions the checkpoints pinned can no longer be loaded.
    for table in pinned:
        dt = DeltaTable(f"{lake_root(sl_env)}/{table}")
        dt.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
        dt = DeltaTable(f"{lake_root(sl_env)}/{table}")
        dt.create_checkpoint()
        dt.cleanup_metadata()
        with pytest.raises(Exception, match="log segment|not found|Invalid"):
            DeltaTable(f"{lake_root(sl_env)}/{table}", version=pinned[table])
    PartitionCache.shared().clear()  # read from the lake, not from what this process wrote

    result = materialize(KEY)
    assert step_outcomes(result)["storm_correlation"] == "COMPLETED", step_outcomes(result)
    heads = heads_by_phase(ledger)
    assert heads["correlate"].status == heads["present"].status == "COMPLETED"
    assert heads["ingest"].attempt == heads["enrich"].attempt == 1  # nothing before correlate ran again
    assert heads["present"].summary["figures"]["outages"] == heads["present"].summary["figures"]["expected_outages"]


def test_changed_landing_file_recomputes_only_its_partition(sl_env: dict[str, str], ledger: Ledger) -> None:
    for key in ALL_KEYS:
        assert_completed_all(materialize(key))
    heads_before = {(cp.partition_key, cp.phase): cp for cp in ledger.heads()}
    receipts_before = {(r.artifact_id, r.target): r for r in ledger.receipts()}
    old_ids = {r.kind: r.artifact_id for r in ledger.receipts(partition_key=KEY)}
    others = [k for k in ALL_KEYS if k != KEY]
    data_before = {(k, t): normalized(read(lake_root(sl_env), t, k)) for k in others for t in SCHEMAS}
    files_before = published_state(sl_env)
    outages_before = read_table(lake_root(sl_env), "outages_raw")

    # Append one valid outage: a copy of the first row with a new id and many customers out.
    path = landing_file(sl_env, "outages.csv")
    header, row = read_header_and_first_row(path)
    row = {**row, "event_id": "appended-outage-1", "customers_out": "4321"}
    (line,) = append_lines(path, [csv_line([row[h] for h in header])])

    for key in ALL_KEYS:
        result = materialize(key)
        assert result.success, failure_descriptions(result)
        expected = "COMPLETED" if key == KEY else "SKIPPED"
        assert step_outcomes(result) == dict.fromkeys(ASSETS, expected), key

    heads_after = {(cp.partition_key, cp.phase): cp for cp in ledger.heads()}
    for (key, phase), cp in heads_before.items():
        now = heads_after[(key, phase)]
        if key == KEY:
            assert now.id != cp.id and now.input_hash != cp.input_hash, phase
            assert now.status == "COMPLETED" and now.attempt == 1
        else:
            assert (now.id, now.seq, now.input_hash, now.state_hash, now.attempt) == \
                   (cp.id, cp.seq, cp.input_hash, cp.state_hash, cp.attempt), (key, phase)
            assert now.summary["delta_versions"] == cp.summary["delta_versions"], (key, phase)
    for (key, table), df in data_before.items():
        assert_frame_equal(normalized(read(lake_root(sl_env), table, key)), df, obj=f"{table} {key}")

    outages_after = read_table(lake_root(sl_env), "outages_raw")
    assert len(outages_after) == len(outages_before) + 1
    new = outages_after[outages_after["event_id"] == "appended-outage-1"]
    assert len(new) == 1 and int(new["source_line"].iloc[0]) == line and int(new["customers_out"].iloc[0]) == 4321
    summary = read_table(lake_root(sl_env), "region_day_summary")
    assert int(summary["outages"].iloc[0]) == len(outages_after)

    # New revisions delivered for this partition only, each naming the one it supersedes.
    receipts_after = {(r.artifact_id, r.target): r for r in ledger.receipts()}
    added = [r for k, r in receipts_after.items() if k not in receipts_before]
    assert added, "no new artifact delivered for the changed partition"
    assert {r.partition_key for r in added} == {KEY}
    assert "summary.json" in {r.kind for r in added}
    for r in added:
        assert r.status == "DELIVERED"
        assert r.supersedes == old_ids[r.kind], r.kind
        data = (publish_dir(sl_env) / r.kind).read_bytes()
        assert r.artifact_id == f"{REGION}/{DAY}/{r.kind}@{hashlib.sha256(data).hexdigest()[:16]}"
    assert len(added) <= len(ARTIFACT_KINDS)
    files_after = published_state(sl_env)
    for rel, state in files_before.items():
        if not rel.startswith(f"{REGION}/{DAY}/"):
            assert files_after[rel] == state, rel
    # The receipts of the earlier revisions are kept.
    for k in receipts_before:
        assert k in receipts_after


# ---- quarantine and unreadable files -------------------------------------------------------
def test_landing_digests_are_reused_by_stamp_and_a_same_size_rewrite_is_still_seen(
        sl_env: dict[str, str], ledger: Ledger) -> None:
    from resources.landing import Landing, file_stamp

    assert_completed_all(materialize(KEY))
    ingest = heads_by_phase(ledger)["ingest"]
    landing = Landing(home(sl_env) / "landing")
    files = landing.input_files(REGION, DAY)
    # The ingest checkpoint records each input file's stamp next to its digest.
    assert ingest.summary["input_stamps"] == {rel: file_stamp(path) for rel, path in files.items()}
    assert ingest.summary["input_files"] == {rel: hashlib.sha256(path.read_bytes()).hexdigest()
                                             for rel, path in files.items()}

    # A recorded (stamp, digest) is taken as it is while the stamp holds: the file is not read.
    rel = f"{REGION}/{DAY}/outages.csv"
    known = {rel: (ingest.summary["input_stamps"][rel], "recorded-digest")}
    assert landing.stamped_digests(REGION, DAY, known=known)[rel] == (known[rel][0], "recorded-digest")

    # Rewrite the file in place with the same size and put its mtime back: the stamp still
    # changes (ctime), so the digest is computed again and ingest runs on the new bytes.
    path = Path(str(files[rel]))  # the local file behind it
    before = path.stat()
    data = bytearray(path.read_bytes())
    header_end = data.index(b"\n")
    pos = data.index(b"\n", header_end + 1) - 1  # last character of the first data row
    data[pos:pos + 1] = b"0" if data[pos:pos + 1] != b"0" else b"1"
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert landing.stamped_digests(REGION, DAY, known=known)[rel] == (
        file_stamp(path), hashlib.sha256(bytes(data)).hexdigest())

    result = materialize(KEY)
    assert result.success, failure_descriptions(result)
    assert step_outcomes(result)[ASSETS[0]] == "COMPLETED"
    again = heads_by_phase(ledger)["ingest"]
    assert again.input_hash != ingest.input_hash
    assert again.summary["input_files"][rel] == hashlib.sha256(bytes(data)).hexdigest()


def test_malformed_rows_are_quarantined_with_line_field_and_reason(sl_env: dict[str, str], ledger: Ledger) -> None:
    path = landing_file(sl_env, "outages.csv")
    rel = f"{REGION}/{DAY}/outages.csv"
    header, first = read_header_and_first_row(path)

    def row(**over: str) -> str:
        return csv_line([{**first, **over}[h] for h in header])

    cases = [
        ("bad lat", row(event_id="q-lat", lat="north"), "lat"),
        ("negative customers_out", row(event_id="q-cust", customers_out="-5"), "customers_out"),
        ("bad timestamp", row(event_id="q-ts", reported_at="not-a-timestamp"), "reported_at"),
        ("duplicate event_id", row(), "event_id"),
        ("wrong column count", row(event_id="q-cols") + ",surplus", None),
        ("good", row(event_id="q-good", customers_out="7"), "-"),
    ]
    lines = append_lines(path, [c[1] for c in cases])
    n = data_rows(path)

    result = materialize(KEY, selection=table_keys(INGEST))
    assert result.success, failure_descriptions(result)
    assert step_outcomes(result) == {"ingested_batch": "COMPLETED"}

    root = lake_root(sl_env)
    q = read(root, "quarantine")
    q = q[q["source_file"] == rel]
    raw = read_table(root, "outages_raw")
    by_line = {int(r.line): r for r in q.itertuples()}
    for (what, text, field), line in zip(cases, lines, strict=True):
        if field == "-":
            assert line not in by_line, f"{what}: a good row was quarantined: {by_line.get(line)}"
            kept = raw[raw["event_id"] == "q-good"]
            assert len(kept) == 1 and int(kept["source_line"].iloc[0]) == line
            continue
        assert line in by_line, f"{what} (line {line}) not in quarantine"
        got = by_line[line]
        assert (None if pd.isna(got.field) else got.field) == field, what
        assert got.reason and got.reason.strip(), what
        assert got.raw == text, what
        if field:
            assert field in got.reason, (what, got.reason)
    assert "unique" in by_line[lines[3]].reason
    assert "fields" in by_line[lines[4]].reason
    for eid in ("q-lat", "q-cust", "q-ts", "q-cols"):
        assert eid not in set(raw["event_id"]), eid
    dup = raw[raw["event_id"] == first["event_id"]]
    assert len(dup) == 1 and int(dup["source_line"].iloc[0]) == 2  # the first occurrence owns the id

    assert len(raw) + len(q) == n
    rep = {f["source_file"]: f for f in ledger.head(KEY, "ingest").summary["figures"]["files"]}[rel]
    assert (rep["rows_read"], rep["rows_accepted"], rep["rows_quarantined"]) == (n, len(raw), len(q))


def _break_weather_utf8(path: Path) -> str:
    data = path.read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 1
    path.write_bytes(data[:cut] + b"\xff\xfe bad bytes,\n" + data[cut:])
    return "UTF-8"


def _drop_outages_column(path: Path) -> str:
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    i = rows[0].index("customers_out")
    path.write_text("".join(csv_line(r[:i] + r[i + 1:]) + "\n" for r in rows), encoding="utf-8")
    return "customers_out"


@pytest.mark.parametrize(("name", "damage"), [("weather.csv", _break_weather_utf8),
                                              ("outages.csv", _drop_outages_column)],
                         ids=["weather-not-utf8", "outages-missing-column"])
def test_unreadable_file_fails_the_partition_and_writes_nothing(sl_env: dict[str, str], ledger: Ledger,
                                                                name: str, damage) -> None:
    other = "2026-09-01|pine_belt"
    assert_completed_all(materialize(other))  # so that every table exists
    problem = damage(landing_file(sl_env, name))
    rel = f"{REGION}/{DAY}/{name}"

    result = materialize(KEY)
    assert not result.success
    descs = failure_descriptions(result)
    assert len(descs) == 1, descs  # only ingest ran; the later phases were not started
    desc = descs[0]
    assert "\n" not in desc.strip(), desc
    assert rel in desc and problem in desc, desc
    assert "Traceback" not in desc
    assert not step_outcomes(result)

    root = lake_root(sl_env)
    for table in SCHEMAS:
        assert partition_rows(root, table, KEY) == 0, f"{table} has rows of the failed partition"
        assert partition_rows(root, table, other) > 0 or table == "quarantine", table
    assert not publish_dir(sl_env).exists()
    heads = heads_by_phase(ledger)
    assert set(heads) == {"ingest"}
    assert heads["ingest"].status == "FAILED"
    assert heads["ingest"].error_class == "InputFileError"
    assert rel in heads["ingest"].error_message
    assert ledger.receipts(partition_key=KEY) == []


def test_upstream_not_ready_fails_with_a_clear_message(sl_env: dict[str, str], ledger: Ledger) -> None:
    result = materialize(KEY, selection=table_keys(CORRELATE))
    assert not result.success
    descs = failure_descriptions(result)
    assert len(descs) == 1, descs
    desc = descs[0]
    assert "\n" not in desc.strip(), desc
    assert KEY in desc and "COMPLETED first" in desc and "upstream" in desc, desc
    assert ledger.heads([KEY]) == []
    versions = table_versions(lake_root(sl_env))
    assert all(versions[t] is None for t in ("cell_hour_stats", "cell_risk", "storm_clusters"))


def test_a_partition_that_has_not_landed_is_no_failure_and_leaves_no_trace(sl_env: dict[str, str],
                                                                           ledger: Ledger) -> None:
    key = "2026-09-20|gulf_coast"  # a day of the partitions with no landing folder
    result = materialize(key)
    assert result.success
    mats = [e for e in result.all_events if e.is_step_materialization]
    assert mats == []  # no table materialized: the partition stays missing in the catalog
    checks = [e.asset_check_evaluation_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert len(checks) == 1 and checks[0].passed and checks[0].metadata["landed"].value is False
    assert "has not landed" in (checks[0].description or "")
    skipped = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SKIPPED"}
    assert skipped == {p.asset for p in PHASES[1:]}, skipped  # the later phases were not started
    assert ledger.heads([key]) == []
    # Files that land later are read as usual: half of them is a failure naming the missing one.
    landed = landing_file(sl_env, "weather.csv", key)
    landed.parent.mkdir(parents=True)
    shutil.copy(landing_file(sl_env, "weather.csv"), landed)
    half = materialize(key)
    assert not half.success
    assert "gulf_coast/2026-09-20/outages.csv" in failure_descriptions(half)[0]


def test_a_forced_rerun_from_correlate_recomputes_it_and_present_keeps_history_and_delivers_nothing(
        sl_env: dict[str, str], ledger: Ledger) -> None:
    from assets.runner import Force

    assert_completed_all(materialize(KEY))
    before = heads_by_phase(ledger)
    receipts = [(r.artifact_id, r.target, r.status) for r in ledger.receipts(partition_key=KEY)]
    force = Force("correlate", "cluster threshold review", "ops-on-call", "f1")

    forced = materialize(KEY, tags=force.tags())
    assert forced.success, failure_descriptions(forced)
    assert step_outcomes(forced) == {"ingested_batch": "SKIPPED", "enriched_outages": "SKIPPED",
                                     "storm_correlation": "COMPLETED", "operational_picture": "COMPLETED"}
    after = heads_by_phase(ledger)
    for phase in ("ingest", "enrich"):
        assert after[phase].id == before[phase].id
    for phase in ("correlate", "present"):
        cp = after[phase]
        assert cp.id != before[phase].id and cp.input_hash != before[phase].input_hash
        assert cp.summary["forced"] == {"from": "correlate", "by": "ops-on-call", "reason": "cluster threshold review",
                                        "id": "f1", "run_id": forced.run_id}
        assert cp.summary["natural_input_hash"] == before[phase].input_hash
        assert cp.state_hash == before[phase].state_hash  # the same inputs gave the same tables and artifacts
        # The old checkpoint is superseded, not deleted: the history shows both.
        rows = query(ledger, "SELECT id, superseded_at FROM checkpoints WHERE partition_key = %s AND phase = %s"
                             " ORDER BY id", (KEY, phase))
        assert [r["id"] for r in rows] == [before[phase].id, cp.id]
        assert rows[0]["superseded_at"] is not None and rows[1]["superseded_at"] is None
    assert [(a["action"], a["phase"], a["actor"], a["reason"], a["detail"]["force_id"]) for a in operator_actions(ledger, KEY)] == [
        ("force", "correlate", "ops-on-call", "cluster threshold review", "f1")]
    # The bytes did not change: nothing was delivered again, the receipts are as they were.
    assert after["present"].summary["delivered"] == []
    assert [(r.artifact_id, r.target, r.status) for r in ledger.receipts(partition_key=KEY)] == receipts

    # A plain run afterwards finds every phase current (the forced checkpoints included).
    again = materialize(KEY)
    assert step_outcomes(again) == dict.fromkeys(ASSETS, "SKIPPED")
    # A forced run needs a phase name and a reason.
    bad = materialize(KEY, tags={"stormlake/from": "correlate"})
    assert not bad.success and "needs a reason" in failure_descriptions(bad)[0]


def test_a_phase_failing_on_the_same_inputs_is_dead_lettered_until_released(sl_env: dict[str, str],
                                                                            ledger: Ledger) -> None:
    limit = load_settings().dead_letter_after
    assert limit == 3
    _drop_outages_column(landing_file(sl_env, "outages.csv"))  # a failure that comes back every time
    for n in range(1, limit + 1):
        assert not materialize(KEY).success
        head = heads_by_phase(ledger)["ingest"]
        assert (head.status, head.attempt, head.failures) == ("FAILED", n, n)
    assert [(cp.partition_key, cp.phase) for cp in LedgerViews(ledger).dead_letters(limit)] == [(KEY, "ingest")]

    # Dead-lettered: the next run makes no attempt and skips it, saying why in one line (its grader
    # check, with the metadata), and the later phases' steps are skipped.
    refused = materialize(KEY)
    assert refused.success
    assert step_outcomes(refused) == {}
    [check] = [c for c in refused.get_asset_check_evaluations() if c.check_name == "grader"]
    desc = check.description
    assert not check.passed and check.metadata["dead_lettered"].value is True
    assert "dead-lettered after 3 failures" in desc and "customers_out" in desc and "stormlake release" in desc, desc
    assert "\n" not in desc.strip()
    head = heads_by_phase(ledger)["ingest"]
    assert (head.attempt, head.failures) == (limit, limit)
    # status --json lists it, with the failures on the phase's entry.
    buf = io.StringIO()
    write_json(ledger, buf, dead_letter_after=limit)
    [entry] = json.loads(buf.getvalue())["partitions"]
    assert entry["dead_lettered"] == ["ingest"] and entry["phases"]["ingest"]["failures"] == limit

    # A release re-arms it (recorded with who and why); the next run tries again.
    assert ledger.release(KEY, actor="ops-on-call", reason="upstream promised a fix").phases == ["ingest"]
    actions = operator_actions(ledger, KEY)
    assert [(a["action"], a["actor"], a["reason"], a["detail"]) for a in actions] == [
        ("release", "ops-on-call", "upstream promised a fix", {"phases": ["ingest"]})]
    assert LedgerViews(ledger).dead_letters(limit) == []
    assert not materialize(KEY).success
    head = heads_by_phase(ledger)["ingest"]
    assert (head.attempt, head.failures) == (limit + 1, 1)


def test_a_range_of_dead_lettered_partitions_is_passed_over(sl_env: dict[str, str], ledger: Ledger) -> None:
    """A key range run (as a UI backfill's) whose partitions are all dead-lettered ends without a
    failure, its grader saying so in one line; one with a healthy partition beside a dead-lettered
    one fails naming the dead-lettered one, after the healthy one's phase completed and its
    materializations were logged."""
    from resources.keys import RANGE_END_TAG as end_tag
    from resources.keys import RANGE_START_TAG as start_tag

    limit = load_settings().dead_letter_after
    keys = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt"]
    for key in keys:
        _drop_outages_column(landing_file(sl_env, "outages.csv", key))
    both = {start_tag: keys[0], end_tag: keys[1]}
    for _ in range(limit):
        assert not materialize(None, tags=both).success
    refused = materialize(None, tags=both)
    assert refused.success
    assert [e for e in refused.all_events if e.is_step_materialization] == []
    [check] = [c for c in refused.get_asset_check_evaluations() if c.check_name == "grader"]
    assert not check.passed and check.metadata["dead_lettered"].value is True
    assert check.description.startswith("skipped 2 dead-lettered partitions") and "\n" not in check.description
    assert {(cp.partition_key, cp.failures) for cp in ledger.heads(keys)} == {(k, limit) for k in keys}

    mixed = {start_tag: "2026-09-01|pine_belt", end_tag: "2026-09-02|pine_belt"}  # one region's two days
    with dg.DagsterInstance.ephemeral() as instance:
        result = materialize(None, tags=mixed, instance=instance)
        logged = instance.get_status_by_partition(dg.AssetKey("outages_raw"), [keys[1], "2026-09-02|pine_belt"],
                                                  PARTITIONS)
    assert not result.success
    assert "dead-lettered" in failure_descriptions(result)[0]
    assert [cp.status for cp in ledger.heads(["2026-09-02|pine_belt"]) if cp.phase == "ingest"] == ["COMPLETED"]
    assert logged == {keys[1]: dg.AssetPartitionStatus.FAILED,
                      "2026-09-02|pine_belt": dg.AssetPartitionStatus.MATERIALIZED}


def test_a_transient_failure_does_not_count_toward_the_dead_letter_limit(sl_env: dict[str, str],
                                                                         ledger: Ledger) -> None:
    args = dict(partition_key=KEY, region_id="gulf_coast", day="2026-09-01", phase="ingest", input_hash="h" * 64,
                schema_version=1, code_version="1", run_id=None)
    claim = ledger.claim(**args).claim
    assert claim is not None and ledger.fail(claim, error_class="DeliveryExhausted", error_message="webhook down",
                                             run_id=None, counts=False)
    claim = ledger.claim(**args).claim
    assert claim is not None and ledger.fail(claim, error_class="InputFileError", error_message="bad", run_id=None)
    head = heads_by_phase(ledger)["ingest"]
    assert (head.attempt, head.failures) == (2, 1)


def _make_noisy(env: dict[str, str], key: str = KEY) -> None:
    """Leave out most station-hours of the batch's weather.csv: present grades it noisy."""
    path = landing_file(env, "weather.csv", key)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([lines[0], *lines[1::4]]))


def _delivered(ledger: Ledger) -> list[tuple[str, str, str]]:
    return sorted((r.artifact_id, r.target, r.status) for r in ledger.receipts(partition_key=KEY))


def test_a_batch_held_by_a_forced_rerun_is_delivered_once_by_its_release(sl_env: dict[str, str],
                                                                        ledger: Ledger) -> None:
    from assets.runner import Force

    _make_noisy(sl_env)
    first = materialize(KEY)
    assert first.success, failure_descriptions(first)
    held = heads_by_phase(ledger)["present"]
    assert held.summary["held"]["quality"] == "noisy" and held.summary["delivered"] == [] and held.tier == 3
    assert _delivered(ledger) == [] and not publish_dir(sl_env).exists()

    forced = materialize(KEY, tags=Force("correlate", "threshold review", "ops", "f1").tags())
    assert forced.success, failure_descriptions(forced)
    again = heads_by_phase(ledger)["present"]
    assert again.id != held.id and "held" in again.summary and again.summary["natural_input_hash"] == held.input_hash

    release = ledger.release(KEY, actor="ops", reason="stations known to be down")
    assert release.held_phase == "present"
    done = materialize(KEY)
    assert done.success, failure_descriptions(done)
    present = heads_by_phase(ledger)["present"]
    assert "held" not in present.summary and present.summary["released"]["by"] == "ops"
    assert present.tier == 4 and len(present.summary["delivered"]) == len(ARTIFACT_KINDS)
    receipts = _delivered(ledger)
    assert len(receipts) == len(ARTIFACT_KINDS) and {r[2] for r in receipts} == {"DELIVERED"}
    # Carried out once: later runs skip and deliver nothing.
    assert step_outcomes(materialize(KEY)) == dict.fromkeys(ASSETS, "SKIPPED")
    assert _delivered(ledger) == receipts


def test_a_released_batch_whose_delivery_failed_is_delivered_by_the_next_run_not_held_again(
        sl_env: dict[str, str], ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_noisy(sl_env)
    assert materialize(KEY).success
    assert "held" in heads_by_phase(ledger)["present"].summary
    ledger.release(KEY, actor="ops", reason="checked by hand")
    monkeypatch.setenv("STORMLAKE_FAULTS", "present.after_pending=raise")
    assert not materialize(KEY).success
    assert heads_by_phase(ledger)["present"].status == "FAILED"
    monkeypatch.delenv("STORMLAKE_FAULTS")
    retried = materialize(KEY)
    assert retried.success, failure_descriptions(retried)
    present = heads_by_phase(ledger)["present"]
    assert present.status == "COMPLETED" and "held" not in present.summary and "released" in present.summary
    assert {r[2] for r in _delivered(ledger)} == {"DELIVERED"} and len(_delivered(ledger)) == len(ARTIFACT_KINDS)
    # The release is used up: the same inputs held again later would wait for a release of their own.
    assert ledger.release_of(KEY, "present", present.summary["natural_input_hash"]) is None


def test_the_grade_is_in_the_summary_table_and_the_dagster_metadata(sl_env: dict[str, str], ledger: Ledger) -> None:
    """A clean batch and a noisy one: the grade in region_day_summary and in the metadata of
    present's materialization, with the measures and, for the held one, its reasons."""
    clean = materialize(KEY)
    assert clean.success, failure_descriptions(clean)
    [meta] = [ev.step_materialization_data.materialization.metadata for ev in clean.get_asset_materialization_events()
              if ev.step_materialization_data.materialization.asset_key.to_user_string() == "region_day_summary"]
    assert meta["signal_quality"].value == "high" and meta["held_for_review"].value is False
    assert set(meta["quality_measures"].value) == {"quarantined_share", "outages_without_weather",
                                                   "station_hours_missing", "outages_without_feeder"}
    assert read(lake_root(sl_env), "region_day_summary")["signal_quality"].tolist() == ["high"]

    other = "2026-09-02|gulf_coast"
    _make_noisy(sl_env, other)
    noisy = materialize(other)
    assert noisy.success, failure_descriptions(noisy)
    [meta] = [ev.step_materialization_data.materialization.metadata for ev in noisy.get_asset_materialization_events()
              if ev.step_materialization_data.materialization.asset_key.to_user_string() == "region_day_summary"]
    assert meta["signal_quality"].value == "noisy" and meta["held_for_review"].value is True
    assert any(r.startswith("station_hours_missing") for r in meta["held_reasons"].value)
    assert read(lake_root(sl_env), "region_day_summary", other)["signal_quality"].tolist() == ["noisy"]


def test_a_held_batch_whose_inputs_change_is_graded_again_and_delivered_when_clean(sl_env: dict[str, str],
                                                                                  ledger: Ledger) -> None:
    weather = landing_file(sl_env, "weather.csv")
    clean_text = weather.read_text()
    _make_noisy(sl_env)
    assert materialize(KEY).success
    assert "held" in heads_by_phase(ledger)["present"].summary and _delivered(ledger) == []
    weather.write_text(clean_text)  # the stations' readings arrive late: new inputs, no release needed
    again = materialize(KEY)
    assert again.success, failure_descriptions(again)
    present = heads_by_phase(ledger)["present"]
    assert "held" not in present.summary and "released" not in present.summary and present.tier == 4
    assert present.summary["figures"]["quality"]["grade"] != "noisy"
    assert len(_delivered(ledger)) == len(ARTIFACT_KINDS)
