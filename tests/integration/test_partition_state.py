"""partition_state, the per-partition view the database keeps current (migration 004), and the
status views that read it: filters, the summary of a large ledger, the streamed JSON."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import psycopg
import pytest

from assets.phases import PHASES, TIER_LABELS
from pipeline.status import partition_status, render_table, views, write_json
from resources import ledger_views
from resources.landing import utc_today
from resources.ledger import Checkpoint, Ledger
from resources.ledger_views import StatusFilter

NAMES = [p.name for p in PHASES]


def expected_state(dsn: str) -> dict[str, dict[str, Any]]:
    """Each partition computed from scratch from the checkpoints and receipts, as contract section 8 says."""
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        heads = cur.execute("SELECT * FROM checkpoints WHERE superseded_at IS NULL").fetchall()
        receipts = cur.execute("SELECT * FROM receipts ORDER BY receipt_id").fetchall()
    today = utc_today()
    by_key: dict[str, dict[str, dict[str, Any]]] = {}
    for h in heads:
        by_key.setdefault(h["partition_key"], {})[h["phase"]] = h
    out = {}
    for key, hs in by_key.items():
        tier = 0
        for phase in PHASES:
            h = hs.get(phase.name)
            if h is None or h["status"] != "COMPLETED" or "held" in (h["summary"] or {}):
                break
            upstream = (h["summary"] or {}).get("upstream", {})
            if any(name not in hs or hs[name]["state_hash"] != v for name, v in upstream.items()):
                break
            tier = phase.tier
        phases = {}
        for name, h in hs.items():
            entry = {"status": h["status"], "seq": h["seq"], "attempts": h["attempt"], "input_hash": h["input_hash"],
                     "state_hash": h["state_hash"], "schema_version": h["schema_version"],
                     "delta_versions": (h["summary"] or {}).get("delta_versions", {})}
            if h["status"] == "FAILED":
                entry["error"] = f"{h['error_class']}: {h['error_message']}"
                entry["failures"] = h["failures"]
            if h["status"] == "COMPLETED" and "held" in (h["summary"] or {}):
                entry["held"] = True
            phases[name] = entry
        deliveries = []
        for r in receipts:
            if r["partition_key"] != key:
                continue
            d = {"artifact_id": r["artifact_id"], "target": r["target"], "status": r["status"],
                 "content_hash": r["content_hash"]}
            if r["supersedes"]:
                d["supersedes"] = r["supersedes"]
            if r["generation"] > 1:
                d["idempotency_key"] = r["idempotency_key"]
            deliveries.append(d)
        day, _, region = key.partition("|")
        artifact_ids: dict[tuple[str, str], set[str]] = {}
        for r in receipts:
            if r["partition_key"] == key:
                artifact_ids.setdefault((r["kind"], r["target"]), set()).add(r["artifact_id"])
        held = any(e.get("held") for e in phases.values())
        present = hs.get("present")
        quality = ((present["summary"] or {}).get("figures", {}).get("quality", {}).get("grade")
                   if present is not None else None)
        out[key] = {"region": region, "day": day, "tier": tier,
                    "tier_label": "held_for_review" if held and tier == 3 else TIER_LABELS[tier],
                    "phases": phases, "deliveries": deliveries, "signal_quality": quality, "held": held,
                    "dead_lettered": sorted(n for n, e in phases.items() if e.get("failures", 0) >= 3),
                    "revisions": max(map(len, artifact_ids.values()), default=0), "open": day == today}
    return out


def _claim(ledger: Ledger, key: str, phase: str, input_hash: str):
    day, _, region = key.partition("|")
    d = ledger.claim(partition_key=key, region_id=region, day=day, phase=phase, input_hash=input_hash,
                      schema_version=1, code_version="1", run_id="r")
    return d


def _complete(ledger: Ledger, key: str, phase: str, input_hash: str, upstream: dict[str, str]) -> Checkpoint | None:
    d = _claim(ledger, key, phase, input_hash)
    if d.skip:
        return d.head
    tier = NAMES.index(phase) + 1
    summary: dict[str, Any] = {"upstream": upstream, "delta_versions": {f"{phase}_table": tier}}
    if phase == "present":  # input "c" is a noisy batch: graded so and held
        grade = "noisy" if input_hash.startswith("c") else "high"
        summary["figures"] = {"quality": {"grade": grade}}
        if grade == "noisy":
            summary["held"] = {"quality": grade, "reasons": ["planted"]}
    return ledger.complete(d.claim, state_hash=f"s:{key}:{phase}:{input_hash}", tier=tier,
                           tier_label=TIER_LABELS[tier], run_id="r", summary=summary)


def test_the_phase_order_of_the_schema_is_the_pipelines(ledger: Ledger) -> None:
    assert views(ledger).phase_order() == [(p.name, p.tier, p.tier_label) for p in PHASES]


def test_partition_state_follows_every_change(ledger: Ledger, pg_dsn: str) -> None:
    """Random claims, completions, failures, new input hashes and receipts: after each, the kept
    state equals the one computed from scratch."""
    rng = random.Random(5)
    keys = [f"2026-09-0{d}|{r}" for d in (1, 2) for r in ("gulf_coast", "pine_belt")]
    inputs = {k: "c" if k == keys[0] else "a" for k in keys}
    seen_held = False
    for step in range(60):
        key = rng.choice(keys)
        heads = {cp.phase: cp for cp in ledger.heads([key])}
        action = rng.random()
        if action < 0.1:
            inputs[key] = rng.choice("abc")  # new landing data: ingest reruns on another input hash
        upstream: dict[str, str] = {}
        for phase in NAMES:
            head = heads.get(phase)
            ih = inputs[key] + "".join(upstream.values())
            if head is not None and head.status == "COMPLETED" and head.input_hash == ih:
                upstream[phase] = head.state_hash or ""
                continue
            if action < 0.3:
                d = _claim(ledger, key, phase, ih)
                if d.claim is not None and rng.random() < 0.5:
                    ledger.fail(d.claim, error_class="GraderError", error_message=f"step {step}", run_id="r")
                break
            cp = _complete(ledger, key, phase, ih, dict(upstream))
            assert cp is not None
            upstream[phase] = cp.state_hash or ""
            if phase == "present":
                for target in ("file", "webhook"):
                    rec = ledger.prepare_receipt(
                        artifact_id=f"{key.split('|')[1]}/{key.split('|')[0]}/summary.json@{ih[:1] * 16}",
                        target=target, partition_key=key, region_id=key.split("|")[1], day=key.split("|")[0],
                        kind="summary.json", content_hash=ih[:1] * 64, size_bytes=1, target_ref="x",
                        checkpoint_id=cp.id)
                    if rec.status == "PENDING" and rng.random() < 0.8:
                        ledger.mark_delivered(rec, {"ok": True})
            break
        want = expected_state(pg_dsn)
        got = {f"{p['day']}|{p['region']}": p for p in partition_status(ledger)}
        assert got == want, f"after step {step}"
        seen_held = seen_held or any(p["held"] and p["tier_label"] == "held_for_review" for p in got.values())
    assert {p["tier"] for p in partition_status(ledger)} - {0}, "the walk never got anywhere"
    assert seen_held, "the walk never held a batch"


@pytest.fixture
def year(ledger: Ledger, pg_dsn: str) -> Ledger:
    """80 partitions (20 days x 4 regions) written in SQL, with failures and pending phases."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            """
            WITH parts AS (
                SELECT 'r' || r AS region_id, to_char(date '2026-09-01' + d, 'YYYY-MM-DD') AS day, r, d
                FROM generate_series(1, 4) r, generate_series(0, 19) d
            )
            INSERT INTO checkpoints (partition_key, region_id, day, phase, input_hash, idempotency_key, status,
                                     state_hash, schema_version, code_version, first_seq, seq, attempt, tier,
                                     tier_label, run_id, error_class, error_message, summary, failures)
            SELECT day || '|' || region_id, region_id, day, o.phase, 'h',
                   encode(sha256(convert_to(day || '|' || region_id || '|' || o.phase || '|h', 'UTF8')), 'hex'),
                   CASE WHEN (r + d) % 9 = 0 AND o.position = 3 THEN 'FAILED' ELSE 'COMPLETED' END,
                   's-' || o.phase, 1, '1', 1, 1, 1, o.position, o.tier_label, 'run',
                   CASE WHEN (r + d) % 9 = 0 AND o.position = 3 THEN 'GraderError' END,
                   CASE WHEN (r + d) % 9 = 0 AND o.position = 3 THEN 'risk "out" of range: ±5 °C' END, '{}',
                   CASE WHEN (r + d) % 9 = 0 AND o.position = 3 THEN 1 + r % 4 ELSE 0 END
            FROM parts, phase_order o
            WHERE NOT ((r + d) % 9 = 0 AND o.position = 4)
            """
        )
    return ledger


def test_filters_select_what_they_say(year: Ledger) -> None:
    everything = partition_status(year)
    assert len(everything) == 80
    failed = [p for p in everything if any(e["status"] == "FAILED" for e in p["phases"].values())]
    assert failed and all(p["tier"] == 2 for p in failed)
    assert partition_status(year, StatusFilter(failed=True)) == failed
    assert partition_status(year, StatusFilter(tier=4)) == [p for p in everything if p["tier"] == 4]
    window = partition_status(year, StatusFilter(regions=("r2", "r3"), days=("2026-09-05", "2026-09-07")))
    assert [(p["day"], p["region"]) for p in window] == [
        (f"2026-09-0{d}", r) for d in (5, 6, 7) for r in ("r2", "r3")]
    assert partition_status(year, StatusFilter(limit=3)) == everything[:3]


def _present(ledger: Ledger, key: str, input_hashes: str) -> None:
    """Run every phase of ``key`` once per input hash, each run delivering its summary to the file
    target: a revision for each input that superseded the one before."""
    region, day = key.split("|")[1], key.split("|")[0]
    for ih in input_hashes:
        upstream: dict[str, str] = {}
        for phase in NAMES:
            cp = _complete(ledger, key, phase, ih, dict(upstream))
            assert cp is not None
            upstream[phase] = cp.state_hash or ""
        rec = ledger.prepare_receipt(
            artifact_id=f"{region}/{day}/summary.json@{ih * 16}", target="file", partition_key=key,
            region_id=region, day=day, kind="summary.json", content_hash=ih * 64, size_bytes=1, target_ref="x",
            checkpoint_id=cp.id)
        ledger.mark_delivered(rec, {"ok": True})


def test_json_is_streamed_in_the_contracts_shape(year: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    today = utc_today()
    _present(year, "2026-09-02|r1", "ab")  # revised once: two revisions
    _present(year, f"{today}|r1", "a")  # the day in progress
    buf = io.StringIO()
    n = write_json(year, buf, StatusFilter())
    doc = json.loads(buf.getvalue())
    assert n == 81 and doc == {"partitions": partition_status(year), "open_days": [today]}
    # How many revisions each partition has had, and which is open, as the table says.
    got = {f"{p['day']}|{p['region']}": (p["revisions"], p["open"]) for p in doc["partitions"]}
    assert got.pop("2026-09-02|r1") == (2, False) and got.pop(f"{today}|r1") == (1, True)
    assert set(got.values()) == {(0, False)}
    table = {line.split()[0] + "|" + line.split()[1]: line.split()[-2] for line in render_table(
        year, StatusFilter(regions=("r1",)), filtered=True) if line[:4].isdigit()}
    assert (table["2026-09-02|r1"], table[f"{today}|r1"], table["2026-09-03|r1"]) == ("2", "1", "0")
    # --days leaves the open day out: none of its partitions is open, and no day is.
    closed = io.StringIO()
    assert write_json(year, closed, StatusFilter(days=("2026-09-01", "2026-09-20"))) == 80
    assert json.loads(closed.getvalue())["open_days"] == []
    # Each object is the text PostgreSQL prints for it as jsonb: its key order, spacing and escapes.
    texts = list(views(year).stream_status_json(StatusFilter(), open_day=today))
    with psycopg.connect(year.dsn) as conn:
        printed = conn.execute("SELECT t::jsonb::text FROM unnest(%s::text[]) WITH ORDINALITY u(t, i) ORDER BY i",
                               (texts,)).fetchall()
    assert [p for (p,) in printed] == texts
    assert any('risk \\"out\\" of range: ±5 °C' in t for t in texts)
    # A reader that stops early (a closed pipe) cancels the query; the ledger's connections serve on.
    monkeypatch.setattr(ledger_views, "STREAM_BATCH", 7)  # so the query is still running when it stops
    for _ in range(5):  # more than the pool's connections
        stream = views(year).stream_status_json(StatusFilter())
        assert next(stream) == texts[0]
        stream.close()
    assert list(views(year).stream_status_json(StatusFilter(limit=2))) == texts[:2]
    empty = io.StringIO()
    assert write_json(year, empty, StatusFilter(regions=("nowhere",))) == 0
    assert json.loads(empty.getvalue()) == {"partitions": [], "open_days": [today]}


def test_the_dead_letters_counted_with_the_attention_list_are_the_ones_listed(year: Ledger) -> None:
    """A large ledger's status counts its dead letters with the attention list's read of the heads;
    the count is the number of phases review lists, at each limit."""
    v = views(year)
    for limit in (1, 2, 3, 4, 5):
        listed = v.dead_letters(limit)
        assert v.attention(3, dead_letter_after=limit).dead_letters == len(listed)
        last = list(render_table(year, dead_letter_after=limit))[-1]
        if listed:
            assert last == f"{len(listed)} dead-lettered phase(s) wait for a person: stormlake review", last
        else:
            assert "dead-lettered" not in last
    assert 0 < len(v.dead_letters(3)) < len(v.dead_letters(1))  # some partitions failed fewer times
    assert v.attention(3).dead_letters is None  # not asked for


def test_a_large_ledger_shows_a_summary_and_what_needs_attention(year: Ledger) -> None:
    lines = list(render_table(year))
    text = "\n".join(lines)
    assert len(lines) < 40, text
    assert lines[0].startswith("partitions by tier:") and "2 enriched 8" in lines[0], lines[0]
    assert "needing attention: 8" in text
    attention = [ln for ln in lines if "FAILED" in ln and "correlate" in ln]
    assert len(attention) == 8 and all('GraderError: risk "out" of range: ±5 °C' in ln for ln in attention)
    assert lines[-1] == "80 partitions; 72 published"
    # a filtered listing shows the partitions themselves
    listed = list(render_table(year, StatusFilter(failed=True), filtered=True))
    assert len([ln for ln in listed if ln[:4] == "2026"]) == 8 and listed[-1] == "8 partitions; 0 published"


def test_the_reports_counts_from_the_grid_equal_the_views_counts(year: Ledger) -> None:
    """The report counts its headline and per-region table from the grid it reads anyway."""
    import dataclasses

    from pipeline.report import _by_region, _counts
    from resources.ledger_views import StatusSummary

    v = views(year)
    grid = v.grid()
    assert _counts(grid) == v.summary()
    for region, cells in sorted(_by_region(grid).items()):
        counted = _counts(cells, region=region)
        as_summary = StatusSummary(**{f.name: getattr(counted, f.name) for f in dataclasses.fields(StatusSummary)})
        assert as_summary == v.summary(StatusFilter(regions=(region,)))


def test_the_status_command_takes_its_filters(year: Ledger, tmp_path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`stormlake status` passes --regions, --days START..END, --tier, --failed and --limit to the
    views; a bad value is one line naming the option, and nothing is read."""
    from pipeline.cli import main

    monkeypatch.setenv("STORMLAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STORMLAKE_PG_DSN", year.dsn)

    def status(*args: str) -> list[dict[str, Any]]:
        assert main(["status", "--json", "--role", "admin", *args]) == 0
        return json.loads(capsys.readouterr().out)["partitions"]

    window = status("--regions", "r2,r3", "--days", "2026-09-05..2026-09-07")
    assert [(p["day"], p["region"]) for p in window] == [(f"2026-09-0{d}", r) for d in (5, 6, 7) for r in ("r2", "r3")]
    failed = status("--failed")
    assert failed and all(any(e["status"] == "FAILED" for e in p["phases"].values()) for p in failed)
    assert status("--failed", "--limit", "2") == failed[:2]
    assert {p["tier"] for p in status("--tier", "4")} == {4}
    tier2 = len(status("--tier", "2"))
    assert main(["status", "--role", "admin", "--tier", "2", "--limit", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([ln for ln in lines if ln.startswith("2026-")]) == 3
    assert f"… {tier2 - 3} more (--limit N shows more)" in lines and f"{tier2} partitions; 0 published" in lines
    for bad, option in ((("--tier", "9"), "--tier"), (("--regions", "R-2"), "--regions"), (("--limit", "-1"), "--limit")):
        assert main(["status", *bad]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and option in err, err
