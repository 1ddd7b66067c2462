#!/usr/bin/env bash
# The CUDA chapter's GPU run, from the repository root on a machine with a GPU, torch, triton and
# cupy (no venv needed): the gpu tests, one benchmark process (ladder, fast kernel, naive, SDPA
# flash) and a compute-sanitizer memcheck of one small launch per kernel.
# Results go under $OUT (default .gpu_out/): gpu.txt, gpu_tests.log, cuda_bench.json, bench.log,
# memcheck.log. Usage: OUT=/some/dir bash tools/gpu_cuda.sh [--quick]; stage time limits in seconds:
# T_TEST, T_BENCH, T_MEM (defaults 200, 300, 120). SKIP_TESTS=1 skips the tests (run elsewhere);
# RACECHECK=1 adds a compute-sanitizer racecheck of the same launches.
set -u
OUT=${OUT:-.gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
QUICK=${1:-}

{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  python3 -c 'import torch, triton, cupy; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "cupy", cupy.__version__)'
} > "$OUT/gpu.txt" 2>&1

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${T_TEST:-200} python3 -m pytest tests/test_cuda.py -m gpu -q -rf -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi

timeout ${T_BENCH:-300} python3 tools/bench_cuda.py --out "$OUT/cuda_bench.json" $QUICK > "$OUT/bench.log" 2>&1
echo "bench exit $?"; tail -3 "$OUT/bench.log"

if command -v compute-sanitizer > /dev/null; then
  timeout ${T_MEM:-120} compute-sanitizer --tool memcheck --print-limit 20 python3 tools/sanitizer_launches.py \
      > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"; tail -4 "$OUT/memcheck.log"
  if [ "${RACECHECK:-0}" = 1 ]; then
    timeout ${T_MEM:-120} compute-sanitizer --tool racecheck --print-limit 20 python3 tools/sanitizer_launches.py \
        > "$OUT/racecheck.log" 2>&1
    echo "racecheck exit $?"; tail -4 "$OUT/racecheck.log"
  fi
fi
