#!/usr/bin/env bash
# Host time per call of this checkout against an older commit (the CUDA host-path change was
# measured this way), then the CUDA GPU tests:
#   OUT=/some/dir BEFORE=<commit> bash experiments/host_overhead/gpu_compare_host_overhead.sh
# writes $OUT/host_before.json, $OUT/host_after.json and $OUT/gpu_tests_cuda.log. Each side is timed
# by its own `python -m flashtut.bench host`, so BEFORE must be a commit that has that subcommand
# (data/host_overhead_h200.json compared f9f88b4, older, with a script since retired).
set -u
OUT=${OUT:-.gpu_out}
LOG="$OUT/host_overhead.log"
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0
stage overhead
OLD=$(mktemp -d); git archive "${BEFORE:?commit before the change}" src | tar -x -C "$OLD"
PYTHONPATH="$OLD/src" timeout 60 python3 -m flashtut.bench host --label before --out "$OUT/host_before.json" 2>&1 | tee -a "$LOG"
timeout 60 python3 -m flashtut.bench host --label after --out "$OUT/host_after.json" 2>&1 | tee -a "$LOG"
stage tests
gpu_tests "${T_TESTS:-150}" "$OUT/gpu_tests_cuda.log" tests/kernels/test_cuda.py tests/kernels/test_cuda_backward.py tests/bench/test_bench.py
stage done
