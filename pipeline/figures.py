"""Figures drawn with matplotlib as PNG bytes that depend on their data only: the same input gives
the same bytes on any machine (a split's published figures carry their sha256 in its manifest; an
operator's pictures in Dagster metadata change only when what they show changes).

Shared by the dataset card's figures (splits/card_figures.py) and the operator's pictures of the
slot ledger (gdelt/ledger_figure.py) and of the OBELICS funnel (articles/funnel.py).
"""

from __future__ import annotations

import io
from collections.abc import Callable

import matplotlib
import matplotlib.style
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# Okabe & Ito, "Color Universal Design" (https://jfly.uni-koeln.de/color/): eight colours that stay
# distinguishable with the common colour-vision deficiencies.
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}


def new_figure(width: float, height: float) -> Figure:
    """A ``width`` × ``height`` inch figure at 100 dpi (so ``100 * width`` pixels wide)."""
    # A bare Figure on an Agg canvas: no pyplot, so no global figure registry or backend switch
    # in the Dagster process, and nothing ever tries to open a window.
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # Agg PNGs carry no timestamp; "Software" would carry the matplotlib version, which would
    # change the bytes (and a published sha256) on a mere library upgrade.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def rendered_png(draw: Callable[[], Figure]) -> bytes:
    """The PNG of the figure ``draw`` returns, drawn and saved in matplotlib's built-in style, so a
    matplotlibrc on the machine cannot change the bytes."""
    with matplotlib.style.context("default"):
        return png_bytes(draw())
