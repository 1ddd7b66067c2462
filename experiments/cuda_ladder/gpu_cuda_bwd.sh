#!/usr/bin/env bash
# The CUDA backward on a GPU machine: resource report, GPU tests, a memory/race check of one
# small case, and timing against the SDPA flash backend's backward in the same process.
# Usage (repository root): OUT=/some/dir experiments/cuda_ladder/gpu_cuda_bwd.sh   [needs torch, triton, cupy, nvcc]
# Writes under $OUT: ptxas.txt, pytest.log, bench.json, bench.log, sanitizer.log.
# Knobs (environment): SKIP_PTXAS=1 (the resource report is the same as a local nvcc 13.0's),
# BENCH_N (sequence lengths timed), BENCH_D (head dims timed), BENCH_SWEEP=0 (no tile sweep),
# PYTEST_K (a pytest -k selection), T_PYTEST, T_BENCH, T_SAN (per-step time limits, seconds).
set -u -o pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/gpu_cuda_bwd}
LOG="$OUT/gpu.txt"
. tools/gpu_common.sh
machine_info
cat "$LOG"

# 1. registers / spills of the builds the H200 runs (sm_90, both head dims, both dtypes)
[ "${SKIP_PTXAS:-0}" = 1 ] || for d in 64 128; do for bf in 0 1; do for f in bwd_dkdv bwd_dq; do
  echo "$f HEAD_DIM=$d FT_BF16=$bf: $(nvcc -std=c++17 -arch=sm_90 -DHEAD_DIM=$d -DFT_BF16=$bf \
      -c src/flashtut/cuda/$f.cu -o /tmp/$f.o -Xptxas -v 2>&1 | grep -E 'registers|spill' | tr -s ' \n' ' ')"
done; done; done | tee "$OUT/ptxas.txt"

# 2. correctness
timeout ${T_PYTEST:-300} python3 -m pytest tests/kernels/test_cuda_backward.py -q -rs -s -k "${PYTEST_K:-}" 2>&1 | tee "$OUT/pytest.log"

# 3. timing, D in {64, 128}, N in {1024, 4096, 16384}, 16k tokens per batch, fp16 and bf16;
#    both dQ strategies (separate pass, atomics) against SDPA flash; then a tile-config sweep
BENCH_N=${BENCH_N:-"1024 4096 16384"} timeout ${T_BENCH:-330} python3 - <<'EOF' 2>&1 | tee "$OUT/bench.log"
import dataclasses, json, math, os
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashtut.cuda.attention import cuda_backward as backward
from flashtut.cuda.configs import BackwardConfig, pick_config
from flashtut.cuda.compile import max_smem_per_block

torch.manual_seed(0)
dev = "cuda"
cap = torch.cuda.get_device_capability()
ARCH, SMEM = 10 * cap[0] + cap[1], max_smem_per_block()


def lse_of(q, k, causal, scale, chunk=1024):
    """Natural-log log-sum-exp per query row, in fp32 chunks (never the whole N x N matrix)."""
    out = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    Nk = k.shape[2]
    for i in range(0, q.shape[2], chunk):
        s = (q[:, :, i:i + chunk].float() @ k.float().transpose(-2, -1)) * scale
        if causal:
            rows = torch.arange(i, min(i + chunk, q.shape[2]), device=q.device)[:, None]
            s.masked_fill_(torch.arange(Nk, device=q.device)[None, :] > rows, float("-inf"))
        out[:, :, i:i + chunk] = torch.logsumexp(s, dim=-1)
    return out


def bench(fn, **kw):
    return triton.testing.do_bench(fn, warmup=50, rep=250, return_mode="median", **kw)


def rel_diff(ours, ref):
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
               for a, b in zip(ours, ref))


rows, sweep = [], []
print(f"{'dtype':>8} {'D':>4} {'N':>6} {'causal':>6} {'flash ms':>8} {'pass ms':>8} {'atom ms':>8} "
      f"{'flash TF':>8} {'pass TF':>8} {'atom TF':>8} {'r pass':>6} {'r atom':>6} {'diff':>7}")
for dtype in (torch.float16, torch.bfloat16):
    for D, H in [(d, 2048 // d) for d in map(int, os.environ.get("BENCH_D", "64 128").split())]:
        base = pick_config(D, ARCH, SMEM)
        variants = {"pass": dataclasses.replace(base, dq_atomic=False),
                    "atomic": dataclasses.replace(base, dq_atomic=True)}
        for N in map(int, os.environ["BENCH_N"].split()):
            B = 16384 // N
            for causal in (False, True):
                q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dtype) for _ in range(4))
                scale = 1 / math.sqrt(D)
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                og.backward(do, retain_graph=True)
                flash_grads = [t.grad.clone() for t in (qg, kg, vg)]
                o = og.detach()
                lse = lse_of(q, k, causal, scale)
                flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
                t_flash = bench(lambda: og.backward(do, retain_graph=True), grad_to_none=[qg, kg, vg])
                r = dict(dtype=str(dtype).replace("torch.", ""), D=D, N=N, B=B, H=H, causal=causal,
                         flash_ms=t_flash, flash_tflops=flops / t_flash / 1e9)
                diff = 0.0
                for name, cfg in variants.items():
                    ours = backward(q, k, v, o, lse, do, causal, scale, config=cfg)
                    diff = max(diff, rel_diff(ours, flash_grads))   # agreement with flash's grads
                    t = bench(lambda: backward(q, k, v, o, lse, do, causal, scale, config=cfg))
                    r[f"{name}_ms"], r[f"{name}_tflops"], r[f"{name}_ratio"] = t, flops / t / 1e9, t_flash / t
                r["max_rel_diff_vs_flash"] = diff
                rows.append(r)
                print(f"{r['dtype']:>8} {D:>4} {N:>6} {str(causal):>6} {t_flash:8.3f} {r['pass_ms']:8.3f} "
                      f"{r['atomic_ms']:8.3f} {r['flash_tflops']:8.1f} {r['pass_tflops']:8.1f} "
                      f"{r['atomic_tflops']:8.1f} {r['pass_ratio']:6.2f} {r['atomic_ratio']:6.2f} {diff:7.1e}")
                del qg, kg, vg, og, flash_grads, ours

print("\ntile-config sweep, float16 (TFLOP/s; (stages, dkdv_block_m, dq_block_n, warps, atomic))")
for D, H in [] if os.environ.get("BENCH_SWEEP", "1") == "0" else ((64, 32), (128, 16)):
    cfgs = [BackwardConfig(D, 2, 64, 64), BackwardConfig(D, 2, 64, 64, dq_atomic=True),
            BackwardConfig(D, 2, 64, 64, warps=8), BackwardConfig(D, 2, 64, 64, warps=8, dq_atomic=True),
            BackwardConfig(D, 1, 64, 64), BackwardConfig(D, 2, 32, 32),
            BackwardConfig(D, 2, 128, 64, dq_atomic=True), BackwardConfig(D, 2, 64, 128)]
    cfgs = [c for c in cfgs if max(c.dkdv_smem, c.dq_smem) <= SMEM]
    for N in (4096,):
        B = 16384 // N
        for causal in (False, True):
            q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=torch.float16) for _ in range(4))
            scale = 1 / math.sqrt(D)
            lse = lse_of(q, k, causal, scale)
            o = torch.randn_like(q)
            flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
            line = []
            for cfg in cfgs:
                t = bench(lambda: backward(q, k, v, o, lse, do, causal, scale, config=cfg))
                tag = (cfg.stages, cfg.dkdv_block_m, cfg.dq_block_n, cfg.warps, int(cfg.dq_atomic))
                sweep.append(dict(D=D, N=N, causal=causal, config=list(tag), ms=t, tflops=flops / t / 1e9))
                line.append(f"{tag}:{flops / t / 1e9:.0f}")
            print(f"D={D} N={N} causal={causal}: " + "  ".join(line))

json.dump(dict(what="flashtut CUDA backward (separate dQ pass / atomic dQ) vs SDPA flash backward, "
                    "do_bench median; TFLOP/s = 2.5 * 4*B*H*N^2*D / time (halved when causal)",
               device=torch.cuda.get_device_name(), rows=rows, sweep=sweep),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "bench.json"), "w"), indent=1)

# where the time goes: the kernels of one D=128 backward, both strategies
from torch.profiler import ProfilerActivity, profile
for atomic in (False, True):
    for causal in (False, True):
        B, H, N, D = 4, 16, 4096, 128
        cfg = dataclasses.replace(pick_config(D, ARCH, SMEM), dq_atomic=atomic)
        q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=torch.float16) for _ in range(4))
        o = torch.randn_like(q)
        lse = lse_of(q, k, causal, 1 / math.sqrt(D))
        backward(q, k, v, o, lse, do, causal, config=cfg)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                backward(q, k, v, o, lse, do, causal, config=cfg)
            torch.cuda.synchronize()
        print(f"kernels, fp16 B={B} H={H} N={N} D={D} causal={causal} atomic={atomic} (mean of 5):")
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", 0)   # CUDA time (torch >= 2.4 name)
            if t > 0:
                print(f"  {e.key[:40]:40s} {t / e.count / 1000:8.3f} ms")
EOF

# 4. out-of-bounds and shared-memory races on one small causal case with ragged tails
cat > /tmp/bwd_small.py <<'EOF'
import torch, flashtut
from flashtut.cuda.attention import cuda_backward as backward
from flashtut.cuda.configs import BackwardConfig
for D in (64, 128):
    q, k, v, do = (torch.randn(1, 2, n, D, device="cuda", dtype=torch.float16) for n in (150, 97, 97, 150))
    o, lse = flashtut.tiled_attention(q, k, v, causal=True, return_lse=True)
    for atomic in (False, True):
        cfg = BackwardConfig(D, 2, 64, 64, dq_atomic=atomic)
        g = backward(q, k, v, o, lse, do, True, None, config=cfg)
        torch.cuda.synchronize()
        print(D, atomic, [bool(torch.isfinite(t).all()) for t in g])
EOF
python3 /tmp/bwd_small.py > /dev/null   # compile outside the sanitizer (CuPy caches the build)
for tool in memcheck racecheck; do
  timeout ${T_SAN:-150} compute-sanitizer --tool $tool --kernel-name kns=attn_bwd python3 /tmp/bwd_small.py 2>&1 \
    | tail -n 6 | tee -a "$OUT/sanitizer.log"
done
