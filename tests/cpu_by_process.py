"""Where the machine's CPU goes while a command runs: CPU seconds by kind of process (the CLI,
Dagster's daemon, its code server, run processes, PostgreSQL, pytest workers, ...).

    .venv/bin/python tests/cpu_by_process.py -- .venv/bin/stormlake backfill
    .venv/bin/python tests/cpu_by_process.py --json cpu.json -- make test

Every process of the machine is sampled from ``/proc`` once a second, so the figures include
whatever else runs (a process that starts and ends between two samples is missed). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

#: (a piece of the command line, the kind); the first that matches names the process.
KINDS = (
    ("/bin/postgres ", "postgres"),
    ("liveness-check", "dagster-daemon liveness-check"),
    ("dagster-daemon run", "dagster-daemon"),
    ("api grpc", "code server"),
    ("multiprocessing.spawn", "run process"),
    ("api execute_run", "run process"),
    ("bin/stormlake", "stormlake CLI"),
    ("dagster-webserver", "webserver"),
    (" dev ", "dg dev"),
    ("celery", "Celery worker"),
    ("moto_server", "S3 endpoint (moto)"),
    ("redis-server", "Redis"),
    ("chrom", "Chromium"),
    ("exec(eval(sys.stdin", "pytest worker"),
    ("pytest", "pytest"),
)


def kind(cmdline: str) -> str:
    if not cmdline:
        return "kernel"
    if cmdline.startswith("postgres"):  # a backend names itself "postgres: user database ..."
        return "postgres"
    # The first 200 characters: a code server's later arguments hold the instance's settings.
    return next((k for piece, k in KINDS if piece in cmdline[:200]), "other")


def _ticks(pid: str) -> tuple[str, int, str] | None:
    """(the process's start time, its user + system ticks, its command line)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19], int(fields[11]) + int(fields[12]), cmdline


def sample(until, interval: float = 1.0) -> tuple[Counter, Counter]:
    """CPU seconds and processes seen by kind, from the first sample until ``until()`` is true."""
    hz = os.sysconf("SC_CLK_TCK")
    seen: dict[tuple[str, str], list] = {}
    seconds: Counter = Counter()
    counts: Counter = Counter()
    first = True
    while True:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            got = _ticks(pid)
            if got is None:
                continue
            start, ticks, cmdline = got
            key = (pid, start)
            if key not in seen:
                seen[key] = [kind(cmdline), ticks if first else 0]
                counts[seen[key][0]] += 0 if first else 1
            k, last = seen[key]
            if ticks > last:
                seconds[k] += (ticks - last) / hz
                seen[key][1] = ticks
        first = False
        if until():
            return seconds, counts
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    t0 = time.monotonic()
    proc = subprocess.Popen(command)
    seconds, counts = sample(lambda: proc.poll() is not None)
    wall = time.monotonic() - t0
    total = sum(seconds.values())
    print(f"{wall:.1f} s wall, {total:.1f} CPU s on {os.cpu_count()} cores "
          f"({total / wall / (os.cpu_count() or 1):.0%} busy); by kind of process:", file=sys.stderr)
    for k, s in seconds.most_common():
        if s >= 0.05:
            print(f"  {k:<32} {s:8.1f} CPU s {s / total:6.1%}  {counts[k]:>5} started", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"wall_s": round(wall, 1), "command": command, "cpu_s": {
            k: round(s, 2) for k, s in seconds.most_common()}, "started": dict(counts)}, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
