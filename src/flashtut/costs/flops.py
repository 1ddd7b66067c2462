"""FLOP counts of the performance protocol (the book's API reference, "Benchmark"), so every row is counted the same way.

Forward: two matrix products of ``Nq x Nk x D`` multiply-adds each, ``4 * B * H * Nq * Nk * D``
FLOPs, halved when causal (about half of the score matrix is masked). Backward: 2.5 times the
forward (five matrix products instead of two), the convention of the FlashAttention papers. The
count is the useful work of the algorithm: recomputation in the backward and the masked tiles a
kernel computes anyway are not credited, so a faster kernel shows as more TFLOP/s.
"""
from __future__ import annotations

BWD_OVER_FWD = 2.5

MODES = ("fwd", "bwd")


def attention_flops(B: int, H: int, Nq: int, Nk: int, D: int, causal: bool = False,
                    mode: str = "fwd") -> float:
    """FLOPs credited to one attention call of the given shape (``mode`` is ``fwd`` or
    ``bwd``)."""
    for name, value in (("B", B), ("H", H), ("Nq", Nq), ("Nk", Nk), ("D", D)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    fwd = 4.0 * B * H * Nq * Nk * D
    if causal:
        fwd /= 2
    return fwd * BWD_OVER_FWD if mode == "bwd" else fwd


def tflops(flops: float, ms: float | None) -> float | None:
    """TFLOP/s of ``flops`` done in ``ms`` milliseconds (None when there is no time)."""
    if ms is None or not ms > 0:
        return None
    return flops / (ms * 1e-3) / 1e12


def visible_pairs(n_q: int, n_k: int, causal=False, window: int | None = None) -> int:
    """How many (query, key) pairs a mask leaves visible: ``Nq * Nk`` without one; with a causal
    alignment (``True``/``"top-left"``, ``"bottom-right"``) and an optional ``window``, each query
    ``i`` sees the keys ``diag(i) - window < j <= diag(i)`` that exist. Exact, not "halved"."""
    from ..checks import check_mask, diag_offset

    alignment, window = check_mask(causal, window)
    if alignment is None:
        return n_q * n_k
    off = diag_offset(alignment, n_q, n_k)
    total = 0
    for i in range(n_q):
        hi = min(n_k, i + off + 1)
        lo = 0 if window is None else max(0, i + off + 1 - window)
        total += max(0, hi - lo)
    return total


def visible_attention_flops(B: int, H: int, Nq: int, Nk: int, D: int, causal=False,
                            window: int | None = None, mode: str = "fwd") -> float:
    """FLOPs of the visible (query, key) pairs only: ``4 * B * H * D`` per pair forward, 2.5 times
    that backward. The fair count for sliding windows and for comparing a windowed kernel with a
    full causal one (each credited the work its mask leaves)."""
    attention_flops(B, H, Nq, Nk, D, mode=mode)                 # the argument checks
    fwd = 4.0 * B * H * D * visible_pairs(Nq, Nk, causal, window)
    return fwd * BWD_OVER_FWD if mode == "bwd" else fwd
