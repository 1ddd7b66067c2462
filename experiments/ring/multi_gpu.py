"""Ring attention measured on every GPU of one machine: NCCL, the zigzag cut, D = 128.

Run by torchrun, one process per GPU (experiments/ring/multi_gpu.sh does it):

    torchrun --standalone --nproc_per_node=NGPU experiments/ring/multi_gpu.py --out-dir $OUT

For each dtype (float16, bfloat16), mask (none, causal) and total length N (128k to 1M tokens, while
the budget lasts), every rank generates the same q, k, v, dO (B = 1, H = 16, D = 128) and keeps its
shard. It measures, as the slowest rank sees it (max over ranks of each rank's median):

* ring: ``ring_attention`` forward, and its backward, over the NCCL group;
* compute: the same rank's steps without the network (its query shard against every rank's shard,
  merged): one GPU on its own shard. efficiency = compute / ring;
* comm: the ring's K/V transfers alone (world - 1 exchanges of a K/V shard); hidden = the share of
  it that the ring does not add to the compute time, ``1 - (ring - compute) / comm``, clipped to [0, 1];
* the error of 64 sampled query rows of each rank against a float32 reference over the whole
  sequence, next to the error of attention computed in the input precision (the yardstick: at most 2x);
* the tiles each rank computes (flashtut.distributed.work_per_rank) and their imbalance.

Rank 0 writes $OUT/ring_multi_gpu_<gpu>.json (flashtut.bench speed rows) after each case, and a
profiler timeline of one causal forward+backward at the smallest N ($OUT/ring_timeline_rank0.json).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from flashtut.bench.provenance import collect
from flashtut.bench.results import save_results
from flashtut.distributed import imbalance, ring_attention, shard, work_per_rank
from flashtut.distributed.ring import agree, backward_step, empty_state, exchange, forward_step, span_of

B, H, D = 1, 16, 128
ROWS = 64          # sampled query rows per rank for the error against the float32 reference


def timed(fn, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` calls (one warm-up first), every rank starting together
    (CUDA events; the wall clock for the CPU smoke run)."""
    fn()
    out = []
    for _ in range(reps):
        if not torch.cuda.is_available():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
            continue
        torch.cuda.synchronize()
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return out


def slowest(ms: float, dev) -> float:
    t = torch.tensor([ms], device=dev, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def reference_rows(q_rows, pos, k, v, do_rows, causal, scale):
    """float32 attention (and dq) of a few query rows at global positions ``pos`` over every key,
    one head at a time; plus the same in the input precision (probabilities rounded before P @ V)."""
    o32, dq32, olow = [], [], []
    for h in range(q_rows.shape[1]):
        kh, vh = k[:, h], v[:, h]
        qh = q_rows[:, h].float().requires_grad_()
        s = (qh @ kh.float().transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.arange(k.shape[2], device=k.device)[None, None, :] > pos[None, :, None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        oh = p @ vh.float()
        (dqh,) = torch.autograd.grad(oh, qh, do_rows[:, h].float())
        o32.append(oh.detach())
        dq32.append(dqh)
        sl = (q_rows[:, h] @ kh.transpose(-1, -2)) * scale
        if causal:
            sl = sl.masked_fill(torch.arange(k.shape[2], device=k.device)[None, None, :] > pos[None, :, None], float("-inf"))
        olow.append((torch.softmax(sl.float(), dim=-1).to(q_rows.dtype) @ vh).float())
        del s, p, sl
    return torch.stack(o32, 1), torch.stack(dq32, 1), torch.stack(olow, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--sizes", default="131072,262144,524288,1048576")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU processes on gloo at tiny sizes (checks the script, times nothing real)")
    args = ap.parse_args(argv)
    local = int(os.environ.get("LOCAL_RANK", 0))
    global H, D
    if args.smoke:
        H, D = 2, 16
        dist.init_process_group("gloo")
        dev, gpu = torch.device("cpu"), "cpu"
    else:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        dev = torch.device("cuda", local)
        gpu = torch.cuda.get_device_name(dev).split()[-1].lower().replace("-", "")
    rank, world = dist.get_rank(), dist.get_world_size()
    path = f"{args.out_dir}/ring_multi_gpu_{gpu}_x{world}.json"
    start = time.monotonic()
    rows, profiled = [], False
    for n in (int(x) for x in args.sizes.split(",")):
        for causal in (True, False):
            for dtype in (torch.float16, torch.bfloat16):
                # every rank must take the same decision, or the ranks that go on wait forever
                over = torch.tensor([float(time.monotonic() - start > args.budget_s)], device=dev)
                dist.all_reduce(over, op=dist.ReduceOp.MAX)
                if over.item():
                    continue
                g = torch.Generator(device=dev).manual_seed(n)
                full = [torch.randn(B, H, n, D, device=dev, dtype=dtype, generator=g) for _ in range(4)]
                q, k, v, do = (shard(x, rank, world, causal) for x in full)
                kvs = [[shard(x, r, world, causal) for r in range(world)] for x in full[1:3]]
                pos_all = shard(torch.arange(n, device=dev), rank, world, causal, dim=0)
                pick = torch.linspace(0, q.shape[2] - 1, ROWS, device=dev).long()
                q_rows, do_rows = q[:, :, pick], do[:, :, pick]
                k_full, v_full = full[1], full[2]
                del full
                qa, ka, va = (x.clone().requires_grad_() for x in (q, k, v))

                def ring_fwd():
                    return ring_attention(qa, ka, va, causal=causal)
                o = ring_fwd()

                def ring_bwd():
                    qa.grad = ka.grad = va.grad = None
                    o.backward(do, retain_graph=True)
                reps = args.reps if n < 524288 else min(args.reps, 2)
                t_fwd = timed(ring_fwd, reps)
                t_bwd = timed(ring_bwd, reps)
                layout = agree(q, k, v, causal)

                def compute_fwd():
                    st = empty_state(q)
                    for step in layout.steps:
                        forward_step(*st, q, kvs[0][step.source], kvs[1][step.source], step, layout.scale,
                                     layout.backend)
                    return st
                o_acc, lse = compute_fwd()
                o_c = o_acc.to(dtype)

                # the sums each step adds into (in the ring, the gradient received from the previous rank)
                sums = [[torch.zeros(x.shape, dtype=lse.dtype, device=dev) for x in kvs[0]] for _ in range(2)]

                def compute_bwd():
                    dq = torch.zeros(q.shape, dtype=lse.dtype, device=dev)
                    for step in layout.steps:
                        kk, vv = kvs[0][step.source], kvs[1][step.source]
                        kr, dk, dv = backward_step(dq, q, kk, vv, o_c, lse, do, step, layout.scale, layout.backend)
                        span_of(sums[0][step.source], kr).add_(dk)
                        span_of(sums[1][step.source], kr).add_(dv)
                c_fwd = timed(compute_fwd, reps)
                c_bwd = timed(compute_bwd, reps)

                def comm():
                    cur = (k, v)
                    for t in range(world - 1):
                        works, nxt = exchange(layout, cur, layout.lengths[(rank - t - 1) % world], 4 * t)
                        for w in works:
                            w.wait()
                        cur = nxt
                t_comm = timed(comm, reps)
                if causal and not profiled and world > 1:
                    profiled = True
                    from torch.profiler import ProfilerActivity, profile
                    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
                    with profile(activities=acts) as prof:
                        ring_fwd().backward(do)
                        if dev.type == "cuda":
                            torch.cuda.synchronize()
                    if rank == 0:
                        prof.export_chrome_trace(f"{args.out_dir}/ring_timeline_rank0.json")
                # errors of sampled rows against float32 over the whole sequence
                ref_o, ref_dq, low_o = reference_rows(q_rows, pos_all[pick], k_full, v_full, do_rows, causal,
                                                      layout.scale)
                qa.grad = None
                o.backward(do, retain_graph=True)
                err = (o[:, :, pick].float() - ref_o).abs().max().item()
                err_low = (low_o - ref_o).abs().max().item()
                err_dq = ((qa.grad[:, :, pick].float() - ref_dq).abs().max() / ref_dq.abs().max()).item()
                errs = torch.tensor([err, err_low, err_dq], device=dev, dtype=torch.float64)
                dist.all_reduce(errs, op=dist.ReduceOp.MAX)
                work = work_per_rank(n, world, "zigzag", causal)
                med = {k_: slowest(statistics.median(v_), dev) for k_, v_ in
                       dict(fwd=t_fwd, bwd=t_bwd, cfwd=c_fwd, cbwd=c_bwd, comm=t_comm).items()}
                base = dict(B=B, H=H, N=n, D=D, dtype=str(dtype)[6:], causal=causal, world=world, gpu=gpu,
                            max_abs_err_o=errs[0].item(), max_abs_err_o_input_precision=errs[1].item(),
                            yardstick_ratio=errs[0].item() / max(errs[1].item(), 1e-30),
                            rel_err_dq=errs[2].item(), tiles_per_rank=work, imbalance=imbalance(work))
                # the backward moves the K/V shard (input dtype) and its dK/dV (float32): three times the bytes
                comm_ms = {"fwd": med["comm"], "bwd": 3 * med["comm"]}
                for mode, ring_ms, comp_ms in (("fwd", med["fwd"], med["cfwd"]), ("bwd", med["bwd"], med["cbwd"])):
                    hidden = min(1.0, max(0.0, 1 - (ring_ms - comp_ms) / max(comm_ms[mode], 1e-9)))
                    f = 4 * B * H * n * n * D / (2 if causal else 1) * (2.5 if mode == "bwd" else 1.0)
                    rows.append(dict(base, impl=f"ring-nccl-x{world}", mode=mode, ms=ring_ms,
                                     tflops=f / world / ring_ms / 1e9, compute_ms=comp_ms,
                                     efficiency=comp_ms / ring_ms, comm_ms=comm_ms[mode], comm_hidden=hidden))
                if rank == 0:
                    r_f, r_b = rows[-2], rows[-1]
                    print(f"{str(dtype)[6:]:8} N={n:8} causal={causal!s:5} x{world}: fwd {r_f['ms']:8.1f} ms "
                          f"({r_f['tflops']:5.0f} TF/s/GPU, eff {r_f['efficiency']:.2f}) bwd {r_b['ms']:8.1f} ms "
                          f"({r_b['tflops']:5.0f} TF/s/GPU, eff {r_b['efficiency']:.2f}) K/V pass {med['comm']:.1f} ms, "
                          f"hidden fwd {r_f['comm_hidden']:.2f} bwd {r_b['comm_hidden']:.2f}; err {errs[0]:.1e} vs input-precision {errs[1]:.1e} "
                          f"(ratio {r_f['yardstick_ratio']:.2f}); imbalance {r_f['imbalance']:.3f}", flush=True)
                    save_results(path, "speed", rows,
                                 collect(dev, call="experiments/ring/multi_gpu.py " + " ".join(sys.argv[1:])),
                                 {"B": B, "H": H, "D": D, "world": world, "backend": "nccl",
                                  "targets": "efficiency >= 0.85 at N >= 128k; imbalance <= 0.05; yardstick <= 2"})
                del q, k, v, do, kvs, qa, ka, va, o, k_full, v_full, o_acc, o_c, lse
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    if rank == 0:
        ok = [r for r in rows if r["mode"] == "fwd"]
        print(f"summary: {len(ok)} cases on {world} GPUs; efficiency >= 0.85 in "
              f"{sum(r['efficiency'] >= 0.85 and rb['efficiency'] >= 0.85 for r, rb in zip(rows[::2], rows[1::2]))}"
              f"/{len(ok)}; yardstick <= 2 in {sum(r['yardstick_ratio'] <= 2 for r in ok)}/{len(ok)}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
