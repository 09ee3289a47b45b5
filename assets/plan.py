"""The planner: how the selected partitions (keys) are cut into key ranges, one run each.

Every road to the phases takes its runs from here: the phase assets' backfill policy (a UI or
CLI backfill, cut by Dagster into ranges of at most :data:`MAX_PARTITIONS_PER_RUN`), and the
schedule's and the sensors' run requests (:func:`range_run_requests`, in ranges cut the same way
by :func:`contiguous_groups`). A key range of (day, region) partitions is a rectangle in
Dagster's order (days, then the regions in the region file's order), so every range here is one
day's neighbouring regions or one region's consecutive days.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from resources.keys import RANGE_END_TAG, RANGE_START_TAG, partition_key, split_partition_key
from resources.settings import load_settings

#: Partitions a key range run holds at most, whatever their size (``STORMLAKE_PARTITIONS_PER_RUN``):
#: the phase assets' backfill policy (:data:`BACKFILL_POLICY`) and the schedule's and the sensors'
#: runs. Each run is a process of its own, so its start is paid once a range, not once a partition.
MAX_PARTITIONS_PER_RUN = load_settings().partitions_per_run
#: How Dagster cuts a backfill of the phase assets into runs: key ranges of the same size.
BACKFILL_POLICY = dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_PARTITIONS_PER_RUN)


def contiguous_groups(keys: list[str], order: list[str], max_size: int) -> list[list[str]]:
    """Split ``keys`` into key ranges of at most ``max_size`` keys, each exactly what a run over
    its first to its last key covers.

    A range of (day, region) partitions is a rectangle: every day from the first key's to the
    last key's, times every region from the first key's to the last key's (in the region
    file's order). So a range is one day's neighbouring regions or one region's consecutive
    days, whichever way takes fewest runs (a day of 50 regions, a region's year); a run of
    neighbours longer than ``max_size`` is cut into parts as equal as possible. Keys outside
    ``order`` are ranges of their own. Ranges come in the order of their first key.
    """
    pos = {k: i for i, k in enumerate(order)}
    region_rank = _region_ranks(order)
    known = sorted({k for k in keys if k in pos}, key=pos.__getitem__)
    parts = [(k, *split_partition_key(k)) for k in known]
    alone = [[k] for k in keys if k not in pos]

    def ordered(groups: list[list[str]]) -> list[list[str]]:
        return sorted(groups + alone, key=lambda g: (pos.get(g[0], len(order)), g[0]))

    groupings = [_runs(parts, along=lambda d, r: (d, region_rank[r]), max_size=max_size),
                 _runs(parts, along=lambda d, r: (r, dt.date.fromisoformat(d).toordinal()), max_size=max_size)]
    return min((ordered(g) for g in groupings), key=len)


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


def range_run_requests(keys: list[str], *, run_key: Callable[[list[str]], str],
                       tags: dict[str, str] | Callable[[list[str]], dict[str, str]],
                       asset_selection: Sequence[dg.AssetKey] | None = None,
                       asset_check_keys: Sequence[dg.AssetCheckKey] | None = None) -> list[dg.RunRequest]:
    """Run requests over ``keys`` in the key ranges a UI backfill's runs have: at most
    :data:`MAX_PARTITIONS_PER_RUN` partitions each, one day's neighbouring regions or one
    region's consecutive days (:func:`contiguous_groups`), so that the schedule's and the
    sensors' runs cost what a backfill's do, not a run (its creation, its launch, its events)
    per partition. A group of one is a request of that partition (its run carries the state
    hash as its data version); a longer one carries the range's tags. ``run_key`` names a group's run;
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
