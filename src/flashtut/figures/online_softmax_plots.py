"""Figures of chapter 04: the online normaliser's running state as blocks of a row stream in."""
from __future__ import annotations

import math

import torch

from ..checks import check_block, check_tensor
from ..softmax import merge_softmax_states
from .style import PALETTE, subplots


def _check_row(x) -> torch.Tensor:
    check_tensor("x", x)
    if x.dim() != 1 or x.numel() < 1 or not x.is_floating_point():
        raise ValueError(f"x must be a non-empty 1-D floating-point tensor (one row), got shape "
                         f"{tuple(x.shape)} and dtype {x.dtype}")
    return x


def running_states(x: torch.Tensor, block_size: int = 1) -> list[dict]:
    """The online normaliser's state after each block of ``block_size`` entries of the row ``x``.

    Each entry: ``end`` (entries read so far), ``m`` (running max), ``d`` (running sum of
    ``exp(x - m)``), ``rescale`` (the factor ``exp(m_old - m_new)`` applied to the old sum; 1 when
    the max did not move) and ``d_unrescaled``, the sum a loop that forgets to rescale would hold
    (each block's terms taken under the running max after that block, then added to a sum
    that is never rescaled, as the buggy loop of chapter 05 does). States are merged
    with ``flashtut.merge_softmax_states``, in float64.
    """
    _check_row(x)
    bs = check_block("block_size", block_size)
    xa = x.detach().to("cpu", torch.float64)
    m = torch.tensor(float("-inf"), dtype=torch.float64)
    d = torch.tensor(0.0, dtype=torch.float64)
    d_wrong = 0.0
    states = []
    for start in range(0, xa.numel(), bs):
        blk = xa[start:start + bs]
        m_blk = blk.max()
        d_blk = torch.exp(blk - m_blk).sum()
        m_old = m
        m, d = merge_softmax_states(m, d, m_blk, d_blk)
        d_wrong += float(torch.exp(blk - m).sum())      # terms under the new max, old sum kept as is
        states.append({
            "end": start + blk.numel(),
            "m": float(m),
            "d": float(d),
            "rescale": 1.0 if math.isinf(float(m_old)) else math.exp(float(m_old) - float(m)),
            "d_unrescaled": d_wrong,
        })
    return states


def running_state_figure(x: torch.Tensor, block_size: int = 4):
    """Two panels for one row ``x``: the entries with the running max after each block (top),
    and the running sum, rescaled when the max rises, against a sum that is never rescaled
    (bottom); each rescaling is labelled with its factor. Returns the matplotlib ``Figure``."""
    states = running_states(x, block_size)
    xa = x.detach().to("cpu", torch.float64)
    n = xa.numel()
    fig, (ax_x, ax_d) = subplots(2, 1, figsize=(7.0, 5.2), sharex=True)

    cols = torch.arange(n).tolist()
    ax_x.bar(cols, xa.tolist(), width=0.7, color=PALETTE[5], alpha=0.7, label="entries $x_j$")
    ends = [s["end"] for s in states]
    starts = [0] + ends[:-1]
    for k, (a, b) in enumerate(zip(starts, ends)):
        ax_x.hlines(states[k]["m"], a - 0.5, b - 0.5, color=PALETTE[3], lw=2.2,
                    label="running max $m$" if k == 0 else None)
        if k:
            ax_x.axvline(a - 0.5, color="#808080", lw=0.6, ls=":")
            ax_d.axvline(a - 0.5, color="#808080", lw=0.6, ls=":")
    ax_x.set_ylabel("value")
    ax_x.set_title(f"one row streamed in blocks of {block_size}", loc="left")
    ax_x.legend(loc="lower right", ncols=2)

    xs = [e - 0.5 for e in ends]                          # a state is known once its block is read
    ax_d.plot(xs, [s["d"] for s in states], "o-", color=PALETTE[0], lw=2, ms=5,
              label=r"running sum $d$, rescaled by $e^{m_{old}-m_{new}}$")
    ax_d.plot(xs, [s["d_unrescaled"] for s in states], "s--", color=PALETTE[1], ms=4,
              label="sum never rescaled (wrong)")
    true_d = float(torch.exp(xa - xa.max()).sum())
    ax_d.axhline(true_d, color=PALETTE[2], lw=1.2, ls="-.", label=r"exact: $\Sigma_j\, e^{x_j - \max(x)}$")
    for s in states:
        if s["rescale"] < 1.0:
            ax_d.annotate(f"×{s['rescale']:.2g}", (s["end"] - 0.5, s["d"]), textcoords="offset points",
                          xytext=(-6, -14), fontsize=8, color=PALETTE[0], ha="right")
    ax_d.set_ylim(bottom=0)
    ax_d.set_xlabel("entries read")
    ax_d.set_ylabel("running sum")
    ax_d.legend(loc="upper left")
    return fig


def accumulator_figure(maxima, fixed, buggy, exact: float, block_size: int):
    """Chapter 05: one coordinate of one query row's output estimate ``acc / l`` after each key
    block, for the loop that rescales (``fixed``) and the loop that does not (``buggy``),
    against the exact output (``exact``); the top panel shows the running maximum, so the
    reader sees that the two part ways exactly where it rises. Returns the ``Figure``."""
    seqs = {"maxima": maxima, "fixed": fixed, "buggy": buggy}
    n = len(maxima)
    for name, seq in seqs.items():
        if len(seq) != n or n == 0 or not all(math.isfinite(float(x)) for x in seq):
            raise ValueError(f"{name} must be a non-empty list of finite numbers, one per block "
                             f"(got {len(seq)}, expected {len(maxima) or 'at least 1'})")
    if not math.isfinite(float(exact)):
        raise ValueError(f"exact must be a finite number, got {exact!r}")
    bs = check_block("block_size", block_size)
    keys = [bs * (i + 1) for i in range(n)]
    fig, (ax_m, ax_o) = subplots(2, 1, figsize=(7.0, 4.8), sharex=True, height_ratios=(1, 2))
    ax_m.step(keys, [float(x) for x in maxima], where="post", color=PALETTE[3], lw=2)
    ax_m.set_ylabel("running max $m$")
    ax_m.set_title(f"one query row, keys in blocks of {bs}", loc="left")
    ax_o.plot(keys, [float(x) for x in fixed], "o-", color=PALETTE[0], ms=5,
              label=r"rescaled by $e^{m_{old}-m_{new}}$")
    ax_o.plot(keys, [float(x) for x in buggy], "s--", color=PALETTE[1], ms=5,
              label="never rescaled (the bug)")
    ax_o.axhline(float(exact), color=PALETTE[2], lw=1.2, ls="-.", label="exact output")
    ax_o.set_xlabel("keys read")
    ax_o.set_ylabel("output estimate acc / ℓ")
    ax_o.legend(loc="best")
    return fig
