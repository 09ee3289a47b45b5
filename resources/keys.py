"""Partition keys: ``YYYY-MM-DD|region_id``, a (day, region) batch as Dagster's multi-partition
key prints it (its dimensions ordered by name: ``day``, then ``region``); and every run tag
stormlake sets or reads, its own and Dagster's, in one place (how keys become runs is
:mod:`assets.plan`)."""

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


#: The run tag that says who launched a run (the CLI, the schedule, a sensor).
LAUNCHED_BY = "stormlake/launched_by"

#: A forced re-run (``stormlake backfill --from PHASE --reason TEXT``, or these tags on any run):
#: the phase recomputed from, why, who asked, and the id the ledger records it under.
FROM_TAG, REASON_TAG, BY_TAG, FORCE_ID_TAG = "stormlake/from", "stormlake/reason", "stormlake/by", "stormlake/force_id"

#: The run tag under which a queued range run whose phase failed for some of its partitions
#: names them (a JSON list of keys), for the runs Dagster's retry of it becomes
#: (``assets.materialize``).
FAILED_PARTITIONS_TAG = "stormlake/failed_partitions"


#: Dagster's run tags around re-executions and run retries (the last two documented with run
#: retries): the run a re-execution re-executes, the automatic retry a failed run got, whether
#: a run is retried when a step fails, and how many runs its run group may count.
PARENT_RUN_TAG = "dagster/parent_run_id"
#: The backfill a run belongs to, and on a failed run that the daemon will retry it (run retries).
BACKFILL_TAG = "dagster/backfill"
PARTITION_TAG = "dagster/partition"  # the one partition of a run that is no key range
WILL_RETRY_TAG = "dagster/will_retry"
AUTO_RETRY_TAG = "dagster/auto_retry_run_id"
RETRY_ON_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
MAX_RETRIES_TAG = "dagster/max_retries"
#: The first and last key of a key range run: what the UI and the backfill daemon put on one, and
#: the only way to run a key range in process (``execute_in_process`` takes one partition key).
#: Dagster's own values, which it does not export; ``tests/integration/test_dagster_compat.py``
#: checks them against Dagster's.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def failed_partitions(tags: Mapping[str, str]) -> frozenset[str]:
    """The keys a run's tags name under :data:`FAILED_PARTITIONS_TAG` (none when the tag is
    missing, emptied or unreadable)."""
    try:
        names = json.loads(tags.get(FAILED_PARTITIONS_TAG) or "[]")
    except ValueError:
        return frozenset()
    return frozenset(str(n) for n in names) if isinstance(names, list) else frozenset()
