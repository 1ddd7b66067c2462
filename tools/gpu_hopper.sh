#!/usr/bin/env bash
# The Hopper chapter's GPU run (issue 14), from the repository root on an sm_90 machine with torch,
# triton and cupy (no venv needed), in one call:
#   1. the gpu tests of tests/test_cuda_hopper.py (FlashAttention criterion on odd shapes, causal
#      both alignments, grouped heads, rows with no key), and its compile/SASS tests where nvcc is;
#   2. SASS of each W1 build (nvcc for sm_90a + cuobjdump): HGMMA / HMMA / WARPGROUP counts;
#   3. the benchmark: W1 (and its variants) vs SDPA flash, SDPA cuDNN and cuda-v3 in one process;
#   4. Nsight Compute on one protocol-size launch of W1, cuda-v3 and SDPA-flash: speed of light,
#      pipe utilisation (tensor pipe), warp stall reasons, occupancy;
#   5. compute-sanitizer memcheck, racecheck and synccheck of small launches of every build.
# Results: $OUT/hopper.log (the summary), $OUT/bench.json, and $OUT/hopper_run.tgz with the details
# (tests.log, sass_*.txt and their ptxas reports, bench.log, ncu.txt, ncu_metrics.txt, and
# {memcheck,racecheck,synccheck}.log): the device tool brings back 8 files at most.
# Usage: OUT=/some/dir bash tools/gpu_hopper.sh [--quick]   (--quick: N = 4096 only, float16 only)
# Stage limits in seconds: T_TEST T_SASS T_BENCH T_NCU T_SAN (defaults 150 60 240 120 90 each tool);
# SKIP=tests,sass,bench,ncu,san skips the stages named; SAN_TOOLS (default "memcheck racecheck synccheck").
set -u
OUT=${OUT:-.gpu_out}
mkdir -p "$OUT"
LOG="$OUT/hopper.log"
DET=$(mktemp -d)
pack() { cp "$DET/bench.json" "$OUT/" 2>/dev/null; tar czf "$OUT/hopper_run.tgz" -C "$DET" . 2>/dev/null; }
trap pack EXIT
trap 'exit 143' TERM INT
export PYTHONPATH=src PYTHONUNBUFFERED=1
. tools/gpu_common.sh
QUICK=${1:-}
skip() { case ",${SKIP:-}," in *",$1,"*) return 0;; esac; return 1; }

stage "machine"
machine_info

if ! skip tests; then
  stage "tests"
  timeout ${T_TEST:-150} python3 -m pytest tests/test_cuda_hopper.py -q -rfE --tb=short -p no:cacheprovider \
      > "$DET/tests.log" 2>&1
  echo "pytest rc=$?" | tee -a "$LOG"; tail -5 "$DET/tests.log" | tee -a "$LOG"
fi

if ! skip sass && command -v nvcc > /dev/null; then
  stage "sass"
  CUO=$(command -v cuobjdump || echo "$(dirname "$(command -v nvcc)")/cuobjdump")
  for D in 64 128; do for BF in 0 1; do for SPLIT in 1 0; do
    [ $D = 64 ] && [ $SPLIT = 0 ] && continue
    name="sass_d${D}_bf${BF}_split${SPLIT}"
    timeout ${T_SASS:-60} nvcc -std=c++17 -cubin -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
        -DHEAD_DIM=$D -DFT_BF16=$BF -DW1_PV_SPLIT=$SPLIT -o "$DET/$name.cubin" src/flashtut/cuda/kernels/fwd_w1_wgmma.cu \
        > "$DET/$name.ptxas" 2>&1
    "$CUO" --dump-sass "$DET/$name.cubin" > "$DET/$name.txt" 2>&1
    echo "$name: HGMMA $(grep -c HGMMA "$DET/$name.txt") HMMA $(grep -cw HMMA "$DET/$name.txt")" \
         "WARPGROUP $(grep -c WARPGROUP "$DET/$name.txt") | $(grep -E 'Used|warn' "$DET/$name.ptxas" | tr '\n' ' ')" \
         | tee -a "$LOG"
    rm -f "$DET/$name.cubin"
  done; done; done
fi

if ! skip bench; then
  stage "bench"
  if [ "$QUICK" = "--quick" ]; then BARGS="--ns 4096 --dtypes float16"; else BARGS=""; fi
  timeout ${T_BENCH:-240} python3 tools/bench_hopper.py --out "$DET/bench.json" $BARGS > "$DET/bench.log" 2>&1
  echo "bench rc=$?" | tee -a "$LOG"
  python3 - "$DET/bench.log" <<'EOF' | tee -a "$LOG"
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"{r['impl']:18s} {r['dtype']:8s} D={r['D']:3d} N={r['N']:5d} causal={r['causal']!s:5s} "
              f"{r.get('fwd_tflops', '-')!s:>7s} TFLOP/s  x{r.get('vs_flash', '-')!s:5s} err {r.get('fwd_err', float('nan')):.2e} "
              f"{r.get('error', '')}")
EOF
fi

if ! skip ncu && command -v ncu > /dev/null; then
  stage "ncu"
  timeout ${T_NCU:-120} ncu --clock-control none -k "regex:flash_fwd_w1|flash_fwd_v3|flash_fwd_kernel" -c 6 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section LaunchStats python3 tools/hopper_launches.py --profile > "$DET/ncu.txt" 2>&1
  echo "ncu rc=$?" | tee -a "$LOG"
  grep -E "flash_fwd|Compute \(SM\) Throughput|Tensor|Registers Per|Achieved Occupancy|Stall" "$DET/ncu.txt" \
      | head -60 | tee -a "$LOG"
  # the ladder table's columns: tensor-pipe activity (HGMMA counts under the hmma_hgmma_qgmma pipe),
  # wgmma instructions, bank conflicts of wgmma's shared-memory reads, and the stall reasons
  timeout ${T_NCU:-120} ncu --clock-control none -k "regex:flash_fwd_w1|flash_fwd_v3|flash_fwd_kernel" -c 6 \
      --metrics sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,\
sm__inst_executed_pipe_tensor_op_hmma.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_gmma.sum,\
smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio \
      python3 tools/hopper_launches.py --profile > "$DET/ncu_metrics.txt" 2>&1
  echo "ncu metrics rc=$?" | tee -a "$LOG"
  grep -E "flash_fwd|pct_of_peak|\.sum|stalled" "$DET/ncu_metrics.txt" | head -80 | tee -a "$LOG"
fi

if ! skip san && command -v compute-sanitizer > /dev/null; then
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    stage "$tool"
    timeout ${T_SAN:-90} compute-sanitizer --tool $tool --print-limit 20 python3 tools/hopper_launches.py \
        > "$DET/$tool.log" 2>&1
    echo "$tool rc=$?" | tee -a "$LOG"; tail -3 "$DET/$tool.log" | tee -a "$LOG"
  done
fi
stage "done"
