#!/usr/bin/env bash
# FlexAttention on one GPU, from the repository root, in at most about 240 s:
#   PYTHONPATH=$PWD/src FLASHTUT_TRITON_AUTOTUNE=0 OUT=/some/dir bash experiments/flex/gpu.sh
# 1. the gpu tests of the flex kernels (tests/kernels/test_flex.py -m gpu), 75 s at most;
# 2. experiments/flex/bench_flex.py: block-mask build times at N = 16384, then ours against PyTorch's
#    compiled FlexAttention for causal, window 1024, document, prefix-LM, ALiBi and soft-capping,
#    over D = 128 then 64, float16 then bfloat16, N = 16384 then 4096, until its budget (BUDGET_S,
#    default 125 s) is spent: PyTorch's compilations take most of it, so one run covers the first
#    part of that grid (it says where it stopped). FLEX_DIMS / FLEX_DTYPES / FLEX_NS / FLEX_CASES
#    pick another part (e.g. FLEX_DIMS=64 FLEX_DTYPES=bfloat16) for a second run.
# Results: $OUT/flex.json (bench results format: speed rows, and host rows for the build times),
# $OUT/run.log (summary), $OUT/bench.log, $OUT/gpu_tests.log.
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0

stage info
machine_info
stage tests
gpu_tests "${T_TESTS:-75}" "$OUT/gpu_tests.log" tests/kernels/test_flex.py
stage bench
timeout "${T_BENCH:-150}" python3 experiments/flex/bench_flex.py --out "$OUT/flex.json" \
    --budget-s "${BUDGET_S:-125}" --dims "${FLEX_DIMS:-128,64}" --dtypes "${FLEX_DTYPES:-float16,bfloat16}" \
    --ns "${FLEX_NS:-16384,4096}" --cases "${FLEX_CASES:-causal,window,document,prefix_lm,alibi,softcap}" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$LOG"
grep -E "^build|vs torch|budget|done in|Error" "$OUT/bench.log" | tee -a "$LOG"
