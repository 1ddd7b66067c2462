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
. "$(dirname "$0")/gpu_common.sh"

stage info
machine_info

if [ "${TESTS:-0}" = 1 ]; then
    stage tests
    gpu_tests "${T_TESTS:-200}" "$OUT/gpu_tests.log"
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
