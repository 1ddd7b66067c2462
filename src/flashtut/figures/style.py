"""One look for every figure, readable on the book's light and dark themes.

The figure background is transparent, so the page colour shows through; text, axes and grid
are a mid grey that has contrast on white and on near-black; the line colours are the
Okabe-Ito palette (distinguishable with colour-vision deficiencies) at a brightness that
works on both backgrounds.
"""
from __future__ import annotations

import matplotlib

INK = "#808080"  # mid grey: ~3.9:1 on white and ~5.3:1 on #121212
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#999999"]

RC = {
    "figure.facecolor": "none",
    "axes.facecolor": "none",
    "savefig.facecolor": "none",
    "savefig.transparent": True,
    "text.color": INK,
    "axes.labelcolor": INK,
    "axes.edgecolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "grid.color": INK,
    "grid.alpha": 0.3,
    "axes.grid": True,
    "legend.frameon": False,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
    "figure.dpi": 110,
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def apply_style() -> None:
    """Install the book's matplotlib defaults (idempotent)."""
    matplotlib.rcParams.update(RC)


def subplots(*args, **kwargs):
    """``plt.subplots`` with the book's style applied first."""
    import matplotlib.pyplot as plt

    apply_style()
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(*args, **kwargs)
