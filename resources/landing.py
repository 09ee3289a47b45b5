"""The landing zone (contract section 3): where input files are, and how a change to them is seen.

Four measures of a landing file, each for its own use, all defined here:

- :func:`file_stamp`: the file's identity and change stamp (device, inode, size, mtime, ctime),
  a ``stat``. An ingest checkpoint records it next to the digest, so that a file whose stamp is
  unchanged is not read again (:meth:`Landing.stamped_digests`).
- the digest: sha256 of the file's bytes (:meth:`Landing.digests`), what ingest's input hash is
  made of. A :class:`Landing` remembers the digests it computed, by file and stamp.
- :meth:`Landing.content_version`: sha256 over a partition's digests, the data version of the
  ``landing_files`` source asset; it changes exactly when ingest's input changes.
- :meth:`Landing.stat_fingerprint`: sizes and mtimes of a partition's files, a ``stat`` each and
  no reading; the landing sensor keeps it in its cursor to notice new or touched files cheaply.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from resources import landing_layout as layout
from resources.settings import REGION_ID_RE

MISSING = "missing"  # the stamp and digest of a file that is not there
DIGEST_CACHE_SIZE = 4096  # digests a Landing remembers before it starts over


def file_stamp(path: Path) -> str:
    """The file's identity and change stamp: device, inode, size, mtime and ctime (ns).

    Any write, rename over, copy or restore changes at least one of them (the ctime is set by
    the kernel on every change and cannot be set back by a tool), so an unchanged stamp
    means unchanged bytes. ``missing`` when there is no file.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return MISSING
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


@dataclass(frozen=True)
class Landing:
    """The landing zone under ``root``.

    It remembers the digests it computed, by the file's path and stamp: the landing sensor's
    observation and its preflight, or the ingest step's observation and its input hash, ask for
    the same files one after the other. Use one Landing for them (:meth:`LandingResource.get`
    returns the same one on every call).
    """

    root: Path
    _digests: dict[tuple[str, str], str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def partition_dir(self, region_id: str, day: str) -> Path:
        return self.root / region_id / day

    def input_files(self, region_id: str, day: str) -> dict[str, Path]:
        """Landing-relative name -> path of every file the ingest of this partition reads."""
        return {rel: self.root / rel for rel in layout.input_files(region_id, day)}

    def has_partition_files(self, region_id: str, day: str) -> bool:
        """Whether the partition's folder holds at least one of its files."""
        return any((self.partition_dir(region_id, day) / name).exists() for name in layout.PARTITION_FILES)

    def partition_bytes(self, region_id: str, day: str) -> int:
        """Bytes of the partition's own files (not the region's reference files, which every
        partition of the region shares); a missing file counts 0."""
        folder = self.partition_dir(region_id, day)
        total = 0
        for name in layout.PARTITION_FILES:
            try:
                total += (folder / name).stat().st_size
            except OSError:
                pass
        return total

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
            stamp = file_stamp(path)
            recorded = known.get(rel)
            out[rel] = recorded if recorded is not None and recorded[0] == stamp else (stamp, self._digest(path, stamp))
        return out

    def content_version(self, region_id: str, day: str) -> str:
        """sha256 over the partition's input file digests: changes exactly when ingest's input does."""
        lines = "\n".join(f"{rel}:{digest}" for rel, digest in self.digests(region_id, day).items())
        return hashlib.sha256(lines.encode()).hexdigest()

    def stat_fingerprint(self, region_id: str, day: str) -> str | None:
        """16 hex of sha256 over the sizes and mtimes of the partition's input files; None if one is missing.

        A ``stat`` per file, no reading: it changes when a file is written or touched.
        """
        parts = []
        for rel, path in sorted(self.input_files(region_id, day).items()):
            try:
                st = path.stat()
            except FileNotFoundError:
                return None
            parts.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    def _digest(self, path: Path, stamp: str) -> str:
        """sha256 of a file's bytes, or ``missing`` (ingest then fails naming the file).

        ``stamp``: the file's :func:`file_stamp`, just taken.
        """
        if stamp == MISSING:
            return stamp
        cached = self._digests.get((str(path), stamp))
        if cached is not None:
            return cached
        h = hashlib.sha256()
        try:
            with path.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        except FileNotFoundError:
            return MISSING
        if len(self._digests) > DIGEST_CACHE_SIZE:
            self._digests.clear()
        self._digests[(str(path), stamp)] = digest = h.hexdigest()
        return digest

    def partitions(self) -> list[tuple[str, str]]:
        """Every (day, region) with a folder in the landing zone, sorted by day then region."""
        found: list[tuple[str, str]] = []
        if not self.root.is_dir():
            return found
        for region_dir in self.root.iterdir():
            if not region_dir.is_dir() or not REGION_ID_RE.match(region_dir.name) or region_dir.name == "reference":
                continue
            for day_dir in region_dir.iterdir():
                try:
                    dt.date.fromisoformat(day_dir.name)
                except ValueError:
                    continue
                if day_dir.is_dir() and len(day_dir.name) == 10:
                    found.append((day_dir.name, region_dir.name))
        return sorted(found)

    def is_empty(self) -> bool:
        return not self.partitions()
