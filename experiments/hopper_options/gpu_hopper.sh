#!/usr/bin/env bash
# Chapter 11's Hopper evidence, in one call, from the repository root on an sm_90 machine
# with torch, triton and cupy (no venv needed):
#   tests      tests/kernels/test_cuda_hopper.py: the gpu tests (FlashAttention criterion on odd shapes, causal
#              both alignments, grouped heads, rows with no key) and, where nvcc is, the compile tests
#   sass       each W1 to W4 build by nvcc for sm_90a and cuobjdump: HGMMA / HMMA / WARPGROUP counts, and for
#              W2, W3 and W4 UTMALDG / SYNCS / USETMAXREG / BAR and the wgmma waits (DEPBAR), ptxas
#   bench      python -m flashtut.bench run --preset hopper: the Hopper rungs against SDPA flash and
#              cuDNN and the fast mma.sync CUDA kernel (cuda-mma) in one process (QUICK=1: N 4096, float16 only)
#   ncu        Nsight Compute on one launch each of W1 to W4, the mma.sync CUDA forward and SDPA flash at
#              N = 4096, D = 128 and 64 (python -m flashtut.bench profile, NCU_SETS=ladder; 'options': W3 with
#              each build option): the sections (speed of light, warp states, occupancy), then the tensor-pipe,
#              wgmma, pipe and stall metrics by name, as ncu_profile.json
#   sanitizer  compute-sanitizer memcheck, racecheck and synccheck of tools/sanitizer_launches.py
#              (which launches every Hopper build on an sm_90 GPU; the TMA rungs only when the tests stage passed,
#              or when FLASHTUT_SANITIZE_W2=1 / _W3=1 / _W3C3=1 / _W4=1 are set: a rung that hangs would cost
#              each tool its whole limit)
# Usage: OUT=/some/dir [STAGES="tests sass bench ncu sanitizer"] [QUICK=1] [NCU_SETS=ladder,options] [NCU_DIMS="128 64"] bash experiments/hopper_options/gpu_hopper.sh
# Stage limits in seconds: T_TESTS T_SASS T_BENCH T_NCU T_SANITIZER (240, 60 per build, 200, 60 per ncu
# run, 90 per tool). On the H200 the first run (QUICK=1) took 36 s of tests, 7 s of SASS, 11 s of
# benchmark, 9 s of ncu sections and 5 s of memcheck, so the whole script fits one 600-second call.
# $OUT gets run.log (the summary), hopper_h200.json (the benchmark) and hopper_run.tgz (every log,
# the SASS listings, the ncu reports): the device tool brings back 8 files at most.
set -u
FINAL=${OUT:-.gpu_out}
mkdir -p "$FINAL"
OUT=$(mktemp -d)
. tools/gpu_common.sh
STAGES=" ${STAGES:-tests sass bench ncu sanitizer} "
want() { [[ "$STAGES" == *" $1 "* ]]; }
pack() {
    cp "$LOG" "$FINAL/run.log"; cp "$OUT/hopper_h200.json" "$OUT/ncu_profile.json" "$FINAL/" 2>/dev/null
    tar czf "$FINAL/hopper_run.tgz" -C "$OUT" . 2>/dev/null
}
trap pack EXIT
trap 'exit 143' TERM INT
KERNEL=src/flashtut/cuda/kernels/fwd_w1_wgmma.cu

stage info
machine_info

if want tests; then
    stage tests
    timeout "${T_TESTS:-240}" python3 -m pytest tests/kernels/test_cuda_hopper.py $(xdist_workers) -q -rfE --tb=short -p no:cacheprovider \
        > "$OUT/tests.log" 2>&1
    rc=$?
    echo "pytest rc=$rc" | tee -a "$LOG"; tail -4 "$OUT/tests.log" | tee -a "$LOG"
    # the TMA rungs finished their gpu tests (in child processes with timeouts): the sanitizer may run them
    [ "$rc" = 0 ] && export FLASHTUT_SANITIZE_W2=1 FLASHTUT_SANITIZE_W3=1 FLASHTUT_SANITIZE_W3C3=1 FLASHTUT_SANITIZE_W4=1
fi

if want sass && command -v nvcc > /dev/null; then
    stage sass
    CUO=$(command -v cuobjdump || echo "$(dirname "$(command -v nvcc)")/cuobjdump")
    for D in 64 128; do for BF in 0 1; do for SPLIT in 1 0; do
        [ $D = 64 ] && [ $SPLIT = 0 ] && continue
        name="sass_d${D}_bf${BF}_split${SPLIT}"
        timeout "${T_SASS:-60}" nvcc -std=c++17 -cubin -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
            -DHEAD_DIM=$D -DFT_BF16=$BF -DW1_PV_SPLIT=$SPLIT -o "$OUT/$name.cubin" "$KERNEL" > "$OUT/$name.ptxas" 2>&1
        "$CUO" --dump-sass "$OUT/$name.cubin" > "$OUT/$name.txt" 2>&1
        echo "$name: HGMMA $(grep -c HGMMA "$OUT/$name.txt") HMMA $(grep -cw HMMA "$OUT/$name.txt")" \
             "WARPGROUP $(grep -c WARPGROUP "$OUT/$name.txt") | $(grep -E 'Used|warn' "$OUT/$name.ptxas" | tr '\n' ' ')" \
             | tee -a "$LOG"
        rm -f "$OUT/$name.cubin"
    done; done; done
    # the TMA rungs at their defaults: W3 should show two copies of each product, one DEPBAR 0x1 (the
    # pipelined wait), named barriers (BAR.SYNC / BAR.ARV with 0x100 threads) and no C75xx ptxas line
    # (and W3 with three consumer warpgroups, D = 64: "w3c3", no named barrier, setmaxnreg 160; W4 the same
    # counts as W3, "w4c3" as "w3c3")
    for SRC in fwd_w2_tma fwd_w3_pingpong w3c3 fwd_w4_persistent w4c3; do for D in 64 128; do for BF in 0 1; do
        case $SRC in w3c3|w4c3) [ $D = 128 ] && continue;; esac
        EXTRA=""; FILE=$SRC
        [ $SRC = w3c3 ] && EXTRA="-DW3_CONSUMERS=3" && FILE=fwd_w3_pingpong
        [ $SRC = w4c3 ] && EXTRA="-DW3_CONSUMERS=3" && FILE=fwd_w4_persistent
        name="sass_${SRC}_d${D}_bf${BF}"
        timeout "${T_SASS:-60}" nvcc -std=c++17 -cubin -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
            -DHEAD_DIM=$D -DFT_BF16=$BF $EXTRA -o "$OUT/$name.cubin" "src/flashtut/cuda/kernels/$FILE.cu" > "$OUT/$name.ptxas" 2>&1
        "$CUO" --dump-sass "$OUT/$name.cubin" > "$OUT/$name.txt" 2>&1
        echo "$name: HGMMA $(grep -c HGMMA "$OUT/$name.txt") UTMALDG $(grep -c UTMALDG "$OUT/$name.txt")" \
             "SYNCS $(grep -c SYNCS "$OUT/$name.txt") USETMAXREG $(grep -c USETMAXREG "$OUT/$name.txt")" \
             "BAR $(grep -cE 'BAR\.(SYNC|ARV)' "$OUT/$name.txt")" \
             "DEPBAR $(grep -o 'DEPBAR.LE gsb0, 0x[0-9]' "$OUT/$name.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ' ')" \
             "| $(grep -E 'Used|warn|C75' "$OUT/$name.ptxas" | tr '\n' ' ')" | tee -a "$LOG"
        rm -f "$OUT/$name.cubin"
    done; done; done
fi

if want bench; then
    stage bench
    if [ "${QUICK:-0}" = 1 ]; then BARGS="-N 4096 --dtype float16"; else BARGS=""; fi
    bench "${T_BENCH:-200}" hopper run --preset hopper $BARGS --out "$OUT/hopper_h200.json"
    python3 - "$OUT/hopper_h200.json" <<'EOF' | tee -a "$LOG"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
flash = {(r["dtype"], r["D"], r["N"], r["causal"]): r.get("tflops") for r in rows if r["impl"] == "sdpa-flash"}
for r in rows:
    f = flash.get((r["dtype"], r["D"], r["N"], r["causal"]))
    ratio = f"x{r['tflops'] / f:.2f}" if r.get("tflops") and f else ""
    print(f"{r['impl']:17s} {r['dtype']:8s} D={r['D']:3d} N={r['N']:5d} causal={r['causal']!s:5s} "
          f"{r.get('tflops') or 0:7.1f} TFLOP/s {ratio:6s} {r.get('status', '')} {r.get('error', '')}")
EOF
fi

if want ncu && command -v ncu > /dev/null; then
    stage ncu
    # each set of launches (flashtut.bench.profile: 'ladder', SDPA flash, the mma.sync forward and every
    # rung; 'options', W3 with each build option) at each head dim: ncu's sections for the text report,
    # then every launch's metrics as one results file (ncu_profile.json, kind 'profile')
    sets=${NCU_SETS:-ladder}
    for D in ${NCU_DIMS:-128 64}; do for S in ${sets//,/ }; do
        python3 -m flashtut.bench.profile --launch $S $D > /dev/null 2>&1   # compiles and caches every kernel
        timeout "${T_NCU:-60}" ncu --clock-control none -k regex:flash_fwd --section SpeedOfLight \
            --section WarpStateStats --section Occupancy python3 -m flashtut.bench.profile --launch $S $D \
            > "$OUT/ncu_${S}_d$D.txt" 2>&1
        echo "ncu sections $S D=$D rc=$?" | tee -a "$LOG"
        grep -E "^  [a-z_:]*flash_fwd|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy" \
            "$OUT/ncu_${S}_d$D.txt" | tee -a "$LOG"
    done; done
    dims=${NCU_DIMS:-128 64}
    timeout "${T_NCU_METRICS:-300}" python3 -m flashtut.bench profile --set "$sets" -D "${dims// /,}" \
        --out "$OUT/ncu_profile.json" 2>&1 | tee -a "$LOG"
fi

if want sanitizer; then
    stage sanitizer
    for tool in memcheck racecheck synccheck; do sanitizer "${T_SANITIZER:-90}" $tool; done
fi
stage done
