"""``stormlake bench --month`` (and ``--year``): many small partitions from the CLI and from the
UI, side by side in one run, whether a partition gets dearer as the lake and the ledger grow, and
a projection of the year.

Under ``$STORMLAKE_HOME/bench/month`` (wiped at the start):

1. a region file of ``--regions`` regions (default 50: the shipped ones, then boxes beside them,
   :func:`pipeline.tools.bench_live.write_region_file`) and their files over ``--days`` days
   (default 30) of ``--rows-per-partition`` outage rows (default 500), generated once;
2. **cli**: on a new home with a new ledger and Dagster database, prepared before the clock
   starts (:func:`pipeline.tools.bench_workers.prepare_home`), ``stormlake backfill`` of every
   partition, timed whole (the process's start included);
3. **ui**: on another new home and new databases, ``stormlake ui`` is started and, once it
   answers, a backfill of the same partitions is launched through GraphQL
   ``launchPartitionBackfill`` (:func:`pipeline.tools.bench_ui.ui_backfill`), timed from the
   launch to the last partition published in the ledger.

From each side's ledger (:meth:`resources.ledger_views.LedgerViews.phase_spans`) the partitions
are ordered by the commit of their last phase and cut into tenths (:func:`tenths`): a tenth's
time runs from the previous tenth's last commit (the first tenth's from the first claim of the
backfill) to its own last commit, over its partitions. The tenths give the growth, last over
first, and a projection of a year of :data:`YEAR_PARTITIONS` partitions (:func:`project`): a
straight line fitted through the tenths' costs, integrated over the year, plus what the side
paid outside the tenths (its start and its end). :func:`phases_by_tenth` shows each phase's
share of a tenth, from the checkpoints' claim-to-commit spans, to tell which one grows.

The figures are printed against :data:`TARGETS` (exit 1 when one is not met); a run of the full
size (50 regions x 30 days x 500 rows, or ``--year``) is recorded as
``docs/bench/<date>-month.json`` (``-year``) and ``docs/BENCHMARKS.md`` is rendered anew
(:mod:`pipeline.tools.bench_table`). ``--year`` is the same code over 365 days, from the CLI
(``--sides ui``: from the UI, recorded as ``<date>-year-ui.json``). Progress goes to stderr
while the backfills run; their own output goes to ``cli.log`` and ``ui.log`` in the bench folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

YEAR_PARTITIONS = 18_250
TENTHS = 10
MONTH = {"regions": 50, "days": 30, "rows_per_partition": 500}
YEAR = {"regions": 50, "days": 365, "rows_per_partition": 500}
#: Targets: seconds a partition (each side), UI / CLI, last tenth / first tenth, the year's seconds.
TARGETS = {"per_partition_s": 0.10, "ui_vs_cli": 1.15, "last_vs_first": 1.15, "year_s": 1800.0}
HANG_GUARD_S = 6 * 3600  # against a backfill that never ends, not a performance bound
PROGRESS_EVERY_S = 5.0
REPO = Path(__file__).resolve().parents[2]


def default_sides(year: bool) -> list[str]:
    """The sides run without ``--sides``: both for a month, the CLI for a year."""
    return ["cli"] if year else ["cli", "ui"]


def first_day(configured: str, days: int, today: dt.date) -> dt.date:
    """The first of ``days`` days to generate: the configured first day, or earlier, so that the
    last is no later than yesterday (a day after today is no partition yet).

    Example:
        >>> first_day("2026-09-01", 30, dt.date(2026, 12, 6))
        datetime.date(2026, 9, 1)
        >>> first_day("2026-09-01", 365, dt.date(2026, 12, 6))
        datetime.date(2025, 12, 6)
    """
    first = dt.date.fromisoformat(configured)
    return min(first, today - dt.timedelta(days=days))


def _say(msg: str) -> None:
    sys.stderr.write(f"bench --month: {msg}\n")
    sys.stderr.flush()


# ---- the arithmetic ------------------------------------------------------------------------
def spread(done_at: Sequence[float], start: float) -> list[float]:
    """``done_at`` in order, with the partitions done at the same moment (one commit of a range
    step) spread evenly over the time since the commit before (the first's since ``start``): a
    range's partitions shared its time, and a cut between them then falls where its share does.

    Example:
        >>> spread([4, 4, 4, 6, 10, 10], 1)
        [2.0, 3.0, 4.0, 6.0, 8.0, 10.0]
    """
    times = sorted(float(t) for t in done_at)
    out: list[float] = []
    before, i = float(start), 0
    while i < len(times):
        j = i
        while j < len(times) and times[j] == times[i]:
            j += 1
        n = j - i
        out += [before + (times[i] - before) * (m + 1) / n for m in range(n)]
        before, i = times[i], j
    return out


def tenths(done_at: Sequence[float], start: float, parts: int = TENTHS) -> list[dict[str, Any]]:
    """Cut the partitions, in the order they were done (``done_at``, seconds on any clock, spread
    over their commits by :func:`spread`), into ``parts`` groups of (nearly) equal size; per
    group: its partitions, its seconds (from the previous group's last partition done, the first
    group's from ``start``, to its own last) and its seconds per partition.

    Example:
        >>> [t["per_partition_s"] for t in tenths([1, 2, 3, 4, 6, 8, 10, 12, 15, 18], 0, parts=5)]
        [1.0, 1.0, 2.0, 2.0, 3.0]
        >>> [t["partitions"] for t in tenths(range(1, 8), 0, parts=3)]
        [2, 3, 2]
        >>> [t["per_partition_s"] for t in tenths([4, 4, 4, 4, 8, 8, 8, 8], 0, parts=4)]
        [1.0, 1.0, 1.0, 1.0]
    """
    times = spread(done_at, start)
    if len(times) < parts:
        raise ValueError(f"{len(times)} partitions cannot be cut into {parts} parts")
    bounds = [round(k * len(times) / parts) for k in range(parts + 1)]
    out = []
    for k in range(parts):
        lo, hi = bounds[k], bounds[k + 1]
        begin = start if k == 0 else times[lo - 1]
        seconds = max(times[hi - 1] - begin, 0.0)
        out.append({"partitions": hi - lo, "seconds": round(seconds, 3), "per_partition_s": round(seconds / (hi - lo), 4)})
    return out


def project(cuts: list[dict[str, Any]], partitions: int, outside_s: float = 0.0) -> dict[str, Any]:
    """The seconds of ``partitions`` partitions, projected from ``cuts`` (:func:`tenths`): the
    least-squares line through each cut's seconds per partition at its middle (partitions done
    by then), integrated from 0 to ``partitions``, plus ``outside_s`` (what the run paid outside
    the cuts: its start and end, paid once). A falling line is taken as flat (its mean): a
    partition is not projected to get cheaper as the lake grows.

    Example:
        >>> p = project([{"partitions": 10, "per_partition_s": c} for c in (1.0, 1.2, 1.4)], 60, 5.0)
        >>> (p["growth_s_per_partition"], p["seconds"])
        (0.02, 95.0)
    """
    xs, ys, done = [], [], 0
    for c in cuts:
        xs.append(done + c["partitions"] / 2)
        ys.append(c["per_partition_s"])
        done += c["partitions"]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    if slope < 0:
        slope = 0.0
    first = my - slope * mx  # the line's cost of the very first partition
    seconds = outside_s + first * partitions + slope * partitions ** 2 / 2
    return {"partitions": partitions, "first_s": round(first, 4), "growth_s_per_partition": round(slope, 8),
            "last_s": round(first + slope * partitions, 4), "outside_s": round(outside_s, 2),
            "seconds": round(seconds, 1), "at_first_tenth_s": round(outside_s + cuts[0]["per_partition_s"] * partitions, 1)}


def done_times(spans: Sequence[Any], last_phase: str) -> dict[str, float]:
    """partition key -> epoch seconds its ``last_phase`` committed, from ledger spans
    (:class:`resources.ledger_views.PhaseSpan`)."""
    return {s.partition_key: s.completed_at.timestamp() for s in spans if s.phase == last_phase}


def phases_by_tenth(spans: Sequence[Any], last_phase: str, phases: Sequence[str],
                    parts: int = TENTHS) -> list[dict[str, float]]:
    """Per tenth of the partitions (in the order their ``last_phase`` committed): each phase's
    mean seconds a partition, claim to commit, a range step's span shared evenly by the
    partitions it claimed and committed together. Two runs at once overlap, so a tenth's phases
    can add up to more than its seconds: the figures tell which phase grows, not the wall time.

    Example:
        >>> from types import SimpleNamespace as S
        >>> at = lambda s: dt.datetime.fromtimestamp(s, dt.UTC)
        >>> spans = [S(partition_key=k, phase="p", created_at=at(0), completed_at=at(4)) for k in "ab"]
        >>> spans.append(S(partition_key="c", phase="p", created_at=at(4), completed_at=at(10)))
        >>> phases_by_tenth(spans, "p", ["p"], parts=3)
        [{'p': 2.0}, {'p': 2.0}, {'p': 6.0}]
    """
    done = done_times(spans, last_phase)
    order = sorted(done, key=lambda k: (done[k], k))
    bounds = [round(k * len(order) / parts) for k in range(parts + 1)]
    tenth_of = {key: k for k in range(parts) for key in order[bounds[k]:bounds[k + 1]]}
    together: dict[tuple[str, Any, Any], int] = {}
    for s in spans:
        together[(s.phase, s.created_at, s.completed_at)] = together.get((s.phase, s.created_at, s.completed_at), 0) + 1
    sums: dict[tuple[int, str], float] = {}
    for s in spans:
        k = tenth_of.get(s.partition_key)
        if k is not None:
            share = (s.completed_at - s.created_at).total_seconds() / together[(s.phase, s.created_at, s.completed_at)]
            sums[(k, s.phase)] = sums.get((k, s.phase), 0.0) + share
    return [{p: round(sums.get((k, p), 0.0) / max(bounds[k + 1] - bounds[k], 1), 4) for p in phases}
            for k in range(parts)]


def side_figures(name: str, wall_s: float, spans: Sequence[Any], phases: Sequence[str],
                 year_partitions: int = YEAR_PARTITIONS) -> dict[str, Any]:
    """One side's figures from its wall seconds and its ledger's spans (see the module docstring)."""
    done = done_times(spans, phases[-1])
    start = min(s.created_at.timestamp() for s in spans)
    cuts = tenths(list(done.values()), start)
    inside = sum(c["seconds"] for c in cuts)
    n = len(done)
    return {"side": name, "partitions": n, "wall_s": round(wall_s, 2), "per_partition_s": round(wall_s / n, 4),
            "tenths": cuts, "last_vs_first": round(cuts[-1]["per_partition_s"] / cuts[0]["per_partition_s"], 3)
            if cuts[0]["per_partition_s"] else None,
            "phases_by_tenth": phases_by_tenth(spans, phases[-1], phases),
            "projection": project(cuts, year_partitions, max(wall_s - inside, 0.0))}


def figures(sides: dict[str, dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows against :data:`TARGETS` (the ``figures`` of a ``docs/bench`` entry).

    Example:
        >>> side = {"partitions": 1500, "per_partition_s": 0.09, "wall_s": 135.0, "last_vs_first": 1.2,
        ...         "tenths": [{"per_partition_s": 0.08}, {"per_partition_s": 0.096}],
        ...         "projection": {"partitions": 18250, "seconds": 1900.0}}
        >>> [(r["figure"], r["met"]) for r in figures({"cli": side}, {"regions": 50, "days": 30,
        ...  "rows_per_partition": 500})]  # doctest: +NORMALIZE_WHITESPACE
        [('CLI: seconds a partition (50 x 30 x 500 rows)', True),
         ('CLI: last tenth / first tenth', False),
         ('CLI: a year of 18,250 partitions, projected from the tenths', False)]
    """
    size = f"{config['regions']} x {config['days']} x {config['rows_per_partition']:,} rows"
    rows: list[dict[str, Any]] = []
    for name, s in sides.items():
        label = name.upper()
        per = s["per_partition_s"]
        rows.append({"figure": f"{label}: seconds a partition ({size})", "value": round(per, 4), "unit": "s",
                     "target": f"<= {TARGETS['per_partition_s']:.2f} s", "met": per <= TARGETS["per_partition_s"],
                     "detail": f"{s['wall_s']:,.1f} s for {s['partitions']:,}"})
        growth = s["last_vs_first"]
        rows.append({"figure": f"{label}: last tenth / first tenth", "value": growth, "unit": "",
                     "target": f"<= {TARGETS['last_vs_first']}",
                     "met": growth is not None and growth <= TARGETS["last_vs_first"],
                     "detail": "tenths " + ", ".join(f"{t['per_partition_s']:.3f}" for t in s["tenths"]) + " s"})
        proj = s["projection"]
        if s["partitions"] >= proj["partitions"]:
            rows.append({"figure": f"{label}: {s['partitions']:,} partitions", "value": s["wall_s"], "unit": "s",
                         "target": f"< {TARGETS['year_s']:.0f} s", "met": s["wall_s"] < TARGETS["year_s"],
                         "detail": f"{s['wall_s'] / 60:.1f} minutes"})
        else:
            rows.append({"figure": f"{label}: a year of {proj['partitions']:,} partitions, projected from the tenths",
                         "value": proj["seconds"], "unit": "s", "target": f"< {TARGETS['year_s']:.0f} s",
                         "met": proj["seconds"] < TARGETS["year_s"], "detail": f"{proj['seconds'] / 60:.1f} minutes"})
    if "cli" in sides and "ui" in sides:
        ratio = sides["ui"]["per_partition_s"] / sides["cli"]["per_partition_s"]
        rows.append({"figure": "UI backfill / CLI", "value": round(ratio, 3), "unit": "",
                     "target": f"<= {TARGETS['ui_vs_cli']}", "met": ratio <= TARGETS["ui_vs_cli"]})
    return rows


def render(result: dict[str, Any]) -> str:
    """The run's figures as a person reads them: per side its tenths and phases, then every target."""
    c = result["config"]
    lines = [f"{c['partitions']:,} partitions ({c['regions']} regions x {c['days']} days x "
             f"{c['rows_per_partition']:,} rows), side by side from fresh homes"]
    for name, s in result["sides"].items():
        p = s["projection"]
        lines += ["", f"{name}: {s['wall_s']:,.1f} s, {s['per_partition_s']:.4f} s a partition; "
                      f"last tenth / first {s['last_vs_first']}; outside the tenths {p['outside_s']:.1f} s",
                  f"  year of {p['partitions']:,} projected: {p['seconds']:,.0f} s ({p['seconds'] / 60:.1f} min), a "
                  f"partition from {p['first_s']:.4f} s to {p['last_s']:.4f} s (at the first tenth's cost: "
                  f"{p['at_first_tenth_s']:,.0f} s)"]
        phases = list(s["phases_by_tenth"][0])
        lines.append("  tenth  partitions  s/partition  " + "  ".join(f"{ph:>9}" for ph in phases))
        for k, (t, ph) in enumerate(zip(s["tenths"], s["phases_by_tenth"], strict=True), start=1):
            lines.append(f"  {k:>5}  {t['partitions']:>10,}  {t['per_partition_s']:>11.4f}  "
                         + "  ".join(f"{ph[x]:>9.4f}" for x in phases))
    lines += ["", f"{'figure':<62} {'value':>10}  {'target':<10} met"]
    for r in result["figures"]:
        value = f"{r['value']:,.4g}" + (f" {r['unit']}" if r.get("unit") else "")
        lines.append(f"{r['figure']:<62} {value:>10}  {r['target']:<10} {'PASS' if r['met'] else 'FAIL'}")
    return "\n".join(lines)


def entry(result: dict[str, Any], *, date: str, commit: str, host: str) -> dict[str, Any]:
    """``result`` as a ``docs/bench`` entry (:mod:`pipeline.tools.bench_table`), its tenths kept."""
    c = result["config"]
    year = c["days"] >= 365
    sides = list(result["sides"])
    command = "stormlake bench " + ("--year" if year else "--month")
    if sides != default_sides(year):
        command += " --sides " + ",".join(sides)
    froms = " and the ".join(s.upper() for s in sides)
    return {"title": f"A {'year' if year else 'month'} of {c['regions']} regions from the {froms}, from fresh homes",
            "command": command, "date": date, "commit": commit, "host": host,
            "source": f"{c['partitions']:,} partitions of {c['rows_per_partition']:,} rows",
            "figures": result["figures"],
            "tenths": {name: [t["per_partition_s"] for t in s["tenths"]] for name, s in result["sides"].items()}}


def record(result: dict[str, Any], bench_dir: Path, page: Path, *, date: str, commit: str, host: str) -> Path:
    """Write ``result`` into ``bench_dir`` as ``<date>-month.json`` (``-year``) and render ``page``."""
    from pipeline.tools import bench_table

    sides = list(result["sides"])
    kind = "year" if result["config"]["days"] >= 365 else "month"
    if kind == "year" and sides != default_sides(True):  # the CLI's year of the same day keeps its file
        kind += "-" + "-".join(sides)
    path = bench_dir / f"{date}-{kind}.json"
    path.write_text(json.dumps(entry(result, date=date, commit=commit, host=host), indent=1) + "\n", encoding="utf-8")
    bench_table.main([str(page)])
    return path


# ---- the measurement -----------------------------------------------------------------------
class Progress:
    """One line on stderr while a side runs: partitions published of all, and the pace since the
    first look (the backfill's start)."""

    def __init__(self, side: str, total: int):
        self.side, self.total = side, total
        self.start: float | None = None
        self.last, self.shown = 0.0, -1
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if self.start is None:
            self.start = now
        if done == self.shown or (now - self.last < (1.0 if self.tty else PROGRESS_EVERY_S) and done < self.total):
            return
        self.last, self.shown = now, done
        elapsed = now - self.start
        pace = f", {elapsed / done:.3f} s a partition" if done else ""
        line = f"bench --month: {self.side} {done:,}/{self.total:,} published, {elapsed:,.0f} s{pace}"
        sys.stderr.write(f"\r{line}\033[K" if self.tty else line + "\n")
        if self.tty and done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _spans(ledger_dsn: str) -> list[Any]:
    from resources.ledger import Ledger
    from resources.ledger_views import LedgerViews

    ledger = Ledger(ledger_dsn)
    try:
        return LedgerViews(ledger).phase_spans()
    finally:
        ledger.close()


def cli_backfill(root: Path, env: dict[str, str], total: int) -> float:
    """``stormlake backfill`` on the prepared home of ``env``, timed whole, with progress from its
    ledger; its wall seconds. Its own output goes to ``root / "cli.log"``."""
    from pipeline.tools.bench_ui import _published
    from resources.errors import StormlakeError
    from resources.ledger import Ledger

    ledger = Ledger(env["STORMLAKE_PG_DSN"])
    progress = Progress("cli", total)
    log_path = root / "cli.log"
    try:
        with log_path.open("wb") as log:
            t = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-c", "from pipeline.cli import main; raise SystemExit(main())",
                                     "backfill"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                while proc.poll() is None:
                    if time.perf_counter() - t > HANG_GUARD_S:
                        raise StormlakeError(f"bench --month: the CLI backfill did not end (see {log_path})")
                    progress(_published(ledger))
                    time.sleep(0.5)
            finally:
                if proc.poll() is None:
                    from pipeline.tools.bench_ui import stop_group

                    stop_group(proc)
            wall = time.perf_counter() - t
        done = _published(ledger)
        progress(done)
    finally:
        ledger.close()
    if proc.returncode != 0 or done < total:
        raise StormlakeError(f"bench --month: stormlake backfill exited {proc.returncode} with {done:,} of "
                             f"{total:,} partitions published (see {log_path})")
    return wall


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _host() -> str:
    return f"a {os.cpu_count()}-core {platform.machine()} host"


def measure_month(args: argparse.Namespace, settings, *, year: bool = False) -> dict[str, Any]:  # noqa: ANN001
    """The figures of ``stormlake bench --month`` / ``--year`` (see the module docstring)."""
    from assets.phases import PHASES
    from pipeline.tools.bench import Databases, _child_env
    from pipeline.tools.bench_live import write_region_file
    from pipeline.tools.bench_ui import ui_backfill
    from pipeline.tools.bench_workers import prepare_home
    from pipeline.tools.generate import generate_scenario
    from resources.keys import partition_key

    size = dict(YEAR if year else MONTH)
    for name in ("regions", "days", "rows_per_partition"):
        if getattr(args, name, None):
            size[name] = getattr(args, name)
    if size["regions"] * size["days"] < TENTHS:
        from resources.errors import ConfigError

        raise ConfigError(f"--regions {size['regions']} x --days {size['days']}: the tenths need at least "
                          f"{TENTHS} partitions")
    sides = [s.strip() for s in (args.sides or ",".join(default_sides(year))).split(",") if s.strip()]
    phases = [p.name for p in PHASES]
    root = settings.home / "bench" / ("year" if year else "month")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    regions_file = root / "regions.csv"
    regions = write_region_file(regions_file, size["regions"])
    landing = root / "landing"
    first = first_day(settings.first_day, size["days"], dt.datetime.now(dt.UTC).date())
    keys = [partition_key((first + dt.timedelta(days=d)).isoformat(), r.region_id)
            for d in range(size["days"]) for r in regions]
    _say(f"generating {size['regions']} regions x {size['days']} days x {size['rows_per_partition']:,} rows "
         f"({len(keys):,} partitions)")
    t = time.perf_counter()
    generate_scenario(landing, regions, days=size["days"], start=first.isoformat(),
                      rows_per_partition=size["rows_per_partition"], seed=args.seed)
    _say(f"generated in {time.perf_counter() - t:.1f} s")
    dbs = Databases(settings.pg_dsn, settings.pgdata)
    out: dict[str, dict[str, Any]] = {}
    try:
        for side in sides:
            ledger_dsn, _ = dbs.create()
            env = _child_env(root / side, landing, ledger_dsn)
            env["STORMLAKE_REGIONS"] = str(regions_file)
            env["STORMLAKE_FIRST_DAY"] = first.isoformat()
            if side == "cli":
                prepare_home(env)
                _say(f"cli: stormlake backfill of {len(keys):,} partitions (its output in {root / 'cli.log'})")
                wall = cli_backfill(root, env, len(keys))
            else:
                _say(f"ui: stormlake ui, then launchPartitionBackfill of {len(keys):,} partitions "
                     f"(its output in {root / 'ui.log'})")
                wall = ui_backfill(root, "ui", env, keys, progress=Progress("ui", len(keys)), hang_guard_s=HANG_GUARD_S)
            out[side] = side_figures(side, wall, _spans(ledger_dsn), phases)
            _say(f"{side}: {wall:,.1f} s, {out[side]['per_partition_s']:.4f} s a partition")
            dbs.drop_all()
    finally:
        dbs.drop_all()
    config = {**size, "partitions": len(keys), "seed": args.seed, "year_partitions": YEAR_PARTITIONS}
    result = {"config": config, "sides": out}
    result["figures"] = figures(out, config)
    return result


def run_month_bench(args: argparse.Namespace, settings, *, year: bool = False) -> int:  # noqa: ANN001
    bad = [s for s in (args.sides or "cli").split(",") if s.strip() not in ("cli", "ui")]
    if bad:
        from resources.errors import ConfigError

        raise ConfigError(f"--sides {args.sides}: each side is cli or ui")
    result = measure_month(args, settings, year=year)
    print(json.dumps({"month": result}, indent=2) if args.json else render(result), flush=True)
    size = YEAR if year else MONTH
    if all(result["config"][k] == v for k, v in size.items()) and (year or len(result["sides"]) == 2):
        path = record(result, REPO / "docs" / "bench", REPO / "docs" / "BENCHMARKS.md",
                      date=dt.datetime.now(dt.UTC).date().isoformat(), commit=_commit(), host=_host())
        _say(f"recorded in {path.relative_to(REPO)}; docs/BENCHMARKS.md rendered anew")
    else:
        _say("not recorded: only the full size (and both sides for --month) is a result of record")
    return 0 if all(r["met"] for r in result["figures"]) else 1
