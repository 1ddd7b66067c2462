"""Convert the committed results files of the retired benchmark scripts (``tools/bench_triton.py``,
``tools/bench_cuda.py``, ``tools/host_overhead.py``) and the anchors file to the one results
format, ``flashtut.bench/1`` (``flashtut/bench/results.py``), in place. Run once, from the
repository root; files already in the format are left alone, so running it again changes nothing:

    python tools/convert_results.py [book/data]

Every measured number is copied, never recomputed: a legacy row with ``fwd_tflops`` and
``bwd_tflops`` becomes one ``speed`` row per pass (``mode``), its errors go to ``err`` (``o`` for
the forward, ``dq``/``dk``/``dv`` for the backward) and its error message to ``reason`` with
``status`` ``"error"``. Where a legacy file measured one case twice (``cuda_h200.json``: the ladder
and the fast-kernel sweep), the first row is kept, as the chapters that drew those files did. The
legacy top-level fields (device, versions, date, command, notes) become the ``provenance`` block,
with ``converted`` naming the layout it came from. ``triton_h200.json``'s N sweep, measured by
another command, goes to its own file, ``triton_h200_sweep.json``.
"""
from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

SCHEMA = "flashtut.bench/1"
CONVERTED_BY = "python tools/convert_results.py"


def _iso(date: str | None) -> str | None:
    """'2026-11-29 12:58 UTC' -> '2026-11-29T12:58:00+00:00' (the harness's date format)."""
    if not date or not date.endswith(" UTC"):
        return date
    parsed = datetime.datetime.strptime(date.replace(" UTC", ""), "%Y-%m-%d %H:%M")
    return parsed.replace(tzinfo=datetime.timezone.utc).isoformat(timespec="seconds")


def _device(name: str, capability=None) -> dict:
    dev = {"type": "cuda", "name": name}
    if isinstance(capability, list):
        dev["compute_capability"] = f"{capability[0]}.{capability[1]}"
    elif isinstance(capability, str) and capability.startswith("sm_"):
        dev["compute_capability"] = f"{capability[3]}.{capability[4:]}"
    return dev


def _speed(base: dict, impl: str, mode: str, tflops, ms=None, err=None, reason=None, **extra) -> dict:
    row = {"kind": "speed", "impl": impl, "mode": mode, "dtype": base["dtype"], "B": base["B"], "H": base["H"],
           "N": base["N"], "Nq": base["N"], "Nk": base["N"], "D": base["D"], "causal": bool(base["causal"]),
           "ms": ms, "tflops": tflops, "status": "ok" if tflops is not None else "error", "reason": reason}
    if err:
        row["err"] = err
    row.update(extra)
    return row


def _doc(kind: str, provenance: dict, rows: list[dict], config: dict | None = None) -> dict:
    return {"schema": SCHEMA, "kind": kind, "provenance": provenance, "config": config or {}, "rows": rows}


def _first_only(rows: list[dict]) -> list[dict]:
    seen, out = set(), []
    for r in rows:
        key = (r["impl"], r["mode"], r["dtype"], r["B"], r["H"], r["N"], r["D"], r["causal"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def convert_cuda(raw: dict, layout: str) -> dict:
    """tools/bench_cuda.py: rows with fwd_/bwd_tflops, *_err and error/bwd_error per implementation."""
    rows = []
    for r in raw["rows"]:
        if "fwd_tflops" in r or "error" in r:
            err = {"o": r[k] for k in ("fwd_err", "fwd_err_vs_sdpa") if k in r}
            extra = {"ref": "sdpa-flash"} if "fwd_err_vs_sdpa" in r else {}
            rows.append(_speed(r, r["impl"], "fwd", r.get("fwd_tflops"), r.get("fwd_ms"), err, r.get("error"), **extra))
        if "bwd_tflops" in r or "bwd_error" in r:
            err = {g: r[f"{g}_err"] for g in ("dq", "dk", "dv") if f"{g}_err" in r}
            rows.append(_speed(r, r["impl"], "bwd", r.get("bwd_tflops"), r.get("bwd_ms"), err, r.get("bwd_error")))
    prov = {"date": _iso(raw.get("date")), "command": raw.get("command"),
            "device": _device(raw["device"], raw.get("capability")), "versions": raw.get("versions") or {},
            "what": raw.get("what"), "converted": {"from": layout, "by": CONVERTED_BY}}
    for key in ("driver", "gpu_tests", "memcheck", "seconds"):
        if key in raw:
            prov[key] = raw[key]
    return _doc("speed", prov, _first_only(rows))


def convert_triton(raw: dict) -> tuple[dict, dict]:
    """tools/bench_triton.py: one row per shape with both implementations side by side, plus the
    N sweep (rows with fwd_/bwd_tflops per implementation) under ``sweep``."""
    rows = []
    for r in raw["rows"]:
        for impl, tag in (("triton", "triton"), ("sdpa-flash", "sdpa_flash")):
            errs = r.get(f"err_vs_fp32_{tag}") or {}
            for mode, names in (("fwd", ("o",)), ("bwd", ("dq", "dk", "dv"))):
                extra = {"ref": "float32 (SDPA math backend on upcast inputs)"} if errs else {}
                if impl == "triton":
                    if "accuracy_ok" in r:
                        extra["fa_criterion"] = r["accuracy_ok"]
                    diff = r.get("max_diff_vs_sdpa_flash") or {}
                    extra["diff_vs_sdpa_flash"] = {n: diff[n] for n in names if n in diff}
                    tuned = r.get("autotune_ms") or {}
                    extra["autotune_ms"] = {k: tuned[k] for k in (("fwd",) if mode == "fwd" else ("dkdv", "dq")) if k in tuned}
                rows.append(_speed(r, impl, mode, r[f"{mode}_tflops_{tag}"], r.get(f"{mode}_ms_{tag}"),
                                   {n: errs[n] for n in names if n in errs}, **extra))
    p = raw["provenance"]
    prov = {"date": _iso(p.get("date")), "command": p.get("command"), "device": _device(p["device"], p.get("capability")),
            "versions": {"torch": p.get("torch"), "triton": p.get("triton")}, "clocks": p.get("clocks"),
            "what": raw.get("what"), "notes": raw.get("notes"), "gpu_tests": raw.get("gpu_tests"),
            "converted": {"from": "tools/bench_triton.py (shapes)", "by": CONVERTED_BY}}
    main = _doc("speed", prov, rows, {"autotuned_configs": raw.get("autotuned_configs") or {}})
    sw = raw["sweep"]
    sp = sw["provenance"]
    sweep_rows = [_speed(r, r["impl"], mode, r[f"{mode}_tflops"], r.get(f"{mode}_ms"))
                  for r in sw["rows"] for mode in ("fwd", "bwd")]
    sweep_prov = {"date": _iso(sp.get("date")), "command": sp.get("command"), "device": _device(sp["device"]),
                  "versions": {"torch": sp.get("torch"), "triton": sp.get("triton")}, "what": sw.get("what"),
                  "converted": {"from": "tools/bench_triton.py --sweep (triton_h200.json's 'sweep')", "by": CONVERTED_BY}}
    return main, _doc("speed", sweep_prov, sweep_rows)


def convert_anchors(raw: dict) -> dict:
    """The anchors layout: one row per shape with fwd_tflops and bwd_tflops, no provenance block."""
    rows = []
    for r in raw["rows"]:
        for mode in ("fwd", "bwd"):
            if r.get(f"{mode}_tflops") is not None:
                rows.append(_speed(r, r["impl"], mode, r[f"{mode}_tflops"]))
    prov = {"date": "2026-11-29T00:00:00+00:00", "command": None, "device": _device("NVIDIA H200"),
            "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0", "cupy": "14.2.0"},
            "what": raw.get("what"), "selection": raw.get("selection"),
            "converted": {"from": "anchors layout (shared/anchors/h200.json)", "by": CONVERTED_BY}}
    return _doc("speed", prov, rows)


def convert_host(raw: dict) -> dict:
    """tools/host_overhead.py (two runs, before and after, merged): entry, us_per_call, version."""
    rows = [{"kind": "host", "entry": r["entry"], "version": r["version"], "us_per_call": r["us_per_call"],
             "B": 1, "H": 1, "N": 128, "D": 64, "dtype": "float16", "calls": 1000, "status": "ok"}
            for r in raw["rows"]]
    prov = dict(raw["provenance"], what=raw.get("what"),
                converted={"from": "tools/host_overhead.py", "by": CONVERTED_BY})
    return _doc("host", prov, rows)


def convert_folder(folder: Path) -> list[str]:
    done = []

    def legacy(name):
        path = folder / name
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        return None if raw.get("schema") == SCHEMA else raw

    def write(name, doc):
        (folder / name).write_text(json.dumps(doc, indent=1) + "\n")
        done.append(name)

    for name in ("cuda_h200.json", "cuda_h200_v3_first.json", "cuda_tiles_h200.json"):
        raw = legacy(name)
        if raw is not None:
            write(name, convert_cuda(raw, "tools/bench_cuda.py" + (" --explore-only" if "tiles" in name else "")))
    raw = legacy("triton_h200.json")
    if raw is not None:
        main, sweep = convert_triton(raw)
        write("triton_h200_sweep.json", sweep)
        write("triton_h200.json", main)
    raw = legacy("anchors_h200_sdpa.json")
    if raw is not None:
        write("anchors_h200_sdpa.json", convert_anchors(raw))
    raw = legacy("host_overhead_h200.json")
    if raw is not None:
        write("host_overhead_h200.json", convert_host(raw))
    return done


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "book/data")
    for name in convert_folder(target):
        print(f"converted {target / name}")
