#!/usr/bin/env bash
# Decoding at the memory limit, on one GPU, from the repository root, in at most about 235 s:
#   1. the gpu tests of the decode kernel, the paged cache and the serving loop (the yardstick, CUDA graph replay);
#   2. python -m flashtut.bench decode: the kernel's bandwidth fraction against the copy bandwidth measured in the
#      same run, the paged read's cost against the contiguous one, and its speed against SDPA's best form, at cache
#      lengths 1k..64k, batch 1 and 32, 32 query heads over 8 KV heads, D = 128, float16 and bfloat16;
#   3. experiments/decode/run_serving.py: tokens/s of generation (PyTorch reference, SDPA over a dense cache, ours
#      over a paged cache in a CUDA graph) at prompts 1k, 4k, 16k, 64k, batch 1 and a mixed batch of 32.
#   OUT=/some/dir bash experiments/decode/gpu.sh
# Results: $OUT/run.log (summary), $OUT/gpu_tests.log, $OUT/decode_kernel_b1.json, $OUT/decode_kernel_b32.json,
# $OUT/decode_serving.json (commit them to book/data as decode_kernel_<gpu>_b1.json, decode_kernel_<gpu>_b32.json
# and decode_serving_<gpu>.json, <gpu> h100 or h200).
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0

stage info
machine_info
stage tests
gpu_tests "${T_TESTS:-70}" "$OUT/gpu_tests.log" tests/kernels/test_triton_decode.py tests/core/test_decode.py
stage kernel
timeout "${T_KERNEL_B1:-55}" python3 -m flashtut.bench decode --batch 1 \
    --lengths 1024,4096,16384,32768,65536 --out "$OUT/decode_kernel_b1.json" > "$OUT/kernel_b1.log" 2>&1
echo "decode b1 rc=$?" | tee -a "$LOG"
grep "^|" "$OUT/kernel_b1.log" | tee -a "$LOG"
timeout "${T_KERNEL_B32:-45}" python3 -m flashtut.bench decode --batch 32 \
    --lengths 1024,4096,16384,65536 --out "$OUT/decode_kernel_b32.json" > "$OUT/kernel_b32.log" 2>&1
echo "decode b32 rc=$?" | tee -a "$LOG"
grep "^|" "$OUT/kernel_b32.log" | tee -a "$LOG"
stage serving
timeout "${T_SERVING:-60}" python3 experiments/decode/run_serving.py --out "$OUT/decode_serving.json" \
    > "$OUT/serving.log" 2>&1
echo "serving rc=$?" | tee -a "$LOG"
grep "^|" "$OUT/serving.log" | tee -a "$LOG"
tail -3 "$OUT/serving.log" | grep -v "^|" | tee -a "$LOG"
stage done
