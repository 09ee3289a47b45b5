"""Deterministic matplotlib drawings for the present phase's report.

Every function returns PNG bytes that depend only on its arguments: the figures are drawn with
the object-oriented API on an Agg canvas (no pyplot, so no global figure registry), inside a
style context that resets matplotlib's defaults (a user's ``matplotlibrc`` must not change the
published bytes), at a fixed size and dpi, and saved without the ``Software`` PNG text chunk
(it carries the matplotlib version, which would change the artifact's hash on an upgrade).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import h3
import matplotlib as mpl
import matplotlib.style as mpl_style
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from resources.settings import Region

#: Pixel density of every picture; with the figure sizes below this yields ~900 px wide images.
DPI = 110
MAP_SIZE_IN = (8.0, 7.0)
HOURLY_SIZE_IN = (8.0, 3.6)
RISK_CMAP = "YlOrRd"
OUTLINE = "#1f3b73"

# Settings applied on top of matplotlib's defaults while drawing. The SVG hash salt is fixed so
# that an SVG export (not used today) would also be reproducible.
_RC: dict[str, object] = {
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.titlesize": 11.0,
    "axes.labelsize": 9.0,
    "svg.hashsalt": "stormlake",
    "path.simplify": True,
}


@contextmanager
def _style() -> Iterator[None]:
    """Draw with matplotlib's built-in defaults plus :data:`_RC`, restoring rcParams after."""
    with mpl_style.context("default"), mpl.rc_context(rc=_RC):
        yield


def _png(fig: Figure) -> bytes:
    """Encode ``fig`` as PNG with no version or time metadata."""
    canvas = FigureCanvasAgg(fig)
    buf = io.BytesIO()
    canvas.print_png(buf, metadata={"Software": None})
    return buf.getvalue()


def _cell_polygons(cell_ids: Sequence[str]) -> list[np.ndarray]:
    """Vertices of each H3 cell as an (n, 2) array in (lon, lat) order."""
    out: list[np.ndarray] = []
    for cell in cell_ids:
        boundary = np.asarray(h3.cell_to_boundary(cell), dtype=float)
        out.append(boundary[:, ::-1])  # h3 gives (lat, lng); plots want x=lon, y=lat
    return out


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
        fig = Figure(figsize=MAP_SIZE_IN, dpi=DPI)
        ax = fig.add_subplot(1, 1, 1)
        norm = Normalize(vmin=0.0, vmax=1.0)  # fixed scale so that days compare at a glance
        cmap = mpl.colormaps[RISK_CMAP]

        cells = cell_risk.sort_values("cell_id", kind="mergesort") if len(cell_risk) else cell_risk
        xmin, xmax, ymin, ymax = region.min_lon, region.max_lon, region.min_lat, region.max_lat
        if len(cells):
            verts = _cell_polygons(cells["cell_id"].tolist())
            risk = cells["risk"].astype(float).fillna(0.0).to_numpy()
            coll = PolyCollection(
                verts, array=risk, cmap=cmap, norm=norm, edgecolors="#ffffff", linewidths=0.15
            )
            ax.add_collection(coll, autolim=False)  # limits are set once below, not per patch
            allv = np.concatenate(verts)
            # Cells straddling the box edge poke out a little; keep them in view.
            xmin, xmax = min(xmin, float(allv[:, 0].min())), max(xmax, float(allv[:, 0].max()))
            ymin, ymax = min(ymin, float(allv[:, 1].min())), max(ymax, float(allv[:, 1].max()))
        else:
            ax.text(
                0.5,
                0.5,
                "No cell data for this day",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="#555555",
                fontsize=12,
            )

        ax.add_patch(
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

        ordered = clusters.sort_values("cluster_id", kind="mergesort") if len(clusters) else clusters
        rings: list[np.ndarray] = []
        labels: list[tuple[str, float, float]] = []
        for row in ordered.itertuples(index=False):
            own = _outline_rings(list(row.cell_ids if row.cell_ids is not None else []))
            rings.extend(own)
            # Label just above the outline, not on the centre, so small clusters stay visible.
            top = max(float(r[:, 1].max()) for r in own) if own else float(row.center_lat)
            labels.append((f"C{int(row.cluster_id)}", float(row.center_lon), top))
        if rings:
            # A white halo under the outline keeps it readable over the darkest cells.
            ax.add_collection(LineCollection(rings, colors="white", linewidths=3.2, zorder=3), autolim=False)
            ax.add_collection(LineCollection(rings, colors=OUTLINE, linewidths=1.6, zorder=3), autolim=False)
        for text, lon, lat in labels:
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

        pad_x, pad_y = (xmax - xmin) * 0.02, (ymax - ymin) * 0.02
        ax.set_xlim(xmin - pad_x, xmax + pad_x)
        ax.set_ylim(ymin - pad_y, ymax + pad_y)
        # Equal ground distances on both axes at the region's latitude.
        mid_lat = (region.min_lat + region.max_lat) / 2.0
        ax.set_aspect(1.0 / max(math.cos(math.radians(mid_lat)), 0.01))
        ax.set_xlabel("Longitude (°)")
        ax.set_ylabel("Latitude (°)")
        ax.set_title(f"{region.name} — outage risk by H3 cell, {day} (UTC)")
        ax.grid(True, linewidth=0.3, color="#bbbbbb", zorder=0)
        ax.set_axisbelow(True)

        sm = ScalarMappable(norm=norm, cmap=cmap)
        cbar = fig.colorbar(sm, ax=ax, shrink=0.8, pad=0.02)
        cbar.set_label("Risk (0 = none, 1 = highest)")
        handles = [
            Line2D([], [], color=OUTLINE, linewidth=1.6, label=f"Storm cluster ({len(ordered)})"),
            Line2D([], [], color="#444444", linewidth=0.9, linestyle="--", label="Region box"),
        ]
        ax.legend(handles=handles, loc="upper left", fontsize=8, framealpha=0.9)
        fig.tight_layout()
        return _png(fig)


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
        fig = Figure(figsize=HOURLY_SIZE_IN, dpi=DPI)
        ax = fig.add_subplot(1, 1, 1)
        ax.bar(hours, counts, width=0.8, color="#d9534f", label="Outages reported", zorder=2)
        ax.set_xlim(-0.6, 23.6)
        ax.set_xticks(hours[::2])
        ax.set_xlabel("Hour of day (UTC)")
        ax.set_ylabel("Outages")
        ax.set_ylim(0, max(1, int(counts.max())) * 1.15)
        ax.grid(True, axis="y", linewidth=0.3, color="#bbbbbb", zorder=0)
        ax2 = ax.twinx()
        ax2.plot(hours, gust, color=OUTLINE, marker="o", markersize=3, linewidth=1.4, label="Max gust")
        finite = gust[np.isfinite(gust)]
        ax2.set_ylim(0, (float(finite.max()) if finite.size else 1.0) * 1.15 or 1.0)
        ax2.set_ylabel("Max wind gust (m/s)")
        ax.set_title(f"{region.name} — outages per hour and max gust, {day}")
        handles = [*ax.get_legend_handles_labels()[0], *ax2.get_legend_handles_labels()[0]]
        # Below the plot: inside it would hide bars or the gust line.
        ax.legend(
            handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False
        )
        if not counts.any():
            ax.text(
                0.5,
                0.5,
                "No outages reported",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="#555555",
                fontsize=11,
            )
        fig.tight_layout()
        return _png(fig)
