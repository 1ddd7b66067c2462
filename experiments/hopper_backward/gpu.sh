#!/usr/bin/env bash
# Chapter 11b's missing column: each rung's tensor-pipe activity (Nsight Compute, one launch per rung and
# SDPA flash's backward, D = 64 and 128, N = 4096, float16), into $OUT/ncu_hopper_bwd_h100.json (about
# 2 minutes on an H100). Run from the repository root:
#   PYTHONPATH=$PWD/src FLASHTUT_TRITON_AUTOTUNE=0 OUT=<dir> bash experiments/hopper_backward/gpu.sh
set -u
OUT=${OUT:-.gpu_out}
. "$(dirname "$0")/../../tools/gpu_common.sh"
machine_info
nvidia-smi --query-gpu=name --format=csv,noheader
stage "ncu per rung"
timeout 220 python3 experiments/hopper_backward/ncu_rungs.py --out "$OUT/ncu_hopper_bwd_h100.json" 2>&1 \
    | tee "$OUT/ncu_rungs.txt" | grep -E "^D =|wrote|expected|ran|Error" | cut -c1-160
