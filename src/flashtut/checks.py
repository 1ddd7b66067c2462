"""Input checks shared by every public function.

Each check raises the error class that the book's API reference documents (``TypeError`` for a non-tensor,
``ValueError`` for a bad shape, dtype, scale or block size) with a message that names the
argument, what it got and what is accepted, so a reader can fix the call without reading code.
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

#: dtypes the PyTorch-level functions accept
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DTYPE_NAMES = "float16, bfloat16, float32 or float64"


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype that sums and products are carried in: float64 for float64, else float32."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype is {str(dtype).replace('torch.', '')}; accepted: {_DTYPE_NAMES}")
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float_dtype(name: str, x: torch.Tensor, allowed=FLOAT_DTYPES, what: str | None = None) -> None:
    if x.dtype not in allowed:
        names = what or ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{name} has dtype {str(x.dtype).replace('torch.', '')}; accepted: {names}")


def check_scale(scale, head_dim: int) -> float:
    """Resolve ``scale``: ``None`` means ``1/sqrt(D)``; otherwise a positive finite number."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a positive float or None, got {type(scale).__name__}")
    scale = float(scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite float or None (= 1/sqrt(D)), got {scale}")
    return scale


def check_block(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_bool(name: str, value) -> bool:
    """A flag: ``True``/``False`` (a NumPy bool too); anything else is a TypeError, so that
    ``return_lse='no'`` cannot quietly mean True."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and "bool" in type(value).__name__):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_count(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number of things (trials, cases): a Python or NumPy integer in
    ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return int(value)


def check_number(name: str, value, minimum: float = 0.0, inclusive: bool = False) -> float:
    """A finite real number above ``minimum`` (at least it, when ``inclusive``): a learning rate,
    a clipping norm. Bools and strings are a TypeError, NaN, infinities and values out of range a
    ValueError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
        bound = f"at least {minimum:g}" if inclusive else f"above {minimum:g}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return value


def check_choice(name: str, value, choices, alternative: str = "") -> str:
    """One of the names in ``choices`` (a kernel, a backend): a non-string is a TypeError, another
    string a ValueError, each naming ``name`` and the choices; ``alternative`` ends the list of what
    is accepted (``" or a callable"``) where the caller takes something else besides."""
    accepted = f"one of {', '.join(map(repr, choices))}{alternative}"
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {accepted}, got {type(value).__name__} {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return value


CAUSAL_ALIGNMENTS = ("top-left", "bottom-right")


def check_causal(causal) -> str | None:
    """Resolve ``causal`` to its alignment: ``None`` (not causal), ``"top-left"`` or ``"bottom-right"``.

    ``False``/``True`` (Python or NumPy bools) mean no mask and ``"top-left"``. Another string is a
    ``ValueError``, another type (an int like ``2`` included) a ``TypeError``.
    """
    if isinstance(causal, str):
        if causal not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"causal must be False, True, 'top-left' or 'bottom-right', got {causal!r}")
        return causal
    # numpy.bool_ is not a subclass of bool (masks computed with NumPy give it); ints are refused
    # so that causal=2 cannot mean something by accident
    if isinstance(causal, (bool, np.bool_)):
        return "top-left" if bool(causal) else None
    raise TypeError(f"causal must be a bool, 'top-left' or 'bottom-right', got {type(causal).__name__}"
                    f" ({causal!r})")


def check_window(window, alignment: str | None, n_q: int | None = None, n_k: int | None = None) -> int | None:
    """``window``: ``None`` or a positive int, only together with a causal alignment.

    A window wider than the sequence lets every query see all the keys it may see, so, given the
    lengths ``n_q`` and ``n_k``, it is clamped to ``max(n_q, n_k)`` (the same mask): a window of
    ``10**20`` then works like any wide one instead of overflowing the index arithmetic."""
    if window is None:
        return None
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, numbers.Integral):
        raise TypeError(f"window must be None or a positive int, got {type(window).__name__} {window!r}")
    if window < 1:
        raise ValueError(f"window must be None or a positive int, got {window}")
    if alignment is None:
        raise ValueError(f"window={window} needs a causal alignment (causal=True, 'top-left' or "
                         "'bottom-right'); got causal=False")
    if n_q is not None and n_k is not None:
        # diag(i) - window < 0 <= j for every row once window >= max(n_q, n_k): no key hidden
        window = min(window, max(n_q, n_k, 1))
    return int(window)


def check_mask(causal, window=None, n_q: int | None = None,
               n_k: int | None = None) -> tuple[str | None, int | None]:
    """The one normaliser of the masking options: returns ``(alignment, window)``.

    ``alignment`` is ``None``, ``"top-left"`` or ``"bottom-right"``; ``window`` is ``None`` or a
    positive int, clamped to ``max(n_q, n_k)`` when the lengths are given. Every attention
    function calls this, so all of them accept the same values.
    """
    alignment = check_causal(causal)
    return alignment, check_window(window, alignment, n_q, n_k)


def diag_offset(alignment: str | None, n_q: int, n_k: int) -> int:
    """Query ``i`` sees key ``j`` when ``j <= i + diag_offset``: 0 for top-left, ``Nk - Nq`` for
    bottom-right (the last query sees the last key, as for a block of new tokens after a cache)."""
    return n_k - n_q if alignment == "bottom-right" else 0


def check_qkv(q, k, v, dtypes=FLOAT_DTYPES, dtype_names: str = _DTYPE_NAMES, gqa: bool = False):
    """Check the ``(B, H, Nq, D)``, ``(B, H, Nk, D)``, ``(B, H, Nk, D)`` layout of the API reference.

    With ``gqa=True``, ``k`` and ``v`` may have ``Hkv`` heads where ``H % Hkv == 0`` (grouped-query
    and multi-query attention). Returns ``(B, H, Nq, Nk, D)``; ``Hkv`` is ``k.shape[1]``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
        if t.dim() != 4:
            layout = "(B, H, Nq, D)" if name == "q" else "(B, H, Nk, D)"
            raise ValueError(f"{name} must be a 4-D tensor {layout}, got shape {tuple(t.shape)}")
        check_float_dtype(name, t, dtypes, dtype_names)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"q, k and v must share one dtype, got q: {q.dtype}, k: {k.dtype}, v: {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got q: {q.device}, k: {k.device}, v: {v.device}")
    B, H, Nq, D = q.shape
    if B < 1 or H < 1:
        raise ValueError(f"q must have at least one batch entry and one head, got B = {B}, H = {H} "
                         f"(shape {tuple(q.shape)})")
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch and head dims must match: q has batch B = {B}, k has {k.shape[0]}, v has {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, got k: {k.shape[1]}, v: {v.shape[1]}")
    Hkv = k.shape[1]
    if gqa:
        if Hkv < 1 or H % Hkv:
            raise ValueError(f"heads: q has H = {H} heads and k, v have Hkv = {Hkv}; accepted: "
                             "Hkv dividing H (query head h uses key/value head h // (H // Hkv))")
    elif Hkv != H:
        raise ValueError(
            f"batch and head dims must match: q has (B, H) = {(B, H)}, "
            f"k has {tuple(k.shape[:2])}, v has {tuple(v.shape[:2])}")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(
            f"head dim D must match: q has D = {D}, k has {k.shape[3]}, v has {v.shape[3]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(
            f"k and v must have the same sequence length Nk, got k: {k.shape[2]}, v: {v.shape[2]}")
    Nk = k.shape[2]
    if Nq < 1 or Nk < 1 or D < 1:
        raise ValueError(f"Nq, Nk and D must be at least 1, got Nq={Nq}, Nk={Nk}, D={D}")
    return B, H, Nq, Nk, D


def check_like(name: str, x, ref: torch.Tensor, ref_name: str = "q") -> torch.Tensor:
    """``x`` must be a tensor with the shape, device and dtype of ``ref`` (for ``o`` and ``do``)."""
    check_tensor(name, x)
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(
            f"{name} must have the shape of {ref_name}, {tuple(ref.shape)}, got {tuple(x.shape)}")
    if x.device != ref.device:
        raise ValueError(f"{name} must be on {ref.device} like {ref_name}, got {x.device}")
    check_float_dtype(name, x)
    if x.dtype != ref.dtype:
        raise ValueError(f"{name} must have the dtype of {ref_name}, "
                         f"{str(ref.dtype).replace('torch.', '')}, got {str(x.dtype).replace('torch.', '')}")
    return x


def check_lse(lse, B: int, H: int, Nq: int, device) -> torch.Tensor:
    check_tensor("lse", lse)
    if tuple(lse.shape) != (B, H, Nq):
        raise ValueError(f"lse must have shape (B, H, Nq) = {(B, H, Nq)}, got {tuple(lse.shape)}")
    if lse.device != device:
        raise ValueError(f"lse must be on {device} like q, got {lse.device}")
    check_float_dtype("lse", lse, (torch.float32, torch.float64), "float32 or float64")
    return lse


def check_cu_seqlens(name: str, cu, total: int, device) -> list[int]:
    """``cu_seqlens``: int32, ``[0, ..., total]``, non-decreasing. Returns it as a list."""
    check_tensor(name, cu)
    if cu.dtype != torch.int32:
        raise ValueError(f"{name} must have dtype int32, got {str(cu.dtype).replace('torch.', '')}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be a 1-D tensor of length batch + 1 >= 2, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {cu.device}")
    vals = cu.tolist()
    if vals[0] != 0:
        raise ValueError(f"{name} must start at 0, got {vals[0]}")
    if any(b < a for a, b in zip(vals, vals[1:])):
        raise ValueError(f"{name} must be non-decreasing (running totals of lengths), got {vals}")
    if vals[-1] != total:
        raise ValueError(f"{name} must end at the number of packed rows, {total}, got {vals[-1]}")
    return vals


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window):
    """Checks of ``varlen_attention``'s arguments; returns ``(bounds_q, bounds_k, mask, scale)``
    with the ``cu_seqlens`` as lists and ``mask = (alignment, window)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
        if t.dim() != 3:
            rows = "total_q" if name == "q" else "total_k"
            raise ValueError(f"{name} must be a 3-D packed tensor ({rows}, heads, D), got shape {tuple(t.shape)}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must have the same number of rows total_k, got k: {k.shape[0]}, v: {v.shape[0]}")
    if q.shape[0] < 1 or k.shape[0] < 1:
        raise ValueError(f"q and k must hold at least one packed row, got total_q = {q.shape[0]}, "
                         f"total_k = {k.shape[0]}")
    # the head, dtype, device and D checks of the dense layout, on a (1, heads, rows, D) view
    _, _, _, _, D = check_qkv(*(t.permute(1, 0, 2)[None] for t in (q, k, v)), gqa=True)
    cq = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    ck = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device)
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, "
                         f"got {len(cq) - 1} and {len(ck) - 1}")
    mask = check_mask(causal, window, q.shape[0], k.shape[0])
    scale = check_scale(scale, D)
    return cq, ck, mask, scale
# --- overflow of the scaled scores ------------------------------------------------------------------

def scores_can_overflow(dtype: torch.dtype, scale: float, head_dim: int) -> bool:
    """Whether ``scale * q . k`` can leave the range of the accumulation dtype for *some* finite
    inputs of ``dtype``, judged from the dtype alone: ``|q . k| <= D * maxval(dtype)^2``.

    False for float16 inputs with any sane scale (65504^2 * 128 is about 5.5e11, far below the
    float32 limit), so the fast path pays nothing; True for bfloat16, float32 and float64, whose
    range is as wide as their accumulator's, so a result must be checked (one reduction, one sync).
    """
    limit = torch.finfo(accum_dtype(dtype)).max
    big = float(torch.finfo(dtype).max)
    # the bound in logs, so that computing it cannot overflow itself
    return math.log(scale) + 2 * math.log(big) + math.log(head_dim) >= math.log(limit) - 1.0


def rows_that_see_keys(alignment: str | None, window: int | None, n_q: int, n_k: int) -> tuple[int, int]:
    """``[r0, r1)``: the query rows that see at least one key (every other row has output 0 and
    lse ``-inf``). Row ``i`` sees a key when ``i + off >= 0`` (bottom-right with ``Nq > Nk``
    leaves the first rows empty) and, with a window, when ``i + off - window < Nk - 1`` (top-left
    with ``Nq > Nk + window`` leaves the last rows empty)."""
    if alignment is None:
        return 0, n_q
    off = diag_offset(alignment, n_q, n_k)
    r0 = min(max(0, -off), n_q)
    r1 = n_q if window is None else min(n_q, n_k - 1 - off + window)
    return r0, max(r0, r1)


def output_health(o: torch.Tensor) -> torch.Tensor:
    """``0`` for each row of ``o`` whose values are all finite, NaN for a row with a NaN or an
    infinity: ``sum(o * 0)`` (a plain ``sum(o)`` could overflow on finite values). Added to a row's
    log-sum-exp, it leaves a finite lse unchanged and makes the lse of a broken row NaN, so that
    the overflow guard reads the lse alone (``D`` times smaller than ``o``)."""
    return (o * 0).sum(dim=-1, dtype=torch.float32 if o.dtype != torch.float64 else torch.float64)


def _overflow_error(dtype: torch.dtype, scale: float, what: str, inputs=()) -> ValueError:
    """The documented ValueError; on this (rare) path the inputs are read to say which one is to
    blame when an input itself holds a NaN or an infinity."""
    for name, t in inputs:
        if not isinstance(t, torch.Tensor):
            continue
        # an lse of -inf is a row that sees no key: only NaN and +inf are wrong there
        bad = (torch.isnan(t) | torch.isposinf(t)) if name == "lse" else ~torch.isfinite(t)
        if bool(bad.any()):
            return ValueError(f"{name} holds NaN or Inf values, so the {what} would be NaN or Inf; "
                              f"accepted: finite {name}")
    acc = str(accum_dtype(dtype)).replace("torch.", "")
    return ValueError(
        f"the scaled scores scale * q @ k^T overflow {acc} (the accumulation dtype of "
        f"{str(dtype).replace('torch.', '')} inputs; largest finite value "
        f"{torch.finfo(accum_dtype(dtype)).max:.3g}), or a value computed from them does, so the "
        f"{what} would be NaN or Inf; scale is {scale:.3g}: bring the inputs or the scale down")


def capturing(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on a GPU whose current stream is being captured into a CUDA graph: then
    nothing may be read back to the host (a read would end the capture), so checks of values are
    skipped; they run on the eager calls before the capture."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def raise_if_flagged(flag: torch.Tensor, dtype: torch.dtype, scale: float, head_dim: int,
                     what: str = "gradients", inputs=()) -> None:
    """Raise the overflow ValueError when ``flag`` (a one-element tensor that a kernel or a check
    set: nonzero means a non-finite value was produced) is set: the one host sync of the guard,
    skipped for dtypes whose scores cannot overflow (:func:`scores_can_overflow`) and while a CUDA
    graph is captured (:func:`capturing`)."""
    if flag.is_meta or not scores_can_overflow(dtype, scale, head_dim) or capturing(flag):
        return
    if bool(flag):
        raise _overflow_error(dtype, scale, what, inputs)


def raise_if_overflowed(lse: torch.Tensor, dtype: torch.dtype, scale: float, head_dim: int,
                        what: str = "output", seen: tuple[int, int] | None = None, inputs=(),
                        output: torch.Tensor | None = None) -> None:
    """The overflow guard of every attention path (reference, tiled, Triton): raise the documented
    ValueError when the scaled scores (or a value computed from them) overflowed.

    Reads ``lse`` only, ``(..., N)``: the log-sum-exp of each row, into which the path has folded
    :func:`output_health` of its output row, so a NaN or an infinity anywhere in a row's output
    shows as a NaN there. The rows ``seen = (r0, r1)`` (:func:`rows_that_see_keys`) must have a
    finite lse, the others ``-inf``; with ``seen=None`` (a packed batch, whose empty rows are
    scattered) only NaN and ``+inf`` are flagged. One reduction over ``N`` floats per row and one
    small host sync, and nothing at all for dtypes whose scores cannot overflow
    (:func:`scores_can_overflow`). ``inputs``: ``(name, tensor)`` pairs read only once an overflow
    was found, to blame an input that was not finite to begin with. ``output``: the path's output,
    whose :func:`output_health` is folded into ``lse`` here, only where the guard runs at all."""
    if lse.is_meta or not scores_can_overflow(dtype, scale, head_dim) or capturing(lse):
        return
    raise_if_flagged(overflow_flag(lse, seen, output), dtype, scale, head_dim, what, inputs)


def overflow_flag(lse: torch.Tensor, seen: tuple[int, int] | None = None,
                  output: torch.Tensor | None = None) -> torch.Tensor:
    """What :func:`raise_if_overflowed` reads, left on the device: a one-element bool tensor, True
    when ``lse`` (with ``output``'s health folded in) is not what rows ``seen`` allow. Callers that
    guard several results at once OR their flags and read them with one :func:`raise_if_flagged`."""
    if output is not None:
        lse = lse + output_health(output)
    if seen is None:
        return (torch.isnan(lse) | torch.isposinf(lse)).any()
    r0, r1 = seen
    bad = ~torch.isfinite(lse[..., r0:r1]).all()
    if r0 > 0 or r1 < lse.shape[-1]:           # rows that see no key: exactly -inf
        bad = bad | (lse[..., :r0] != float("-inf")).any() | (lse[..., r1:] != float("-inf")).any()
    return bad
