#!/usr/bin/env bash
# The sliding window's Triton backward against SDPA flash on one GPU (issue 15's benchmark shape),
# from the repository root: the gpu tests of the Triton kernels with grouped-query heads, windows
# and packed batches (autotuning off: each list's first tile), then tools/triton_window_bench.py
# (each backward kernel alone per tile, the fused backward, the whole backward, SDPA flash).
#   OUT=/some/dir bash tools/gpu_triton_window.sh        (at most 230 s on an H200)
# Results: $OUT/run.log (summary), $OUT/gpu_tests.log, $OUT/triton_window.txt and .json.
set -u
OUT=${OUT:-.gpu_out}
. "$(dirname "$0")/gpu_common.sh"
export FLASHTUT_TRITON_AUTOTUNE=0

stage info
machine_info
stage tests
gpu_tests "${T_TESTS:-150}" "$OUT/gpu_tests.log" tests/kernels/test_triton.py tests/core/test_real_models.py \
    -k "window or gqa or varlen or triton or fused"
stage bench
timeout "${T_BENCH:-75}" python3 tools/triton_window_bench.py --out "$OUT" --budget-s "${BUDGET_S:-35}" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$LOG"
grep -E "sdpa|SPLIT|FUSED|DEFAULT|AUTOTUNED|total" "$OUT/bench.log" | tee -a "$LOG"
