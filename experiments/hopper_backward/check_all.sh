#!/usr/bin/env bash
# The Hopper backward's checks on an sm_90 GPU in one call (about 4 minutes on an H100), results under $OUT:
#   the gpu tests of the kernel, cuda_attention's gpu tests (it takes this backward on sm_90), the protocol
#   sweep of every rung against SDPA flash and the mma.sync backward, compute-sanitizer's racecheck, synccheck
#   and memcheck on the shipped rungs, and Nsight Compute's tensor-pipe figures at D = 64 and 128.
# Run from the repository root: OUT=<dir> bash experiments/hopper_backward/check_all.sh
set -u
OUT=${OUT:-.gpu_out}
. "$(dirname "$0")/../../tools/gpu_common.sh"
machine_info
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=line -k "not sm90a and not trap" \
    tests/kernels/test_cuda_hopper_backward.py 2>&1 | tail -2
timeout 110 python3 experiments/hopper_backward/run.py --rep-ms 100 --out "$OUT/sweep.json" > "$OUT/sweep.txt" 2>&1
tail -19 "$OUT/sweep.txt"
for tool in racecheck synccheck memcheck; do
    echo "== $tool"
    timeout 60 compute-sanitizer --tool $tool python3 experiments/hopper_backward/sanitize.py --rungs b3,b4 2>&1 \
        | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|b[34] D" | tail -9
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=line -k "cuda and not triton" \
    tests/kernels/test_cuda.py tests/kernels/test_cuda_dims.py tests/core/test_real_models.py 2>&1 | tail -3
for D in 64 128; do
    timeout 40 ncu --clock-control none -k regex:'bwd_hopper$|flash_bwd_dq' --metrics \
        sm__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,launch__registers_per_thread \
        python3 experiments/hopper_backward/profile_one.py --rungs b1,b2,b3,b4 --D $D > "$OUT/ncu_d$D.txt" 2>&1
    grep -E "^  [a-z]|bwd_hopper \(|flash_bwd" "$OUT/ncu_d$D.txt" | sed 's/  */ /g' | cut -c1-120
done
