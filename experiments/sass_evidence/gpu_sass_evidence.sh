#!/usr/bin/env bash
# Evidence that the instructions decide the ranking on Hopper, in one call of at most
# 150 s, from the repository root on an sm_90 machine with torch, triton and cupy:
#   sdpa     SDPA flash's forward kernels (D 128, float16) read out of libtorch_cuda.so by name with
#            cuobjdump (in the background, while the GPU runs the next stage)
#   speed    our Triton forward and backward and SDPA flash, D 128, N 4096 and 16384, float16, causal and
#            not, timed twice, each time in a fresh process with a fresh TRITON_CACHE_DIR: once with
#            Triton's defaults (wgmma on sm_90) and once with DISABLE_MMA_V3=1 (Triton's switch to
#            mma.sync); SDPA flash is timed in both processes as the reference
#   sass     the instruction counts (HGMMA, HMMA, UTMALDG, LDGSTS, LDSM ...) of every Triton kernel each
#            process compiled (the cubins in its cache folder), of our CUDA forwards (W1 for sm_90a and
#            the mma.sync one) and SDPA flash's, with the speed rows, in one results file
# Usage: OUT=/some/dir bash experiments/sass_evidence/gpu_sass_evidence.sh
# Limits in seconds: T_SPEED per timing process (55), T_SDPA (100), T_SASS (60).
# $OUT gets run.log (the summary), sass_evidence_h200.json (the results file) and sass_run.tgz (the
# parts, each process's log and the SASS listings of the Triton kernels).
set -u
FINAL=${OUT:-.gpu_out}
mkdir -p "$FINAL"
OUT=$(mktemp -d)
. tools/gpu_common.sh
RESULT=sass_evidence_h200.json
pack() {
    cp "$LOG" "$FINAL/run.log"; cp "$OUT/$RESULT" "$FINAL/" 2>/dev/null
    tar czf "$FINAL/sass_run.tgz" --exclude='triton_cache_*' -C "$OUT" . 2>/dev/null
}
trap pack EXIT
trap 'exit 143' TERM INT

stage info
machine_info

stage sdpa
timeout "${T_SDPA:-100}" python3 -m flashtut.bench sass --what sdpa -D 128 --out "$OUT/part_sdpa.json" \
    > "$OUT/sdpa.log" 2>&1 &
SDPA_PID=$!

# same shapes in both processes: the protocol's 16k tokens, hidden 2048 (16 heads of 128)
SHAPES="--impl triton,sdpa-flash -D 128 -N 4096,16384 --dtype float16 --causal both --mode fwd,bwd \
        --tokens 16384 --hidden 2048 --warmup-ms 5 --rep-ms 30 --no-progress"
for setting in default no-mma-v3; do
    stage "speed $setting"
    cache="$OUT/triton_cache_$setting"
    mkdir -p "$cache"
    extra=()
    [ "$setting" = no-mma-v3 ] && extra=(DISABLE_MMA_V3=1)
    env ${extra[@]+"${extra[@]}"} TRITON_CACHE_DIR="$cache" FLASHTUT_TRITON_AUTOTUNE=0 \
        timeout "${T_SPEED:-55}" python3 -m flashtut.bench run $SHAPES --out "$OUT/speed_$setting.json" \
        > "$OUT/speed_$setting.log" 2>&1
    echo "speed $setting rc=$?" | tee -a "$LOG"
    tail -12 "$OUT/speed_$setting.log" | tee -a "$LOG"
done

stage "sdpa wait"
wait "$SDPA_PID"
echo "sdpa rc=$?" | tee -a "$LOG"
tail -3 "$OUT/sdpa.log" | tee -a "$LOG"

stage sass
ARGS=(--what triton,cuda -D 128 --listings "$OUT"
      --triton-cache "default=$OUT/triton_cache_default" --triton-cache "DISABLE_MMA_V3=1=$OUT/triton_cache_no-mma-v3")
[ -s "$OUT/speed_default.json" ] && ARGS+=(--speed "default=$OUT/speed_default.json")
[ -s "$OUT/speed_no-mma-v3.json" ] && ARGS+=(--speed "DISABLE_MMA_V3=1=$OUT/speed_no-mma-v3.json")
[ -s "$OUT/part_sdpa.json" ] && ARGS+=(--part "$OUT/part_sdpa.json")
timeout "${T_SASS:-60}" python3 -m flashtut.bench sass "${ARGS[@]}" --out "$OUT/$RESULT" > "$OUT/sass.log" 2>&1
echo "sass rc=$?" | tee -a "$LOG"
cat "$OUT/sass.log" >> "$LOG"
stage done
