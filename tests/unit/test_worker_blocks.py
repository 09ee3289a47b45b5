"""Key ranges: what one run covers (a rectangle of days × regions), and how a backfill's keys are
shared among its worker processes."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from assets.partitions import PARTITIONS
from assets.plan import (
    MAX_PARTITIONS_PER_RUN,
    MAX_SMALL_PARTITIONS_PER_RUN,
    RUN_LANDING_BYTES,
    contiguous_groups,
    partitions_per_run,
    range_run_requests,
    worker_blocks,
)
from resources.keys import RANGE_START_TAG
from tests.helpers import requested_keys

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


def test_run_requests_are_the_ranges_of_a_backfill_and_a_range_of_one_is_its_partition() -> None:
    gappy = [k for k in keys(3) if k != "2026-09-02|piedmont"]
    requests = range_run_requests(gappy, run_key=lambda g: f"{g[0]}..{g[-1]}", tags={"t": "v"})
    ranges = [requested_keys(r) for r in requests]
    assert ranges == contiguous_groups(gappy, ORDER, MAX_PARTITIONS_PER_RUN)
    check_ranges(ranges, gappy)
    assert [r.run_key for r in requests] == [f"{g[0]}..{g[-1]}" for g in ranges]
    assert all(r.tags["t"] == "v" for r in requests)
    (alone,) = range_run_requests(["2026-09-01|piedmont"], run_key=lambda g: g[0], tags={})
    assert alone.partition_key == "2026-09-01|piedmont" and RANGE_START_TAG not in alone.tags


def test_one_range_or_one_worker_is_one_block() -> None:
    assert worker_blocks(keys(1), workers=4) == [keys(1)]  # 6 keys: one process, no worker started
    assert worker_blocks(keys(4), workers=1) == [keys(4)]
    assert worker_blocks([], workers=2) == []


def check_blocks(blocks: list[list[str]], selected: list[str], max_per_run: int) -> None:
    """Every key in one block; each block runs as exact key ranges of at most ``max_per_run``."""
    assert sorted(k for b in blocks for k in b) == sorted(selected)
    for block in blocks:
        ranges = contiguous_groups(block, ORDER, max_per_run)
        check_ranges(ranges, block)
        assert max(len(r) for r in ranges) <= max_per_run


def test_the_workers_get_blocks_that_let_them_finish_together() -> None:
    # 18 keys (3 days of 6 regions) of 20,000 rows (27 a run): two blocks of three regions'
    # days, one range each, not six blocks of a region's days (three runs a worker).
    blocks = worker_blocks(keys(3), workers=2, max_per_run=27)
    assert [len(b) for b in blocks] == [9, 9]
    check_ranges(blocks, keys(3))
    # The bench's 16 (two regions' third day missing): 8 each, in two ranges each.
    bench = [k for k in keys(3) if k not in ("2026-09-03|blue_ridge", "2026-09-03|tidewater")]
    blocks = worker_blocks(bench, workers=2, max_per_run=27)
    assert [len(b) for b in blocks] == [8, 8]
    assert [len(contiguous_groups(b, ORDER, 27)) for b in blocks] == [2, 2]
    check_blocks(blocks, bench, 27)
    # More than the workers can take in one round: rounds of blocks of at most a run each.
    many = worker_blocks(keys(20), workers=2)
    assert max(len(b) for b in many) <= MAX_PARTITIONS_PER_RUN
    assert len(many) >= len(keys(20)) / MAX_PARTITIONS_PER_RUN
    check_blocks(many, keys(20), MAX_PARTITIONS_PER_RUN)


def test_every_region_over_consecutive_days_is_one_rectangle() -> None:
    """A backfill of every region over days is one range, not a run per day or per region; a
    selection with a hole is cut into rectangles that cover exactly its keys."""
    week = keys(7)
    assert contiguous_groups(week, ORDER, 64) == [sorted(week, key=ORDER.index)]
    check_ranges(contiguous_groups(week, ORDER, 64), week)
    # Too big for one run: bands of whole days, as equal as possible (42 keys, at most 20 a run).
    bands = contiguous_groups(week, ORDER, 20)
    assert sorted(len(g) for g in bands) == [12, 12, 18]
    check_ranges(bands, week)
    # The first day's first region missing: that day's other regions, and the rest of the week.
    holed = week[1:]
    groups = contiguous_groups(holed, ORDER, 64)
    assert sorted(len(g) for g in groups) == [5, 36]
    check_ranges(groups, holed)
    # Scattered keys still come out as exact ranges, every key once.
    scattered = [k for i, k in enumerate(keys(9)) if i % 7 not in (2, 5)]
    check_ranges(contiguous_groups(scattered, ORDER, 8), scattered)
    check_ranges(contiguous_groups(scattered, ORDER, 64), scattered)


def test_small_partitions_share_bigger_runs(tmp_path: Path) -> None:
    """The runs' size follows the partitions' own landing files (not the region's reference files):
    8 a run for partitions of 200,000 rows, more for small ones, at most 64."""
    from resources.landing import Landing
    from resources.landing_layout import PARTITION_FILES

    def per_run(bytes_each: int) -> int:
        root = tmp_path / f"landing-{bytes_each}"
        selected = keys(2)
        for key in selected:
            day, region = key.split("|")
            folder = root / region / day
            folder.mkdir(parents=True)
            for name in PARTITION_FILES:
                (folder / name).write_bytes(b"x" * (bytes_each // len(PARTITION_FILES)))
        (root / "reference").mkdir()
        (root / "reference" / "customers.csv").write_bytes(b"x" * (RUN_LANDING_BYTES // 2))  # shared, not counted
        return partitions_per_run(selected, Landing(root))

    assert per_run(110_000) == MAX_SMALL_PARTITIONS_PER_RUN  # 500 rows
    assert per_run(2_400_000) == RUN_LANDING_BYTES // 2_400_000  # 20,000 rows: 27
    assert per_run(23_000_000) == MAX_PARTITIONS_PER_RUN  # 200,000 rows
    assert partitions_per_run([], Landing(tmp_path / "none")) == MAX_PARTITIONS_PER_RUN
    # Landing files gone since ingest: nothing to go by, the size of old.
    assert partitions_per_run(keys(2), Landing(tmp_path / "none")) == MAX_PARTITIONS_PER_RUN
    # Small and big partitions together are sized by the big ones.
    mixed = tmp_path / "landing-110000"
    big = mixed / "gulf_coast" / "2026-09-01"
    for name in PARTITION_FILES:
        (big / name).write_bytes(b"x" * (23_000_000 // len(PARTITION_FILES)))
    assert partitions_per_run(keys(2), Landing(mixed)) == MAX_PARTITIONS_PER_RUN


def test_small_partitions_are_still_shared_among_the_workers() -> None:
    """Runs of up to 64 small partitions do not leave a core idle: 40 keys for 2 workers are two
    blocks of about half each, not one run in one process; 8 or fewer stay in one process."""
    week = keys(7)[:40]
    blocks = worker_blocks(week, workers=2, max_per_run=64)
    assert len(blocks) >= 2 and max(len(b) for b in blocks) <= 20, [len(b) for b in blocks]
    check_blocks(blocks, week, 64)
    assert worker_blocks(keys(1) + ["2026-09-02|gulf_coast"], workers=2, max_per_run=64) == [
        keys(1) + ["2026-09-02|gulf_coast"]]
