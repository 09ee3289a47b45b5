"""bench --live's pieces that need no server: its region file and its line against the target."""

from __future__ import annotations

from pathlib import Path

from pipeline.tools.bench_live import TARGET_S, render_live, write_region_file
from resources.settings import DEFAULT_REGIONS_FILE, load_regions


def test_the_region_file_holds_the_shipped_regions_then_boxes_beside_them(tmp_path: Path) -> None:
    regions = write_region_file(tmp_path / "regions.csv", 50)
    shipped = load_regions(DEFAULT_REGIONS_FILE)
    assert len(regions) == 50 and len({r.region_id for r in regions}) == 50
    assert regions[: len(shipped)] == shipped
    for i, a in enumerate(regions):
        for b in regions[i + 1:]:
            apart = a.max_lat <= b.min_lat or b.max_lat <= a.min_lat or a.max_lon <= b.min_lon or b.max_lon <= a.min_lon
            assert apart, (a, b)


def test_the_figure_is_printed_against_the_target() -> None:
    result = {"config": {"partitions": 50, "rows_per_partition": 500, "day": "2026-12-05"},
              "land_to_delivered_s": 42.5, "superseding_deliveries": 100, "first_version_s": 40.0,
              "target_s": TARGET_S, "met": True}
    line = render_live(result)
    assert "50 regions" in line and "42.5 s" in line and f"target <= {TARGET_S:.0f} s: met" in line
    assert "NOT met" in render_live({**result, "land_to_delivered_s": 80.0, "met": False})
