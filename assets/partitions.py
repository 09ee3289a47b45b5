"""The partition space of every phase asset: days (UTC) × regions (contract section 2).

The day dimension runs from ``STORMLAKE_FIRST_DAY`` to the current UTC day included
(``end_offset=1``): the day in progress is a partition, served with the files landed so far and
recomputed as they grow (docs/LIVE.md). Which landing folders are partitions, and why each
other one is not, is :meth:`resources.landing.Landing.partition_keys`' call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from resources.keys import split_partition_key
from resources.landing import NotAPartition
from resources.settings import Region, load_regions, load_settings

if TYPE_CHECKING:
    from resources.landing import Landing


def regions() -> list[Region]:
    return load_regions(load_settings().regions_file)


def storm_partitions(region_list: list[Region] | None = None, first_day: str | None = None) -> dg.MultiPartitionsDefinition:
    """``day`` (daily, UTC, from ``STORMLAKE_FIRST_DAY`` to today) × ``region`` (the region file).

    Dagster orders the dimensions by name, so keys read ``2026-09-01|gulf_coast``. Daily
    partitions end at the last complete day unless ``end_offset`` says otherwise; ``1`` adds the
    day in progress.
    """
    region_list = region_list if region_list is not None else regions()
    return dg.MultiPartitionsDefinition(
        {
            "day": dg.DailyPartitionsDefinition(start_date=first_day or load_settings().first_day, timezone="UTC",
                                                end_offset=1),
            "region": dg.StaticPartitionsDefinition([r.region_id for r in region_list]),
        }
    )


def split_key(key: str | dg.MultiPartitionKey) -> tuple[str, str]:
    """``(day, region_id)`` of a multi-partition key."""
    if isinstance(key, dg.MultiPartitionKey):
        dims = key.keys_by_dimension
        return dims["day"], dims["region"]
    return split_partition_key(str(key))


PARTITIONS = storm_partitions()


def day_dimension() -> dg.DailyPartitionsDefinition:
    day_def = PARTITIONS.get_partitions_def_for_dimension("day")
    assert isinstance(day_def, dg.DailyPartitionsDefinition)
    return day_def


def region_ids() -> list[str]:
    return list(PARTITIONS.get_partitions_def_for_dimension("region").get_partition_keys())


def first_day() -> str:
    return day_dimension().start.date().isoformat()


def landing_keys(landing: Landing, *, today: str | None = None) -> tuple[list[str], list[NotAPartition]]:
    """``(keys, rejected)`` of :meth:`Landing.partition_keys` for this partition space: its
    regions, from its first day to ``today`` (default: the current UTC day)."""
    return landing.partition_keys(region_ids(), first_day(), today=today)
