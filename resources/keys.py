"""Partition keys: ``YYYY-MM-DD|region_id``, a (day, region) batch as Dagster's multi-partition
key prints it (its dimensions ordered by name: ``day``, then ``region``); and every run tag
stormlake sets or reads, its own and Dagster's, in one place (how keys become runs is
:mod:`assets.plan`)."""

from __future__ import annotations

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

#: The backfill a run belongs to; on a failed run, that the daemon will retry it, and the retry
#: it got (run retries).
BACKFILL_TAG = "dagster/backfill"
PARTITION_TAG = "dagster/partition"  # the one partition of a run that is no key range
WILL_RETRY_TAG = "dagster/will_retry"
AUTO_RETRY_TAG = "dagster/auto_retry_run_id"
#: The first and last key of a key range run: what the UI and the backfill daemon put on one, and
#: the only way to run a key range in process (``execute_in_process`` takes one partition key).
#: Dagster's own values, which it does not export; ``tests/integration/test_dagster_compat.py``
#: checks them against Dagster's.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"

