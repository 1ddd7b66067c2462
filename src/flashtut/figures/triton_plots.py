"""Figures and tables of chapter 07 (Triton): the grid of programs, and the measured speed.

The measured ones take ``flashtut.bench`` speed rows (``results_data.load_results(
"triton_h200.json")`` and ``"triton_h200_sweep.json"``, or rows measured live on the reader's
GPU); nothing here opens a file. Every figure function returns a matplotlib Figure in the book's
style; ``results_table`` returns Markdown. ``versus_flash_table`` and
``final_measurement_markdown`` turn speed rows (``bench_h200_kernels.json``, the Triton and the
CUDA kernels against SDPA flash) into the tables of the perf logs' "Final measurement" sections;
``untuned_vs_tuned_lines`` compares that run with the autotuned one.
"""
from __future__ import annotations

from matplotlib.patches import Rectangle

from ..bench.report import SHORT_DTYPE
from .style import INK, PALETTE, subplots

_IMPL_STYLE = {"triton": (PALETTE[0], "o", "flashtut Triton"),
               "sdpa-flash": (PALETTE[1], "s", "SDPA flash (FlashAttention-2)"),
               "naive": (PALETTE[3], "^", "naive (PyTorch ops)")}


def side_by_side(rows, impl: str = "triton", other: str = "sdpa-flash") -> list[dict]:
    """One dict per shape measured for both ``impl`` and ``other`` (speed rows, status ok): D, N,
    B, H, dtype, causal, ``{mode}_tflops_{name}``, ``{mode}_ms_{name}``, ``{mode}_ratio`` (impl /
    other), ``err_vs_fp32_{name}`` (the errors of both passes, where recorded) and ``accuracy_ok``
    (impl's FlashAttention criterion, where recorded); ``name`` is the implementation with ``-``
    written ``_``. In the order the rows first name each shape."""
    shapes: dict = {}
    for r in rows:
        if r.get("kind") != "speed" or r.get("status") != "ok" or r.get("impl") not in (impl, other):
            continue
        key = (r["D"], r["N"], r["dtype"], bool(r["causal"]))
        e = shapes.setdefault(key, {"D": r["D"], "N": r["N"], "B": r["B"], "H": r["H"], "dtype": r["dtype"],
                                    "causal": bool(r["causal"])})
        name = r["impl"].replace("-", "_")
        e[f"{r['mode']}_tflops_{name}"] = r["tflops"]
        e[f"{r['mode']}_ms_{name}"] = r.get("ms")
        if r.get("err"):
            e.setdefault(f"err_vs_fp32_{name}", {}).update(r["err"])
        if r["impl"] == impl and r.get("fa_criterion") is not None:
            e["accuracy_ok"] = e.get("accuracy_ok", True) and bool(r["fa_criterion"])
    a, b = impl.replace("-", "_"), other.replace("-", "_")
    out = []
    for e in shapes.values():
        if all(f"{m}_tflops_{a}" in e and f"{m}_tflops_{b}" in e for m in ("fwd", "bwd")):
            for m in ("fwd", "bwd"):
                e[f"{m}_ratio"] = round(e[f"{m}_tflops_{a}"] / e[f"{m}_tflops_{b}"], 3)
            out.append(e)
    return out


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
    ``rows``: ``flashtut.bench`` speed rows."""
    fig, axes = subplots(2, 2, figsize=(9.5, 6.4), sharex=True)
    for r, causal in enumerate((False, True)):
        for c, pas in enumerate(("fwd", "bwd")):
            ax = axes[r][c]
            for impl, (color, marker, label) in _IMPL_STYLE.items():
                pts = sorted((x["N"], x["tflops"]) for x in rows
                             if x.get("kind") == "speed" and x["impl"] == impl and x["mode"] == pas
                             and x.get("status") == "ok" and bool(x["causal"]) == causal)
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
    """Ours over SDPA flash, forward and backward, for every shape measured for both (speed rows),
    with the targets (forward 1.0x, backward 0.8x)."""
    rows = side_by_side(rows)
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
    # above the axes, not over the bars (a legend inside covered the right-hand bars)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, ncol=4, loc="outside upper center")
    return fig


def _error_ratio(r) -> str:
    """The worst of ours over SDPA flash's error against the fp32 reference, over o, dq, dk, dv."""
    ours, theirs = r.get("err_vs_fp32_triton", {}), r.get("err_vs_fp32_sdpa_flash", {})
    ratios = [ours[n] / theirs[n] for n in ("o", "dq", "dk", "dv") if ours.get(n) is not None and theirs.get(n)]
    return f"{max(ratios):.2f}" if ratios else "-"


def results_table(rows) -> str:
    """Markdown table, narrow enough for a phone: shape, dtype, causal, forward and backward TFLOP/s of
    ours with the ratio to SDPA flash in brackets, and (where measured) the worst ratio of our max
    error against the fp32 reference to SDPA flash's, over o, dq, dk and dv (the yardstick asks for at
    most 2). ``rows``: speed rows of ``triton`` and ``sdpa-flash``."""
    rows = side_by_side(rows)
    head = ("| D | N | dtype | causal | fwd TFLOP/s (x SDPA) | bwd TFLOP/s (x SDPA) | error / SDPA's |\n"
            "|---:|---:|---|---|---:|---:|---:|\n")
    lines = [f"| {r['D']} | {r['N']} | {SHORT_DTYPE.get(r['dtype'], r['dtype'])} | {'yes' if r['causal'] else 'no'} "
             f"| {r['fwd_tflops_triton']:.0f} ({r['fwd_ratio']:.2f}) | {r['bwd_tflops_triton']:.0f} ({r['bwd_ratio']:.2f}) "
             f"| {_error_ratio(r)} |" for r in rows]
    return head + "\n".join(lines)




def versus_flash_rows(rows, impl: str) -> list[dict]:
    """One dict per (D, N, dtype, causal) measured for ``impl`` in ``flashtut.bench`` speed rows
    (``book/data/bench_h200_kernels.json``): TFLOP/s of ``impl`` and of SDPA flash per pass
    (``fwd_ours``, ``fwd_flash``, ``bwd_ours``, ``bwd_flash``; a pass not measured is absent) and
    whether every pass of ``impl`` met the accuracy check run before timing (``checked``).
    Sorted D = 128 first, then N, dtype (fp16 first) and causal."""
    found: dict = {}
    for r in rows:
        if r.get("kind") != "speed" or r.get("status") != "ok" or r.get("impl") not in (impl, "sdpa-flash"):
            continue
        key = (r["D"], r["N"], r["dtype"], bool(r["causal"]))
        side = "ours" if r["impl"] == impl else "flash"
        entry = found.setdefault(key, {"D": key[0], "N": key[1], "dtype": key[2], "causal": key[3],
                                       "checked": True})
        entry[f"{r['mode']}_{side}"] = r["tflops"]
        if side == "ours":
            entry["checked"] = entry["checked"] and bool(r.get("passed"))
    order = {"float16": 0, "bfloat16": 1}
    out = [e for e in found.values() if any(f"{m}_ours" in e and f"{m}_flash" in e for m in ("fwd", "bwd"))]
    return sorted(out, key=lambda e: (-e["D"], e["N"], order.get(e["dtype"], 2), e["causal"]))


def versus_flash_table(rows, impl: str, modes=("fwd", "bwd")) -> str:
    """Markdown: for each shape, TFLOP/s of ``impl`` and of SDPA flash per pass in ``modes`` and
    their ratio (ours / flash; the FLOP count is the same, so it is also flash's time / ours),
    then one line per pass with the smallest and largest ratio. Rows: ``flashtut.bench`` speed
    rows holding ``impl`` and ``sdpa-flash``."""
    for m in modes:
        if m not in ("fwd", "bwd"):
            raise ValueError(f"modes: got {m!r}; accepted: 'fwd' and/or 'bwd'")
    table = versus_flash_rows(rows, impl)
    if not table:
        raise ValueError(f"rows: no speed rows of both {impl!r} and 'sdpa-flash'")
    head = "| D | N | dtype | causal |"
    rule = "|---:|---:|---|---|"
    for m in modes:
        head += f" {m} ours | {m} SDPA flash | {m} ratio |"
        rule += "---:|---:|---:|"
    head += " checked |"
    rule += "---|"
    lines = [head, rule]
    ratios: dict = {m: [] for m in modes}
    for e in table:
        line = f"| {e['D']} | {e['N']} | {SHORT_DTYPE.get(e['dtype'], e['dtype'])} | {'yes' if e['causal'] else 'no'} |"
        for m in modes:
            ours, flash = e.get(f"{m}_ours"), e.get(f"{m}_flash")
            if ours is None or flash is None:
                line += " | | |"
                continue
            ratios[m].append(ours / flash)
            line += f" {ours:.1f} | {flash:.1f} | {ours / flash:.2f} |"
        line += " yes |" if e["checked"] else " **no** |"
        lines.append(line)
    names = {"fwd": "forward", "bwd": "backward"}
    summary = [f"- {names[m]}: ours / SDPA flash from {min(v):.2f} to {max(v):.2f} over {len(v)} shapes"
               for m, v in ratios.items() if v]
    return "\n".join(lines) + "\n\n" + "\n".join(summary)


def final_measurement_markdown(rows, provenance: dict, impl: str, modes=("fwd", "bwd")) -> str:
    """The perf logs' "Final measurement" section body: the ``provenance`` of one committed file
    (an entry of ``results_data.load_results``'s second list) and :func:`versus_flash_table` of its
    ``rows``. Printed by

        python -c "from flashtut import results_data as d; from flashtut.figures import triton_plots as t; \
            rows, prov = d.load_results('bench_h200_kernels.json'); print(t.final_measurement_markdown(rows, prov[0], 'triton'))"
    """
    p = provenance
    dev = p.get("device") or {}
    ver = p.get("versions") or {}
    cfg = p.get("config") or {}
    head = (f"Data: `book/data/{p['file']}` ({dev.get('name', '?')}, {p.get('date', '?')}; torch "
            f"{ver.get('torch', '?')}, triton {ver.get('triton', '?')}, CUDA {ver.get('cuda', '?')}). "
            f"TFLOP/s per the protocol ({cfg.get('tokens')} tokens per batch, hidden {cfg.get('hidden')}), "
            f"timer `{rows[0].get('timer', '?')}`; \"checked\": the error check before timing passed. "
            f"Command: `{p.get('command')}`.")
    return head + "\n\n" + versus_flash_table(rows, impl, modes)


def untuned_vs_tuned_lines(rows, tuned_rows) -> str:
    """Markdown lines comparing Triton rows of a ``flashtut.bench`` file (autotuning off) with
    the autotuned run (speed rows of ``book/data/triton_h200.json``), shape by shape: the
    smallest and largest ratio untuned / autotuned TFLOP/s per pass and per head dimension."""
    tuned = {(r["D"], r["N"], r["dtype"], bool(r["causal"])): r for r in side_by_side(tuned_rows)}
    ratios: dict = {}
    for e in versus_flash_rows(rows, "triton"):
        t = tuned.get((e["D"], e["N"], e["dtype"], e["causal"]))
        if t is None:
            continue
        for m in ("fwd", "bwd"):
            if f"{m}_ours" in e:
                ratios.setdefault((m, e["D"]), []).append(e[f"{m}_ours"] / t[f"{m}_tflops_triton"])
    if not ratios:
        raise ValueError("rows, tuned_rows: no shape measured in both")
    names = {"fwd": "forward", "bwd": "backward"}
    return "\n".join(f"- {names[m]}, D = {d}: untuned / autotuned from {min(v):.2f} to {max(v):.2f} "
                     f"over {len(v)} shapes" for (m, d), v in sorted(ratios.items(), key=lambda x: (x[0][0] != "fwd", -x[0][1])))
