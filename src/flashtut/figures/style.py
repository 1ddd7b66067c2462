"""One look for every figure, readable on the book's light and dark themes.

A figure is drawn on its own white background with near-black text (12.6:1), because the
dark theme shows cell outputs on a light grey panel through a dimming filter, where a grey
meant for both themes fell to about 2:1; ``book/_static/figures.css`` turns that filter off, so
a figure looks the same in both themes. Lines use the Okabe-Ito palette (distinguishable with
colour-vision deficiencies) and, past its eight colours, Paul Tol's. ``IMPL_STYLE`` gives every
implementation one colour and one marker, the same in every figure of the book.
"""
from __future__ import annotations

import matplotlib

INK = "#333333"  # on the white figure background: 12.6:1
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#999999"]
#: more colours, for the figures with more series than the palette has (Paul Tol's muted set)
EXTRA = ["#882255", "#44AA99", "#332288", "#AA4499", "#117733", "#DDCC77", "#661100"]

#: one colour and marker per implementation, everywhere; no two share a colour
IMPL_STYLE = {
    "naive": ("#999999", "o"), "tiled": ("#56B4E9", "s"), "sdpa-math": ("#DDCC77", "^"),
    "sdpa-efficient": ("#CC79A7", "D"), "sdpa-flash": ("#0072B2", "v"), "sdpa-cudnn": ("#009E73", "P"),
    "triton": ("#E69F00", "X"), "cuda": ("#D55E00", "*"),
    "cuda-v1": ("#882255", "<"), "cuda-v2": ("#44AA99", ">"), "cuda-v3": ("#332288", "h"),
    "cuda-v4": ("#AA4499", "p"), "cuda-v5": ("#117733", "8"), "flex": ("#661100", "d"),
    # chapter 13: our FlexAttention on the Triton kernels ("flex" is PyTorch's)
    "triton-flex": ("#BB5566", "."),
    # chapter 11's Hopper rungs and the mma.sync forward they are measured against (hopper_h200.json);
    # colours outside PALETTE and EXTRA, so the spare colours for unnamed series stay as they were
    "cuda-mma": ("#000000", "+"), "hopper-w1": ("#AAAA00", "x"), "hopper-w1[pv128]": ("#77AADD", "1"),
    "hopper-w1[n64]": ("#EE8866", "2"), "hopper-w2": ("#EE3377", "H"), "hopper-w3": ("#DC050C", "4"),
    "hopper-w3[c3]": ("#9467BD", "3"), "hopper-w4": ("#8C564B", "|"), "hopper-w4[c3]": ("#17BECF", "_"),
}

RC = {
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "savefig.transparent": False,
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
    "font.size": 11,
    "legend.fontsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def apply_style() -> None:
    """Install the book's matplotlib defaults (idempotent); in a notebook, figures are sent at
    twice the pixel density (``retina``), so text stays sharp when the page scales them."""
    matplotlib.rcParams.update(RC)
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:          # plain Python: nothing is displayed inline
        return
    if get_ipython() is not None:
        set_matplotlib_formats("retina")


def impl_style(name: str, index: int = 0) -> dict:
    """Colour, marker and line style of an implementation: ``IMPL_STYLE`` for the known names
    (the CUDA ladder dashed); any other name takes the ``index``-th colour after them."""
    name = name.split(" [")[0]                     # "impl [device]" keeps the impl's look
    if name in IMPL_STYLE:
        color, marker = IMPL_STYLE[name]
        return {"color": color, "marker": marker, "linestyle": "--" if name.startswith("cuda-v") else "-"}
    spare = [c for c in PALETTE + EXTRA if c not in {c for c, _ in IMPL_STYLE.values()}] or PALETTE
    markers = ["o", "s", "^", "D", "v"]
    return {"color": spare[index % len(spare)], "marker": markers[index % len(markers)],
            "linestyle": ["--", "-.", ":"][index % 3]}


def subplots(*args, **kwargs):
    """``plt.subplots`` with the book's style applied first."""
    import matplotlib.pyplot as plt

    apply_style()
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(*args, **kwargs)
