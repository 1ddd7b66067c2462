"""Decode attention over a KV cache, measured against the memory bandwidth (``python -m flashtut.bench decode``).

One decoding step reads the whole cache once (:func:`flashtut.costs.decode_traffic.decode_step_bytes`),
so the step is judged by its bandwidth: those bytes over its time, as a fraction of the GPU's
measured copy bandwidth (measured in the same run, :func:`flashtut.bench.roofline.copy_bandwidth`).

For each cache length, batch and dtype (one new query per sequence, 32 query heads over 8 key/value
heads, D = 128 by default):

* ``triton-decode``: the split-KV kernel over a contiguous cache and over a paged one (the same
  positions in pages scattered over a pool; ``page_size`` in the row), with the split count the
  launch chooses (``num_splits`` in the row);
* ``sdpa-<backend>``: ``scaled_dot_product_attention`` on the same dense-cache problem, for each of
  its fused backends (flash, efficient, cudnn) in two forms: ``enable_gqa=True`` with the query heads
  as heads, and (``-rows``) the query heads of a group as rows of one key/value head, which is the
  same attention for one new token and lets any backend skip the group's repeated reads. SDPA's
  best is the fastest that runs.

Every implementation is checked before it is timed (the book's yardstick against float32, on the
first sequence). Times are medians of CUDA-graph replays: a graph holds several calls on different
copies of the cache (together larger than the L2 cache, so no call reads a cache another left in
L2), so neither the L2 nor Python's launch overhead is timed.
"""
from __future__ import annotations

import math
import statistics

import torch
import torch.nn.functional as F

from ..costs.decode_traffic import decode_step_bytes
from .accuracy import yardstick
from .memory import is_oom, release_cached
from .roofline import copy_bandwidth

#: bytes a graph's calls read together at least: several times the largest L2 cache (H200: 50 MiB)
ROTATE_BYTES = 256 * 2**20
#: the most cache copies one timing holds
MAX_COPIES = 16
SDPA_BACKENDS = ("flash", "efficient", "cudnn")


def time_graph(calls, device, replays: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of one call, from a CUDA graph that runs every callable of ``calls``
    once per replay (each on its own copy of the inputs). On the CPU: the median wall time of
    the calls, run directly."""
    import time

    device = torch.device(device)
    if device.type != "cuda":
        times = []
        for _ in range(max(2, replays // 10)):
            t0 = time.perf_counter()
            for c in calls:
                c()
            times.append((time.perf_counter() - t0) * 1e3 / len(calls))
        return statistics.median(times)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):            # compile and allocate outside the capture
        for c in calls:
            c()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize(device)
    del graph
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / len(calls)


def _problem(B, H, Hkv, N, D, dtype, device, page_size, copies, seed):
    """``copies`` independent (q, dense k, dense v, pool k, pool v, table) sets; every sequence
    holds ``N`` positions; a pool's pages are scattered in a random order."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = -(-N // page_size)
    sets = []
    for _ in range(copies):
        q = torch.randn(B, H, 1, D, generator=g, device=device, dtype=dtype)
        k = torch.randn(B, Hkv, N, D, generator=g, device=device, dtype=dtype)
        v = torch.randn(B, Hkv, N, D, generator=g, device=device, dtype=dtype)
        order = torch.randperm(B * pages_per_seq, generator=g, device=device).int()
        table = order.view(B, pages_per_seq)
        pad = pages_per_seq * page_size - N
        kp = torch.empty(B * pages_per_seq, Hkv, page_size, D, device=device, dtype=dtype)
        vp = torch.empty_like(kp)
        for src, dst in ((k, kp), (v, vp)):
            full = F.pad(src, (0, 0, 0, pad)).view(B, Hkv, pages_per_seq, page_size, D)
            dst[table.long().flatten()] = full.permute(0, 2, 1, 3, 4).reshape(-1, Hkv, page_size, D)
        sets.append(dict(q=q, k=k, v=v, kp=kp, vp=vp, table=table))
    return sets


def _sdpa_fn(backend: str, rows: bool, H, Hkv):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def fn(q, k, v):
        with sdpa_kernel(which):
            if rows:   # (B, H, 1, D) -> (B, Hkv, H / Hkv, D): a group's queries as rows of its K/V head
                B, _, _, D = q.shape
                return F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v).reshape(B, H, 1, D)
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hkv)
    return fn


def measure_case(B, H, Hkv, N, D, dtype, device, page_sizes=(64, 16), seed=0, sdpa=True,
                 kernels=None) -> list[dict]:
    """The rows of one case: the kernel over a contiguous cache and each paged layout, and each
    SDPA form that runs; every row checked, then timed (and a kernel's checked again after its
    timing's replays). ``kernels`` maps an implementation name to ``(tuning, num_splits)``: a
    :class:`flashtut.triton.decode.DecodeTuning` (None: the shipped launch) and a split count
    (None: the one the launch chooses); by default ``{"triton-decode": (None, None)}``."""
    from dataclasses import asdict

    from ..triton.decode import SHIPPED, choose_num_splits, triton_decode_attention

    device = torch.device(device)
    itemsize = torch.finfo(dtype).bits // 8
    chosen = choose_num_splits(B, Hkv, N, device) if device.type == "cuda" else 1
    kernels = kernels or {"triton-decode": (None, None)}
    must = decode_step_bytes([N] * B, H, Hkv, D, itemsize)
    copies = max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / must["must"]))) if device.type == "cuda" else 1
    base = dict(kind="decode", what="kernel", B=B, H=H, Hkv=Hkv, N=N, D=D, Nq=1,
                dtype=str(dtype).replace("torch.", ""), bytes=must["must"], copies=copies)
    rows = []
    try:
        sets = _problem(B, H, Hkv, N, D, dtype, device, max(page_sizes), copies, seed)
    except Exception as e:                                      # noqa: BLE001 - reported in the row
        release_cached(device)
        return [dict(base, impl="triton-decode", status="oom" if is_oom(e) else "error",
                     error=f"{type(e).__name__}: {e}"[:300])]
    seqlens = torch.full((B,), N, dtype=torch.int32, device=device)
    s0 = sets[0]

    def judged(o) -> dict:
        y = yardstick(s0["q"][:1], s0["k"][:1], s0["v"][:1], o[:1], causal="bottom-right")
        return {"err": y.err["o"], "ratio_to_torch": y.ratio("o"), "passed": y.passed}

    variants = []
    for impl in kernels:
        variants += [(impl, "contiguous", None)] + [(impl, "paged", ps) for ps in page_sizes]
    if sdpa and device.type == "cuda":
        variants += [(f"sdpa-{b}{'-rows' if r else ''}", "dense", None) for b in SDPA_BACKENDS for r in (False, True)]
    for impl, layout, ps in variants:
        row = dict(base, impl=impl, layout=layout, page_size=ps)
        try:
            if impl in kernels:
                tuning, splits = kernels[impl]
                tuning, splits = tuning or SHIPPED, splits or chosen
                row.update(num_splits=splits, **asdict(tuning))
                if layout == "paged":
                    # the pool was built with the largest page size; a smaller one splits each page
                    big = max(page_sizes)
                    per = big // ps
                    views = []
                    for s in sets:
                        kp = s["kp"].view(-1, Hkv, per, ps, D).transpose(1, 2).reshape(-1, Hkv, ps, D)
                        vp = s["vp"].view(-1, Hkv, per, ps, D).transpose(1, 2).reshape(-1, Hkv, ps, D)
                        tab = (s["table"].long()[:, :, None] * per + torch.arange(per, device=device)).view(B, -1).int()
                        views.append((s["q"], kp, vp, tab))
                    calls = [lambda a=a, n=splits, t=tuning: triton_decode_attention(
                        a[0], a[1], a[2], seqlens, a[3], num_splits=n, tuning=t) for a in views]
                else:
                    calls = [lambda s=s, n=splits, t=tuning: triton_decode_attention(
                        s["q"], s["k"], s["v"], seqlens, num_splits=n, tuning=t) for s in sets]
            else:
                name = impl[len("sdpa-"):]
                fn = _sdpa_fn(name.replace("-rows", ""), name.endswith("-rows"), H, Hkv)
                calls = [lambda s=s: fn(s["q"], s["k"], s["v"]) for s in sets]
            row.update(judged(calls[0]()))
            if not row["passed"]:
                row["status"] = "failed"
            else:
                ms = time_graph(calls, device)
                row.update(status="ok", ms=ms, gb_per_s=must["must"] / (ms * 1e-3) / 1e9)
                # state a launch keeps between calls (the fused merge's counters) is still right
                if impl in kernels and not judged(calls[0]())["passed"]:
                    row.update(status="failed", error="outside the yardstick after the timing's replays")
        except Exception as e:                                  # noqa: BLE001 - reported in the row
            if is_oom(e):
                row["status"] = "oom"
            else:
                row.update(status="unavailable" if impl.startswith("sdpa") else "error",
                           error=f"{type(e).__name__}: {e}"[:300])
            release_cached(device)
        rows.append(row)
    del sets
    release_cached(device)
    return rows


def run_decode(device, lengths, batches, dtypes, H=32, Hkv=8, D=128, page_sizes=(64, 16), seed=0,
               on_row=None) -> list[dict]:
    """The copy bandwidth, then every case of ``lengths x batches x dtypes``."""
    device = torch.device(device)
    rows = []

    def keep(r):
        rows.append(r)
        if on_row is not None:
            on_row(r)

    keep(copy_bandwidth(device, seed=seed))
    for dtype in dtypes:
        for B in batches:
            for N in lengths:
                for r in measure_case(B, H, Hkv, N, D, dtype, device, page_sizes, seed):
                    keep(r)
    return rows


def summarize(rows) -> list[dict]:
    """Per case (B, N, dtype): the kernel's bandwidth fraction (contiguous), the paged layout's cost
    against it, and its speed against SDPA's best form (the fastest row that passed)."""
    copy = [r["gb_per_s"] for r in rows if r.get("kind") == "roofline" and r.get("gb_per_s")]
    peak = max(copy) if copy else None
    cases = {}
    for r in rows:
        if r.get("kind") == "decode" and r.get("status") == "ok":
            cases.setdefault((r["dtype"], r["B"], r["N"]), []).append(r)
    out = []
    for (dtype, B, N), rs in sorted(cases.items()):
        ours = next((r for r in rs if r["impl"] == "triton-decode" and r["layout"] == "contiguous"), None)
        paged = sorted((r for r in rs if r["impl"] == "triton-decode" and r["layout"] == "paged"),
                       key=lambda r: -r["page_size"])
        sdpa = [r for r in rs if r["impl"].startswith("sdpa")]
        best = min(sdpa, key=lambda r: r["ms"]) if sdpa else None
        out.append({
            "dtype": dtype, "B": B, "N": N, "ms": ours and ours["ms"],
            "fraction": ours and peak and ours["gb_per_s"] / peak,
            "paged_cost": {r["page_size"]: r["ms"] / ours["ms"] - 1 for r in paged} if ours else {},
            "sdpa_best": best and best["impl"],
            "vs_sdpa": best["ms"] / ours["ms"] if best and ours else None,
            "splits": ours and ours.get("num_splits")})
    return out


def summary_table(rows) -> str:
    """:func:`summarize` as a Markdown table."""
    lines = ["| dtype | batch | cache length | splits | us | bandwidth fraction | paged cost (page 64 / 16 by default) "
             "| x SDPA best | SDPA best |", "|---|---|---|---|---|---|---|---|---|"]
    def num(x, fmt):
        return "" if x is None else format(x, fmt)

    for s in summarize(rows):
        cost = " / ".join(f"{100 * c:+.1f}%" for _, c in sorted(s["paged_cost"].items(), reverse=True))
        lines.append(f"| {s['dtype']} | {s['B']} | {s['N']} | {s['splits']} | {num(s['ms'] and 1e3 * s['ms'], '.1f')} "
                     f"| {num(s['fraction'], '.2f')} | {cost} | {num(s['vs_sdpa'], '.2f')} | {s['sdpa_best'] or ''} |")
    return "\n".join(lines)


def serving_table(rows) -> str:
    """The serving loop's decode tokens per second (``flashtut.model.paged_decoding.
    measure_serving`` rows) as a Markdown table: one line per batch and prompt length, one
    column per method, then ours (the paged kernel in a CUDA graph) over SDPA and over the
    PyTorch reference."""
    gen = [r for r in rows if r.get("section") == "generation" and r.get("method")]
    methods = list(dict.fromkeys(r["method"] for r in gen))
    cases = {}
    for r in gen:
        cases.setdefault((r["layout"], r["prompt"]), {})[r["method"]] = (
            r.get("tokens_per_s") if r.get("status") == "ok" else None)

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "-"

    lines = ["| batch | prompt | " + " | ".join(methods) + " | ours / SDPA | ours / reference |",
             "|---" * (len(methods) + 4) + "|"]
    for (layout, prompt), got in cases.items():
        cells = [f"{got[m]:,.0f}" if got.get(m) else "-" for m in methods]
        ours = got.get("triton paged")
        lines.append(f"| {layout.replace('batch ', '')} | {prompt:,} | " + " | ".join(cells)
                     + f" | {ratio(ours, got.get('sdpa dense'))} | {ratio(ours, got.get('pytorch reference'))} |")
    return "\n".join(lines)


__all__ = ["run_decode", "measure_case", "summarize", "summary_table", "serving_table", "time_graph",
           "SDPA_BACKENDS"]
