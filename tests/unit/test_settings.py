"""Settings read from the environment: the lake's log retention (an extension of contract section 1)."""

from __future__ import annotations

import pytest

from resources.errors import ConfigError
from resources.settings import DEFAULT_LAKE_LOG_RETENTION_MINUTES, load_settings


def test_the_lakes_log_retention_defaults_to_two_minutes_and_takes_whole_minutes() -> None:
    assert load_settings({}).lake_log_retention_minutes == DEFAULT_LAKE_LOG_RETENTION_MINUTES == 2
    assert load_settings({"STORMLAKE_LAKE_LOG_RETENTION_MINUTES": "1"}).lake_log_retention_minutes == 1
    assert load_settings({"STORMLAKE_LAKE_LOG_RETENTION_MINUTES": "1440"}).lake_log_retention_minutes == 1440
    # 0 would remove commits that concurrent writers are still reading (they would fail and retry)
    for bad in ("0", "-1", "2.5", "two"):
        with pytest.raises(ConfigError, match="STORMLAKE_LAKE_LOG_RETENTION_MINUTES=.* whole number of at least 1"):
            load_settings({"STORMLAKE_LAKE_LOG_RETENTION_MINUTES": bad})
