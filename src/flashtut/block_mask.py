"""Block masks: a mask, read once at the size of the kernel's tiles.

A ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` of batch ``b``, head ``h``
may see key ``kv_idx``; it is written with elementwise tensor operations, so that one call on
broadcast index tensors evaluates it everywhere. A fused kernel works on tiles of
``BLOCK_SIZE x BLOCK_SIZE`` (query block x key block), and each tile is one of three kinds:

* **empty**: no query of the tile sees any key of it. The kernel never visits it.
* **full**: every query sees every key. The kernel visits it without evaluating the mask.
* **partial**: some do, some do not. The kernel visits it and applies the mask element by element.

:func:`create_block_mask` classifies every tile once and stores, per query block, the lists of its
full and of its partial key blocks (sparse: a count and the indices, ascending), plus the same
lists transposed, per key block, for the backward's programs that own keys. The result,
a :class:`BlockMask`, is computed once per mask and size and reused by every layer and step.
A tile that runs past the end of the queries or the keys is never full (its padding is masked),
so the kernel's full tiles need no bounds checks at all.

This module is pure PyTorch (the core layer): the kernels in ``flashtut.triton.flex`` read it.
"""
from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .checks import check_count

#: the kinds of a tile, as stored by :meth:`BlockMask.kinds`
EMPTY, PARTIAL, FULL = 0, 1, 2
#: the tile size of PyTorch's FlexAttention and of our kernels' mask blocks
DEFAULT_BLOCK_SIZE = 128
#: elements of the mask evaluated at once while building (bounds the builder's memory)
_CHUNK_ELEMENTS = 1 << 27


def check_mod(name: str, fn, n_args: int, args: str) -> Callable:
    """``fn`` must be callable with ``n_args`` positional arguments (``args`` names them)."""
    if not callable(fn):
        raise TypeError(f"{name} must be a function {name}({args}), got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):          # a builtin without a signature: let the call decide
        return fn
    try:
        sig.bind(*range(n_args))
    except TypeError:
        raise TypeError(f"{name} must take {n_args} positional arguments ({args}); "
                        f"got a function with signature {name}{sig}") from None
    return fn


def check_mask_mod(mask_mod) -> Callable:
    return check_mod("mask_mod", mask_mod, 4, "b, h, q_idx, kv_idx")


def check_score_mod(score_mod) -> Callable:
    return check_mod("score_mod", score_mod, 5, "score, b, h, q_idx, kv_idx")


def _check_dim(name: str, value, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        what = "None or a positive int" if allow_none else "a positive int"
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    return check_count(name, value, 1)


def check_mod_requirements(fn, B, H, Nq, Nk, name: str) -> None:
    """The ready-made mods of ``flashtut.masks`` say what sizes their tensors cover
    (``fn.requires``: ``{"positions": n}`` or ``{"heads": n}`` or ``{"batch": n}``); a call for
    other sizes is a ValueError naming the tensor, before any kernel reads past its end."""
    needs = getattr(fn, "requires", None) or {}
    what = getattr(fn, "__name__", name)
    n = needs.get("positions")
    if n is not None and max(Nq, Nk) > n:
        raise ValueError(f"{name} {what}: its tensor covers {n} positions, but the attention has "
                         f"Nq = {Nq} queries and Nk = {Nk} keys; give one entry per position")
    n = needs.get("heads")
    if n is not None and H is not None and H > n:
        raise ValueError(f"{name} {what}: its tensor has {n} entries, one per head, but the attention "
                         f"has H = {H} query heads")
    n = needs.get("batch")
    if n is not None and B is not None and B > n:
        raise ValueError(f"{name} {what}: its tensor has {n} entries, one per batch element, but the "
                         f"attention has B = {B}")


def index_grids(B: int, H: int, Nq: int, Nk: int, device=None, q_start: int = 0):
    """``b, h, q_idx, kv_idx`` as int64 tensors of shapes ``(B,1,1,1)``, ``(1,H,1,1)``,
    ``(1,1,Nq,1)``, ``(1,1,1,Nk)``: a mod called on them broadcasts to ``(B, H, Nq, Nk)``."""
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    q = torch.arange(q_start, q_start + Nq, device=device).view(1, 1, Nq, 1)
    kv = torch.arange(Nk, device=device).view(1, 1, 1, Nk)
    return b, h, q, kv


def evaluate_mask(mask_mod, B: int, H: int, Nq: int, Nk: int, device=None, q_start: int = 0) -> torch.Tensor:
    """``mask_mod`` at every position, a bool tensor ``(B, H, Nq, Nk)`` (rows ``q_start`` on).
    A mod that fails, or returns something that is not a bool tensor of a broadcastable shape,
    is a ValueError/TypeError that names it."""
    grids = index_grids(B, H, Nq, Nk, device, q_start)
    try:
        keep = mask_mod(*grids)
    except (IndexError, RuntimeError) as exc:
        raise ValueError(f"mask_mod failed on B = {B}, H = {H}, q_idx in [0, {q_start + Nq}), kv_idx in "
                         f"[0, {Nk}) ({type(exc).__name__}: {exc}); does a tensor it indexes cover "
                         "every position?") from None
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
        got = f"a {str(keep.dtype).replace('torch.', '')} tensor" if isinstance(keep, torch.Tensor) \
            else type(keep).__name__
        raise TypeError(f"mask_mod must return a bool tensor (True: the query sees the key), written with "
                        f"elementwise tensor operations such as q_idx >= kv_idx; it returned {got}")
    try:
        return keep.expand(B, H, Nq, Nk)
    except RuntimeError:
        raise ValueError(f"mask_mod returned shape {tuple(keep.shape)}, which does not broadcast to "
                         f"(B, H, Nq, Nk) = {(B, H, Nq, Nk)}: it must combine its arguments elementwise") from None


def mask_matrix(mask_mod, B, H, Nq: int, Nk: int, device=None) -> torch.Tensor:
    """The dense mask ``(B or 1, H or 1, Nq, Nk)``, True where the query sees the key."""
    check_mask_mod(mask_mod)
    B_, H_ = _check_dim("B", B, True) or 1, _check_dim("H", H, True) or 1
    return evaluate_mask(mask_mod, B_, H_, _check_dim("Nq", Nq, False), _check_dim("Nk", Nk, False), device)


def tile_kinds(mask_mod, B: int, H: int, Nq: int, Nk: int, block_q: int, block_kv: int,
               device=None) -> torch.Tensor:
    """EMPTY / PARTIAL / FULL for every tile, int8 ``(B, H, cdiv(Nq, block_q), cdiv(Nk, block_kv))``.

    The mask is evaluated a band of query blocks at a time; padding past ``Nq``/``Nk`` counts as
    hidden, so a tile that crosses the end is never full."""
    nqb, nkb = -(-Nq // block_q), -(-Nk // block_kv)
    kinds = torch.empty(B, H, nqb, nkb, dtype=torch.int8, device=device)
    band = max(1, _CHUNK_ELEMENTS // max(1, B * H * block_q * nkb * block_kv))
    for q0 in range(0, nqb, band):
        q1 = min(nqb, q0 + band)
        rows = min(Nq, q1 * block_q) - q0 * block_q
        keep = evaluate_mask(mask_mod, B, H, rows, Nk, device, q_start=q0 * block_q)
        pad = torch.zeros(B, H, (q1 - q0) * block_q, nkb * block_kv, dtype=torch.bool, device=keep.device)
        pad[:, :, :rows, :Nk] = keep
        tiles = pad.view(B, H, q1 - q0, block_q, nkb, block_kv)
        some = tiles.any(dim=5).any(dim=3)
        every = tiles.all(dim=5).all(dim=3)
        kinds[:, :, q0:q1] = torch.where(every, FULL, torch.where(some, PARTIAL, EMPTY)).to(torch.int8)
    return kinds


def sparse_lists(kinds: torch.Tensor, which: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of tiles, ``(count, indices)`` of the tiles of kind ``which``: int32 ``(..., rows)``
    and ``(..., rows, cols)``, the selected columns first in ascending order (the rest unused)."""
    chosen = kinds == which
    count = chosen.sum(dim=-1, dtype=torch.int32)
    order = torch.argsort((~chosen).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count.contiguous(), order.contiguous()


@dataclass(frozen=True)
class BlockMask:
    """The sparse block structure of a mask for one size, built by :func:`create_block_mask`.

    Per query block ``m`` (of ``batch``, ``head``): ``kv_num_blocks[.., m]`` partial key blocks,
    listed in ``kv_indices[.., m, :count]``, and ``full_kv_num_blocks``/``full_kv_indices`` the
    full ones. ``q_*`` are the same lists per key block (the transposed mask), for the backward.
    ``B``/``H`` are ``None`` when the mask does not depend on them (the lists then have size 1
    there and serve every batch element or head)."""
    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    full_q_num_blocks: torch.Tensor
    full_q_indices: torch.Tensor
    B: int | None
    H: int | None
    Nq: int
    Nk: int
    block_size: tuple[int, int]
    mask_mod: Callable | None

    @property
    def shape(self) -> tuple:
        return (self.B, self.H, self.Nq, self.Nk)

    @property
    def device(self) -> torch.device:
        return self.kv_indices.device

    def kinds(self) -> torch.Tensor:
        """The dense int8 map of tile kinds ``(B or 1, H or 1, query blocks, key blocks)``."""
        out = torch.zeros(self.kv_indices.shape, dtype=torch.int8, device=self.device)
        cols = torch.arange(out.shape[-1], device=self.device)
        for num, idx, kind in ((self.kv_num_blocks, self.kv_indices, PARTIAL),
                               (self.full_kv_num_blocks, self.full_kv_indices, FULL)):
            listed = cols < num[..., None].long()
            out.scatter_add_(-1, idx.long(), torch.where(listed, kind, 0).to(torch.int8))
        return out

    def visited_fraction(self) -> float:
        """The fraction of tiles the kernel visits (partial or full)."""
        total = self.kv_indices.numel()
        return float((self.kv_num_blocks.sum() + self.full_kv_num_blocks.sum()).item()) / max(total, 1)

    def to(self, device) -> "BlockMask":
        """The same block mask with its lists on ``device``."""
        moved = {f: getattr(self, f).to(device) for f in _LIST_FIELDS}
        return BlockMask(**moved, B=self.B, H=self.H, Nq=self.Nq, Nk=self.Nk, block_size=self.block_size,
                         mask_mod=self.mask_mod)

    def check_for(self, B: int, H: int, Nq: int, Nk: int) -> None:
        """A ValueError naming ``block_mask`` unless it was built for these sizes."""
        wrong = [f"{n} = {got} (built for {mine})" for n, mine, got in
                 (("B", self.B, B), ("H", self.H, H), ("Nq", self.Nq, Nq), ("Nk", self.Nk, Nk))
                 if mine is not None and mine != got]
        if wrong:
            raise ValueError("block_mask was built for other sizes: the inputs have " + ", ".join(wrong)
                             + "; build it with create_block_mask(mask_mod, B, H, Nq, Nk)")

    def __repr__(self) -> str:
        return (f"BlockMask(B={self.B}, H={self.H}, Nq={self.Nq}, Nk={self.Nk}, block_size={self.block_size}, "
                f"visited={self.visited_fraction():.1%} of the tiles, "
                f"mask_mod={getattr(self.mask_mod, '__name__', self.mask_mod)})")


_LIST_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def block_mask_from_kinds(kinds: torch.Tensor, B, H, Nq: int, Nk: int, block_size: tuple[int, int],
                          mask_mod=None) -> BlockMask:
    """The sparse lists (both directions) of a map of tile kinds."""
    kv_num, kv_idx = sparse_lists(kinds, PARTIAL)
    full_kv_num, full_kv_idx = sparse_lists(kinds, FULL)
    kinds_t = kinds.transpose(-1, -2)
    q_num, q_idx = sparse_lists(kinds_t, PARTIAL)
    full_q_num, full_q_idx = sparse_lists(kinds_t, FULL)
    return BlockMask(kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx,
                     B, H, Nq, Nk, block_size, mask_mod)


def _check_block_size(BLOCK_SIZE) -> tuple[int, int]:
    sizes = BLOCK_SIZE if isinstance(BLOCK_SIZE, tuple) else (BLOCK_SIZE, BLOCK_SIZE)
    if len(sizes) != 2:
        raise ValueError(f"BLOCK_SIZE must be an int or a pair (query block, key block), got {BLOCK_SIZE!r}")
    for s in sizes:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral) or s < 16 or s & (s - 1):
            raise ValueError(f"BLOCK_SIZE must be a power of two >= 16 (the kernels' tiles divide it), "
                             f"got {BLOCK_SIZE!r}")
    return int(sizes[0]), int(sizes[1])


def _default_device(device):
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def create_block_mask(mask_mod, B, H, Nq, Nk, device=None, BLOCK_SIZE=DEFAULT_BLOCK_SIZE) -> BlockMask:
    """Build the :class:`BlockMask` of ``mask_mod(b, h, q_idx, kv_idx) -> bool`` for ``B`` batch
    elements, ``H`` query heads, ``Nq`` queries and ``Nk`` keys, once, to be reused.

    ``B``/``H`` may be ``None`` for a mask that does not depend on them. ``device``: where the
    mask is evaluated and the lists live (``None``: the GPU when there is one, else the CPU).
    ``BLOCK_SIZE``: the tile, an int or ``(query block, key block)``, powers of two >= 16."""
    check_mask_mod(mask_mod)
    B, H = _check_dim("B", B, True), _check_dim("H", H, True)
    Nq, Nk = _check_dim("Nq", Nq, False), _check_dim("Nk", Nk, False)
    block = _check_block_size(BLOCK_SIZE)
    check_mod_requirements(mask_mod, B, H, Nq, Nk, "mask_mod")
    kinds = tile_kinds(mask_mod, B or 1, H or 1, Nq, Nk, *block, _default_device(device))
    return block_mask_from_kinds(kinds, B, H, Nq, Nk, block, mask_mod)


def dense_block_mask(Nq: int, Nk: int, device=None, BLOCK_SIZE=DEFAULT_BLOCK_SIZE) -> BlockMask:
    """The block mask of no mask at all: every tile full, but those that cross the end of the
    queries or keys (partial: their padding is hidden). Built without evaluating anything."""
    bq, bk = _check_block_size(BLOCK_SIZE)
    nqb, nkb = -(-Nq // bq), -(-Nk // bk)
    kinds = torch.full((1, 1, nqb, nkb), FULL, dtype=torch.int8, device=_default_device(device))
    if Nq % bq:
        kinds[..., -1, :] = PARTIAL
    if Nk % bk:
        kinds[..., -1] = PARTIAL
    return block_mask_from_kinds(kinds, None, None, Nq, Nk, (bq, bk), None)


__all__ = ["BlockMask", "create_block_mask", "dense_block_mask", "mask_matrix", "tile_kinds", "sparse_lists",
           "block_mask_from_kinds", "evaluate_mask", "index_grids", "check_mask_mod", "check_score_mod",
           "check_mod_requirements", "EMPTY", "PARTIAL", "FULL", "DEFAULT_BLOCK_SIZE"]
