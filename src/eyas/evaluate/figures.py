"""Figures of the evaluation and the report: a headless matplotlib figure, its atomic PNG, and the data
it shows, read back from its artists (so a test can check a figure plots what it was given)."""

from __future__ import annotations

import os

from eyas.core.atomic import atomic_path

DPI = 100


def new_figure(width: float, height: float):
    """A figure of `width` x `height` inches on the Agg canvas (object API: no pyplot state, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def plotted(fig) -> list[dict]:
    """What each axes of `fig` shows, in drawing order: its title, every line (label, x, y) and every
    bar group (label, heights; horizontal bars' widths)."""
    from matplotlib.patches import Rectangle

    shown = []
    for ax in fig.axes:
        lines = [
            {
                "label": line.get_label(),
                "x": [float(x) for x in line.get_xdata()],
                "y": [float(y) for y in line.get_ydata()],
            }
            for line in ax.get_lines()
        ]
        bars = []
        for container in ax.containers:
            horizontal = getattr(container, "orientation", "vertical") == "horizontal"
            values = [
                p.get_width() if horizontal else p.get_height() for p in container if isinstance(p, Rectangle)
            ]
            bars.append({"label": container.get_label(), "values": [float(v) for v in values]})
        shown.append({"title": ax.get_title(), "lines": lines, "bars": bars})
    return shown


def save_figure(fig, out: str | os.PathLike) -> list[dict]:
    """Lay out and write `fig` as a PNG at `out` (atomically); returns `plotted(fig)`."""
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
    return plotted(fig)
