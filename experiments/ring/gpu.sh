#!/usr/bin/env bash
# Ring attention on ONE GPU: the compute path of every rank (the Triton kernel returning
# (o, lse) per pair of shards, then the merge) timed against one unsharded kernel of the same total
# work, then the GPU tests of flashtut.distributed. From the repository root:
#   OUT=/some/dir bash experiments/ring/gpu.sh        (at most about 230 s)
# Results: $OUT/run.log (summary), $OUT/ring_compute_path.json, $OUT/compute_path.log, $OUT/gpu_tests.log.
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0

stage info
machine_info
stage compute_path
timeout "${T_BENCH:-160}" python3 experiments/ring/compute_path.py --out-dir "$OUT" --budget-s "${BUDGET_S:-110}" \
    > "$OUT/compute_path.log" 2>&1
echo "compute_path rc=$?" | tee -a "$LOG"
grep -E "ratio|summary" "$OUT/compute_path.log" | tee -a "$LOG"
stage tests
gpu_tests "${T_TESTS:-65}" "$OUT/gpu_tests.log" tests/distributed
