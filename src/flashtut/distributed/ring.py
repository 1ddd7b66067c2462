"""Ring attention (Liu et al., 2023): attention over a sequence cut across the ranks of a process
group, with the merge of chapter 04 combining what each rank computes.

Each rank holds a shard of the queries, keys and values (:func:`flashtut.distributed.shard`). At
step ``t`` it holds the key/value shard of rank ``r - t`` and:

1. posts the send of that shard to rank ``r + 1`` and the receive of the next one from ``r - 1``
   (``torch.distributed.batch_isend_irecv``: the transfer runs while the rank computes);
2. runs the kernel on its queries against the shard it holds (:mod:`flashtut.distributed.schedule`
   says which rows meet which under the zigzag cut), which returns a partial state ``(o, lse)``;
3. merges that state into its running one, in place, by the rule of
   :func:`flashtut.merge_attention_states`, which chapter 04 proves associative (so the order the
   shards arrive in does not matter);
4. waits for the transfer, and takes the received shard for the next step.

After ``world`` steps every query has met every key. The backward runs the same ring: each step's
kernel gets the final output and the whole row's log-sum-exp, returns this pair's ``dq`` (kept) and
``dk``, ``dv`` (added to the gradient of the key/value shard it belongs to), and the gradient travels
on with its shard, one step behind it, until it arrives home after the last step.

A rank makes ``world`` kernel calls per pass, so what a single call would do each time is done once
per pass: the inputs are checked before the ring starts (:func:`agree`), and the overflow guard,
which reads a flag back to the host for bfloat16 and float32, runs on the merged result
(:func:`guard_output`, :func:`guard_gradients`) instead of after every call.

:func:`ring_attention` is the autograd entry point; :func:`ring_forward_local` and
:func:`ring_backward_local` run the same steps for all ranks in one process, without the network:
what the chapter draws and what one GPU times.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..checks import (FLOAT_DTYPES, accum_dtype, capturing, check_causal, check_like, check_lse, check_qkv,
                      check_scale, output_health, overflow_flag, raise_if_flagged, scores_can_overflow)
from .kernels import check_backend_inputs, resolve_backend, shard_backward, shard_forward, shard_merge
from .schedule import Step, ring_schedule
from .sharding import check_world, shard, shard_ranges, unshard

#: per-rank fields that every rank must agree on (compared after one all_gather)
_AGREED = ("B", "H", "Hkv", "D", "dtype", "causal", "scale")


@dataclass(frozen=True)
class RingLayout:
    """What every rank agreed on before the ring starts: its place in the group, the global length
    ``n``, every rank's shard length, the mask, the scale, the kernel backend and its own steps."""
    rank: int
    world: int
    n: int
    lengths: tuple[int, ...]
    causal: bool
    scale: float
    backend: str
    steps: tuple[Step, ...]
    prev: int = 0          # global ranks of the neighbours (what P2POp takes)
    next: int = 0
    group: object = None


# -- one step, shared by the distributed ring and the one-process simulation ------------------

def span_of(x: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    """Rows ``[start, end)`` of ``x`` along the sequence (dim 2), a view (``x`` itself when the
    span is all of it: a ring over short shards feels the cost of every slice)."""
    start, end = span
    return x if start == 0 and end == x.shape[2] else x.narrow(2, start, end - start)


def forward_step(o, lse, q, k, v, step: Step, scale: float, backend: str) -> None:
    """Run ``step``'s kernel; merge its partial state into the running ``(o, lse)``, in
    place."""
    qr, kr = step.q_rows, step.kv_rows
    o_p, lse_p = shard_forward(span_of(q, qr), span_of(k, kr), span_of(v, kr),
                               step.causal, scale, backend)
    if step.step == 0:   # its own shard, every row: merged with the empty state, itself
        o.copy_(o_p)
        lse.copy_(lse_p)
    else:
        shard_merge(span_of(o, qr), span_of(lse, qr), o_p, lse_p, backend)


def backward_step(dq, q, k, v, o, lse, do, step: Step, scale: float, backend: str):
    """Run ``step``'s kernel and add its share of ``dq`` (this rank's queries) in place; return
    ``(kv_rows, dk, dv)``: its share of the gradient of the key/value shard held at this step,
    and the rows of that shard it belongs to."""
    qr, kr = step.q_rows, step.kv_rows
    dq_p, dk_p, dv_p = shard_backward(span_of(q, qr), span_of(k, kr), span_of(v, kr), span_of(o, qr),
                                      span_of(lse, qr), span_of(do, qr), step.causal, scale, backend)
    span_of(dq, qr).add_(dq_p)
    return kr, dk_p, dv_p


def empty_state(q: torch.Tensor):
    """The running state before any key: ``o = 0``, ``lse = -inf``, in the accumulation dtype."""
    acc_t = accum_dtype(q.dtype)
    return (torch.zeros(q.shape, dtype=acc_t, device=q.device),
            torch.full(q.shape[:-1], float("-inf"), dtype=acc_t, device=q.device))


def _named(**tensors):
    """``(name, tensor)`` pairs for the guard's message: a list of shards gives one pair each."""
    return tuple((name, t) for name, ts in tensors.items() for t in (ts if isinstance(ts, list) else [ts]))


def guard_output(states, scale: float, inputs, layout: RingLayout | None = None) -> None:
    """The overflow guard of a forward pass, once: raise the ``ValueError`` of
    :func:`flashtut.checks.raise_if_overflowed` if the merged ``(o, lse)`` of any state in
    ``states`` is not finite (every row of a rank sees a key: its own diagonal). One small host
    sync per pass, none for float16 (:func:`flashtut.checks.scores_can_overflow`); with a
    ``layout`` of a process group, the ranks OR their flags first, so that all of them raise."""
    o, lse = states[0]
    dtype, head_dim = inputs[0][1].dtype, o.shape[-1]
    if not scores_can_overflow(dtype, scale, head_dim) or capturing(lse):
        return
    bad = overflow_flag(lse, (0, lse.shape[-1]), o)
    for o, lse in states[1:]:
        bad = bad | overflow_flag(lse, (0, lse.shape[-1]), o)
    raise_if_flagged(_every_rank(bad, layout), dtype, scale, head_dim, "output", inputs)


def guard_gradients(grads, scale: float, inputs, layout: RingLayout | None = None) -> None:
    """The overflow guard of a backward pass, once: the ``ValueError`` of the single-call guard
    if any of the summed gradients ``grads`` is not finite (a step whose gradients overflowed
    leaves its sum NaN or infinite); with a ``layout``, on every rank of the group."""
    dtype, head_dim = inputs[0][1].dtype, grads[0].shape[-1]
    if not scores_can_overflow(dtype, scale, head_dim) or capturing(grads[0]):
        return
    health = sum(output_health(g).sum() for g in grads)
    raise_if_flagged(_every_rank(~torch.isfinite(health), layout), dtype, scale, head_dim, "gradients", inputs)


def _every_rank(bad: torch.Tensor, layout: RingLayout | None) -> torch.Tensor:
    """``bad`` ORed over the ranks of ``layout``'s group (one ``all_reduce`` of one number): a rank
    that raised alone would leave the others waiting for it in the next ring."""
    if layout is None or layout.world == 1:
        return bad
    flag = bad.to(torch.int32).reshape(1).to(_comm_device(bad, layout.group))
    try:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=layout.group)
    except RuntimeError as exc:
        raise _timed_out(layout.rank, "agreeing on the overflow guard (all_reduce)", exc) from exc
    return flag


# -- agreeing on the layout --------------------------------------------------------------------

def _comm_device(q, group) -> torch.device:
    """Where the group's collectives take their tensors: the GPU for NCCL (``q``'s, when it is on
    one), the CPU for gloo."""
    if dist.get_backend(group) != "nccl":
        return torch.device("cpu")
    if isinstance(q, torch.Tensor) and q.is_cuda:
        return q.device
    return torch.device("cuda", torch.cuda.current_device())


def _timed_out(layout_rank: int, what: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(
        f"ring_attention on rank {layout_rank}: {what} did not complete ({type(exc).__name__}: {exc}). "
        "A rank that raised, stopped or never called ring_attention leaves its peers waiting until the "
        "process group's timeout (init_process_group(..., timeout=...)); look for the error of another rank")


def agree(q, k, v, causal=False, scale=None, group=None, backend: str = "auto") -> RingLayout:
    """Check this rank's inputs, then agree with every rank of ``group`` on one layout.

    One ``all_gather`` of a few integers carries each rank's shapes, dtype, mask and scale, and
    whether its inputs were valid: a rank with bad inputs raises its own ``ValueError``/``TypeError``
    and the others a ``RuntimeError`` naming it, so no rank is left waiting in the ring. Ranks that
    disagree (shapes, dtype, mask, scale, or shard lengths that :func:`shard` would not give) raise
    ``ValueError`` naming what differs, on every rank.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring_attention needs an initialised process group: call "
                           "torch.distributed.init_process_group('gloo' or 'nccl', ...) on every rank first "
                           "(flashtut.distributed.run_world does it for a world of CPU processes)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the process group it passed")
    error, meta = None, [0] * (2 + len(_AGREED))
    try:
        B, H, Nq, Nk, D = check_qkv(q, k, v, gqa=True)
        if Nq != Nk:
            raise ValueError(f"q has {Nq} rows and k, v have {Nk}: each rank passes its shards of one sequence "
                             "(shard(x, rank, world, causal) of q, k and v), which have equal lengths")
        alignment = check_causal(causal)
        scale = check_scale(scale, D)
        backend = resolve_backend(backend, q)
        check_backend_inputs(q, k, v, scale, backend)
        scale_bits = int(torch.tensor(scale, dtype=torch.float64).view(torch.int64).item())
        meta = [0, Nq, B, H, k.shape[1], D, FLOAT_DTYPES.index(q.dtype), int(alignment is not None), scale_bits]
    except (TypeError, ValueError) as exc:
        error, meta[0] = exc, 1
    mine = torch.tensor(meta, dtype=torch.int64, device=_comm_device(q, group))
    gathered = [torch.empty_like(mine) for _ in range(world)]
    try:
        dist.all_gather(gathered, mine, group=group)
    except RuntimeError as exc:
        raise _timed_out(rank, "agreeing on the shapes with every rank (all_gather)", exc) from exc
    if error is not None:
        raise error
    rows = [g.tolist() for g in gathered]
    bad = [i for i, row in enumerate(rows) if row[0]]
    if bad:
        raise RuntimeError(f"ring_attention: rank(s) {bad} rejected their inputs (their own error says why); "
                           f"the inputs of rank {rank} were fine")
    for f, name in enumerate(_AGREED, start=2):
        values = [row[f] for row in rows]
        if len(set(values)) > 1:
            if name == "dtype":
                values = [str(FLOAT_DTYPES[x]).replace("torch.", "") for x in values]
            elif name == "scale":
                values = [torch.tensor(x).view(torch.float64).item() for x in values]
            raise ValueError(f"{name} differs between ranks ({', '.join(f'rank {i}: {x}' for i, x in enumerate(values))}); "
                             "every rank must pass shards of the same q, k, v with the same causal and scale")
    lengths = tuple(row[1] for row in rows)
    n, is_causal = sum(lengths), bool(rows[0][7])
    enough = n >= (2 * world if is_causal else world)
    wants = _layouts(n, world, is_causal, scale, backend)[0].lengths if enough else (None,) * world
    for r, (got, want) in enumerate(zip(lengths, wants)):
        if got != want:
            raise ValueError(f"rank {r} holds {got} rows, but shard(x, {r}, {world}, causal={is_causal}) of the "
                             f"{n} rows of all ranks gives {want}: pass the shards that "
                             "flashtut.distributed.shard returns")
    steps = _layouts(n, world, is_causal, scale, backend)[rank].steps
    glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return RingLayout(rank, world, n, lengths, is_causal, scale, backend, steps,
                      glob((rank - 1) % world), glob((rank + 1) % world), group)


# -- the ring over torch.distributed -----------------------------------------------------------

def exchange(layout: RingLayout, sends, recv_rows: int, tag: int):
    """Post the sends of ``sends`` to the next rank and the receives of as many tensors of
    ``recv_rows`` rows from the previous one; returns ``(works, received)`` (not yet waited on)."""
    recvs = [torch.empty((*t.shape[:2], recv_rows, t.shape[3]), dtype=t.dtype, device=t.device) for t in sends]
    ops = [dist.P2POp(dist.isend, t, layout.next, layout.group, tag + i) for i, t in enumerate(sends)]
    ops += [dist.P2POp(dist.irecv, t, layout.prev, layout.group, tag + i) for i, t in enumerate(recvs)]
    return dist.batch_isend_irecv(ops), recvs


def _wait(works, layout: RingLayout, what: str) -> None:
    try:
        for w in works:
            w.wait()
    except RuntimeError as exc:
        raise _timed_out(layout.rank, f"{what} from rank {layout.prev}", exc) from exc


def _source_rows(layout: RingLayout, t: int) -> int:
    return layout.lengths[(layout.rank - t) % layout.world]


def ring_forward(q, k, v, layout: RingLayout):
    """This rank's ``(o, lse)`` over the whole sequence: ``o`` in ``q``'s dtype,
    ``lse`` in the accumulation dtype."""
    o, lse = empty_state(q)
    cur_k, cur_v = k, v
    for t, step in enumerate(layout.steps):
        last = t == layout.world - 1
        if not last:    # the next shard travels while this one is computed
            rows = _source_rows(layout, t + 1)
            works, (nxt_k, nxt_v) = exchange(layout, (cur_k, cur_v), rows, 4 * t)
        forward_step(o, lse, q, cur_k, cur_v, step, layout.scale, layout.backend)
        if not last:
            _wait(works, layout, f"the K/V shard of step {t + 1}")
            cur_k, cur_v = nxt_k, nxt_v
    o = o.to(q.dtype)
    guard_output([(o, lse)], layout.scale, _named(q=q, k=k, v=v), layout)
    return o, lse


def ring_backward(q, k, v, o, lse, do, layout: RingLayout):
    """This rank's ``(dq, dk, dv)``: ``dq`` of its queries; ``dk``, ``dv`` of its own
    key/value shard, summed over every rank's queries as it travelled the ring."""
    acc_t = accum_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    cur_k, cur_v = k, v
    for t, step in enumerate(layout.steps):
        last = t == layout.world - 1
        rows = _source_rows(layout, t + 1)
        if not last:
            works, (nxt_k, nxt_v) = exchange(layout, (cur_k, cur_v), rows, 4 * t)
        kr, dk_p, dv_p = backward_step(dq, q, cur_k, cur_v, o, lse, do, step,
                                       layout.scale, layout.backend)
        if t == 0:   # its own shard, every row: the shard's gradient starts here
            grad = (dk_p.to(acc_t), dv_p.to(acc_t))
        else:        # added to what the ranks before summed into this shard's gradient
            _wait(grad_works, layout, f"the dK/dV of step {t}")
            span_of(grad[0], kr).add_(dk_p)
            span_of(grad[1], kr).add_(dv_p)
        if layout.world > 1:     # on to the next rank; after the last step, home
            sent = grad          # kept alive until the send is waited on
            grad_works, grad = exchange(layout, sent, rows, 4 * t + 2)
        if not last:
            _wait(works, layout, f"the K/V shard of step {t + 1}")
            cur_k, cur_v = nxt_k, nxt_v
    if layout.world > 1:
        _wait(grad_works, layout, "this rank's own dK/dV, home")
    grads = dq.to(q.dtype), grad[0].to(k.dtype), grad[1].to(v.dtype)
    inputs = _named(q=q, k=k, v=v, o=o, lse=lse, do=do)
    guard_gradients(grads, layout.scale, inputs, layout)
    return grads


class RingAttention(torch.autograd.Function):
    """Autograd node of :func:`ring_attention`: saves this rank's ``q, k, v, o`` and ``lse``."""

    @staticmethod
    def forward(ctx, q, k, v, layout: RingLayout):
        o, lse = ring_forward(q, k, v, layout)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.layout = layout
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, o, lse, do.contiguous(), ctx.layout)
        return dq, dk, dv, None


def ring_attention(q, k, v, causal=False, scale: float | None = None, group=None):
    """Attention over a sequence sharded across the ranks of ``group`` (``None``: the default
    group), differentiable.

    Every rank passes its own shards ``(B, H, n_r, D)`` of ``q`` and ``(B, Hkv, n_r, D)`` of ``k``
    and ``v``, cut by :func:`flashtut.distributed.shard` with the same ``causal`` (``False``,
    ``True``, ``"top-left"`` or ``"bottom-right"``: one mask for a whole sequence), and gets back
    its shard of the output of attention over the whole sequence, in ``q``'s dtype. ``k``/``v`` may
    have fewer heads than ``q`` (grouped-query). Works on gloo (CPU tensors, any float dtype; the
    tiled PyTorch loops run each step) and NCCL (CUDA tensors; the Triton kernels run each step)
    process groups. Bad inputs on any rank raise on every rank (see ``ring.agree``); a rank that
    stops leaves the others a ``RuntimeError`` after the group's timeout.
    """
    layout = agree(q, k, v, causal, scale, group)
    return RingAttention.apply(q, k, v, layout)


# -- the same steps in one process -------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _layouts(n: int, world: int, causal: bool, scale: float, backend: str) -> tuple[RingLayout, ...]:
    """Every rank's layout (without a group) for ``n`` rows over ``world`` ranks, computed once per
    shape: the schedule is pure Python, and a ring over short shards feels every microsecond."""
    lengths = tuple(sum(e - b for b, e in shard_ranges(n, r, world, causal)) for r in range(world))
    return tuple(RingLayout(r, world, n, lengths, causal, scale, backend, tuple(ring_schedule(r, world, n, causal)))
                 for r in range(world))


def _local_layouts(qs, ks, vs, causal, scale, backend) -> tuple[RingLayout, ...]:
    """Every rank's layout for shards ``qs``, ``ks``, ``vs``, after the checks that
    :func:`agree` makes across ranks (once per pass: the steps run unchecked)."""
    if not (isinstance(qs, (list, tuple)) and len(qs) == len(ks) == len(vs) >= 1):
        raise ValueError("qs, ks and vs must be lists of every rank's shards, one per rank, of equal length")
    for q, k, v in zip(qs, ks, vs):
        check_qkv(q, k, v, gqa=True)
    world, n = len(qs), sum(x.shape[2] for x in qs)
    is_causal = check_causal(causal) is not None
    scale = check_scale(scale, qs[0].shape[-1])
    backend = resolve_backend(backend, qs[0])
    if n < (2 * world if is_causal else world):
        raise ValueError(f"the shards hold {n} rows in all, fewer than shard(x, r, {world}, causal={is_causal}) "
                         "needs (one per chunk)")
    layouts = _layouts(n, world, is_causal, scale, backend)
    like = (qs[0].shape[:2], qs[0].shape[3], qs[0].dtype, qs[0].device, ks[0].shape[1])
    for r, (q, k) in enumerate(zip(qs, ks)):
        rows = layouts[0].lengths[r]
        if (q.shape[:2], q.shape[3], q.dtype, q.device, k.shape[1]) != like or not rows == q.shape[2] == k.shape[2]:
            raise ValueError(f"rank {r}'s shards do not match: pass the shards shard(x, r, {world}, "
                             f"causal={is_causal}) of one q, k, v (rank {r} holds {rows} of {n} rows)")
    check_backend_inputs(qs[0], ks[0], vs[0], scale, backend)   # what differs between ranks is checked above
    return layouts


def local_forward(qs, ks, vs, causal=False, scale: float | None = None, backend: str = "auto"):
    """Every rank's steps of the ring in one process, on the list of every rank's shards (rank ``r``
    at step ``t`` uses the shards of rank ``r - t``, exactly what the network would have brought
    it). Returns each rank's ``(o, lse)`` in the accumulation dtype."""
    layouts = _local_layouts(qs, ks, vs, causal, scale, backend)
    states = [empty_state(x) for x in qs]
    for t in range(len(qs)):
        for r, lay in enumerate(layouts):
            src = lay.steps[t].source
            forward_step(*states[r], qs[r], ks[src], vs[src], lay.steps[t], lay.scale, lay.backend)
    guard_output(states, layouts[0].scale, _named(q=list(qs), k=list(ks), v=list(vs)))
    return states


def local_backward(qs, ks, vs, os_, lses, dos, causal=False, scale: float | None = None, backend: str = "auto"):
    """The backward's steps of every rank in one process, on lists of shards: each rank's
    ``(dq, dk, dv)`` in the accumulation dtype."""
    layouts = _local_layouts(qs, ks, vs, causal, scale, backend)
    for q, o, lse, do in zip(qs, os_, lses, dos, strict=True):
        check_like("o", o, q)
        check_like("do", do, q)
        check_lse(lse, *q.shape[:3], q.device)
    acc_t = accum_dtype(qs[0].dtype)
    grads = [tuple(torch.zeros(x.shape, dtype=acc_t, device=x.device) for x in (q, k, v))
             for q, k, v in zip(qs, ks, vs)]
    for t in range(len(qs)):
        for r, lay in enumerate(layouts):
            src = lay.steps[t].source
            kr, dk_p, dv_p = backward_step(grads[r][0], qs[r], ks[src], vs[src], os_[r], lses[r], dos[r],
                                           lay.steps[t], lay.scale, lay.backend)
            span_of(grads[src][1], kr).add_(dk_p)
            span_of(grads[src][2], kr).add_(dv_p)
    guard_gradients([g for rank in grads for g in rank], layouts[0].scale,
                    _named(q=list(qs), k=list(ks), v=list(vs), o=list(os_), lse=list(lses), do=list(dos)))
    return grads


def ring_forward_local(q, k, v, world: int, causal=False, scale: float | None = None, backend: str = "auto"):
    """:func:`local_forward` on whole sequences: shards them, runs every rank's steps, and returns
    ``(o, lse)`` in the original order, ``o`` in ``q``'s dtype."""
    check_qkv(q, k, v, gqa=True)
    check_world(0, world)
    states = local_forward(*([shard(x, r, world, causal) for r in range(world)] for x in (q, k, v)),
                           causal=causal, scale=scale, backend=backend)
    o = unshard([s[0].to(q.dtype) for s in states], causal)
    return o, unshard([s[1][..., None] for s in states], causal)[..., 0]


def ring_backward_local(q, k, v, o, lse, do, world: int, causal=False, scale: float | None = None,
                        backend: str = "auto"):
    """:func:`local_backward` on whole sequences: ``(dq, dk, dv)`` in the original order."""
    check_qkv(q, k, v, gqa=True)
    check_world(0, world)
    cut = [[shard(x, r, world, causal) for r in range(world)] for x in (q, k, v, o, lse[..., None], do)]
    cut[4] = [x[..., 0] for x in cut[4]]
    grads = local_backward(*cut, causal=causal, scale=scale, backend=backend)
    return tuple(unshard([g[i].to(x.dtype) for g in grads], causal) for i, x in enumerate((q, k, v)))


__all__ = ["ring_attention", "RingAttention", "RingLayout", "agree", "exchange", "ring_forward", "ring_backward",
           "span_of", "forward_step", "backward_step", "guard_output", "guard_gradients", "empty_state",
           "local_forward", "local_backward", "ring_forward_local", "ring_backward_local"]
