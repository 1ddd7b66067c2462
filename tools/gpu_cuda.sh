#!/usr/bin/env bash
# The CUDA chapter's GPU run, from the repository root on a machine with a GPU, torch, triton and
# cupy (no venv needed): the gpu tests, one benchmark process (ladder, fast kernel, naive, SDPA
# flash) and a compute-sanitizer memcheck of one small launch per kernel.
# Results go under $OUT (default .gpu_out/): gpu.txt, gpu_tests.log, cuda_bench.json, bench.log,
# memcheck.log. Usage: OUT=/some/dir bash tools/gpu_cuda.sh [--quick]; stage time limits in seconds:
# T_TEST, T_BENCH, T_MEM (defaults 200, 300, 120).
set -u
OUT=${OUT:-.gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
QUICK=${1:-}

{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  python3 -c 'import torch, triton, cupy; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "cupy", cupy.__version__)'
} > "$OUT/gpu.txt" 2>&1

timeout ${T_TEST:-200} python3 -m pytest tests/test_cuda.py -m gpu -q -rf -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25

timeout ${T_BENCH:-300} python3 tools/bench_cuda.py --out "$OUT/cuda_bench.json" $QUICK > "$OUT/bench.log" 2>&1
echo "bench exit $?"; tail -3 "$OUT/bench.log"

if command -v compute-sanitizer > /dev/null; then
  timeout ${T_MEM:-120} compute-sanitizer --tool memcheck --print-limit 20 python3 -c '
import torch
from flashtut.cuda.forward import forward
import flashtut
for D in (64, 128):
    q, k, v = (torch.randn(1, 2, 77, D, device="cuda", dtype=torch.float16) for _ in range(3))
    k2, v2 = (torch.randn(1, 2, 131, D, device="cuda", dtype=torch.float16) for _ in range(2))
    for variant in ("v1", "v2", "v3"):
        for causal in (False, True):
            forward(q, k2, v2, causal=causal, variant=variant)
    q.requires_grad_(); k2.requires_grad_(); v2.requires_grad_()
    flashtut.cuda_attention(q, k2, v2, causal=True).sum().backward()
torch.cuda.synchronize()
print("memcheck launches done")
' > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"; tail -4 "$OUT/memcheck.log"
fi
