"""glibc allocator settings for a process that runs phases: keep freed memory for the next partition.

A phase allocates and frees buffers of a few MB for every partition (pandas columns, Arrow
conversions). glibc's defaults hand a freed block of that size straight back to the kernel
(``mmap``/``munmap`` above a threshold that starts at 128 KiB and only grows as blocks are
freed, and the heap top is trimmed past twice that), so early partitions of a fresh process take
fresh pages again and again: a page fault and a zeroed page each time. A process that runs
phases keeps such memory instead: blocks below 32 MiB come from the heap
(``M_MMAP_THRESHOLD``), the heap keeps up to 256 MiB of free memory at its top
(``M_TRIM_THRESHOLD``) and grows 64 MiB at a time (``M_TOP_PAD``).

Peak RSS stays about what the largest partition needs (figures: docs/BENCHMARKS.md). An
environment that sets glibc's own ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or
``MALLOC_TOP_PAD_`` keeps its settings.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
SETTINGS = (
    (M_MMAP_THRESHOLD, 32 * 1024 * 1024),  # glibc's upper limit for this setting on 64-bit
    (M_TRIM_THRESHOLD, 256 * 1024 * 1024),
    (M_TOP_PAD, 64 * 1024 * 1024),
)
ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

def keep_freed_memory() -> bool:
    """Apply :data:`SETTINGS`; True when glibc took them (False elsewhere, or when the environment
    sets glibc's own). The phase runner calls this once per process, before its first phase."""
    if not sys.platform.startswith("linux") or any(k in os.environ for k in ENV):
        return False
    try:
        # The process's own symbols, the C library's among them: ctypes.util.find_library would
        # start ``ldconfig -p`` (a fork of this process) to find the same library.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt (musl)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in SETTINGS)
