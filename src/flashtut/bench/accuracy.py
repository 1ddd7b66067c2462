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

:func:`yardstick` is that criterion as one function, the one every kernel test and chapter 07
use: the errors of a kernel's output and gradients next to PyTorch's in the input precision and
SDPA's math backend, and whether each is within :func:`yardstick_tolerance`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

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
    """PyTorch attention in the input precision, the yardstick's baseline: the matrix products
    in the input dtype (float16/bfloat16 products, rounded to it), the softmax computed in
    float32 and its probabilities rounded to the input dtype before ``P @ V``. Its gradients,
    by autograd through this function, are computed in the same precision (``dS`` is rounded
    to the input dtype before the ``dQ`` and ``dK`` products, as in a fused kernel). Grouped-query
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
    # a row that sees no key (bottom-right with Nq > Nk) gets output 0, as the API says, not the
    # NaN of a softmax over -inf alone: a NaN here would make this baseline's error infinite and
    # the yardstick pass anything
    p = torch.softmax(s.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    return torch.matmul(p, v)


def sdpa_math_attention(q, k, v, causal=False, scale: float | None = None,
                        window: int | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` with its math backend (float32 inside for float16 and
    bfloat16 inputs): stricter than the yardstick; the book reports the ratio to it too."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    alignment, window = check_mask(causal, window)
    keep = None
    if alignment is not None:
        Nq, Nk = q.shape[-2], k.shape[-2]
        keep = ~causal_mask(Nq, Nk, q.device, diag_offset=diag_offset(alignment, Nq, Nk), window=window)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])


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
        self.q = q[:self.b, :self.h]
        self.do = None if do is None else do[:self.b, :self.h]   # None: forward only
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

    def _once(self, attr: str, compute, grad: bool) -> dict:
        """``compute()`` in exact float32 (with or without autograd), the first time only."""
        if getattr(self, attr) is None:
            with exact_float32(), torch.set_grad_enabled(grad):
                setattr(self, attr, compute())
        return getattr(self, attr)

    def forward(self) -> dict:
        return self._once("_fwd", self._compute_forward, grad=False)

    def _compute_forward(self) -> dict:
        q, k, v = (self._up(t) for t in (self.q, self.k, self.v))
        kw = dict(causal=self.causal, scale=self.scale, window=self.window)
        o = naive_attention(q, k, v, **kw)
        lse = attention_lse(q, k, **kw)
        base = lowp_attention(self.q, self.k, self.v, **kw)
        return {"o": o, "lse": lse, "base": {"o": max_abs_err(base, o)}}

    def backward(self) -> dict:
        return self._once("_bwd", self._compute_backward, grad=True)

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
                within[name] = err <= yardstick_tolerance(self.dtype, base[name])
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


# --- the accuracy yardstick: one definition for every kernel test, the bench and the book ----------

#: absolute slack of the yardstick per input dtype, for tensors whose PyTorch error is ~0
YARDSTICK_SLACK = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}


def yardstick_tolerance(dtype: torch.dtype, lowp_err: float) -> float:
    """The largest error the yardstick accepts where PyTorch in the input precision errs by
    ``lowp_err``: ``FA_FACTOR * lowp_err`` plus the dtype's slack."""
    return FA_FACTOR * lowp_err + YARDSTICK_SLACK.get(dtype, 1e-3)


@dataclass
class Yardstick:
    """A kernel's errors against the float32-or-wider reference, next to PyTorch's own.

    ``err``, ``lowp_err`` and ``math_err`` map ``o`` (and ``dq``, ``dk``, ``dv``) to the max
    absolute error of the kernel, of :func:`lowp_attention` (PyTorch in the input precision) and
    of :func:`sdpa_math_attention`. ``passed`` is the criterion of the flash-attn repository's
    tests (the papers state none): every error at most ``FA_FACTOR`` (2) times PyTorch's input-precision error, plus a slack of
    :data:`YARDSTICK_SLACK` for tensors that PyTorch gets (almost) exactly right.
    """
    dtype: torch.dtype
    err: dict = field(default_factory=dict)
    lowp_err: dict = field(default_factory=dict)
    math_err: dict = field(default_factory=dict)

    def tolerance(self, name: str) -> float:
        return yardstick_tolerance(self.dtype, self.lowp_err[name])

    def ratio(self, name: str, to: str = "lowp") -> float:
        """The kernel's error over PyTorch's (``to="lowp"``) or SDPA math's (``to="math"``)."""
        base = (self.lowp_err if to == "lowp" else self.math_err)[name]
        return self.err[name] / base if base > 0 else (0.0 if self.err[name] == 0 else math.inf)

    @property
    def failures(self) -> list:
        return [n for n in self.err if not (self.err[n] <= self.tolerance(n))]

    @property
    def passed(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return "\n".join(
            f"{n}: error {self.err[n]:.2e} = {self.ratio(n):.2f}x PyTorch in {dt} ({self.lowp_err[n]:.2e}), "
            f"{self.ratio(n, 'math'):.2f}x SDPA math ({self.math_err[n]:.2e})"
            + ("" if self.err[n] <= self.tolerance(n) else f"  <- above {self.tolerance(n):.2e}")
            for n in self.err)


def yardstick(q, k, v, o, grads=None, do=None, causal=False, scale: float | None = None,
              budget_bytes: int | None = None, window: int | None = None) -> Yardstick:
    """Judge a kernel's output ``o`` (and its gradients ``grads = (dq, dk, dv)`` for the output
    gradient ``do``) on the inputs ``q, k, v`` by the book's accuracy yardstick (see
    :class:`Yardstick`). The reference is naive attention in float64 on the CPU and for
    float32/float64 inputs, in float32 for float16/bfloat16 on a GPU; ``budget_bytes`` limits it
    to a slice of batch and heads, as in :class:`Reference`."""
    if (grads is None) != (do is None):
        raise ValueError("yardstick: pass both grads (dq, dk, dv) and do, or neither")
    ref = Reference(q, k, v, do, causal, scale, budget_bytes, window)
    fwd = ref.forward()
    out = Yardstick(q.dtype, {"o": max_abs_err(ref.part(o), fwd["o"])}, {"o": fwd["base"]["o"]})
    leaves = [t.detach().clone().requires_grad_(grads is not None) for t in (ref.q, ref.k, ref.v)]
    with exact_float32(), torch.enable_grad():
        o_math = sdpa_math_attention(*leaves, causal=causal, scale=scale, window=window)
    out.math_err["o"] = max_abs_err(o_math, fwd["o"])
    if grads is not None:
        bwd = ref.backward()
        math_grads = torch.autograd.grad(o_math, leaves, ref.do)
        for name, g, gm in zip(GRAD_NAMES, grads, math_grads):
            heads = None if name == "dq" else ref.k.shape[1]      # dk, dv have the K/V heads
            out.err[name] = max_abs_err(ref.part(g, heads), bwd[name])
            out.lowp_err[name] = bwd["base"][name]
            out.math_err[name] = max_abs_err(gm, bwd[name])
    return out


def ds_rounding_effect(q, k, v, do, causal: bool = False, scale: float | None = None) -> dict:
    """What rounding ``dS`` to the input dtype costs the Triton backward (chapter 07).

    Runs ``flashtut.triton.attention.triton_backward`` twice on the same inputs, as shipped (``dS``
    rounded to 16 bits before the ``dQ`` and ``dK`` products, as FlashAttention-2 does) and with
    ``ds_fp32=True`` (``dS`` kept in float32), and judges both by :func:`yardstick`. Also returns
    how completely each row of ``dS`` cancels, from a float64 recomputation:
    ``max_i |sum_j dS_ij| / sum_j |dS_ij|`` (zero up to rounding: ``sum_j P_ij dP_ij = Delta_i``
    and ``sum_j P_ij = 1``). Returns ``{"rounded": Yardstick, "fp32": Yardstick, "row_cancellation": float}``.
    """
    from ..triton.attention import triton_backward, triton_forward   # the kernels this measures

    o, lse = triton_forward(q, k, v, causal, scale)
    out = {}
    for label, flag in (("rounded", False), ("fp32", True)):
        grads = triton_backward(q, k, v, o, lse, do, causal, scale, ds_fp32=flag)
        out[label] = yardstick(q, k, v, o, grads, do, causal, scale)
    q64, k64, v64, do64 = (t.detach().to(torch.float64) for t in (q, k, v, do))
    scale = check_scale(scale, q.shape[-1])
    s = q64 @ k64.transpose(-2, -1) * scale
    alignment, _ = check_mask(causal)
    if alignment is not None:
        Nq, Nk = q.shape[-2], k.shape[-2]
        s = s.masked_fill(causal_mask(Nq, Nk, q.device, diag_offset=diag_offset(alignment, Nq, Nk)),
                          float("-inf"))
    p = torch.softmax(s, dim=-1)
    dp = do64 @ v64.transpose(-2, -1)
    ds = p * (dp - (do64 * (p @ v64)).sum(-1, keepdim=True))
    out["row_cancellation"] = float((ds.sum(-1).abs() / ds.abs().sum(-1).clamp_min(1e-300)).max())
    return out


def ds_rounding_table(effect: dict) -> str:
    """:func:`ds_rounding_effect`'s result as a Markdown table: each gradient's error, and its
    ratio to PyTorch in the input precision (the yardstick; at most 2 passes) and to SDPA math."""
    rounded, fp32 = effect["rounded"], effect["fp32"]
    lines = ["| gradient | dS rounded (shipped): error | x PyTorch | x SDPA math "
             "| dS in float32: error | x PyTorch | x SDPA math |",
             "|---|---|---|---|---|---|---|"]
    for name in GRAD_NAMES:
        cells = [f"{y.err[name]:.2e} | {y.ratio(name):.2f} | {y.ratio(name, 'math'):.2f}" for y in (rounded, fp32)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
