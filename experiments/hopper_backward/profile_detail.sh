#!/usr/bin/env bash
# Nsight Compute's detail pages (speed of light, pipes, shared memory, warp states, scheduler, occupancy,
# source counters) of one launch of a rung's main kernel, at D = 128 and 64 (the protocol's N = 4096,
# float16, not causal; profile_one.py), from the repository root with PYTHONPATH=src:
#   OUT=/some/dir [PROF_RUNGS=b4] [PROF_DIMS="128 64"] bash experiments/hopper_backward/profile_detail.sh
# Writes $OUT/ncu_D<D>.csv (ncu --csv --page details) and $OUT/run.log, about 40 s per head dim.
set -u
OUT=${OUT:-.gpu_out}
. tools/gpu_common.sh
stage info
machine_info
for D in ${PROF_DIMS:-128 64}; do
  python3 experiments/hopper_backward/profile_one.py --rungs "${PROF_RUNGS:-b4}" --D "$D" > /dev/null 2>&1
  timeout "${T_PROF:-80}" ncu --clock-control none -k regex:'bwd_hopper$' -c "${PROF_COUNT:-1}" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section SourceCounters --section LaunchStats --section Occupancy \
    --metrics sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.avg,smsp__inst_executed.sum \
    --csv --page details python3 experiments/hopper_backward/profile_one.py --rungs "${PROF_RUNGS:-b4}" --D "$D" \
    > "$OUT/ncu_D$D.csv" 2> "$OUT/ncu_D$D.err"
  echo "ncu D=$D rc=$? $(wc -l < "$OUT/ncu_D$D.csv") lines" | tee -a "$LOG"
done
