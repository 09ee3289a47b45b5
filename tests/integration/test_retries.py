"""Dagster's retry policy: transient failures are retried, a user's bad input never."""

from __future__ import annotations

import socket
from pathlib import Path

import dagster as dg
import pytest

from tests.helpers import KEY, materialize


def _retries(result: dg.ExecuteInProcessResult) -> int:
    return sum(ev.event_type_value == "STEP_UP_FOR_RETRY" for ev in result.all_events)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_transient_delivery_failure_is_retried_by_dagster(sl_env: dict[str, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Nobody listens there: every POST is refused, the webhook target gives up (transient).
    monkeypatch.setenv("STORMLAKE_WEBHOOK_URL", f"http://127.0.0.1:{_closed_port()}/hook")
    monkeypatch.setenv("STORMLAKE_WEBHOOK_TRIES", "1")
    monkeypatch.setenv("STORMLAKE_WEBHOOK_BACKOFF", "0")
    result = materialize(KEY)
    assert not result.success
    assert _retries(result) == 2  # the assets' policy: max_retries=2


def test_bad_input_is_not_retried(sl_env: dict[str, str]) -> None:
    day, _, region = KEY.partition("|")
    path = Path(sl_env["STORMLAKE_HOME"]) / "landing" / region / day / "weather.csv"
    path.write_bytes(b"station_id,region_id\n\xff\xfe\n")
    result = materialize(KEY)
    assert not result.success
    assert _retries(result) == 0
