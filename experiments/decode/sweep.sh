#!/usr/bin/env bash
# The decode kernel's launch variants against the shipped launch, on one GPU, from the repository root,
# in at most about 200 s:
#   1. the gpu tests of the variants (the fused merge and the table read one tile ahead against the shipped
#      launch, the fused merge's counters across CUDA-graph replays);
#   2. experiments/decode/sweep.py: every variant at batch 1 (1k, 4k, 16k, 64k keys) and 32 (4k, 16k), float16
#      and bfloat16, contiguous and paged (pages of 64 and 16), timed in one process by the benchmark's harness,
#      with the copy bandwidth of the same process.
#   OUT=/some/dir bash experiments/decode/sweep.sh
# Results: $OUT/run.log (the table), $OUT/sweep_tests.log, $OUT/decode_sweep.json (kind decode), $OUT/sweep.log.
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0

stage info
machine_info
stage tests
gpu_tests "${T_TESTS:-35}" "$OUT/sweep_tests.log" tests/kernels/test_triton_decode.py -k "variant or fused"
stage sweep
timeout "${T_SWEEP:-150}" python3 experiments/decode/sweep.py --budget-s "${SWEEP_BUDGET_S:-110}" \
    --out "$OUT/decode_sweep.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?" | tee -a "$LOG"
grep "^|" "$OUT/sweep.log" | tee -a "$LOG"
grep -v "^|" "$OUT/sweep.log" | grep -v "done at" | tail -12 | tee -a "$LOG"
stage done
