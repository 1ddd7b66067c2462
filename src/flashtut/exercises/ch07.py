"""Chapter 07 exercises: write the backward's preprocessing kernel; add a sliding-window mask to
the forward kernel.

Checkers run the reader's function on fresh random inputs (odd lengths, head dims that are and
are not powers of two) and say where it differs from the reference. They work on a GPU and, at
the small sizes they use, under the Triton interpreter on a CPU.

Sliding-window attention: query ``i`` sees keys ``j`` with ``i - window < j <= i`` (the causal
mask, top-left aligned, further limited to the ``window`` most recent keys, itself included).
"""
from __future__ import annotations

import math

import torch

from ..checks import check_block, check_qkv, check_scale
from ..constants import LOG2E
from ..devices import default_device
from .checker import CheckResult, call_scalar, check_callable, run_trials

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the chapter says how to install triton
    triton = tl = None


# --------------------------------------------------------------- exercise 7.1: Delta ----

def reference_delta(o, do) -> torch.Tensor:
    """``Delta = rowsum(dO * O)`` in float32, shape ``(B, H, N)``."""
    return (do.float() * o.float()).sum(dim=-1)


def check_preprocess(fn, trials: int = 4, seed: int = 0) -> CheckResult:
    """Check ``fn(o, do) -> delta`` (``(B, H, N)`` float32) on random ``(B, H, N, D)`` inputs,
    D in {128, 40, 64, 24} (not all powers of two, and as wide as a real head), float32 and
    float16, N not a multiple of 16, from a few rows to more than a hundred (more rows than
    any one block)."""
    dims = [128, 40, 64, 24]
    dtypes = [torch.float32, torch.float16]
    dev = default_device()
    state = {"t": 0}

    def make(gen):
        t = state["t"]
        state["t"] += 1
        B, H = int(torch.randint(1, 3, (1,), generator=gen)), int(torch.randint(1, 3, (1,), generator=gen))
        lo, hi = (131, 200) if t % 2 == 0 else (5, 40)       # more rows than a block, or fewer
        N = int(torch.randint(lo, hi, (1,), generator=gen))
        N += N % 16 == 0                                    # never a multiple of 16
        D, dt = dims[t % len(dims)], dtypes[t % len(dtypes)]
        o = torch.randn(B, H, N, D, generator=gen).to(device=dev, dtype=dt)
        do = torch.randn(B, H, N, D, generator=gen).to(device=dev, dtype=dt)
        return o, do

    return run_trials(fn, reference_delta, make, trials=trials, seed=seed, name="delta",
                      atol=1e-4, rtol=1e-4)


def solution_preprocess(o, do) -> torch.Tensor:
    """The library's own preprocessing kernel
    (``flashtut.triton.backward.bwd_preprocess_kernel``), launched on ``(B, H, N, D)``
    tensors: one program per 16 rows, D padded to a power of two."""
    from ..triton import backward
    from ..triton.attention import _require_runtime
    _require_runtime(o)
    B, H, N, D = o.shape
    o, do = o.contiguous(), do.contiguous()
    delta = torch.empty(B, H, N, dtype=torch.float32, device=o.device)
    block_m, block_d = 16, max(16, triton.next_power_of_2(D))
    backward.bwd_preprocess_kernel[(triton.cdiv(N, block_m), B * H)](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        H, N, D, BLOCK_M=block_m, BLOCK_D=block_d)
    return delta


# ------------------------------------------------------- exercise 7.2: sliding window ----

def window_mask(n_q: int, n_k: int, window: int, device=None) -> torch.Tensor:
    """Boolean ``(n_q, n_k)``, True where key ``j`` is hidden from query ``i``:
    ``j > i`` or ``j <= i - window``."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return (j > i) | (j <= i - window)


def reference_window_attention(q, k, v, window: int, scale: float | None = None) -> torch.Tensor:
    """Sliding-window attention with the full score matrix, in float64, cast to ``q``'s dtype."""
    _, _, Nq, Nk, D = check_qkv(q, k, v)
    scale = check_scale(scale, D)
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    s = s.masked_fill(window_mask(Nq, Nk, window, q.device), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v.double()).to(q.dtype)


def reference_window_key_range(start_m: int, block_m: int, block_n: int, window: int,
                               n_k: int):
    """The tile-aligned key range ``[lo, hi)`` one query block must visit: from the tile
    holding the first key its first row sees, to one past the last key its last row
    sees."""
    lo = max(start_m - window + 1, 0) // block_n * block_n
    hi = min(start_m + block_m, n_k)
    return lo, max(hi, lo)


def check_window_key_range(fn) -> CheckResult:
    """Check ``fn(start_m, block_m, block_n, window, n_k) -> (lo, hi)`` exhaustively on small
    sizes: the range must start on a tile boundary, cover every key any row of the block sees,
    and skip every tile that no row sees (the first and last visited tiles must hold a visible key)."""
    check_callable("fn", fn)
    for block_m in (16, 32, 64):
        for block_n in (16, 32):
            for window in (1, 5, 16, 40, 200):
                for n_k in (37, 64, 130):
                    for start_m in range(0, n_k, block_m):
                        pair, error = call_scalar(fn, (start_m, block_m, block_n, window, n_k),
                                                  count=2, integers=True)
                        if error is not None:
                            return error
                        lo, hi = pair
                        rows = torch.arange(start_m, min(start_m + block_m, n_k))
                        seen = ~window_mask(n_k, n_k, window)[rows]          # (rows, n_k)
                        keys = seen.any(dim=0).nonzero().flatten()
                        first, last = int(keys.min()), int(keys.max())
                        where = (f"start_m={start_m}, block_m={block_m}, block_n={block_n}, "
                                 f"window={window}, n_k={n_k}: got ({lo}, {hi})")
                        if lo % block_n:
                            return CheckResult(False, f"✗ lo is not a multiple of block_n; {where}")
                        if lo > first or hi <= last:
                            return CheckResult(False, f"✗ misses visible keys {first}..{last}; {where}")
                        if first >= lo + block_n or last < hi - block_n:
                            return CheckResult(False, f"✗ visits a tile that no row of the block sees "
                                                      f"(visible keys {first}..{last}); {where}")
    return CheckResult(True, "✓ every block visits exactly the tiles its rows can see")


def check_window_attention(fn, trials: int = 4, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, window) -> o`` against the float64 reference on random inputs
    (Nq <= Nk, lengths not multiples of 16, some longer than a hundred keys, D in {128, 16,
    72, 32}, windows of 23, 1000, 1 and 7: shorter and longer than a tile)."""
    dev = default_device()
    windows = [23, 1000, 1, 7]
    dims = [128, 16, 72, 32]
    state = {"t": 0}

    def make(gen):
        t = state["t"]
        state["t"] += 1
        B, H = 1, int(torch.randint(1, 3, (1,), generator=gen))
        lo, hi = (131, 170) if t % 2 == 0 else (20, 70)
        Nk = int(torch.randint(lo, hi, (1,), generator=gen))
        Nk += Nk % 16 == 0
        Nq = int(torch.randint(max(5, Nk // 2), Nk + 1, (1,), generator=gen))
        D = dims[t % len(dims)]
        q, k, v = (torch.randn(B, H, n, D, generator=gen).to(dev) for n in (Nq, Nk, Nk))
        return q, k, v, windows[t % len(windows)]

    return run_trials(fn, reference_window_attention, make, trials=trials, seed=seed, name="o",
                      atol=2e-5, rtol=2e-5)


def window_attn_fwd(Q, K, V, O, n_q, n_k, window, head_dim, qk_scale,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_PREC: tl.constexpr):
    """Sliding-window forward for contiguous ``(B*H, N, D)`` tensors; grid
    ``(cdiv(n_q, BLOCK_M), B*H)``. The library's forward with two changes: the key loop
    starts at the first tile the window reaches, and the mask also hides keys that fell
    out of the window. One masked loop, for brevity."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < head_dim
    q_ok = (offs_m[:, None] < n_q) & d_ok
    q = tl.load(Q + bh * n_q * head_dim + offs_m[:, None] * head_dim + offs_d[None, :],
                mask=q_ok, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo = (tl.maximum(start_m - window + 1, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(start_m + BLOCK_M, n_k)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_ok = (cols[:, None] < n_k) & d_ok
        k = tl.load(K + bh * n_k * head_dim + cols[:, None] * head_dim
                    + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(V + bh * n_k * head_dim + cols[:, None] * head_dim
                    + offs_d[None, :], mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        keep = ((cols[None, :] < n_k) & (cols[None, :] <= offs_m[:, None])
                & (cols[None, :] > offs_m[:, None] - window))
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        # a row may see no key in this tile and none before it: keep exp2 away from
        # -inf - -inf
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * qk_scale - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # padded rows only: never stored
    o = acc / l_safe[:, None]
    tl.store(O + bh * n_q * head_dim + offs_m[:, None] * head_dim + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=q_ok)


# compiled by triton.jit (or wrapped for the interpreter) when triton is installed
window_attn_fwd_kernel = triton.jit(window_attn_fwd) if triton is not None else None


def solution_window_attention(q, k, v, window: int, scale: float | None = None,
                              block_m: int = 16, block_n: int = 16) -> torch.Tensor:
    """Sliding-window attention with ``window_attn_fwd_kernel`` (forward only). Needs
    ``Nq <= Nk`` so that every query row sees at least its own key."""
    from ..triton.attention import _require_runtime
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    scale = check_scale(scale, D)
    window = check_block("window", window)
    if Nq > Nk:
        raise ValueError(f"sliding-window attention here needs Nq <= Nk (each query sees its own key), "
                         f"got Nq={Nq}, Nk={Nk}")
    if q.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"q has dtype {q.dtype}; accepted: float16 or float32")
    _require_runtime(q)
    q, k, v = (t.contiguous() for t in (q, k, v))
    o = torch.empty_like(q)
    block_d = max(16, triton.next_power_of_2(D))
    window_attn_fwd_kernel[(triton.cdiv(Nq, block_m), B * H)](
        q, k, v, o, Nq, Nk, window, D, scale * LOG2E,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32")   # exact fp32 products, as the library
    return o


def tiles_visited(n: int, window: int, block_m: int = 64, block_n: int = 64) -> dict:
    """How many (query block, key block) tiles a square problem of length ``n`` computes:
    full attention, causal skipping, and the sliding window's range."""
    n_mb, n_nb = math.ceil(n / block_m), math.ceil(n / block_n)
    causal = sum(math.ceil(min(s + block_m, n) / block_n) for s in range(0, n, block_m))
    win = 0
    for s in range(0, n, block_m):
        lo, hi = reference_window_key_range(s, block_m, block_n, window, n)
        win += math.ceil((hi - lo) / block_n)
    return {"full": n_mb * n_nb, "causal": causal, "window": win}


__all__ = ["reference_delta", "check_preprocess", "solution_preprocess", "window_mask",
           "reference_window_attention", "reference_window_key_range", "check_window_key_range",
           "check_window_attention", "solution_window_attention", "tiles_visited"]

