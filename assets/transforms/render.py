"""Deterministic matplotlib drawings for the present phase's report, and the figure and PNG helpers
of every picture in the project (:func:`new_figure`, :func:`figure_png`).

The drawings return PNG bytes that depend only on their arguments: the figures are drawn with
the object-oriented API on an Agg canvas (no pyplot, so no global figure registry), inside a
style context that resets matplotlib's defaults (a user's ``matplotlibrc`` must not change the
published bytes), at a fixed size and dpi, and encoded by :func:`encode_png` (no text chunks, so
no matplotlib version or time stamp in the bytes).

Rendering is a fixed cost of every partition, so the drawings avoid matplotlib's expensive
steps: the axes sit at fixed heights and only the side margins of the value axes are fitted to
their tick labels (``tight_layout`` measures every artist of the figure before it is drawn), the
colorbar axes is placed next to the map's aspect-adjusted box by arithmetic, the hexagons and the
hourly bars are one :class:`PolyCollection` each, and the PNG is written without the adaptive
row filters PIL applies (on flat-coloured charts they cost more than the compression itself and
give larger files than unfiltered rows).
"""

from __future__ import annotations

import gc
import math
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import h3
import matplotlib as mpl
import matplotlib.style as mpl_style
import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import YAxis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from resources.settings import Region

if TYPE_CHECKING:
    import pandas as pd

#: Pixel density of every picture; with the figure sizes below this yields ~900 px wide images.
DPI = 110
MAP_SIZE_IN = (8.0, 7.0)
HOURLY_SIZE_IN = (8.0, 3.6)
RISK_CMAP = "YlOrRd"
OUTLINE = "#1f3b73"
BAR_COLOR = "#d9534f"
#: zlib level of the PNG data. On these charts (unfiltered rows) level 3 costs about what level 1
#: does and half of level 6, and its files are ~7 % larger than level 6's (still ~15 % smaller
#: than PIL's default encoding at level 6 with adaptive filters).
PNG_ZLIB_LEVEL = 3

# Fixed layout, in figure fractions: the bottom and top of the axes (room for the title above,
# the x tick labels and axis label, and for the hourly chart its legend, below) and the right
# edge of the map's box (room for the colorbar). The map's left margin is fitted to its tick
# labels by :func:`_y_axis_px`; the hourly chart's side margins are a fixed room for its value
# axes' labels (:data:`HOURLY_LABEL_DIGITS`).
_MAP_BOTTOM, _MAP_TOP, _MAP_RIGHT = 0.075, 0.93, 0.86
_MAP_CBAR_PAD, _MAP_CBAR_WIDTH, _MAP_CBAR_SHRINK, _MAP_CBAR_MIN = 0.02, 0.032, 0.8, 0.4
_HOURLY_BOTTOM, _HOURLY_TOP = 0.27, 0.91
#: Blank pixels between an axis label and the figure's edge (about ``tight_layout``'s padding).
_EDGE_PX = 12.0

# Settings applied on top of matplotlib's defaults while drawing.
_RC: dict[str, object] = {
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.titlesize": 11.0,
    "axes.labelsize": 9.0,
    "path.simplify": True,
}


@contextmanager
def _style() -> Iterator[None]:
    """Draw with matplotlib's built-in defaults plus :data:`_RC`, restoring rcParams after.

    The cyclic garbage collector is paused while a figure is built and drawn (and resumed only
    if it was running). A figure is a few thousand objects in reference cycles that live until
    the picture is encoded: collections during the drawing would find them all alive and promote
    them to the old generations, whose full collections then scan the whole process heap (a
    pipeline process holds Dagster, pandas and pyarrow); measured, they cost more than a tenth of
    the drawing time. Paused, the dead figure is freed by the next young collection instead: the
    drawing functions build their figure in an inner frame that has returned (dropping it) before
    the collector resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with mpl_style.context("default"), mpl.rc_context(rc=_RC):
            yield
    finally:
        if was_enabled:
            gc.enable()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(rgba: np.ndarray, *, dpi: float = DPI, level: int = PNG_ZLIB_LEVEL) -> bytes:
    """PNG bytes of an ``(height, width, 4)`` uint8 RGBA image; RGB when it is fully opaque.

    Rows are stored unfiltered (filter type 0) and deflated at ``level``: charts are large areas
    of flat colour, where PNG's prediction filters add work without making the data smaller. The
    file has IHDR, pHYs (the dpi), IDAT and IEND only, so the bytes depend on the pixels, ``dpi``,
    ``level`` and the zlib library alone.

    Raises:
        ValueError: ``rgba`` is not an ``(h, w, 4)`` uint8 array with ``h, w >= 1``.
    """
    if rgba.dtype != np.uint8 or rgba.ndim != 3 or rgba.shape[2] != 4 or 0 in rgba.shape:
        raise ValueError(f"encode_png: expected an (h, w, 4) uint8 image, got {rgba.dtype} {rgba.shape}")
    height, width = rgba.shape[:2]
    opaque = bool((rgba[:, :, 3] == 255).all())
    pixels = rgba[:, :, :3] if opaque else rgba
    rows = np.zeros((height, 1 + width * pixels.shape[2]), dtype=np.uint8)  # column 0: filter type 0
    rows[:, 1:] = pixels.reshape(height, -1)
    ppm = round(dpi / 0.0254)
    header = struct.pack(">IIBBBBB", width, height, 8, 2 if opaque else 6, 0, 0, 0)
    return b"".join((
        b"\x89PNG\r\n\x1a\n",
        _chunk(b"IHDR", header),
        _chunk(b"pHYs", struct.pack(">IIB", ppm, ppm, 1)),
        _chunk(b"IDAT", zlib.compress(rows.tobytes(), level)),
        _chunk(b"IEND", b""),
    ))


def new_figure(
    size: tuple[float, float], *, dpi: float = DPI, layout: str | None = None
) -> tuple[Figure, FigureCanvasAgg]:
    """A figure of ``size`` inches on its own Agg canvas: no pyplot, so nothing global keeps it alive
    and it is safe in any thread. ``layout`` is matplotlib's (``"constrained"``, or None for none)."""
    fig = Figure(figsize=size, dpi=dpi, layout=layout)
    return fig, FigureCanvasAgg(fig)


def figure_png(canvas: FigureCanvasAgg) -> bytes:
    """Draw the canvas's figure and encode it with :func:`encode_png`."""
    canvas.draw()
    return encode_png(np.asarray(canvas.buffer_rgba()), dpi=canvas.figure.dpi)


def draw_over(canvas: FigureCanvasAgg, background: object, layers: Sequence[tuple[object, Sequence]]) -> bytes:
    """PNG bytes of a template's pixels (``background``, from ``canvas.copy_from_bbox``) with
    ``layers`` drawn over them: (axes or figure, its artists), each artist drawn on its own, in
    order. Nothing else of the figure is drawn again."""
    canvas.restore_region(background)
    for owner, artists in layers:
        for artist in artists:
            owner.draw_artist(artist)
    return encode_png(np.asarray(canvas.buffer_rgba()), dpi=canvas.figure.dpi)


def _note(ax: Axes, text: str, *, fontsize: float) -> Text:
    """A grey line of text in the middle of ``ax``, where a picture has nothing to draw."""
    return ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555555", fontsize=fontsize)


def _y_axis_px(axis: YAxis, canvas: FigureCanvasAgg) -> float:
    """Pixels a y axis needs beside its axes: ticks, the widest tick label, the label, an edge gap.

    Measures only this axis's texts (a few; the drawing reuses their cached layout), where
    ``tight_layout`` measures every artist of the figure. Call it after the axis's limits and label
    are set.
    """
    renderer = canvas.get_renderer()
    ticks = max(
        (t.get_window_extent(renderer).width for t in axis.get_ticklabels() if t.get_text()), default=0.0
    )
    label = axis.label.get_window_extent(renderer).width if axis.label.get_text() else 0.0
    pts = mpl.rcParams["ytick.major.size"] + mpl.rcParams["ytick.major.pad"] + axis.labelpad
    return ticks + label + pts * canvas.figure.dpi / 72.0 + _EDGE_PX


#: Cell outlines kept per process: a region's days draw mostly the same cells (a year of 50
#: regions of a few thousand cells each fits; past this many the kept ones are dropped).
CELL_OUTLINES_KEPT = 200_000
_cell_outlines: dict[str, np.ndarray] = {}


def _cell_outline(cell: str) -> np.ndarray:
    """The vertices of one H3 cell in (lon, lat) order, an (n, 2) array; kept for the next day."""
    outline = _cell_outlines.get(cell)
    if outline is None:
        if len(_cell_outlines) >= CELL_OUTLINES_KEPT:
            _cell_outlines.clear()
        # h3 gives (lat, lng); plots want x=lon, y=lat
        outline = _cell_outlines[cell] = np.asarray(h3.cell_to_boundary(cell), dtype=float)[:, ::-1]
    return outline


def _cell_polygons(cell_ids: Sequence[str]) -> np.ndarray | list[np.ndarray]:
    """Vertices of each H3 cell in (lon, lat) order: one (cells, 6, 2) array when all are hexagons.

    The single array lets :class:`PolyCollection` build its paths from one template; a pentagon
    or a cell with distortion vertices falls back to a list of (n, 2) arrays (same drawing). A
    cell's outline is computed once per process (:func:`_cell_outline`), so a region's later days
    only look theirs up: about 12 ms a map of 500 outages before.
    """
    outlines = [_cell_outline(cell) for cell in cell_ids]
    if outlines and all(len(o) == 6 for o in outlines):
        return np.stack(outlines)
    return outlines


def _outline_rings(cell_ids: Sequence[str]) -> list[np.ndarray]:
    """All rings (outer and holes) of the union of ``cell_ids`` as (n, 2) lon/lat arrays."""
    if not cell_ids:
        return []
    geo = h3.cells_to_geo(sorted(cell_ids))
    polygons = [geo["coordinates"]] if geo["type"] == "Polygon" else list(geo["coordinates"])
    return [np.asarray(ring, dtype=float) for poly in polygons for ring in poly]


def render_map_png(*, region: Region, day: str, cell_risk: pd.DataFrame, clusters: pd.DataFrame) -> bytes:
    """Map of the region's cells coloured by risk, with the storm clusters outlined and labelled.

    Args:
        region: The partition's region; its box sets the extent and is drawn dashed.
        day: The partition day, shown in the title.
        cell_risk: Rows of ``CELL_RISK`` (``cell_id``, ``risk``, ...).
        clusters: Rows of ``STORM_CLUSTERS`` (``cluster_id``, ``cell_ids``, ``center_lat``, ...).

    Returns:
        PNG bytes.
    """
    with _style():
        return _draw_map(region, day, cell_risk, clusters)


#: How far beyond the region's box the map shows, in degrees of latitude (about 2.2 km; a
#: resolution-7 H3 cell reaches at most about 1.4 km from its centre, so a cell of the region
#: that straddles the box's edge is drawn whole). Longitude: the same ground distance.
MAP_MARGIN_DEG = 0.02
#: Map templates kept per process (one per region; a year of 50 regions keeps all of them).
MAP_TEMPLATES = 64


class _MapTemplate:
    """What every map of one region shares, drawn once: the axes with their limits, aspect, grid,
    ticks, tick and axis labels, and the colorbar, as pixels (``background``).

    A map is these pixels with the day's artists drawn over them (:func:`_draw_map`): the cells,
    the region's box and the axes' spines over the cells, the clusters, the legend and the title.
    The pixels of a map depend only on its region and its data, never on what was drawn before:
    every map starts from the same background and draws its own artists in a fixed order.
    """

    def __init__(self, region: Region) -> None:
        self.fig, self.canvas = new_figure(MAP_SIZE_IN)
        self.ax = self.fig.add_axes((0.1, _MAP_BOTTOM, _MAP_RIGHT - 0.1, _MAP_TOP - _MAP_BOTTOM))  # left: fitted
        self.norm = Normalize(vmin=0.0, vmax=1.0)  # fixed scale so that days compare at a glance
        self.cmap = mpl.colormaps[RISK_CMAP]
        _frame_map(self.ax, region, map_extent(region))
        _fit_map(self.ax, self.canvas)
        _risk_colorbar(self.fig, self.ax, self.norm, self.cmap)
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(self.fig.bbox)


_map_templates: dict[Region, _MapTemplate] = {}


def map_extent(region: Region) -> tuple[float, float, float, float]:
    """(xmin, xmax, ymin, ymax) of every map of ``region``: its box and :data:`MAP_MARGIN_DEG` around."""
    mid_lat = (region.min_lat + region.max_lat) / 2.0
    dx = MAP_MARGIN_DEG / max(math.cos(math.radians(mid_lat)), 0.01)
    return region.min_lon - dx, region.max_lon + dx, region.min_lat - MAP_MARGIN_DEG, region.max_lat + MAP_MARGIN_DEG


def _kept(cache: dict, key: object, make: Callable[[], object], limit: int):  # noqa: ANN202 - a template
    """``cache[key]``, made by ``make()`` when missing; the ``limit`` most recently used are kept."""
    template = cache.pop(key, None) or make()
    cache[key] = template  # most recently used last
    while len(cache) > limit:
        cache.pop(next(iter(cache)))
    return template


def _map_template(region: Region) -> _MapTemplate:
    return _kept(_map_templates, region, lambda: _MapTemplate(region), MAP_TEMPLATES)


def prepare_templates(regions: Sequence[Region]) -> None:
    """Draw the hourly chart's template and the map templates of ``regions`` (at most
    :data:`MAP_TEMPLATES`) now, in a process about to fork the processes that draw: each fork
    starts with them, shared copy-on-write, instead of drawing its own (about a quarter of a
    second each; a run forked for one partition would pay it for each of its two pictures).
    A map template is about 5 MB of pixels.
    """
    with _style():
        _hourly_template()
        for region in list(regions)[:MAP_TEMPLATES]:
            _map_template(region)


def _draw_map(region: Region, day: str, cell_risk: pd.DataFrame, clusters: pd.DataFrame) -> bytes:
    """The body of :func:`render_map_png`: the region's template, then the day's artists over it.

    Each artist is added, drawn on its own (``draw_artist``) and removed again, so the template
    stays as it was built.
    """
    t = _map_template(region)
    ax = t.ax
    coll = _risk_cells(cell_risk, t.norm, t.cmap)
    below: list = []  # drawn under the axes' spines
    above: list = []  # drawn over them
    try:
        below.append(ax.add_collection(coll, autolim=False) if coll is not None
                     else _note(ax, "No cell data for this day", fontsize=12))
        below.append(_region_box(ax, region))
        outlines, labels = _cluster_outlines(ax, clusters)
        above += outlines + labels
        above.append(_map_legend(ax, len(clusters)))
        # An explicit y skips the per-draw search for top tick labels to dodge (there are none).
        ax.set_title(f"{region.name} — outage risk by H3 cell, {day} (UTC)", y=1.0)
        return draw_over(t.canvas, t.background, [(ax, [*below, *ax.spines.values(), *above, ax.title])])
    finally:
        for artist in [*below, *above]:
            artist.remove()
        ax.set_title("")


def _risk_cells(cell_risk: pd.DataFrame, norm: Normalize, cmap: Colormap) -> PolyCollection | None:
    """The cells as hexagons coloured by risk, one collection (None when there are none)."""
    if not len(cell_risk):
        return None
    cells = cell_risk.sort_values("cell_id", kind="mergesort")
    verts = _cell_polygons(cells["cell_id"].tolist())
    risk = cells["risk"].astype(float).fillna(0.0).to_numpy()
    return PolyCollection(verts, array=risk, cmap=cmap, norm=norm, edgecolors="#ffffff", linewidths=0.15)


def _region_box(ax: Axes, region: Region) -> Rectangle:
    """The region's box, dashed."""
    return ax.add_patch(
        Rectangle(
            (region.min_lon, region.min_lat),
            region.max_lon - region.min_lon,
            region.max_lat - region.min_lat,
            fill=False,
            linestyle="--",
            linewidth=0.9,
            edgecolor="#444444",
        )
    )


def _cluster_outlines(ax: Axes, clusters: pd.DataFrame) -> tuple[list, list]:
    """Each storm cluster outlined and labelled ``C<id>`` just above its outline, not on its centre,
    so that small clusters stay visible. Returns the outlines' collections and the labels."""
    ordered = clusters.sort_values("cluster_id", kind="mergesort") if len(clusters) else clusters
    rings: list[np.ndarray] = []
    labels: list[tuple[str, float, float]] = []
    for row in ordered.itertuples(index=False):
        own = _outline_rings(list(row.cell_ids if row.cell_ids is not None else []))
        rings.extend(own)
        top = max(float(r[:, 1].max()) for r in own) if own else float(row.center_lat)
        labels.append((f"C{int(row.cluster_id)}", float(row.center_lon), top))
    outlines = []
    if rings:
        # A white halo under the outline keeps it readable over the darkest cells.
        outlines.append(ax.add_collection(LineCollection(rings, colors="white", linewidths=3.2, zorder=3), autolim=False))
        outlines.append(ax.add_collection(LineCollection(rings, colors=OUTLINE, linewidths=1.6, zorder=3), autolim=False))
    texts = [
        ax.annotate(
            text,
            (lon, lat),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
            fontweight="bold",
            color=OUTLINE,
            zorder=4,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": OUTLINE, "lw": 0.8, "alpha": 0.9},
        )
        for text, lon, lat in labels
    ]
    return outlines, texts


def _frame_map(ax: Axes, region: Region, extent: tuple[float, float, float, float]) -> None:
    """Limits a little wider than ``extent``, equal ground distances on both axes at the region's
    latitude, the axis labels and a light grid."""
    xmin, xmax, ymin, ymax = extent
    pad_x, pad_y = (xmax - xmin) * 0.02, (ymax - ymin) * 0.02
    ax.set_xlim(xmin - pad_x, xmax + pad_x)
    ax.set_ylim(ymin - pad_y, ymax + pad_y)
    mid_lat = (region.min_lat + region.max_lat) / 2.0
    ax.set_aspect(1.0 / max(math.cos(math.radians(mid_lat)), 0.01))
    ax.set_xlabel("Longitude (°)")
    ax.set_ylabel("Latitude (°)")
    ax.grid(True, linewidth=0.3, color="#bbbbbb", zorder=0)
    ax.set_axisbelow(True)


def _fit_map(ax: Axes, canvas: FigureCanvasAgg) -> None:
    """Leave the y axis the room its tick labels need. The aspect shrinks the axes inside its box,
    so the ticks are measured for the height the map is drawn at."""
    ax.apply_aspect()
    left = _y_axis_px(ax.yaxis, canvas) / (MAP_SIZE_IN[0] * DPI)
    ax.set_position((left, _MAP_BOTTOM, _MAP_RIGHT - left, _MAP_TOP - _MAP_BOTTOM))
    ax.apply_aspect()


def _risk_colorbar(fig: Figure, ax: Axes, norm: Normalize, cmap: Colormap) -> None:
    """The risk scale next to the map as drawn: shorter than the map, but readable next to the flat
    map of a wide region."""
    box = ax.get_position()
    height = min(max(box.height * _MAP_CBAR_SHRINK, _MAP_CBAR_MIN), _MAP_TOP - _MAP_BOTTOM)
    cax = fig.add_axes(
        (box.x1 + _MAP_CBAR_PAD, box.y0 + (box.height - height) / 2, _MAP_CBAR_WIDTH, height)
    )
    cbar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    cbar.set_label("Risk (0 = none, 1 = highest)")


def _map_legend(ax: Axes, n_clusters: int) -> Legend:
    """What the outlines and the dashed frame are."""
    handles = [
        Line2D([], [], color=OUTLINE, linewidth=1.6, label=f"Storm cluster ({n_clusters})"),
        Line2D([], [], color="#444444", linewidth=0.9, linestyle="--", label="Region box"),
    ]
    return ax.legend(handles=handles, loc="upper left", fontsize=8, framealpha=0.9)


def render_hourly_png(*, region: Region, day: str, enriched: pd.DataFrame, cell_hour: pd.DataFrame) -> bytes:
    """Outages reported per UTC hour (bars) with the strongest gust of each hour (line, twin axis).

    Args:
        region: The partition's region (title).
        day: The partition day (title).
        enriched: Rows of ``OUTAGES_ENRICHED``; ``hour`` is counted.
        cell_hour: Rows of ``CELL_HOUR_STATS``; the hourly maximum of ``gust_ms`` is drawn.
            When it has no gusts the enriched rows' ``gust_ms`` are used instead.

    Returns:
        PNG bytes.
    """
    hours = np.arange(24)
    counts = (
        enriched["hour"].astype(int).value_counts().reindex(hours, fill_value=0).to_numpy()
        if len(enriched)
        else np.zeros(24, dtype=int)
    )
    gust_src = cell_hour if len(cell_hour) and cell_hour["gust_ms"].notna().any() else enriched
    if len(gust_src):
        gust = (
            gust_src.groupby(gust_src["hour"].astype(int))["gust_ms"]
            .max()
            .reindex(hours)
            .to_numpy(dtype=float)
        )
    else:
        gust = np.full(24, np.nan)

    with _style():
        return _draw_hourly(region, day, counts, gust)


#: The tops of the hourly chart's two value axes are one of these times a power of ten, the
#: smallest at or above 1.15 × the day's highest value.
_NICE_TOPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
#: Room beside the hourly chart's value axes for tick labels of this many digits: counts (a
#: million or more is written in millions, "1.5M"), then gusts in m/s.
HOURLY_LABEL_DIGITS = (6, 4)


def nice_top(value: float) -> float:
    """The top of a value axis showing values up to ``value``: 15 % of headroom, then the next of
    :data:`_NICE_TOPS` times a power of ten (1.0 when there is nothing to show).

    Example:
        >>> [nice_top(v) for v in (0, 1, 7, 13, 87, 1000, 23.4)]
        [1.0, 1.2, 10.0, 15.0, 120.0, 1200.0, 30.0]
    """
    target = value * 1.15
    if not math.isfinite(target) or target <= 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(target))
    for step in _NICE_TOPS:
        top = round(step * scale, 12)
        if top >= target - 1e-12:
            return top
    return round(10.0 * scale, 12)  # pragma: no cover - 10.0 is always enough


def tick_label(value: float) -> str:
    """A value axis's tick label: ``12``, ``2.5``, ``150000``, ``1.5M``.

    Example:
        >>> [tick_label(v) for v in (0.0, 2.5, 150000.0, 1500000.0)]
        ['0', '2.5', '150000', '1.5M']
    """
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def value_ticks(top: float) -> list[float]:
    """Where a value axis from 0 to ``top`` has its ticks: matplotlib's choice of about five steps."""
    from matplotlib.ticker import MaxNLocator

    ticks = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(0.0, top)
    return [round(float(v), 12) for v in ticks if -1e-9 <= v <= top * (1 + 1e-9)]


def shifted(fig: Figure, base, dx_px: float, dy_px: float):  # noqa: ANN001, ANN202 - matplotlib transforms
    """``base`` moved by a fixed number of pixels of ``fig``."""
    from matplotlib.transforms import ScaledTranslation

    return base + ScaledTranslation(dx_px / fig.dpi, dy_px / fig.dpi, fig.dpi_scale_trans)


class _HourlyTemplate:
    """What every hourly chart shares, drawn once per process: the hour axis with its ticks and
    label, the labels of both value axes, and the legend, as pixels.

    A chart draws over these pixels what depends on its data: its two value axes (ticks, tick
    labels and grid lines up to its own tops, see :func:`nice_top`), its bars, the axes' spines,
    its gust line, its note and its title. The value axes are a row of tick marks and plain texts
    beside each side, in a fixed room (:data:`HOURLY_LABEL_DIGITS`), so one template serves every
    scale.
    """

    def __init__(self) -> None:
        from matplotlib.transforms import blended_transform_factory

        hours = np.arange(24)
        self.fig, self.canvas = new_figure(HOURLY_SIZE_IN)
        fig = self.fig
        ax = self.ax = fig.add_axes((0.1, _HOURLY_BOTTOM, 0.8, _HOURLY_TOP - _HOURLY_BOTTOM))  # sides: below
        ax.set_xlim(-0.6, 23.6)
        ax.set_xticks(hours[::2])
        ax.set_xlabel("Hour of day (UTC)")
        ax.set_yticks([])
        ax2 = self.ax2 = ax.twinx()
        ax2.set_yticks([])
        handles = [Rectangle((0, 0), 1, 1, color=BAR_COLOR, label="Outages reported"),
                   Line2D([], [], color=OUTLINE, marker="o", markersize=3, linewidth=1.4, label="Max gust")]
        # Below the plot: inside it would hide bars or the gust line.
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8,
                  frameon=False)
        renderer = self.canvas.get_renderer()
        self.tick_size = mpl.rcParams["ytick.major.size"]
        self.tick_width = mpl.rcParams["ytick.major.width"]
        self.label_size = mpl.rcParams["ytick.labelsize"]
        self.gap = (self.tick_size + mpl.rcParams["ytick.major.pad"]) * fig.dpi / 72.0
        rooms = []
        for digits in HOURLY_LABEL_DIGITS:
            probe = fig.text(0, 0, "8" * digits, fontsize=self.label_size)
            rooms.append(self.gap + probe.get_window_extent(renderer).width
                         + mpl.rcParams["axes.labelpad"] * fig.dpi / 72.0)
            probe.remove()
        self.left_side = blended_transform_factory(ax.transAxes, ax.transData)
        self.right_side = blended_transform_factory(ax2.transAxes, ax2.transData)
        ylabels = [ax.text(0, 0.5, "Outages", rotation=90, ha="right", va="center",
                           transform=shifted(fig, ax.transAxes, -rooms[0], 0)),
                   ax.text(1, 0.5, "Max wind gust (m/s)", rotation=90, ha="left", va="center",
                           transform=shifted(fig, ax.transAxes, rooms[1], 0))]
        width = HOURLY_SIZE_IN[0] * DPI
        left = (rooms[0] + ylabels[0].get_window_extent(renderer).width + _EDGE_PX) / width
        right = 1.0 - (rooms[1] + ylabels[1].get_window_extent(renderer).width + _EDGE_PX) / width
        ax.set_position((left, _HOURLY_BOTTOM, right - left, _HOURLY_TOP - _HOURLY_BOTTOM))  # ax2 follows
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(fig.bbox)

    def value_axis(self, top: float, *, right: bool) -> list:
        """The artists of one value axis up to ``top``: its tick marks and labels, and on the left
        (the counts) the grid lines across the plot. Added to the axes; the caller draws and removes them."""
        from matplotlib.markers import TICKLEFT, TICKRIGHT

        ax = self.ax2 if right else self.ax
        ax.set_ylim(0, top)
        ticks = value_ticks(top)
        side = self.right_side if right else self.left_side
        artists: list = []
        if not right:
            artists.append(ax.add_collection(LineCollection([((-0.6, v), (23.6, v)) for v in ticks], linewidths=0.3,
                                                            colors="#bbbbbb", zorder=0), autolim=False))
        artists.append(ax.add_line(Line2D([1.0 if right else 0.0] * len(ticks), ticks, transform=side,
                                          marker=TICKRIGHT if right else TICKLEFT, markersize=self.tick_size,
                                          markeredgewidth=self.tick_width, color="black", linestyle="",
                                          clip_on=False)))
        shift = shifted(self.fig, side, self.gap if right else -self.gap, 0)
        artists += [ax.text(1.0 if right else 0.0, v, tick_label(v), transform=shift, ha="left" if right else "right",
                            va="center_baseline", fontsize=self.label_size, clip_on=False) for v in ticks]
        return artists


_hourly_templates: dict[str, _HourlyTemplate] = {}


def _hourly_template() -> _HourlyTemplate:
    return _kept(_hourly_templates, "hourly", _HourlyTemplate, 1)


def _draw_hourly(region: Region, day: str, counts: np.ndarray, gust: np.ndarray) -> bytes:
    """The body of :func:`render_hourly_png` (24 counts, 24 gusts): the template, then the day's
    artists over it, each added, drawn and removed again (see :func:`_draw_map`)."""
    hours = np.arange(24)
    finite = gust[np.isfinite(gust)]
    t = _hourly_template()
    ax, ax2 = t.ax, t.ax2
    # One collection for the 24 bars (``Axes.bar`` makes, adds and draws a patch per bar).
    bars = np.zeros((24, 4, 2))
    bars[:, :, 0] = hours[:, None] + np.array([-0.4, 0.4, 0.4, -0.4])
    bars[:, 2:, 1] = counts[:, None]
    added: list = []  # every artist this chart adds, removed again at the end
    try:
        counts_axis = t.value_axis(nice_top(max(1, int(counts.max()))), right=False)  # grid, ticks, labels
        added += counts_axis
        gusts_axis = t.value_axis(nice_top(float(finite.max()) if finite.size else 0.0), right=True)
        added += gusts_axis
        bar_artists = [ax.add_collection(
            PolyCollection(bars, facecolors=BAR_COLOR, edgecolors="none", linewidths=0.0, zorder=2), autolim=False)]
        if not counts.any():
            bar_artists.append(_note(ax, "No outages reported", fontsize=11))
        added += bar_artists
        line = ax2.plot(hours, gust, color=OUTLINE, marker="o", markersize=3, linewidth=1.4, label="Max gust",
                        scalex=False, scaley=False)
        added += line
        ax.set_title(f"{region.name} — outages per hour and max gust, {day}", y=1.0)  # y: see _draw_map
        # In a full drawing's order: the bar axes (grid, bars, then its spines over them, note,
        # ticks, title), then the gust axes (line, spines, ticks).
        return draw_over(t.canvas, t.background, [
            (ax, [counts_axis[0], bar_artists[0], *ax.spines.values(), *bar_artists[1:], *counts_axis[1:], ax.title]),
            (ax2, [*line, *ax2.spines.values(), *gusts_axis]),
        ])
    finally:
        for artist in added:
            artist.remove()
        ax.set_title("")
