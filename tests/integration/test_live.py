"""The day in progress is a partition; a landing folder that is not one is named with its reason;
a partition Dagster refuses fails alone, in one line, while the others run."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

from assets.partitions import PARTITIONS, landing_keys, storm_partitions
from resources.landing import Landing, utc_today
from tests.helpers import materialize


def _day(offset: int) -> str:
    return (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=offset)).isoformat()


def test_the_day_dimension_ends_with_today() -> None:
    day_keys = PARTITIONS.get_partitions_def_for_dimension("day").get_partition_keys()
    assert day_keys[-1] == utc_today()
    assert PARTITIONS.has_partition_key(f"{utc_today()}|gulf_coast")
    assert not PARTITIONS.has_partition_key(f"{_day(1)}|gulf_coast")
    # At any moment of a day, the dimension's last key is that day (not the day before).
    at = dt.datetime(2026, 12, 5, 0, 0, 1, tzinfo=dt.UTC)
    days = storm_partitions(first_day="2026-12-01").get_partitions_def_for_dimension("day")
    assert days.get_partition_keys(current_time=at)[-1] == "2026-12-05"


def test_landing_keys_names_every_folder_that_is_not_a_partition(sl_env: dict[str, str]) -> None:
    landing = Path(sl_env["STORMLAKE_HOME"]) / "landing"
    today, tomorrow = _day(0), _day(1)
    source = landing / "gulf_coast" / "2026-09-01"
    for folder in (f"gulf_coast/{today}", f"gulf_coast/{tomorrow}", "gulf_coast/2026-08-31", "gulf_coast/latest",
                   "gulf_coast/2026-02-30", "atlantis/2026-09-01", "Gulf Coast/2026-09-01"):
        shutil.copytree(source, landing / folder)
    (landing / "_scratch" / "2026-09-01").mkdir(parents=True)  # a folder starting with _ holds no partition

    keys, rejected = landing_keys(Landing(landing))
    assert keys == ["2026-09-01|gulf_coast", "2026-09-01|pine_belt", "2026-09-02|gulf_coast",
                    "2026-09-02|pine_belt", f"{today}|gulf_coast"]
    reasons = {r.folder: r.reason for r in rejected}
    assert sorted(reasons) == sorted([f"gulf_coast/{tomorrow}", "gulf_coast/2026-08-31", "gulf_coast/latest",
                                      "gulf_coast/2026-02-30", "atlantis/2026-09-01", "Gulf Coast/2026-09-01"])
    assert "after today" in reasons[f"gulf_coast/{tomorrow}"]
    assert "STORMLAKE_FIRST_DAY" in reasons["gulf_coast/2026-08-31"]
    assert "not a day" in reasons["gulf_coast/latest"] and "not a day" in reasons["gulf_coast/2026-02-30"]
    assert "region file" in reasons["atlantis/2026-09-01"]
    assert "not a region id" in reasons["Gulf Coast/2026-09-01"]
    line = str(next(r for r in rejected if r.folder == f"gulf_coast/{tomorrow}"))
    assert line.startswith(f"landing folder gulf_coast/{tomorrow}: ") and "\n" not in line


def test_todays_partition_materializes(sl_env: dict[str, str]) -> None:
    landing = Path(sl_env["STORMLAKE_HOME"]) / "landing"
    today = _day(0)
    shutil.copytree(landing / "gulf_coast" / "2026-09-01", landing / "gulf_coast" / today)
    # Its rows are reported on 2026-09-01: quarantined as outside today's day, but the partition runs.
    result = materialize(f"{today}|gulf_coast")
    assert result.success
    assert {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()} >= {
        "outages_raw", "region_day_summary"}
