"""``stormlake bench --month``: the tenths, the projection of the year, the figures and their
record (the heavy bench itself runs only as ``stormlake bench --month``)."""

from __future__ import annotations

import datetime as dt
import doctest
import json
from pathlib import Path

import pytest

import pipeline.tools.bench_month as month
from pipeline.tools import bench_table
from resources.ledger import Ledger
from resources.ledger_views import LedgerViews, PhaseSpan

PHASES = ["ingest", "enrich", "correlate", "present"]
T0 = dt.datetime(2026, 9, 1, 12, 0, tzinfo=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _month(per_partition: list[float], start_s: float = 2.0) -> list[PhaseSpan]:
    """The spans of a backfill in ranges of 10 partitions run one after the other: each range's
    phases a quarter of its time each, the range taking ``per_partition[i]`` a partition."""
    spans, t = [], start_s
    for r, cost in enumerate(per_partition):
        keys = [f"2026-09-{r + 1:02d}|region_{i:02d}" for i in range(10)]
        for phase in PHASES:
            end = t + cost * 10 / len(PHASES)
            spans += [PhaseSpan(k, phase, _at(t), _at(end)) for k in keys]
            t = end
    return spans


def test_the_examples_hold() -> None:
    assert doctest.testmod(month).failed == 0


def test_tenths_cover_the_run_from_the_first_claim_to_the_last_partition_done() -> None:
    done = [0.5 * i for i in range(1, 101)]  # 100 partitions, one every half second, from 0
    cuts = month.tenths(done, start=-1.0)
    assert [c["partitions"] for c in cuts] == [10] * 10
    assert cuts[0]["seconds"] == pytest.approx(6.0)  # from the start, before the first was done
    assert all(c["seconds"] == pytest.approx(5.0) for c in cuts[1:])
    assert sum(c["seconds"] for c in cuts) == pytest.approx(done[-1] + 1.0)
    assert month.tenths(list(reversed(done)), start=-1.0) == cuts  # the order given does not matter
    with pytest.raises(ValueError, match="9 partitions"):
        month.tenths(done[:9], start=0.0)


def test_the_year_is_the_line_through_the_tenths_integrated() -> None:
    cuts = [{"partitions": 150, "per_partition_s": 0.08 + 0.002 * k} for k in range(10)]
    p = month.project(cuts, 18_250, outside_s=10.0)
    # Exactly linear: cost(x) = a + b x through the tenths' middles (x = 75, 225, ...).
    b = 0.002 / 150
    a = 0.08 - b * 75
    assert p["growth_s_per_partition"] == pytest.approx(b, rel=1e-3)
    assert p["first_s"] == pytest.approx(a, abs=1e-4)
    assert p["seconds"] == pytest.approx(10.0 + a * 18_250 + b * 18_250 ** 2 / 2, rel=1e-3)
    assert p["at_first_tenth_s"] == pytest.approx(10.0 + 0.08 * 18_250, abs=0.1)
    flat = month.project([{"partitions": 150, "per_partition_s": 0.09}] * 10, 18_250)
    assert flat["seconds"] == pytest.approx(0.09 * 18_250, abs=0.1) and flat["growth_s_per_partition"] == 0
    falling = month.project([{"partitions": 150, "per_partition_s": 0.1 - 0.001 * k} for k in range(10)], 1000)
    assert falling["growth_s_per_partition"] == 0 and falling["seconds"] == pytest.approx(95.5, abs=0.1)


def test_a_side_s_figures_come_from_its_ledger_spans() -> None:
    costs = [0.08, 0.08, 0.09, 0.09, 0.10, 0.10, 0.11, 0.11, 0.12, 0.12]  # ten ranges of ten
    spans = _month(costs, start_s=2.0)
    wall = 2.0 + sum(c * 10 for c in costs) + 1.5  # its start before the first claim, its end after the last
    side = month.side_figures("cli", wall, spans, PHASES)
    assert side["partitions"] == 100
    assert [t["per_partition_s"] for t in side["tenths"]] == pytest.approx(costs, abs=1e-4)
    assert side["last_vs_first"] == pytest.approx(0.12 / 0.08, abs=1e-3)
    assert side["projection"]["outside_s"] == pytest.approx(3.5, abs=0.01)
    for tenth, cost in zip(side["phases_by_tenth"], costs, strict=True):
        assert set(tenth) == set(PHASES)
        assert all(v == pytest.approx(cost / 4, abs=1e-4) for v in tenth.values())


def test_the_figures_pass_and_fail_against_the_targets_and_the_page_renders_them(tmp_path: Path) -> None:
    cli = month.side_figures("cli", 10.5, _month([0.09] * 10, start_s=0.5), PHASES)
    ui = month.side_figures("ui", 12.0, _month([0.1, 0.1, 0.1, 0.1, 0.1, 0.11, 0.11, 0.12, 0.12, 0.12]), PHASES)
    config = {"regions": 10, "days": 10, "rows_per_partition": 500, "partitions": 100}
    rows = {r["figure"]: r for r in month.figures({"cli": cli, "ui": ui}, config)}
    assert {k: v["met"] for k, v in rows.items()} == {
        "CLI: seconds a partition (10 x 10 x 500 rows)": False,  # 0.105 s
        "CLI: last tenth / first tenth": True,
        "CLI: a year of 18,250 partitions, projected from the tenths": True,
        "UI: seconds a partition (10 x 10 x 500 rows)": False,
        "UI: last tenth / first tenth": False,  # 1.2
        "UI: a year of 18,250 partitions, projected from the tenths": False,
        "UI backfill / CLI": True,  # 0.12 / 0.105
    }
    result = {"config": config, "sides": {"cli": cli, "ui": ui}, "figures": list(rows.values())}
    text = month.render(result)
    assert "UI backfill / CLI" in text and text.count("FAIL") == 4 and text.count("PASS") == 3
    assert len([line for line in text.splitlines() if line.startswith("  ") and line.strip()[:1].isdigit()]) == 20

    (tmp_path / "bench").mkdir()
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# B\n\n{bench_table.BEGIN}\n{bench_table.END}\n", encoding="utf-8")
    path = month.record(result, tmp_path / "bench", page, date="2026-12-06", commit="abc1234", host="h")
    assert path.name == "2026-12-06-month.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["command"] == "stormlake bench --month" and saved["tenths"]["ui"][-1] == pytest.approx(0.12)
    page_text = page.read_text(encoding="utf-8")
    assert "| UI backfill / CLI | 1.143 | <= 1.15 | yes |" in page_text
    assert "| tenth | CLI s/partition | UI s/partition |" in page_text
    assert bench_table.main(["--check", str(page)]) == 0

    # a year from the UI is recorded beside the CLI's year of the same day, and says which side it is
    year = {"config": {**config, "days": 365}, "sides": {"ui": ui}, "figures": list(rows.values())[3:6]}
    cli_year = tmp_path / "bench" / "2026-12-06-year.json"
    cli_year.write_text(json.dumps({**saved, "title": "the CLI's year"}), encoding="utf-8")
    path = month.record(year, tmp_path / "bench", page, date="2026-12-06", commit="abc1234", host="h")
    assert path.name == "2026-12-06-year-ui.json"
    assert json.loads(cli_year.read_text(encoding="utf-8"))["title"] == "the CLI's year"
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["command"] == "stormlake bench --year --sides ui" and saved["title"].startswith("A year of 10 regions from the UI")


def test_the_ledger_gives_every_completed_head_s_span_in_order_of_commit(ledger: Ledger) -> None:
    args = dict(region_id="gulf_coast", day="2026-09-01", input_hash="h1", schema_version=1, code_version="1",
                run_id="r")
    for key, region in (("2026-09-01|gulf_coast", "gulf_coast"), ("2026-09-01|pine_belt", "pine_belt")):
        for phase in ("ingest", "enrich"):
            claim = ledger.claim(**{**args, "partition_key": key, "region_id": region, "phase": phase}).claim
            ledger.complete(claim, state_hash="s", summary={}, tier=1, tier_label="ingested", run_id="r")
    ledger.claim(**{**args, "partition_key": "2026-09-02|gulf_coast", "day": "2026-09-02", "phase": "ingest"})

    spans = LedgerViews(ledger).phase_spans()

    assert [(s.partition_key, s.phase) for s in spans] == [
        ("2026-09-01|gulf_coast", "ingest"), ("2026-09-01|gulf_coast", "enrich"),
        ("2026-09-01|pine_belt", "ingest"), ("2026-09-01|pine_belt", "enrich")]  # the pending claim is not done
    assert all(s.created_at <= s.completed_at for s in spans)
    assert [s.completed_at for s in spans] == sorted(s.completed_at for s in spans)
    assert month.done_times(spans, "enrich").keys() == {"2026-09-01|gulf_coast", "2026-09-01|pine_belt"}


@pytest.mark.parametrize(("argv", "says"), [
    (["--regions", "5"], "go with --month or --year"),
    (["--month", "--days", "0"], "--days 0: must be at least 1"),
    (["--month", "--regions", "3", "--days", "3"], "the tenths need at least 10 partitions"),
    (["--month", "--sides", "cli,web"], "each side is cli or ui"),
])
def test_a_month_bench_that_cannot_be_measured_is_a_usage_error(
        argv: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    monkeypatch.setenv("STORMLAKE_HOME", str(tmp_path / "home"))
    assert main(["bench", *argv]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "home" / "bench").exists()  # refused before anything was generated
