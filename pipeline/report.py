"""`stormlake report`: one self-contained HTML page on where every batch stands.

The page is built from the ledger only (checkpoints, their events and the receipts): a headline,
a heat map of days x regions coloured by tier with failures marked, a map of days x regions
coloured by signal quality, a picture of where batches stall and where the time goes per phase,
what waits for a person (held batches, dead letters), a table of the partitions that need
attention and a table of deliveries. Nothing on the page is fetched at view time: the CSS is inline and the
pictures are PNGs in ``data:`` URIs, drawn with matplotlib's object API on the Agg canvas (no
pyplot global state, so it is safe inside a Dagster process or a thread).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from assets.phases import PHASES, TIER_LABELS
from assets.quality import GRADES
from assets.transforms.pages import page_environment
from pipeline.status import views
from resources.errors import SummaryInvalid
from resources.files import write_atomic
from resources.keys import partition_key
from resources.ledger import Checkpoint, Ledger
from resources.ledger_views import (
    AttentionRow,
    EventRow,
    GridCell,
    LedgerViews,
    PhaseCount,
    PhaseDurations,
    ReceiptCounts,
    ReceiptRow,
    RegionCounts,
    StatusFilter,
    StatusSummary,
)
from resources.settings import DEFAULT_DEAD_LETTER_AFTER

T = TypeVar("T")

PHASE_NAMES = tuple(p.name for p in PHASES)
LAST_TIER = len(PHASES)
PICTURE_DPI = 100
#: Threads reading the ledger for the report at once (the ledger's pool holds four connections).
READ_THREADS = 3
TIER_COLORS = {0: "#bdbdbd", 1: "#d9f0d3", 2: "#a6dba0", 3: "#5aae61", 4: "#1b7837"}
TIER_TEXT = {0: "#222", 1: "#222", 2: "#222", 3: "#fff", 4: "#fff"}
STATUS_COLORS = {"COMPLETED": "#41ab5d", "PENDING": "#f4a331", "FAILED": "#d7191c", "NONE": "#e6e6e6"}
FAILED_RED = "#d7191c"
PENDING_ORANGE = "#e66101"
MAX_ATTENTION_ROWS = 500
MAX_REVIEW_ROWS = 200  # held batches and dead letters listed (the count says how many in all)
QUALITY_COLORS = {"high": "#1b7837", "medium": "#a6dba0", "low": "#fdb863", "noisy": "#d7191c"}
#: The two charts of phases.png, (left, bottom, width, height) as fractions of the figure.
PHASES_STALL_BOX = (0.07, 0.215, 0.475, 0.735)
PHASES_TIME_BOX = (0.615, 0.215, 0.375, 0.735)
WEEK_COLUMNS_AFTER = 120  # days on the heat map's axis beyond which its columns are weeks
MAX_REVISION_ROWS = 40
MAX_EVENT_ROWS = 25
MAX_MESSAGE_CHARS = 600
STALE_PENDING = dt.timedelta(minutes=15)  # a PENDING head untouched this long probably lost its worker


# ---- data -------------------------------------------------------------------------------------
@dataclass
class ReportData:
    """Everything the page shows, each part already aggregated by the ledger's views."""

    now: dt.datetime
    summary: StatusSummary
    grid: list[GridCell]
    phase_counts: list[PhaseCount]
    attention_total: int
    attention: list[AttentionRow]
    regions: list[RegionCounts]
    region_names: dict[str, str]
    event_counts: dict[tuple[str, str], int]               # (phase, status) -> events
    durations: dict[str, PhaseDurations]
    receipt_counts: list[ReceiptCounts]
    revisions: list[ReceiptRow]
    recent_events: list[EventRow]
    last_delivery_at: dt.datetime | None
    held: list[Checkpoint]  # present heads held for review
    dead_letters: list[Checkpoint]
    dead_letter_after: int
    hidden_phases: list[str]  # phases the reading role may not see (left out of every part of the page)
    #: One line for each held head whose stored summary does not read (assets/summaries.py): the
    #: page shows it in place of the batch's details, and `stormlake report` exits 1.
    summary_problems: list[SummaryInvalid] = dataclasses.field(default_factory=list)
    open_day: str = ""  # the UTC day in progress: its partitions get a new revision as files land
    open_partitions: list[OpenPartition] | None = None  # that day's partitions in the ledger

    @property
    def last_activity(self) -> dt.datetime | None:
        last_event = self.recent_events[0].at if self.recent_events else None
        times = [t for t in (last_event, self.last_delivery_at) if t is not None]
        return max(times) if times else None

    def heads(self, status: str) -> int:
        return sum(c.heads for c in self.phase_counts if c.status == status)


@dataclass(frozen=True)
class OpenPartition:
    """A partition of the day still open: how far it got and how many revisions it has had."""

    region: str
    tier: int
    tier_label: str
    revisions: int
    delivered: int


def _open_day(v: LedgerViews) -> tuple[str, list[OpenPartition]]:
    """The day still open (the current UTC day) and its partitions, read as ``status`` reads them."""
    from resources.landing import utc_today

    today = utc_today()
    rows = v.partitions(StatusFilter(days=(today, today)))
    return today, [OpenPartition(r.region, r.tier, r.tier_label, r.revisions,
                                 sum(d["status"] == "DELIVERED" for d in r.deliveries)) for r in rows]


def _region_names() -> dict[str, str]:
    """region_id -> display name from the configured region list; empty when it cannot be read."""
    from resources.errors import StormlakeError
    from resources.settings import load_regions, load_settings

    try:
        return {r.region_id: r.name for r in load_regions(load_settings().regions_file)}
    except (StormlakeError, OSError):  # the report must not fail over a label
        return {}


def collect(ledger: Ledger, *, dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER) -> ReportData:
    """Everything the page shows, read from the ledger's views (a dozen aggregate queries).

    The grid (one small row a partition) is read once; the headline counts and the per-region
    table are counted from it rather than read again. The reads are independent, so they run on
    :data:`READ_THREADS` threads, each on a connection of the ledger's pool, and the server
    answers several at once (one after the other, they were most of the page's time). A person's
    reads are logged once per kind of read and session (a request serves only its own session).
    """
    from concurrent.futures import ThreadPoolExecutor

    v = views(ledger)
    reads: dict[str, Callable[[LedgerViews], Any]] = {  # the longest first
        "durations": lambda w: w.durations(),
        "grid": lambda w: w.grid(),
        "dead_letters": lambda w: w.dead_letters(dead_letter_after),
        "recent_events": lambda w: w.recent_events(MAX_EVENT_ROWS),
        "attention": lambda w: w.attention(MAX_ATTENTION_ROWS),
        "phase_counts": lambda w: w.phase_counts(stale_after=STALE_PENDING),
        "event_counts": lambda w: w.event_counts(),
        "revisions": lambda w: w.latest_receipts(MAX_REVISION_ROWS),
        "receipt_counts": lambda w: w.receipt_counts(),
        "last_delivery_at": lambda w: w.last_delivery_at(),
        "hidden_phases": lambda w: w.hidden_phases(),
        "open_day": _open_day,
    }
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="report-read") as pool:
        pending = {name: pool.submit(read, v.sibling()) for name, read in reads.items()}
        grid = pending["grid"].result()
        held_keys = [partition_key(c.day, c.region) for c in grid if c.held]
        held, problems = _readable(v.held(held_keys) if held_keys else [])
        got = {name: f.result() for name, f in pending.items()}
    total, attention, _ = got["attention"]
    return ReportData(
        now=dt.datetime.now(dt.UTC),
        summary=_counts(grid),
        grid=grid,
        phase_counts=got["phase_counts"],
        attention_total=total,
        attention=attention,
        regions=[_counts(cells, region=r) for r, cells in sorted(_by_region(grid).items())],
        region_names=_region_names(),
        event_counts=got["event_counts"],
        durations=got["durations"],
        receipt_counts=got["receipt_counts"],
        revisions=got["revisions"],
        recent_events=got["recent_events"],
        last_delivery_at=got["last_delivery_at"],
        held=held,
        dead_letters=got["dead_letters"],
        dead_letter_after=dead_letter_after,
        hidden_phases=got["hidden_phases"],
        summary_problems=problems,
        open_day=got["open_day"][0],
        open_partitions=got["open_day"][1],
    )


def _readable(cps: list[Checkpoint]) -> tuple[list[Checkpoint], list[SummaryInvalid]]:
    """The checkpoints whose stored summary reads, and a line for each of the others."""
    from assets.summaries import invalid_summary, summary_problem

    ok, problems = [], []
    for cp in cps:
        bad = summary_problem(cp.phase, cp.schema_version, cp.summary)
        if bad is None:
            ok.append(cp)
        else:
            problems.append(invalid_summary(partition_key=cp.partition_key, phase=cp.phase, seq=cp.seq,
                                            field=bad[0], problem=bad[1]))
    return ok, problems


def _by_region(grid: list[GridCell]) -> dict[str, list[GridCell]]:
    out: dict[str, list[GridCell]] = {}
    for c in grid:
        out.setdefault(c.region, []).append(c)
    return out


def _counts(cells: list[GridCell], *, region: str | None = None) -> StatusSummary:
    """The partitions of ``cells`` counted by tier, failure, pending, hold and quality."""
    by_tier = dict.fromkeys(range(LAST_TIER + 1), 0)
    by_tier.update(Counter(c.tier for c in cells))
    fields = dict(partitions=len(cells), by_tier=by_tier, with_failure=sum(c.failed for c in cells),
                  with_pending=sum(c.pending for c in cells), held=sum(c.held for c in cells),
                  by_quality=dict(Counter(c.quality for c in cells if c.quality)))
    return StatusSummary(**fields) if region is None else RegionCounts(region=region, **fields)


# ---- pictures ---------------------------------------------------------------------------------
def _hide_top_right(ax) -> None:  # noqa: ANN001 - a matplotlib Axes
    """Leave the axes open at the top and right."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _day_axis(days: set[str]) -> list[str]:
    """The days to draw: the whole calendar range when it is not too sparse, so gaps show."""
    ordered = sorted(days)
    try:
        first, last = dt.date.fromisoformat(ordered[0]), dt.date.fromisoformat(ordered[-1])
    except ValueError:
        return ordered
    span = (last - first).days + 1
    if span > max(3 * len(ordered), 31) or span > 1500:
        return ordered
    full = [(first + dt.timedelta(days=i)).isoformat() for i in range(span)]
    return sorted(set(full) | days)


def _region_axis(regions: set[str], names: dict[str, str]) -> list[str]:
    """Regions in the order of the region list (as configured), unknown ones after, by id."""
    order = {rid: i for i, rid in enumerate(names)}
    return sorted(regions, key=lambda r: (order.get(r, len(order)), r))


def _tick_step(n: int, room: int) -> int:
    return max(1, -(-n // room))


def _columns(days: set[str]) -> tuple[list[str], dict[str, int], str]:
    """The heat map's columns: one per day, or one per week (from Monday) when the days on the axis
    are more than :data:`WEEK_COLUMNS_AFTER`. Returns (labels, day -> column, unit)."""
    axis = _day_axis(days)
    if len(axis) <= WEEK_COLUMNS_AFTER:
        return axis, {d: i for i, d in enumerate(axis)}, "day"
    dates = {d: dt.date.fromisoformat(d) for d in days}
    first = min(dates.values())
    monday = first - dt.timedelta(days=first.weekday())
    index = {d: (date - monday).days // 7 for d, date in dates.items()}
    labels = [(monday + dt.timedelta(weeks=i)).isoformat() for i in range(max(index.values()) + 1)]
    return labels, index, "week"


@dataclass(frozen=True)
class HeatGrid:
    """The heat map's cells: the lowest tier per (region, column), and where a phase failed or waits."""

    columns: list[str]
    unit: str  # "day" or "week"
    regions: list[str]
    tiers: Any  # float array (regions x columns), -1 where no partition is in the ledger
    failed: Any  # bool array
    pending: Any  # bool array, False where failed


def heat_grid(data: ReportData) -> HeatGrid:
    import numpy as np

    columns, dx, unit = _columns({c.day for c in data.grid})
    regions = _region_axis({c.region for c in data.grid}, data.region_names)
    ry = {r: i for i, r in enumerate(regions)}
    n = len(data.grid)
    xs = np.fromiter((dx[c.day] for c in data.grid), dtype=np.int64, count=n)
    ys = np.fromiter((ry[c.region] for c in data.grid), dtype=np.int64, count=n)
    tiers = np.full((len(regions), len(columns)), np.inf)
    np.minimum.at(tiers, (ys, xs), np.fromiter((c.tier for c in data.grid), dtype=float, count=n))
    tiers[np.isinf(tiers)] = -1
    failed = np.zeros(tiers.shape, dtype=bool)
    pending = np.zeros(tiers.shape, dtype=bool)
    fail = np.fromiter((c.failed for c in data.grid), dtype=bool, count=n)
    pend = np.fromiter((c.pending for c in data.grid), dtype=bool, count=n)
    failed[ys[fail], xs[fail]] = True
    pending[ys[pend], xs[pend]] = True
    return HeatGrid(columns, unit, regions, tiers, failed, pending & ~failed)


def _cell_artists(ax, g: HeatGrid, width: float, height: float,  # noqa: ANN001 - an Axes
                  colors: list[str]) -> tuple[list[Any], list[Any]]:
    """Added to ``ax``: the grid's cells, value ``i`` in ``colors[i]`` (a negative value shows the
    axes' hatched background) with thin white lines between them, then the marks of its failed and
    pending cells; two lists, drawn under and over the axes' spines."""
    import numpy as np
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_rgba_array

    # The cells' colours are looked up here, on the grid itself, and the image is given as RGBA:
    # matplotlib then only resamples it to the axes' pixels, instead of resampling the values
    # and their mask and colouring every pixel of the picture.
    lut = np.vstack([(to_rgba_array(colors) * 255).round(), [[0, 0, 0, 0]]]).astype(np.uint8)
    index = np.where(g.tiers < 0, len(colors), g.tiers).astype(np.intp)  # -1: transparent, the background shows
    cells: list[Any] = [ax.imshow(lut[index], aspect="auto", interpolation="nearest", origin="upper")]
    nr, nd = g.tiers.shape
    if nd <= 120 and nr <= 120:  # thin white lines between cells
        xs = np.arange(0.5, nd - 1, 1.0)
        ys = np.arange(0.5, nr - 1, 1.0)
        segments = [((x, -0.5), (x, nr - 0.5)) for x in xs] + [((-0.5, y), (nd - 0.5, y)) for y in ys]
        cells.append(ax.add_collection(LineCollection(segments, colors="white",
                                                      linewidths=1.0 if max(nd, nr) < 60 else 0.4),
                                       autolim=False))
    marks: list[Any] = []
    cell_pt = min(width * 0.8 * 72 / max(nd, 1), height * 0.75 * 72 / max(nr, 1))
    size = max(4.0, (0.55 * cell_pt) ** 2)  # a marker of about half a cell, in points squared
    failed_y, failed_x = np.nonzero(g.failed)
    pending_y, pending_x = np.nonzero(g.pending)
    if len(failed_x):
        marks.append(ax.scatter(failed_x, failed_y, marker="X", s=size, c=FAILED_RED, edgecolors="white",
                                linewidths=0.6 if cell_pt > 8 else 0, zorder=3))
    if len(pending_x):
        marks.append(ax.scatter(pending_x, pending_y, marker="o", s=size * 0.8, facecolors="none",
                                edgecolors=PENDING_ORANGE, linewidths=1.6 if cell_pt > 8 else 0.8, zorder=3))
    return cells, marks


def _label_axes(ax, g: HeatGrid, width: float, height: float) -> tuple[float, float]:  # noqa: ANN001 - an Axes
    """Limits, the hatched background, tick marks, tick labels and axis labels of a grid's axes.

    The ticks are one line of markers per axis and the labels plain texts placed at fixed offsets
    from the axes, rather than matplotlib's axis ticks (several artists each, made and measured
    again on every layout pass; a year's 50 regions and 53 weeks made this the slowest part of the
    report). Returns the pixels the labels need left of and below the axes.
    """
    import matplotlib as mpl
    from matplotlib.lines import Line2D
    from matplotlib.markers import TICKDOWN, TICKLEFT
    from matplotlib.transforms import blended_transform_factory

    from assets.transforms.render import shifted

    nr, nd = g.tiers.shape
    fig = ax.figure
    ax.set_xlim(-0.5, nd - 0.5)
    ax.set_ylim(nr - 0.5, -0.5)  # first region on top
    ax.set_autoscale_on(False)  # the cells drawn later leave the limits alone
    ax.set_xticks([])
    ax.set_yticks([])
    ax.patch.set_facecolor("white")
    ax.patch.set_hatch("////")
    ax.patch.set_edgecolor("#d0d0d0")
    _hide_top_right(ax)

    tick_pt = mpl.rcParams["xtick.major.size"]
    gap = tick_pt * fig.dpi / 72  # a tick's length, then as much again to its label, as matplotlib's
    below = blended_transform_factory(ax.transData, ax.transAxes)
    beside = blended_transform_factory(ax.transAxes, ax.transData)
    xs = list(range(0, nd, _tick_step(nd, int(width * 4))))
    ys = list(range(0, nr, _tick_step(nr, int(height * 5))))
    for pos, transform, marker in ((xs, below, TICKDOWN), (ys, beside, TICKLEFT)):
        zeros = [0] * len(pos)
        ax.add_line(Line2D(*((pos, zeros) if marker == TICKDOWN else (zeros, pos)), transform=transform,
                           marker=marker, markersize=tick_pt, markeredgewidth=mpl.rcParams["xtick.major.width"],
                           color="black",
                           linestyle="", clip_on=False))
    xlabels = [ax.text(i, 0, g.columns[i], transform=shifted(fig, below, 0, -2 * gap), rotation=60, ha="right",
                       va="top", rotation_mode="anchor", fontsize=8, clip_on=False) for i in xs]
    ylabels = [ax.text(0, i, g.regions[i], transform=shifted(fig, beside, -2 * gap, 0), ha="right",
                       va="center_baseline", fontsize=8, clip_on=False) for i in ys]
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    depth = box.y0 - min(t.get_window_extent(renderer).y0 for t in xlabels) + 4
    reach = box.x0 - min(t.get_window_extent(renderer).x0 for t in ylabels) + 4
    xlabel = ax.text(0.5, 0, "day" if g.unit == "day" else "week (from Monday)", ha="center", va="top",
                     transform=shifted(fig, ax.transAxes, 0, -depth), fontsize="medium")
    ylabel = ax.text(0, 0.5, "region", rotation=90, ha="right", va="center",
                     transform=shifted(fig, ax.transAxes, -reach, 0), fontsize="medium")
    return (reach + ylabel.get_window_extent(renderer).width,
            depth + xlabel.get_window_extent(renderer).height)


def _heat_handles() -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [
        Patch(facecolor=TIER_COLORS[t], edgecolor="#999", label=f"{t} {TIER_LABELS[t]}") for t in range(LAST_TIER + 1)
    ]
    handles.append(Patch(facecolor="white", edgecolor="#b0b0b0", hatch="////", label="not in ledger"))
    handles.append(Line2D([], [], marker="X", linestyle="", markersize=9, markerfacecolor=FAILED_RED,
                          markeredgecolor="white", label="a phase FAILED"))
    handles.append(Line2D([], [], marker="o", linestyle="", markersize=8, markerfacecolor="none",
                          markeredgecolor=PENDING_ORANGE, markeredgewidth=1.6, label="a phase PENDING"))
    return handles


def _quality_handles() -> list[Any]:
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(facecolor=QUALITY_COLORS[q], edgecolor="#999",
                                label=q + (" (held)" if q == "noisy" else "")) for q in GRADES]
    handles.append(Patch(facecolor="white", edgecolor="#b0b0b0", hatch="////", label="not graded yet"))
    return handles


@dataclass(frozen=True)
class GridMap:
    """One picture over the (column, region) grid: its cells, their colours, title and legend."""

    grid: HeatGrid
    colors: list[str]
    title: str
    legend_title: str
    handles: list[Any]


#: Blank pixels between the pictures' outermost texts and the figure's edge.
GRID_EDGE_PX = 8.0


def grid_pngs(maps: list[GridMap]) -> list[bytes]:
    """PNG bytes of each map; all of them have the grid, and so the figure size, of the first.

    The maps of a report share their columns and regions, so their axes, ticks and labels are laid
    out and drawn once, and each map draws its own artists over those pixels: its cells, the lines
    between them, the marks, the title and the legend. The layout is fixed, not matplotlib's
    constrained layout (which measured every tick label of the figure on each of its passes, about
    half of a year's report): the margins are the measured extents of the y axis, the x axis, the
    title and the widest legend. A map's pixels depend only on the maps asked for, never on what was
    drawn before. The second map is drawn by a fork (:func:`drawn_aside`) while this process draws
    the first.
    """
    from assets.transforms.render import draw_over, new_figure

    g = maps[0].grid
    nr, nd = g.tiers.shape
    width = min(18.0, max(7.5, 2.8 + nd * 0.32))
    height = min(14.0, max(2.6, 1.6 + nr * 0.3))
    fig, canvas = new_figure((width, height), dpi=PICTURE_DPI)
    ax = fig.add_axes((0.1, 0.1, 0.8, 0.8))  # placed below, once its labels are measured
    left, bottom = _label_axes(ax, g, width, height)
    legends = [fig.legend(handles=m.handles, loc="upper left", fontsize=8, frameon=False, title=m.legend_title,
                          title_fontsize=9, alignment="left") for m in maps]
    renderer = canvas.get_renderer()
    title = ax.set_title(maps[0].title, loc="left", fontsize=11, y=1.0)  # every title is one line of this size
    box = ax.get_window_extent(renderer)
    left += GRID_EDGE_PX
    bottom += GRID_EDGE_PX
    top = title.get_window_extent(renderer).y1 - box.y1 + GRID_EDGE_PX
    right = max(leg.get_window_extent(renderer).width for leg in legends) + GRID_EDGE_PX
    fw, fh = fig.bbox.width, fig.bbox.height
    ax.set_position((left / fw, bottom / fh, max(0.1, 1 - (left + right) / fw), max(0.1, 1 - (bottom + top) / fh)))
    for leg in legends:
        leg.set_bbox_to_anchor((1 - right / fw, 1 - GRID_EDGE_PX / fh), transform=fig.transFigure)
        leg.set_visible(False)
    title.set_text("")
    spines = [ax.spines["left"], ax.spines["bottom"]]  # drawn over each map's cells, not in the template
    for spine in spines:
        spine.set_visible(False)
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    for spine in spines:
        spine.set_visible(True)

    def draw(m: GridMap, leg: Any) -> bytes:  # noqa: ANN401 - a Legend
        cells, marks = _cell_artists(ax, m.grid, width, height, m.colors)
        try:
            title = ax.set_title(m.title, loc="left", fontsize=11, y=1.0)
            leg.set_visible(True)
            return draw_over(canvas, background, [(ax, [*cells, *spines, *marks, title]), (fig, [leg])])
        finally:
            leg.set_visible(False)
            ax.set_title("", loc="left")
            for artist in [*cells, *marks]:
                artist.remove()

    # The maps after the first are drawn by forks of this process, the template drawn, on the
    # other core; each starts from the template alone, as the first does here.
    others = [drawn_aside(functools.partial(draw, m, leg)) for m, leg in zip(maps[1:], legends[1:], strict=True)]
    first, rest = _alongside(lambda: draw(maps[0], legends[0]), others)
    return [first, *rest]


def heat_map(data: ReportData) -> GridMap:
    """Days (x) by regions (y), each cell coloured by tier; FAILED marked X, PENDING circled.

    A long range (a season, a year) shows weeks as columns: a cell is the lowest tier any day of
    that week reached in that region, marked when any of its days has a failed or pending phase.
    """
    g = heat_grid(data)
    return GridMap(g, [TIER_COLORS[t] for t in range(LAST_TIER + 1)],
                   "Where every batch stands: tier reached per (day, region)" if g.unit == "day" else
                   "Where every batch stands: lowest tier reached in each week, per region", "tier", _heat_handles())


def heatmap_png(data: ReportData) -> bytes:
    return grid_pngs([heat_map(data)])[0]


def quality_grid(data: ReportData) -> HeatGrid:
    """The quality map's cells: the worst grade per (region, column) as its index in GRADES, -1 where
    no partition of the cell has been graded (present has not run)."""
    import numpy as np

    columns, dx, unit = _columns({c.day for c in data.grid})
    regions = _region_axis({c.region for c in data.grid}, data.region_names)
    ry = {r: i for i, r in enumerate(regions)}
    grades = np.full((len(regions), len(columns)), -1.0)
    graded = [c for c in data.grid if c.quality in GRADES]
    if graded:
        ys = np.fromiter((ry[c.region] for c in graded), dtype=np.int64, count=len(graded))
        xs = np.fromiter((dx[c.day] for c in graded), dtype=np.int64, count=len(graded))
        np.maximum.at(grades, (ys, xs), np.fromiter((GRADES.index(c.quality) for c in graded), dtype=float,
                                                    count=len(graded)))
    none = np.zeros(grades.shape, dtype=bool)
    return HeatGrid(columns, unit, regions, grades, none, none)


def quality_map(data: ReportData) -> GridMap:
    """Days (x) by regions (y), each cell coloured by the batch's signal quality (worst of a week
    when the columns are weeks); a noisy batch is held for review. No cell is marked failed or pending."""
    g = quality_grid(data)
    return GridMap(g, [QUALITY_COLORS[q] for q in GRADES],
                   "Signal quality per (day, region)" if g.unit == "day" else
                   "Signal quality: worst grade of each week, per region", "quality", _quality_handles())


def quality_png(data: ReportData) -> bytes:
    return grid_pngs([quality_map(data)])[0]


def _stall_bars(ax, data: ReportData) -> None:  # noqa: ANN001 - a matplotlib Axes
    """Per phase, head checkpoints by status (stacked), and the heads that needed a retry."""
    import numpy as np

    total = data.summary.partitions
    by_status = {s: [0] * len(PHASE_NAMES) for s in ("COMPLETED", "PENDING", "FAILED")}
    retried = [0] * len(PHASE_NAMES)
    for c in data.phase_counts:
        if c.phase in PHASE_NAMES:
            i = PHASE_NAMES.index(c.phase)
            by_status[c.status][i] += c.heads
            retried[i] += c.retried
    not_run = [total - sum(by_status[s][i] for s in by_status) for i in range(len(PHASE_NAMES))]
    skipped = [data.event_counts.get((ph, "SKIPPED"), 0) for ph in PHASE_NAMES]
    x = np.arange(len(PHASE_NAMES))
    bottom = np.zeros(len(PHASE_NAMES))
    for status, values, label in (
        ("COMPLETED", by_status["COMPLETED"], "COMPLETED"),
        ("FAILED", by_status["FAILED"], "FAILED"),
        ("PENDING", by_status["PENDING"], "PENDING (running or stalled)"),
        ("NONE", not_run, "no checkpoint yet"),
    ):
        vals = np.array(values, dtype=float)
        ax.bar(x - 0.12, vals, 0.56, bottom=bottom, color=STATUS_COLORS[status], label=label,
               edgecolor="white", linewidth=0.5)
        for i, v in enumerate(vals):
            if v and status in ("FAILED", "PENDING") and v >= 0.045 * max(total, 1):
                ax.annotate(f"{int(v)}", (x[i] - 0.12, bottom[i] + v / 2), ha="center", va="center",
                            fontsize=8, color="white" if status == "FAILED" else "#222", fontweight="bold")
        bottom += vals
    ax.bar(x + 0.29, retried, 0.2, color="#ffffff", edgecolor="#7b3294", hatch="////",
           label="attempts > 1 (retried)")
    for i, v in enumerate(retried):
        if v:
            ax.annotate(str(v), (x[i] + 0.29, v), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=8, color="#7b3294")
    labels = []
    for i, ph in enumerate(PHASE_NAMES):
        notes = [f"{n} {what}" for n, what in ((by_status["FAILED"][i], "failed"),
                                                (by_status["PENDING"][i], "pending"),
                                                (skipped[i], "skips")) if n]
        labels.append(ph + ("\n" + ", ".join(notes) if notes else ""))
    ax.set_xticks(x, labels, fontsize=9)
    ax.set_ylabel("partitions")
    ax.set_ylim(0, max(total, max(retried, default=0), 1) * 1.12)
    ax.set_title("Where batches stall: head checkpoint per phase", loc="left", fontsize=11)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    _hide_top_right(ax)


def _duration_bars(ax, data: ReportData) -> None:  # noqa: ANN001 - a matplotlib Axes
    """Per phase, time from claim to COMPLETED: median, 90th percentile and the slowest attempt."""
    import numpy as np

    rows = [(ph, data.durations.get(ph)) for ph in PHASE_NAMES]
    y = np.arange(len(PHASE_NAMES))[::-1]
    if any(r and r.n for _, r in rows):
        p50 = np.array([float(r.p50) if r and r.p50 is not None else 0.0 for _, r in rows])
        p90 = np.array([float(r.p90) if r and r.p90 is not None else 0.0 for _, r in rows])
        mx = np.array([float(r.max) if r and r.max is not None else 0.0 for _, r in rows])
        ax.barh(y, p90, 0.55, color="#c6dbef", label="90th percentile")
        ax.barh(y, p50, 0.55, color="#2171b5", label="median")
        ax.scatter(mx, y, marker="|", s=220, color="#08306b", label="slowest", zorder=3)
        top = float(max(mx.max(), p90.max(), 1e-3))
        for i, (_, r) in enumerate(rows):
            if r and r.n:
                text = f"med {_fmt_secs(p50[i])}, n={r.n}" + (f", {r.failed} failed" if r.failed else "")
            elif r and r.failed:
                text = f"{r.failed} failed, none completed"
            else:
                text = "no finished attempt"
            ax.annotate(text, (max(mx[i], p90[i]), y[i]), xytext=(6, 0), textcoords="offset points",
                        va="center", fontsize=8, color="#333")
        ax.set_xlim(0, top * 1.6)
        ax.set_xlabel("seconds per attempt (claim → COMPLETED)")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    else:
        ax.text(0.5, 0.5, "no finished attempts yet", ha="center", va="center", transform=ax.transAxes,
                color="#666")
        ax.set_xticks([])
    ax.set_yticks(y, PHASE_NAMES, fontsize=9)
    ax.set_title("Where time goes: duration of an attempt per phase", loc="left", fontsize=11)
    _hide_top_right(ax)


def phases_png(data: ReportData) -> bytes:
    """Left: where batches stall (heads per phase by status). Right: where time goes (attempt times)."""
    from assets.transforms.render import figure_png, new_figure

    fig, canvas = new_figure((12.0, 4.8), dpi=PICTURE_DPI)
    # A fixed layout (constrained layout measured every text on each pass): room on the left for
    # counts of up to six digits, between the charts for the phase names, below for two-line tick
    # labels and the legends.
    ax = fig.add_axes(PHASES_STALL_BOX)
    ax2 = fig.add_axes(PHASES_TIME_BOX)
    _stall_bars(ax, data)
    _duration_bars(ax2, data)
    return figure_png(canvas)


# ---- html -------------------------------------------------------------------------------------
def _fmt_secs(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _fmt_time(t: dt.datetime | None) -> str:
    if t is None:
        return "—"
    if t.tzinfo is not None:
        t = t.astimezone(dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(t: dt.datetime | None, now: dt.datetime) -> str:
    if t is None:
        return ""
    secs = max(0.0, (now - t).total_seconds())
    if secs < 90:
        return f"{secs:.0f} s ago"
    if secs < 5400:
        return f"{secs / 60:.0f} min ago"
    if secs < 172800:
        return f"{secs / 3600:.1f} h ago"
    return f"{secs / 86400:.1f} days ago"


def _stalled(a: AttentionRow, now: dt.datetime) -> str:
    if a.state != "PENDING" or a.updated_at is None:
        return ""
    return f" · {_ago(a.updated_at, now)}" + (" (stale?)" if now - a.updated_at > STALE_PENDING else "")


def _clip(text: str | None) -> str:
    text = text or ""
    if len(text) > MAX_MESSAGE_CHARS:
        return text[:MAX_MESSAGE_CHARS] + f"… ({len(text) - MAX_MESSAGE_CHARS} more characters)"
    return text


def _verdict(data: ReportData, stale: int) -> dict[str, str]:
    total, published = data.summary.partitions, data.summary.by_tier[LAST_TIER]
    if data.summary.with_failure:
        return {"text": f"{data.summary.with_failure} of {total} partitions have a FAILED phase; {published} published.",
                "cls": "bad"}
    if published == total:
        return {"text": f"All {total} partitions are published (tier {LAST_TIER}).", "cls": "ok"}
    waiting = f" ({stale} PENDING phases untouched for over {STALE_PENDING.seconds // 60} min)" if stale else ""
    return {"text": f"{published} of {total} partitions published; {total - published} still on the way{waiting}.",
            "cls": "warn"}


def render_page(data: ReportData, images: dict[str, bytes], *, role: str | None = None) -> str:
    """The page from its data and pictures, through ``templates/report.html.j2`` (autoescaped)."""
    stale = sum(c.stale for c in data.phase_counts)
    totals: dict[str, Counter] = {}
    for r in data.receipt_counts:
        totals.setdefault(r.target, Counter())["DELIVERED"] += r.delivered
        totals[r.target]["PENDING"] += r.pending
    days = sorted({c.day for c in data.grid})
    note = (f"{data.summary.partitions} partitions, {len(data.regions)} regions, days {days[0]} … {days[-1]}"
            if days else "nothing has run yet")
    per_region = {r.region: r for r in data.regions}
    env = page_environment("pipeline")
    env.filters.update(time=_fmt_time, ago=_ago, stalled=_stalled, clip=_clip)
    return env.get_template("report.html.j2").render(
        data=data, images=images, note=note, now=data.now, verdict=_verdict(data, stale),
        headline={"failed": data.heads("FAILED"), "pending": data.heads("PENDING"), "stale": stale,
                  "pending_receipts": sum(r.pending for r in data.receipt_counts),
                  "delivered": sum(r.delivered for r in data.receipt_counts)},
        delivery_totals=sorted(totals.items()),
        regions=[per_region[r] for r in _region_axis(set(per_region), data.region_names)],
        region_names=data.region_names, tiers=range(LAST_TIER + 1), last_tier=LAST_TIER,
        tier_labels=TIER_LABELS, tier_colors=TIER_COLORS, tier_text=TIER_TEXT,
        week_columns_after=WEEK_COLUMNS_AFTER, grades=GRADES, review_rows=MAX_REVIEW_ROWS, role=role,
    )


def drawn_aside(draw: Callable[[], bytes]) -> Callable[[], bytes]:
    """Start ``draw()`` in a forked process and return a function that waits for its bytes.

    The report's pictures take a core each for a few hundred milliseconds on a year's ledger; a
    fork of this process (the drawing libraries already imported, the data already read) draws one
    on the other core. The child draws, writes the bytes to a pipe and leaves with ``os._exit``
    (it touches neither the ledger's connections nor anything else of this process; a failure of
    its own is printed on stderr). Where fork or a pipe is not available, or the child does not
    deliver, the picture is drawn here instead: the same bytes, since a drawing depends only on
    its data.
    """
    if not hasattr(os, "fork"):
        return draw
    try:
        r, w = os.pipe()
    except OSError:
        return draw
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return draw
    if pid == 0:  # the child
        code = 1
        try:
            os.close(r)
            png = draw()
            with os.fdopen(w, "wb") as out:
                out.write(png)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)

    def result() -> bytes:
        with os.fdopen(r, "rb") as pipe:
            png = pipe.read()
        try:
            _, status = os.waitpid(pid, 0)
            delivered = os.waitstatus_to_exitcode(status) == 0
        except ChildProcessError:  # reaped already (SIGCHLD ignored): trust a whole PNG only
            delivered = png.startswith(b"\x89PNG") and png.endswith(b"IEND\xaeB`\x82")
        return png if delivered else draw()

    return result


def _alongside(here: Callable[[], T], aside: list[Callable[[], bytes]]) -> tuple[T, list[bytes]]:
    """``here()`` in this process while the drawings of ``aside`` (:func:`drawn_aside`) go on, then
    their bytes. When ``here`` fails, they are still waited for, and an error of theirs does not
    hide the one on its way."""
    try:
        mine = here()
    except BaseException:
        for wait in aside:
            with contextlib.suppress(Exception):
                wait()
        raise
    return mine, [wait() for wait in aside]


def render_report_with_images(ledger: Ledger, *, dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER,
                              role: str | None = None) -> tuple[str, dict[str, bytes]]:
    """The page and its pictures (name -> PNG bytes), for callers that also want the files."""
    page, images, _ = _render(ledger, dead_letter_after=dead_letter_after, role=role)
    return page, images


def _render(ledger: Ledger, *, dead_letter_after: int, role: str | None) -> tuple[str, dict[str, bytes], ReportData]:
    """The page, its pictures and the data they show.

    The ledger's queries run on a thread while this one imports the drawing libraries (about a
    second each for a year's ledger): the server works while Python imports.
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="report-collect") as pool:
        reading = pool.submit(collect, ledger, dead_letter_after=dead_letter_after)
        import assets.transforms.render  # noqa: F401 - the pictures' libraries, imported meanwhile
        data = reading.result()
    if not data.summary.partitions:
        return render_page(data, {}, role=role), {}, data
    phases = drawn_aside(lambda: phases_png(data))  # on the other core while the maps are drawn here
    (heat, *quality), [phases_picture] = _alongside(
        lambda: grid_pngs([heat_map(data), *([quality_map(data)] if data.summary.by_quality else [])]), [phases])
    images = {"heatmap.png": heat, "phases.png": phases_picture}
    if quality:
        images["quality.png"] = quality[0]
    return render_page(data, images, role=role), images, data


def write_report(ledger: Ledger, out: Path, *, images_dir: Path | None = None,
                 dead_letter_after: int = DEFAULT_DEAD_LETTER_AFTER, role: str | None = None) -> list[str]:
    """Write the report page to ``out`` atomically (temporary file in the same folder, then rename);
    the lines of the stored summaries it could not read (:attr:`ReportData.summary_problems`).

    With ``images_dir`` the pictures are also written there as PNG files (the page never needs them).
    """
    out = Path(out)
    page, images, data = _render(ledger, dead_letter_after=dead_letter_after, role=role)
    write_atomic(out, page, durable=True)
    if images_dir is not None:
        images_dir = Path(images_dir)
        images_dir.mkdir(parents=True, exist_ok=True)
        for name, png in images.items():
            (images_dir / name).write_bytes(png)
    return [str(p) for p in data.summary_problems]
