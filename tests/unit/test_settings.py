"""Settings read from the environment: the lake's log retention (an extension of contract section 1)."""

from __future__ import annotations

import pytest

from resources.errors import ConfigError
from resources.settings import DEFAULT_LAKE_LOG_RETENTION_MINUTES, load_settings


def test_the_lakes_log_retention_defaults_to_two_minutes_and_takes_whole_minutes_from_zero() -> None:
    assert load_settings({}).lake_log_retention_minutes == DEFAULT_LAKE_LOG_RETENTION_MINUTES == 2
    assert load_settings({"STORMLAKE_LAKE_LOG_RETENTION_MINUTES": "0"}).lake_log_retention_minutes == 0
    assert load_settings({"STORMLAKE_LAKE_LOG_RETENTION_MINUTES": "1440"}).lake_log_retention_minutes == 1440
    for bad in ("-1", "2.5", "two"):
        with pytest.raises(ConfigError, match="STORMLAKE_LAKE_LOG_RETENTION_MINUTES=.* whole number of at least 0"):
            load_settings({"STORMLAKE_LAKE_LOG_RETENTION_MINUTES": bad})
