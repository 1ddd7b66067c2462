"""Training and evaluation: AdamW, a fixed seed, float32 on the CPU and mixed precision on a GPU."""
from __future__ import annotations

import contextlib

import torch

from ..checks import check_number
from .gpt import GPT


def autocast_dtype(device) -> torch.dtype | None:
    """The mixed-precision dtype for ``device``: bfloat16 on GPUs that have it (sm_80 and newer),
    float16 on older ones (Colab's T4), None (plain float32) on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def autocast(device, dtype: torch.dtype | None):
    """``torch.autocast`` on ``device`` in ``dtype``, or nothing when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def make_optimizer(model: GPT, lr: float = 3e-3, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """AdamW; weight decay on the matrices only (not on norm weights)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def train(model: GPT, batches, lr: float = 3e-3, weight_decay: float = 0.1, dtype: torch.dtype | None = None,
          grad_clip: float | None = 1.0, on_step=None) -> list[float]:
    """One optimiser step per ``(x, y)`` batch (moved to the model's device); returns the loss of
    each step. ``dtype``: the autocast dtype (None: float32); float16 gets a gradient scaler.
    ``on_step(step, loss)`` is called after each step."""
    lr, weight_decay = check_number("lr", lr), check_number("weight_decay", weight_decay, inclusive=True)
    if grad_clip is not None:
        grad_clip = check_number("grad_clip", grad_clip)
    device = next(model.parameters()).device
    opt = make_optimizer(model, lr, weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    model.train()
    losses = []
    for step, (x, y) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        with autocast(device, dtype):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if grad_clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    if not losses:
        raise ValueError("batches must hold at least one (x, y) batch; got none, so nothing was trained")
    return losses


@torch.no_grad()
def evaluate(model: GPT, batches, dtype: torch.dtype | None = None) -> float:
    """Mean loss over ``batches`` (no gradients, the model in eval mode)."""
    device = next(model.parameters()).device
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        with autocast(device, dtype):
            _, loss = model(x.to(device), y.to(device))
        total += float(loss)
        count += 1
    model.train()
    if count == 0:      # a mean over nothing is no loss at all, not a perfect 0.0
        raise ValueError("batches must hold at least one (x, y) batch to evaluate; got none")
    return total / count


__all__ = ["train", "evaluate", "make_optimizer", "autocast", "autocast_dtype"]
