"""Beyond one GPU: ring attention over ``torch.distributed`` (chapter 14).

A sequence too long for one GPU is cut across the ranks of a process group; each rank keeps its
shard of the queries and passes key/value shards around a ring, merging partial softmax states with
the rule of chapter 04. The package sits above the kernels it calls:

* ``sharding``: :func:`shard` and :func:`unshard` (contiguous without a mask, zigzag with one);
* ``schedule``: which rows meet which keys at each step of the ring;
* ``balance``: the work per rank under the contiguous, striped and zigzag cuts, in tiles;
* ``kernels``: the per-shard attention returning ``(o, lse)`` (tiled PyTorch or Triton) and its backward;
* ``ring``: :func:`ring_attention` (autograd), its forward and backward over ``batch_isend_irecv``,
  and the same steps run in one process;
* ``world``: :func:`run_world`, a world of CPU processes on gloo for tests and the chapter;
* ``training``: a training step of chapter 12's GPT with its sequence sharded;
* ``demo``: what each rank runs in the chapter's small gloo worlds.
"""
from __future__ import annotations

from .balance import SCHEMES, balance_table, imbalance, row_owner, tiles, work_per_rank
from .ring import (RingAttention, agree, local_backward, local_forward, ring_attention, ring_backward_local,
                   ring_forward_local)
from .schedule import Step, ring_schedule
from .sharding import shard, shard_ranges, unshard
from .training import ring_backend, sharded_loss, train_step
from .world import WorldError, run_world

__all__ = ["ring_attention", "shard", "unshard", "shard_ranges", "ring_schedule", "Step", "RingAttention",
           "agree", "ring_forward_local", "ring_backward_local", "local_forward", "local_backward", "work_per_rank", "balance_table", "imbalance",
           "tiles", "row_owner", "SCHEMES", "run_world", "WorldError", "ring_backend", "sharded_loss", "train_step"]
