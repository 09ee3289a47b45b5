"""Settings read from the environment: the lake's log retention, the executor and its broker (extensions of contract section 1)."""

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


@pytest.mark.parametrize(("name", "bad", "says"), [
    ("STORMLAKE_WEBHOOK_TRIES", "nan", "whole number"),
    ("STORMLAKE_WEBHOOK_TRIES", "inf", "whole number"),
    ("STORMLAKE_WEBHOOK_TRIES", "0", "whole number"),
    ("STORMLAKE_WORKERS", "\u00b2", "whole number"),  # a digit to str.isdigit, not to int()
    ("STORMLAKE_WEBHOOK_TIMEOUT", "nan", "finite number"),
    ("STORMLAKE_WEBHOOK_TIMEOUT", "inf", "finite number"),
    ("STORMLAKE_WEBHOOK_TIMEOUT", "0", "above 0"),
    ("STORMLAKE_WEBHOOK_BACKOFF", "-1", "at least 0"),
])
def test_a_bad_number_setting_is_a_config_error_naming_it(name: str, bad: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}=.*{says}"):
        load_settings({name: bad})


def test_the_webhook_url_must_be_http_with_a_host_and_its_value_is_never_repeated() -> None:
    good = "https://hook:S3CRET@consumer.example:8443/in?token=T0KEN"
    assert load_settings({"STORMLAKE_WEBHOOK_URL": good}).webhook_url == good
    for bad in ("garbage", "htp://hook:S3CRET@x/in", "https:///in?token=S3CRET", "http://x:port/in"):
        with pytest.raises(ConfigError, match="STORMLAKE_WEBHOOK_URL is not an http") as raised:
            load_settings({"STORMLAKE_WEBHOOK_URL": bad})
        assert "S3CRET" not in str(raised.value) and bad not in str(raised.value)


def test_a_webhook_s_errors_and_receipts_show_its_url_without_secrets() -> None:
    import doctest

    import resources.publisher as publisher

    assert doctest.testmod(publisher).failed == 0
    target = publisher.WebhookTarget("http://hook:S3CRET@127.0.0.1:1/in?token=T0KEN", max_tries=1, timeout_s=1)
    artifact = publisher.Artifact("gulf_coast", "2026-09-01", "summary.json", b"{}")
    assert target.shown_ref(artifact) == "http://127.0.0.1:1/in?\u2026"
    with pytest.raises(publisher.DeliveryExhausted) as raised:  # nothing listens on port 1
        target.deliver(artifact, supersedes=None)
    assert "S3CRET" not in str(raised.value) and "T0KEN" not in str(raised.value)
    assert "http://127.0.0.1:1/in?\u2026" in str(raised.value)


def test_a_day_setting_takes_only_yyyy_mm_dd_and_a_folder_setting_no_file(tmp_path) -> None:  # noqa: ANN001
    for bad in ("20260901", "2026-W36-2", "2026-13-01"):
        with pytest.raises(ConfigError, match="STORMLAKE_FIRST_DAY=.*YYYY-MM-DD"):
            load_settings({"STORMLAKE_FIRST_DAY": bad})
    a_file = tmp_path / "a_file"
    a_file.write_text("x\n")
    for name, value in (("STORMLAKE_PUBLISH_DIR", a_file), ("STORMLAKE_LAKE", a_file / "lake")):
        with pytest.raises(ConfigError, match=f"{name}=.*{a_file} is a file, not a folder"):
            load_settings({name: str(value), "STORMLAKE_HOME": str(tmp_path)})
    fine = load_settings({"STORMLAKE_PUBLISH_DIR": str(tmp_path / "not" / "made" / "yet"), "STORMLAKE_HOME": str(tmp_path)})
    assert fine.publish_dir == tmp_path / "not" / "made" / "yet"


def test_a_yaml_region_list_of_plain_values_names_the_file_and_the_item(tmp_path) -> None:  # noqa: ANN001
    from resources.settings import load_regions

    path = tmp_path / "regions.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"regions\.yaml: region 1 of the list is str 'a', not a mapping"):
        load_regions(path)


def test_an_age_further_back_than_the_calendar_reads_as_every_time() -> None:
    import datetime as dt

    from pipeline.cli import _since

    assert _since("99999999999d") == dt.datetime(1, 1, 1, tzinfo=dt.UTC)
    assert dt.datetime.now(dt.UTC) - _since("2h") < dt.timedelta(hours=2, minutes=5)


def test_the_landing_lake_and_publish_settings_take_an_s3_url_and_never_repeat_a_bad_one() -> None:
    got = load_settings({"STORMLAKE_LANDING": "s3://storm/landing/", "STORMLAKE_LAKE": "s3://storm/lake",
                         "STORMLAKE_PUBLISH_DIR": "s3://storm"})
    assert (got.landing, got.lake, got.publish_dir) == ("s3://storm/landing", "s3://storm/lake", "s3://storm")
    for name in ("STORMLAKE_LANDING", "STORMLAKE_PUBLISH_DIR"):
        for bad in ("s3://key:S3CRET@storm/x", "http://host/S3CRET", "s3://storm/x?token=S3CRET", "s3:///S3CRET"):
            with pytest.raises(ConfigError, match=f"{name} is a URL but not s3://bucket/prefix") as caught:
                load_settings({name: bad})
            assert "S3CRET" not in str(caught.value)


def test_the_executor_setting_picks_dagsters_executor_and_celery_needs_a_redis_broker() -> None:
    import dagster as dg

    from pipeline.engine import executor_def

    assert load_settings({}).executor == "in_process" and load_settings({}).broker_url is None
    assert executor_def(load_settings({})) is dg.in_process_executor
    assert executor_def(load_settings({"STORMLAKE_EXECUTOR": "multiprocess"})) is dg.multiprocess_executor
    url = "redis://:S3CRET@broker.internal:6379/0"
    celery = load_settings({"STORMLAKE_EXECUTOR": "celery", "STORMLAKE_BROKER_URL": url})
    assert celery.broker_url == url and celery.redeliver_after_s == 3600
    assert executor_def(celery).name == "celery"  # its broker is read from the environment inside the run
    with pytest.raises(ConfigError, match="STORMLAKE_EXECUTOR=celery needs STORMLAKE_BROKER_URL"):
        load_settings({"STORMLAKE_EXECUTOR": "celery"})
    with pytest.raises(ConfigError, match="STORMLAKE_EXECUTOR='dask': use in_process or multiprocess or celery"):
        load_settings({"STORMLAKE_EXECUTOR": "dask"})
    for bad in ("amqp://u:S3CRET@host//", "redis://", "S3CRET"):
        with pytest.raises(ConfigError, match="STORMLAKE_BROKER_URL is not a redis") as raised:
            load_settings({"STORMLAKE_EXECUTOR": "celery", "STORMLAKE_BROKER_URL": bad})
        assert "S3CRET" not in str(raised.value)
    with pytest.raises(ConfigError, match="STORMLAKE_REDELIVER_AFTER"):
        load_settings({"STORMLAKE_REDELIVER_AFTER": "0"})
