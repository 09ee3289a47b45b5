"""Renders the recorded benchmark results (``docs/bench/*.json``) into ``docs/BENCHMARKS.md``.

Each JSON file is one recorded measurement: ``title``, ``command``, ``date``, ``commit``,
``host``, an optional ``source``, and ``figures``, a list of rows with ``figure``, ``value``
(a number, or a string as ``stormlake bench --all --json`` prints it), optional ``unit``,
``target`` (empty when the figure has none), ``met`` (true, false or null) and optional
``detail``. A result of ``stormlake bench --month`` (``--year``) also holds ``tenths``: per
side (``cli``, ``ui``), the seconds a partition of each tenth of the partitions in the order they
were done, rendered as a table of their own. The page holds the rendered tables between two markers, so the figures have one
home, the data, and the page cannot drift from it.

    python -m pipeline.tools.bench_table            # rewrites the tables in docs/BENCHMARKS.md
    python -m pipeline.tools.bench_table --check    # exit 1 when the page is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BEGIN = "<!-- bench tables: rendered from docs/bench/*.json by `python -m pipeline.tools.bench_table` -->"
END = "<!-- end of bench tables -->"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"
MET = {True: "yes", False: "no", None: ""}


def _value(row: dict[str, Any]) -> str:
    value = row["value"]
    text = f"{value:,}" if isinstance(value, (int, float)) else str(value)
    if row.get("unit"):
        text += f" {row['unit']}"
    return text + (f" ({row['detail']})" if row.get("detail") else "")


def render_entry(entry: dict[str, Any]) -> str:
    """One recorded measurement as a markdown section.

    Example:
        >>> print(render_entry({"title": "T", "command": "stormlake bench", "date": "2026-12-05",
        ...                     "commit": "v1", "host": "h", "figures": [
        ...     {"figure": "pipeline / bare", "value": 1.05, "target": "<= 1.15", "met": True}]}))
        ### T
        <BLANKLINE>
        `stormlake bench` · 2026-12-05 · commit v1 · h
        <BLANKLINE>
        | figure | value | target | met |
        |---|---|---|---|
        | pipeline / bare | 1.05 | <= 1.15 | yes |
    """
    head = f"`{entry['command']}` · {entry['date']} · commit {entry['commit']} · {entry['host']}"
    if entry.get("source"):
        head += f" · {entry['source']}"
    lines = [f"### {entry['title']}", "", head, "", "| figure | value | target | met |", "|---|---|---|---|"]
    lines += [
        f"| {r['figure']} | {_value(r)} | {r.get('target', '')} | {MET[r.get('met')]} |"
        for r in entry["figures"]
    ]
    if entry.get("tenths"):
        lines += ["", *_tenths(entry["tenths"])]
    return "\n".join(lines)


def _tenths(sides: dict[str, list[float]]) -> list[str]:
    """The tenths of a month's (a year's) result: one row a tenth, one column a side.

    Example:
        >>> print(chr(10).join(_tenths({"cli": [0.09, 0.1], "ui": [0.1, 0.12]})))
        | tenth | CLI s/partition | UI s/partition |
        |---|---|---|
        | 1 | 0.090 | 0.100 |
        | 2 | 0.100 | 0.120 |
    """
    names = list(sides)
    lines = ["| tenth | " + " | ".join(f"{n.upper()} s/partition" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for k in range(max(len(v) for v in sides.values())):
        cells = [f"{sides[n][k]:.3f}" if k < len(sides[n]) else "" for n in names]
        lines.append(f"| {k + 1} | " + " | ".join(cells) + " |")
    return lines


def render(bench_dir: Path) -> str:
    """Every recorded measurement, newest date first (then by file name)."""
    entries = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(bench_dir.glob("*.json"))]
    entries.sort(key=lambda e: e["date"], reverse=True)
    return "\n\n".join(render_entry(e) for e in entries)


def updated(page: str, tables: str) -> str:
    """``page`` with the text between the markers replaced by ``tables``."""
    head, sep, rest = page.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"the page lacks the markers {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n\n{tables}\n\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.tools.bench_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("page", nargs="?", type=Path, default=PAGE)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the page is out of date, change nothing"
    )
    args = parser.parse_args(argv)
    old = args.page.read_text(encoding="utf-8")
    try:
        new = updated(old, render(args.page.parent / "bench"))
    except ValueError as exc:
        sys.stderr.write(f"bench_table: {args.page}: {exc}\n")
        return 2
    if args.check:
        if new != old:
            sys.stderr.write(
                f"bench_table: {args.page} is out of date; run python -m pipeline.tools.bench_table\n"
            )
            return 1
        return 0
    args.page.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
