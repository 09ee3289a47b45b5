"""Whether the process a run was tagged with is still that process.

A run executed by a process that died (SIGKILL, power loss) stays STARTED and keeps its
concurrency-pool slots until somebody fails it; that somebody goes by the process id in the
run's tags. A process id alone is not enough: the kernel hands ids out again (Linux wraps at
``/proc/sys/kernel/pid_max``, 32,768 by default), and a dead run whose id now belongs to a
live process (a PostgreSQL backend, another run) would hold its slots for as long as that
process lives, and every later run would wait on them. So a run is tagged with its process's
start time too (:func:`started`), and a process counts as the run's only while both match.
"""

from __future__ import annotations

import os


def started(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``, field 22);
    None where there is no ``/proc`` or no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The name (field 2) is in parentheses and may hold spaces and parentheses itself.
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


def alive(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` runs and, when its start time ``start`` was recorded, is the
    process that started then (not a later one that got the same id)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    if start is None:
        return True
    now = started(pid)
    return now is None or now == start
