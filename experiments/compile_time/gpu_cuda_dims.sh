#!/usr/bin/env bash
# The CUDA kernels' head dims on a GPU machine, in one call of at most ~200 s,
# from the repository root with torch, triton and cupy:
#   warm       compile every build the tests use, 16 processes at a time, into CuPy's disk cache
#   tests      tests/kernels/test_cuda_dims.py, gpu-marked: D in {32, 40, 80, 96, 256} forward and
#              backward, fp16 and bf16, odd Nq != Nk, causal both alignments, grouped heads,
#              non-contiguous inputs, and the Nq = 130, Nk = 67 causal bf16 D = 128 case and its
#              neighbours, all on the book's one yardstick (tests_dims.log; then that case alone
#              with -s in case_130x67.log: the ratios to PyTorch bf16 and to SDPA math printed)
#   sanitizer  compute-sanitizer memcheck of tools/sanitizer_launches.py --dims (the forward and both
#              backward paths at D = 32, 96 and 256, grouped heads, both alignments, Nq > Nk)
#   timing     D = 96 and 256, bfloat16, N = 4096 and 16384 tokens per batch: cuda_attention forward
#              and backward against SDPA flash in the same process (timing.log), step 3 and step 5
#              at D = 96 (which fast step it should run: configs.FAST_VARIANTS has no measurement)
#   compile    python experiments/compile_time/compile_time.py (compile_time.json, compile.log): NVRTC seconds
#              per build of a first cuda_attention call at D = 96 and 256 (bf16), one by one and one
#              thread each, and the first forward/backward in a new process, cache empty then filled
# Usage: OUT=/some/dir [STAGES="warm tests sanitizer timing compile"] bash experiments/compile_time/gpu_cuda_dims.sh
# Stage limits in seconds (environment): T_WARM 30, T_TESTS 45, T_CASE 25, T_SAN 30, T_TIMING 35,
# T_COMPILE 35: 200 in all.
# $OUT gets run.log (the summary) and the files named above.
set -u
export OUT=${OUT:-/tmp/gpu_cuda_dims}
. tools/gpu_common.sh
STAGES=" ${STAGES:-warm tests sanitizer timing compile} "
want() { [[ "$STAGES" == *" $1 "* ]]; }
machine_info

if want warm; then
    stage warm
    timeout ${T_WARM:-30} python3 experiments/compile_time/compile_time.py --warm >> "$LOG" 2>&1
    echo "warm rc=$?" | tee -a "$LOG"
fi

if want tests; then
    stage tests
    gpu_tests ${T_TESTS:-45} "$OUT/tests_dims.log" tests/kernels/test_cuda_dims.py
    # the 130 x 67 case once more in one process, -s: its ratios to PyTorch and to SDPA math printed
    timeout ${T_CASE:-25} python3 -m pytest tests/kernels/test_cuda_dims.py -m gpu -k 130_by_67 -p no:cacheprovider \
        -q -s -rfE --tb=short > "$OUT/case_130x67.log" 2>&1
    echo "case 130x67 rc=$?" | tee -a "$LOG"
    grep "accuracy" "$OUT/case_130x67.log" | sort -t: -k2 | tail -4 | tee -a "$LOG"
fi

if want sanitizer; then
    stage sanitizer
    if command -v compute-sanitizer > /dev/null; then
        python3 tools/sanitizer_launches.py --dims > /dev/null 2>&1    # compiled outside the sanitizer
        timeout ${T_SAN:-30} compute-sanitizer --tool memcheck --print-limit 20 \
            python3 tools/sanitizer_launches.py --dims > "$OUT/memcheck_dims.log" 2>&1
        echo "memcheck rc=$?" | tee -a "$LOG"
        tail -3 "$OUT/memcheck_dims.log" | tee -a "$LOG"
    else
        echo "sanitizer: compute-sanitizer not found" | tee -a "$LOG"
    fi
fi

if want timing; then
    stage timing
    timeout ${T_TIMING:-35} python3 - <<'EOF' 2>&1 | tee "$OUT/timing.log" >> "$LOG"
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtut
from flashtut.bench.timing import time_fn
from flashtut.cuda import attention as ca

dtype = torch.bfloat16
print("D      N causal  impl            fwd ms   fwd TF  bwd ms   bwd TF  x flash fwd  x flash bwd")
for D in (96, 256):
    H = 2048 // D if D != 96 else 16
    for N in (4096, 16384):
        B = 16384 // N
        for causal in (False, True):
            q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(4))
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            res = {}
            for name in ("sdpa-flash", "cuda", *(["cuda-v3", "cuda-v5"] if D == 96 else [])):
                if name.startswith("cuda-"):
                    t = time_fn(lambda: ca.cuda_forward(q, k, v, causal, variant=name[5:]), "cuda")
                    res[name] = (t, None)
                    continue
                leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                if name == "sdpa-flash":
                    def fwd():
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            return F.scaled_dot_product_attention(*leaves, is_causal=causal)
                else:
                    fwd = lambda: flashtut.cuda_attention(*leaves, causal=causal)   # noqa: E731
                o = fwd()
                tf = time_fn(fwd, "cuda")
                tb = time_fn(lambda: o.backward(do, retain_graph=True), "cuda", grad_to_none=leaves)
                res[name] = (tf, tb)
            ff, fb = res["sdpa-flash"]
            for name, (tf, tb) in res.items():
                bwd = f"{tb:7.3f} {2.5 * flops / tb / 1e9:7.1f}" if tb else f"{'':7s} {'':7s}"
                xb = f"{fb / tb:11.2f}" if tb else ""
                print(f"{D:3d} {N:6d} {str(causal):6s}  {name:12s} {tf:7.3f} {flops / tf / 1e9:7.1f} {bwd}"
                      f"  {ff / tf:11.2f}  {xb}", flush=True)
EOF
    echo "timing rc=$?" | tee -a "$LOG"
fi

if want compile; then
    stage compile
    timeout ${T_COMPILE:-35} python3 experiments/compile_time/compile_time.py --out "$OUT/compile_time.json" \
        --dims 96 256 --dtypes bfloat16 > "$OUT/compile.log" 2>&1
    echo "compile rc=$?" | tee -a "$LOG"
    tail -6 "$OUT/compile.log" | tee -a "$LOG"
fi
stage done
