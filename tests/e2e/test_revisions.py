"""Revisions: late data recomputes one partition and delivers superseding artifacts; a schema-version
bump recomputes that phase and the ones after it, and reverting it restores the old state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.consumer import (
    KINDS,
    PHASE_NAMES,
    Consumer,
    add_outages,
    check_consumer,
    check_headers,
    check_ledger_clean,
    lake_snapshot,
    make_home,
    run,
    sql_rows,
    status,
)

pytestmark = pytest.mark.e2e

ALL = ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast", "2026-09-02|pine_belt"]
ARGS = ("backfill", "--regions", "gulf_coast,pine_belt", "--days", "2026-09-01..2026-09-02")
LATE = "2026-09-01|gulf_coast"


def completed_events(dsn: str) -> dict[tuple[str, str], int]:
    rows = sql_rows(dsn, "SELECT partition_key, phase, count(*) FROM checkpoint_events WHERE status = 'COMPLETED'"
                         " GROUP BY partition_key, phase")
    return {(r[0], r[1]): r[2] for r in rows}


def test_late_data_recomputes_one_partition_and_supersedes_its_artifacts(pg_dsn: str, sample_landing: Path,
                                                                         tmp_path: Path) -> None:
    with Consumer() as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url)
        first = run(env, *ARGS)
        assert first.returncode == 0, str(first)
        before = status(env)
        old = check_consumer(consumer.snapshot(), partitions=ALL)
        n_first = len(consumer.snapshot())
        assert n_first == 12

        add_outages(Path(env["STORMLAKE_HOME"]) / "landing", "gulf_coast", "2026-09-01", n=3)
        second = run(env, *ARGS)
        assert second.returncode == 0, str(second)
        after = status(env)

        # only the changed partition was recomputed, every phase of it, once
        for key in ALL:
            for phase in PHASE_NAMES:
                b, a = before[key]["phases"][phase], after[key]["phases"][phase]
                if key == LATE:
                    assert a["seq"] > b["seq"] and a["input_hash"] != b["input_hash"], (key, phase, b, a)
                    assert a["attempts"] == 1 and a["status"] == "COMPLETED", (key, phase, a)
                else:
                    assert a == b, f"{phase} of {key} changed although its inputs did not"
        events = completed_events(pg_dsn)
        assert events == {(k, p): (2 if k == LATE else 1) for k in ALL for p in PHASE_NAMES}, events
        assert after[LATE]["tier"] == 4

        # the new revisions, and only those, were delivered, each naming the one it supersedes
        new_posts = consumer.snapshot()[n_first:]
        for p in new_posts:
            check_headers(p)
            assert p.key.startswith("gulf_coast/2026-09-01/"), f"an unchanged partition delivered {p.key}"
            slot = p.key.split("@")[0]
            assert p.key != old[slot], f"{p.key} was delivered again"
            assert p.headers.get("x-stormlake-supersedes") == old[slot], p.headers
        kinds = sorted(p.kind for p in new_posts)
        assert len(kinds) == len(set(kinds)), kinds
        assert {"summary.json", "report.html"} <= set(kinds), kinds
        receipts = {d["artifact_id"]: d for d in after[LATE]["deliveries"]}
        for p in new_posts:
            for target in ("file", "webhook"):
                rec = [d for d in after[LATE]["deliveries"] if d["artifact_id"] == p.key and d["target"] == target]
                assert len(rec) == 1 and rec[0]["status"] == "DELIVERED", rec
                assert rec[0].get("supersedes") == old[p.key.split("@")[0]], rec
        assert set(receipts) >= set(old[f"gulf_coast/2026-09-01/{k}"] for k in KINDS)
        check_consumer(consumer.snapshot()[n_first:], partitions=[])
        check_ledger_clean(pg_dsn)

        # and a third run delivers nothing at all
        third = run(env, *ARGS)
        assert third.returncode == 0, str(third)
        assert len(consumer.snapshot()) == n_first + len(new_posts)


# ---- schema versions (in process: the bump must be visible to the running code) ------------------
def _outcomes(result: Any) -> dict[str, str]:
    from assets.phases import PHASES as PH
    from tests.helpers import step_outcomes

    by_op = step_outcomes(result)  # keyed by the phase's op, whose tables all carry its outcome
    return {p.name: by_op.get(p.asset, "-") for p in PH}


def _heads(dsn: str, key: str) -> dict[str, tuple[Any, ...]]:
    rows = sql_rows(dsn, "SELECT phase, seq, schema_version, state_hash, attempt FROM checkpoints"
                         " WHERE partition_key = %s AND superseded_at IS NULL", (key,))
    return {r[0]: r[1:] for r in rows}


def _set_schema_version(phase: Any, version: int) -> None:
    """A bump as a developer makes it: the phase's version, and its summary model at that version
    (here the same model, as for a bump that changes a table but not the summary)."""
    from assets.summaries import SUMMARIES

    latest = max(v for name, v in SUMMARIES if name == phase.name)
    SUMMARIES.setdefault((phase.name, version), SUMMARIES[(phase.name, latest)])
    object.__setattr__(phase, "schema_version", version)  # frozen dataclass, shared by every module


def test_schema_version_bump_recomputes_that_phase_and_later_ones(sl_env: dict[str, str], pg_dsn: str) -> None:
    from assets import correlate as correlate_mod
    from assets.phases import BY_NAME, CORRELATE
    from assets.schemas import SCHEMAS
    from tests.helpers import KEY, materialize

    assert correlate_mod.CORRELATE is CORRELATE is BY_NAME["correlate"]
    first = materialize(KEY)
    assert first.success
    assert _outcomes(first) == dict.fromkeys(PHASE_NAMES, "COMPLETED")
    v1 = _heads(pg_dsn, KEY)
    lake_v1 = lake_snapshot(sl_env, [KEY])
    original = CORRELATE.schema_version
    try:
        _set_schema_version(CORRELATE, original + 1)
        bumped = materialize(KEY)
        assert bumped.success
        assert _outcomes(bumped) == {"ingest": "SKIPPED", "enrich": "SKIPPED", "correlate": "COMPLETED",
                                     "present": "COMPLETED"}, "a schema bump recomputes the phase and later ones"
        v2 = _heads(pg_dsn, KEY)
        assert v2["correlate"][1] == original + 1, v2
        assert v2["present"][1] == v1["present"][1]
        for phase in ("ingest", "enrich"):
            assert v2[phase] == v1[phase], phase
        for phase in ("correlate", "present"):
            assert v2[phase][0] > v1[phase][0], phase
        again = materialize(KEY)
        assert _outcomes(again) == dict.fromkeys(PHASE_NAMES, "SKIPPED")
    finally:
        _set_schema_version(CORRELATE, original)

    reverted = materialize(KEY)
    assert reverted.success
    assert _outcomes(reverted) == {"ingest": "SKIPPED", "enrich": "SKIPPED", "correlate": "COMPLETED",
                                   "present": "COMPLETED"}
    v3 = _heads(pg_dsn, KEY)
    assert v3["correlate"][1] == original
    for phase in PHASE_NAMES:
        assert v3[phase][2] == v1[phase][2], f"{phase}: reverting did not restore the state"
    lake_v3 = lake_snapshot(sl_env, [KEY])
    import pandas as pd

    for table in SCHEMAS:
        pd.testing.assert_frame_equal(lake_v3[(table, KEY)], lake_v1[(table, KEY)], obj=table)
    check_ledger_clean(pg_dsn)


def test_a_partial_selection_after_a_schema_bump_names_the_phase_to_run_first(sl_env: dict[str, str],
                                                                             pg_dsn: str) -> None:
    """Materializing only present after correlate's schema changed must not compute on old-shape tables."""
    from assets.phases import CORRELATE, PRESENT, table_keys
    from tests.helpers import KEY, materialize, table_versions

    assert materialize(KEY).success
    v1 = _heads(pg_dsn, KEY)
    original = CORRELATE.schema_version
    try:
        _set_schema_version(CORRELATE, original + 1)
        lake_before = table_versions(sl_env["STORMLAKE_HOME"] + "/lake")
        only_present = materialize(KEY, selection=table_keys(PRESENT))
        assert not only_present.success
        failure = next(e for e in only_present.all_events if e.is_step_failure)
        message = failure.step_failure_data.user_failure_data.description
        assert "\n" not in message, message
        assert "needs correlate at schema version 2" in message and "schema version 1" in message, message
        assert f"run correlate first (materialize its tables {', '.join(CORRELATE.tables)} with" in message, message
        assert _heads(pg_dsn, KEY)["present"][0] == v1["present"][0], "present was recomputed on outdated input"
        assert table_versions(sl_env["STORMLAKE_HOME"] + "/lake") == lake_before, "something was written"

        # Running correlate first, as the message says, makes the same selection work.
        assert materialize(KEY, selection=table_keys(CORRELATE)).success
        again = materialize(KEY, selection=table_keys(PRESENT))
        assert again.success
        assert _outcomes(again)["present"] == "COMPLETED"
    finally:
        _set_schema_version(CORRELATE, original)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_inputs_going_a_b_a_leave_every_consumer_on_a(where: str, pg_dsn: str, sample_landing: Path, tmp_path: Path,
                                                      request: pytest.FixtureRequest,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A's artifact ids were delivered before B's; going back to A delivers A again as the current revision.

    With ``s3`` the landing zone, the lake and the published files are on a local S3 endpoint."""
    import hashlib

    from resources.storage import open_storage
    from tests.s3 import files_on

    one = ("backfill", "--regions", "gulf_coast", "--days", "2026-09-01..2026-09-01")
    with Consumer() as consumer:
        env = make_home(tmp_path, sample_landing, pg_dsn, webhook=consumer.url,
                        **files_on(where, request, monkeypatch, sample_landing))
        home = Path(env["STORMLAKE_HOME"])
        landing = open_storage(env.get("STORMLAKE_LANDING") or home / "landing")
        published = open_storage(env.get("STORMLAKE_PUBLISH_DIR") or home / "published")
        outages = "gulf_coast/2026-09-01/outages.csv"
        original = landing.read(outages)
        assert run(env, *one).returncode == 0
        a_ids = check_consumer(consumer.snapshot(), partitions=[LATE])
        a_bytes = {slot: published.read(slot) for slot in a_ids}

        add_outages(landing.location, "gulf_coast", "2026-09-01", n=3)
        assert run(env, *one).returncode == 0
        n_b = len(consumer.snapshot())
        b_ids = {p.key.split("@")[0]: p.key for p in consumer.snapshot()[len(a_ids):]}
        changed = set(b_ids)
        assert {"gulf_coast/2026-09-01/summary.json", "gulf_coast/2026-09-01/report.html"} <= changed, b_ids

        landing.put(outages, original)  # back to A
        back = run(env, *one)
        assert back.returncode == 0, str(back)
        again = consumer.snapshot()[n_b:]
        assert sorted(p.key.split("@")[0] for p in again) == sorted(changed), [p.key for p in again]
        for p in again:
            check_headers(p)
            slot = p.key.split("@")[0]
            assert p.headers["x-stormlake-artifact-id"] == a_ids[slot], p.headers
            assert p.key == f"{a_ids[slot]}#2", "a revision that became current again needs a key of its own"
            assert p.headers.get("x-stormlake-supersedes") == b_ids[slot], p.headers
            assert p.answer == 200, p.as_dict()
        # every consumer ends on the ledger's current revision: A's bytes
        for slot, artifact_id in a_ids.items():
            data = published.read(slot)
            assert data == a_bytes[slot], f"the {published.kind} target of {slot} does not end on A"
            assert hashlib.sha256(data).hexdigest()[:16] == artifact_id.rsplit("@", 1)[1]
            last = [p for p in consumer.snapshot() if p.kind == slot.rsplit("/", 1)[1]][-1]
            assert last.headers["x-stormlake-artifact-id"] == artifact_id, (slot, last.as_dict())
        present = sql_rows(pg_dsn, "SELECT summary->'artifacts' FROM checkpoints WHERE partition_key = %s"
                                   " AND phase = 'present' AND superseded_at IS NULL", (LATE,))[0][0]
        assert sorted(present) == sorted(a_ids.values())
        deliveries = status(env)[LATE]["deliveries"]
        for slot in changed:
            latest = [d for d in deliveries if d["artifact_id"].startswith(slot + "@")][-2:]
            assert sorted(d["target"] for d in latest) == sorted([published.kind, "webhook"]), latest
            for d in latest:
                assert d["status"] == "DELIVERED" and d["idempotency_key"] == f"{a_ids[slot]}#2", d
        check_ledger_clean(pg_dsn)

        # and a fourth run delivers nothing at all
        assert run(env, *one).returncode == 0
        assert len(consumer.snapshot()) == n_b + len(again)
