#!/usr/bin/env bash
# The CUDA ladder's GPU run (the CUDA forward ladder, steps 3 to 7, and the backward's dQ strategies), from
# the repository root on a machine with a GPU, torch, triton, cupy, nvcc, ncu and compute-sanitizer:
#   1. ptxas -v of every new step (nvcc, sm_90, fp16, D = 64 and 128), in the background;
#   2. optional: the new steps' gpu tests (T_TEST > 0);
#   3. experiments/cuda_ladder/cuda_ladder.py: first-call compile times, correctness on odd shapes, forward TFLOP/s of
#      steps 3-7 and SDPA flash, backward of SDPA flash and our two dQ strategies, one process;
#   4. ncu --clock-control none on one launch of SDPA flash and of each step (N = 4096, D = 128, fp16);
#   5. compute-sanitizer memcheck (and racecheck) on small launches of the new steps.
# Usage: OUT=/some/dir [QUICK=--quick] [T_TEST=60] bash experiments/cuda_ladder/gpu_ladder.sh; writes under $OUT:
# ptxas.log, ladder.json, ladder.log, ncu.csv, ncu_summary.txt, memcheck.log, racecheck.log.
set -u
OUT=${OUT:-.gpu_out}
source tools/gpu_common.sh   # PYTHONPATH, $OUT, the run log
machine_info
D=src/flashtut/cuda/kernels
( for pipe in "0 0" "1 0" "2 0" "2 1"; do set -- $pipe; for hd in 128 64; do
    echo "== V4_PIPE=$1 V4_SKIP_RESCALE=$2 HEAD_DIM=$hd"
    nvcc -std=c++17 -fatbin -Xptxas -v -gencode arch=compute_90,code=sm_90 -DHEAD_DIM=$hd -DV4_PIPE=$1 \
      -DV4_SKIP_RESCALE=$2 -o /dev/null $D/fwd_v4_fa2.cu 2>&1 | grep -E "registers|spill"
  done; done
  echo "== v3 (D=128: 8 warps, 128-key tiles)"
  nvcc -std=c++17 -fatbin -Xptxas -v -gencode arch=compute_90,code=sm_90 -DHEAD_DIM=128 -DV3_WARPS=8 \
      -DV3_BLOCK_N=128 -o /dev/null $D/fwd_v3_fast.cu 2>&1 | grep -E "registers|spill"
) > "$OUT/ptxas.log" 2>&1 &
PTXAS=$!

if [ "${T_TEST:-0}" != 0 ]; then
  timeout "$T_TEST" python3 -m pytest tests/kernels/test_cuda.py -m gpu -q -rf -p no:cacheprovider -k "v4 or v5 or v6 or v7 or group or diag" \
      2>&1 | tail -15
fi

timeout ${T_BENCH:-150} python3 experiments/cuda_ladder/cuda_ladder.py --out "$OUT/ladder.json" ${QUICK:-} > "$OUT/ladder.log" 2>&1
echo "ladder exit $?"

if command -v ncu > /dev/null; then
  timeout ${T_NCU:-60} ncu --clock-control none --kernel-name regex:flash_fwd --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis_Tables \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      --csv --page raw python3 experiments/cuda_ladder/cuda_ladder.py --ncu-launch > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "ncu exit $?"
  python3 - "$OUT/ncu.csv" > "$OUT/ncu_summary.txt" 2>&1 <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
head, data = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
names = ["sdpa-flash", "v3", "v4", "v5", "v6", "v7"]
col = {h: i for i, h in enumerate(head)}
def get(r, h):
    try: return float(r[col[h]].replace(",", ""))
    except (KeyError, ValueError): return float("nan")
for name, r in zip(names, data):
    stalls = sorted(((get(r, h), h) for h in head if "issue_stalled" in h and h.endswith("per_issue_active.ratio")), reverse=True)[:4]
    conf = [(h, r[col[h]]) for h in head if "bank_conflicts" in h and "shared" in h and h.endswith(".sum")]
    print(f"{name:10s} tensor {get(r, 'sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f}% "
          f"occupancy {get(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.1f}% "
          f"regs {r[col['launch__registers_per_thread']] if 'launch__registers_per_thread' in col else '?'} "
          f"dur {get(r, 'gpu__time_duration.sum'):.0f}")
    print("   stalls per issue:", ", ".join(f"{h.split('issue_stalled_')[1].split('_per')[0]} {v:.2f}" for v, h in stalls))
    print("   bank conflicts:", ", ".join(f"{h}={v}" for h, v in conf))
PY
  cat "$OUT/ncu_summary.txt"
fi

if command -v compute-sanitizer > /dev/null; then
  timeout ${T_MEM:-45} compute-sanitizer --tool memcheck --print-limit 20 python3 experiments/cuda_ladder/cuda_ladder.py \
      --sanitizer-launch > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"; tail -2 "$OUT/memcheck.log"
  timeout ${T_RACE:-45} compute-sanitizer --tool racecheck --print-limit 20 python3 experiments/cuda_ladder/cuda_ladder.py \
      --sanitizer-launch > "$OUT/racecheck.log" 2>&1
  echo "racecheck exit $?"; tail -2 "$OUT/racecheck.log"
fi
wait $PTXAS
cat "$OUT/ptxas.log"
grep -v '^{' "$OUT/ladder.log" | tail -40
