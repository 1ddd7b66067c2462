#!/usr/bin/env bash
# One device call for the Triton kernels, from the repo root on a CUDA GPU:
#   OUT=/some/dir bash tools/gpu_triton.sh
# 1. GPU tests (pytest -m gpu, autotuning off so each kernel compiles one configuration,
#    8 workers); 2. the benchmark against SDPA flash for the shapes (autotuned, one
#    process, after 8 worker processes filled triton's compile cache); 3. the N sweep of
#    triton / SDPA flash / naive for chapter 07's figure; 4. chapter 07's GPU paths (exercise
#    checkers, the live speed cell through flashtut.bench). RUN_TESTS, RUN_BENCH, RUN_SWEEP,
#    RUN_EXTRAS=0 skip a part.
set -u
OUT=${OUT:-/tmp/flashtut_out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  python3 -m pytest --version 2>&1 | tee -a "$OUT/gpu.txt"
  if python3 -c "import xdist" 2>/dev/null; then WORKERS="-n 8"; else WORKERS=""; fi
  FLASHTUT_TRITON_AUTOTUNE=0 timeout "${TEST_TIMEOUT:-200}" python3 -m pytest tests/test_triton.py -m gpu $WORKERS \
      -p no:cacheprovider -q -rfE --tb=short > "$OUT/gpu_tests.log" 2>&1
  echo "pytest rc=$? workers='$WORKERS'" >> "$OUT/gpu_tests.log"
  tail -25 "$OUT/gpu_tests.log"
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  timeout "${BENCH_TIMEOUT:-230}" python3 tools/bench_triton.py --out "$OUT/triton_bench.json" --precompile 8 \
      ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench rc=$?" >> "$OUT/bench.log"
  grep -v Warning "$OUT/bench.log" | tail -20
fi
if [ "${RUN_SWEEP:-1}" = 1 ]; then
  timeout "${SWEEP_TIMEOUT:-150}" python3 tools/bench_triton.py --sweep --ds 128 --precompile 4 \
      --out "$OUT/triton_sweep.json" > "$OUT/sweep.log" 2>&1
  echo "sweep rc=$?" >> "$OUT/sweep.log"
  tail -40 "$OUT/sweep.log"
fi
if [ "${RUN_EXTRAS:-1}" = 1 ]; then
  timeout "${EXTRAS_TIMEOUT:-150}" python3 tools/bench_triton.py --extras --out "$OUT/triton_extras.json" \
      > "$OUT/extras.log" 2>&1
  echo "extras rc=$?" >> "$OUT/extras.log"
  tail -40 "$OUT/extras.log"
fi
