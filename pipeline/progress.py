"""The CLI's progress display: one line per finished partition (:class:`PartitionRun`), a bar
redrawn in place on a TTY."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from assets.phases import PHASES


@dataclass
class PartitionRun:
    """What a backfill reports for one partition: each phase's outcome, its deliveries, its error."""

    key: str
    ok: bool
    seconds: float
    phases: dict[str, str] = field(default_factory=dict)  # phase -> COMPLETED | SKIPPED | FAILED
    delivered: list[str] = field(default_factory=list)
    error: str | None = None
    error_class: str | None = None


class Progress:
    """A one-line-per-partition progress display on stderr (bar redrawn in place on a TTY)."""

    MARK = {"COMPLETED": "done", "SKIPPED": "skip", "FAILED": "FAIL"}

    def __init__(self, total: int, *, stream=sys.stderr):
        self.total = total
        self.done = 0
        self.stream = stream
        self.tty = stream.isatty()
        self.start = time.monotonic()

    def _bar(self) -> str:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        return "[" + "#" * filled + "." * (width - filled) + f"] {self.done}/{self.total}"

    def starting(self, what: str) -> None:
        if self.tty:
            self.stream.write(f"\r{self._bar()} {what} ...\033[K")
            self.stream.flush()

    def finished(self, run: PartitionRun) -> None:
        self.done += 1
        phases = " ".join(f"{p.name}:{self.MARK.get(run.phases.get(p.name, ''), '-')}" for p in PHASES)
        line = f"{self._bar()} {run.key:<28} {phases}  {run.seconds:5.1f}s"
        if run.delivered:
            line += f"  delivered {len(run.delivered)}"
        if run.error:
            line += f"\n    error: {run.error}"
        self.stream.write(("\r" if self.tty else "") + line + ("\033[K" if self.tty else "") + "\n")
        self.stream.flush()

    def close(self) -> None:
        elapsed = time.monotonic() - self.start
        self.stream.write(f"{self.done}/{self.total} partitions in {elapsed:.1f}s\n")
        self.stream.flush()
