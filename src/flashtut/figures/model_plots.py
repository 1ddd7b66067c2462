"""Chapter 12's figures: the small GPT with each attention backend. Drawing only: every function
takes the rows of :mod:`flashtut.model.measure` (or of a live run in the same layout)."""
from __future__ import annotations

from .bench_plots import impl_style
from .style import PALETTE, subplots

MiB = 2**20


def _style(backend: str) -> dict:
    # the model's "sdpa" lets PyTorch choose; on a GPU in bf16 that is the flash backend
    return impl_style("sdpa-flash" if backend == "sdpa" else backend)


def loss_curves_figure(rows, title: str = "training loss, same seed and batches"):
    """Left: the loss of every step per backend (rows with ``backend`` and ``losses``). Right: each
    backend's difference from the first one's, step by step."""
    rows = [r for r in rows if r.get("losses")]
    if not rows:
        raise ValueError("rows must hold at least one row with a 'losses' list")
    fig, (ax, ax_d) = subplots(1, 2, figsize=(10, 3.6))
    base = rows[0]
    for r in rows:
        s = _style(r["backend"])
        steps = range(1, len(r["losses"]) + 1)
        ax.plot(steps, r["losses"], color=s["color"], linestyle=s["linestyle"], label=r["backend"])
        if r is not base:
            ax_d.plot(steps, [a - b for a, b in zip(r["losses"], base["losses"])], color=s["color"],
                      marker=s["marker"], markersize=3, linestyle="-", label=f"{r['backend']} - {base['backend']}")
    ax.set(xlabel="step", ylabel="loss (nats per byte)", title=title)
    ax.legend()
    ax_d.axhline(0, color=PALETTE[-1], linewidth=0.8)
    ax_d.set(xlabel="step", ylabel="loss difference", title=f"difference from {base['backend']}")
    if len(rows) > 1:
        ax_d.legend()
    return fig


def scaling_figure(rows, device: str = ""):
    """Tokens per second (left) and peak extra memory (right) of one training step against the
    context length, per backend; an ``x`` marks the first context that ran out of memory."""
    rows = [r for r in rows if r.get("section", "scaling") == "scaling"]
    fig, (ax_t, ax_m) = subplots(1, 2, figsize=(10, 3.8))
    for backend in dict.fromkeys(r["backend"] for r in rows):
        s = _style(backend)
        mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["context"])
        ok = [r for r in mine if r["status"] == "ok"]
        for ax, key, scale in ((ax_t, "tokens_per_s", 1e3), (ax_m, "peak_extra_bytes", MiB)):
            ax.plot([r["context"] for r in ok], [r[key] / scale for r in ok], color=s["color"],
                    marker=s["marker"], linestyle=s["linestyle"], label=backend)
        oom = [r for r in mine if r["status"] == "oom"]
        if oom and ok:
            for ax, key, scale in ((ax_t, "tokens_per_s", 1e3), (ax_m, "peak_extra_bytes", MiB)):
                ax.plot([oom[0]["context"]], [ok[-1][key] / scale], marker="x", markersize=11, mew=2,
                        color=s["color"], linestyle="none")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
    ax_m.set_yscale("log")
    ax_t.set(ylabel="thousand tokens / s", title=f"training throughput{' (' + device + ')' if device else ''}")
    ax_m.set(ylabel="MiB", title="peak extra memory of one step (x: out of memory)")
    ax_t.legend()
    return fig


def generation_figure(rows, device: str = ""):
    """Tokens per second of greedy generation against the prompt length, one line per method
    (rows of the ``generation`` section with ``method``, ``prompt``, ``tokens_per_s``)."""
    rows = [r for r in rows if r.get("status") == "ok" and r.get("section", "generation") == "generation"]
    fig, ax = subplots(figsize=(6.5, 3.8))
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["prompt"])
        backend = mine[0]["backend"]
        s = _style(backend) if not method.startswith("split-kv") else {"color": PALETTE[4], "marker": "h"}
        ax.plot([r["prompt"] for r in mine], [r["tokens_per_s"] for r in mine], color=s["color"],
                marker=s["marker"], linestyle=":" if "recompute" in method else "-", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="prompt length (tokens)", ylabel="generated tokens / s",
           title=f"greedy generation{' (' + device + ')' if device else ''}: cache (solid) vs recompute (dotted)")
    ax.legend(fontsize=8)
    return fig


__all__ = ["loss_curves_figure", "scaling_figure", "generation_figure"]
