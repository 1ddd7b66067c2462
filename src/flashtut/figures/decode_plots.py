"""Figures for split-KV decoding (chapter 10): how partial softmax states merge, and why
splitting the keys fills a GPU's SMs during decoding."""
from __future__ import annotations

import math

import torch
from matplotlib.ticker import MaxNLocator

from ..checks import check_block, check_float_dtype, check_scale, check_tensor
from ..decode import decode_num_splits, split_bounds, suggest_num_splits
from ..reference import attention_lse
from .style import PALETTE, impl_style, subplots


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


def plot_decode_splits(num_sms: int = 132, kv_heads: int = 8, batches=(1, 2, 4, 8, 16, 32, 64, 128),
                       lengths=(1024, 4096, 16384, 65536), device_name: str = "H200"):
    """The decode kernel's split count (:func:`flashtut.decode.decode_num_splits`) against the
    batch, one curve per cache length, and (right) the programs per SM it gives. The kernel packs
    a key/value head's query heads into one program, so an unsplit launch has ``batch * kv_heads``
    programs. Returns the matplotlib figure."""
    num_sms, kv_heads = check_block("num_sms", num_sms), check_block("kv_heads", kv_heads)
    batches = [check_block("batches entries", b) for b in batches]
    lengths = [check_block("lengths entries", n) for n in lengths]
    fig, (ax_s, ax_p) = subplots(1, 2, figsize=(8, 3.2))
    for i, n in enumerate(lengths):
        splits = [decode_num_splits(b, kv_heads, n, num_sms) for b in batches]
        label = f"{n // 1024}k keys" if n >= 1024 else f"{n} keys"
        ax_s.plot(batches, splits, "-o", ms=3, color=PALETTE[i % len(PALETTE)], label=label)
        ax_p.plot(batches, [b * kv_heads * s / num_sms for b, s in zip(batches, splits)], "-o", ms=3,
                  color=PALETTE[i % len(PALETTE)])
    ax_p.axhline(4, color="#999999", linestyle="--", linewidth=1)
    for ax in (ax_s, ax_p):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("batch (sequences)")
    ax_s.set(ylabel="num_splits", title=f"(a) splits, {kv_heads} KV heads, {num_sms} SMs ({device_name})")
    ax_p.set(ylabel="programs per SM", title="(b) programs per SM (dashed: the target, 4)")
    for ax in (ax_s, ax_p):
        ax.title.set_fontsize(9)
    ax_s.legend(fontsize=8)
    return fig


def plot_decode_bandwidth(rows, copy_gb_per_s: float, dtype: str = "bfloat16"):
    """Measured decode attention (``flashtut.bench decode`` rows): the fraction of the copy
    bandwidth each implementation reaches against the cache length, one panel per batch; ours
    over a contiguous and a paged cache, and SDPA's fastest form at each length. The panels stack
    in one column over a shared axis, with the legend under them, off the data: on a phone the
    figure scales to the column's width, and a column of panels keeps its text about 1.5 times
    the size that panels side by side would. Returns the matplotlib figure."""
    if not (copy_gb_per_s and copy_gb_per_s > 0):
        raise ValueError(f"copy_gb_per_s must be a positive bandwidth, got {copy_gb_per_s!r}")
    ok = [r for r in rows if r.get("kind") == "decode" and r.get("status") == "ok" and r.get("dtype") == dtype]
    batches = sorted({r["B"] for r in ok})
    if not batches:
        raise ValueError(f"no timed decode row in {dtype}")
    fig, axes = subplots(len(batches), 1, figsize=(4.6, 2.4 * len(batches) + 1.0), squeeze=False,
                         sharex=True)
    for ax, B in zip(axes[:, 0], batches):
        mine = [r for r in ok if r["B"] == B]
        lines = {"triton (contiguous)": [r for r in mine if r["impl"] == "triton-decode" and r["layout"] == "contiguous"]}
        for ps in sorted({r["page_size"] for r in mine if r["layout"] == "paged"}, reverse=True):
            lines[f"triton (paged, {ps})"] = [r for r in mine if r["layout"] == "paged" and r["page_size"] == ps]
        best = {}
        for r in mine:
            if r["impl"].startswith("sdpa") and (r["N"] not in best or r["ms"] < best[r["N"]]["ms"]):
                best[r["N"]] = r
        lines["SDPA, best form"] = list(best.values())
        for i, (label, rs) in enumerate(lines.items()):
            rs = sorted(rs, key=lambda r: r["N"])
            if not rs:
                continue
            style = impl_style("sdpa-flash" if label.startswith("SDPA") else "triton")
            if "paged" in label:
                style = dict(style, linestyle=[":", "-."][i % 2], marker="s")
            ax.plot([r["N"] for r in rs], [r["gb_per_s"] / copy_gb_per_s for r in rs], label=label, ms=4, **style)
        ax.axhline(0.8, color="#999999", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set(ylim=(0, 1.1), title=f"batch {B}, {dtype}")
    axes[-1][0].set_xlabel("cache length (keys)")
    fig.supylabel("fraction of copy bandwidth", fontsize=11)
    handles = {}
    for ax in axes[:, 0]:                       # every series once, whichever panel has it
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=2)
    return fig


__all__ = ["plot_split_merge", "plot_sm_fill", "plot_decode_splits", "plot_decode_bandwidth"]
