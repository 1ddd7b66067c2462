#!/usr/bin/env bash
# Ring attention on every GPU of one machine: NCCL over all GPUs (NVLink multicast off), the
# zigzag cut, D = 128, float16 and bfloat16, causal and not, N from 128k to 1M tokens in total (while the
# budget lasts), forward and backward timed against each GPU alone on its shard, the K/V transfers
# alone, and the error of sampled rows against a float32 reference. From the repository root, on a
# machine with 2, 4 or 8 GPUs:
#   OUT=/some/dir bash experiments/ring/multi_gpu.sh        (at most about 580 s)
# Results: $OUT/run.log (summary), $OUT/ring_multi_gpu_<gpu>_x<world>.json, $OUT/multi_gpu.log,
# $OUT/ring_timeline_rank0.json (a profiler timeline of one causal step at the smallest N).
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0 NCCL_NVLS_ENABLE=0
NGPU=$(nvidia-smi -L | wc -l)

stage info
machine_info
nvidia-smi topo -m >> "$LOG" 2>&1
stage ring_x$NGPU
timeout "${T_RING:-570}" torchrun --standalone --nproc_per_node="$NGPU" experiments/ring/multi_gpu.py \
    --out-dir "$OUT" --budget-s "${BUDGET_S:-420}" ${SIZES:+--sizes "$SIZES"} > "$OUT/multi_gpu.log" 2>&1
echo "multi_gpu rc=$?" | tee -a "$LOG"
grep -E "N=|summary|Error|error" "$OUT/multi_gpu.log" | head -40 | tee -a "$LOG"
