"""Chapter 03's figures: where ``exp`` overflows float16, and the three passes of safe softmax."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..checks import check_tensor
from .style import INK, PALETTE, subplots


def exp_overflow_threshold(dtype: torch.dtype = torch.float16) -> dict:
    """Where ``exp`` leaves the range of a floating dtype, computed with ``torch.exp`` itself.

    ``max``: the dtype's largest finite value; ``exact``: ``log(max)``, the real x at which
    ``exp(x)`` reaches it; ``last_finite``: the largest x of this dtype whose ``exp`` in this dtype
    is finite; ``first_inf``: the next representable x, whose ``exp`` is ``inf``. For float16 the
    inputs near 11 are 2**-7 apart, so ``last_finite`` is 11.0859375 and ``first_inf`` 11.09375.
    """
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"dtype: got {dtype!r}; accepted: torch.float16, torch.bfloat16, "
                         "torch.float32, torch.float64")
    fmax = torch.finfo(dtype).max
    up = torch.tensor(float("inf"), dtype=dtype)
    x = torch.tensor(math.log(fmax), dtype=torch.float64).to(dtype)   # nearest representable
    while not torch.isfinite(torch.exp(x)):
        x = torch.nextafter(x, -up)
    while torch.isfinite(torch.exp(torch.nextafter(x, up))):
        x = torch.nextafter(x, up)
    return {"max": fmax, "exact": math.log(fmax), "last_finite": float(x),
            "first_inf": float(torch.nextafter(x, up))}


def exp_overflow_figure():
    """Two panels: ``exp(x)`` for x in [0, 12] on a log scale against float16's largest value
    (left), and a zoom on every float16 input between 10.9 and 11.2 with its float16 ``exp``,
    finite below ``log(65504)`` and ``inf`` above (right). Returns the ``Figure``."""
    th = exp_overflow_threshold(torch.float16)
    fig, (ax, zoom) = subplots(1, 2, figsize=(9.6, 3.6))
    x = np.linspace(0, 12, 500)
    ax.plot(x, np.exp(x), color=PALETTE[0], lw=2, label="exp(x)")
    ax.axhline(th["max"], color=INK, ls="--", lw=1, label=f"float16 max = {th['max']:,.0f}")
    ax.axvspan(th["exact"], 12, color=PALETTE[3], alpha=0.15, label="exp(x) overflows float16")
    ax.set_yscale("log")
    ax.set_xlim(0, 12)
    ax.set_xlabel("x")
    ax.set_ylabel("exp(x)")
    ax.legend(loc="lower right", fontsize=8)

    x16 = torch.arange(10.9, 11.2, 2 ** -8, dtype=torch.float64).to(torch.float16).unique()
    e16 = torch.exp(x16).double().numpy()
    xs = x16.double().numpy()
    ok = np.isfinite(e16)
    zoom.plot(xs[ok], e16[ok], "o", color=PALETTE[1], ms=4, label="float16 exp of a float16 x")
    top = th["max"] * 1.06
    zoom.plot(xs[~ok], np.full(int((~ok).sum()), top), "x", color=PALETTE[3], ms=6,
              label="float16 exp is inf")
    xf = np.linspace(10.9, 11.2, 200)
    zoom.plot(xf, np.exp(xf), color=PALETTE[0], lw=1, alpha=0.6, label="exp(x), exact")
    zoom.axhline(th["max"], color=INK, ls="--", lw=1)
    zoom.axvline(th["exact"], color=PALETTE[3], ls=":", lw=1.2)
    zoom.annotate(f"log(65504) = {th['exact']:.4f}", (th["exact"], 67000), textcoords="offset points",
                  xytext=(-5, 0), ha="right", fontsize=8.5, color=PALETTE[3])
    zoom.set_xlabel("x")
    zoom.legend(loc="upper left", fontsize=8)
    return fig


def safe_softmax_passes_figure(x: torch.Tensor):
    """The three passes of safe softmax on one row ``x``: (1) the maximum ``m``; (2) the terms
    ``exp(x - m)``, all at most 1, and their sum ``d``; (3) the result ``exp(x - m) / d``.
    Returns the ``Figure``."""
    check_tensor("x", x)
    if x.dim() != 1 or x.numel() < 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 1-D floating-point row of at least 2 entries, got shape "
                         f"{tuple(x.shape)}, dtype {x.dtype}")
    xa = x.detach().to("cpu", torch.float64).numpy()
    m = float(xa.max())
    e = np.exp(xa - m)
    d = float(e.sum())
    y = e / d
    idx = np.arange(xa.size)
    fig, axes = subplots(1, 3, figsize=(9.6, 3.0), sharex=True)
    axes[0].bar(idx, xa, color=PALETTE[0])
    axes[0].axhline(m, color=PALETTE[3], ls="--", lw=1.2)
    axes[0].set_title(f"pass 1: m = max x = {m:.4g}", fontsize=9.5)
    axes[1].bar(idx, e, color=PALETTE[1])
    axes[1].axhline(1.0, color=INK, ls=":", lw=1)
    axes[1].set_title(f"pass 2: d = Σ exp(x − m) = {d:.4g}", fontsize=9.5)
    axes[2].bar(idx, y, color=PALETTE[2])
    axes[2].set_title(f"pass 3: y = exp(x − m) / d", fontsize=9.5)
    for ax in axes:
        ax.set_xlabel("column j")
    return fig
