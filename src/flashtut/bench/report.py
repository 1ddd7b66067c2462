"""Text tables of results: what the CLI prints at the end and what a notebook can show."""
from __future__ import annotations

import re
from collections import defaultdict

IMPL_ORDER = ["naive", "tiled", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn", "triton", "cuda"]


def ladder_key(name: str):
    """Sort key of a CUDA ladder step's name: ``cuda-v2`` before ``cuda-v10``."""
    m = re.match(r"cuda-v(\d+)(.*)", name)
    return (int(m.group(1)), m.group(2)) if m else (10**6, name)


def impl_order(names) -> list[str]:
    """Reference implementations first, then PyTorch's, then ours, then the ladder in order."""
    names = list(dict.fromkeys(names))
    known = [n for n in IMPL_ORDER if n in names]
    ladder = sorted((n for n in names if n.startswith("cuda-v")), key=ladder_key)
    rest = sorted(n for n in names if n not in known and n not in ladder)
    return known + ladder + rest


SPEED_KEY = ("mode", "dtype", "B", "H", "Nq", "Nk", "D", "causal")


def _fmt(x, spec: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return format(x, spec or ".3g")
    return str(x)


def format_table(header: list[str], body: list[list[str]], markdown: bool = False, left=(0,)) -> str:
    """Columns padded to their widest cell (right-aligned but for ``left``), or Markdown."""
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    if markdown:
        line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
        sep = "| " + " | ".join("-" * w for w in widths) + " |"
        return "\n".join([line(header), sep, *(line(r) for r in body)])
    line = lambda cells: "  ".join(c.ljust(w) if i in left else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in body)])


def _worst_err(row) -> float | None:
    errs = [e for e in (row.get("err") or {}).values() if e is not None]
    return max(errs) if errs else None


def speed_table(rows: list[dict], baseline: str = "sdpa-flash", markdown: bool = False,
                show_unavailable: bool = False) -> str:
    """One line per speed row: time, TFLOP/s, ratio to ``baseline`` on the same case, the
    largest error, and the status (with the reason when not ``ok``). Rows of implementations
    that could not run are left out unless ``show_unavailable`` (``unavailable_notes`` lists
    them once each)."""
    base = {tuple(r.get(k) for k in SPEED_KEY): r["tflops"] for r in rows
            if r.get("impl") == baseline and r.get("tflops")}
    header = ["impl", "mode", "dtype", "B", "H", "Nq", "Nk", "D", "causal", "ms", "TFLOP/s",
              f"x {baseline}", "max err", "2x torch", "status"]
    if not base:                      # no baseline measured: no ratio column
        header.pop(11)
    body = []
    for r in rows:
        if r.get("status") == "unavailable" and not show_unavailable:
            continue
        b = base.get(tuple(r.get(k) for k in SPEED_KEY))
        ratio = r["tflops"] / b if b and r.get("tflops") else None
        status = r.get("status") or "-"
        if status != "ok" and r.get("reason"):
            status += ": " + r["reason"].splitlines()[0][:70]
        body.append([r["impl"], r["mode"], r["dtype"], _fmt(r["B"]), _fmt(r["H"]), _fmt(r["Nq"]),
                     _fmt(r["Nk"]), _fmt(r["D"]), _fmt(r["causal"]), _fmt(r.get("ms"), ".4g"),
                     _fmt(r.get("tflops"), ".3g")] + ([_fmt(ratio, ".2f")] if base else [])
                    + [_fmt(_worst_err(r), ".2e"), _fmt(r.get("fa_criterion")), status])
    return format_table(header, body, markdown, left=(0, 1, 2, len(header) - 1))


def notes(rows: list[dict]) -> list[str]:
    """One line per (implementation, status, reason) that is not ``ok``, with how many rows."""
    counts: dict = {}
    for r in rows:
        if r.get("status") not in (None, "ok", "skipped") and r.get("reason"):
            key = (r["impl"], r["status"], r["reason"])
            counts[key] = counts.get(key, 0) + 1
    return [f"{impl}: {status} ({n} row{'s' if n > 1 else ''}): {reason}"
            for (impl, status, reason), n in counts.items()]


def memory_table(rows: list[dict], markdown: bool = False) -> str:
    """Peak extra MiB per implementation (columns) and N (lines); OOM where it ran out."""
    impls = list(dict.fromkeys(r["impl"] + ("" if r.get("mode", "fwd") == "fwd" else " (fwd+bwd)")
                               for r in rows))
    cell = defaultdict(dict)
    for r in rows:
        name = r["impl"] + ("" if r.get("mode", "fwd") == "fwd" else " (fwd+bwd)")
        if r.get("status") == "ok":
            cell[r["N"]][name] = f"{r['peak_extra_bytes'] / 2**20:.1f}"
        else:
            cell[r["N"]][name] = {"oom": "OOM", "skipped": "(OOM)", "unavailable": "n/a"}.get(r.get("status"), "error")
    body = [[str(n)] + [cell[n].get(i, "-") for i in impls] for n in sorted(cell)]
    return format_table(["N \\ peak extra MiB"] + impls, body, markdown)


def roofline_table(rows: list[dict], markdown: bool = False) -> str:
    body = []
    for r in rows:
        if r.get("what") == "copy":
            body.append(["copy", "-", _fmt(r["bytes"] / 2**20, ".0f") + " MiB", _fmt(r["ms"], ".4g"),
                         _fmt(r["gb_per_s"], ".4g") + " GB/s", r.get("status", "ok")])
        elif r.get("what") == "matmul":
            st = r.get("status") or "-"
            if st != "ok" and r.get("reason"):
                st += ": " + r["reason"][:80]
            body.append(["matmul", r["dtype"], f"n={r['n']}", _fmt(r.get("ms"), ".4g"),
                         (_fmt(r.get("tflops"), ".4g") + " TFLOP/s") if r.get("tflops") else "-", st])
        elif r.get("what") == "instruction":
            st = r.get("status") or "-"
            if st != "ok" and r.get("reason"):
                st += ": " + r["reason"][:80]
            size = f"{r['grid']} x {r['threads']} threads" if r.get("grid") else "-"
            body.append([r["instruction"], r["dtype"], size, _fmt(r.get("ms"), ".4g"),
                         (_fmt(r.get("tflops"), ".4g") + " TFLOP/s") if r.get("tflops") else "-", st])
    return format_table(["what", "dtype", "size", "ms", "rate", "status"], body, markdown)


def ratio_table(rows: list[dict], baseline: str = "sdpa-flash") -> list[dict]:
    """For every case where ``baseline`` has a speed, each implementation's TFLOP/s over the
    baseline's: ``[{"mode", "dtype", "D", "N", "causal", ..., "ratios": {impl: ratio}}]``."""
    speed = [r for r in rows if r.get("kind", "speed") == "speed" and r.get("tflops")]
    groups = defaultdict(dict)
    for r in speed:             # ratios only within one device's results
        groups[(r.get("device"),) + tuple(r.get(k) for k in SPEED_KEY)][r["impl"]] = r["tflops"]
    out = []
    for key, by_impl in groups.items():
        b = by_impl.get(baseline)
        if not b:
            continue
        entry = dict(zip(("device",) + SPEED_KEY, key))
        entry["N"] = entry["Nq"]
        entry["baseline_tflops"] = b
        entry["ratios"] = {i: t / b for i, t in by_impl.items() if i != baseline}
        out.append(entry)
    out.sort(key=lambda e: (str(e["device"]), e["mode"], e["dtype"], e["D"], e["causal"], e["N"]))
    return out


def format_ratio_table(table: list[dict], baseline: str = "sdpa-flash", markdown: bool = True) -> str:
    """``ratio_table`` as text: one line per case, one column per implementation."""
    impls = impl_order(i for e in table for i in e["ratios"])
    devices = len({e.get("device") for e in table}) > 1
    header = (["device"] if devices else []) + ["mode", "dtype", "D", "N", "causal", f"{baseline} TFLOP/s"] \
        + [f"{i} / {baseline}" for i in impls]
    body = [([str(e.get("device"))] if devices else [])
            + [e["mode"], e["dtype"], str(e["D"]), str(e["N"]), _fmt(e["causal"]), f"{e['baseline_tflops']:.1f}"]
            + [_fmt(e["ratios"].get(i), ".2f") for i in impls] for e in table]
    return format_table(header, body, markdown)


def case_table(rows: list[dict], impls: list[str], ratio: tuple[str, str] | None = None,
               markdown: bool = True) -> str:
    """TFLOP/s of each of ``impls`` side by side, one line per case (D, N, dtype, mask; largest D
    first) where all of them have a speed, and, with ``ratio=(impl, base)``, impl's TFLOP/s over
    base's on that case: the perf logs' tables of a rung against the kernels it is measured with."""
    cells: dict[tuple, dict] = defaultdict(dict)
    for r in rows:
        if r.get("kind", "speed") == "speed" and r.get("tflops") and r["impl"] in impls:
            cells[(r.get("device"),) + tuple(r.get(k) for k in SPEED_KEY)][r["impl"]] = r["tflops"]
    head = ["D", "N", "dtype", "causal"] + list(impls) + ([f"{ratio[0]} / {ratio[1]}"] if ratio else [])
    body = []
    for key in sorted((k for k, by in cells.items() if len(by) == len(impls)),
                      key=lambda k: (str(k[0]), k[1], -k[7], k[5], k[2], k[8])):
        case = dict(zip(("device",) + SPEED_KEY, key))
        by = cells[key]
        body.append([str(case["D"]), str(case["Nq"]), case["dtype"], _fmt(case["causal"])]
                    + [f"{by[i]:.1f}" for i in impls]
                    + ([f"{by[ratio[0]] / by[ratio[1]]:.2f}"] if ratio else []))
    return format_table(head, body, markdown, left=(2, 3))


#: the instructions that tell which tensor-core path a kernel takes (and how it feeds it)
SASS_COLUMNS = ("HGMMA", "HMMA", "LDSM", "LDGSTS", "UTMALDG", "USETMAXREG")


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def sass_table(rows: list[dict], markdown: bool = True) -> str:
    """The ``sass`` rows of a results file (``flashtut.bench.sass``) as one line per implementation,
    setting and kernel name: how many compiled versions were read and the count of each of
    :data:`SASS_COLUMNS` in them (a range where the versions differ)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("kind") == "sass" and r.get("counts"):
            name = r["kernel"].split("<")[0].split("(")[0].replace("void ", "")
            groups[(r["impl"], r.get("setting", "default"), name)].append(r["counts"])
    body = [[impl, setting, name, str(len(c))] + [_span([x.get(op, 0) for x in c]) for op in SASS_COLUMNS]
            for (impl, setting, name), c in sorted(groups.items())]
    return format_table(["impl", "setting", "kernel", "versions", *SASS_COLUMNS], body, markdown, left=(0, 1, 2))


def setting_table(rows: list[dict], impl: str = "triton", markdown: bool = True) -> str:
    """``impl``'s speed in each setting a results file holds (``flashtut.bench.sass``: Triton's
    defaults against ``DISABLE_MMA_V3=1``), with SDPA flash timed in the same process as the
    reference: one line per mode, N and mask."""
    cells: dict[tuple, dict] = defaultdict(dict)
    settings = []
    for r in rows:
        if r.get("kind") != "speed" or not r.get("tflops") or not r["impl"].startswith(impl):
            continue
        setting = r.get("setting", "default")
        if setting not in settings:
            settings.append(setting)
        cells[(r["mode"], r["N"], r["causal"])][setting] = (r["tflops"], r.get("speedup_vs_sdpa_flash"))
    head = ["mode", "N", "causal"] + [f"{impl} {s} TFLOP/s (x SDPA flash)" for s in settings]
    body = []
    for key in sorted(cells, key=lambda k: (k[0] != "fwd", k[1], k[2])):
        row = [key[0], str(key[1]), "yes" if key[2] else "no"]
        for s in settings:
            t = cells[key].get(s)
            row.append("-" if t is None else f"{t[0]:.0f} ({t[1]:.2f})" if t[1] else f"{t[0]:.0f}")
        body.append(row)
    return format_table(head, body, markdown)
