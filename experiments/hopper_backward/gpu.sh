#!/usr/bin/env bash
# Chapter 11b on an sm_90 GPU (at most 4 minutes): its notebook's GPU cells, run as plain Python (every rung
# against autograd in float64), then the ladder table's missing column: each rung's tensor-pipe activity
# (Nsight Compute, one launch per rung and SDPA flash's backward, D = 64 and 128, N = 4096, float16), into
# $OUT/ncu_hopper_bwd_h100.json. Run from the repository root:
#   PYTHONPATH=$PWD/src FLASHTUT_TRITON_AUTOTUNE=0 OUT=<dir> bash experiments/hopper_backward/gpu.sh
set -u
OUT=${OUT:-.gpu_out}
. "$(dirname "$0")/../../tools/gpu_common.sh"
machine_info
nvidia-smi --query-gpu=name --format=csv,noheader
stage "chapter 11b's cells"
timeout 90 python3 tools/run_notebooks_plain.py notebooks/11_hopper_backward.ipynb > "$OUT/notebook_11b.txt" 2>&1
echo "notebook rc=$?"; grep -E "max \|error\||takes it|Error|Traceback" "$OUT/notebook_11b.txt" | head -12
stage "ncu per rung"
timeout 140 python3 experiments/hopper_backward/ncu_rungs.py --out "$OUT/ncu_hopper_bwd_h100.json" 2>&1 \
    | tee "$OUT/ncu_rungs.txt" | grep -E "^D =|wrote|expected|ran|Error" | cut -c1-160
