"""The planner: how the selected partitions (keys) are cut into key ranges, one run each.

Every road to the phases takes its runs from here: the phase assets' backfill policy (a UI or
CLI backfill, cut by Dagster into ranges of at most :data:`MAX_PARTITIONS_PER_RUN`), the
schedule's and the sensors' run requests (:func:`range_run_requests`), the CLI's key ranges
(:func:`contiguous_groups`, sized by :func:`partitions_per_run`) and the cut of a queued range
by the kind of work of its partitions (:func:`line_groups`). A key range of (day, region)
partitions is a rectangle in Dagster's order (days, then the regions in the region file's
order), so every range here is one day's neighbouring regions, one region's consecutive days,
or the same neighbouring regions on consecutive days.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import dagster as dg

from resources.keys import RANGE_END_TAG, RANGE_START_TAG, partition_key, split_partition_key

if TYPE_CHECKING:
    from resources.landing import Landing

#: Partitions a key range run holds at most, whatever their size: the phase assets' backfill
#: policy (:data:`BACKFILL_POLICY`), the schedule's and the sensors' runs, and the CLI's runs of
#: big partitions (:func:`partitions_per_run`).
MAX_PARTITIONS_PER_RUN = 8
#: How Dagster cuts a backfill of the phase assets into runs: key ranges of the same size.
BACKFILL_POLICY = dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_PARTITIONS_PER_RUN)

#: A key range run holds at most ``MAX_PARTITIONS_PER_RUN`` partitions whatever their size (the
#: phase assets' backfill policy holds as many), and small ones as many as ``RUN_LANDING_BYTES``
#: of landing files, up to this many: Dagster's cost of a run (its creation, planned and step
#: events) is of the order of a small partition's phase work, so small partitions share runs.
MAX_SMALL_PARTITIONS_PER_RUN = 64
RUN_LANDING_BYTES = 64 * 1024 * 1024
#: Partitions whose landing folders are measured to size the runs (spread over the selection).
SIZE_SAMPLE = 32


def partitions_per_run(keys: list[str], landing: Landing) -> int:
    """How many partitions one key range run may hold: :data:`MAX_PARTITIONS_PER_RUN`, or more for
    small partitions, as many as :data:`RUN_LANDING_BYTES` of landing files would be at the size
    of the biggest of up to :data:`SIZE_SAMPLE` partitions spread over ``keys`` (a selection of
    small and big partitions is sized by the big ones), at most
    :data:`MAX_SMALL_PARTITIONS_PER_RUN`. Partitions whose landing files are gone take
    :data:`MAX_PARTITIONS_PER_RUN`.

    Example: partitions of 500 outage rows (about 110 kB of landing files) take 64 a run, of
    20,000 rows (2.4 MB) 27, of 200,000 rows (23 MB) 8.
    """
    if not keys:
        return MAX_PARTITIONS_PER_RUN
    step = max(1, len(keys) // SIZE_SAMPLE)
    biggest = max(landing.partition_bytes(region_id, day)
                  for day, region_id in map(split_partition_key, keys[::step][:SIZE_SAMPLE]))
    if not biggest:  # no landing files to go by (removed since ingest): the size of old
        return MAX_PARTITIONS_PER_RUN
    return int(max(MAX_PARTITIONS_PER_RUN, min(MAX_SMALL_PARTITIONS_PER_RUN, RUN_LANDING_BYTES // biggest)))


def contiguous_groups(keys: list[str], order: list[str], max_size: int) -> list[list[str]]:
    """Split ``keys`` into key ranges of at most ``max_size`` keys, each exactly what a run over
    its first to its last key covers.

    A range of (day, region) partitions is a rectangle: every day from the first key's to the
    last key's, times every region from the first key's to the last key's (in the region
    file's order). So a range is one day's neighbouring regions, one region's consecutive days,
    or (for runs of more than :data:`MAX_PARTITIONS_PER_RUN`) the same neighbouring regions on
    consecutive days, whichever way takes fewest runs (a day of 50 regions, a region's year, a
    week of every region); a run of neighbours longer than ``max_size`` is cut into parts as
    equal as possible. Keys outside ``order`` are ranges of their own. Ranges come in the order
    of their first key.
    """
    return min(range_groupings(keys, order, max_size), key=len)


def range_groupings(keys: list[str], order: list[str], max_size: int) -> tuple[list[list[str]], ...]:
    """The ways to cut ``keys`` into key ranges (see :func:`contiguous_groups`): by day, each range
    a day's neighbouring regions; by region, each range a region's consecutive days; and, for
    runs of more than :data:`MAX_PARTITIONS_PER_RUN` (small partitions), rectangles, each range
    the same neighbouring regions on consecutive days.

    Runs of at most 8 (partitions of 200,000 rows) keep to the first two: big partitions as one
    rectangle made a resumed run, which reads its inputs back from the lake, slower than two
    ranges of a line each."""
    pos = {k: i for i, k in enumerate(order)}
    region_rank = _region_ranks(order)
    known = sorted({k for k in keys if k in pos}, key=pos.__getitem__)
    parts = [(k, *split_partition_key(k)) for k in known]
    alone = [[k] for k in keys if k not in pos]

    def ordered(groups: list[list[str]]) -> list[list[str]]:
        return sorted(groups + alone, key=lambda g: (pos.get(g[0], len(order)), g[0]))

    groupings = [_runs(parts, along=lambda d, r: (d, region_rank[r]), max_size=max_size),
                 _runs(parts, along=lambda d, r: (r, dt.date.fromisoformat(d).toordinal()), max_size=max_size)]
    if max_size > MAX_PARTITIONS_PER_RUN:  # small partitions (big ones: see above)
        groupings.append([sorted(g, key=pos.__getitem__) for g in _rectangles(parts, region_rank, max_size=max_size)])
    return tuple(ordered(g) for g in groupings)


def _region_ranks(order: list[str]) -> dict[str, int]:
    """Each region's place in the partition order (the region file's order)."""
    ranks: dict[str, int] = {}
    for key in order:
        ranks.setdefault(split_partition_key(key)[1], len(ranks))
    return ranks


def _runs(parts: list[tuple[str, str, str]], *, along, max_size: int) -> list[list[str]]:  # noqa: ANN001
    """Keys in runs of neighbours: ``along(day, region)`` is (line, place), and neighbours are keys
    of one line at consecutive places; each run cut into parts of at most ``max_size``."""
    runs: list[list[str]] = []
    last: tuple[object, int] | None = None
    for key, day, region in sorted(parts, key=lambda p: along(p[1], p[2])):
        line, place = along(day, region)
        if last is None or line != last[0] or place != last[1] + 1:
            runs.append([])
        runs[-1].append(key)
        last = (line, place)
    return [part for run in runs for part in _cut(run, max_size)]


def _cut(items: list, max_size: int) -> list[list]:
    """``items`` in consecutive parts of at most ``max_size``, as equal as possible."""
    n = -(-len(items) // max(1, max_size))
    cuts = [round(i * len(items) / n) for i in range(n + 1)]
    return [items[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def _rectangles(parts: list[tuple[str, str, str]], region_rank: dict[str, int], *, max_size: int) -> list[list[str]]:
    """Keys in rectangles: each day's keys in runs of neighbouring regions, and a run continued
    over the following days that have the same one. A rectangle of more than ``max_size`` keys
    is cut into bands of whole days, or, when one day's run alone is longer, into parts of each
    day's run.

    A backfill of every region over a span of days is one rectangle, where cutting by day or by
    region makes a run per day or per region.
    """
    by_day: dict[int, list[tuple[int, str]]] = {}
    for key, day, region in parts:
        by_day.setdefault(dt.date.fromisoformat(day).toordinal(), []).append((region_rank[region], key))
    done: list[tuple[int, list[list[str]]]] = []  # (last day, each day's keys)
    growing: dict[tuple[int, int], tuple[int, list[list[str]]]] = {}  # (first, last rank) -> (last day, rows)
    for day in sorted(by_day):
        spans: list[list[tuple[int, str]]] = []
        for rank, key in sorted(by_day[day]):
            if spans and rank == spans[-1][-1][0] + 1:
                spans[-1].append((rank, key))
            else:
                spans.append([(rank, key)])
        now: dict[tuple[int, int], tuple[int, list[list[str]]]] = {}
        for span in spans:
            edge = (span[0][0], span[-1][0])
            row = [key for _, key in span]
            last = growing.pop(edge, None)
            if last is not None and last[0] == day - 1:
                last[1].append(row)
                now[edge] = (day, last[1])
            else:
                if last is not None:
                    done.append((last[0], last[1]))
                now[edge] = (day, [row])
        done.extend(growing.values())
        growing = now
    done.extend(growing.values())
    out: list[list[str]] = []
    for _, rows in done:
        if len(rows[0]) > max_size:
            out.extend(part for row in rows for part in _cut(row, max_size))
        else:
            out.extend([key for row in band for key in row] for band in _cut(rows, max(1, max_size // len(rows[0]))))
    return out


def line_groups(keys: Sequence[str], kind: Callable[[str], Hashable],
                skip: frozenset[str] = frozenset()) -> list[list[str]]:
    """``keys`` (a key range in Dagster's order: days, then regions) without ``skip``, cut into
    groups of consecutive keys of one ``kind`` (landed or not, dead-lettered or not), each a
    range of its own.

    A range over one day or one region is a line, cut where a skipped key is or where the kind
    changes; a range over several days and regions is cut at each day as well, so that every
    group is a range of one day's regions or one region's days.
    """
    days = {split_partition_key(k)[0] for k in keys}
    regions = {split_partition_key(k)[1] for k in keys}
    by_day = len(days) > 1 and len(regions) > 1
    groups: list[list[str]] = []
    last: tuple[str, Hashable] | None = None  # (day, kind) of the previous key kept, while consecutive
    for key in keys:
        if key in skip:
            last = None
            continue
        day = split_partition_key(key)[0] if by_day else ""
        state = (day, kind(key))
        if state != last:
            groups.append([])
        groups[-1].append(key)
        last = state
    return groups


def range_run_requests(keys: list[str], *, run_key: Callable[[list[str]], str],
                       tags: dict[str, str] | Callable[[list[str]], dict[str, str]],
                       asset_selection: Sequence[dg.AssetKey] | None = None,
                       asset_check_keys: Sequence[dg.AssetCheckKey] | None = None) -> list[dg.RunRequest]:
    """Run requests over ``keys`` in the key ranges a UI backfill's runs have: at most
    :data:`MAX_PARTITIONS_PER_RUN` partitions each, one day's neighbouring regions or one
    region's consecutive days (:func:`contiguous_groups`), so that the schedule's and the
    sensors' runs cost what a backfill's do, not a run (its creation, its launch, its events)
    per partition. A group of one is a request of that partition (its run carries the state
    hash as its data version); a longer one carries the range's tags, and the run coordinator
    cuts it as it cuts a backfill's (:mod:`pipeline.range_runs`): partitions that have not
    landed, or are dead-lettered, go to runs of their own. ``run_key`` names a group's run;
    ``tags`` are every run's, or a group's own when a callable. ``asset_selection`` and
    ``asset_check_keys`` (with the selection) narrow every run to those assets and checks (the
    outbox sensor's continuations: the phases after the one that completed).
    """
    from assets.partitions import region_ids

    # Dagster's order of the partitions of the keys' days: days, then the regions in their file's order.
    order = [partition_key(day, region) for day in sorted({split_partition_key(k)[0] for k in keys})
             for region in region_ids()]
    selection: dict[str, Any] = {}
    if asset_selection is not None:
        selection = {"asset_selection": list(asset_selection), "asset_check_keys": list(asset_check_keys or [])}
    requests = []
    for group in contiguous_groups(keys, order, MAX_PARTITIONS_PER_RUN):
        own = tags(group) if callable(tags) else tags
        if len(group) == 1:
            requests.append(dg.RunRequest(run_key=run_key(group), partition_key=group[0], tags=own, **selection))
        else:
            requests.append(dg.RunRequest(run_key=run_key(group), **selection,
                                          tags={**own, RANGE_START_TAG: group[0], RANGE_END_TAG: group[-1]}))
    return requests


def worker_blocks(keys: list[str], workers: int, max_per_run: int = MAX_PARTITIONS_PER_RUN) -> list[list[str]]:
    """The blocks of neighbouring keys the worker processes take one at a time.

    A block holds about the workers' share of the keys (``workers`` blocks when each worker's
    share fits in ``max_per_run``, else as many rounds of them as needed), and the process that
    takes it runs it in key ranges as :func:`run_partitions` does. Blocks are cut three ways,
    and the one whose workers would finish first (:func:`_makespan`, which counts each block's
    ranges, a run's cost being about half a partition's) is taken:

    - the keys in region order, then day (a region's days together), cut into equal blocks;
    - the keys in day order, then region (a day's regions together), cut into equal blocks;
    - blocks that are each one key range (a day's or a region's neighbours).

    16 keys (3 days of 6 regions, two days missing) for 2 workers are two blocks of 8: three
    regions' days each, run as one or two ranges; as single ranges they were six blocks of a
    region's days, three runs a worker, which took longer and more CPU time.

    A selection of at most :data:`MAX_PARTITIONS_PER_RUN` keys (or ``max_per_run``, when
    smaller) is one block: one process runs it, with no worker to start. A bigger one is
    shared out even when one run could take it all (small partitions): two processes of half
    as many partitions each finish first.
    """
    from assets.partitions import PARTITIONS

    if workers <= 1 or len(keys) <= min(max_per_run, MAX_PARTITIONS_PER_RUN):
        return [keys] if keys else []
    order = PARTITIONS.get_partition_keys()
    rounds = -(-len(keys) // (workers * max_per_run))
    size = -(-len(keys) // (workers * rounds))
    pos = {k: i for i, k in enumerate(order)}
    region_rank = _region_ranks(order)

    def by_region(key: str) -> tuple[int, str]:
        day, region = split_partition_key(key)
        return (region_rank.get(region, len(region_rank)), day)

    def by_day(key: str) -> int:
        return pos.get(key, len(order))

    def ranges(block: list[str]) -> int:
        return len(contiguous_groups(block, order, max_per_run))

    candidates = [[sorted(block, key=by_day) for block in _cut(sorted(keys, key=along), size)]
                  for along in (by_region, by_day)]
    candidates.append(min(range_groupings(keys, order, size), key=lambda blocks: _makespan(blocks, workers)))
    return min(candidates, key=lambda blocks: (_makespan(blocks, workers, ranges), len(blocks)))


def _makespan(blocks: list[list[str]], workers: int,
              ranges: Callable[[list[str]], int] = lambda _block: 1) -> float:
    """When the last worker would finish, each taking the next block as it is free (a block
    costs its partitions plus about half a partition for each of its runs, ``ranges(block)``)."""
    free = [0.0] * workers
    for block in blocks:
        i = free.index(min(free))
        free[i] += len(block) + 0.5 * ranges(block)
    return max(free)
