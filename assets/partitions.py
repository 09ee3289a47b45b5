"""The partition space of every phase asset: days (UTC) × regions (contract section 2)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import dagster as dg

from resources.keys import partition_key, split_partition_key
from resources.settings import Region, load_regions, load_settings

if TYPE_CHECKING:
    from resources.landing import Landing


def regions() -> list[Region]:
    return load_regions(load_settings().regions_file)


def storm_partitions(region_list: list[Region] | None = None, first_day: str | None = None) -> dg.MultiPartitionsDefinition:
    """``day`` (daily, UTC, from ``STORMLAKE_FIRST_DAY``) × ``region`` (the region file).

    Dagster orders the dimensions by name, so keys read ``2026-09-01|gulf_coast``.
    """
    region_list = region_list if region_list is not None else regions()
    return dg.MultiPartitionsDefinition(
        {
            "day": dg.DailyPartitionsDefinition(start_date=first_day or load_settings().first_day, timezone="UTC"),
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


def landing_keys(landing: Landing, *, today: str | None = None) -> tuple[list[str], list[str]]:
    """``(keys, ignored)``: the landing zone's folders that are partitions, in (day, region) order,
    and those that are not (unknown region, before the first day, a day not over yet)."""
    today = today or dt.datetime.now(dt.UTC).date().isoformat()
    known, first = set(region_ids()), first_day()
    keys: list[str] = []
    ignored: list[str] = []
    for day, region in landing.partitions():
        (keys if region in known and first <= day < today else ignored).append(partition_key(day, region))
    return keys, ignored
