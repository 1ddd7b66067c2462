#!/usr/bin/env bash
# The Triton backward's candidates against SDPA flash on one GPU (experiments/triton_backward/ab.py), from the
# repository root, at most about 235 s:
#   OUT=/some/dir bash experiments/triton_backward/gpu.sh
# 1. gate: 24 processes at once (head dim 64/128 x causal x float16/bfloat16 x three parts of the candidates)
#    check every candidate's gradients on ragged shapes by the yardstick; this also fills Triton's cache.
# 2. time: one process, the protocol grid (D 128/64, N 16384/4096, fp16/bf16, causal and not), SDPA flash and
#    every candidate that passed the gate, interleaved rounds; ratios = SDPA flash's time / the candidate's.
# 3. fwd-guard: the forward in bfloat16 against float16 at N = 4096 (the overflow guard).
# 4. the gpu tests of the head dims above 128, in the time left (T_TESTS caps them).
# Results under $OUT: run.log (the summary printed here), gate_*.json/.log, triton_backward.json/.txt (results
# format, kind speed), fwd_guard.json/.txt, gpu_tests.log.
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
export FLASHTUT_TRITON_AUTOTUNE=0
T0=$(date +%s)
left() { echo $(( ${BUDGET_S:-235} - ($(date +%s) - T0) )); }
AB=experiments/triton_backward/ab.py

stage info
machine_info
stage gate
for D in 128 64; do for c in 0 1; do for dt in float16 bfloat16; do for h in a b c; do
    timeout "${T_GATE:-100}" python3 "$AB" gate --D "$D" --causal "$c" --dtype "$dt" --part "$h" --out-dir "$OUT" \
        > "$OUT/gate_${D}_${c}_${dt}_${h}.log" 2>&1 &
done; done; done; done
wait
grep -h "^gate" "$OUT"/gate_*.log | sort > "$OUT/gate_summary.txt"
grep "FAIL" "$OUT/gate_summary.txt" | tee -a "$LOG"
echo "gate: $(grep -c PASS "$OUT/gate_summary.txt") pass, $(grep -c FAIL "$OUT/gate_summary.txt") fail" \
     "of 8 classes x 4 candidates (missing rows: cut off by T_GATE)" | tee -a "$LOG"

stage time
t=$(( $(left) - ${RESERVE_S:-45} ))
timeout "$t" python3 "$AB" time --rounds "${ROUNDS:-2}" --budget-s $(( t - 15 )) --out-dir "$OUT" > "$OUT/time.log" 2>&1
echo "time rc=$?" | tee -a "$LOG"
grep -E "^D=|^  |SUMMARY|budget" "$OUT/time.log" | tee -a "$LOG"
grep -q SUMMARY "$OUT/time.log" || timeout 30 python3 "$AB" summary --out-dir "$OUT" 2>&1 | tee -a "$LOG"

stage fwd-guard
timeout "${T_FWD:-30}" python3 "$AB" fwd-guard --rounds 3 --out-dir "$OUT" > "$OUT/fwd_guard.log" 2>&1
echo "fwd-guard rc=$?" | tee -a "$LOG"
grep "^fwd" "$OUT/fwd_guard.log" | tee -a "$LOG"

stage tests
t=$(left)
if [ "$t" -gt 20 ]; then
    gpu_tests "$(( t < ${T_TESTS:-600} ? t : ${T_TESTS:-600} ))" "$OUT/gpu_tests.log" tests/kernels/test_triton.py \
        -k "head_dims_up_to_256 or wide_config"
else
    echo "tests: no time left; run them apart (see experiments/triton_backward/README.md)" | tee -a "$LOG"
fi
stage done
