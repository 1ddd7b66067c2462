# Shared by tools/gpu_check.sh and the experiments' gpu_*.sh scripts (sourced, not run): their log, stage marks, the machine's
# description, the GPU test run, the sanitizer run and one benchmark stage. The caller sets OUT
# (created here) and may set LOG (default $OUT/run.log).
mkdir -p "$OUT"
LOG=${LOG:-$OUT/run.log}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

stage() { echo "== $1 $(date -u +%H:%M:%S)" | tee -a "$LOG"; }

machine_info() {
    { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
      python3 -c 'import sys, torch, triton, cupy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "cupy", cupy.__version__)'
      # the device's copy of the tree may carry a stale .git: the commit the caller names comes first
      if [ -n "${FLASHTUT_SOURCE_COMMIT:-}" ]; then echo "commit $FLASHTUT_SOURCE_COMMIT (FLASHTUT_SOURCE_COMMIT)"
      else git log -1 --format='commit %H (git)' 2>/dev/null; fi; } >> "$LOG" 2>&1
}

# pytest's worker option where pytest-xdist is installed (8 workers), else nothing
xdist_workers() { python3 -c "import xdist" 2>/dev/null && echo "-n 8"; }

# gpu_tests LIMIT_S LOGFILE [pytest paths...]: the `gpu`-marked tests, 8 workers when xdist is there
gpu_tests() {
    local limit=$1 log=$2; shift 2
    timeout "$limit" python3 -m pytest "$@" -m gpu $(xdist_workers) -p no:cacheprovider -q -rfE --tb=short > "$log" 2>&1
    echo "pytest rc=$?" | tee -a "$log" "$LOG"
    tail -4 "$log" | tee -a "$LOG"
}

# sanitizer LIMIT_S TOOL [ARGS...]: compute-sanitizer (memcheck, racecheck, synccheck) over one small
# launch of every CUDA kernel (tools/sanitizer_launches.py; ARGS pick a subset, such as --defaults),
# compiled first outside the sanitizer (CuPy caches it); the log is $OUT/TOOL.log, or TOOL_ARG.log
sanitizer() {
    local limit=$1 tool=$2; shift 2
    local log="$OUT/$tool${1:+_${1#--}}.log"
    if ! command -v compute-sanitizer > /dev/null; then
        echo "sanitizer $tool: compute-sanitizer not found" | tee -a "$LOG"; return
    fi
    python3 tools/sanitizer_launches.py "$@" > /dev/null 2>&1
    timeout "$limit" compute-sanitizer --tool "$tool" --print-limit 20 python3 tools/sanitizer_launches.py "$@" \
        > "$log" 2>&1
    echo "sanitizer $tool${*:+ $*} rc=$?" | tee -a "$LOG"
    tail -4 "$log" | tee -a "$LOG"
}

# bench LIMIT_S NAME ARGS...: python -m flashtut.bench ARGS, its output in the log; every subcommand
# rewrites its --out file as it goes, so a stage cut off by its limit keeps what it measured
bench() {
    local limit=$1 name=$2; shift 2
    timeout "$limit" python3 -m flashtut.bench "$@" --no-progress >> "$LOG" 2>&1
    echo "$name rc=$?" | tee -a "$LOG"
}
