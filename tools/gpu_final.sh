#!/usr/bin/env bash
# The morning H200 call: every GPU test, then the measurements behind the kernel chapters, chapter
# 01's roofline and chapter 09's memory figure, through `python -m flashtut.bench`, one process per
# stage. The protocol sweep of chapter 09 is tools/gpu_protocol.sh.
#   OUT=/some/dir [STAGES="tests kernels"] bash tools/gpu_final.sh   (STAGES: a subset of the stages)
# Stages (each with its own time limit, so a slow one cannot starve the rest; every bench stage
# rewrites its JSON as it goes, so a stage cut off by its limit keeps what it measured):
#   tests    pytest -m gpu over the whole suite (Triton autotuning off: one config per kernel)
#   kernels  triton, cuda and SDPA flash, fwd and bwd: D 128 and 64, N 4096 and 16384, fp16/bf16, causal or not
#   roofline copy bandwidth and matmul rates (chapter 01)
#   memory   peak extra memory of one forward against N (chapter 09)
# Triton runs its first (default) configuration in the bench stages (FLASHTUT_TRITON_AUTOTUNE=0):
# autotuning every key would spend the call compiling; the default is each search space's
# first entry: forward within a few percent of the autotuned winner in book/data/triton_h200.json,
# backward up to 15% slower (perflog_triton.md compares the two).
set -u
OUT=${OUT:-.gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 FLASHTUT_TRITON_AUTOTUNE=0
LOG="$OUT/run.log"
B="python3 -m flashtut.bench"
. "$(dirname "$0")/gpu_common.sh"

stage info
machine_info

STAGES=" ${STAGES:-tests kernels roofline memory} "   # a subset runs only those stages
want() { [[ "$STAGES" == *" $1 "* ]]; }

if want tests; then
stage tests
gpu_tests "${T_TESTS:-230}" "$OUT/gpu_tests.log"
fi

if want kernels; then
stage kernels
timeout "${T_KERNELS:-170}" $B run --impl triton,cuda,sdpa-flash -D 128,64 -N 4096,16384 \
    --dtype float16,bfloat16 --causal both --mode fwd,bwd --tokens 16384 --hidden 2048 \
    --warmup-ms 5 --rep-ms 40 --no-progress --out "$OUT/bench_h200_kernels.json" >> "$LOG" 2>&1
echo "kernels rc=$?" | tee -a "$LOG"
fi

if want roofline; then
stage roofline
timeout "${T_ROOF:-40}" $B roofline --dtype float16,bfloat16,float32,tf32 --out "$OUT/h200_roofline.json" >> "$LOG" 2>&1
echo "roofline rc=$?" | tee -a "$LOG"
fi

if want memory; then
stage memory
timeout "${T_MEM:-60}" $B memory --preset protocol --impl naive,sdpa-flash,triton,cuda --no-progress \
    --out "$OUT/memory_h200.json" >> "$LOG" 2>&1
echo "memory rc=$?" | tee -a "$LOG"
fi

stage done
