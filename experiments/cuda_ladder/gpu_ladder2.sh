#!/usr/bin/env bash
# The CUDA ladder's second GPU run, after the defaults changed (cuda_attention: step v5 at D = 128, the
# atomic-dQ backward): every build compiled in parallel, the CUDA gpu tests, the protocol benchmark
# of cuda_attention against SDPA flash through the project's CLI, the backward strategies again
# (checks and timings), compute-sanitizer racecheck of the new backward configurations, and ncu on
# one backward of each dQ strategy. Usage: OUT=/some/dir bash experiments/cuda_ladder/gpu_ladder2.sh; writes
# gpu_tests.log, bench_protocol.json, bench.log, ladder_bwd.json, ladder_bwd.log, racecheck.log,
# ncu_bwd.csv under $OUT.
set -u
OUT=${OUT:-.gpu_out}
source tools/gpu_common.sh   # PYTHONPATH, $OUT, the run log
machine_info
timeout ${T_WARM:-30} python3 experiments/cuda_ladder/cuda_ladder.py --warm-only
timeout ${T_TEST:-90} python3 -m pytest tests/kernels/test_cuda.py tests/kernels/test_cuda_backward.py -m gpu -q -rf \
    -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "tests exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -25
timeout ${T_BENCH:-55} python3 -m flashtut.bench run --impl cuda,sdpa-flash -D 128,64 -N 4096,16384 \
    --dtype float16,bfloat16 --causal both --mode fwd,bwd --tokens 16384 --hidden 2048 --warmup-ms 5 \
    --rep-ms 40 --no-progress --out "$OUT/bench_protocol.json" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
# LOADER_AB=<file>: step 3's .cu from before the loader rewrite (git show 5e5e80a~1:src/flashtut/cuda/fwd_v3_fast.cu)
timeout ${T_BWD:-55} python3 experiments/cuda_ladder/cuda_ladder.py --bwd-only ${LOADER_AB:+--loader-ab $LOADER_AB} \
    --out "$OUT/ladder_bwd.json" > "$OUT/ladder_bwd.log" 2>&1
echo "ladder bwd exit $?"
timeout ${T_RACE:-25} compute-sanitizer --tool racecheck --print-limit 20 python3 experiments/cuda_ladder/cuda_ladder.py \
    --sanitizer-launch > "$OUT/racecheck.log" 2>&1
echo "racecheck exit $?"; tail -2 "$OUT/racecheck.log"
timeout ${T_NCU:-25} ncu --clock-control none --kernel-name "regex:attn_bwd_(dkdv|dq)" --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis_Tables \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    --csv --page raw python3 experiments/cuda_ladder/cuda_ladder.py --ncu-bwd-launch > "$OUT/ncu_bwd.csv" 2>&1
echo "ncu exit $?"
grep -v '^{' "$OUT/ladder_bwd.log" | tail -12
tail -22 "$OUT/bench.log"
