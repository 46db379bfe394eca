"""Checks of the PNG figures the pipeline writes: a real PNG of the size its figure was made at, with
something drawn on it. What a figure shows is checked against its inputs through the data its plot
function returns (`eyas.evaluate.figures.plotted`)."""

from __future__ import annotations

import struct
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: str | Path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR chunk, which the format puts first."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path}: not a PNG"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])


def assert_figure_png(path: str | Path, inches: tuple[float, float], dpi: int = 100) -> None:
    """`path` is a PNG of `inches` at `dpi` with more than a blank canvas on it."""
    import matplotlib.image

    assert png_size(path) == (round(inches[0] * dpi), round(inches[1] * dpi))
    image = matplotlib.image.imread(path)
    assert float(image[..., :3].std()) > 0.05, f"{path}: nothing drawn"


def series(shown: list[dict], title_part: str) -> dict:
    """The one axes of `plotted` data whose title contains `title_part`."""
    (axes,) = [a for a in shown if title_part in a["title"]]
    return axes
