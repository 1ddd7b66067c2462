"""Chapter 02's figures: how naive attention's memory grows with N, where it stops fitting, and
the bytes each of its kernels moves against one fused kernel."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from ..costs.memory import MiB, attention_memory_table, max_seq_len
from ..costs.traffic import Traffic
from .style import INK, PALETTE, subplots


def attention_memory_figure(B: int, H: int, D: int, dtype: torch.dtype = torch.float16,
                            Ns: Sequence[int] = tuple(2 ** k for k in range(9, 18)),
                            capacities: Mapping[str, float] | None = None,
                            score_dtype: torch.dtype | None = None,
                            measured: Mapping[int, float] | None = None,
                            measured_label: str = "measured peak extra memory"):
    """Bytes against sequence length ``N`` on log axes: Q, K, V and O together (linear in N) and
    the score matrices S and P (quadratic), with a dashed line per GPU capacity in ``capacities``
    (label -> bytes) and a marker where S and P stop fitting. ``measured`` (N -> bytes) adds
    measured peaks, labelled ``measured_label``. Returns the matplotlib ``Figure``."""
    Ns = sorted(int(n) for n in Ns)
    if len(Ns) < 2 or Ns[0] < 1:
        raise ValueError(f"Ns must hold at least two positive lengths, got {Ns}")
    tables = [attention_memory_table(B, H, n, D, dtype, score_dtype=score_dtype) for n in Ns]
    io = np.array([t[6].bytes for t in tables], dtype=float)      # total Q, K, V, O
    sp = np.array([t[7].bytes for t in tables], dtype=float)      # total S, P
    s_dtype = tables[0][4].dtype
    fig, ax = subplots(figsize=(7.0, 5.0))
    ax.plot(Ns, io / MiB, "o-", color=PALETTE[0], label="Q, K, V, O together (grows like N)")
    ax.plot(Ns, sp / MiB, "s-", color=PALETTE[3], label=f"S and P, {s_dtype} (grows like N²)")
    for i, (label, cap) in enumerate((capacities or {}).items()):
        color = (PALETTE[4], PALETTE[5], PALETTE[2], PALETTE[7])[i % 4]
        n_max = max_seq_len(cap, B, H, getattr(torch, s_dtype), n_matrices=2)
        ax.axhline(cap / MiB, color=color, ls="--", lw=1,
                   label=f"{label}: S and P fit up to N = {n_max:,}")
        ax.plot([n_max], [cap / MiB], "x", color=color, ms=9, mew=2)
    if measured:
        mN = sorted(measured)
        ax.plot(mN, [measured[n] / MiB for n in mN], "^", color=PALETTE[1], ms=8,
                label=measured_label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("MiB")
    ax.set_title(f"B={B}, H={H}, D={D}, inputs {str(dtype).replace('torch.', '')}", color=INK)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    return fig


def traffic_figure(kernels: Sequence[Traffic], fused: Traffic | None = None):
    """Horizontal bars of MiB read and written by each kernel (and by ``fused``, drawn last), so
    the round trips of S and P through device memory are visible. Returns the ``Figure``."""
    rows = list(kernels) + ([fused] if fused is not None else [])
    if not rows:
        raise ValueError("kernels: need at least one Traffic")
    fig, ax = subplots(figsize=(7.0, 0.55 * len(rows) + 1.4))
    y = np.arange(len(rows))[::-1]
    reads = np.array([k.bytes_read for k in rows], dtype=float) / MiB
    writes = np.array([k.bytes_written for k in rows], dtype=float) / MiB
    ax.barh(y, reads, color=PALETTE[0], label="read from device memory")
    ax.barh(y, writes, left=reads, color=PALETTE[1], label="written to device memory")
    for yi, r, w in zip(y, reads, writes):
        ax.text(r + w, yi, f"  {r + w:,.0f} MiB", va="center", fontsize=8.5)
    ax.set_yticks(y, [k.name for k in rows])
    ax.set_xlabel("MiB moved")
    ax.set_xlim(0, (reads + writes).max() * 1.3)
    ax.grid(axis="y", visible=False)
    ax.legend(loc="lower right", fontsize=8)
    return fig
