"""Figures and tables of chapter 07 (Triton): the grid of programs, and the measured speed.

The measured ones take the rows of ``book/data/triton_h200.json`` (or rows of the same shape
measured live on the reader's GPU). Every figure function returns a matplotlib Figure in the
book's style; ``results_table`` returns Markdown.
"""
from __future__ import annotations

import json

from matplotlib.patches import Rectangle

from .style import INK, PALETTE, subplots

_IMPL_STYLE = {"triton": (PALETTE[0], "o", "flashtut Triton"),
               "sdpa-flash": (PALETTE[1], "s", "SDPA flash (FlashAttention-2)"),
               "naive": (PALETTE[3], "^", "naive (PyTorch ops)")}


def load_h200() -> dict:
    """The committed H200 measurements of the Triton kernels (``book/data/triton_h200.json``)."""
    from ..results_data import data_path
    return json.loads(data_path("triton_h200.json").read_text())


def program_grid_figure(n_q: int = 300, n_k: int = 300, block_m: int = 64, block_n: int = 64,
                        causal: bool = True):
    """The forward kernel's work split: one program per query block (a row of tiles); per tile,
    whether the program skips it (above the diagonal), computes it with a mask (crosses the
    diagonal or the end of the keys) or without one."""
    n_mb = -(-n_q // block_m)
    n_nb = -(-n_k // block_n)
    fig, ax = subplots(figsize=(3.6 + 0.55 * n_nb, 0.6 + 0.55 * n_mb))
    colors = {"skip": "none", "masked": PALETTE[1], "free": PALETTE[0]}
    for i in range(n_mb):
        q0, q1 = i * block_m, min((i + 1) * block_m, n_q)
        for j in range(n_nb):
            k0, k1 = j * block_n, min((j + 1) * block_n, n_k)
            if causal and k0 > q1 - 1:
                kind = "skip"
            elif (causal and k1 - 1 > q0) or k1 - k0 < block_n:
                kind = "masked"
            else:
                kind = "free"
            ax.add_patch(Rectangle((j, n_mb - 1 - i), 1, 1, facecolor=colors[kind], edgecolor=INK,
                                   linewidth=0.6, hatch="//" if kind == "skip" else None, alpha=0.85))
        ax.text(-0.15, n_mb - 0.5 - i, f"pid {i}", ha="right", va="center", fontsize=8)
    ax.set_xlim(-1.2, n_nb)
    ax.set_ylim(0, n_mb)
    ax.set_aspect("equal")
    ax.axis("off")
    handles = [Rectangle((0, 0), 1, 1, facecolor=colors[k], edgecolor=INK, hatch="//" if k == "skip" else None)
               for k in ("free", "masked", "skip")]
    ax.legend(handles, ["no mask (first loop)", "masked (second loop)", "skipped"],
              loc="center left", bbox_to_anchor=(1.02, 0.5), ncol=1, fontsize=8)
    ax.set_title(f"Nq={n_q}, Nk={n_k}, BLOCK_M={block_m}, BLOCK_N={block_n}"
                 + (", causal" if causal else ""), fontsize=9)
    return fig


def speed_vs_n_figure(rows, title: str = ""):
    """TFLOP/s against N for each implementation; forward and backward, non-causal and causal.
    ``rows``: dicts with impl, N, causal, fwd_tflops, bwd_tflops."""
    fig, axes = subplots(2, 2, figsize=(9.5, 6.4), sharex=True)
    for r, causal in enumerate((False, True)):
        for c, pas in enumerate(("fwd", "bwd")):
            ax = axes[r][c]
            for impl, (color, marker, label) in _IMPL_STYLE.items():
                pts = sorted((x["N"], x[f"{pas}_tflops"]) for x in rows
                             if x["impl"] == impl and bool(x["causal"]) == causal)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label)
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{'backward' if pas == 'bwd' else 'forward'}, {'causal' if causal else 'not causal'}",
                         fontsize=9)
            if c == 0:
                ax.set_ylabel("TFLOP/s")
            if r == 1:
                ax.set_xlabel("sequence length N (batch = 16384 / N)")
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def ratio_figure(rows):
    """Ours over SDPA flash, forward and backward, for every shape of the issue's protocol,
    with the targets (forward 1.0x, backward 0.8x)."""
    labels = [f"{'fp16' if r['dtype'] == 'float16' else 'bf16'} D{r['D']} N{r['N'] // 1024}k"
              + (" c" if r["causal"] else "") for r in rows]
    fig, ax = subplots(figsize=(10, 3.6))
    x = range(len(rows))
    w = 0.4
    ax.bar([i - w / 2 for i in x], [r["fwd_ratio"] for r in rows], w, color=PALETTE[0], label="forward")
    ax.bar([i + w / 2 for i in x], [r["bwd_ratio"] for r in rows], w, color=PALETTE[2], label="backward")
    ax.axhline(1.0, color=PALETTE[0], linestyle="--", linewidth=1, label="forward target 1.0x")
    ax.axhline(0.8, color=PALETTE[2], linestyle=":", linewidth=1, label="backward target 0.8x")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s ratio to SDPA flash")
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    return fig


def results_table(rows) -> str:
    """Markdown table: shape, dtype, causal, forward and backward TFLOP/s of ours and of SDPA
    flash, their ratios, and (where measured) the max errors against the fp32 reference."""
    head = ("| D | N | dtype | causal | fwd ours | fwd SDPA | ratio | bwd ours | bwd SDPA | ratio "
            "| max err ours (o, dq, dk, dv) | max err SDPA flash |\n"
            "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|\n")
    lines = []
    for r in rows:
        errs = ["", ""]
        if "err_vs_fp32_triton" in r:
            errs = [", ".join(f"{r[key][n]:.1e}" for n in ("o", "dq", "dk", "dv"))
                    for key in ("err_vs_fp32_triton", "err_vs_fp32_sdpa_flash")]
        lines.append(f"| {r['D']} | {r['N']} | {r['dtype']} | {'yes' if r['causal'] else 'no'} "
                     f"| {r['fwd_tflops_triton']:.0f} | {r['fwd_tflops_sdpa_flash']:.0f} | {r['fwd_ratio']:.2f}x "
                     f"| {r['bwd_tflops_triton']:.0f} | {r['bwd_tflops_sdpa_flash']:.0f} | {r['bwd_ratio']:.2f}x "
                     f"| {errs[0]} | {errs[1]} |")
    return head + "\n".join(lines)
