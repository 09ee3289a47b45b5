"""`stormlake report`: one self-contained HTML page on where every batch stands.

The page is built from the ledger only (checkpoints, their events and the receipts): a headline,
a heat map of days x regions coloured by tier with failures marked, a picture of where batches
stall and where the time goes per phase, a table of the partitions that need attention and a
table of deliveries. Nothing on the page is fetched at view time: the CSS is inline and the
pictures are PNGs in ``data:`` URIs, drawn with matplotlib's object API on the Agg canvas (no
pyplot global state, so it is safe inside a Dagster process or a thread).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assets.phases import PHASES, TIER_LABELS
from pipeline.status import views
from resources.ledger import Ledger
from resources.ledger_views import (
    AttentionRow,
    EventRow,
    GridCell,
    PhaseCount,
    PhaseDurations,
    ReceiptCounts,
    ReceiptRow,
    RegionCounts,
    StatusSummary,
)

PHASE_NAMES = tuple(p.name for p in PHASES)
LAST_TIER = len(PHASES)
TIER_COLORS = {0: "#bdbdbd", 1: "#d9f0d3", 2: "#a6dba0", 3: "#5aae61", 4: "#1b7837"}
TIER_TEXT = {0: "#222", 1: "#222", 2: "#222", 3: "#fff", 4: "#fff"}
STATUS_COLORS = {"COMPLETED": "#41ab5d", "PENDING": "#f4a331", "FAILED": "#d7191c", "NONE": "#e6e6e6"}
FAILED_RED = "#d7191c"
PENDING_ORANGE = "#e66101"
MAX_ATTENTION_ROWS = 500
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

    @property
    def last_activity(self) -> dt.datetime | None:
        last_event = self.recent_events[0].at if self.recent_events else None
        times = [t for t in (last_event, self.last_delivery_at) if t is not None]
        return max(times) if times else None

    def heads(self, status: str) -> int:
        return sum(c.heads for c in self.phase_counts if c.status == status)


def _region_names() -> dict[str, str]:
    """region_id -> display name from the configured region list; empty when it cannot be read."""
    from resources.errors import StormlakeError
    from resources.settings import load_regions, load_settings

    try:
        return {r.region_id: r.name for r in load_regions(load_settings().regions_file)}
    except (StormlakeError, OSError):  # the report must not fail over a label
        return {}


def collect(ledger: Ledger) -> ReportData:
    """Everything the page shows, read from the ledger's views (a dozen aggregate queries)."""
    v = views(ledger)
    total, attention = v.attention(MAX_ATTENTION_ROWS)
    return ReportData(
        now=dt.datetime.now(dt.UTC),
        summary=v.summary(),
        grid=v.grid(),
        phase_counts=v.phase_counts(stale_after=STALE_PENDING),
        attention_total=total,
        attention=attention,
        regions=v.regions(),
        region_names=_region_names(),
        event_counts=v.event_counts(),
        durations=v.durations(),
        receipt_counts=v.receipt_counts(),
        revisions=v.latest_receipts(MAX_REVISION_ROWS),
        recent_events=v.recent_events(MAX_EVENT_ROWS),
        last_delivery_at=v.last_delivery_at(),
    )


# ---- pictures ---------------------------------------------------------------------------------
def _new_figure(width: float, height: float):  # -> (Figure, FigureCanvasAgg)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, FigureCanvasAgg(fig)


def _png(fig, canvas) -> bytes:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    canvas.print_png(buf, metadata={"Software": None})
    return buf.getvalue()


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


def heatmap_png(data: ReportData) -> bytes:
    """Days (x) by regions (y), each cell coloured by tier; FAILED marked X, PENDING circled.

    A long range (a season, a year) shows weeks as columns: a cell is the lowest tier any day of
    that week reached in that region, marked when any of its days has a failed or pending phase.
    """
    import numpy as np
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    days, dx, unit = _columns({c.day for c in data.grid})
    regions = _region_axis({c.region for c in data.grid}, data.region_names)
    ry = {r: i for i, r in enumerate(regions)}
    xs = np.fromiter((dx[c.day] for c in data.grid), dtype=np.int64, count=len(data.grid))
    ys = np.fromiter((ry[c.region] for c in data.grid), dtype=np.int64, count=len(data.grid))
    tiers = np.fromiter((c.tier for c in data.grid), dtype=float, count=len(data.grid))
    grid = np.full((len(regions), len(days)), np.inf)
    np.minimum.at(grid, (ys, xs), tiers)
    grid[np.isinf(grid)] = -1
    failed = np.zeros(grid.shape, dtype=bool)
    pending = np.zeros(grid.shape, dtype=bool)
    fail = np.fromiter((c.failed for c in data.grid), dtype=bool, count=len(data.grid))
    pend = np.fromiter((c.pending for c in data.grid), dtype=bool, count=len(data.grid))
    failed[ys[fail], xs[fail]] = True
    pending[ys[pend], xs[pend]] = True
    pending &= ~failed
    failed_y, failed_x = np.nonzero(failed)
    pending_y, pending_x = np.nonzero(pending)

    nd, nr = len(days), len(regions)
    width = min(18.0, max(7.5, 2.8 + nd * 0.32))
    height = min(14.0, max(2.6, 1.6 + nr * 0.3))
    fig, canvas = _new_figure(width, height)
    ax = fig.add_subplot()
    cmap = ListedColormap([TIER_COLORS[t] for t in range(5)])
    cmap.set_bad((0, 0, 0, 0))  # cells with no partition in the ledger show the hatched background
    norm = BoundaryNorm([-0.5, 0.5, 1.5, 2.5, 3.5, 4.5], cmap.N)
    ax.patch.set_facecolor("white")
    ax.patch.set_hatch("////")
    ax.patch.set_edgecolor("#d0d0d0")
    ax.imshow(np.ma.masked_less(grid, 0), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest",
              origin="upper")

    # marker size: about half a cell, in points squared
    cell_pt = min(width * 0.8 * 72 / max(nd, 1), height * 0.75 * 72 / max(nr, 1))
    size = max(4.0, (0.55 * cell_pt) ** 2)
    if len(failed_x):
        ax.scatter(failed_x, failed_y, marker="X", s=size, c=FAILED_RED, edgecolors="white",
                   linewidths=0.6 if cell_pt > 8 else 0, zorder=3)
    if len(pending_x):
        ax.scatter(pending_x, pending_y, marker="o", s=size * 0.8, facecolors="none",
                   edgecolors=PENDING_ORANGE, linewidths=1.6 if cell_pt > 8 else 0.8, zorder=3)

    if nd <= 120 and nr <= 120:  # thin white lines between cells
        ax.set_xticks(np.arange(-0.5, nd, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, nr, 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=1.0 if max(nd, nr) < 60 else 0.4)
        ax.tick_params(which="minor", length=0)
    xstep = _tick_step(nd, int(width * 4))
    ystep = _tick_step(nr, int(height * 5))
    ax.set_xticks(range(0, nd, xstep), [days[i] for i in range(0, nd, xstep)], rotation=60, ha="right",
                  rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(0, nr, ystep), [regions[i] for i in range(0, nr, ystep)], fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("day" if unit == "day" else "week (from Monday)")
    ax.set_ylabel("region")
    ax.set_title("Where every batch stands: tier reached per (day, region)" if unit == "day" else
                 "Where every batch stands: lowest tier reached in each week, per region", loc="left", fontsize=11)

    handles: list[Any] = [
        Patch(facecolor=TIER_COLORS[t], edgecolor="#999", label=f"{t} {TIER_LABELS[t]}") for t in range(5)
    ]
    handles.append(Patch(facecolor="white", edgecolor="#b0b0b0", hatch="////", label="not in ledger"))
    handles.append(Line2D([], [], marker="X", linestyle="", markersize=9, markerfacecolor=FAILED_RED,
                          markeredgecolor="white", label="a phase FAILED"))
    handles.append(Line2D([], [], marker="o", linestyle="", markersize=8, markerfacecolor="none",
                          markeredgecolor=PENDING_ORANGE, markeredgewidth=1.6, label="a phase PENDING"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False, title="tier",
               title_fontsize=9, alignment="left")
    return _png(fig, canvas)


def phases_png(data: ReportData) -> bytes:
    """Left: per phase, head checkpoints by status (stacked) and retried ones. Right: attempt times."""
    import numpy as np
    total = data.summary.partitions
    by_status = {s: [0] * len(PHASE_NAMES) for s in ("COMPLETED", "PENDING", "FAILED")}
    retried = [0] * len(PHASE_NAMES)
    for c in data.phase_counts:
        if c.phase not in PHASE_NAMES:
            continue
        i = PHASE_NAMES.index(c.phase)
        by_status[c.status][i] += c.heads
        retried[i] += c.retried
    not_run = [total - sum(by_status[s][i] for s in by_status) for i in range(len(PHASE_NAMES))]
    skipped = [data.event_counts.get((ph, "SKIPPED"), 0) for ph in PHASE_NAMES]

    fig, canvas = _new_figure(12.0, 4.8)
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.25, 1])
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
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    # right: time per attempt (claim -> COMPLETED)
    rows = [(ph, data.durations.get(ph)) for ph in PHASE_NAMES]
    y = np.arange(len(PHASE_NAMES))[::-1]
    has_any = any(r and r.n for _, r in rows)
    if has_any:
        p50 = np.array([float(r.p50) if r and r.p50 is not None else 0.0 for _, r in rows])
        p90 = np.array([float(r.p90) if r and r.p90 is not None else 0.0 for _, r in rows])
        mx = np.array([float(r.max) if r and r.max is not None else 0.0 for _, r in rows])
        ax2.barh(y, p90, 0.55, color="#c6dbef", label="90th percentile")
        ax2.barh(y, p50, 0.55, color="#2171b5", label="median")
        ax2.scatter(mx, y, marker="|", s=220, color="#08306b", label="slowest", zorder=3)
        top = float(max(mx.max(), p90.max(), 1e-3))
        for i, (_, r) in enumerate(rows):
            if r and r.n:
                text = f"med {_fmt_secs(p50[i])}, n={r.n}" + (f", {r.failed} failed" if r.failed else "")
            elif r and r.failed:
                text = f"{r.failed} failed, none completed"
            else:
                text = "no finished attempt"
            ax2.annotate(text, (max(mx[i], p90[i]), y[i]), xytext=(6, 0), textcoords="offset points",
                         va="center", fontsize=8, color="#333")
        ax2.set_xlim(0, top * 1.6)
        ax2.set_xlabel("seconds per attempt (claim → COMPLETED)")
        ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    else:
        ax2.text(0.5, 0.5, "no finished attempts yet", ha="center", va="center", transform=ax2.transAxes,
                 color="#666")
        ax2.set_xticks([])
    ax2.set_yticks(y, PHASE_NAMES, fontsize=9)
    ax2.set_title("Where time goes: duration of an attempt per phase", loc="left", fontsize=11)
    for side in ("top", "right"):
        ax2.spines[side].set_visible(False)
    return _png(fig, canvas)


# ---- html -------------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


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


def _tier_badge(tier: int) -> str:
    return (f'<span class="tier" style="background:{TIER_COLORS[tier]};color:{TIER_TEXT[tier]}">'
            f"{tier} {_e(TIER_LABELS[tier])}</span>")


def _status_badge(status: str) -> str:
    cls = {"COMPLETED": "ok", "DELIVERED": "ok", "FAILED": "bad", "PENDING": "warn"}.get(status, "muted")
    return f'<span class="st {cls}">{_e(status)}</span>'


def _count_badge(n: int, cls: str) -> str:
    return f'<span class="st {cls}">{int(n)}</span>' if n else ""


def _img(png: bytes, alt: str) -> str:
    b64 = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{b64}">'


CSS = """
:root { --fg:#1d2327; --muted:#667085; --line:#e4e7ec; --bad:#d7191c; --warn:#e66101; --ok:#1a7f37; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: var(--fg); margin: 0; background: #f6f7f9; }
header { background: #12263a; color: #fff; padding: 18px 28px; }
header h1 { margin: 0; font-size: 22px; }
header p { margin: 4px 0 0; color: #c9d4df; }
main { padding: 18px 28px 40px; max-width: 1500px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px;
          margin: 0 0 18px; }
h2 { font-size: 17px; margin: 0 0 10px; }
p.note { color: var(--muted); margin: 4px 0 10px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 130px; background: #fff; }
.card .v { font-size: 24px; font-weight: 650; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.card.bad { border-color: var(--bad); } .card.bad .v { color: var(--bad); }
.card.warn { border-color: var(--warn); } .card.warn .v { color: var(--warn); }
.card.ok .v { color: var(--ok); }
.verdict { font-size: 16px; margin: 0 0 12px; font-weight: 600; }
.verdict.bad { color: var(--bad); } .verdict.ok { color: var(--ok); } .verdict.warn { color: var(--warn); }
img { max-width: 100%; height: auto; display: block; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #f2f4f7; position: sticky; top: 0; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.msg { max-width: 520px; white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
td.mono, span.mono { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
.tier { display: inline-block; padding: 1px 7px; border-radius: 10px; font-size: 12px; white-space: nowrap; border: 1px solid #bbb; }
.st { font-weight: 600; font-size: 12px; } .st.ok { color: var(--ok); } .st.bad { color: var(--bad); }
.st.warn { color: var(--warn); } .st.muted, .muted { color: var(--muted); }
.scroll { max-height: 560px; overflow: auto; border: 1px solid var(--line); border-radius: 6px; }
.empty { padding: 40px; text-align: center; color: var(--muted); font-size: 16px; }
footer { color: var(--muted); font-size: 12px; padding: 0 28px 24px; }
"""


def _page(title_note: str, body: str, now: dt.datetime) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>stormlake report — {_e(title_note)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        "<header><h1>stormlake — where every batch stands</h1>"
        f"<p>{_e(title_note)} · generated {_e(_fmt_time(now))} from the ledger</p></header>\n"
        f"<main>\n{body}\n</main>\n"
        "<footer>Tiers: 0 not_started · 1 ingested · 2 enriched · 3 correlated · 4 published. A tier is reached"
        " only when that phase and every phase before it are COMPLETED on their upstream's current state."
        "</footer>\n</body>\n</html>\n"
    )


def _card(key: str, value: Any, cls: str = "", sub: str = "") -> str:
    extra = f'<div class="k">{_e(sub)}</div>' if sub else ""
    return f'<div class="card {cls}"><div class="k">{_e(key)}</div><div class="v">{_e(value)}</div>{extra}</div>'


def _headline(data: ReportData) -> str:
    total = data.summary.partitions
    failed = data.heads("FAILED")
    pending = data.heads("PENDING")
    stale = sum(c.stale for c in data.phase_counts)
    pending_receipts = sum(r.pending for r in data.receipt_counts)
    delivered = sum(r.delivered for r in data.receipt_counts)
    published = data.summary.by_tier[LAST_TIER]
    failed_parts = data.summary.with_failure
    if failed_parts:
        verdict = (f"{failed_parts} of {total} partitions have a FAILED phase; "
                   f"{published} published.", "bad")
    elif published == total:
        verdict = (f"All {total} partitions are published (tier {LAST_TIER}).", "ok")
    else:
        verdict = (f"{published} of {total} partitions published; {total - published} still on the way"
                   + (f" ({stale} PENDING phases untouched for over {STALE_PENDING.seconds // 60} min)" if stale else "")
                   + ".", "warn")
    cards = [_card("partitions", total)]
    for t in range(LAST_TIER + 1):
        n = data.summary.by_tier[t]
        cards.append(_card(f"tier {t} · {TIER_LABELS[t]}", n, "ok" if t == LAST_TIER and n else ""))
    cards.append(_card("failed phases", failed, "bad" if failed else ""))
    cards.append(_card("pending phases", pending, "warn" if pending else "", f"{stale} stale" if stale else ""))
    cards.append(_card("pending receipts", pending_receipts, "warn" if pending_receipts else "",
                       f"{delivered} delivered"))
    la = data.last_activity
    cards.append(_card("last activity", _fmt_time(la) if la else "—", "", _ago(la, data.now)))
    return (f'<section id="headline"><h2>Headline</h2><p class="verdict {verdict[1]}">{_e(verdict[0])}</p>'
            f'<div class="cards">{"".join(cards)}</div></section>')


def _attention_row(a: AttentionRow, now: dt.datetime) -> str:
    stalled = ""
    if a.state == "PENDING" and a.updated_at is not None:
        stalled = f" · {_ago(a.updated_at, now)}" + (" (stale?)" if now - a.updated_at > STALE_PENDING else "")
    msg = a.error_message or ""
    if len(msg) > MAX_MESSAGE_CHARS:
        msg = msg[:MAX_MESSAGE_CHARS] + f"… ({len(msg) - MAX_MESSAGE_CHARS} more characters)"
    also = (' <span class=muted>(also failed: ' + _e(", ".join(a.also_failed)) + ")</span>") if a.also_failed else ""
    state = _status_badge(a.state) if a.state in ("FAILED", "PENDING") else _e(a.state)
    return (
        f"<tr><td class=mono>{_e(a.day)}</td><td>{_e(a.region)}</td><td>{_tier_badge(a.tier)}</td>"
        f"<td>{_e(a.phase)}{also}</td><td>{state}{_e(stalled)}</td>"
        f"<td class=mono>{_e(a.error_class or '')}</td><td class=msg>{_e(msg)}</td>"
        f"<td class=num>{_e(a.attempts if a.attempts is not None else '')}</td>"
        f"<td class=mono>{_e(a.run_id or '')}</td></tr>"
    )


def _attention(data: ReportData) -> str:
    if not data.attention_total:
        return ('<section id="attention"><h2>Partitions needing attention</h2>'
                f'<p class="note">None: every partition is at tier {LAST_TIER} with no failed phase.</p></section>')
    shown = len(data.attention)
    more = (f'<p class="note">… and {data.attention_total - shown} more (failed first, then pending, stale, not run;'
            " <span class=mono>stormlake status --failed</span> or <span class=mono>--tier N</span> lists them).</p>"
            if data.attention_total > shown else "")
    return (
        '<section id="attention"><h2>Partitions needing attention</h2>'
        f'<p class="note">{data.attention_total} partitions are not at tier {LAST_TIER} or have a failed phase. '
        'Each row names the phase the partition is held at.</p>'
        '<div class="scroll"><table><thead><tr><th>day</th><th>region</th><th>tier</th><th>held at phase</th>'
        '<th>state</th><th>error class</th><th>message</th><th class=num>attempts</th><th>last run id</th></tr>'
        f'</thead><tbody>{"".join(_attention_row(a, data.now) for a in data.attention)}</tbody></table></div>'
        f"{more}</section>"
    )


def _regions_table(data: ReportData) -> str:
    per = {r.region: r for r in data.regions}
    body = []
    for rid in _region_axis(set(per), data.region_names):
        c = per[rid]
        cells = "".join(f"<td class=num>{c.by_tier[t] or ''}</td>" for t in range(LAST_TIER + 1))
        body.append(
            f"<tr><td class=mono>{_e(rid)}</td><td>{_e(data.region_names.get(rid, ''))}</td>"
            f"<td class=num>{c.partitions}</td>{cells}"
            f"<td class=num>{_count_badge(c.with_failure, 'bad')}</td>"
            f"<td class=num>{c.with_pending or ''}</td></tr>"
        )
    heads = "".join(f"<th class=num>{t} {_e(TIER_LABELS[t])}</th>" for t in range(LAST_TIER + 1))
    return (
        '<section id="regions"><h2>Per region</h2><div class="scroll"><table><thead><tr><th>region</th><th>name</th>'
        f'<th class=num>partitions</th>{heads}<th class=num>with failure</th><th class=num>with pending</th></tr>'
        f'</thead><tbody>{"".join(body)}</tbody></table></div></section>'
    )


def _deliveries(data: ReportData) -> str:
    if not data.receipt_counts:
        return ('<section id="deliveries"><h2>Deliveries</h2>'
                '<p class="note">No receipts yet: nothing has been delivered or prepared for delivery.</p></section>')
    rows = "".join(
        f"<tr><td>{_e(r.target)}</td><td class=mono>{_e(r.kind)}</td>"
        f"<td class=num>{r.delivered}</td>"
        f"<td class=num>{_count_badge(r.pending, 'warn') or 0}</td>"
        f"<td class=num>{r.revisions}</td><td class=num>{r.attempts}</td>"
        f"<td class=num>{r.with_error or ''}</td><td>{_e(_fmt_time(r.last_delivered))}</td></tr>"
        for r in data.receipt_counts
    )
    totals: Counter = Counter()
    for r in data.receipt_counts:
        totals[(r.target, "DELIVERED")] += r.delivered
        totals[(r.target, "PENDING")] += r.pending
    targets = sorted({t for t, _ in totals})
    summary = " · ".join(
        f"{_e(t)}: {totals[(t, 'DELIVERED')]} delivered, {totals[(t, 'PENDING')]} pending" for t in targets
    )
    revs = "".join(
        f"<tr><td class=mono>{_e(r.idempotency_key)}</td><td>{_e(r.target)}</td>"
        f"<td>{_status_badge(r.status)}</td><td class=mono>{_e(r.supersedes or '—')}</td>"
        f"<td class=num>{r.attempts}</td><td class=msg>{_e((r.last_error or '')[:MAX_MESSAGE_CHARS])}</td>"
        f"<td>{_e(_fmt_time(r.delivered_at or r.created_at))}</td></tr>"
        for r in data.revisions
    )
    return (
        f'<section id="deliveries"><h2>Deliveries</h2><p class="note">{summary}</p>'
        '<table><thead><tr><th>target</th><th>kind</th><th class=num>delivered</th><th class=num>pending</th>'
        '<th class=num>revisions (supersede another)</th><th class=num>delivery attempts</th>'
        '<th class=num>with last error</th><th>last delivered</th></tr></thead>'
        f'<tbody>{rows}</tbody></table>'
        f'<h2 style="margin-top:16px">Latest revisions</h2><p class="note">The {len(data.revisions)} most recent receipts;'
        ' <em>supersedes</em> names the delivered revision each one replaces.</p>'
        '<div class="scroll"><table><thead><tr><th>artifact</th><th>target</th><th>status</th><th>supersedes</th>'
        '<th class=num>attempts</th><th>last error</th><th>delivered / prepared</th></tr></thead>'
        f'<tbody>{revs}</tbody></table></div></section>'
    )


def _recent(data: ReportData) -> str:
    rows = "".join(
        f"<tr><td class=num>{r.event_id}</td><td>{_e(_fmt_time(r.at))}</td>"
        f"<td class=mono>{_e(r.partition_key)}</td><td>{_e(r.phase)}</td><td>{_status_badge(r.status)}</td>"
        f"<td class=mono>{_e(r.run_id or '')}</td></tr>"
        for r in data.recent_events
    )
    return (
        '<section id="activity"><h2>Recent activity</h2>'
        f'<p class="note">The last {len(data.recent_events)} checkpoint events, newest first.</p>'
        '<table><thead><tr><th class=num>event</th><th>at</th><th>partition</th><th>phase</th><th>status</th>'
        f'<th>run id</th></tr></thead><tbody>{rows}</tbody></table></section>'
    )


def render_report_with_images(ledger: Ledger) -> tuple[str, dict[str, bytes]]:
    """The page and its pictures (name -> PNG bytes), for callers that also want the files."""
    data = collect(ledger)
    if not data.summary.partitions:
        body = (
            '<section><div class="empty"><strong>Nothing has run yet.</strong><br>The ledger holds no checkpoint:'
            " run <span class=mono>stormlake demo</span> or <span class=mono>stormlake backfill</span>,"
            " then <span class=mono>stormlake report</span> again.</div></section>"
        )
        if data.receipt_counts:
            body += _deliveries(data)
        return _page("nothing has run yet", body, data.now), {}
    images = {"heatmap.png": heatmap_png(data), "phases.png": phases_png(data)}
    days = sorted({c.day for c in data.grid})
    note = (f"{data.summary.partitions} partitions, {len(data.regions)} regions, days {days[0]} … {days[-1]}")
    body = "\n".join([
        _headline(data),
        '<section id="heatmap"><h2>Tier by day and region</h2><p class="note">Each cell is one partition, coloured'
        " by the tier it reached; a red X marks a partition with a FAILED phase, an orange ring one with a phase"
        " PENDING (running, or stalled if it stays).</p>" + _img(images["heatmap.png"], "tier heat map") + "</section>",
        '<section id="phases"><h2>Where batches stall and where time goes</h2><p class="note">Left: the head'
        " checkpoint of each phase over all partitions (grey: no checkpoint yet), with the heads that needed more"
        " than one attempt. Right: time from claim to COMPLETED per attempt.</p>"
        + _img(images["phases.png"], "phase status and durations") + "</section>",
        _attention(data),
        _regions_table(data),
        _deliveries(data),
        _recent(data),
    ])
    return _page(note, body, data.now), images


def write_report(ledger: Ledger, out: Path, *, images_dir: Path | None = None) -> None:
    """Write the report page to ``out`` atomically (temporary file in the same folder, then rename).

    With ``images_dir`` the pictures are also written there as PNG files (the page never needs them).
    """
    out = Path(out)
    page, images = render_report_with_images(ledger)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise
    if images_dir is not None:
        images_dir = Path(images_dir)
        images_dir.mkdir(parents=True, exist_ok=True)
        for name, png in images.items():
            (images_dir / name).write_bytes(png)


def _suppress():  # type: ignore[no-untyped-def]
    import contextlib

    return contextlib.suppress(OSError)
