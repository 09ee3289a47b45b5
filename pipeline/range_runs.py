"""A queued key range run, cut before it starts into runs that each suit one kind of work.

A UI backfill's runs are key ranges of up to ``MAX_PARTITIONS_PER_RUN`` partitions (the phase
assets' backfill policy), cut by Dagster from the selection: one day's regions, or one region's
days. Two things must not happen to such a range, and :func:`cut` prevents them when the run
reaches the run queue (stormlake's run coordinator, :mod:`pipeline.launcher`):

- **Partitions that have not landed next to ones that have.** A step over a range materializes
  all of its partitions or none, so a range of both cannot pass over the ones without files (a
  run over only those ends successfully with nothing read or written). Such a range becomes
  runs of consecutive partitions that all landed or all did not.
- **A failure that costs the range.** A phase that fails for one partition fails the run's
  later steps for every partition of the range. The failing step names its failed partitions
  and asks Dagster to retry the run (``assets.materialize``); the retry (from the failed step
  on) arrives here and becomes runs over the range's other partitions, in ranges of
  consecutive ones. The failed partitions are not run again: their error is in the failed run
  and in the ledger. A backfill waits for the retry and its runs (each carries the backfill's
  tag) and ends with only the failed partitions (and their later phases) failed, as the CLI's
  regrouping does (``pipeline.orchestrate``).

The first group keeps the submitted run (its range tags are rewritten); every other group is a
copy of it with its own range (:func:`resources.dagster_compat.copy_run`), in the same backfill
and run group. A range that needs no cut is submitted as it is; so is every run that is not a
key range of stormlake's partitions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from resources import dagster_compat
from resources.keys import FAILED_PARTITIONS_TAG, failed_partitions, split_partition_key

if TYPE_CHECKING:
    from resources.landing import Landing

RANGE_START_TAG, RANGE_END_TAG = dagster_compat.partition_range_tags()
# Dagster's documented run tags: the run a re-execution re-executes, and whether a run is
# retried when a step fails.
PARENT_RUN_TAG = "dagster/parent_run_id"
RETRY_ON_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"


def line_groups(keys: Sequence[str], landed: Callable[[str], bool], skip: frozenset[str] = frozenset()) -> list[list[str]]:
    """``keys`` (a key range in Dagster's order: days, then regions) without ``skip``, cut into
    groups of consecutive keys that all landed or all did not, each a range of its own.

    A range over one day or one region is a line, cut where a skipped key is or where
    ``landed`` changes; a range over several days and regions is cut at each day as well, so that
    every group is a range of one day's regions or one region's days.
    """
    days = {split_partition_key(k)[0] for k in keys}
    regions = {split_partition_key(k)[1] for k in keys}
    by_day = len(days) > 1 and len(regions) > 1
    groups: list[list[str]] = []
    last: tuple[str, bool] | None = None  # (day, landed) of the previous key kept, while consecutive
    for key in keys:
        if key in skip:
            last = None
            continue
        day = split_partition_key(key)[0] if by_day else ""
        state = (day, landed(key))
        if state != last:
            groups.append([])
        groups[-1].append(key)
        last = state
    return groups


def failed_in_parent(instance: dg.DagsterInstance, run: dg.DagsterRun) -> frozenset[str]:
    """The partitions the run's parent (the run it re-executes) named as failed, if any."""
    parent_id = run.tags.get(PARENT_RUN_TAG)
    parent = instance.get_run_by_id(parent_id) if parent_id else None
    return failed_partitions(parent.tags) if parent is not None else frozenset()


def range_keys(run: dg.DagsterRun) -> list[str] | None:
    """The keys of a run over a range of stormlake's partitions, in Dagster's order; None for any other run."""
    from assets.partitions import PARTITIONS

    start, end = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
    if not start or not end:
        return None
    if not (PARTITIONS.has_partition_key(start) and PARTITIONS.has_partition_key(end)):
        return None
    return [str(k) for k in PARTITIONS.get_partition_keys_in_range(dg.PartitionKeyRange(start, end))]


def cut(instance: dg.DagsterInstance, workspace: object, run: dg.DagsterRun, landing: Landing) -> list[dg.DagsterRun]:
    """The runs to submit for ``run``: itself, or itself over its first group and a copy for each other."""
    keys = range_keys(run)
    if keys is None:
        return [run]

    def landed(key: str) -> bool:
        day, region_id = split_partition_key(key)
        return landing.has_partition_files(region_id, day)

    skip = failed_in_parent(instance, run)
    # A retry carries its parent's tags: the failed partitions, and the retry on a step failure
    # that the parent's step asked for. Neither holds for the retry's own runs.
    inherited = {FAILED_PARTITIONS_TAG: "", RETRY_ON_FAILURE_TAG: "false"} if skip else {}
    groups = line_groups(keys, landed, skip)
    if not groups or (len(groups) == 1 and groups[0] == keys):
        if inherited:
            instance.add_run_tags(run.run_id, inherited)
        return [run]
    first, *rest = groups
    instance.add_run_tags(run.run_id, {RANGE_START_TAG: first[0], RANGE_END_TAG: first[-1], **inherited})
    runs = [instance.get_run_by_id(run.run_id) or run]
    for group in rest:
        tags = {**run.tags, RANGE_START_TAG: group[0], RANGE_END_TAG: group[-1], **inherited}
        runs.append(dagster_compat.copy_run(instance, workspace, run, tags))
    return runs
