"""Figure and PNG helpers of the pictures drawn with matplotlib (those of ``stormlake report``):
:func:`new_figure`, :func:`figure_png`, :func:`draw_over`, :func:`encode_png`.

The PNG bytes depend only on the pixels: the figures are drawn with the object-oriented API on an
Agg canvas (no pyplot, so no global figure registry), and :func:`encode_png` writes no text chunks
(no matplotlib version or time stamp in the bytes) and stores rows without the adaptive filters
PIL applies (on flat-coloured charts they cost more than the compression itself and give larger
files than unfiltered rows). The present phase's pictures are SVG, written by
:mod:`assets.transforms.pictures`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: Pixel density of every picture.
DPI = 110
#: zlib level of the PNG data. On these charts (unfiltered rows) level 3 costs about what level 1
#: does and much less than level 6, for files only a little larger than level 6's.
PNG_ZLIB_LEVEL = 3


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


def shifted(fig: Figure, base, dx_px: float, dy_px: float):  # noqa: ANN001, ANN202 - matplotlib transforms
    """``base`` moved by a fixed number of pixels of ``fig``."""
    from matplotlib.transforms import ScaledTranslation

    return base + ScaledTranslation(dx_px / fig.dpi, dy_px / fig.dpi, fig.dpi_scale_trans)
