"""The recorded benchmark results (docs/bench/*.json) and the page that renders them."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from pipeline.tools import bench_table
from tests.conftest import REPO

FIGURE_KEYS = {"figure", "value", "target", "met"}


def test_render_entry_example() -> None:
    assert doctest.testmod(bench_table).failed == 0


@pytest.mark.parametrize("path", sorted((REPO / "docs" / "bench").glob("*.json")), ids=lambda p: p.name)
def test_recorded_result_has_its_fields(path: Path) -> None:
    entry = json.loads(path.read_text(encoding="utf-8"))
    assert {"title", "command", "date", "commit", "host", "figures"} <= set(entry)
    assert entry["figures"], "a recorded result holds at least one figure"
    for row in entry["figures"]:
        assert set(row) >= FIGURE_KEYS, row
        assert row["met"] in (True, False, None)
        assert (row["met"] is None) == (not row["target"]), (
            f"a figure is met or not exactly when it has a target: {row}"
        )


def test_benchmarks_page_shows_the_recorded_results() -> None:
    assert bench_table.main(["--check", str(REPO / "docs" / "BENCHMARKS.md")]) == 0


def test_page_out_of_date_is_found_and_rewritten(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# B\n\n{bench_table.BEGIN}\n{bench_table.END}\n\ntail\n", encoding="utf-8")
    (tmp_path / "bench" / "a.json").write_text(
        json.dumps(
            {
                "title": "Views",
                "command": "stormlake bench --scale",
                "date": "2026-01-02",
                "commit": "v1",
                "host": "h",
                "figures": [{"figure": "status", "value": 0.5, "unit": "s", "target": "< 1 s", "met": True}],
            }
        ),
        encoding="utf-8",
    )
    assert bench_table.main(["--check", str(page)]) == 1
    assert bench_table.main([str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "| status | 0.5 s | < 1 s | yes |" in text and text.endswith("tail\n")
    assert bench_table.main(["--check", str(page)]) == 0


def test_page_without_markers_is_bad_usage(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    page = tmp_path / "BENCHMARKS.md"
    page.write_text("# B\n", encoding="utf-8")
    assert bench_table.main(["--check", str(page)]) == 2
