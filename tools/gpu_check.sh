#!/usr/bin/env bash
# The whole GPU check, from the repository root on a machine with a GPU, torch, triton and cupy (no
# venv needed): every result lands under $OUT (default .gpu_out/).
#   OUT=/some/dir [STAGES="tests sanitizer protocol"] bash tools/gpu_check.sh
# Stages, in this order (STAGES picks a subset; each has a time limit in seconds, T_<STAGE>):
#   tests      pytest -m gpu over the whole suite (Triton autotuning off)         gpu_tests.log
#   sanitizer  compute-sanitizer memcheck and racecheck of tools/sanitizer_launches.py
#                                                                                  memcheck.log, racecheck.log
#   protocol   the performance protocol, every implementation, one process per head dim and dtype
#              (DIMS, DTYPES)                                                      bench_h200_protocol_d*_*.json
#   kernels    Triton, CUDA and SDPA flash at the long shapes, with a longer timing budget
#                                                                                  bench_h200_kernels.json
#   roofline   copy bandwidth and matmul rates (chapter 01)                        h200_roofline.json
#   instructions  mma.sync's and wgmma's own ceilings (chapter 09)          h200_instruction_peaks.json
#   memory     peak extra memory of one forward against N (chapter 09)             memory_h200.json
#   triton     chapter 07's runs: Triton against SDPA flash, autotuned, and the N sweep
#                                                                                  triton_h200.json, triton_h200_sweep.json
#   cuda       chapter 08's runs: the ladder and the fast kernel, its tile shapes cuda_h200.json, cuda_tiles_h200.json
#   host       host time per call (experiments/host_overhead)                      host_overhead_h200.json
#   real-models  Triton with grouped-query heads, a window and packed batches against SDPA flash
#                                                                                  real_models_h200.json
#   capstone   chapter 12's GPT: loss per backend, tokens/s and memory, generation, packed batches
#                                                                                  capstone_h200.json
#   hopper     chapter 11's Hopper rungs against SDPA flash and cuDNN (sm_90 only; experiments/hopper_options/gpu_hopper.sh
#              adds its tests, SASS, Nsight Compute and sanitizers)                  hopper_h200.json
#   shipped    cuda_attention as it ships (sm_90 only): compute-sanitizer synccheck, racecheck and
#              memcheck over its Hopper forward (sanitizer_launches.py --defaults; T_SHIPPED_SANITIZER
#              each), its protocol run
#              against SDPA flash and cuDNN, and Nsight Compute over its Hopper builds (profile set
#              `shipped`)          *_defaults.log, cuda_protocol_h200.json, ncu_shipped_h200.json
# Default STAGES: tests sanitizer protocol. Triton runs its first configuration in every stage but
# `triton` (FLASHTUT_TRITON_AUTOTUNE=0): autotuning every shape would spend the call compiling.
set -u
OUT=${OUT:-.gpu_out}
. "$(dirname "$0")/gpu_common.sh"
STAGES=" ${STAGES:-tests sanitizer protocol} "
want() { [[ "$STAGES" == *" $1 "* ]]; }
export FLASHTUT_TRITON_AUTOTUNE=0
IMPLS=naive,tiled,sdpa-flash,sdpa-cudnn,sdpa-efficient,triton,cuda,cuda-ladder

stage info
machine_info

if want tests; then stage tests; gpu_tests "${T_TESTS:-230}" "$OUT/gpu_tests.log"; fi
if want sanitizer; then
    stage sanitizer
    sanitizer "${T_SANITIZER:-120}" memcheck
    sanitizer "${T_SANITIZER:-120}" racecheck
fi
if want protocol; then
    for D in ${DIMS:-128 64}; do for DT in ${DTYPES:-float16 bfloat16}; do
        stage "protocol D=$D $DT"
        bench "${T_PROTOCOL:-150}" "protocol D=$D $DT" run --preset protocol -D "$D" --dtype "$DT" --causal both \
            --impl $IMPLS --warmup-ms 5 --rep-ms 25 --out "$OUT/bench_h200_protocol_d${D}_${DT}.json"
    done; done
fi
if want kernels; then
    stage kernels
    bench "${T_KERNELS:-170}" kernels run --impl triton,cuda,sdpa-flash -D 128,64 -N 4096,16384 \
        --dtype float16,bfloat16 --causal both --mode fwd,bwd --tokens 16384 --hidden 2048 \
        --warmup-ms 5 --rep-ms 40 --out "$OUT/bench_h200_kernels.json"
fi
if want roofline; then
    stage roofline
    bench "${T_ROOFLINE:-40}" roofline roofline --dtype float16,bfloat16,float32,tf32 --out "$OUT/h200_roofline.json"
fi
if want instructions; then
    stage instructions
    bench "${T_INSTRUCTIONS:-60}" instructions roofline --what instruction --dtype float16,bfloat16 \
        --out "$OUT/h200_instruction_peaks.json"
fi
if want memory; then
    stage memory
    bench "${T_MEMORY:-60}" memory memory --preset protocol --impl naive,sdpa-flash,triton,cuda \
        --out "$OUT/memory_h200.json"
fi
if want triton; then
    stage triton
    FLASHTUT_TRITON_AUTOTUNE=1 bench "${T_TRITON:-300}" triton run --preset triton-autotune \
        --warmup-ms 25 --rep-ms 150 --out "$OUT/triton_h200.json"
    FLASHTUT_TRITON_AUTOTUNE=1 bench "${T_TRITON:-300}" triton-sweep run --preset triton-sweep \
        --warmup-ms 10 --rep-ms 60 \
        --out "$OUT/triton_h200_sweep.json"
fi
if want cuda; then
    stage cuda
    bench "${T_CUDA:-150}" cuda-ladder run --preset cuda-ladder --out "$OUT/cuda_h200.json"
    bench "${T_CUDA:-150}" cuda-tiles run --preset cuda-tiles --out "$OUT/cuda_tiles_h200.json"
fi
if want real-models; then
    stage real-models
    timeout "${T_REAL_MODELS:-120}" python3 -m flashtut.bench real-models --warmup-ms 10 --rep-ms 50 \
        --out "$OUT/real_models_h200.json" >> "$LOG" 2>&1
    echo "real-models rc=$?" | tee -a "$LOG"
fi
if want capstone; then
    stage capstone
    timeout "${T_CAPSTONE:-150}" python3 -m flashtut.model.measure --out "$OUT/capstone_h200.json" >> "$LOG" 2>&1
    echo "capstone rc=$?" | tee -a "$LOG"
fi
if want host; then
    stage host
    timeout "${T_HOST:-60}" python3 -m flashtut.bench host --out "$OUT/host_overhead_h200.json" >> "$LOG" 2>&1
    echo "host rc=$?" | tee -a "$LOG"
fi
if want hopper; then
    stage hopper
    bench "${T_HOPPER:-300}" hopper run --preset hopper --out "$OUT/hopper_h200.json"
fi
if want shipped; then
    stage shipped
    # the limits sum to 480 s by default, so the whole stage fits one 10-minute device call
    for tool in synccheck racecheck memcheck; do sanitizer "${T_SHIPPED_SANITIZER:-60}" "$tool" --defaults; done
    bench "${T_PROTOCOL:-150}" cuda-protocol run --impl cuda,cuda-mma,sdpa-flash,sdpa-cudnn --mode fwd,bwd \
        -D 128,64 -N 4096,16384 --dtype float16,bfloat16 --causal both --tokens 16384 --hidden 2048 \
        --warmup-ms 5 --rep-ms 40 --out "$OUT/cuda_protocol_h200.json"
    bench "${T_NCU:-150}" ncu-shipped profile --set shipped --out "$OUT/ncu_shipped_h200.json"
fi
stage done
