#!/usr/bin/env bash
# Second lead call: the GPU tests changed after the first call, then the rest of the protocol
# sweep (D=128 fp16: N 8192 and 16384 non-causal, every N causal; then D=64 fp16).
#   OUT=/some/dir bash tools/gpu_final2.sh
set -u
OUT=${OUT:-.gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 FLASHTUT_TRITON_AUTOTUNE=0
LOG="$OUT/run2.log"; B="python3 -m flashtut.bench"
IMPLS=naive,sdpa-flash,sdpa-cudnn,sdpa-efficient,triton,cuda,cuda-ladder
stage() { echo "== $1 $(date -u +%H:%M:%S)" | tee -a "$LOG"; }
stage tests
timeout "${T_TESTS:-110}" python3 -m pytest tests/test_cuda_backward.py -m gpu -n 8 -p no:cacheprovider -q -rfE \
    --tb=short > "$OUT/gpu_tests2.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/gpu_tests2.log" "$LOG"; tail -3 "$OUT/gpu_tests2.log" | tee -a "$LOG"
stage sweep-d128-long
timeout "${T_A:-90}" $B run --preset protocol -D 128 --dtype float16 --causal no -N 8192,16384 --impl $IMPLS \
    --warmup-ms 5 --rep-ms 25 --no-progress --out "$OUT/bench_h200_protocol_b.json" >> "$LOG" 2>&1
stage sweep-d128-causal
timeout "${T_B:-110}" $B run --preset protocol -D 128 --dtype float16 --causal yes --impl $IMPLS \
    --warmup-ms 5 --rep-ms 25 --no-progress --out "$OUT/bench_h200_protocol_c.json" >> "$LOG" 2>&1
stage sweep-d64
timeout "${T_C:-100}" $B run --preset protocol -D 64 --dtype float16 --causal both --impl $IMPLS \
    --warmup-ms 5 --rep-ms 25 --no-progress --out "$OUT/bench_h200_protocol_d64.json" >> "$LOG" 2>&1
stage done
