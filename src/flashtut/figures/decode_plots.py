"""Figures for split-KV decoding (chapter 10): how partial softmax states merge, and why
splitting the keys fills a GPU's SMs during decoding."""
from __future__ import annotations

import math

import torch
from matplotlib.ticker import MaxNLocator

from ..checks import check_block, check_float_dtype, check_scale, check_tensor
from ..decode import split_bounds, suggest_num_splits
from ..reference import attention_lse
from .style import PALETTE, subplots


def _demo_row(n_keys: int, head_dim: int, seed: int):
    """One query row and its keys, with a few keys aligned with the query so that the
    largest scores sit in one split and the merge weights are visibly unequal."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(n_keys, head_dim, generator=gen, dtype=torch.float64)
    hot = torch.randint(n_keys // 2, n_keys, (3,), generator=gen)
    k[hot] += 0.8 * q
    return q, k


def plot_split_merge(q=None, k=None, num_splits: int = 4, scale: float | None = None, seed: int = 0):
    """Three panels for one query row split into ``num_splits`` key chunks.

    (a) the scaled scores; (b) each split's own softmax, normalised over its chunk (dashed),
    against the softmax over all keys (solid); (c) the merge weights ``exp(lse_s - lse)``,
    which sum to 1: multiplying each split's probabilities by its weight gives exactly the
    global probabilities, and the same weights combine the partial outputs.

    ``q`` is ``(D,)`` and ``k`` is ``(Nk, D)``; by default a random row of 96 keys, D = 16.
    Returns the matplotlib figure.
    """
    num_splits = check_block("num_splits", num_splits)
    if (q is None) != (k is None):
        raise ValueError("q and k go together: pass both, or neither for the random demo row")
    if q is None:
        q, k = _demo_row(96, 16, seed)
    for name, t, dims, layout in (("q", q, 1, "(D,)"), ("k", k, 2, "(Nk, D)")):
        check_tensor(name, t)
        check_float_dtype(name, t)
        if t.dim() != dims:
            raise ValueError(f"{name} must be a {dims}-D tensor {layout}, got shape {tuple(t.shape)}")
    if k.shape[1] != q.shape[0] or k.shape[0] < 1:
        raise ValueError(f"k must be (Nk, D) with Nk >= 1 and D = {q.shape[0]} like q, "
                         f"got {tuple(k.shape)}")
    q = q.detach().to("cpu", torch.float64)
    k = k.detach().to("cpu", torch.float64)
    n_keys, head_dim = k.shape
    scale = check_scale(scale, head_dim)
    q4, k4 = q.reshape(1, 1, 1, head_dim), k.reshape(1, 1, n_keys, head_dim)
    scores = (k @ q) * scale
    lse = float(attention_lse(q4, k4, scale=scale))
    bounds = [b for b in split_bounds(n_keys, num_splits) if b[0] < b[1]]
    lse_s = [float(attention_lse(q4, k4[:, :, a:b], scale=scale)) for a, b in bounds]
    weights = [math.exp(ls - lse) for ls in lse_s]

    fig, (ax_s, ax_p, ax_w) = subplots(1, 3, figsize=(11, 3.2),
                                       gridspec_kw={"width_ratios": [1.3, 1.3, 0.8]})
    idx = torch.arange(n_keys)
    p_global = torch.exp(scores - lse)
    for s, (a, b) in enumerate(bounds):
        colour = PALETTE[s % len(PALETTE)]
        for ax in (ax_s, ax_p):
            ax.axvspan(a - 0.5, b - 0.5, color=colour, alpha=0.12, lw=0)
        ax_s.plot(idx[a:b], scores[a:b], ".", color=colour, ms=4)
        ax_p.plot(idx[a:b], torch.exp(scores[a:b] - lse_s[s]), "--", color=colour, lw=1,
                  label="within split" if s == 0 else None)
    ax_p.plot(idx, p_global, "-", color="#808080", lw=1.2, label="over all keys")
    ax_s.set(title="(a) scores $q\\cdot k_j\\,/\\sqrt{d}$", xlabel="key $j$")
    ax_p.set(title="(b) softmax within each split vs. global", xlabel="key $j$", ylabel="probability")
    ax_p.legend(loc="upper left", fontsize=8)
    labels = [f"split {s}\n[{a}, {b})" for s, (a, b) in enumerate(bounds)]
    bars = ax_w.bar(range(len(bounds)), weights,
                    color=[PALETTE[s % len(PALETTE)] for s in range(len(bounds))])
    for bar, w in zip(bars, weights):
        ax_w.annotate(f"{w:.3f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=8)
    ax_w.set_xticks(range(len(bounds)), labels, fontsize=7)
    ax_w.set(title="(c) merge weights $e^{\\,\\mathrm{lse}_s-\\mathrm{lse}}$", ylim=(0, 1.1))
    return fig


def plot_sm_fill(num_sms: int = 132, batch_heads=(8, 32, 128), max_splits: int = 20,
                 n_keys: int = 32768, device_name: str = "H200"):
    """Share of a GPU's SMs that get a thread block in a decoding step (one query row per
    sequence), against the number of key splits, for several values of ``batch * heads``.

    Blocks beyond the SM count wait for a second wave, so the share is capped at 1. The
    marker on each curve is :func:`flashtut.decode.suggest_num_splits` for that case.
    Returns the matplotlib figure.
    """
    num_sms = check_block("num_sms", num_sms)
    max_splits = check_block("max_splits", max_splits)
    n_keys = check_block("n_keys", n_keys)
    batch_heads = [check_block("batch_heads entries", bh) for bh in batch_heads]
    fig, ax = subplots(figsize=(6, 3.2))
    splits = list(range(1, max_splits + 1))
    for i, bh in enumerate(batch_heads):
        share = [min(bh * s, num_sms) / num_sms for s in splits]
        colour = PALETTE[i % len(PALETTE)]
        ax.plot(splits, share, "-o", ms=3, color=colour, label=f"B·H = {bh}")
        pick = suggest_num_splits(1, bh, 1, n_keys, num_sms)
        if pick <= max_splits:
            ax.plot([pick], [min(bh * pick, num_sms) / num_sms], "s", ms=9, mfc="none",
                    color=colour)
    ax.set(xlabel="num_splits", ylabel="share of SMs with work",
           title=f"Decoding, Nq = 1, on {num_sms} SMs ({device_name}); squares: suggest_num_splits",
           ylim=(0, 1.05))
    ax.title.set_fontsize(9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="lower right")
    return fig


__all__ = ["plot_split_merge", "plot_sm_fill"]
