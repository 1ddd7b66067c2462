#!/usr/bin/env bash
# The performance protocol of DESIGN.md, every implementation, one process per (head dim, dtype):
# naive, tiled (small N only: the registry refuses it above 1024 tiles per call), the SDPA flash,
# cuDNN and efficient backends, Triton, the fast CUDA kernel and every CUDA ladder step, forward
# and backward, N 512..16384, causal and not. One process per file, so every ratio to SDPA flash
# in chapter 09 compares two rows measured in the same process.
#   OUT=/some/dir DIMS="128 64" DTYPES="float16 bfloat16" TESTS=1 bash tools/gpu_protocol.sh
# writes $OUT/bench_h200_protocol_d<D>_<dtype>.json (copied to book/data/ unchanged), and with
# TESTS=1 first runs every `gpu`-marked test into $OUT/gpu_tests.log.
# Triton runs its first configuration (FLASHTUT_TRITON_AUTOTUNE=0), as in tools/gpu_final.sh.
set -u
OUT=${OUT:-.gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 FLASHTUT_TRITON_AUTOTUNE=0
LOG="$OUT/protocol.log"
IMPLS=naive,tiled,sdpa-flash,sdpa-cudnn,sdpa-efficient,triton,cuda,cuda-ladder
stage() { echo "== $1 $(date -u +%H:%M:%S)" | tee -a "$LOG"; }

stage info
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c 'import sys, torch, triton, cupy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "cupy", cupy.__version__)'
  git log -1 --format='commit %H' 2>/dev/null; } >> "$LOG" 2>&1

if [ "${TESTS:-0}" = 1 ]; then
    stage tests
    if python3 -c "import xdist" 2>/dev/null; then W="-n 8"; else W=""; fi
    timeout "${T_TESTS:-200}" python3 -m pytest -m gpu $W -p no:cacheprovider -q -rfE --tb=short \
        > "$OUT/gpu_tests.log" 2>&1
    echo "pytest rc=$?" | tee -a "$OUT/gpu_tests.log" "$LOG"
    tail -4 "$OUT/gpu_tests.log" | tee -a "$LOG"
fi

for D in ${DIMS:-128 64}; do
    for DT in ${DTYPES:-float16 bfloat16}; do
        stage "sweep D=$D $DT"
        timeout "${T_SWEEP:-150}" python3 -m flashtut.bench run --preset protocol -D "$D" --dtype "$DT" \
            --causal both --impl $IMPLS --warmup-ms 5 --rep-ms 25 --no-progress \
            --out "$OUT/bench_h200_protocol_d${D}_${DT}.json" >> "$LOG" 2>&1
        echo "sweep D=$D $DT rc=$?" | tee -a "$LOG"
    done
done
stage done
