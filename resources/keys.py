"""Partition keys: ``YYYY-MM-DD|region_id``, a (day, region) batch as Dagster's multi-partition
key prints it (its dimensions ordered by name: ``day``, then ``region``); how many of them a run
takes, stormlake's own run tags, and the run tags of Dagster's that stormlake reads or sets on
key range runs."""

from __future__ import annotations

import json
from collections.abc import Mapping

SEPARATOR = "|"


def partition_key(day: str, region_id: str) -> str:
    """The key of the batch of ``region_id`` on ``day``."""
    return f"{day}{SEPARATOR}{region_id}"


def split_partition_key(key: str) -> tuple[str, str]:
    """``(day, region_id)`` of a partition key."""
    day, _, region_id = str(key).partition(SEPARATOR)
    return day, region_id


#: Partitions a key range run holds at most, whatever their size: the phase assets' backfill
#: policy (a UI backfill's runs: Dagster cuts the selection into ranges of one day's regions or
#: one region's days, at most this many a run) and the CLI's runs of big partitions
#: (``pipeline.orchestrate.partitions_per_run``).
MAX_PARTITIONS_PER_RUN = 8

#: The run tag that says who launched a run (the CLI, the schedule, a sensor).
LAUNCHED_BY = "stormlake/launched_by"

#: The run tag under which a queued range run whose phase failed for some of its partitions
#: names them (a JSON list of keys), for the runs Dagster's retry of it becomes
#: (``pipeline.range_runs``).
FAILED_PARTITIONS_TAG = "stormlake/failed_partitions"


#: Dagster's run tags around re-executions and run retries (the last two documented with run
#: retries): the run a re-execution re-executes, the automatic retry a failed run got, whether
#: a run is retried when a step fails, and how many runs its run group may count.
PARENT_RUN_TAG = "dagster/parent_run_id"
AUTO_RETRY_TAG = "dagster/auto_retry_run_id"
RETRY_ON_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
MAX_RETRIES_TAG = "dagster/max_retries"


def failed_partitions(tags: Mapping[str, str]) -> frozenset[str]:
    """The keys a run's tags name under :data:`FAILED_PARTITIONS_TAG` (none when the tag is
    missing, emptied or unreadable)."""
    try:
        names = json.loads(tags.get(FAILED_PARTITIONS_TAG) or "[]")
    except ValueError:
        return frozenset()
    return frozenset(str(n) for n in names) if isinstance(names, list) else frozenset()
