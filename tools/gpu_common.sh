# Shared by the tools/gpu_*.sh scripts (sourced, not run): their log, stage marks, the machine's
# description and the GPU test run. The caller sets OUT and LOG first.
stage() { echo "== $1 $(date -u +%H:%M:%S)" | tee -a "$LOG"; }

machine_info() {
    { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
      python3 -c 'import sys, torch, triton, cupy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "cupy", cupy.__version__)'
      git log -1 --format='commit %H' 2>/dev/null; } >> "$LOG" 2>&1
}

# gpu_tests LIMIT_S LOGFILE [pytest paths...]: the `gpu`-marked tests, 8 workers when xdist is there
gpu_tests() {
    local limit=$1 log=$2; shift 2
    local w=""; python3 -c "import xdist" 2>/dev/null && w="-n 8"
    timeout "$limit" python3 -m pytest "$@" -m gpu $w -p no:cacheprovider -q -rfE --tb=short > "$log" 2>&1
    echo "pytest rc=$?" | tee -a "$log" "$LOG"
    tail -4 "$log" | tee -a "$LOG"
}
