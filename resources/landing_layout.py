"""Where the files of the landing zone are (contract section 3), as landing-relative paths.

Free of Dagster, so that the ingest transform and the scenario generator, which run without it,
name the files from here as :class:`resources.landing.Landing` does.
"""

from __future__ import annotations

OUTAGES_FILE = "outages.csv"
WEATHER_FILE = "weather.csv"
CUSTOMERS_FILE = "reference/customers.csv"
TERRAIN_FILE = "reference/terrain.csv"
PARTITION_FILES = (OUTAGES_FILE, WEATHER_FILE)  # in every <region_id>/<YYYY-MM-DD>/ folder
REFERENCE_FILES = (CUSTOMERS_FILE, TERRAIN_FILE)  # shared by every partition


def partition_file(region_id: str, day: str, name: str) -> str:
    """The landing-relative path of one of a partition's files (``name``: one of PARTITION_FILES)."""
    return f"{region_id}/{day}/{name}"


def input_files(region_id: str, day: str) -> tuple[str, str, str, str]:
    """The landing-relative paths of the files the ingest of a partition reads.

    In the order outages, weather, customers, terrain.
    """
    return (partition_file(region_id, day, OUTAGES_FILE), partition_file(region_id, day, WEATHER_FILE),
            CUSTOMERS_FILE, TERRAIN_FILE)
