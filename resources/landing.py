"""The landing zone (contract section 3): where input files are, and their digests."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from resources.settings import REGION_ID_RE

PARTITION_FILES = ("outages.csv", "weather.csv")
REFERENCE_FILES = ("reference/customers.csv", "reference/terrain.csv")


# Digests already computed in this process, by the file's path and change stamp: the CLI's
# preflight and the ingest phase after it ask for the same files within seconds.
_DIGESTS: dict[tuple[str, str], str] = {}


def file_stamp(path: Path) -> str:
    """The file's identity and change stamp: device, inode, size, mtime and ctime (ns).

    Any write, rename over, copy or restore changes at least one of them (the ctime is set by
    the kernel on every change and cannot be set back by a tool), so an unchanged stamp
    means unchanged bytes. ``missing`` when there is no file.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def file_digest(path: Path, stamp: str | None = None) -> str:
    """sha256 of a file's bytes, or ``missing`` (ingest then fails naming the file).

    ``stamp``: the file's :func:`file_stamp`, when the caller has just taken it.
    """
    stamp = stamp or file_stamp(path)
    if stamp == "missing":
        return stamp
    cached = _DIGESTS.get((str(path), stamp))
    if cached is not None:
        return cached
    h = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except FileNotFoundError:
        return "missing"
    if len(_DIGESTS) > 4096:
        _DIGESTS.clear()
    _DIGESTS[(str(path), stamp)] = digest = h.hexdigest()
    return digest


@dataclass(frozen=True)
class Landing:
    root: Path

    def partition_dir(self, region_id: str, day: str) -> Path:
        return self.root / region_id / day

    def input_files(self, region_id: str, day: str) -> dict[str, Path]:
        """Landing-relative name -> path of every file the ingest of this partition reads."""
        files = {f"{region_id}/{day}/{name}": self.partition_dir(region_id, day) / name for name in PARTITION_FILES}
        files.update({rel: self.root / rel for rel in REFERENCE_FILES})
        return files

    def digests(self, region_id: str, day: str) -> dict[str, str]:
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
            out[rel] = recorded if recorded is not None and recorded[0] == stamp else (stamp, file_digest(path, stamp))
        return out

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


# ---- Dagster resource --------------------------------------------------------------------


class LandingResource(dg.ConfigurableResource):
    """The landing zone (``STORMLAKE_LANDING``) and the region list it is read with."""

    root: str
    regions_file: str

    def get(self) -> Landing:
        return Landing(Path(self.root))

    def regions(self):  # -> dict[str, Region]
        from resources.settings import load_regions

        return {r.region_id: r for r in load_regions(self.regions_file)}
