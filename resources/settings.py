"""Settings (contract section 1) and the region list (contract section 2), read in one place.

Every path and switch stormlake uses comes from :func:`load_settings`; nothing else reads the
environment for them. Values are resolved once per process.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from resources.errors import ConfigError

DEFAULT_REGIONS_FILE = Path(__file__).with_name("regions.csv")
DEFAULT_FIRST_DAY = "2026-09-01"
DEFAULT_LAKE_LOG_RETENTION_MINUTES = 2  # how long a Delta log keeps older commits (resources/lake.py says why)
DEFAULT_DEAD_LETTER_AFTER = 3  # failed attempts of the same inputs after which a phase waits for a person
DEFAULT_WRITE_TOGETHER = 8  # small partitions of a range step whose tables share a Delta commit
DEFAULT_PARTITIONS_PER_RUN = 32  # partitions a key range run holds at most (the phases' backfill policy)
#: Seconds after which the broker hands a step whose worker never acknowledged it (a worker lost
#: with its host) to another worker; longer than any step runs, or a running step is handed out twice.
DEFAULT_REDELIVER_AFTER_S = 3600
EXECUTORS = ("in_process", "multiprocess", "celery")
DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
REGION_ID_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
REGION_FIELDS = ("region_id", "name", "min_lat", "max_lat", "min_lon", "max_lon")


@dataclass(frozen=True)
class Region:
    """One region of the partition dimension: an id and a lat/lon bounding box."""

    region_id: str
    name: str
    min_lat: float
    max_lat: float
    min_lon: float
    max_lon: float

    def contains(self, lat: float, lon: float) -> bool:
        return self.min_lat <= lat <= self.max_lat and self.min_lon <= lon <= self.max_lon

    def fingerprint(self) -> str:
        """The region's definition as text, hashed into the input hash of ingest."""
        return f"{self.region_id}|{self.min_lat!r}|{self.max_lat!r}|{self.min_lon!r}|{self.max_lon!r}"


@dataclass(frozen=True)
class Settings:
    """The resolved settings of contract section 1."""

    home: Path
    landing: Path | str  # a folder, or an s3://bucket/prefix URL (resources/storage.py)
    lake: str
    publish_dir: Path | str  # a folder, or an s3://bucket/prefix URL
    webhook_url: str | None
    pg_dsn: str | None
    regions_file: Path
    first_day: str
    dagster_home: Path
    webhook_timeout_s: float = 10.0
    webhook_tries: int = 5
    webhook_backoff_s: float = 0.5
    workers: int = 1  # backfill processes at once: the CLI's --workers default and the UI's backfill runs
    dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER  # failed attempts of the same inputs after which a phase waits for a person
    lake_log_retention_minutes: int = DEFAULT_LAKE_LOG_RETENTION_MINUTES  # how long a Delta log keeps its older commits
    write_together: int = DEFAULT_WRITE_TOGETHER  # small partitions of a range step written in one commit a table (1: each alone)
    partitions_per_run: int = DEFAULT_PARTITIONS_PER_RUN  # partitions a key range run holds at most
    landing_sensor: str = "running"  # the landing sensor's default status: running (serve the day as it lands) or stopped
    owner_dsn: str | None = None  # STORMLAKE_OWNER_DSN: migrations and new logins (resources.logins)
    pipeline_dsn: str | None = None  # STORMLAKE_PIPELINE_DSN: the pipeline's own login
    dagster_dsn: str | None = None  # STORMLAKE_DAGSTER_DSN: Dagster's storage, with credentials of its own
    file_mode: str = "private"  # STORMLAKE_FILE_MODE: private (0600/0700) or group (0640/0750)
    executor: str = "in_process"  # STORMLAKE_EXECUTOR: where a run's steps run (pipeline/engine.py)
    broker_url: str | None = None  # STORMLAKE_BROKER_URL: the Celery broker and result backend (a secret)
    redeliver_after_s: int = DEFAULT_REDELIVER_AFTER_S  # STORMLAKE_REDELIVER_AFTER: a lost worker's step goes to another after this

    @property
    def pgdata(self) -> Path:
        return self.home / "pg"


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    """Read the settings from the environment (or ``environ``), applying the contract defaults."""
    env = dict(os.environ if environ is None else environ)

    def get(name: str) -> str | None:
        value = env.get(name)
        return value if value not in (None, "") else None

    home = Path(get("STORMLAKE_HOME") or "./.stormlake").expanduser().absolute()
    first_day = get("STORMLAKE_FIRST_DAY") or DEFAULT_FIRST_DAY
    try:
        if not DAY_RE.match(first_day):  # fromisoformat takes 20260901 and 2026-W36-2 too
            raise ValueError(first_day)
        dt.date.fromisoformat(first_day)
    except ValueError as exc:
        raise ConfigError(
            f"STORMLAKE_FIRST_DAY={first_day!r} is not a date; use YYYY-MM-DD"
        ) from exc
    lake = str(_location("STORMLAKE_LAKE", get("STORMLAKE_LAKE"), home / "lake", any_url=True))
    publish_dir = _location("STORMLAKE_PUBLISH_DIR", get("STORMLAKE_PUBLISH_DIR"), home / "published")
    return Settings(
        home=home,
        landing=_location("STORMLAKE_LANDING", get("STORMLAKE_LANDING"), home / "landing", must_be_folder=False),
        lake=lake,
        publish_dir=publish_dir,
        webhook_url=_webhook_url(get("STORMLAKE_WEBHOOK_URL")),
        pg_dsn=get("STORMLAKE_PG_DSN"),
        regions_file=Path(get("STORMLAKE_REGIONS") or DEFAULT_REGIONS_FILE).expanduser().absolute(),
        first_day=first_day,
        dagster_home=Path(get("DAGSTER_HOME") or home / "dagster").expanduser().absolute(),
        webhook_timeout_s=_number(get, "STORMLAKE_WEBHOOK_TIMEOUT", 10.0, positive=True),
        webhook_tries=_whole(get, "STORMLAKE_WEBHOOK_TRIES", 5),
        webhook_backoff_s=_number(get, "STORMLAKE_WEBHOOK_BACKOFF", 0.5),
        workers=_workers(get),
        dead_letter_after=_whole(get, "STORMLAKE_DEAD_LETTER_AFTER", DEFAULT_DEAD_LETTER_AFTER),
        lake_log_retention_minutes=_whole(get, "STORMLAKE_LAKE_LOG_RETENTION_MINUTES",
                                          DEFAULT_LAKE_LOG_RETENTION_MINUTES),
        write_together=_whole(get, "STORMLAKE_WRITE_TOGETHER", DEFAULT_WRITE_TOGETHER),
        partitions_per_run=_whole(get, "STORMLAKE_PARTITIONS_PER_RUN", DEFAULT_PARTITIONS_PER_RUN),
        landing_sensor=_choice(get, "STORMLAKE_LANDING_SENSOR", ("running", "stopped")),
        owner_dsn=get("STORMLAKE_OWNER_DSN"),
        pipeline_dsn=get("STORMLAKE_PIPELINE_DSN"),
        dagster_dsn=get("STORMLAKE_DAGSTER_DSN"),
        file_mode=_choice(get, "STORMLAKE_FILE_MODE", ("private", "group")),
        executor=_choice(get, "STORMLAKE_EXECUTOR", EXECUTORS),
        broker_url=_broker_url(get("STORMLAKE_BROKER_URL"), needed=get("STORMLAKE_EXECUTOR") == "celery"),
        redeliver_after_s=_whole(get, "STORMLAKE_REDELIVER_AFTER", DEFAULT_REDELIVER_AFTER_S),
    )


def _broker_url(raw: str | None, *, needed: bool) -> str | None:
    """``STORMLAKE_BROKER_URL``: a Redis URL (``redis://``, ``rediss://``), required by the Celery
    executor. The message never repeats the value, which may hold a password."""
    if raw is None:
        if needed:
            raise ConfigError("STORMLAKE_EXECUTOR=celery needs STORMLAKE_BROKER_URL (redis://host:port/db)")
        return None
    return _url_with_host(raw, "STORMLAKE_BROKER_URL", ("redis", "rediss"), "a redis:// or rediss://")


def _choice(get, name: str, choices: tuple[str, ...]) -> str:  # type: ignore[no-untyped-def]
    """One of ``choices`` (the first by default)."""
    value = get(name) or choices[0]
    if value not in choices:
        raise ConfigError(f"{name}={value!r}: use {' or '.join(choices)}")
    return value


def _workers(get) -> int:  # type: ignore[no-untyped-def]
    """``STORMLAKE_WORKERS``: how many backfill processes run at once (default: the machine's cores)."""
    return _whole(get, "STORMLAKE_WORKERS", max(1, os.cpu_count() or 1))


def _location(name: str, raw: str | None, default: Path, *, must_be_folder: bool = True,
              any_url: bool = False) -> Path | str:
    """A folder setting: a local folder (absolute), or an ``s3://bucket/prefix`` URL. ``any_url``:
    another URL is kept as given (the lake's tables take any URI delta-rs reads)."""
    if raw is not None and "://" in raw and any_url and not raw.startswith("s3://"):
        return raw
    if raw is not None and "://" in raw:
        parts = urllib.parse.urlsplit(raw)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment or "@" in parts.netloc:
            raise ConfigError(f"{name} is a URL but not s3://bucket/prefix (its value is not shown: it may hold"
                              " a secret); object storage is s3://, a local folder a path")
        return f"s3://{parts.netloc}{parts.path.rstrip('/')}"
    path = Path(raw or default).expanduser().absolute()
    if must_be_folder:
        _a_folder(name, path)
    return path


def _a_folder(name: str, path: Path) -> None:
    """A folder setting may name a folder still to be made, not a file: a phase would otherwise
    fail on it, and count toward its dead letter, for a mistake in the settings."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise ConfigError(f"{name}={str(path)!r}: {p} is a file, not a folder")
            return


def _webhook_url(raw: str | None) -> str | None:
    """``STORMLAKE_WEBHOOK_URL``: an http(s) URL with a host. The message never repeats the value,
    which may hold a token."""
    if raw is None:
        return None
    return _url_with_host(raw, "STORMLAKE_WEBHOOK_URL", ("http", "https"), "an http:// or https://")


def _whole(get, name: str, default: int) -> int:  # type: ignore[no-untyped-def]
    raw = get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r} is not a whole number of at least 1")
    return int(raw)


def _number(get, name: str, default: float, *, positive: bool = False) -> float:  # type: ignore[no-untyped-def]
    raw = get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name}={raw!r} is not a finite number")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{name}={raw!r} must be {'above 0' if positive else 'at least 0'}")
    return value


def load_regions(path: Path | str) -> list[Region]:
    """Load and validate the region list (CSV, or YAML with a list of mappings).

    Raises:
        ConfigError: the file is missing or a row breaks a rule; the message names the file,
            the line and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: region file not found (set STORMLAKE_REGIONS)")
    rows: list[tuple[int, dict[str, str]]]
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not a readable YAML region list ({exc.__class__.__name__})") from exc
        if isinstance(data, dict) and "regions" in data:
            data = data["regions"]
        if not isinstance(data, list):
            raise ConfigError(f"{path}: expected a list of regions")
        for i, item in enumerate(data):
            if not isinstance(item, dict):
                raise ConfigError(f"{path}: region {i + 1} of the list is {type(item).__name__} {item!r}, not a mapping"
                                  f" of {', '.join(REGION_FIELDS)}")
        rows = [(i + 1, {str(k): str(v) for k, v in item.items()}) for i, item in enumerate(data)]
    else:
        try:
            with path.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                missing = [f for f in REGION_FIELDS if f not in (reader.fieldnames or [])]
                if missing:
                    raise ConfigError(f"{path}:1: missing column(s) {', '.join(missing)}")
                rows = [(i + 2, row) for i, row in enumerate(reader)]
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8") from exc
    regions: list[Region] = []
    seen: set[str] = set()
    for line, row in rows:
        rid = (row.get("region_id") or "").strip()
        if not REGION_ID_RE.match(rid):
            raise ConfigError(
                f"{path}:{line} field 'region_id': {rid!r} must match ^[a-z][a-z0-9_]{{0,31}}$"
            )
        if rid in seen:
            raise ConfigError(f"{path}:{line} field 'region_id': duplicate region {rid!r}")
        seen.add(rid)
        bounds: dict[str, float] = {}
        for name in REGION_FIELDS[2:]:
            try:
                bounds[name] = float(row.get(name, ""))
            except (TypeError, ValueError):
                raise ConfigError(f"{path}:{line} field {name!r}: {row.get(name)!r} is not a number") from None
        if not (-90 <= bounds["min_lat"] < bounds["max_lat"] <= 90):
            raise ConfigError(f"{path}:{line} field 'min_lat': need -90 <= min_lat < max_lat <= 90")
        if not (-180 <= bounds["min_lon"] < bounds["max_lon"] <= 180):
            raise ConfigError(f"{path}:{line} field 'min_lon': need -180 <= min_lon < max_lon <= 180")
        regions.append(Region(region_id=rid, name=(row.get("name") or rid).strip(), **bounds))
    if not regions:
        raise ConfigError(f"{path}: the region list is empty")
    return regions


def _url_with_host(raw: str, name: str, schemes: tuple[str, ...], kinds: str) -> str:
    """``raw`` when it is a URL of one of ``schemes`` with a host and a numeric port (if any); the
    error never shows the value, which may hold a secret."""
    try:
        parts = urllib.parse.urlsplit(raw)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in schemes or not parts.hostname:
        raise ConfigError(f"{name} is not {kinds} URL with a host (its value is not shown: it may hold a secret)")
    return raw
