#!/usr/bin/env bash
# The sliding window's Triton backward against SDPA flash on one GPU (the real-models benchmark's window shape),
# from the repository root: first `python experiments/triton_window/window_backward.py` (the whole backward with the default
# tiles and autotuned, each backward kernel alone per tile, the fused backward, SDPA flash), then
# the gpu tests of the Triton kernels with grouped-query heads, windows and packed batches
# (autotuning off: each list's first tile) in the time left.
#   OUT=/some/dir bash experiments/triton_window/gpu_triton_window.sh        (at most about 230 s on an H200)
# Results: $OUT/run.log (summary), $OUT/triton_window.txt and .json, $OUT/bench.log, $OUT/gpu_tests.log.
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0

stage info
machine_info
stage bench
timeout "${T_BENCH:-75}" python3 experiments/triton_window/window_backward.py --out-dir "$OUT" --budget-s "${BUDGET_S:-35}" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$LOG"
grep -E "sdpa|SPLIT|FUSED|DEFAULT|AUTOTUNED|total" "$OUT/bench.log" | tee -a "$LOG"
stage tests
gpu_tests "${T_TESTS:-140}" "$OUT/gpu_tests.log" tests/core/test_real_models.py tests/kernels/test_triton.py \
    -k "window or gqa or varlen or triton or fused"
