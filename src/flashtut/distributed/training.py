"""Chapter 12's GPT trained with its sequence sharded across ranks (context parallelism).

Everything in the model but attention is position-wise: embeddings, norms, the MLP and the output
layer see one token at a time. So each rank runs the whole model on its shard of the tokens, with
two changes: the rotary positions are the tokens' positions in the whole sequence (the zigzag shard
of ``0..N-1``), and attention is :func:`flashtut.distributed.ring_attention`. The loss is the mean
over every token of every rank (a sum of local sums over the global count), and the gradient of
each weight is summed over the ranks before the optimiser step, so every rank takes the step one
process would take on the whole sequence.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..model.gpt import GPT, IGNORE_INDEX
from .ring import ring_attention
from .sharding import shard


def ring_backend(group=None):
    """An attention backend for :class:`flashtut.model.GPT`: causal ring attention over ``group``."""
    def ring(q, k, v, window=None):
        if window is not None:
            raise ValueError(f"window={window}: ring attention here takes the causal mask without a window")
        return ring_attention(q, k, v, causal=True, group=group)
    return ring


def sharded_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor, group=None):
    """``(loss, n_tokens)`` of this rank's shard ``idx``, ``targets`` ``(B, n_r)`` (cut by
    ``shard(..., causal=True, dim=1)``): ``loss`` is this rank's share of the global mean, the sum
    of its tokens' cross-entropy over the count of every rank's targets, so the shares add up to the
    loss one process computes on the whole sequence."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a flashtut.model.GPT, got {type(model).__name__}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    lengths = torch.tensor([idx.shape[1], int((targets != IGNORE_INDEX).sum())], device=idx.device)
    dist.all_reduce(lengths, group=group)
    n, count = (int(x) for x in lengths.tolist())
    positions = shard(torch.arange(n, device=idx.device), rank, world, causal=True, dim=0)
    model.attention_backend = ring_backend(group)
    logits, _ = model(idx, positions=positions)
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce = F.cross_entropy(wide.reshape(-1, wide.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                         reduction="sum")
    return ce / max(count, 1), count


def train_step(model: GPT, optimizer, idx: torch.Tensor, targets: torch.Tensor,
               group=None) -> float:
    """One optimiser step of every rank on the whole sequence: returns the global
    loss (the same on every rank, and the same as one process's)."""
    loss, _ = sharded_loss(model, idx, targets, group)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)    # each weight's gradient, summed over ranks
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    return float(total)


__all__ = ["ring_backend", "sharded_loss", "train_step"]
