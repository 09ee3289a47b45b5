"""A queued key range run, cut before it starts into runs that each suit one kind of work.

A UI backfill's runs are key ranges of up to ``MAX_PARTITIONS_PER_RUN`` partitions (the phase
assets' backfill policy), cut by Dagster from the selection: one day's regions, or one region's
days. Two things must not happen to such a range, and :func:`cut` prevents them when the run
reaches the run queue (stormlake's run coordinator, :mod:`pipeline.launcher`):

- **Partitions that have not landed, or are dead-lettered, next to ones to run.** A step over a
  range materializes all of its partitions or none, so a range of both cannot pass over the
  ones without files or the dead-lettered ones (a run over only those ends successfully with
  nothing read or written, saying why). Such a range becomes runs of consecutive partitions of
  one kind (:func:`range_kinds`). A partition counts as dead-lettered here when one of its
  head checkpoints failed ``STORMLAKE_DEAD_LETTER_AFTER`` times (a quick read of the ledger,
  ``pipeline.launcher.dead_lettered``), and its kind is the first such phase. Whether its
  current inputs are the ones that failed is the step's to say: if they changed, the partition
  runs in a smaller range than it could have; if the ledger could not be read, a dead-lettered
  partition in a range fails it, and the range's retry leaves it out (below).
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

import json
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from assets.plan import line_groups
from resources import dagster_compat
from resources.keys import (
    AUTO_RETRY_TAG,
    COPIES_TAG,
    FAILED_PARTITIONS_TAG,
    MAX_RETRIES_TAG,
    PARENT_RUN_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    RETRY_ON_FAILURE_TAG,
    failed_partitions,
    split_partition_key,
)

if TYPE_CHECKING:
    from resources.landing import Landing



def failed_in_parent(instance: dg.DagsterInstance, run: dg.DagsterRun) -> frozenset[str]:
    """The partitions the run's parent named as failed, when the run is Dagster's automatic retry
    of it (the parent's ``dagster/auto_retry_run_id``). A re-execution a person launches ("Re-execute
    from failure", once the bad file is mended) runs every partition of its range again."""
    parent_id = run.tags.get(PARENT_RUN_TAG)
    parent = instance.get_run_by_id(parent_id) if parent_id else None
    if parent is None or parent.tags.get(AUTO_RETRY_TAG) != run.run_id:
        return frozenset()
    return failed_partitions(parent.tags)


def range_keys(run: dg.DagsterRun) -> list[str] | None:
    """The keys of a run over a range of stormlake's partitions, in Dagster's order; None for any other run."""
    from assets.partitions import PARTITIONS

    start, end = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
    if not start or not end:
        return None
    if not (PARTITIONS.has_partition_key(start) and PARTITIONS.has_partition_key(end)):
        return None
    return [str(k) for k in PARTITIONS.get_partition_keys_in_range(dg.PartitionKeyRange(start, end))]


def landed_keys(keys: Sequence[str], landing: Landing) -> set[str]:
    """The keys with at least one landing file."""
    landed = set()
    for key in keys:
        day, region_id = split_partition_key(key)
        if landing.has_partition_files(region_id, day):
            landed.add(key)
    return landed


def range_kinds(keys: Sequence[str], landing: Landing, dead: Mapping[str, str],
                landed: set[str] | None = None) -> dict[str, Hashable]:
    """Each key's kind of work: not landed (no landing file; ``landed``, when the caller looked
    already), dead-lettered at a phase (``dead``: the first phase whose head failed too often),
    or to run. Partitions dead-lettered at different phases are of different kinds: the earlier
    phases of the later ones still run."""
    landed = landed_keys(keys, landing) if landed is None else landed

    def kind(key: str) -> Hashable:
        if key not in landed:
            return "not landed"
        return ("dead-lettered", dead[key]) if key in dead else "to run"

    return {key: kind(key) for key in keys}


def cut(instance: dg.DagsterInstance, workspace: object, run: dg.DagsterRun, landing: Landing,
        dead_letters: Callable[[list[str]], Mapping[str, str]]) -> list[dg.DagsterRun]:
    """The runs to submit for ``run``: itself, or itself over its first group and a copy for each other.

    Only a run not started yet is cut. The copies' ids are kept on the run (:data:`COPIES_TAG`),
    so a submission that is made again (the daemon stopped between the cut and the submissions)
    submits the copies that are still waiting instead of cutting again. A copy that cannot be
    made leaves the run uncut (the copies made so far are deleted): it then runs as Dagster
    planned it.
    """
    if run.status != dg.DagsterRunStatus.NOT_STARTED:
        return [run]
    if run.tags.get(COPIES_TAG):
        waiting = [instance.get_run_by_id(run_id) for run_id in json.loads(run.tags[COPIES_TAG])]
        return [run, *(r for r in waiting if r is not None and r.status == dg.DagsterRunStatus.NOT_STARTED)]
    keys = range_keys(run)
    if keys is None:
        return [run]

    landed = landed_keys(keys, landing)
    # Only a landed partition can be dead-lettered: a range with nothing landed asks the ledger nothing.
    kinds = range_kinds(keys, landing, dead_letters(sorted(landed)) if landed else {}, landed)
    skip = failed_in_parent(instance, run)
    groups = line_groups(keys, kinds.__getitem__, skip)
    cut_needed = groups not in ([], [keys])
    inherited: dict[str, str] = {}
    if skip:
        # A retry carries its parent's tags: the failed partitions, the retry on a step failure
        # the parent's step asked for, and a retry limit counted for the parent's run group.
        # None holds for the retry's runs; they keep the instance's retries of a crashed run.
        group = instance.get_run_group(run.run_id)
        runs_in_group = (len(group[1]) if group else 1) + max(0, len(groups) - 1)
        inherited = {FAILED_PARTITIONS_TAG: "", RETRY_ON_FAILURE_TAG: "false",
                     MAX_RETRIES_TAG: str(runs_in_group + instance.run_retries_max_retries)}
    if not cut_needed:
        if inherited:
            instance.add_run_tags(run.run_id, inherited)
        return [run]
    first, *rest = groups
    copies: list[dg.DagsterRun] = []
    snapshots = dagster_compat.run_snapshots(instance, run)  # for every copy and the re-planning
    try:
        for group_keys in rest:
            tags = {**run.tags, RANGE_START_TAG: group_keys[0], RANGE_END_TAG: group_keys[-1], **inherited}
            copies.append(dagster_compat.copy_run(instance, workspace, run, tags, snapshots=snapshots))
    except (dg.DagsterError, ValueError) as exc:
        for copy in copies:
            instance.delete_run(copy.run_id)
        instance.report_engine_event(f"stormlake: the range was not cut ({exc.__class__.__name__}: {exc}); "
                                     "it runs as planned", run)
        return [run]
    instance.add_run_tags(run.run_id, {RANGE_START_TAG: first[0], RANGE_END_TAG: first[-1], **inherited,
                                       COPIES_TAG: json.dumps([c.run_id for c in copies])})
    _replan_failed(instance, run, skip & set(keys), plan=snapshots[0])
    return [instance.get_run_by_id(run.run_id) or run, *copies]


def _replan_failed(instance: dg.DagsterInstance, retry: dg.DagsterRun, failed: set[str], *, plan: object) -> None:
    """The retry planned the partitions its parent failed before they were taken out of it: plan
    them again in the parent, so that the UI shows them failed, not never run, once the retry
    has succeeded (:func:`resources.dagster_compat.replan_in_failed_run`). Only the UI's colour
    depends on it: a failure to write is said in the daemon's log and the cut stands."""
    parent_id = retry.tags.get(PARENT_RUN_TAG)
    if not failed or not parent_id:
        return
    try:
        dagster_compat.replan_in_failed_run(instance, parent_id, retry, sorted(failed), plan=plan)
    except Exception as exc:  # noqa: BLE001 - the cut is done; the UI's colour of a failed partition waits
        logging.getLogger(__name__).warning("stormlake: could not plan the failed partitions %s again in run %s"
                                            " (%s: %s)", sorted(failed), parent_id, exc.__class__.__name__, exc)
