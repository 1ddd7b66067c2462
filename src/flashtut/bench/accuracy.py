"""The correctness check every measurement passes before it is timed.

The reference is naive attention in a wider dtype (float64 on the CPU and for float32/float64
inputs; float32 for float16/bfloat16 on a GPU, where float64 is slow), on the same input values.
On a GPU the full score matrix of a large case does not fit, so the reference runs on a slice of
the batch and heads (heads are independent, so the slice of the output and of the gradients
is exactly what the reference computes).

What is recorded per tensor (``o``, ``lse``, ``dq``, ``dk``, ``dv``): the maximum absolute error
against the reference, and the error of PyTorch's own attention computed entirely in the input
dtype (``q @ k^T``, softmax and ``@ v`` in float16 or bfloat16), the yardstick of the
FlashAttention repository: a kernel is as accurate as it should be when its error is at most
twice that. The gate that decides whether a row is timed is that, or a small floor relative to
the reference's magnitude (for float32, tf32 matrix units are allowed), whichever is larger:
it catches wrong results (a missed rescale, a wrong mask), not the last bit.
"""
from __future__ import annotations

import contextlib

import torch

from ..checks import check_mask, check_scale, diag_offset
from ..reference import attention_lse, causal_mask, naive_attention

#: relative error floor of the gate, per input dtype
GATE_FLOOR = {torch.float64: 1e-9, torch.float32: 5e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
#: the FlashAttention criterion: our error may be this many times PyTorch's low-precision error
FA_FACTOR = 2.0
GRAD_NAMES = ("dq", "dk", "dv")


@contextlib.contextmanager
def exact_float32():
    """Full float32 matrix products for the reference, whatever another module set globally
    (tf32 would put a 1e-3 error into the yardstick itself)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def reference_dtype(device, dtype: torch.dtype) -> torch.dtype:
    if torch.device(device).type == "cpu" or dtype in (torch.float32, torch.float64):
        return torch.float64
    return torch.float32


def lowp_attention(q, k, v, causal=False, scale: float | None = None,
                   window: int | None = None) -> torch.Tensor:
    """Attention with every operation in the input dtype (no upcast): the error PyTorch itself
    makes in float16/bfloat16, which the FlashAttention criterion compares against. Grouped-query
    ``k``/``v`` are repeated over their group (autograd sums the group's gradients back)."""
    alignment, window = check_mask(causal, window)
    scale = check_scale(scale, q.shape[-1])
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if alignment is not None:
        Nq, Nk = q.shape[-2], k.shape[-2]
        s = s.masked_fill(causal_mask(Nq, Nk, q.device, diag_offset=diag_offset(alignment, Nq, Nk),
                                      window=window), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def slice_counts(B: int, H: int, Nq: int, Nk: int, itemsize: int, budget_bytes: int | None):
    """How many batches and heads ``(b, h)`` the reference can take within ``budget_bytes``
    (about six ``Nq x Nk`` matrices per head: scores, mask, probabilities and their gradients)."""
    if budget_bytes is None:
        return B, H
    per_head = 6 * Nq * Nk * itemsize
    n = max(1, int(budget_bytes // per_head))
    if n >= B * H:
        return B, H
    if n >= H:
        return n // H, H
    return 1, n


def max_abs_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Max absolute difference in the reference dtype; infinity if ``x`` has a NaN or Inf."""
    x, ref = x.detach().to(ref.dtype), ref.detach()
    if not torch.isfinite(x).all():
        return float("inf")
    return float((x - ref).abs().max())


class Reference:
    """Reference results for one case, computed lazily on a slice of batch and heads."""

    def __init__(self, q, k, v, do, causal, scale: float | None, budget_bytes: int | None = None,
                 window: int | None = None):
        self.causal, self.scale, self.window, self.dtype = causal, scale, window, q.dtype
        self.ref_dtype = reference_dtype(q.device, q.dtype)
        B, H, Nq, D = q.shape
        itemsize = torch.finfo(self.ref_dtype).bits // 8
        self.b, self.h = slice_counts(B, H, Nq, k.shape[2], itemsize, budget_bytes)
        # grouped-query heads: whole groups only, so the sliced k/v are what the sliced q reads
        group = H // k.shape[1]
        self.h = max(group, self.h - self.h % group)
        self.q, self.do = (t[:self.b, :self.h] for t in (q, do))
        self.k, self.v = (t[:self.b, :self.h // group] for t in (k, v))
        self._fwd = None
        self._bwd = None

    def part(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """The slice of a full-size result that the reference covers (``heads``: of a K/V-sized
        result, its own count of heads)."""
        return x[:self.b, :self.h if heads is None else heads]

    def info(self) -> dict:
        return {"dtype": str(self.ref_dtype).replace("torch.", ""), "batch": self.b, "heads": self.h}

    def _up(self, t):
        return t.detach().to(self.ref_dtype)

    def forward(self) -> dict:
        if self._fwd is None:
            with exact_float32(), torch.no_grad():
                self._fwd = self._compute_forward()
        return self._fwd

    def _compute_forward(self) -> dict:
        q, k, v = (self._up(t) for t in (self.q, self.k, self.v))
        kw = dict(causal=self.causal, scale=self.scale, window=self.window)
        o = naive_attention(q, k, v, **kw)
        lse = attention_lse(q, k, **kw)
        base = lowp_attention(self.q, self.k, self.v, **kw)
        return {"o": o, "lse": lse, "base": {"o": max_abs_err(base, o)}}

    def backward(self) -> dict:
        if self._bwd is None:
            with exact_float32(), torch.enable_grad():
                self._bwd = self._compute_backward()
        return self._bwd

    def _compute_backward(self) -> dict:
        leaves = [self._up(t).requires_grad_() for t in (self.q, self.k, self.v)]
        kw = dict(causal=self.causal, scale=self.scale, window=self.window)
        o = naive_attention(*leaves, **kw)
        o.backward(self._up(self.do))
        grads = {n: t.grad for n, t in zip(GRAD_NAMES, leaves)}
        del o, leaves
        low = [t.detach().clone().requires_grad_() for t in (self.q, self.k, self.v)]
        lowp_attention(*low, **kw).backward(self.do)
        base = {n: max_abs_err(t.grad, grads[n]) for n, t in zip(GRAD_NAMES, low)}
        return {**grads, "base": base}

    def _judge(self, errs: dict, refs: dict, base: dict) -> dict:
        floor = GATE_FLOOR.get(self.dtype, 5e-2)
        tol, within = {}, {}
        for name, err in errs.items():
            scale = max(1.0, float(refs[name].abs().max()))
            tol[name] = max(FA_FACTOR * base.get(name, 0.0), floor * scale)
            if name in base:
                within[name] = err <= FA_FACTOR * base[name]
        passed = all(errs[n] <= tol[n] for n in errs)
        fa = all(within.values()) if self.dtype in (torch.float16, torch.bfloat16) and within else None
        return {"err": errs, "torch_lowp_err": {n: base[n] for n in errs if n in base}, "tol": tol,
                "passed": passed, "fa_criterion": fa}

    def check_forward(self, o: torch.Tensor, lse: torch.Tensor | None = None) -> dict:
        ref = self.forward()
        errs = {"o": max_abs_err(self.part(o), ref["o"])}
        refs = {"o": ref["o"]}
        if lse is not None:
            errs["lse"] = max_abs_err(self.part(lse), ref["lse"])
            refs["lse"] = ref["lse"]
        return self._judge(errs, refs, ref["base"])

    def check_backward(self, grads, o: torch.Tensor | None = None) -> dict:
        ref = self.backward()
        errs = {n: max_abs_err(self.part(g, ref[n].shape[1]), ref[n]) for n, g in zip(GRAD_NAMES, grads)}
        refs = {n: ref[n] for n in GRAD_NAMES}
        base = dict(ref["base"])
        if o is not None:
            fwd = self.forward()
            errs["o"] = max_abs_err(self.part(o), fwd["o"])
            refs["o"] = fwd["o"]
            base.update(fwd["base"])
        return self._judge(errs, refs, base)
