"""Unit tests of `stormlake report` (pipeline/report.py) against a real PostgreSQL ledger."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import markupsafe
import psycopg
import pytest

from assets.phases import PHASES
from pipeline.report import render_report_with_images, write_report
from resources.ledger import Ledger

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMG_RE = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
NASTY = '<script>alert("boom")</script> & rows > 0 were \'quarantined\''


def _claim(ledger: Ledger, key: str, phase: str, run_id: str, input_hash: str = "h1"):
    day, _, region = key.partition("|")
    d = ledger.claim(partition_key=key, region_id=region, day=day, phase=phase, input_hash=input_hash,
                      schema_version=1, code_version="1", run_id=run_id)
    assert d.claim is not None
    return d.claim


def _complete(ledger: Ledger, key: str, phase: str, run_id: str) -> None:
    p = next(p for p in PHASES if p.name == phase)
    claim = _claim(ledger, key, phase, run_id)
    ledger.complete(claim, state_hash=f"s-{key}-{phase}", summary={"upstream": {}}, tier=p.tier,
                    tier_label=p.tier_label, run_id=run_id)


def _deliver(ledger: Ledger, key: str, digest: str, target: str, *, delivered: bool = True) -> str:
    day, _, region = key.partition("|")
    artifact = f"{region}/{day}/summary.json@{digest}"
    rec = ledger.prepare_receipt(artifact_id=artifact, target=target, partition_key=key, region_id=region, day=day,
                                 kind="summary.json", content_hash=digest * 4, size_bytes=123,
                                 target_ref=f"published/{region}/{day}/summary.json", checkpoint_id=None)
    if delivered:
        ledger.mark_delivered(rec, {"ok": True})
    return artifact


def present_summary(**extra: Any) -> dict[str, Any]:
    """A present summary as the runner commits it (its model: assets/summaries.py)."""
    quality = {"grade": "noisy" if "held" in extra else "high", "measures": {}, "reasons": []}
    return {"rows": {"region_day_summary": 1}, "delta_versions": {"region_day_summary": 1}, "upstream": {},
            "figures": {"outages": 1, "expected_outages": 1, "customers_out": 5, "clusters": 0,
                        "expected_clusters": 0, "backlog": 0, "artifacts": {}, "quality": quality},
            "artifacts": [], "delivered": [], "receipts": 0, "checks": {"artifacts": True}, **extra}


@pytest.fixture
def populated(ledger: Ledger) -> Ledger:
    # gulf_coast 2026-09-01: published, delivered twice (a second revision supersedes the first)
    key = "2026-09-01|gulf_coast"
    for phase in ("ingest", "enrich", "correlate", "present"):
        _complete(ledger, key, phase, "run-aaa")
    _deliver(ledger, key, "0123456789abcdef", "file")
    _deliver(ledger, key, "0123456789abcdef", "webhook")
    _deliver(ledger, key, "fedcba9876543210", "file")
    _deliver(ledger, key, "fedcba9876543210", "webhook", delivered=False)  # still PENDING
    # pine_belt 2026-09-01: ingested, enrich failed twice with a message that needs escaping
    key = "2026-09-01|pine_belt"
    _complete(ledger, key, "ingest", "run-bbb")
    for run in ("run-bbb", "run-ccc"):
        claim = _claim(ledger, key, "enrich", run)
        assert ledger.fail(claim, error_class="QualityGateError", error_message=NASTY, run_id=run)
    # red_hills 2026-09-02: ingest claimed and still PENDING; gulf_coast 2026-09-02: correlated
    _claim(ledger, "2026-09-02|red_hills", "ingest", "run-ddd")
    for phase in ("ingest", "enrich", "correlate"):
        _complete(ledger, "2026-09-02|gulf_coast", phase, "run-eee")
    return ledger


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(b, validate=True) for b in IMG_RE.findall(page)]


def test_report_shows_where_every_batch_stands(populated: Ledger, tmp_path: Path) -> None:
    out = tmp_path / "nested" / "report.html"
    write_report(populated, out)
    assert out.is_file()
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # no temporary file left behind
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    for region in ("gulf_coast", "pine_belt", "red_hills"):
        assert region in page
    # the failed partition's error, escaped, with its class, attempts and last run id
    assert str(markupsafe.escape(NASTY)) in page
    assert "<script>" not in page and NASTY not in page
    attention = page[page.index('id="attention"'):page.index('id="regions"')]
    assert "QualityGateError" in attention and "run-ccc" in attention
    row = next(r for r in attention.split("<tr>") if "pine_belt" in r)
    assert "enrich" in row and "FAILED" in row and "<td class=num>2</td>" in row
    assert "red_hills" in attention and "PENDING" in attention
    assert "2026-09-01</td><td>gulf_coast" not in attention  # published, nothing to do
    # headline: 4 partitions, one per tier 0, 1, 3, 4; one failed phase; one pending receipt
    headline = page[page.index('id="headline"'):page.index('id="heatmap"')]
    assert re.search(r'partitions</div><div class="v">4<', headline)
    for tier, n in ((0, 1), (1, 1), (2, 0), (3, 1), (4, 1)):
        assert re.search(rf'tier {tier} [^<]*</div><div class="v">{n}<', headline), tier
    assert re.search(r'failed phases</div><div class="v">1<', headline)
    assert re.search(r'pending receipts</div><div class="v">1<', headline)
    assert "last activity" in headline and "UTC" in headline
    # deliveries: counts per target, and the later revision names the one it supersedes
    deliveries = page[page.index('id="deliveries"'):page.index('id="activity"')]
    assert "gulf_coast/2026-09-01/summary.json@fedcba9876543210" in deliveries
    assert "<td class=mono>gulf_coast/2026-09-01/summary.json@0123456789abcdef</td>" in deliveries  # supersedes
    assert "file: 2 delivered, 0 pending" in deliveries and "webhook: 1 delivered, 1 pending" in deliveries
    # two pictures, inline PNGs; nothing fetched from the network
    images = _images(page)
    assert len(images) == 2
    assert all(img.startswith(PNG_MAGIC) and len(img) > 2000 for img in images)
    assert "http://" not in page and "https://" not in page
    assert not re.search(r'(src|href)="(?!data:|#)', page)


def test_images_are_returned_and_match_the_page(populated: Ledger) -> None:
    page, images = render_report_with_images(populated)
    assert set(images) == {"heatmap.png", "phases.png"}
    assert sorted(_images(page)) == sorted(images.values())


def test_empty_ledger_says_nothing_has_run(ledger: Ledger, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    write_report(ledger, out)
    page = out.read_text(encoding="utf-8")
    assert "Nothing has run yet" in page
    assert "stormlake demo" in page
    assert _images(page) == []
    assert "http://" not in page and "https://" not in page


def test_rewrite_replaces_the_page(populated: Ledger, ledger: Ledger, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    out.write_text("old page", encoding="utf-8")
    write_report(populated, out)
    first = out.read_text(encoding="utf-8")
    assert "old page" not in first and "pine_belt" in first
    _complete(ledger, "2026-09-02|red_hills", "ingest", "run-fff")  # takes over the PENDING claim
    write_report(ledger, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    assert "run-fff" in out.read_text(encoding="utf-8")


def test_cli_report_writes_to_home(sl_env: dict[str, str], pg_dsn: str) -> None:
    from pipeline.cli import main

    assert main(["report"]) == 2  # a read command runs no DDL: the owner migrates first
    assert main(["db", "migrate"]) == 0
    assert main(["report"]) == 0
    page = (Path(sl_env["STORMLAKE_HOME"]) / "report.html").read_text(encoding="utf-8")
    assert "Nothing has run yet" in page


def test_thousands_of_partitions_render_quickly(ledger: Ledger, pg_dsn: str, tmp_path: Path) -> None:
    """60 regions x 80 days = 4,800 partitions, 19,200 heads and their events, written in SQL."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            """
            WITH parts AS (
                SELECT 'r' || lpad(r::text, 2, '0') AS region_id,
                       to_char(date '2026-09-01' + d, 'YYYY-MM-DD') AS day, r, d
                FROM generate_series(1, 60) r, generate_series(0, 79) d
            ), phases AS (
                SELECT * FROM (VALUES ('ingest', 1), ('enrich', 2), ('correlate', 3), ('present', 4)) v(phase, tier)
            )
            INSERT INTO checkpoints (partition_key, region_id, day, phase, input_hash, idempotency_key, status,
                                     state_hash, schema_version, code_version, first_seq, seq, attempt, tier,
                                     tier_label, run_id, error_class, error_message, completed_at, summary)
            SELECT day || '|' || region_id, region_id, day, phase, 'h',
                   encode(sha256(convert_to(day || '|' || region_id || '|' || phase || '|h', 'UTF8')), 'hex'),
                   CASE WHEN (r * 7 + d) % 53 = 0 AND tier = 2 THEN 'FAILED'
                        WHEN (r + d) % 41 = 0 AND tier = 3 THEN 'PENDING' ELSE 'COMPLETED' END,
                   's', 1, '1', 1, 1, 1 + ((r + d) % 9 = 0)::int, tier, 'x', 'run-' || d,
                   CASE WHEN (r * 7 + d) % 53 = 0 AND tier = 2 THEN 'ValueError' END,
                   CASE WHEN (r * 7 + d) % 53 = 0 AND tier = 2 THEN 'bad <row> ' || r END,
                   now(), '{}'::jsonb
            FROM parts, phases
            WHERE tier <= 4 - ((r * 3 + d) % 11 = 0)::int - ((r * 5 + d) % 13 = 0)::int
            """
        )
        conn.execute(
            """
            INSERT INTO checkpoint_events (checkpoint_id, partition_key, region_id, day, phase, status,
                                           input_hash, seq, attempt, tier, run_id, at)
            SELECT id, partition_key, region_id, day, phase, s.status, 'h', 1, 1, tier, run_id,
                   now() - interval '1 hour' + s.off * (1 + (id % 17)) * interval '1 second'
            FROM checkpoints, (VALUES ('PENDING', 0), ('COMPLETED', 1)) s(status, off)
            WHERE checkpoints.status = 'COMPLETED' OR s.status = 'PENDING'
            """
        )
    out = tmp_path / "big.html"
    write_report(ledger, out)
    page = out.read_text(encoding="utf-8")
    assert len(_images(page)) == 2
    assert 'partitions</div><div class="v">4800<' in page
    assert "bad &lt;row&gt;" in page


def test_report_maps_quality_lists_what_waits_and_says_what_a_role_may_not_see(populated: Ledger) -> None:
    # red_hills 2026-09-01: published but graded noisy and held; pine_belt's enrich fails a third time.
    key = "2026-09-01|red_hills"
    for phase in ("ingest", "enrich", "correlate", "present"):
        p = next(p for p in PHASES if p.name == phase)
        claim = _claim(populated, key, phase, "run-fff")
        summary: dict = {"upstream": {}}
        if phase == "present":
            summary = present_summary(held={"quality": "noisy", "reasons": ["station_hours_missing 50.0% > 30%"]})
        populated.complete(claim, state_hash=f"s-{key}-{phase}", summary=summary, tier=p.tier,
                           tier_label=p.tier_label, run_id="run-fff")
    claim = _claim(populated, "2026-09-01|pine_belt", "enrich", "run-ggg")
    assert populated.fail(claim, error_class="QualityGateError", error_message="third time", run_id="run-ggg")

    page, images = render_report_with_images(populated, dead_letter_after=3)
    assert "quality.png" in images and images["quality.png"].startswith(PNG_MAGIC)
    assert 'id="quality"' in page and "noisy 1" in page
    review = page[page.index('id="review"'):page.index('id="phases"')]
    assert "1 held for review" in review and "1 dead-lettered" in review
    assert "2026-09-01|red_hills" in review and "station_hours_missing" in review
    assert "2026-09-01|pine_belt" in review and "dead-lettered after 3 failures" in review

    reader = Ledger(populated.dsn, role="compliance_auditor", audited=True)
    try:
        page, images = render_report_with_images(reader, role="compliance_auditor")
    finally:
        reader.close()
    assert "read as compliance_auditor" in page
    assert "may not see the ingest, enrich, correlate phases" in page
    assert "QualityGateError" not in page  # enrich's errors are not the auditor's to see
    assert "1 held for review" in page
    # The report's reads run on several threads, each session through logged requests of its own:
    # one of each kind it reads, each request in one backend.
    with psycopg.connect(populated.dsn) as conn:
        requests = conn.execute("SELECT what, request_id, count(DISTINCT backend_pid) FROM checkpoint_access_log"
                                " WHERE role = 'compliance_auditor' GROUP BY what, request_id").fetchall()
        sessions = conn.execute("SELECT count(DISTINCT backend_pid) FROM checkpoint_access_log"
                                " WHERE role = 'compliance_auditor'").fetchone()[0]
    assert {what for what, _, _ in requests} == {"checkpoints", "events", "partitions", "receipts"}
    assert all(backends == 1 for _, _, backends in requests)
    for kind in ("checkpoints", "events", "partitions", "receipts"):
        assert sum(what == kind for what, _, _ in requests) <= sessions


def test_pictures_depend_only_on_the_ledger(populated: Ledger) -> None:
    """The two maps share one drawing of their axes; a picture's bytes do not depend on what was
    drawn before it, and the maps keep the page's grid and size."""
    from pipeline.report import collect, grid_pngs, heat_map, phases_png, quality_map

    _, first = render_report_with_images(populated)
    data = collect(populated)
    grid_pngs([quality_map(data)])  # other drawings in between
    grid_pngs([heat_map(data), quality_map(data)])
    _, again = render_report_with_images(populated)
    assert first == again
    heat, quality = grid_pngs([heat_map(data), quality_map(data)])
    assert heat == first["heatmap.png"]
    assert _png_size(heat) == _png_size(quality)
    assert phases_png(data) == first["phases.png"]  # drawn here, and in the report by a forked process


def test_pictures_drawn_by_forks_are_those_drawn_without(populated: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report draws the phases picture and the second map in forks of its process; without
    fork every picture is drawn in the process, and each is the same."""
    import os

    key = "2026-09-01|red_hills"  # a graded batch, so the report draws the quality map too
    for phase in ("ingest", "enrich", "correlate", "present"):
        p = next(p for p in PHASES if p.name == phase)
        summary: dict = {"upstream": {}, **({"figures": {"quality": {"grade": "low"}}} if phase == "present" else {})}
        populated.complete(_claim(populated, key, phase, "run-q"), state_hash=f"s-{key}-{phase}", summary=summary,
                           tier=p.tier, tier_label=p.tier_label, run_id="run-q")
    _, forked = render_report_with_images(populated)
    monkeypatch.delattr(os, "fork")
    _, here = render_report_with_images(populated)
    assert set(forked) == {"heatmap.png", "phases.png", "quality.png"} and forked == here


def test_a_picture_drawn_aside_is_the_one_drawn_here_and_a_child_that_fails_is_made_up_for() -> None:
    """drawn_aside hands back the child's bytes (more than a pipe holds, read after the child has
    finished); where the child does not deliver, the picture is drawn in this process instead."""
    import os

    from pipeline.report import drawn_aside

    here = os.getpid()
    big = bytes(range(256)) * 4096  # 1 MiB: the child waits on the pipe until it is read
    wait = drawn_aside(lambda: big + os.getpid().to_bytes(4, "big"))
    child = wait()
    assert child[:-4] == big and int.from_bytes(child[-4:], "big") != here  # drawn by another process

    def dies_in_the_child() -> bytes:
        if os.getpid() != here:
            os._exit(3)
        return b"drawn here"

    assert drawn_aside(dies_in_the_child)() == b"drawn here"


def _png_size(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_a_year_shows_weeks_as_columns_with_the_lowest_tier_of_each() -> None:
    """Past WEEK_COLUMNS_AFTER days the heat map's columns are weeks from Monday: a cell is the
    lowest tier of the week in its region, marked when any of its days failed."""
    import datetime as dt
    from types import SimpleNamespace

    from pipeline.report import WEEK_COLUMNS_AFTER, grid_pngs, heat_grid, heat_map
    from resources.ledger_views import GridCell

    start = dt.date(2026, 8, 31)  # a Monday
    days = [(start + dt.timedelta(days=d)).isoformat() for d in range(365)]
    assert len(days) > WEEK_COLUMNS_AFTER
    cells = [GridCell(region, day, 4, False, False) for region in ("a", "b") for day in days]
    cells[3] = GridCell("a", days[3], 1, True, False)  # the first Thursday in region a: failed at tier 1
    data = SimpleNamespace(grid=cells, region_names={"a": "Region A", "b": "Region B"})
    g = heat_grid(data)
    assert g.unit == "week" and g.regions == ["a", "b"]
    assert len(g.columns) == 53 and g.columns[:2] == ["2026-08-31", "2026-09-07"]
    assert g.tiers[0, 0] == 1 and g.failed[0, 0] and not g.failed[0, 1:].any()
    assert (g.tiers[0, 1:] == 4).all() and (g.tiers[1] == 4).all()
    (png,) = grid_pngs([heat_map(data)])
    assert png.startswith(PNG_MAGIC) and png == grid_pngs([heat_map(data)])[0]


def test_a_held_batch_whose_stored_summary_does_not_read_is_one_line_in_the_report(populated: Ledger,
                                                                                  tmp_path: Path) -> None:
    key = "2026-09-01|red_hills"
    for phase in ("ingest", "enrich", "correlate"):
        _complete(populated, key, phase, "run-hhh")
    claim = _claim(populated, key, "present", "run-hhh")
    populated.complete(claim, state_hash="s", summary=present_summary(held={"quality": "noisy"}), tier=3,
                       tier_label="held_for_review", run_id="run-hhh")
    problems = write_report(populated, tmp_path / "report.html")
    assert len(problems) == 1
    line = problems[0]
    for words in (f"present of {key}", f"seq {claim.seq}", "'held.reasons'", "--from present"):
        assert words in line, (words, line)
    page = (tmp_path / "report.html").read_text()
    review = page[page.index('id="review"'):page.index('id="phases"')]
    assert "stored summary does not read" in review and "held.reasons" in review
