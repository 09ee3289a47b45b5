"""How a queued key range run is cut (``pipeline.range_runs.line_groups``): into ranges of
consecutive partitions of one kind (landed or not, dead-lettered or not), without the failed
ones, each a range Dagster can run (one day's regions or one region's days)."""

from __future__ import annotations

import itertools
import random

from assets.plan import line_groups
from pipeline.range_runs import range_kinds
from resources.keys import partition_key, split_partition_key

REGIONS = ["r1", "r2", "r3", "r4", "r5"]


def keys_of(days: list[str], regions: list[str]) -> list[str]:
    """A rectangle's keys in Dagster's order (days, then regions)."""
    return [partition_key(d, r) for d, r in itertools.product(days, regions)]


def test_a_range_that_all_landed_stays_one() -> None:
    keys = keys_of(["2026-09-01"], REGIONS)
    assert line_groups(keys, lambda k: True) == [keys]


def test_landed_and_not_landed_partitions_go_to_runs_of_their_own() -> None:
    keys = keys_of(["2026-09-01"], REGIONS)
    landed = {keys[0], keys[1], keys[4]}
    assert line_groups(keys, lambda k: k in landed) == [keys[:2], keys[2:4], keys[4:]]


def test_dead_lettered_partitions_go_to_runs_of_their_own() -> None:
    keys = keys_of(["2026-09-01"], REGIONS)
    kinds = {keys[0]: "to run", keys[1]: "dead-lettered", keys[2]: "dead-lettered", keys[3]: "to run",
             keys[4]: "not landed"}
    assert line_groups(keys, kinds.__getitem__) == [keys[:1], keys[1:3], keys[3:4], keys[4:]]


def test_failed_partitions_are_left_out_and_cut_the_range() -> None:
    keys = keys_of(["2026-09-01", "2026-09-02", "2026-09-03"], ["r2"])  # one region's days
    assert line_groups(keys, lambda k: True, frozenset({keys[1]})) == [keys[:1], keys[2:]]
    assert line_groups(keys, lambda k: True, frozenset({keys[0]})) == [keys[1:]]
    assert line_groups(keys, lambda k: True, frozenset(keys)) == []


def test_a_rectangle_is_cut_at_each_day() -> None:
    keys = keys_of(["2026-09-01", "2026-09-02"], REGIONS[:3])
    assert line_groups(keys, lambda k: True, frozenset({keys[1]})) == [keys[:1], keys[2:3], keys[3:]]


def test_every_group_is_a_range_of_consecutive_kept_keys_of_one_kind() -> None:
    """Random ranges, landings and failures: the groups hold every kept key once, in order; each
    is consecutive in the range, of one kind, and a line (one day or one region)."""
    rng = random.Random(7)
    days = [f"2026-09-{d:02d}" for d in range(1, 9)]
    for _ in range(2000):
        d = rng.randint(1, 4)
        r = rng.randint(1, 5)
        d0, r0 = rng.randint(0, len(days) - d), rng.randint(0, len(REGIONS) - r)
        keys = keys_of(days[d0:d0 + d], REGIONS[r0:r0 + r])
        landed = {k for k in keys if rng.random() < 0.7}
        skip = frozenset(k for k in keys if rng.random() < 0.15)
        groups = line_groups(keys, landed.__contains__, skip)
        flat = [k for g in groups for k in g]
        assert flat == [k for k in keys if k not in skip]
        for g in groups:
            positions = [keys.index(k) for k in g]
            assert positions == list(range(positions[0], positions[0] + len(g))), (keys, g)
            assert len({k in landed for k in g}) == 1
            g_days = {split_partition_key(k)[0] for k in g}
            g_regions = {split_partition_key(k)[1] for k in g}
            assert len(g_days) == 1 or len(g_regions) == 1, g


def test_partitions_dead_lettered_at_different_phases_are_kinds_apart(tmp_path) -> None:  # noqa: ANN001
    """One dead-lettered at ingest, one at correlate: in one range the second's ingest would
    skip (an outcome) beside the first's refusal, and the step would fail; so they run apart."""
    from resources.landing import Landing
    from resources.landing_layout import PARTITION_FILES

    keys = keys_of(["2026-09-01"], REGIONS)
    for key in keys[:4]:  # r5 has not landed
        day, region = split_partition_key(key)
        folder = tmp_path / region / day
        folder.mkdir(parents=True)
        (folder / PARTITION_FILES[0]).write_text("x")
    dead = {keys[1]: "ingest", keys[2]: "correlate", keys[3]: "correlate"}
    kinds = range_kinds(keys, Landing(tmp_path), dead)
    assert kinds == {keys[0]: "to run", keys[1]: ("dead-lettered", "ingest"), keys[2]: ("dead-lettered", "correlate"),
                     keys[3]: ("dead-lettered", "correlate"), keys[4]: "not landed"}
    assert line_groups(keys, kinds.__getitem__) == [keys[:1], keys[1:2], keys[2:4], keys[4:]]
