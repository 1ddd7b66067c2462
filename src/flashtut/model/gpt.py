"""A small GPT: token embeddings, rotary positions, decoder blocks with grouped-query attention,
RMSNorm, a GELU MLP, and an output layer tied to the embeddings.

Every attention call goes through :mod:`flashtut.model.attention`, so the backend (``"naive"``,
``"sdpa"``, ``"tiled"``, ``"triton"``, ``"cuda"`` or a function of the reader's own) is one
attribute, :attr:`GPT.attention_backend`, and swapping it changes nothing else.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checks import check_block
from .attention import attend, attend_packed, attend_split_kv, check_backend
from .ids import check_token_ids

#: the label of a target position that has no next token (padding): the loss skips it
IGNORE_INDEX = -100


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a :class:`GPT`. ``n_kv_head`` key/value heads serve ``n_head`` query heads
    (``n_head % n_kv_head == 0``; 1 is multi-query attention, ``n_head`` ordinary multi-head);
    ``window`` limits every query to the last ``window`` keys (sliding-window attention)."""
    vocab_size: int = 256
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    n_kv_head: int = 2
    mlp_ratio: int = 4
    window: int | None = None
    rope_base: float = 10000.0

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "mlp_ratio"):
            check_block(name, getattr(self, name))
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head dim, got d_model / n_head = {self.head_dim}")
        if self.window is not None:
            check_block("window", self.window)
        base = self.rope_base
        if isinstance(base, (bool, np.bool_)) or not isinstance(base, numbers.Real):
            raise TypeError(f"rope_base must be a number (the rotary base, e.g. 10000.0), "
                            f"got {type(base).__name__} {base!r}")
        if not (math.isfinite(base) and base > 0):
            raise ValueError(f"rope_base must be a positive finite number (the rotary angles are "
                             f"position * rope_base^(-2i/D)), got {base!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 (float64 for float64) whatever the autocast dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        wide = torch.promote_types(x.dtype, torch.float32)
        xw = x.to(wide)
        y = xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(wide)).to(x.dtype)


def rotary_angles(positions: torch.Tensor, head_dim: int, base: float = 10000.0):
    """``(cos, sin)`` of the rotary angles ``position * base^(-2i / head_dim)``, shaped
    ``(..., 1, head_dim // 2)`` to broadcast over the heads of a ``(..., N, heads, head_dim)`` tensor."""
    # float64: position * frequency keeps its digits at long contexts; apply_rotary narrows it
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    return torch.cos(angles)[..., None, :], torch.sin(angles)[..., None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair ``(x_i, x_{i + D/2})`` of every head by its position's angle. The score
    of a rotated query and key then depends on their positions only through their difference."""
    wide = torch.promote_types(x.dtype, torch.float32)
    x1, x2 = x.to(wide).chunk(2, dim=-1)
    cos, sin = cos.to(wide), sin.to(wide)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class KVCache:
    """The keys and values of every layer for ``batch`` sequences of up to ``max_len`` tokens.

    ``decode`` says how the new tokens attend to it: ``"split-kv"`` through
    :func:`flashtut.split_kv_attention` with ``num_splits`` key chunks, or ``"backend"`` through
    the model's own attention backend with the bottom-right causal alignment."""

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device=None, dtype=torch.float32,
                 decode: str = "split-kv", num_splits: int = 1):
        if decode not in ("split-kv", "backend"):
            raise ValueError(f"decode must be 'split-kv' or 'backend', got {decode!r}")
        shape = (config.n_layer, check_block("batch", batch), config.n_kv_head, check_block("max_len", max_len),
                 config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.decode = decode
        self.num_splits = check_block("num_splits", num_splits)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store the new ``(B, Hkv, T, D)`` keys and values of ``layer`` after the cached ones and
        return everything cached for it (the cache's length advances once all layers have run)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} tokens; {end} do not fit")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def positions(self, n_new: int, device) -> torch.Tensor:
        """The positions of the next ``n_new`` tokens (every sequence has the same length)."""
        return torch.arange(self.length, self.length + n_new, device=device)

    def attend(self, layer: int, q, k, v, backend, window: int | None = None):
        """Store the new ``k``, ``v`` ``(B, Hkv, T, D)`` of ``layer`` and attend the new
        queries ``q`` ``(B, H, T, D)`` to everything cached, as ``decode`` says."""
        k, v = self.append(layer, k, v)
        if self.decode == "split-kv":
            return attend_split_kv(q, k, v, self.num_splits, window=window)
        return attend(q, k, v, backend, window=window)

    def advance(self, n_new: int) -> None:
        """Every layer has stored ``n_new`` more tokens."""
        self.length += n_new


class Attention(nn.Module):
    """Grouped-query self-attention: ``n_head`` query heads, ``n_kv_head`` key/value
    heads."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.config, self.layer = config, layer
        d, D = config.d_model, config.head_dim
        self.wq = nn.Linear(d, config.n_head * D, bias=False)
        self.wk = nn.Linear(d, config.n_kv_head * D, bias=False)
        self.wv = nn.Linear(d, config.n_kv_head * D, bias=False)
        self.wo = nn.Linear(config.n_head * D, d, bias=False)

    def forward(self, x, cos, sin, backend, cu_seqlens=None,
                cache: KVCache | None = None):
        cfg = self.config
        B, T, _ = x.shape
        q = apply_rotary(self.wq(x).view(B, T, cfg.n_head, cfg.head_dim), cos, sin)
        k = apply_rotary(self.wk(x).view(B, T, cfg.n_kv_head, cfg.head_dim), cos, sin)
        v = self.wv(x).view(B, T, cfg.n_kv_head, cfg.head_dim)
        # packed: B == 1, the rows are the sequences end to end
        if cu_seqlens is not None:
            o = attend_packed(q[0], k[0], v[0], cu_seqlens, backend,
                              window=cfg.window)[None]
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, D)
            if cache is not None:   # a KVCache, or paged_decoding.DecodeCache
                o = cache.attend(self.layer, q, k, v, backend, window=cfg.window)
            else:
                o = attend(q, k, v, backend, window=cfg.window)
            o = o.transpose(1, 2)
        return self.wo(o.reshape(B, T, cfg.n_head * cfg.head_dim))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.d_model
        self.up = nn.Linear(config.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, config.d_model, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.norm1, self.attn = RMSNorm(config.d_model), Attention(config, layer)
        self.norm2, self.mlp = RMSNorm(config.d_model), MLP(config)

    def forward(self, x, cos, sin, backend, cu_seqlens=None, cache=None):
        x = x + self.attn(self.norm1(x), cos, sin, backend, cu_seqlens, cache)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """A decoder-only language model whose attention backend is a parameter.

    ``forward(idx, targets=None, cu_seqlens=None, positions=None, cache=None)`` takes token ids
    ``idx`` ``(B, T)`` and returns ``(logits, loss)``; ``loss`` is the mean cross-entropy over the
    targets that are not :data:`IGNORE_INDEX` (None without targets). A packed batch is ``B = 1``
    with ``cu_seqlens`` and each token's ``positions`` inside its own sequence; with a ``cache``
    the tokens continue the cached ones (positions follow on) and the cache grows by ``T``. A
    cache is anything with ``positions(T, device)``, ``attend(layer, q, k, v, backend, window)``
    and ``advance(T)``: :class:`KVCache`, or the paged cache of chapter 12's serving loop.
    """

    def __init__(self, config: GPTConfig, attention_backend="sdpa", seed: int | None = 0):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.attention_backend = check_backend(attention_backend)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.d_model)
        if seed is not None:
            self.reset_parameters(seed)

    def reset_parameters(self, seed: int = 0):
        """Draw every weight from a generator seeded with ``seed``: two models built with one seed
        are identical, whatever the backend. Normal(0, 0.02); the projections that write into the
        residual stream are scaled down by ``sqrt(2 * n_layer)`` so its variance does not grow
        with depth."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:           # norm weights
                    p.fill_(1.0)
                    continue
                std = 0.02 / (math.sqrt(2 * self.config.n_layer) if name.endswith(("wo.weight", "down.weight")) else 1)
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, idx, targets=None, cu_seqlens=None, positions=None,
                cache: KVCache | None = None):
        self.attention_backend = check_backend(self.attention_backend)
        B, T = check_token_ids("idx", idx, targets=targets).shape
        if positions is None:
            positions = (cache.positions(T, idx.device) if cache is not None
                         else torch.arange(T, device=idx.device))
        cos, sin = rotary_angles(positions, self.config.head_dim, self.config.rope_base)
        try:
            x = self.embed(idx)
        except IndexError:  # (CPU) free to catch, where a check would cost a sync
            check_token_ids("idx", idx, self.config.vocab_size)
            raise
        for block in self.blocks:
            x = block(x, cos, sin, self.attention_backend, cu_seqlens, cache)
        if cache is not None:
            cache.advance(T)
        # tied: the embedding matrix, transposed
        logits = F.linear(self.norm(x), self.embed.weight)
        loss = None
        if targets is not None:
            # float32 at least
            wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
            loss = F.cross_entropy(wide.view(-1, logits.shape[-1]), targets.reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return logits, loss

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["GPT", "GPTConfig", "KVCache", "RMSNorm", "Attention", "MLP", "Block", "IGNORE_INDEX",
           "rotary_angles", "apply_rotary"]
