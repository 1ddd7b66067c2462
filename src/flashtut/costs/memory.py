"""Memory accounting by code: how big attention's tensors are, how many bytes each kernel moves
between device memory and the chip, and where the score matrix stops fitting. (The measurement
that checks these numbers is :func:`flashtut.bench.memory.peak_extra_memory`.)

Sizes are exact bytes; the tables print them in MiB (2**20 bytes) because that is how PyTorch and
``nvidia-smi`` report memory. GPU capacities are the vendors' decimal GB (1e9 bytes).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..checks import FLOAT_DTYPES
from .flops import attention_flops
from .traffic import Traffic

MiB = 2 ** 20

# Element-wise work the softmax does per score, by the convention used in this book: compare for
# the max, subtract the max, exp, add to the sum, divide by the sum.
SOFTMAX_FLOPS_PER_ELEMENT = 5


def _check_dims(**dims) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_dtype(name: str, dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: got {dtype!r}; accepted: torch.float16, torch.bfloat16, "
                         "torch.float32, torch.float64")


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of a floating dtype (2 for float16/bfloat16, 4, 8)."""
    _check_dtype("dtype", dtype)
    return torch.empty((), dtype=dtype).element_size()


def tensor_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Exact bytes of a dense tensor of ``shape`` and ``dtype``."""
    return math.prod(int(s) for s in shape) * element_size(dtype)


# --- what naive attention holds ------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryRow:
    name: str
    shape: tuple
    dtype: str
    bytes: int

    @property
    def mib(self) -> float:
        return self.bytes / MiB


def attention_memory_table(B: int, H: int, N: int, D: int, dtype: torch.dtype = torch.float16,
                           Nk: int | None = None, score_dtype: torch.dtype | None = None) -> list[MemoryRow]:
    """The tensors of standard attention and their sizes.

    Rows ``Q, K, V, O`` (``dtype``), ``S = Q K^T`` and ``P = softmax(S)`` (``score_dtype``, by
    default ``dtype``; ``flashtut.naive_attention`` keeps them in float32 for 16-bit inputs), then
    three totals: the inputs and output, the two ``N x N`` matrices, and everything.
    ``N`` is the query length; ``Nk`` the key length (default ``N``).
    """
    Nk = N if Nk is None else Nk
    _check_dims(B=B, H=H, N=N, D=D, Nk=Nk)
    B, H, N, D, Nk = int(B), int(H), int(N), int(D), int(Nk)
    _check_dtype("dtype", dtype)
    score_dtype = dtype if score_dtype is None else score_dtype
    _check_dtype("score_dtype", score_dtype)
    name = lambda dt: str(dt).replace("torch.", "")
    shapes = {"Q": (B, H, N, D), "K": (B, H, Nk, D), "V": (B, H, Nk, D), "O": (B, H, N, D)}
    rows = [MemoryRow(k, s, name(dtype), tensor_bytes(s, dtype)) for k, s in shapes.items()]
    rows += [MemoryRow(k, (B, H, N, Nk), name(score_dtype), tensor_bytes((B, H, N, Nk), score_dtype))
             for k in ("S", "P")]
    io = sum(r.bytes for r in rows[:4])
    scores = rows[4].bytes + rows[5].bytes
    rows += [MemoryRow("total Q, K, V, O", (), "", io),
             MemoryRow("total S, P", (), "", scores),
             MemoryRow("total", (), "", io + scores)]
    return rows


def format_table(rows: list[MemoryRow]) -> str:
    """A markdown table of ``attention_memory_table`` rows (for ``IPython.display.Markdown``)."""
    lines = ["| tensor | shape | dtype | bytes | MiB |", "| --- | --- | --- | ---: | ---: |"]
    for r in rows:
        shape = "(" + ", ".join(str(s) for s in r.shape) + ")" if r.shape else ""
        label = f"**{r.name}**" if r.name.startswith("total") else r.name
        lines.append(f"| {label} | {shape} | {r.dtype} | {r.bytes:,} | {r.mib:,.1f} |")
    return "\n".join(lines)


def naive_attention_peak_bytes(B: int, H: int, N: int, D: int, dtype: torch.dtype = torch.float16,
                               Nk: int | None = None, causal: bool = False) -> int:
    """The extra memory of one call of ``flashtut.naive_attention`` at its peak (output included),
    predicted by following its code statement by statement and adding up the tensors alive at
    each step; what a measurement such as ``torch.cuda.max_memory_allocated`` should report, up
    to the allocator's rounding of each block (512 bytes on CUDA).

    Scores and probabilities are in the accumulation dtype ``acc`` (float32, float64 for float64
    inputs); a cast ``x.to(acc)`` allocates only when ``dtype`` is not already ``acc``.
    """
    Nk = N if Nk is None else Nk
    _check_dims(B=B, H=H, N=N, D=D, Nk=Nk)
    _check_dtype("dtype", dtype)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    cast = dtype != acc
    nn = tensor_bytes((B, H, N, Nk), acc)
    q_acc, k_acc, v_acc, o_acc = (tensor_bytes((B, H, n, D), acc) for n in (N, Nk, Nk, N))
    steps = [
        cast * (q_acc + k_acc) + nn,             # S0 = q.to(acc) @ k.to(acc)^T
        2 * nn,                                  # S1 = S0 * scale, while S0 is still alive
        2 * nn + cast * v_acc + o_acc,           # s and P alive; v.to(acc) and P V
        2 * nn + o_acc + cast * tensor_bytes((B, H, N, D), dtype),   # (P V).to(dtype)
    ]
    if causal:                                   # s.masked_fill(mask, -inf): old s, mask, new s
        steps.append(2 * nn + N * Nk * torch.empty((), dtype=torch.bool).element_size())
    return max(steps)


def max_seq_len(capacity_bytes: float, B: int, H: int, dtype: torch.dtype = torch.float16,
                n_matrices: int = 1) -> int:
    """The largest ``N`` for which ``n_matrices`` score matrices of shape ``(B, H, N, N)`` fit in
    ``capacity_bytes`` (ignoring everything else the GPU holds, so a generous upper bound)."""
    _check_dims(B=B, H=H, n_matrices=n_matrices)
    if not capacity_bytes > 0:
        raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes!r}")
    per_square = B * H * n_matrices * element_size(dtype)
    n = math.isqrt(int(capacity_bytes // per_square))
    while per_square * (n + 1) ** 2 <= capacity_bytes:  # isqrt of the floored quotient may be one short
        n += 1
    return n


# --- bytes moved by each kernel --------------------------------------------------------------------

def matmul_traffic(M: int, N: int, K: int, dtype: torch.dtype = torch.float16, batch: int = 1,
                   out_dtype: torch.dtype | None = None, name: str = "matmul") -> Traffic:
    """``C (M x N) = A (M x K) @ B (K x N)``, ``batch`` times: ``2 M N K`` FLOPs each, A and B read
    once and C written once (the best a tiled kernel can do when everything streams through)."""
    _check_dims(M=M, N=N, K=K, batch=batch)
    out_dtype = dtype if out_dtype is None else out_dtype
    e_in, e_out = element_size(dtype), element_size(out_dtype)
    return Traffic(name, 2 * batch * M * N * K, batch * (M * K + K * N) * e_in, batch * M * N * e_out)


def naive_attention_kernels(B: int, H: int, N: int, D: int, dtype: torch.dtype = torch.float16,
                            Nk: int | None = None, score_dtype: torch.dtype | None = None) -> list[Traffic]:
    """The three kernels of unfused attention, each a round trip through device memory:

    1. ``S = Q K^T * scale`` (the scale folded into the matmul): reads Q and K, writes S;
    2. ``P = softmax(S)``: reads S, writes P;
    3. ``O = P V``: reads P and V, writes O.

    ``score_dtype`` (default ``dtype``) is the dtype of S and P.
    """
    Nk = N if Nk is None else Nk
    _check_dims(B=B, H=H, N=N, D=D, Nk=Nk)
    score_dtype = dtype if score_dtype is None else score_dtype
    _check_dtype("score_dtype", score_dtype)
    bh = B * H
    s_bytes = tensor_bytes((bh, N, Nk), score_dtype)
    qk = matmul_traffic(N, Nk, D, dtype, batch=bh, out_dtype=score_dtype, name="S = Q K^T")
    softmax = Traffic("P = softmax(S)", SOFTMAX_FLOPS_PER_ELEMENT * bh * N * Nk, s_bytes, s_bytes)
    pv = Traffic("O = P V", 2 * bh * N * Nk * D,
                       s_bytes + tensor_bytes((bh, Nk, D), dtype), tensor_bytes((bh, N, D), dtype))
    return [qk, softmax, pv]


def fused_attention_kernel(B: int, H: int, N: int, D: int, dtype: torch.dtype = torch.float16,
                           Nk: int | None = None) -> Traffic:
    """One fused kernel (FlashAttention): the same FLOPs, but only Q, K, V are read and O written.

    This is the compulsory traffic: K and V read once. A real kernel reads them once per query
    block, and most of those re-reads hit the L2 cache; chapter 05 counts them.
    """
    Nk = N if Nk is None else Nk
    _check_dims(B=B, H=H, N=N, D=D, Nk=Nk)
    bh = B * H
    flops = int(attention_flops(B, H, N, Nk, D)) + SOFTMAX_FLOPS_PER_ELEMENT * bh * N * Nk
    read = tensor_bytes((bh, N, D), dtype) + 2 * tensor_bytes((bh, Nk, D), dtype)
    return Traffic("fused attention", flops, read, tensor_bytes((bh, N, D), dtype))


def format_traffic(kernels: list[Traffic]) -> str:
    """A markdown table of kernels: GFLOP, MiB read, MiB written, FLOP per byte, plus a total row."""
    lines = ["| kernel | GFLOP | read (MiB) | written (MiB) | FLOP/byte |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for k in kernels:
        lines.append(f"| {k.name} | {k.flops / 1e9:,.2f} | {k.bytes_read / MiB:,.1f} | "
                     f"{k.bytes_written / MiB:,.1f} | {k.intensity:,.1f} |")
    if len(kernels) > 1:
        f = sum(k.flops for k in kernels)
        r = sum(k.bytes_read for k in kernels)
        w = sum(k.bytes_written for k in kernels)
        lines.append(f"| **total** | {f / 1e9:,.2f} | {r / MiB:,.1f} | {w / MiB:,.1f} | {f / (r + w):,.1f} |")
    return "\n".join(lines)


# --- tracing what PyTorch code really does -------------------------------------------------------

def _footprint(t: torch.Tensor) -> int:
    # an expanded (stride-0) dimension repeats the same memory, so it does not add bytes
    return math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0) * t.element_size()


def _matmul_flops(name: str, args) -> int:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("mm", "bmm") and len(tensors) >= 2:
        a, b = tensors[0], tensors[1]
        return 2 * math.prod(a.shape[:-1]) * a.shape[-1] * b.shape[-1]
    return 0


def trace_traffic(fn: Callable, *args, **kwargs) -> tuple[object, list[Traffic]]:
    """Run ``fn(*args, **kwargs)`` and record every ATen operator it calls with the bytes it reads
    (its tensor inputs) and writes (its outputs). Views move no data and are left out.

    In eager mode on a GPU each recorded operator is (at least) one kernel launch and each of its
    inputs and outputs one pass over device memory. Call it on tensors on the ``meta`` device to
    count a large shape without allocating it. Returns ``(result, rows)``.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    rows: list[Traffic] = []

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, f_args=(), f_kwargs=None):
            f_kwargs = f_kwargs or {}
            out = func(*f_args, **f_kwargs)
            name = func.overloadpacket.__name__
            if func.is_view or name in ("_unsafe_view", "detach", "alias"):
                return out
            ins = [t for t in tree_flatten((f_args, f_kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            first = outs[0] if outs else None
            output = (f"{tuple(first.shape)} {str(first.dtype).replace('torch.', '')}"
                      if first is not None else "")
            rows.append(Traffic(name, _matmul_flops(name, f_args), sum(_footprint(t) for t in ins),
                                sum(_footprint(t) for t in outs), output,
                                writes={"output": sum(t.numel() for t in outs)}))
            return out

    with _Recorder():
        result = fn(*args, **kwargs)
    return result, rows


def format_ops(rows: list[Traffic], min_bytes: int = 0) -> str:
    """A markdown table of ``trace_traffic`` rows moving at least ``min_bytes``, plus a total row."""
    lines = ["| # | operator | output | read (MiB) | written (MiB) |",
             "| ---: | --- | --- | ---: | ---: |"]
    for i, r in enumerate(rows, 1):
        if r.bytes_read + r.bytes_written >= min_bytes:
            lines.append(f"| {i} | `{r.name}` | {r.output} | "
                         f"{r.bytes_read / MiB:,.1f} | {r.bytes_written / MiB:,.1f} |")
    read = sum(r.bytes_read for r in rows)
    written = sum(r.bytes_written for r in rows)
    lines.append(f"| | **total ({len(rows)} operators)** | | {read / MiB:,.1f} | {written / MiB:,.1f} |")
    return "\n".join(lines)


# --- softmax: passes over memory -----------------------------------------------------------------

@dataclass(frozen=True)
class SoftmaxPasses:
    algorithm: str
    reads_of_x: int
    writes_of_y: int
    note: str

    def bytes(self, numel: int, dtype: torch.dtype) -> int:
        return (self.reads_of_x + self.writes_of_y) * numel * element_size(dtype)


SOFTMAX_PASSES = [
    SoftmaxPasses("naive (no max)", 2, 1, "sum of exp(x); then exp(x) / sum, written out: overflows"),
    SoftmaxPasses("safe, three passes", 3, 1, "max; sum of exp(x - max); exp(x - max) / sum, written out"),
    SoftmaxPasses("online (chapter 04)", 2, 1, "running max and rescaled sum together; then normalise"),
]
