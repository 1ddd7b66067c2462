#!/usr/bin/env bash
# The CUDA host-path change (cached build and launch plan, one set of checks per call), on a GPU:
# host time per call before and after, the CUDA GPU tests, then the protocol sweep again.
#   OUT=/some/dir BEFORE=<commit> [SWEEP=0] bash tools/gpu_host_path.sh   (SWEEP=0: no sweep)
set -u
OUT=${OUT:-.gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLASHTUT_TRITON_AUTOTUNE=0
LOG="$OUT/host_path.log"
. "$(dirname "$0")/gpu_common.sh"
stage overhead
OLD=$(mktemp -d); git archive "${BEFORE:?commit before the change}" src | tar -x -C "$OLD"
PYTHONPATH="$OLD/src" timeout 60 python3 tools/host_overhead.py --label before --out "$OUT/host_overhead_before.json" 2>&1 | tee -a "$LOG"
PYTHONPATH=src timeout 60 python3 tools/host_overhead.py --label after --out "$OUT/host_overhead_after.json" 2>&1 | tee -a "$LOG"
stage tests
PYTHONPATH=src gpu_tests "${T_TESTS:-150}" "$OUT/gpu_tests_cuda.log" tests/test_cuda.py tests/test_cuda_backward.py \
    tests/test_bench.py
if [ "${SWEEP:-1}" = 1 ]; then bash tools/gpu_protocol.sh; fi
stage done
