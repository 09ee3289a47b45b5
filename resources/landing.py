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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from resources import landing_layout as layout
from resources.settings import REGION_ID_RE
from resources.storage import MISSING, Storage, StoredFile, open_storage

DIGEST_CACHE_SIZE = 4096  # digests a Landing remembers before it starts over


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

    def partitions(self) -> list[tuple[str, str]]:
        """Every (day, region) with a folder in the landing zone, sorted by day then region."""
        found: list[tuple[str, str]] = []
        for region in self.storage.listing()[0]:
            if not REGION_ID_RE.match(region) or region == "reference":
                continue
            for day in self.storage.listing(region)[0]:
                try:
                    dt.date.fromisoformat(day)
                except ValueError:
                    continue
                if len(day) == 10:
                    found.append((day, region))
        return sorted(found)

    def is_empty(self) -> bool:
        return not self.partitions()
