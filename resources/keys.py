"""Partition keys: ``YYYY-MM-DD|region_id``, a (day, region) batch as Dagster's multi-partition
key prints it (its dimensions ordered by name: ``day``, then ``region``)."""

from __future__ import annotations

SEPARATOR = "|"


def partition_key(day: str, region_id: str) -> str:
    """The key of the batch of ``region_id`` on ``day``."""
    return f"{day}{SEPARATOR}{region_id}"


def split_partition_key(key: str) -> tuple[str, str]:
    """``(day, region_id)`` of a partition key."""
    day, _, region_id = str(key).partition(SEPARATOR)
    return day, region_id
