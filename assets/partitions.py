"""The partition space of every phase asset: days (UTC) × regions (contract section 2)."""

from __future__ import annotations

import dagster as dg

from resources.settings import Region, load_regions, load_settings


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
    day, _, region_id = str(key).partition("|")
    return day, region_id


PARTITIONS = storm_partitions()
