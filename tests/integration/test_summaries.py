"""The checkpoint's summary is a contract (assets/summaries.py): refused at emission, checked at read."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from assets import correlate, enrich, ingest, present
from assets.context import PartitionRef, PhaseContext, PhaseOutput
from assets.phases import CORRELATE, ENRICH, INGEST, PHASES, PRESENT
from assets.summaries import EVENT_DETAILS, SUMMARIES, detail_problem, summary_problem
from pipeline.preflight import light_runner
from resources.errors import StormlakeError, SummaryInvalid, SummaryRefused
from resources.ledger import Ledger
from resources.settings import load_settings
from tests.helpers import KEY, lake, latest_version

COMPUTE = {"ingest": (ingest.compute, ingest.grade), "enrich": (enrich.compute, enrich.grade),
           "correlate": (correlate.compute, correlate.grade), "present": (present.compute, present.grade)}


def runner(**kw):
    r = light_runner(load_settings())
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def part(r, key: str = KEY) -> PartitionRef:
    return PartitionRef.parse(key, r.regions)


def run_phases(r, phases, key: str = KEY) -> None:
    for phase in phases:
        compute, grade = COMPUTE[phase.name]
        r.run(phase, part(r, key), compute, grade)


def corrupt(dsn: str, key: str, phase: str, statement: str) -> int:
    """Change a COMPLETED head's stored summary as only the table's owner can (the guard trigger
    off for the statement); its seq."""
    with psycopg.connect(dsn, autocommit=False) as conn:
        conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER checkpoints_guard")
        (seq,) = conn.execute(
            f"UPDATE checkpoints SET summary = {statement} WHERE partition_key = %s AND phase = %s"
            " AND superseded_at IS NULL AND status = 'COMPLETED' RETURNING seq", (key, phase)).fetchone()
        conn.execute("ALTER TABLE checkpoints ENABLE TRIGGER checkpoints_guard")
        conn.commit()
    return seq


def test_every_phase_declares_its_summary_at_its_schema_version() -> None:
    for phase in PHASES:
        assert (phase.name, phase.schema_version) in SUMMARIES, phase.name
    assert set(EVENT_DETAILS) == {"PENDING", "COMPLETED", "FAILED", "SKIPPED"}


def test_the_summaries_and_event_details_the_pipeline_commits_read(sl_env: dict[str, str], ledger: Ledger) -> None:
    run_phases(runner(), PHASES)
    heads = ledger.heads([KEY])
    assert [cp.phase for cp in heads] and all(cp.status == "COMPLETED" for cp in heads)
    for cp in heads:
        assert summary_problem(cp.phase, cp.schema_version, cp.summary) is None, cp.phase
    with psycopg.connect(sl_env["STORMLAKE_PG_DSN"]) as conn:
        events = conn.execute("SELECT status, detail FROM checkpoint_events WHERE partition_key = %s", (KEY,)).fetchall()
    assert {s for s, _ in events} >= {"PENDING", "COMPLETED"}
    for status, detail in events:
        assert detail_problem(status, detail) is None, (status, detail)


def test_a_phase_whose_figures_break_its_model_fails_before_anything_is_written(sl_env: dict[str, str],
                                                                              ledger: Ledger) -> None:
    def bad(ctx: PhaseContext) -> PhaseOutput:
        out = ingest.compute(ctx)
        out.figures["outages"] = "many"
        return out

    r = runner()
    with pytest.raises(SummaryRefused) as err:
        r.run(INGEST, part(r), bad, ingest.grade)
    line = str(err.value)
    assert "\n" not in line
    assert "ingest of 2026-09-01|gulf_coast" in line and "'figures.outages'" in line, line
    (head,) = ledger.heads([KEY])
    assert head.status == "FAILED" and head.error_class == "SummaryRefused"
    assert latest_version(lake(load_settings().lake), "outages_raw") is None  # nothing written


def test_a_summary_that_breaks_its_model_is_refused_and_nothing_is_committed(sl_env: dict[str, str],
                                                                           ledger: Ledger) -> None:
    def bad(ctx: PhaseContext) -> PhaseOutput:
        out = ingest.compute(ctx)
        out.hold = {"grade": "noisy"}  # a hold has a quality and its reasons
        return out

    r = runner()
    with pytest.raises(SummaryRefused) as err:
        r.run(INGEST, part(r), bad, ingest.grade)
    line = str(err.value)
    assert "ingest of 2026-09-01|gulf_coast" in line and "'held." in line, line
    (head,) = ledger.heads([KEY])
    assert head.status == "FAILED" and head.summary == {}
    assert ledger.receipts(partition_key=KEY) == []
    # The same partition computes and commits once the phase is right.
    run_phases(r, [INGEST])
    assert ledger.heads([KEY])[0].status == "COMPLETED"


def test_a_corrupt_stored_summary_stops_the_next_phase_of_its_partition_alone(sl_env: dict[str, str],
                                                                            ledger: Ledger) -> None:
    other = "2026-09-01|pine_belt"
    r = runner()
    for key in (KEY, other):
        run_phases(r, [INGEST, ENRICH, CORRELATE], key)
    seq = corrupt(sl_env["STORMLAKE_PG_DSN"], KEY, "ingest", "summary #- '{figures,files}'")
    results = dict(r.run_range(PRESENT, [part(r, KEY), part(r, other)], present.compute, present.grade))
    err = results[KEY]
    assert isinstance(err, SummaryInvalid), err
    line = str(err)
    assert "\n" not in line
    for words in ("ingest of 2026-09-01|gulf_coast", f"seq {seq}", "'figures.files'",
                  "stormlake backfill --regions gulf_coast --days 2026-09-01..2026-09-01 --from ingest"):
        assert words in line, (words, line)
    assert err.exit_code == 1
    assert not isinstance(results[other], StormlakeError) and results[other].status == "COMPLETED"
    # The run the message names replaces the checkpoint; the partition then publishes.
    from assets.runner import Force

    forced = runner(force=Force("ingest", "invalid summary", "test", "f1"))
    run_phases(forced, PHASES)
    heads = {cp.phase: cp for cp in ledger.heads([KEY])}
    assert heads["present"].status == "COMPLETED" and heads["ingest"].seq != seq
    assert summary_problem("ingest", 1, heads["ingest"].summary) is None


def test_an_older_schema_version_without_a_model_is_reported_with_the_rerun(sl_env: dict[str, str],
                                                                            ledger: Ledger) -> None:
    r = runner()
    run_phases(r, [INGEST, ENRICH])
    with psycopg.connect(sl_env["STORMLAKE_PG_DSN"], autocommit=False) as conn:
        conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER checkpoints_guard")
        conn.execute("UPDATE checkpoints SET schema_version = 0 WHERE phase = 'ingest'")
        conn.execute("ALTER TABLE checkpoints ENABLE TRIGGER checkpoints_guard")
        conn.commit()
    cp = {c.phase: c for c in ledger.heads([KEY])}["ingest"]
    problem = summary_problem("ingest", 0, cp.summary)
    assert problem is not None and "no longer read" in problem[1]


def test_read_summary_names_partition_phase_seq_and_field(tmp_path: Path) -> None:
    from assets.summaries import read_summary

    class Cp:
        partition_key, phase, status, schema_version, seq = KEY, "enrich", "COMPLETED", 1, 42
        summary = {"rows": {"outages_enriched": -1}}

    with pytest.raises(SummaryInvalid) as err:
        read_summary(Cp())
    assert (err.value.partition_key, err.value.phase, err.value.seq, err.value.field) == (
        KEY, "enrich", 42, "rows.outages_enriched")


def test_a_head_of_another_code_version_whose_summary_does_not_read_is_computed_again(sl_env: dict[str, str],
                                                                                      ledger: Ledger) -> None:
    r = runner()
    run_phases(r, [INGEST])
    with psycopg.connect(sl_env["STORMLAKE_PG_DSN"]) as conn:
        conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER checkpoints_guard")
        # What an older code version committed: another input hash, and a summary of another shape.
        conn.execute("UPDATE checkpoints SET code_version = '0', summary = summary - 'rows', input_hash = 'older',"
                     " idempotency_key = encode(sha256(convert_to(partition_key || '|' || phase || '|older', 'UTF8')),"
                     " 'hex') WHERE phase = 'ingest'")
        conn.execute("ALTER TABLE checkpoints ENABLE TRIGGER checkpoints_guard")
    outcome = r.run(INGEST, part(r), ingest.compute, ingest.grade)  # the version changed: it computes anyway
    assert outcome.status == "COMPLETED" and outcome.checkpoint.code_version == INGEST.code_version
    with pytest.raises(SummaryInvalid):  # the same version's head that does not read stops the phase
        corrupt(sl_env["STORMLAKE_PG_DSN"], KEY, "ingest", "summary - 'rows'")
        r.run(INGEST, part(r), ingest.compute, ingest.grade)


def test_a_schema_version_without_a_summary_model_is_refused_with_where_to_declare_it() -> None:
    from assets.summaries import check_summary

    with pytest.raises(SummaryRefused, match=r"schema version 9 declares no summary model.*assets/summaries.py"):
        check_summary("correlate", 9, {}, partition_key=KEY)
