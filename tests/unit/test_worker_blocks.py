"""How a backfill's keys are shared among its worker processes."""

from __future__ import annotations

from assets.partitions import PARTITIONS
from pipeline.orchestrate import MAX_PARTITIONS_PER_RUN, worker_blocks

REGIONS = ("gulf_coast", "pine_belt", "red_hills", "piedmont", "blue_ridge", "tidewater")  # the region file's order


def keys(days: int) -> list[str]:
    return [f"2026-09-{d:02d}|{r}" for d in range(1, days + 1) for r in REGIONS]


def test_one_range_or_one_worker_is_one_block() -> None:
    assert worker_blocks(keys(1), workers=4) == [keys(1)]  # 6 keys: one range run, no worker started
    assert worker_blocks(keys(4), workers=1) == [keys(4)]
    assert worker_blocks([], workers=2) == []


def test_every_worker_gets_a_share_of_neighbouring_keys() -> None:
    blocks = worker_blocks(keys(2)[:10], workers=2)  # 10 keys: 5 and 5, not 8 and 2
    assert [len(b) for b in blocks] == [5, 5]
    assert sorted(k for b in blocks for k in b) == sorted(keys(2)[:10])
    blocks = worker_blocks(keys(3), workers=2)  # 18 keys: 5, 5, 4, 4 (9 each), not 8, 8, 2
    assert sorted(len(b) for b in blocks) == [4, 4, 5, 5]
    assert [k for b in blocks for k in b] == keys(3)
    many = worker_blocks(keys(20), workers=2)  # 120 keys: range runs of at most 8, 7 or 8 each
    assert max(len(b) for b in many) <= MAX_PARTITIONS_PER_RUN and min(len(b) for b in many) >= 7
    assert sum(len(b) for b in many) == 120 and len({k for b in many for k in b}) == 120
    # Keys that are not neighbours (a region left out) are never in one block: a range run
    # would take every key between its first and its last.
    gappy = [k for k in keys(4) if not k.endswith("|red_hills")]
    pos = {k: i for i, k in enumerate(PARTITIONS.get_partition_keys())}
    blocks = worker_blocks(gappy, workers=2)
    assert sorted(k for b in blocks for k in b) == sorted(gappy)
    for block in blocks:
        assert [pos[k] for k in block] == list(range(pos[block[0]], pos[block[0]] + len(block))), block
