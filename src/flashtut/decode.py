"""Split-KV decoding ("flash-decoding"): attention for a few query rows against a long K/V.

Why decoding needs its own schedule on a GPU
--------------------------------------------
A FlashAttention-2 kernel gives one thread block to each (batch, head, query block). When a
language model generates text it attends with one new query row per sequence (``Nq = 1``)
against the whole key/value cache, so there are only ``B * H`` thread blocks: with ``B = 1``
and 32 heads that is 32 blocks for the 132 SMs of an H100 SXM or H200, and 100 SMs sit idle
while the busy ones stream a long K/V through. The step is memory-bound (about one FLOP per
byte of K and V read), so what matters is how much of the memory bandwidth the launch can
draw, and a quarter of the SMs cannot draw all of it.

Splitting the keys into ``num_splits`` chunks gives ``B * H * num_splits`` independent
pieces of work. Each piece returns a partial output normalised over its own chunk and the
log-sum-exp of its scores; a small second step merges the partial states with the same
associative rule as the online softmax of chapter 04. The merge reads ``num_splits``
vectors of length ``D`` per query row, which is tiny next to the ``Nk * D`` keys and values
each split read, so it costs little.

This module is the algorithm in PyTorch: each chunk runs through
:func:`flashtut.tiled_attention` (the online softmax is written once, there) and the partial
states are combined by :func:`merge_attention_states`, which is written in terms of
:func:`flashtut.merge_softmax_states`.
"""
from __future__ import annotations

import functools
import math

import torch

from .checks import (accum_dtype, capturing, check_block, check_bool, check_float_dtype, check_mask,
                     check_qkv, check_scale, check_tensor, diag_offset, raise_if_overflowed,
                     rows_that_see_keys)
from .softmax import merge_softmax_states
from .tiled import attention_loops

_LSE_DTYPES = (torch.float32, torch.float64)


def split_bounds(n_keys: int, num_splits: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` key range of each of ``num_splits`` chunks of ``n_keys`` keys.

    Chunk sizes differ by at most one, so no split is much longer than the others (the
    slowest split sets the time of the whole launch). With more splits than keys some
    chunks are empty; they contribute the empty state and change nothing.
    """
    n_keys = check_block("n_keys", n_keys)
    num_splits = check_block("num_splits", num_splits)
    cuts = [(s * n_keys) // num_splits for s in range(num_splits + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def empty_attention_state(o_shape, device=None, dtype=torch.float32):
    """The state of attending to no key at all: output 0 and log-sum-exp ``-inf``.

    Merging it into any state returns that state unchanged.
    """
    o = torch.zeros(tuple(o_shape), dtype=dtype, device=device)
    lse = torch.full(tuple(o_shape)[:-1], float("-inf"), dtype=dtype, device=device)
    return o, lse


def _check_state(name_o: str, o, name_lse: str, lse) -> None:
    check_tensor(name_o, o)
    check_tensor(name_lse, lse)
    check_float_dtype(name_o, o)
    check_float_dtype(name_lse, lse, _LSE_DTYPES, "float32 or float64")
    if o.dim() < 1:
        raise ValueError(f"{name_o} must have a last dimension D, got a 0-d tensor")
    if tuple(lse.shape) != tuple(o.shape[:-1]):
        raise ValueError(f"{name_lse} must have the shape of {name_o} without its last dimension, "
                         f"{tuple(o.shape[:-1])}, got {tuple(lse.shape)}")
    if lse.device != o.device:
        raise ValueError(f"{name_lse} must be on {o.device} like {name_o}, got {lse.device}")


def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """Merge two partial attention states computed over disjoint sets of keys.

    A state is ``(o, lse)``: the output normalised over its own keys, shape
    ``(..., D)``, and the natural-log log-sum-exp of its scores, shape ``(...)``. Its
    softmax state in the sense of chapter 04 is ``(m, d) = (lse, 1)``, since
    ``exp(lse) * 1`` is its normaliser; :func:`flashtut.merge_softmax_states` combines
    the two normalisers, and each output is reweighted by the share of the total that
    its keys hold, ``exp(lse_x - lse)``.

    Associative and commutative (to rounding), like the softmax merge, so the partial
    states of any number of splits can be combined in any grouping. The empty state
    ``(0, -inf)`` is neutral; merging two empty states gives an empty state, not NaN.

    Returns ``(o, lse)``: ``o`` in the dtype of ``o_a``; ``lse`` in float32, or float64
    when any input is float64. Raises ``TypeError`` for a non-tensor and ``ValueError``
    for mismatched shapes, devices or dtypes.
    """
    _check_state("o_a", o_a, "lse_a", lse_a)
    _check_state("o_b", o_b, "lse_b", lse_b)
    if tuple(o_a.shape) != tuple(o_b.shape):
        raise ValueError(f"o_a and o_b must have one shape, "
                         f"got {tuple(o_a.shape)} and {tuple(o_b.shape)}")
    if o_a.device != o_b.device:
        raise ValueError(f"o_a and o_b must be on one device, "
                         f"got {o_a.device} and {o_b.device}")
    if o_a.dtype != o_b.dtype:
        raise ValueError(f"o_a and o_b must share one dtype, "
                         f"got {o_a.dtype} and {o_b.dtype}")
    wide = torch.float64 in (o_a.dtype, lse_a.dtype, lse_b.dtype)
    acc_t = torch.float64 if wide else torch.float32
    la, lb = lse_a.to(acc_t), lse_b.to(acc_t)
    one = torch.ones_like(la)
    m, d = merge_softmax_states(la, one, lb, one)
    lse = m + torch.log(d)  # both empty: -inf + log(0) = -inf, not NaN
    # an empty merged state has lse = -inf; subtracting 0 there keeps both weights at
    # exp(-inf) = 0
    lse_safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w_a = torch.exp(la - lse_safe)[..., None]
    w_b = torch.exp(lb - lse_safe)[..., None]
    o = w_a * o_a.to(acc_t) + w_b * o_b.to(acc_t)
    return o.to(o_a.dtype), lse


def _split_state(q, k_chunk, v_chunk, k_start: int, alignment, off: int, window,
                 scale: float):
    """Partial state of all query rows against one chunk of keys starting at
    ``k_start``.

    Inputs arrive already in the accumulation dtype, so the partial output is not
    rounded to float16/bfloat16 before the merge (a kernel keeps these partials in
    float32 too). Query ``i`` sees global key ``j <= i + off``, which is chunk key
    ``j - k_start <= i + off - k_start``: the chunk runs the tiled loops with its
    diagonal shifted by ``-k_start``.
    """
    return attention_loops(q, k_chunk, v_chunk, alignment, off - k_start, window, scale,
                           64, 64)


def _chunk_visible(k0: int, k1: int, n_q: int, alignment, off: int, window) -> bool:
    """Whether any query row may see a key of ``[k0, k1)``."""
    if k0 == k1:
        return False
    if alignment is None:
        return True
    if k0 > n_q - 1 + off:                       # right of the last row's diagonal
        return False
    return window is None or k1 - 1 > off - window   # the first row's window reaches it


def split_kv_attention(q, k, v, num_splits: int, causal=False,
                       scale: float | None = None, return_lse: bool = False,
                       window: int | None = None):
    """Attention computed as ``num_splits`` independent key chunks whose states are
    merged.

    Layout, ``scale``, ``causal`` and ``window`` as in the API: ``k``/``v`` are the
    key/value cache and may have fewer heads than ``q`` (grouped-query);
    ``causal="bottom-right"`` places the ``Nq`` queries at the end of the cache (query
    ``i`` sees keys ``j <= i + Nk - Nq``), so decoding one new token is ``Nq = 1`` and a
    prefill of several tokens is ``Nq > 1`` against the same cache. The result equals
    :func:`flashtut.tiled_attention` to rounding. On a GPU each chunk would be its own
    thread block, which is what lets a decoding step with one query row per sequence
    spread over all the SMs instead of ``B * H`` of them; see the module docstring.
    ``num_splits`` may exceed ``Nk``: it is clamped to ``Nk`` (a chunk with no key would
    contribute only the neutral state), so the cost never grows with it. A chunk that no
    row may see (right of every diagonal, or behind every window) contributes the empty
    state without being computed, not NaN.

    Returns ``o`` (shape and dtype of ``q``) or ``(o, lse)`` when ``return_lse=True``,
    with ``lse`` of shape ``(B, H, Nq)`` in float32 (float64 for float64 inputs). A
    non-integer or non-positive ``num_splits`` raises ``ValueError``.
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v, gqa=True)
    num_splits = min(check_block("num_splits", num_splits), Nk)
    alignment, window = check_mask(causal, window, Nq, Nk)
    scale = check_scale(scale, D)
    return_lse = check_bool("return_lse", return_lse)
    off = diag_offset(alignment, Nq, Nk)
    acc_t = accum_dtype(q.dtype)
    qa = q.to(acc_t)
    partials = []
    for k0, k1 in split_bounds(Nk, num_splits):
        if not _chunk_visible(k0, k1, Nq, alignment, off, window):
            partials.append(empty_attention_state((B, H, Nq, D), q.device, acc_t))
        else:
            partials.append(_split_state(qa, k[:, :, k0:k1].to(acc_t),
                                         v[:, :, k0:k1].to(acc_t),
                                         k0, alignment, off, window, scale))
    o, lse = functools.reduce(lambda a, b: merge_attention_states(*a, *b), partials)
    o = o.to(q.dtype)
    # the guard every path shares, once, on the merged result (a split's NaN reaches it)
    raise_if_overflowed(lse, q.dtype, scale, D, output=o,
                        seen=rows_that_see_keys(alignment, window, Nq, Nk),
                        inputs=(("q", q), ("k", k), ("v", v)))
    return (o, lse) if return_lse else o


def suggest_num_splits(batch: int, heads: int, n_queries: int, n_keys: int,
                       num_sms: int, block_m: int = 64,
                       min_keys_per_split: int = 256) -> int:
    """A simple rule for the number of key splits of one attention launch.

    Without splitting there are ``batch * heads * ceil(n_queries / block_m)`` thread
    blocks. Take the fewest splits that give every SM at least one block,
    ``ceil(num_sms / blocks)``, but never so many that a split holds fewer than
    ``min_keys_per_split`` keys (below that the merge and the launch cost more than the
    split saves), and never fewer than one. Prefill (long ``n_queries``) already has
    enough blocks and gets 1; decoding with few sequences gets several.

    Production heuristics refine this with the kernel's occupancy (blocks per SM) and
    the fraction of the last wave that is busy; the rule here is the first-order
    version.
    """
    batch = check_block("batch", batch)
    heads = check_block("heads", heads)
    n_queries = check_block("n_queries", n_queries)
    n_keys = check_block("n_keys", n_keys)
    num_sms = check_block("num_sms", num_sms)
    block_m = check_block("block_m", block_m)
    min_keys_per_split = check_block("min_keys_per_split", min_keys_per_split)
    blocks = batch * heads * math.ceil(n_queries / block_m)
    wanted = math.ceil(num_sms / blocks)
    cap = max(1, n_keys // min_keys_per_split)
    return max(1, min(wanted, cap))




# -- decoding over a KV cache, contiguous or paged -------------------------------------------------

def check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None):
    """Check the arguments of :func:`decode_attention` (the API reference's rules) and return
    ``(lengths, scale)``: the cache lengths as a list of ints and the resolved scale. While a CUDA
    graph is captured the lengths and the table are not read (``lengths`` is None): their values
    are checked on the eager calls.

    Contiguous cache: ``k_cache``/``v_cache`` are ``(B, Hkv, Nmax, D)`` and ``block_table`` is
    None. Paged cache: ``(num_pages, Hkv, page_size, D)`` with an int32 ``(B, max_pages)`` table.
    Every length must hold the ``Nq`` new queries and fit the cache (``Nmax``, or the table's
    ``max_pages * page_size``); the table entries a sequence uses must name pages of the pool.
    Bad input: ``TypeError`` (not a tensor) or ``ValueError`` naming the argument.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)):
        check_tensor(name, t)
    if block_table is not None:
        check_tensor("block_table", block_table)
    if q.dim() != 4:
        raise ValueError(f"q must be a 4-D tensor (B, H, Nq, D), got shape {tuple(q.shape)}")
    paged = block_table is not None
    layout = "(num_pages, Hkv, page_size, D)" if paged else "(B, Hkv, Nmax, D)"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor {layout}, got shape {tuple(t.shape)}")
    check_float_dtype("q", q)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_float_dtype(name, t)
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have the dtype of q, {str(q.dtype).replace('torch.', '')}, "
                             f"got {str(t.dtype).replace('torch.', '')}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on {q.device} like q, got {t.device}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"k_cache and v_cache must have one shape {layout}, "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    B, H, Nq, D = q.shape
    n0, Hkv, n2, Dk = k_cache.shape
    if B < 1 or H < 1 or Nq < 1 or D < 1:
        raise ValueError(f"q must have at least one batch entry, head, query and feature, "
                         f"got shape {tuple(q.shape)}")
    if Dk != D:
        raise ValueError(f"head dim D must match: q has D = {D}, k_cache has {Dk}")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"heads: q has H = {H} heads and k_cache, v_cache have Hkv = {Hkv}; accepted: "
                         "Hkv dividing H (query head h uses key/value head h // (H // Hkv))")
    if n0 < 1 or n2 < 1:
        raise ValueError(f"k_cache must have at least one {'page and row' if paged else 'sequence and position'}, "
                         f"got shape {tuple(k_cache.shape)}")
    if not paged and n0 != B:
        raise ValueError(f"k_cache must have q's batch B = {B} as its first dim (contiguous cache, "
                         f"block_table None), got {n0}")
    scale = check_scale(scale, D)
    if cache_seqlens.dtype != torch.int32:
        raise ValueError(f"cache_seqlens must have dtype int32, got {str(cache_seqlens.dtype).replace('torch.', '')}")
    if tuple(cache_seqlens.shape) != (B,):
        raise ValueError(f"cache_seqlens must have shape (B,) = ({B},), got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens must be on {q.device} like q, got {cache_seqlens.device}")
    if paged:
        if block_table.dtype != torch.int32:
            raise ValueError(f"block_table must have dtype int32, got {str(block_table.dtype).replace('torch.', '')}")
        if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"block_table must have shape (B, max_pages) = ({B}, >= 1), "
                             f"got {tuple(block_table.shape)}")
        if block_table.device != q.device:
            raise ValueError(f"block_table must be on {q.device} like q, got {block_table.device}")
        capacity, what = block_table.shape[1] * n2, f"max_pages * page_size = {block_table.shape[1]} * {n2}"
    else:
        capacity, what = n2, "Nmax"
    if capturing(q):          # a CUDA graph is being captured: the values stay on the device, unread
        return None, scale
    lengths = cache_seqlens.tolist()
    for b, n in enumerate(lengths):
        if n < Nq:
            raise ValueError(f"cache_seqlens[{b}] = {n} is shorter than the Nq = {Nq} new queries "
                             "(the cache holds them too): accepted Nq <= cache_seqlens[b]")
        if n > capacity:
            raise ValueError(f"cache_seqlens[{b}] = {n} is past the cache's {what} = {capacity} positions")
    if paged:
        table = block_table.tolist()
        for b, n in enumerate(lengths):
            used = table[b][:-(-n // n2)]
            bad = [p for p in used if not 0 <= p < n0]
            if bad:
                raise ValueError(f"block_table[{b}] names page {bad[0]}, outside the pool of "
                                 f"{n0} pages (accepted 0 to {n0 - 1})")
    return lengths, scale


def gather_cache(cache, b: int, length: int, block_table=None):
    """The first ``length`` positions of sequence ``b``, ``(Hkv, length, D)``: a slice of a
    contiguous ``(B, Hkv, Nmax, D)`` cache, or its pages, in table order, for a paged one."""
    if block_table is None:
        return cache[b, :, :length]
    page_size = cache.shape[2]
    pages = block_table[b, :-(-length // page_size)].long()
    rows = cache[pages]                            # (n_pages, Hkv, page_size, D)
    return rows.transpose(0, 1).reshape(cache.shape[1], -1, cache.shape[3])[:, :length]


def decode_attention_reference(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None,
                               num_splits: int = 1):
    """``decode_attention(..., backend="reference")``: for each sequence, gather its
    ``cache_seqlens[b]`` cached positions (through the block table when paged) and run
    :func:`split_kv_attention` with the bottom-right alignment. Any dtype, any device."""
    lengths, scale = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, scale)
    if lengths is None:
        raise RuntimeError("decode_attention(backend='reference') reads the cache lengths on the host, "
                           "which a CUDA graph cannot capture: capture backend='triton'")
    out = [split_kv_attention(q[b:b + 1], gather_cache(k_cache, b, n, block_table)[None],
                              gather_cache(v_cache, b, n, block_table)[None], num_splits,
                              causal="bottom-right", scale=scale)
           for b, n in enumerate(lengths)]
    return torch.cat(out, dim=0)


def decode_num_splits(batch: int, kv_heads: int, n_keys: int, num_sms: int,
                      programs_per_sm: int = 4, min_keys_per_split: int = 256,
                      max_splits: int = 64) -> int:
    """The split count of the decode kernel: :func:`suggest_num_splits` applied to
    its launch.

    The kernel packs every query head of a key/value group into one program (the
    group shares each K/V tile), so a split-free launch has ``batch * kv_heads``
    programs. A memory-bound kernel needs several programs resident per SM to keep
    enough loads in flight, so the target is ``programs_per_sm * num_sms`` programs;
    a split shorter than ``min_keys_per_split`` keys costs more in merge and launch
    than it brings, and ``max_splits`` bounds the partial-state buffer. Batch 1 over
    8 KV heads at 64k keys on 132 SMs: 64 splits; batch 32: 3.
    """
    per_sm = check_block("programs_per_sm", programs_per_sm)
    target = check_block("num_sms", num_sms) * per_sm
    wanted = suggest_num_splits(batch, kv_heads, 1, n_keys, target,
                                min_keys_per_split=min_keys_per_split)
    return min(wanted, check_block("max_splits", max_splits))


__all__ = ["split_kv_attention", "merge_attention_states", "empty_attention_state",
           "split_bounds", "suggest_num_splits", "check_decode_inputs", "gather_cache",
           "decode_attention_reference", "decode_num_splits"]
