"""Nsight Compute's view of each rung of the Hopper backward, for chapter 11b's ladder table: one launch of
each rung's main kernel (``bwd_hopper``) and of SDPA flash's backward at D = 64 and 128 (the protocol's
N = 4096, B = 4, H = 2048 / D, float16, not causal), with ``flashtut.bench.profile.NCU_METRICS``. Writes rows of
kind ``profile`` (set ``hopper-bwd``) to --out. (ptxas' registers per rung need no GPU: the CPU test
tests/book/test_chapter_11_backward.py checks the ones the chapter quotes.)

    PYTHONPATH=src python experiments/hopper_backward/ncu_rungs.py --out ncu_hopper_bwd_h100.json
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from flashtut.bench.profile import NCU_METRICS, TENSOR, parse_ncu_csv
from flashtut.bench.provenance import collect
from flashtut.bench.results import save_results
from flashtut.cuda import hopper_backward as hb

RUNGS = list(hb.RUNGS)
HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", default="ncu")
    args = ap.parse_args(argv)
    rows = []
    for D in (64, 128):
        child = [sys.executable, str(HERE / "profile_one.py"), "--rungs", ",".join(RUNGS), "--D", str(D)]
        subprocess.run(child, check=True, timeout=90, capture_output=True)      # compile and cache first
        res = subprocess.run([args.ncu, "--clock-control", "none", "-k", "regex:bwd_hopper$|flash_bwd_dq",
                              "--metrics", ",".join(NCU_METRICS), "--csv", *child],
                             capture_output=True, text=True, timeout=100)
        if res.returncode != 0:
            print(res.stderr[-2000:] or res.stdout[-2000:])
            return 1
        launches = parse_ncu_csv(res.stdout)
        names = [f"hopper_{r}" for r in RUNGS] + ["sdpa_flash"]
        if len(launches) != len(names):
            print(f"D = {D}: expected {len(names)} launches, ncu profiled {[e['kernel'][:40] for e in launches]}")
            return 1
        for name, entry in zip(names, launches):
            want = "flash_bwd" if name == "sdpa_flash" else "bwd_hopper"
            if want not in entry["kernel"]:
                print(f"D = {D}: launch {name} ran {entry['kernel']!r}")
                return 1
            row = {"kind": "profile", "set": "hopper-bwd", "impl": name, "kernel": entry["kernel"], "mode": "bwd",
                   "B": 16384 // 4096, "H": 2048 // D, "N": 4096, "D": D, "dtype": "float16", "causal": False,
                   "metrics": entry["metrics"], "units": entry["units"]}
            rows.append(row)
            print(f"D = {D:3d} {name:11s} tensor pipe {entry['metrics'].get(TENSOR, float('nan')):5.1f}%  "
                  f"{entry['metrics'].get('gpu__time_duration.sum', float('nan')) / 1e6:6.3f} ms")
    prov = collect("cuda", sys.argv[1:] if argv is None else argv)
    prov["summary"] = ("Nsight Compute metrics of one launch of each Hopper backward rung's main kernel (bwd_hopper) "
                       "and of SDPA flash's backward, float16, N 4096, D 64 and 128, "
                       "not causal (chapter 11b, perflog_hopper_bwd)")
    prov["rerun"] = "python experiments/hopper_backward/ncu_rungs.py --out book/data/ncu_hopper_bwd_h100.json"
    save_results(args.out, "profile", rows, prov, {"set": "hopper-bwd", "rungs": RUNGS})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
