"""Chapter 01's roofline figure (Williams, Waterman and Patterson, 2009): attainable FLOP/s
against arithmetic intensity, one roof per GPU, with attention's kernels placed on it."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..hardware import attainable_tflops
from .style import INK, PALETTE, subplots

# dark enough for text on a white page and light enough on a dark one (no yellow)
_POINT_COLORS = [PALETTE[3], PALETTE[4], PALETTE[5], PALETTE[2]]


def _check_roofs(roofs) -> list[tuple[str, float, float]]:
    out = []
    for r in roofs:
        if len(r) != 3:
            raise ValueError(f"roofs: each entry must be (label, peak_tflops, bandwidth_gbps), got {r!r}")
        label, peak, bw = r
        if not (float(peak) > 0 and float(bw) > 0):
            raise ValueError(f"roofs: peak and bandwidth of {label!r} must be positive, got {peak}, {bw}")
        out.append((str(label), float(peak), float(bw)))
    if not out:
        raise ValueError("roofs: need at least one (label, peak_tflops, bandwidth_gbps)")
    return out


def roofline_figure(roofs: Sequence[tuple[str, float, float]],
                    points: Sequence[tuple[str, float]] = (),
                    title: str | None = None, x_range: tuple[float, float] = (0.1, 1e4)):
    """Draw one roof per entry of ``roofs`` = ``(label, peak TFLOP/s, bandwidth GB/s)`` on log
    axes, mark each ridge point, and place each ``(label, FLOP per byte)`` of ``points`` on the
    first roof: a kernel's dot sits on the slanted part when it is memory-bound and on the flat
    part when it is compute-bound. Returns the matplotlib ``Figure``."""
    roofs = _check_roofs(roofs)
    lo, hi = x_range
    if not (0 < lo < hi):
        raise ValueError(f"x_range must be (low, high) with 0 < low < high, got {x_range}")
    fig, ax = subplots(figsize=(7.2, 4.4))
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    roof_colors = [PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[7]]
    for i, (label, peak, bw) in enumerate(roofs):
        color = roof_colors[i % len(roof_colors)]
        y = np.minimum(peak, bw * 1e9 * x / 1e12)
        ridge = peak * 1e12 / (bw * 1e9)
        ax.plot(x, y, color=color, lw=2.2 if i == 0 else 1.4, alpha=1.0 if i == 0 else 0.8,
                label=f"{label}: {peak:,.0f} TFLOP/s, {bw:,.0f} GB/s, ridge {ridge:,.0f} FLOP/B")
        ax.plot([ridge], [peak], "o", color=color, ms=4)
    label0, peak0, bw0 = roofs[0]
    # kernels of equal intensity (QK^T and PV at one shape) share one dot and one label
    groups: dict[float, list[str]] = {}
    for name, intensity in points:
        if not float(intensity) > 0:
            raise ValueError(f"points: the intensity of {name!r} must be positive, got {intensity}")
        key = next((k for k in groups if abs(k - float(intensity)) <= 1e-3 * k), float(intensity))
        groups.setdefault(key, []).append(str(name))
    for j, (intensity, names) in enumerate(sorted(groups.items())):
        y = attainable_tflops(intensity, peak0, bw0)
        ax.axvline(intensity, color=INK, lw=0.8, ls=":", alpha=0.7)
        ax.plot([intensity], [y], "D", color=_POINT_COLORS[j % len(_POINT_COLORS)], ms=7, zorder=5)
        ax.annotate("\n".join(names) + f"\n{intensity:,.1f} FLOP/B, {y:,.0f} TFLOP/s", (intensity, y),
                    textcoords="offset points", xytext=(8, -34), fontsize=8.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of device-memory traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    return fig
