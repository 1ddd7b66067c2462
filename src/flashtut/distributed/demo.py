"""What each rank runs in chapter 14's small worlds of CPU processes (:func:`run_world` starts them;
the ranks import these functions by name, so they live in the package, not in a notebook cell)."""
from __future__ import annotations

import torch

from ..reference import naive_attention
from ..model.gpt import GPT, GPTConfig
from .ring import ring_attention
from .sharding import shard
from .training import train_step


def random_qkv(n: int, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, seed: int = 0):
    """float64 ``q``, ``k``, ``v`` and an upstream gradient ``do`` of one sequence of ``n`` rows,
    the same on every rank (one seed)."""
    g = torch.Generator().manual_seed(seed)
    shapes = ((1, heads, n, head_dim), (1, kv_heads, n, head_dim), (1, kv_heads, n, head_dim), (1, heads, n, head_dim))
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def ring_versus_one_process(rank: int, world: int, n: int, causal: bool, seed: int = 0) -> dict:
    """This rank's ring attention (forward and backward) on its shard, against attention of the whole
    sequence in one process: the largest difference of the output and of each gradient."""
    q, k, v, do = random_qkv(n, seed=seed)
    mine = [shard(x, rank, world, causal).requires_grad_() for x in (q, k, v)]
    o = ring_attention(*mine, causal=causal)
    o.backward(shard(do, rank, world, causal))
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = naive_attention(*whole, causal=causal)
    ref.backward(do)
    out = {"rows": mine[0].shape[2], "o": (o - shard(ref, rank, world, causal)).abs().max().item()}
    for name, a, b in zip(("dq", "dk", "dv"), mine, whole):
        out[name] = (a.grad - shard(b.grad, rank, world, causal)).abs().max().item()
    return out


def tiny_gpt() -> GPTConfig:
    """The GPT of the chapter's training step: two layers, four query heads sharing two key/value heads."""
    return GPTConfig(vocab_size=64, n_layer=2, d_model=32, n_head=4, n_kv_head=2)


class PlainSGD:
    """Gradient descent written out (``step``, ``zero_grad``): a ``torch.optim`` optimiser would import
    ``torch._dynamo`` in each fresh rank process, seconds of start-up for a two-step demo."""

    def __init__(self, params, lr: float = 0.1):
        self.params, self.lr = list(params), lr

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.sub_(self.lr * p.grad)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None


def sharded_training(rank: int, world: int, idx: torch.Tensor, targets: torch.Tensor, steps: int = 3) -> list[float]:
    """``steps`` training steps of :func:`tiny_gpt` (float64, seed 0) on this rank's zigzag shard of
    ``idx``, ``targets`` ``(B, N)``; the global loss of each step."""
    model = GPT(tiny_gpt(), attention_backend="naive", seed=0).double()
    opt = PlainSGD(model.parameters())
    mine = [shard(t, rank, world, True, dim=1) for t in (idx, targets)]
    return [train_step(model, opt, *mine) for _ in range(steps)]


def one_process_training(idx: torch.Tensor, targets: torch.Tensor, steps: int = 3) -> list[float]:
    """The same steps in one process on the whole sequence."""
    model = GPT(tiny_gpt(), attention_backend="naive", seed=0).double()
    opt = PlainSGD(model.parameters())
    losses = []
    for _ in range(steps):
        _, loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


__all__ = ["random_qkv", "ring_versus_one_process", "tiny_gpt", "PlainSGD", "sharded_training",
           "one_process_training"]
