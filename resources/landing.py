"""The landing zone (contract section 3): where input files are, and how a change to them is seen.

The zone is a local folder or an ``s3://bucket/prefix`` (:mod:`resources.storage`); everything
below works on either. Four measures of a landing file, each for its own use, all defined here:

- :func:`file_stamp`: the file's identity and change stamp, without reading it (a local file's
  ``stat``: device, inode, size, mtime, ctime; an object's size, ETag and modification time).
  An ingest checkpoint records it next to the digest, so that a file whose stamp is unchanged is
  not read again (:meth:`Landing.stamped_digests`).
- the digest: sha256 of the file's bytes (:meth:`Landing.digests`), what ingest's input hash is
  made of. A :class:`Landing` remembers the digests it computed, by file and stamp.
- :meth:`Landing.content_version`: sha256 over a partition's digests, the data version of the
  ``landing_files`` source asset; it changes exactly when ingest's input changes.
- :meth:`Landing.stat_fingerprint`: sizes and modification times (and ETags on S3) of a
  partition's files from folder listings, no reading; the landing sensor keeps it in its cursor
  to notice new or touched files cheaply.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from resources import landing_layout as layout
from resources.keys import partition_key
from resources.settings import DAY_RE, REGION_ID_RE
from resources.storage import MISSING, Storage, StoredFile, open_storage

DIGEST_CACHE_SIZE = 4096  # digests a Landing remembers before it starts over


def utc_today() -> str:
    """The current UTC day, ``YYYY-MM-DD``: the last day of the partitions' day dimension."""
    return dt.datetime.now(dt.UTC).date().isoformat()


@dataclass(frozen=True)
class NotAPartition:
    """A landing folder that is not a partition, and why (one line for the operator)."""

    folder: str  # landing-relative, ``<region>/<day>``
    reason: str

    def __str__(self) -> str:
        return f"landing folder {self.folder}: {self.reason}"


def folder_reason(region: str, day: str, *, regions: set[str], first_day: str, today: str) -> str | None:
    """Why the landing folder ``<region>/<day>`` is not a partition, or None when it is one."""
    if not REGION_ID_RE.match(region):
        return "not a region id (lowercase letters, digits and _, starting with a letter)"
    if region not in regions:
        return "not a region of the region file (STORMLAKE_REGIONS)"
    if not DAY_RE.match(day):
        return "not a day (YYYY-MM-DD)"
    try:
        dt.date.fromisoformat(day)
    except ValueError:
        return "not a day of the calendar"
    if day < first_day:
        return f"before STORMLAKE_FIRST_DAY={first_day}"
    if day > today:
        return f"a day after today ({today} UTC): it becomes a partition when its UTC day begins"
    return None


def file_stamp(path: Path | StoredFile) -> str:
    """The file's identity and change stamp, ``missing`` when there is no file.

    A local file's device, inode, size, mtime and ctime (ns): any write, rename over, copy or
    restore changes at least one of them (the ctime is set by the kernel on every change and
    cannot be set back by a tool), so an unchanged stamp means unchanged bytes. An object's
    size, ETag and modification time.
    """
    if isinstance(path, StoredFile):
        return path.stamp()
    st = open_storage(Path(path).parent).stat(Path(path).name)
    return MISSING if st is None else st.stamp


@dataclass(frozen=True)
class Landing:
    """The landing zone under ``root``.

    It remembers the digests it computed, by the file's path and stamp: the landing sensor's
    observation and its preflight, or the ingest step's observation and its input hash, ask for
    the same files one after the other. Use one Landing for them (:meth:`LandingResource.get`
    returns the same one on every call).
    """

    root: Path | str  # a local folder or an s3://bucket/prefix URL
    _digests: dict[tuple[str, str], str] = field(default_factory=dict, init=False, repr=False, compare=False)
    storage: Storage = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage", open_storage(self.root))

    @property
    def location(self) -> str:
        """The zone as shown (a folder or a URL without credentials)."""
        return self.storage.location

    def partition_dir(self, region_id: str, day: str) -> Path:
        """The partition's folder in a local landing zone."""
        return Path(self.root) / region_id / day

    def input_files(self, region_id: str, day: str) -> dict[str, StoredFile]:
        """Landing-relative name -> file of every file the ingest of this partition reads."""
        return {rel: self.storage.file(rel) for rel in layout.input_files(region_id, day)}

    def has_partition_files(self, region_id: str, day: str) -> bool:
        """Whether the partition's folder holds at least one of its files."""
        files = self.storage.listing(f"{region_id}/{day}")[1]
        return any(name in files for name in layout.PARTITION_FILES)

    def partition_bytes(self, region_id: str, day: str) -> int:
        """Bytes of the partition's own files (not the region's reference files, which every
        partition of the region shares); a missing file counts 0."""
        files = self.storage.listing(f"{region_id}/{day}")[1]
        return sum(files[name].size for name in layout.PARTITION_FILES if name in files)

    def digests(self, region_id: str, day: str) -> dict[str, str]:
        """Landing-relative name -> sha256 of every input file of the partition (``missing`` if absent)."""
        return {rel: digest for rel, (_, digest) in self.stamped_digests(region_id, day).items()}

    def stamped_digests(self, region_id: str, day: str,
                        known: Mapping[str, tuple[str, str]] | None = None) -> dict[str, tuple[str, str]]:
        """Landing-relative name -> (stamp, sha256) of every input file of the partition.

        ``known``: (stamp, digest) pairs recorded by an earlier ingest of the partition; a file
        whose stamp is unchanged is not read again (a resumed backfill does not re-hash the
        landing zone to find that nothing changed). A file changed between the stamp and the
        digest gets a new stamp next time, so it is hashed again then.
        """
        known = known or {}
        out: dict[str, tuple[str, str]] = {}
        for rel, path in sorted(self.input_files(region_id, day).items()):
            stamp = path.stamp()
            recorded = known.get(rel)
            out[rel] = recorded if recorded is not None and recorded[0] == stamp else (stamp, self._digest(path, stamp))
        return out

    def content_version(self, region_id: str, day: str) -> str:
        """sha256 over the partition's input file digests: changes exactly when ingest's input does."""
        lines = "\n".join(f"{rel}:{digest}" for rel, digest in self.digests(region_id, day).items())
        return hashlib.sha256(lines.encode()).hexdigest()

    def stat_fingerprint(self, region_id: str, day: str) -> str | None:
        """16 hex of sha256 over the sizes and modification times (and ETags on S3) of the
        partition's input files; None if one is missing.

        Two folder listings (the partition's and the reference folder), no reading: it changes
        when a file is written or touched.
        """
        listed: dict[str, dict] = {}
        parts = []
        for rel in sorted(self.input_files(region_id, day)):
            folder, _, name = rel.rpartition("/")
            if folder not in listed:
                listed[folder] = self.storage.listing(folder)[1]
            st = listed[folder].get(name)
            if st is None:
                return None
            parts.append(f"{rel}:{st.change}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    def _digest(self, path: StoredFile, stamp: str) -> str:
        """sha256 of a file's bytes, or ``missing`` (ingest then fails naming the file).

        ``stamp``: the file's :func:`file_stamp`, just taken.
        """
        if stamp == MISSING:
            return stamp
        cached = self._digests.get((str(path), stamp))
        if cached is not None:
            return cached
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            return MISSING
        if len(self._digests) > DIGEST_CACHE_SIZE:
            self._digests.clear()
        self._digests[(str(path), stamp)] = digest
        return digest

    def folders(self) -> list[tuple[str, str]]:
        """Every ``(folder, subfolder)`` name pair of the landing zone, sorted, whatever the names:
        the places a partition's files may be. The reference folder and folders whose name starts
        with ``_`` or ``.`` (the generator's ``_truth``) hold no partition and are left out.
        Which pairs are partitions is :func:`assets.partitions.landing_keys`' call."""
        found: list[tuple[str, str]] = []
        for region in self.storage.listing()[0]:
            if region == "reference" or region[:1] in ("_", "."):
                continue
            found.extend((region, day) for day in self.storage.listing(region)[0] if day[:1] != ".")
        return sorted(found)

    def partition_keys(self, regions: Iterable[str], first_day: str, *,
                       today: str | None = None) -> tuple[list[str], list[NotAPartition]]:
        """``(keys, rejected)``: the folders that are partitions of ``regions`` from ``first_day``
        to ``today`` (default: the current UTC day), as keys in (day, region) order, and every
        other folder with the reason it is not one (:func:`folder_reason`).

        The one classification of landing folders: the CLI's selection, the landing sensor and
        the observation of ``landing_files`` all start from it (without importing Dagster).
        """
        today, known = today or utc_today(), set(regions)
        keys: list[tuple[str, str]] = []
        rejected: list[NotAPartition] = []
        for region, day in self.folders():
            reason = folder_reason(region, day, regions=known, first_day=first_day, today=today)
            if reason is None:
                keys.append((day, region))
            else:
                rejected.append(NotAPartition(f"{region}/{day}", reason))
        return [partition_key(day, region) for day, region in sorted(keys)], rejected

    def partitions(self) -> list[tuple[str, str]]:
        """Every (day, region) whose folder names read as a region id and a day, sorted by day
        then region (whether they are partitions: :func:`assets.partitions.landing_keys`)."""
        found: list[tuple[str, str]] = []
        for region, day in self.folders():
            if not REGION_ID_RE.match(region) or len(day) != 10:
                continue
            try:
                dt.date.fromisoformat(day)
            except ValueError:
                continue
            found.append((day, region))
        return sorted(found)

    def is_empty(self) -> bool:
        return not self.partitions()
