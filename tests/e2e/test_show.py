"""`stormlake show` and the checkpoint's summaries read back, through the real CLI.

A stored summary that does not match its phase's model (assets/summaries.py) fails a resumed
backfill's run with an error naming the partition, the phase, the seq and the field, with the
command that replaces it (the CLI names the partition and that run in one line), and `show`
reports it in one line; the other partitions do not fail. `show` obeys the read policy.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from tests.consumer import check_one_line_error, make_home, run, sql_rows, status

pytestmark = pytest.mark.e2e

KEY, OTHER = "2026-09-01|gulf_coast", "2026-09-01|pine_belt"
ARGS = ("backfill", "--regions", "gulf_coast,pine_belt", "--days", "2026-09-01..2026-09-01")


def corrupt_ingest_summary(dsn: str, key: str) -> int:
    """Drop the ingest head's ``figures.files`` as the tables' owner can (the guard trigger off
    for the change); the checkpoint's seq."""
    with psycopg.connect(dsn) as conn:
        conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER checkpoints_guard")
        (seq,) = conn.execute(
            "UPDATE checkpoints SET summary = summary #- '{figures,files}' WHERE partition_key = %s"
            " AND phase = 'ingest' AND superseded_at IS NULL RETURNING seq", (key,)).fetchone()
        conn.execute("ALTER TABLE checkpoints ENABLE TRIGGER checkpoints_guard")
    return seq


def test_a_corrupt_stored_summary_is_reported_by_a_resume_and_by_show_then_replaced(
        pg_dsn: str, sample_landing: Path, tmp_path: Path) -> None:
    env = make_home(tmp_path, sample_landing, pg_dsn)
    first = run(env, *ARGS, faults="present.after_lease=raise")
    assert first.returncode == 1, str(first)
    seq = corrupt_ingest_summary(pg_dsn, KEY)

    resumed = run(env, *ARGS)
    assert resumed.returncode == 1, str(resumed)
    assert "Traceback" not in resumed.stderr + resumed.stdout
    # The summary is read before the phase records an attempt, so the ledger has no line of it:
    # the CLI says in one line which partition failed and which run's log has the error.
    failed = [ln for ln in resumed.stderr.splitlines() if ln.startswith(f"stormlake: {KEY} failed:")]
    assert len(failed) == 1, str(resumed)
    found = re.search(r"run (\S+) of backfill \S+ failed", failed[0])
    assert found and "Dagster UI" in failed[0], failed[0]
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        errors = [e.dagster_event.step_failure_data.error.message
                  for e in instance.all_logs(found.group(1), of_type=dg.DagsterEventType.STEP_FAILURE)]
    lines = [ln for m in errors for ln in m.splitlines() if "its stored summary" in ln]
    assert lines, errors
    for ln in lines:
        for words in (KEY, "ingest", f"seq {seq}", "'figures.files'", "--from ingest"):
            assert words in ln, (words, ln)
    final = status(env)
    # the other partition is not failed by it: done, or named as stopped between phases (the
    # outbox sensor continues it)
    assert final[OTHER]["tier"] == 4 or any("stopped between phases" in ln and OTHER in ln
                                             for ln in resumed.stderr.splitlines()), str(resumed)
    assert final[KEY]["phases"]["present"]["status"] == "FAILED"

    shown = run(env, "show", KEY, "--role", "admin")
    assert shown.returncode == 1, str(shown)
    line = check_one_line_error(shown.stderr, must_mention=(KEY, "ingest", f"seq {seq}", "'figures.files'"))
    assert "SummaryInvalid" in line
    assert "checkpoint seq" in shown.stdout  # the rest of the history is shown all the same

    command = re.search(r"run `(stormlake [^`]+)`", line).group(1)
    fixed = run(env, *shlex.split(command)[1:])
    assert fixed.returncode == 0, str(fixed)
    assert status(env)[KEY]["tier"] == 4
    again = run(env, "show", KEY, "--role", "admin", "--json")
    assert again.returncode == 0, str(again)
    rec = json.loads(again.stdout)
    ingest = rec["phases"]["ingest"]
    assert [c["seq"] for c in ingest][0] == seq and ingest[0]["superseded_at"] is not None
    assert "figures.files" in ingest[0]["summary_problem"]
    assert ingest[-1]["why"] == "forced re-run from ingest by " + ingest[-1]["why"].split(" by ", 1)[1]
    assert ingest[-1]["why"].endswith(": invalid summary")


def test_show_gives_every_attempt_delivery_action_and_read_and_obeys_the_read_policy(
        pg_dsn: str, sample_landing: Path, tmp_path: Path) -> None:
    env = make_home(tmp_path, sample_landing, pg_dsn)
    one = ("backfill", "--regions", "gulf_coast", "--days", "2026-09-01..2026-09-01")
    killed = run(env, *one, faults="correlate.mid_transform=raise")
    assert killed.returncode == 1, str(killed)
    assert run(env, *one).returncode == 0
    forced = run(env, *one, "--from", "present", "--reason", "check the report")
    assert forced.returncode == 0, str(forced)

    admin = run(env, "show", KEY, "--role", "admin", "--json")
    assert admin.returncode == 0 and admin.stderr.strip() == "", str(admin)
    rec = json.loads(admin.stdout)
    assert list(rec["phases"]) == ["ingest", "enrich", "correlate", "present"] and rec["hidden_phases"] == []
    (correlate,) = rec["phases"]["correlate"]
    assert [(a["attempt"], a["status"]) for a in correlate["attempts"]] == [(1, "FAILED"), (2, "COMPLETED")]
    assert correlate["attempts"][0]["error"].startswith("InjectedFault")
    assert correlate["attempts"][1]["duration_s"] is not None
    assert correlate["delta_versions"] and correlate["calls"][0]["kind"] == "delta_commit"
    present = rec["phases"]["present"]
    assert len(present) == 2 and present[0]["superseded_at"] and present[0]["why"] == "first run"
    assert present[1]["why"].endswith("check the report") and present[1]["quality"]
    assert {d["kind"] for d in rec["deliveries"]} == {"summary.json", "clusters.geojson", "report.html"}
    assert all(d["status"] == "DELIVERED" and d["receipt"] for d in rec["deliveries"])
    assert [a["action"] for a in rec["actions"]] == ["force"]
    assert {r["what"] for r in rec["reads"]} >= {"checkpoints", "events", "calls", "receipts", "actions"}

    reader = run(env, "show", KEY, "--role", "compliance_auditor", "--json")
    assert reader.returncode == 0, str(reader)
    check_one_line_error(reader.stderr, must_mention=("compliance_auditor", "ingest, enrich, correlate"))
    seen = json.loads(reader.stdout)
    assert list(seen["phases"]) == ["present"]
    assert seen["hidden_phases"] == ["ingest", "enrich", "correlate"]
    assert len(seen["deliveries"]) == 3
    assert all(set(r["allowed"]) <= {"present"} and not r["denied"] for r in seen["reads"])
    logged = sql_rows(pg_dsn, "SELECT DISTINCT phase, allowed FROM checkpoint_access_log"
                              " WHERE role = 'compliance_auditor' AND partition_key = %s", (KEY,))
    assert set(logged) == {("ingest", False), ("enrich", False), ("correlate", False), ("present", True)}

    ops = run(env, "show", KEY, "--role", "ops_reader")  # correlate and present, as text
    assert ops.returncode == 0, str(ops)
    assert "ingest" not in ops.stdout.split("deliveries")[0].replace(KEY, "")
    assert "correlate\n" in ops.stdout and "forced re-run from present" in ops.stdout

    page = tmp_path / "show.html"
    drawn = run(env, "show", KEY, "--role", "admin", "--html", str(page))
    assert drawn.returncode == 0, str(drawn)
    text = page.read_text()
    assert "<svg" in text and "<rect" in text and "check the report" in text

    with psycopg.connect(pg_dsn) as conn:  # an event whose detail is not of its status's shape
        (event,) = conn.execute("UPDATE checkpoint_events SET detail = '{\"state\": 1}' WHERE event_id ="
                                " (SELECT min(event_id) FROM checkpoint_events WHERE status = 'COMPLETED'"
                                " AND phase = 'present') RETURNING event_id").fetchone()
    odd = run(env, "show", KEY, "--role", "admin")
    assert odd.returncode == 1, str(odd)
    check_one_line_error(odd.stderr, must_mention=("EventDetailInvalid", f"event {event}", "'state_hash'"))

    bad = run(env, "show", "not-a-key")
    assert bad.returncode == 2
    check_one_line_error(bad.stderr, must_mention=("not-a-key",))
