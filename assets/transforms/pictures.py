"""The present phase's pictures as SVG: the map of risk by cell and the hourly chart.

Both pictures are vector drawings written as text by this module alone: no plotting library, no
font metrics, no rasteriser. That makes them

- cheap: a map is written as text, where drawing and PNG-encoding it with matplotlib (and a
  template per region) was most of a small partition's fixed cost;
- byte-deterministic by construction: the bytes depend on the data, the region and the ``h3``
  library's cell outlines, never on a plotting library's version, its fonts or the machine;
- sharp at any zoom, with text a reader can select and search, and hover titles that name each
  storm cluster and each hour with their figures.

The page embeds them inline (``report.html`` stays one self-contained file).

Coordinates: every picture has a ``viewBox`` of :data:`MAP_SIZE` (a wide region's map less high) or
:data:`HOURLY_SIZE` units (the pixel size at which they read best) and scales with the page. The map's cells and cluster
outlines are written in integer tenths of a unit inside a ``scale(0.1)`` group, with relative
moves between a shape's vertices, which keeps a map of thousands of cells compact. Cells of the
same colour (risk on a 256-step scale, as the colour bar shows it) share one ``<path>``.

Text cannot be measured without fonts, so the layout leaves fixed room for the labels it knows
(tick labels of up to :data:`HOURLY_LABEL_DIGITS` digits, the axis labels), and a title longer
than its line is fitted with ``textLength``.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import h3
import numpy as np

from resources.settings import Region

if TYPE_CHECKING:
    import pandas as pd

#: (width, height) of each picture's viewBox; a map is at most this high (a wide region's is lower).
MAP_SIZE = (880, 770)
HOURLY_SIZE = (880, 400)
OUTLINE = "#1f3b73"
BAR_COLOR = "#d9534f"
GRID = "#c8c8c8"
#: The risk colours (ColorBrewer's YlOrRd, 9 classes), from risk 0 to risk 1, interpolated linearly.
RISK_COLORS = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#bd0026", "#800026")
#: Risk is shown in this many colour steps (the cells of one step share a path).
RISK_STEPS = 256
FONT = "DejaVu Sans,Verdana,Arial,sans-serif"
#: How far beyond the region's box the map shows, in degrees of latitude (about 2.2 km; a
#: resolution-7 H3 cell reaches at most about 1.4 km from its centre, so a cell of the region
#: that straddles the box's edge is drawn whole). Longitude: the same ground distance.
MAP_MARGIN_DEG = 0.02
#: Room beside the hourly chart's value axes for tick labels of this many digits: counts (a
#: million or more is written in millions, "1.5M"), then gusts in m/s.
HOURLY_LABEL_DIGITS = (6, 4)
#: Width of a digit of the tick labels' font, in units of the font size (DejaVu Sans: 0.636).
_DIGIT_EM = 0.64
#: Width of an average character of a title or label, in units of the font size.
_CHAR_EM = 0.6

# The map's frame, in viewBox units: room for the title above, the longitude labels below, the
# latitude labels left and the colour bar right.
_MAP_LEFT, _MAP_RIGHT, _MAP_TOP, _MAP_BOTTOM = 86, 126, 52, 66
_HOURLY_TOP, _HOURLY_BOTTOM = 44, 104
_MAP_CBAR_MIN = 180  # the colour bar's least height (the map's own when it is lower)
_TICK = 5  # tick length
_TICK_FONT, _LABEL_FONT, _TITLE_FONT = 12, 12, 15


#: Characters XML does not allow in a document (C0 controls but tab and line breaks, lone surrogates,
#: U+FFFE and U+FFFF): a region's name could carry one, and the picture would not parse.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _x(text: object) -> str:
    """``text`` escaped for SVG character data and attribute values, without the characters XML
    does not allow."""
    return html.escape(_NOT_XML.sub("", str(text)), quote=True)


def _num(value: float) -> str:
    """A coordinate with at most one decimal: ``12``, ``12.5``, ``-3.1``."""
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return "0" if text == "-0" else text


def _svg(size: tuple[int, int], label: str, body: list[str]) -> str:
    width, height = size
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{_x(label)}" font-family="{FONT}" '
            f'font-size="{_TICK_FONT}">\n<rect width="{width}" height="{height}" fill="#ffffff"/>\n'
            + "\n".join(body) + "\n</svg>")


def _text(x: float, y: float, text: str, *, size: float = _TICK_FONT, anchor: str = "middle",
          extra: str = "") -> str:
    """A line of text at (x, y): ``y`` is its baseline."""
    return (f'<text x="{_num(x)}" y="{_num(y)}" font-size="{_num(size)}" text-anchor="{anchor}"{extra}>'
            f"{_x(text)}</text>")


def _title(width: int, y: float, text: str) -> str:
    """The picture's title, centred; fitted into the picture's width when it is longer."""
    room = width - 24
    fit = f' textLength="{room}" lengthAdjust="spacingAndGlyphs"' if len(text) * _CHAR_EM * _TITLE_FONT > room else ""
    return _text(width / 2, y, text, size=_TITLE_FONT, extra=f' font-weight="bold"{fit}')


def _vertical_label(x: float, y: float, text: str) -> str:
    """An axis label written bottom to top, centred on (x, y)."""
    return (f'<text transform="translate({_num(x)} {_num(y)}) rotate(-90)" font-size="{_LABEL_FONT}" '
            f'text-anchor="middle">{_x(text)}</text>')


# ---- scales -------------------------------------------------------------------------------

#: The tops of the hourly chart's two value axes are one of these times a power of ten, the
#: smallest at or above 1.15 × the day's highest value.
_NICE_TOPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
#: A tick step is one of these times a power of ten.
_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


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


def nice_ticks(low: float, high: float, most: int = 5) -> list[float]:
    """Ticks from ``low`` to ``high``: the multiples of the smallest step of :data:`_STEPS` times a
    power of ten that makes at most ``most`` intervals.

    Example:
        >>> nice_ticks(0, 1.2)
        [0.0, 0.25, 0.5, 0.75, 1.0]
        >>> nice_ticks(-90.62, -89.38, 7)
        [-90.6, -90.4, -90.2, -90.0, -89.8, -89.6, -89.4]
    """
    span = high - low
    if not (math.isfinite(span) and span > 0):
        return [round(low, 12)]
    base = 10.0 ** math.floor(math.log10(span / most))
    for factor in _STEPS:  # 10 × base is always few enough: it is more than span / most
        step = factor * base
        first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
        if last - first <= most:
            break
    return [round(k * step, 12) for k in range(first, last + 1)]


def decimals_of(step: float) -> int:
    """How many decimals write every multiple of ``step`` exactly: 0.25 → 2, 0.2 → 1, 5 → 0."""
    text = f"{step:.9f}".rstrip("0")
    return len(text) - text.index(".") - 1


def tick_label(value: float) -> str:
    """A value axis's tick label: ``12``, ``2.5``, ``150000``, ``1.5M``.

    Example:
        >>> [tick_label(v) for v in (0.0, 2.5, 150000.0, 1500000.0)]
        ['0', '2.5', '150000', '1.5M']
    """
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def _degree_label(value: float, step: float) -> str:
    """A longitude or latitude tick, with the decimals its step needs."""
    text = f"{value:.{decimals_of(step)}f}"
    return "0" if float(text) == 0 else text


def _color_table() -> list[str]:
    """The ``#rrggbb`` colour of each of the :data:`RISK_STEPS` risk steps."""
    stops = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in RISK_COLORS], dtype=float)
    at = np.arange(RISK_STEPS) / (RISK_STEPS - 1) * (len(RISK_COLORS) - 1)
    rgb = np.rint(np.stack([np.interp(at, np.arange(len(RISK_COLORS)), stops[:, k]) for k in range(3)], axis=1))
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in rgb.astype(int).tolist()]


_COLORS = _color_table()


def risk_colors(risk: np.ndarray) -> list[str]:
    """The ``#rrggbb`` colour of each risk (0..1; NaN is drawn as 0) on :data:`RISK_STEPS` steps."""
    steps = np.clip(np.floor(np.nan_to_num(risk.astype(float), nan=0.0) * RISK_STEPS), 0, RISK_STEPS - 1)
    return [_COLORS[k] for k in steps.astype(int).tolist()]


# ---- the map --------------------------------------------------------------------------------

def _cell_outline(cell: str) -> np.ndarray:
    """The vertices of one H3 cell in (lon, lat) order, an (n, 2) array."""
    return np.asarray(h3.cell_to_boundary(cell), dtype=float)[:, ::-1]


def _outline_rings(cell_ids: Sequence[str]) -> list[np.ndarray]:
    """All rings (outer and holes) of the union of ``cell_ids`` as (n, 2) lon/lat arrays."""
    if not cell_ids:
        return []
    geo = h3.cells_to_geo(sorted(cell_ids))
    polygons = [geo["coordinates"]] if geo["type"] == "Polygon" else list(geo["coordinates"])
    return [np.asarray(ring, dtype=float) for poly in polygons for ring in poly]


def map_extent(region: Region) -> tuple[float, float, float, float]:
    """(xmin, xmax, ymin, ymax) of every map of ``region``: its box and :data:`MAP_MARGIN_DEG` around."""
    mid_lat = (region.min_lat + region.max_lat) / 2.0
    dx = MAP_MARGIN_DEG / max(math.cos(math.radians(mid_lat)), 0.01)
    return region.min_lon - dx, region.max_lon + dx, region.min_lat - MAP_MARGIN_DEG, region.max_lat + MAP_MARGIN_DEG


class _MapFrame:
    """Where the map's data go in the picture: the plot box, sized for equal ground distances on
    both axes at the region's latitude and centred in the room the layout leaves it."""

    def __init__(self, region: Region) -> None:
        xmin, xmax, ymin, ymax = map_extent(region)
        pad_x, pad_y = (xmax - xmin) * 0.02, (ymax - ymin) * 0.02
        self.lon0, self.lon1, self.lat0, self.lat1 = xmin - pad_x, xmax + pad_x, ymin - pad_y, ymax + pad_y
        squash = max(math.cos(math.radians((region.min_lat + region.max_lat) / 2.0)), 0.01)
        width, height = MAP_SIZE
        room_w, room_h = width - _MAP_LEFT - _MAP_RIGHT, height - _MAP_TOP - _MAP_BOTTOM
        self.scale = min(room_w / ((self.lon1 - self.lon0) * squash), room_h / (self.lat1 - self.lat0))
        self.sx = self.scale * squash  # units per degree of longitude
        self.w, self.h = (self.lon1 - self.lon0) * self.sx, (self.lat1 - self.lat0) * self.scale
        self.x0 = _MAP_LEFT + (room_w - self.w) / 2
        self.y0 = _MAP_TOP
        #: the picture's height: a wide region's map is as high as its plot needs, no more
        self.height = math.ceil(_MAP_TOP + self.h + _MAP_BOTTOM)

    def xy(self, lonlat: np.ndarray) -> np.ndarray:
        """(lon, lat) pairs (last axis) as viewBox (x, y)."""
        out = np.empty(lonlat.shape, dtype=float)
        out[..., 0] = self.x0 + (lonlat[..., 0] - self.lon0) * self.sx
        out[..., 1] = self.y0 + (self.lat1 - lonlat[..., 1]) * self.scale
        return out

    def tenths(self, lonlat: np.ndarray) -> np.ndarray:
        """:meth:`xy` in integer tenths of a unit."""
        return np.rint(self.xy(lonlat) * 10).astype(np.int64)


def _ring_path(ring: np.ndarray) -> str:
    """One closed ring of integer-tenth points as path data: a move, then relative lines."""
    steps = np.diff(ring, axis=0)
    return f"M{ring[0, 0]} {ring[0, 1]}l" + " ".join(f"{dx} {dy}" for dx, dy in steps) + "z"


#: A hexagon's path data: its first vertex, then five relative lines (the sixth side closes it).
_HEXAGON = "M{} {}l{} {} {} {} {} {} {} {} {} {}z"
#: Cells' path data kept per process, by region (a region's days draw mostly the same cells: its
#: reference cells and those with outages). Past this many cells in all, the kept ones are dropped;
#: a year of 50 regions of a few thousand cells each fits.
CELL_PATHS_KEPT = 200_000
_cell_path_data: dict[Region, dict[str, str]] = {}


def _paths_of(region: Region, frame: _MapFrame, cells: list[str]) -> list[str]:
    """The path data of each of ``cells`` on the map of ``region``, in integer tenths; made for the
    cells this process has not drawn on that region's map before, looked up for the others."""
    kept = _cell_path_data.get(region)
    new = list(dict.fromkeys(c for c in cells if kept is None or c not in kept))
    if new and sum(map(len, _cell_path_data.values())) + len(new) > CELL_PATHS_KEPT:
        _cell_path_data.clear()
        kept = None
    if kept is None:
        kept = _cell_path_data[region] = {}
    if new:
        outlines = [_cell_outline(cell) for cell in new]
        hexagons = [i for i, o in enumerate(outlines) if len(o) == 6]
        if hexagons:
            pts = frame.tenths(np.stack([outlines[i] for i in hexagons]))  # (cells, 6, 2)
            rows = np.concatenate([pts[:, 0, :], np.diff(pts, axis=1).reshape(len(hexagons), 10)], axis=1)
            for i, row in zip(hexagons, rows.tolist(), strict=True):
                kept[new[i]] = _HEXAGON.format(*row)
        for i, outline in enumerate(outlines):  # a pentagon or a cell with distortion vertices
            if len(outline) != 6:
                kept[new[i]] = _ring_path(frame.tenths(outline))
    return [kept[cell] for cell in cells]


def _cell_paths(region: Region, frame: _MapFrame, cell_risk: pd.DataFrame) -> list[str]:
    """The cells, one ``<path>`` per colour step, in integer tenths (inside the scale group)."""
    cells = cell_risk.sort_values("cell_id", kind="mergesort")
    ids = cells["cell_id"].tolist()
    colors = risk_colors(cells["risk"].to_numpy(dtype=float, na_value=np.nan))
    by_color: dict[str, list[str]] = {}
    for color, path in zip(colors, _paths_of(region, frame, ids), strict=True):
        by_color.setdefault(color, []).append(path)
    return [f'<path fill="{color}" d="{"".join(paths)}"/>' for color, paths in sorted(by_color.items())]


def _cluster_shapes(frame: _MapFrame, clusters: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Each storm cluster outlined (white halo, then the outline colour) with a hover title, and
    its label ``C<id>`` in a box just above its outline (not on its centre, so that small clusters
    stay visible). Returns (outlines in integer tenths, labels in units)."""
    ordered = clusters.sort_values("cluster_id", kind="mergesort") if len(clusters) else clusters
    outlines: list[str] = []
    labels: list[str] = []
    for row in ordered.itertuples(index=False):
        cluster_id = int(row.cluster_id)
        rings = _outline_rings(list(row.cell_ids if row.cell_ids is not None else []))
        top = max(float(r[:, 1].max()) for r in rings) if rings else float(row.center_lat)
        gust = "n/a" if row.max_gust_ms is None or math.isnan(row.max_gust_ms) else f"{row.max_gust_ms:.1f} m/s"
        title = (f"C{cluster_id}: {int(row.cell_count)} cells, {int(row.outages)} outages, "
                 f"{int(row.customers_out)} customers out, peak hour {int(row.peak_hour):02d}:00, "
                 f"max gust {gust}, mean risk {row.mean_risk:.2f}")
        if rings:
            d = "".join(_ring_path(frame.tenths(r)) for r in rings)
            outlines.append(f'<g><title>{_x(title)}</title><path d="{d}" stroke="#ffffff" stroke-width="44"/>'
                            f'<path d="{d}" stroke="{OUTLINE}" stroke-width="22"/></g>')
        x, y = frame.xy(np.array([float(row.center_lon), top]))
        text = f"C{cluster_id}"
        w, h = len(text) * 0.68 * 11 + 8, 15
        labels.append(f'<g><title>{_x(title)}</title><rect x="{_num(x - w / 2)}" y="{_num(y - 4 - h)}" '
                      f'width="{_num(w)}" height="{h}" rx="3" fill="#ffffff" fill-opacity="0.9" '
                      f'stroke="{OUTLINE}" stroke-width="1"/>'
                      + _text(x, y - 8, text, size=11, extra=f' font-weight="bold" fill="{OUTLINE}"') + "</g>")
    return outlines, labels


def _map_axes(frame: _MapFrame) -> list[str]:
    """The grid, ticks and tick labels of both axes, and the axis labels."""
    f = frame
    x1, y1 = f.x0 + f.w, f.y0 + f.h
    lons, lats = nice_ticks(f.lon0, f.lon1, 7), nice_ticks(f.lat0, f.lat1, 7)
    lon_step = lons[1] - lons[0] if len(lons) > 1 else 1.0
    lat_step = lats[1] - lats[0] if len(lats) > 1 else 1.0
    grid, ticks, labels = [], [], []
    for lon in lons:
        x = _num(f.x0 + (lon - f.lon0) * f.sx)
        grid.append(f"M{x} {_num(f.y0)}V{_num(y1)}")
        ticks.append(f"M{x} {_num(y1)}v{_TICK}")
        labels.append(_text(float(x), y1 + _TICK + 14, _degree_label(lon, lon_step)))
    for lat in lats:
        y = _num(f.y0 + (f.lat1 - lat) * f.scale)
        grid.append(f"M{_num(f.x0)} {y}H{_num(x1)}")
        ticks.append(f"M{_num(f.x0)} {y}h-{_TICK}")
        labels.append(_text(f.x0 - _TICK - 3, float(y) + 4, _degree_label(lat, lat_step), anchor="end"))
    return [
        f'<path d="{"".join(grid)}" stroke="{GRID}" stroke-width="0.6" fill="none"/>',
        f'<path d="{"".join(ticks)}" stroke="#000000" stroke-width="1" fill="none"/>',
        *labels,
        _text(f.x0 + f.w / 2, y1 + _TICK + 36, "Longitude (°)", size=_LABEL_FONT),
        _vertical_label(f.x0 - 64, f.y0 + f.h / 2, "Latitude (°)"),
    ]


def _colorbar(frame: _MapFrame) -> list[str]:
    """The risk scale beside the map: a gradient through :data:`RISK_COLORS`, ticks every 0.2."""
    height = max(frame.h * 0.8, min(frame.h, _MAP_CBAR_MIN))
    x, y, w = frame.x0 + frame.w + 16, frame.y0 + (frame.h - height) / 2, 18
    stops = "".join(f'<stop offset="{_num(100 * i / (len(RISK_COLORS) - 1))}%" stop-color="{c}"/>'
                    for i, c in enumerate(RISK_COLORS))
    out = [f'<defs><linearGradient id="map-risk" x1="0" y1="1" x2="0" y2="0">{stops}</linearGradient></defs>',
           f'<rect x="{_num(x)}" y="{_num(y)}" width="{w}" height="{_num(height)}" fill="url(#map-risk)" '
           f'stroke="#000000" stroke-width="0.8"/>']
    marks = []
    for k in range(6):
        ty = y + height * (1 - k / 5)
        marks.append(f"M{_num(x + w)} {_num(ty)}h{_TICK}")
        out.append(_text(x + w + _TICK + 3, ty + 4, f"{k / 5:.1f}", anchor="start"))
    out.append(f'<path d="{"".join(marks)}" stroke="#000000" stroke-width="1"/>')
    out.append(_vertical_label(x + w + 52, y + height / 2, "Risk (0 = none, 1 = highest)"))
    return out


def _map_legend(frame: _MapFrame, n_clusters: int) -> str:
    """What the outlines and the dashed frame are, in the map's upper left corner."""
    x, y = frame.x0 + 8, frame.y0 + 8
    first = f"Storm cluster ({n_clusters})"
    w = max(len(first), len("Region box")) * _CHAR_EM * 11 + 44
    return (f'<g><rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="44" rx="3" fill="#ffffff" '
            f'fill-opacity="0.9" stroke="#cccccc"/>'
            f'<path d="M{_num(x + 8)} {_num(y + 15)}h24" stroke="{OUTLINE}" stroke-width="2.2"/>'
            + _text(x + 38, y + 19, first, size=11, anchor="start")
            + f'<path d="M{_num(x + 8)} {_num(y + 33)}h24" stroke="#444444" stroke-width="1.2" '
              f'stroke-dasharray="5 3"/>'
            + _text(x + 38, y + 37, "Region box", size=11, anchor="start") + "</g>")


def render_map_svg(*, region: Region, day: str, cell_risk: pd.DataFrame, clusters: pd.DataFrame) -> str:
    """Map of the region's cells coloured by risk, with the storm clusters outlined and labelled.

    Args:
        region: The partition's region; its box sets the extent and is drawn dashed.
        day: The partition day, shown in the title.
        cell_risk: Rows of ``CELL_RISK`` (``cell_id``, ``risk``, ...).
        clusters: Rows of ``STORM_CLUSTERS`` (``cluster_id``, ``cell_ids``, ``center_lat``, ...).

    Returns:
        The ``<svg>`` element.
    """
    f = _MapFrame(region)
    box = f'x="{_num(f.x0)}" y="{_num(f.y0)}" width="{_num(f.w)}" height="{_num(f.h)}"'
    corner = f.xy(np.array([[region.min_lon, region.max_lat], [region.max_lon, region.min_lat]]))
    outlines, labels = _cluster_shapes(f, clusters)
    body = [f'<defs><clipPath id="map-plot"><rect {box}/></clipPath></defs>', *_map_axes(f)]
    plotted = []
    if len(cell_risk):
        plotted.append('<g transform="scale(0.1)" stroke="#ffffff" stroke-width="2">'
                       + "".join(_cell_paths(region, f, cell_risk)) + "</g>")
    plotted.append(f'<rect x="{_num(corner[0, 0])}" y="{_num(corner[0, 1])}" '
                   f'width="{_num(corner[1, 0] - corner[0, 0])}" height="{_num(corner[1, 1] - corner[0, 1])}" '
                   f'fill="none" stroke="#444444" stroke-width="1.2" stroke-dasharray="6 3"/>')
    if outlines:
        plotted.append('<g transform="scale(0.1)" fill="none" stroke-linejoin="round">' + "".join(outlines) + "</g>")
    body.append('<g clip-path="url(#map-plot)">' + "".join(plotted) + "</g>")
    body.append(f'<rect {box} fill="none" stroke="#000000" stroke-width="1"/>')
    if not len(cell_risk):
        body.append(_text(f.x0 + f.w / 2, f.y0 + f.h / 2, "No cell data for this day", size=16,
                          extra=' fill="#555555"'))
    body += labels
    body.append(_map_legend(f, len(clusters)))
    body += _colorbar(f)
    body.append(_title(MAP_SIZE[0], 30, f"{region.name} — outage risk by H3 cell, {day} (UTC)"))
    return _svg((MAP_SIZE[0], f.height), f"Map of {region.name} cells coloured by outage risk with storm clusters outlined", body)


# ---- the hourly chart -----------------------------------------------------------------------


def hourly_series(enriched: pd.DataFrame, cell_hour: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(outages reported in each UTC hour, the strongest gust of each hour or NaN): 24 each.

    The gusts come from ``cell_hour``; when it has none, from the enriched rows' ``gust_ms``.
    """
    hours = np.arange(24)
    counts = (
        enriched["hour"].astype(int).value_counts().reindex(hours, fill_value=0).to_numpy()
        if len(enriched)
        else np.zeros(24, dtype=int)
    )
    gust_src = cell_hour if len(cell_hour) and cell_hour["gust_ms"].notna().any() else enriched
    if len(gust_src):
        gust = gust_src.groupby(gust_src["hour"].astype(int))["gust_ms"].max().reindex(hours).to_numpy(dtype=float)
    else:
        gust = np.full(24, np.nan)
    return counts, gust


def render_hourly_svg(*, region: Region, day: str, enriched: pd.DataFrame, cell_hour: pd.DataFrame) -> str:
    """Outages reported per UTC hour (bars, left axis) with the strongest gust of each hour (line,
    right axis); each hour's figures are its hover title.

    Args:
        region: The partition's region (title).
        day: The partition day (title).
        enriched: Rows of ``OUTAGES_ENRICHED``; ``hour`` is counted.
        cell_hour: Rows of ``CELL_HOUR_STATS``; the hourly maximum of ``gust_ms`` is drawn.
            When it has no gusts the enriched rows' ``gust_ms`` are used instead.

    Returns:
        The ``<svg>`` element.
    """
    counts, gust = hourly_series(enriched, cell_hour)
    width, height = HOURLY_SIZE
    rooms = [_TICK + 4 + digits * _DIGIT_EM * _TICK_FONT + 8 for digits in HOURLY_LABEL_DIGITS]
    x0 = rooms[0] + _LABEL_FONT + 16
    x1 = width - rooms[1] - _LABEL_FONT - 16
    y0, y1 = _HOURLY_TOP, height - _HOURLY_BOTTOM
    hour_w = (x1 - x0) / 24.2  # the hours from -0.6 to 23.6

    def hx(hour: float) -> float:
        return x0 + (hour + 0.6) * hour_w

    finite = gust[np.isfinite(gust)]
    count_top = nice_top(max(1, int(counts.max())))
    gust_top = nice_top(float(finite.max()) if finite.size else 0.0)

    def cy(value: float) -> float:
        return y1 - value / count_top * (y1 - y0)

    def gy(value: float) -> float:
        return y1 - value / gust_top * (y1 - y0)

    body: list[str] = []
    grid, ticks, labels = [], [], []
    for v in nice_ticks(0.0, count_top):
        grid.append(f"M{_num(x0)} {_num(cy(v))}H{_num(x1)}")
        ticks.append(f"M{_num(x0)} {_num(cy(v))}h-{_TICK}")
        labels.append(_text(x0 - _TICK - 4, cy(v) + 4, tick_label(v), anchor="end"))
    for v in nice_ticks(0.0, gust_top):
        ticks.append(f"M{_num(x1)} {_num(gy(v))}h{_TICK}")
        labels.append(_text(x1 + _TICK + 4, gy(v) + 4, tick_label(v), anchor="start"))
    for hour in range(0, 24, 2):
        ticks.append(f"M{_num(hx(hour))} {_num(y1)}v{_TICK}")
        labels.append(_text(hx(hour), y1 + _TICK + 14, str(hour)))
    body.append(f'<path d="{"".join(grid)}" stroke="{GRID}" stroke-width="0.6" fill="none"/>')
    bars = "".join(f"M{_num(hx(h - 0.4))} {_num(y1)}V{_num(cy(c))}h{_num(0.8 * hour_w)}V{_num(y1)}z"
                   for h, c in enumerate(counts.tolist()) if c > 0)
    if bars:
        body.append(f'<path d="{bars}" fill="{BAR_COLOR}"/>')
    else:
        body.append(_text((x0 + x1) / 2, (y0 + y1) / 2, "No outages reported", size=15, extra=' fill="#555555"'))
    body.append(f'<rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(x1 - x0)}" height="{_num(y1 - y0)}" '
                f'fill="none" stroke="#000000" stroke-width="1"/>')
    body.append(f'<path d="{"".join(ticks)}" stroke="#000000" stroke-width="1" fill="none"/>')
    # the gust line, broken where an hour has no gust, with a dot on every hour that has one
    runs, run = [], []
    for h, g in enumerate(gust.tolist()):
        if math.isfinite(g):
            run.append(f"{_num(hx(h))} {_num(gy(g))}")
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    if runs:
        line = "".join("M" + "L".join(r) for r in runs)
        dots = "".join(f'<circle cx="{p.split()[0]}" cy="{p.split()[1]}" r="3"/>' for r in runs for p in r)
        body.append(f'<path d="{line}" fill="none" stroke="{OUTLINE}" stroke-width="2" stroke-linejoin="round"/>'
                    f'<g fill="{OUTLINE}">{dots}</g>')
    body += labels
    # each hour's figures on hover, over the whole height of the plot
    hovers = []
    for h in range(24):
        g = gust[h]
        said = f"{h:02d}:00–{h + 1:02d}:00 UTC: {int(counts[h])} outages reported, max gust " + (
            f"{g:.1f} m/s" if math.isfinite(g) else "n/a")
        hovers.append(f'<rect x="{_num(hx(h - 0.5))}" y="{_num(y0)}" width="{_num(hour_w)}" '
                      f'height="{_num(y1 - y0)}"><title>{_x(said)}</title></rect>')
    body.append('<g fill="#000000" fill-opacity="0">' + "".join(hovers) + "</g>")
    body.append(_text((x0 + x1) / 2, y1 + _TICK + 36, "Hour of day (UTC)", size=_LABEL_FONT))
    body.append(_vertical_label(x0 - rooms[0] - 4, (y0 + y1) / 2, "Outages"))
    body.append(_vertical_label(x1 + rooms[1] + 8, (y0 + y1) / 2, "Max wind gust (m/s)"))
    # the legend below the plot
    lx, ly = (x0 + x1) / 2 - 150, height - 22
    body.append(f'<rect x="{_num(lx)}" y="{_num(ly - 10)}" width="22" height="11" fill="{BAR_COLOR}"/>'
                + _text(lx + 30, ly, "Outages reported", size=11, anchor="start")
                + f'<path d="M{_num(lx + 170)} {_num(ly - 4)}h24" stroke="{OUTLINE}" stroke-width="2"/>'
                + f'<circle cx="{_num(lx + 182)}" cy="{_num(ly - 4)}" r="3" fill="{OUTLINE}"/>'
                + _text(lx + 202, ly, "Max gust", size=11, anchor="start"))
    body.append(_title(width, 26, f"{region.name} — outages per hour and max gust, {day}"))
    return _svg(HOURLY_SIZE, "Outages reported per hour with the maximum wind gust", body)
