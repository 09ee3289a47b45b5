"""Files written whole or not at all, and who may read what stormlake writes.

Everything stormlake writes (the lake's Delta files, landing zones it generates, published
artifacts, reports, Dagster's files) is created under the process's umask, which
:func:`apply_file_mode` sets from ``STORMLAKE_FILE_MODE``: ``private`` (the default) makes files
0600 and folders 0700, ``group`` 0640 and 0750 for a group that shares the data. delta-rs and
Dagster create their files themselves, so the umask, not a chmod here and there, is the lever.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

#: STORMLAKE_FILE_MODE -> the umask every file and folder is created under.
UMASKS = {"private": 0o077, "group": 0o027}
_umask = UMASKS["private"]


def apply_file_mode(setting: str) -> None:
    """Create every later file and folder of this process (and of its children) as ``setting`` says."""
    global _umask
    _umask = UMASKS[setting]
    os.umask(_umask)


def file_mode() -> int:
    """The mode of a file written now: 0600, or 0640 for a shared group."""
    return 0o666 & ~_umask


def write_atomic(path: Path | str, data: bytes | str, *, durable: bool = False, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a part.

    Several processes may write the same path at once; each uses a temporary file of its own
    and the last rename wins. With ``durable`` the file and its folder entry are flushed to disk
    before this returns (a delivered artifact survives a power loss). ``mode`` defaults to
    :func:`file_mode`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, file_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path
