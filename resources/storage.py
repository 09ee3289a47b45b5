"""Where stormlake's files live: a local folder or an object store prefix (``s3://bucket/prefix``).

The landing zone and the published artifacts go through one :class:`Storage`, whichever kind it
is, so reading landing files, fingerprinting them and delivering artifacts is one code path.
:func:`open_storage` picks the kind from the setting's value.

- :class:`LocalStorage`: a folder. A write is a temporary file, fsync and a rename
  (:func:`resources.files.write_atomic`); a file's stamp is its ``stat`` (device, inode, size,
  mtime, ctime).
- :class:`S3Storage`: a bucket and prefix, through boto3 (docs/OBJECT_STORAGE.md says why).
  A write is one PUT, which S3 makes visible whole or not at all; an
  object's stamp is its size, ETag and modification time from a HEAD or a listing. The endpoint,
  region and credentials come from the standard AWS variables (``AWS_ENDPOINT_URL``,
  ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ALLOW_HTTP``, ...).

Every failure other than a missing file is a :class:`resources.errors.StorageError`: one line
naming the URL (never a credential) and what went wrong.
"""

from __future__ import annotations

import abc
import contextlib
import os
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resources.errors import StorageError
from resources.files import write_atomic

MISSING = "missing"  # the stamp of a file that is not there
S3_SCHEME = "s3://"
# The AWS variables passed on to the lake's Delta tables (delta-rs reads the same names).
AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP")


@dataclass(frozen=True)
class Stat:
    """What is known of a file without reading it."""

    size: int
    stamp: str  # changes whenever the bytes may have changed (see the storage classes)
    change: str  # size and modification time (and ETag on S3): the landing sensor's part


def is_url(location: str | Path) -> bool:
    return isinstance(location, str) and "://" in location


def open_storage(location: str | Path) -> Storage:
    """The storage at ``location``: an ``s3://bucket/prefix`` URL or a local folder."""
    if isinstance(location, Storage):
        return location
    if is_url(location):
        if not str(location).startswith(S3_SCHEME):
            raise StorageError(f"{location}: only local folders and s3://bucket/prefix are supported")
        return S3Storage(str(location))
    return LocalStorage(Path(location))


def delta_storage_options(uri: str) -> dict[str, str] | None:
    """``storage_options`` for a Delta table at ``uri``: on S3, the AWS variables of the
    environment and conditional writes (``conditional_put=etag``), so concurrent commits are
    safe without a lock table. None for a local table."""
    if not uri.startswith(S3_SCHEME):
        return None
    options = {k: v for k in AWS_VARIABLES if (v := os.environ.get(k))}
    if "AWS_REGION" not in options and "AWS_DEFAULT_REGION" in options:
        options["AWS_REGION"] = options["AWS_DEFAULT_REGION"]
    options.pop("AWS_DEFAULT_REGION", None)
    options["conditional_put"] = "etag"
    return options


class Storage(abc.ABC):
    """A folder of files addressed by ``/``-separated paths relative to its root."""

    kind: str  # "file" or "s3": the delivery target's name in receipts and the status JSON
    location: str  # the root as shown (no credential)

    @abc.abstractmethod
    def url(self, rel: str) -> str:
        """Where ``rel`` is, as shown and recorded."""

    @abc.abstractmethod
    def stat(self, rel: str) -> Stat | None:
        """The file's :class:`Stat`; None when there is none."""

    @abc.abstractmethod
    def read(self, rel: str) -> bytes:
        """The file's bytes. Raises FileNotFoundError when it is missing."""

    @abc.abstractmethod
    def put(self, rel: str, data: bytes, *, durable: bool = False) -> str:
        """Write the whole file at once (a reader sees the old bytes or the new, never a part);
        returns :meth:`url`."""

    @abc.abstractmethod
    def listing(self, rel: str = "") -> tuple[list[str], dict[str, Stat]]:
        """``(folders, files)`` directly under ``rel``: the sub-folder names, sorted, and
        file name -> :class:`Stat`. Empty when ``rel`` does not exist."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the root is there (a local folder; an S3 bucket that can be listed)."""

    def file(self, rel: str) -> StoredFile:
        return StoredFile(self, rel)


@dataclass(frozen=True)
class StoredFile:
    """One file of a storage, readable as a :class:`pathlib.Path` is (``read_bytes``)."""

    storage: Storage
    rel: str

    def read_bytes(self) -> bytes:
        return self.storage.read(self.rel)

    def stamp(self) -> str:
        st = self.storage.stat(self.rel)
        return MISSING if st is None else st.stamp

    def __str__(self) -> str:
        return self.storage.url(self.rel)


class LocalStorage(Storage):
    """A local folder. A file's stamp is device, inode, size, mtime and ctime (ns): any write,
    rename over, copy or restore changes one of them, and a tool cannot set the ctime back."""

    kind = "file"

    def __init__(self, root: Path):
        self.root = Path(root)
        self.location = str(self.root)

    def path(self, rel: str) -> Path:
        return self.root / rel if rel else self.root

    def url(self, rel: str) -> str:
        return str(self.path(rel))

    def stat(self, rel: str) -> Stat | None:
        try:
            return _local_stat(self.path(rel).stat())
        except FileNotFoundError:
            return None

    def read(self, rel: str) -> bytes:
        return self.path(rel).read_bytes()

    def put(self, rel: str, data: bytes, *, durable: bool = False) -> str:
        return str(write_atomic(self.path(rel), data, durable=durable))

    def listing(self, rel: str = "") -> tuple[list[str], dict[str, Stat]]:
        folders: list[str] = []
        files: dict[str, Stat] = {}
        try:
            with os.scandir(self.path(rel)) as entries:
                for entry in entries:
                    if entry.is_dir():
                        folders.append(entry.name)
                    elif entry.is_file():
                        try:
                            files[entry.name] = _local_stat(entry.stat())
                        except FileNotFoundError:
                            pass
        except (FileNotFoundError, NotADirectoryError):
            pass
        return sorted(folders), files

    def exists(self) -> bool:
        return self.root.is_dir()


def _local_stat(st: os.stat_result) -> Stat:
    return Stat(st.st_size, f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}",
                f"{st.st_size}:{st.st_mtime_ns}")


class S3Storage(Storage):
    """``s3://bucket/prefix`` through boto3. An object's stamp is its size, ETag and modification
    time: S3 gives a rewritten object a new ETag (and modification time)."""

    kind = "s3"

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        if not parts.netloc:
            raise StorageError(f"{url}: no bucket (use s3://bucket/prefix)")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.location = f"{S3_SCHEME}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._opened: tuple[int, Any] | None = None

    @property
    def client(self) -> Any:
        """The S3 client of this process. A process forked from one that used it (the CLI's
        backfill workers) makes its own rather than share the parent's pooled connections."""
        if self._opened is None or self._opened[0] != os.getpid():
            import boto3
            from botocore.config import Config

            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            try:
                # Transient answers (5xx, throttling, timeouts) are retried by botocore a few
                # times, kept short so a failing store is reported in seconds.
                client = boto3.session.Session().client(
                    "s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None, region_name=region,
                    config=Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=5,
                                  read_timeout=60))
            except Exception as exc:  # botocore's own configuration errors
                raise StorageError(f"{self.location}: cannot be opened ({_reason(exc)})") from None
            self._opened = (os.getpid(), client)
        return self._opened[1]

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url(self, rel: str) -> str:
        return f"{self.location}/{rel}" if rel else self.location

    def stat(self, rel: str) -> Stat | None:
        try:
            meta = self.client.head_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as exc:
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise _error(self.url(rel), "cannot be looked up", exc) from None
        return _s3_stat(meta["ContentLength"], meta.get("ETag"), meta["LastModified"])

    def read(self, rel: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read()
        except Exception as exc:
            if _code(exc) in ("404", "NoSuchKey"):
                raise FileNotFoundError(self.url(rel)) from None
            raise _error(self.url(rel), "cannot be read", exc) from None

    def put(self, rel: str, data: bytes, *, durable: bool = False) -> str:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data)
        except Exception as exc:
            raise _error(self.url(rel), "cannot be written", exc) from None
        return self.url(rel)

    def listing(self, rel: str = "") -> tuple[list[str], dict[str, Stat]]:
        prefix = self.key(rel.strip("/")).strip("/")
        prefix = f"{prefix}/" if prefix else ""
        folders: list[str] = []
        files: dict[str, Stat] = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/")
            for page in pages:
                folders += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
                for obj in page.get("Contents", []):
                    files[obj["Key"][len(prefix):]] = _s3_stat(obj["Size"], obj.get("ETag"), obj["LastModified"])
        except Exception as exc:
            raise _error(self.url(rel.strip("/")), "cannot be listed", exc) from None
        return sorted(folders), files

    def exists(self) -> bool:
        self.listing()  # raises, naming the URL, when the bucket is missing or the login is refused
        return True


def _s3_stat(size: int, etag: str | None, modified: Any) -> Stat:
    mtime = int(modified.timestamp() * 1_000_000) * 1000
    text = f"{size}:{(etag or '').strip(chr(34))}:{mtime}"
    return Stat(int(size), text, text)


def _code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError ('' for any other error)."""
    response = getattr(exc, "response", None)
    return str((response or {}).get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _error(url: str, what: str, exc: BaseException) -> StorageError:
    """A one-line error naming ``url`` and the store's answer, without credentials."""
    return StorageError(f"{url}: {what} ({_reason(exc)})", transient=_transient(exc))


REFUSED = "the credentials were refused: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


def _reason(exc: BaseException) -> str:
    """The store's answer in a few words: the S3 error code when the answer carries one."""
    code = _code(exc)
    known = {"NoSuchBucket": "no such bucket", "NoSuchKey": "no such key", "SignatureDoesNotMatch": REFUSED,
             "InvalidAccessKeyId": REFUSED, "403": "access denied (HTTP 403): check AWS_ACCESS_KEY_ID,"
             " AWS_SECRET_ACCESS_KEY and the bucket's policy",
             "AccessDenied": "access denied: check the credentials and the bucket's policy"}
    if code in known:
        return known[code]
    if code:
        return f"{code} (HTTP {exc.response.get('ResponseMetadata', {}).get('HTTPStatusCode', '?')})"  # type: ignore[attr-defined]
    name = exc.__class__.__name__
    if name == "EndpointConnectionError":
        return "the endpoint cannot be reached: check AWS_ENDPOINT_URL"
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if name == "NoRegionError":
        return "no region: set AWS_REGION"
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else exc.__class__.__name__
    return _without_secrets(first)[:300]


def _transient(exc: BaseException) -> bool:
    status = (getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if isinstance(status, int) and status >= 500:
        return True
    if exc.__class__.__name__ in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                                  "ConnectionClosedError"):
        return True
    return "SlowDown" in str(exc)


def _without_secrets(text: str) -> str:
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "…")
    return text


@contextlib.contextmanager
def local_folder_for(location: Path | str) -> Iterator[Path]:
    """A local folder whose files end up at ``location``: the folder itself, or for object storage
    a temporary folder whose files are uploaded, each with one PUT, when the block ends."""
    store = open_storage(location)
    if isinstance(store, LocalStorage):
        yield store.root
        return
    with tempfile.TemporaryDirectory(prefix="stormlake-upload-") as tmp:
        yield Path(tmp)
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                store.put(path.relative_to(tmp).as_posix(), path.read_bytes())
