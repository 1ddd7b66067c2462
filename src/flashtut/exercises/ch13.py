"""Chapter 13 exercises: classify the tiles of a mask; write a mask the kernel can compile.

Exercise 13.1: ``fn(mask_mod, Nq, Nk, block) -> kinds``, the ``(cdiv(Nq, block), cdiv(Nk, block))``
int tensor of tile kinds (0 empty, 1 partial, 2 full). Besides the numbers, the checker grades the
technique: the mask must be evaluated on broadcast index tensors, in at most one call per query
block (one call for the whole grid is best), never once per element or per tile with Python numbers.

Exercise 13.2: ``fn(w) -> mask_mod``, a sliding window of ``w`` keys that also keeps key 0 (an
"attention sink", StreamingLLM): query ``i`` sees ``j = 0`` and ``i - w < j <= i``. Graded: the
mask at every position, and that the Triton kernel can compile it (written with elementwise
operations, no Python ``if`` on its arguments) and then gives the reference's attention.
"""
from __future__ import annotations

import torch

from ..block_mask import EMPTY, FULL, PARTIAL, check_mask_mod, create_block_mask, evaluate_mask, tile_kinds
from .. import masks
from ..flex_reference import flex_reference
from .checker import CheckResult, check_callable, compare

# --------------------------------------------------------------- exercise 13.1: tile kinds ----


def _doc_mask(n):
    ids = torch.tensor([0] * 9 + [1] * 17 + [2] * (n - 26))
    return masks.document(ids)


CASES_13_1 = (("causal", lambda n: masks.causal, 40, 40, 16), ("window 5", lambda n: masks.sliding_window(5), 50, 50, 16),
              ("document", _doc_mask, 45, 45, 16), ("prefix_lm 20", lambda n: masks.prefix_lm(20), 33, 47, 16),
              ("no mask", lambda n: (lambda b, h, q, kv: q >= 0), 37, 29, 16),
              ("causal, tiles of 8", lambda n: masks.causal, 30, 30, 8))


def reference_tile_kinds(mask_mod, Nq: int, Nk: int, block: int) -> torch.Tensor:
    """The library's classification (``flashtut.block_mask.tile_kinds``) for one batch and head."""
    return tile_kinds(mask_mod, 1, 1, Nq, Nk, block, block, "cpu")[0, 0]


class _Watched:
    """A mask_mod that records how it is called: how often, and whether with index tensors."""

    def __init__(self, mod):
        self.mod, self.calls, self.scalar_calls = mod, 0, 0

    def __call__(self, b, h, q_idx, kv_idx):
        self.calls += 1
        if not (isinstance(q_idx, torch.Tensor) and isinstance(kv_idx, torch.Tensor)) or \
                q_idx.numel() * kv_idx.numel() <= 1:
            self.scalar_calls += 1
        as_t = [x if isinstance(x, torch.Tensor) else torch.tensor(x) for x in (b, h, q_idx, kv_idx)]
        return self.mod(*as_t)


def check_tile_kinds(fn) -> CheckResult:
    """Check ``fn(mask_mod, Nq, Nk, block) -> kinds`` on causal, window, document, prefix-LM and
    unmasked cases with ragged ends (a tile that crosses the end of the queries or keys is never
    full), then grade how it evaluates the mask (see the module's docstring)."""
    check_callable("fn", fn)
    lines, ok = [], True
    for name, make, Nq, Nk, block in CASES_13_1:
        watched = _Watched(make(max(Nq, Nk)))
        try:
            got = fn(watched, Nq, Nk, block)
        except Exception as exc:  # noqa: BLE001 - the reader's code raised: say so
            return CheckResult(False, f"✗ {name}: your function raised {type(exc).__name__}: {exc}")
        want = reference_tile_kinds(make(max(Nq, Nk)), Nq, Nk, block)
        res = compare(got, want, atol=0, rtol=0, name=f"kinds, {name}, Nq={Nq} Nk={Nk} block={block}")
        ok &= bool(res)
        lines.append(str(res))
        n_bands = -(-Nq // block)
        if watched.scalar_calls:
            ok = False
            lines.append(f"✗ technique ({name}): mask_mod was called {watched.scalar_calls} times with single "
                         "positions; call it on broadcast index tensors (torch.arange(Nq)[:, None] and "
                         "torch.arange(Nk)[None, :]) so one call evaluates a whole band of rows")
        elif watched.calls > n_bands:
            ok = False
            lines.append(f"✗ technique ({name}): mask_mod was called {watched.calls} times, more than once per "
                         f"query block ({n_bands}); evaluate whole rows of tiles (or the whole grid) at once")
    if ok:
        lines.append("✓ the mask was evaluated on index tensors, at most once per query block")
    return CheckResult(ok, "\n".join(lines))


def solution_tile_kinds(mask_mod, Nq: int, Nk: int, block: int) -> torch.Tensor:
    """One call on broadcast index tensors, padded with hidden positions to whole tiles, then
    ``all`` and ``any`` over each tile."""
    q = torch.arange(Nq)[:, None]
    kv = torch.arange(Nk)[None, :]
    keep = mask_mod(torch.tensor(0), torch.tensor(0), q, kv).expand(Nq, Nk)
    nq, nk = -(-Nq // block), -(-Nk // block)
    padded = torch.zeros(nq * block, nk * block, dtype=torch.bool)
    padded[:Nq, :Nk] = keep
    tiles = padded.view(nq, block, nk, block)
    full = tiles.all(dim=3).all(dim=1)
    some = tiles.any(dim=3).any(dim=1)
    return torch.where(full, FULL, torch.where(some, PARTIAL, EMPTY))


# ----------------------------------------------------- exercise 13.2: a window with a sink ----

def reference_sink_window(w: int):
    """Query ``i`` sees key 0 and the keys ``i - w < j <= i``."""
    return masks.or_masks(masks.sliding_window(w), lambda b, h, q_idx, kv_idx: kv_idx == 0)


def _kernel_runs_here() -> bool:
    try:
        from ..triton.attention import interpreting
    except ImportError:
        return False
    return torch.cuda.is_available() or interpreting()


def check_sink_window(fn) -> CheckResult:
    """Check ``fn(w) -> mask_mod`` (a window of ``w`` keys plus key 0) at every position of several
    sizes, then that the Triton kernel compiles it and, where the kernel runs (a GPU, or the
    interpreter), that ``flashtut.flex_attention`` with it matches the float64 reference."""
    check_callable("fn", fn)
    lines, ok = [], True
    mods_made = []
    for w, Nq, Nk in ((4, 30, 30), (1, 17, 17), (9, 21, 40)):
        try:
            mod = check_mask_mod(fn(w))
            got = evaluate_mask(mod, 1, 1, Nq, Nk)[0, 0]
        except Exception as exc:  # noqa: BLE001 - the reader's code raised: say so
            return CheckResult(False, f"✗ w={w}: your mask_mod raised {type(exc).__name__}: {exc}")
        want = evaluate_mask(reference_sink_window(w), 1, 1, Nq, Nk)[0, 0]
        res = compare(got.to(torch.int8), want.to(torch.int8), atol=0, rtol=0,
                      name=f"mask (1 = the query sees the key), w={w}, Nq={Nq}, Nk={Nk}")
        ok &= bool(res)
        lines.append(str(res))
        mods_made.append(mod)
    if not ok:
        return CheckResult(False, "\n".join(lines + ["(fix the mask before the kernel sees it)"]))
    try:
        from ..triton import mods
        mods.compile_mask(fn(4))
    except ImportError:
        lines.append("- the kernel's compiler needs triton, which is not installed: not checked")
        return CheckResult(ok, "\n".join(lines))
    except TypeError as exc:
        return CheckResult(False, "\n".join(lines + [f"✗ technique: the Triton kernel cannot compile your mask: {exc}"]))
    lines.append("✓ the Triton kernel compiles your mask_mod")
    if _kernel_runs_here():
        from ..triton.flex_attention import triton_flex_attention
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, 40, 16, generator=gen).to(dev) for _ in range(3))
        bm = create_block_mask(fn(6), None, None, 40, 40, device=dev, BLOCK_SIZE=16)
        got = triton_flex_attention(q, k, v, block_mask=bm)
        ref = flex_reference(q.double(), k.double(), v.double(),
                                      block_mask=create_block_mask(reference_sink_window(6), None, None, 40, 40,
                                                                   device=dev, BLOCK_SIZE=16))
        res = compare(got, ref, atol=1e-4, rtol=1e-4, name="attention through the flex kernel, w=6")
        ok &= bool(res)
        lines.append(str(res))
    return CheckResult(ok, "\n".join(lines))


def solution_sink_window(w: int):
    def sink_window(b, h, q_idx, kv_idx):
        return ((q_idx >= kv_idx) & (q_idx - kv_idx < w)) | (kv_idx == 0)
    return sink_window


__all__ = ["check_tile_kinds", "reference_tile_kinds", "solution_tile_kinds", "check_sink_window",
           "reference_sink_window", "solution_sink_window"]
