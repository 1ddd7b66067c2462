"""Input checks shared by every public function.

Each check raises the error class that ``API.md`` documents (``TypeError`` for a non-tensor,
``ValueError`` for a bad shape, dtype, scale or block size) with a message that names the
argument, what it got and what is accepted, so a reader can fix the call without reading code.
"""
from __future__ import annotations

import math
import numbers

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


def check_causal(causal) -> bool:
    if not isinstance(causal, (bool, int)) or isinstance(causal, float):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return bool(causal)


def check_qkv(q, k, v, dtypes=FLOAT_DTYPES, dtype_names: str = _DTYPE_NAMES):
    """Check the ``(B, H, Nq, D)``, ``(B, H, Nk, D)``, ``(B, H, Nk, D)`` layout of API.md.

    Returns ``(B, H, Nq, Nk, D)``.
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
    if k.shape[:2] != (B, H) or v.shape[:2] != (B, H):
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


def raise_if_overflowed(result: torch.Tensor, dtype: torch.dtype, scale: float, head_dim: int,
                        what: str = "output", neg_inf_ok: bool = False) -> None:
    """Raise the documented ValueError when ``result`` (computed from finite inputs) holds a NaN or
    an infinity because the scaled scores overflowed. Reads ``result`` only when the input dtype
    allows overflow at all (see :func:`scores_can_overflow`)."""
    if result.is_meta or not scores_can_overflow(dtype, scale, head_dim):
        return
    bad = torch.isnan(result) | torch.isposinf(result) if neg_inf_ok else ~torch.isfinite(result)
    if bool(bad.any()):
        acc = str(accum_dtype(dtype)).replace("torch.", "")
        raise ValueError(
            f"the scaled scores scale * q @ k^T overflow {acc} (the accumulation dtype of "
            f"{str(dtype).replace('torch.', '')} inputs; largest finite value "
            f"{torch.finfo(accum_dtype(dtype)).max:.3g}), or a value computed from them does, so the "
            f"{what} would be NaN or Inf; scale is {scale:.3g}: bring the inputs or the scale down")
