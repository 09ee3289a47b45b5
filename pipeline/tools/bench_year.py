"""``stormlake bench --all``: every figure of a year of many small partitions, in one run.

Runs, one after the other on this machine and this PostgreSQL, each with its own defaults and
``--repeat`` turns (every ratio is measured side by side within its turn):

1. **small**: ``stormlake bench`` on 40 partitions x 500 rows, without the resume and commit
   measurements: pipeline / bare, and the bare loop's seconds per partition;
2. **workers**: ``stormlake bench --workers`` (16 x 20,000 rows): 1 process against
   ``STORMLAKE_WORKERS``;
3. **ui**: ``stormlake bench --ui`` (20 x 500 rows): a backfill launched through the Dagster UI's
   GraphQL against ``stormlake backfill``;
4. **scale**: ``stormlake bench --scale``: the views on a ledger of 18,250 partitions.

Each part prints its own table as it ends; the last table lists the figures against their
targets. Exit status 0 when every target is met.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: Targets of the figures that have one in their own part (the views keep theirs in bench_scale).
SMALL = {"partitions": 40, "rows_per_partition": 500}
PIPELINE_VS_BARE_TARGET = 1.10
BARE_PER_PARTITION_TARGET_S = 0.15


def _args(base: argparse.Namespace, **over: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(base), "json": False, **over})


def _say(msg: str) -> None:
    sys.stderr.write(f"bench --all: {msg}\n")
    sys.stderr.flush()


def figures(small: dict[str, Any], workers: dict[str, Any], ui: dict[str, Any],
            scale: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: what, value, target, whether met.

    Example:
        >>> rows = figures({"ratios": {"pipeline_vs_bare": 1.2}, "runs": {"bare": {"wall_s": 6.0}},
        ...                 "config": {"partitions": 40, "rows_per_partition": 500}},
        ...                {"speedup": 1.7, "target": 1.6, "config": {"partitions": 16, "rows_per_partition": 20000}},
        ...                {"ratio": 2.0, "target": 1.5, "config": {"partitions": 20, "rows_per_partition": 500}},
        ...                {"views": {"status": {"median_s": 0.4, "target_s": 1.0, "met": True}},
        ...                 "ledger": {"partitions": 18250}})
        >>> [(r["figure"], r["value"], r["met"]) for r in rows]  # doctest: +NORMALIZE_WHITESPACE
        [('status (18,250 partitions)', '0.400 s', True), ('pipeline / bare (40 x 500)', '1.200', False),
         ('bare seconds per partition (40 x 500)', '0.150 s', True), ('UI backfill / CLI (20 x 500)', '2.000', False),
         ('workers speedup (16 x 20,000)', '1.700', True)]
    """
    rows: list[dict[str, Any]] = []
    n = scale["ledger"]["partitions"]
    for name, f in scale["views"].items():
        rows.append({"figure": f"{name} ({n:,} partitions)", "value": f"{f['median_s']:.3f} s",
                     "target": f"<= {f['target_s']:.1f} s", "met": bool(f["met"])})
    c = small["config"]
    size = f"{c['partitions']} x {c['rows_per_partition']:,}"
    ratio = small["ratios"].get("pipeline_vs_bare")
    rows.append({"figure": f"pipeline / bare ({size})", "value": "-" if ratio is None else f"{ratio:.3f}",
                 "target": f"<= {PIPELINE_VS_BARE_TARGET}", "met": ratio is not None and ratio <= PIPELINE_VS_BARE_TARGET})
    bare = (small["runs"].get("bare") or {}).get("wall_s")
    per = bare / c["partitions"] if bare else None
    rows.append({"figure": f"bare seconds per partition ({size})", "value": "-" if per is None else f"{per:.3f} s",
                 "target": f"<= {BARE_PER_PARTITION_TARGET_S} s",
                 "met": per is not None and per <= BARE_PER_PARTITION_TARGET_S})
    c = ui["config"]
    rows.append({"figure": f"UI backfill / CLI ({c['partitions']} x {c['rows_per_partition']:,})",
                 "value": f"{ui['ratio']:.3f}", "target": f"<= {ui['target']}", "met": ui["ratio"] <= ui["target"]})
    c = workers["config"]
    rows.append({"figure": f"workers speedup ({c['partitions']} x {c['rows_per_partition']:,})",
                 "value": f"{workers['speedup']:.3f}", "target": f">= {workers['target']}",
                 "met": workers["speedup"] >= workers["target"]})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["a year of many small partitions: every figure of this run", f"{'figure':<42} {'value':>10}  {'target':<10} met"]
    lines += [f"{r['figure']:<42} {r['value']:>10}  {r['target']:<10} {'yes' if r['met'] else 'NO'}" for r in rows]
    return "\n".join(lines)


def run_year_bench(args: argparse.Namespace, settings) -> int:  # noqa: ANN001  (resources.settings.Settings)
    from pipeline.tools.bench import measure_bench
    from pipeline.tools.bench_scale import measure_scale, render_scale
    from pipeline.tools.bench_ui import DEFAULTS as UI_DEFAULTS
    from pipeline.tools.bench_ui import measure_ui, render_ui
    from pipeline.tools.bench_workers import DEFAULTS as WORKER_DEFAULTS
    from pipeline.tools.bench_workers import measure_workers, render_workers
    from resources.errors import StormlakeError

    _say(f"1/4 small partitions ({SMALL['partitions']} x {SMALL['rows_per_partition']} rows, {args.repeat} turns)")
    small, table, failures = measure_bench(_args(args, skip="resume,commit", **SMALL), settings)
    print(table, flush=True)
    if failures:
        raise StormlakeError(f"bench --all: the small-partition bench failed: {failures[0]}")
    _say("2/4 workers")
    workers = measure_workers(_args(args, **WORKER_DEFAULTS), settings)
    print("\n" + render_workers(workers), flush=True)
    _say("3/4 the Dagster UI")
    ui = measure_ui(_args(args, **UI_DEFAULTS), settings)
    print("\n" + render_ui(ui), flush=True)
    _say("4/4 views at a year's scale")
    scale = measure_scale(_args(args), settings)
    print("\n" + render_scale(scale), flush=True)
    rows = figures(small, workers, ui, scale)
    if args.json:
        print(json.dumps({"figures": rows, "small": small, "workers": workers, "ui": ui, "scale": scale}, indent=2))
    else:
        print("\n" + render(rows))
    return 0 if all(r["met"] for r in rows) else 1
