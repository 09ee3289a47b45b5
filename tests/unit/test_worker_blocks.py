"""Key ranges: what one run covers (a rectangle of days × regions), and how a backfill's keys are
shared among its worker processes."""

from __future__ import annotations

import dagster as dg

from assets.partitions import PARTITIONS
from pipeline.orchestrate import MAX_PARTITIONS_PER_RUN, contiguous_groups, worker_blocks

REGIONS = ("gulf_coast", "pine_belt", "red_hills", "piedmont", "blue_ridge", "tidewater")  # the region file's order
ORDER = PARTITIONS.get_partition_keys()


def keys(days: int, regions: tuple[str, ...] = REGIONS, first: int = 1) -> list[str]:
    return [f"2026-09-{d:02d}|{r}" for d in range(first, first + days) for r in regions]


def check_ranges(groups: list[list[str]], selected: list[str]) -> None:
    """Every group is exactly what a run over its first to last key covers; every key once."""
    for g in groups:
        assert PARTITIONS.get_partition_keys_in_range(dg.PartitionKeyRange(g[0], g[-1])) == g, g
    assert sorted(k for g in groups for k in g) == sorted(selected)


def test_a_range_is_a_day_of_neighbouring_regions_or_a_region_of_consecutive_days() -> None:
    day = keys(1)
    assert contiguous_groups(day, ORDER, 8) == [day]  # one day, all regions: one run
    year = keys(20, ("red_hills",))
    groups = contiguous_groups(year, ORDER, MAX_PARTITIONS_PER_RUN)  # a region's days: 7, 7, 6
    assert sorted((len(g) for g in groups), reverse=True) == [7, 7, 6]
    check_ranges(groups, year)
    # Days that span a day boundary are never one range across regions that are not all taken.
    spread = keys(7)[:40]
    check_ranges(contiguous_groups(spread, ORDER, 8), spread)
    gappy = [k for k in keys(4) if not k.endswith("|red_hills")]
    check_ranges(contiguous_groups(gappy, ORDER, 8), gappy)


def test_one_range_or_one_worker_is_one_block() -> None:
    assert worker_blocks(keys(1), workers=4) == [keys(1)]  # 6 keys: one process, no worker started
    assert worker_blocks(keys(4), workers=1) == [keys(4)]
    assert worker_blocks([], workers=2) == []


def test_the_workers_get_ranges_that_let_them_finish_together() -> None:
    blocks = worker_blocks(keys(3), workers=2)  # 18 keys: six regions' 3 days (9 each), not 6+6 and 6
    assert [len(b) for b in blocks] == [3] * 6
    check_ranges(blocks, keys(3))
    many = worker_blocks(keys(20), workers=2)
    assert max(len(b) for b in many) <= MAX_PARTITIONS_PER_RUN
    check_ranges(many, keys(20))
