"""Nsight Compute profiles of the forward kernels chapter 11 compares, as results rows of kind ``profile``.

``python -m flashtut.bench profile`` runs, for each head dim and set of launches, this module as a child
process under ``ncu`` (``python -m flashtut.bench profile --launch SET D``), which launches each
implementation of the set exactly once, so that ncu's report has one entry per launch in the order of
:func:`launches`; it then reads ncu's CSV (:func:`parse_ncu_csv`), pairs each entry with its launch
(:func:`profile_rows`, which checks that the kernel is the one that implementation runs) and writes one
row per launch: the implementation's registry name, the case, the kernel and its :data:`NCU_METRICS`.

Sets: ``ladder``, SDPA flash, the mma.sync forward and each Hopper rung, then ``cuda_attention``'s
Hopper build and W4 causal; ``options``, ``cuda_attention``'s consumer count at that head dim plain and
with each build option of the registry's ``hopper-options`` group, not causal, then causal; ``overlap``,
``cuda_attention``'s Hopper build alone and with each of :data:`OVERLAP_OPTIONS` (the softmax pinned under
the P V, on either anchor, the lazy rescale, stepped descriptors), not causal, then causal; ``shipped``,
``cuda_attention``'s Hopper build as it ships now (``configs.HOPPER_OPTIONS``) and, where that differs,
the build the other sets launch as its own (:data:`PROFILED_OPTIONS`), not causal, then causal. The case is
the protocol's N = 4096 (B = 4, H = 2048 / D), float16, random inputs. One launch each: a profile's
durations are single launches, not the benchmark's medians.
"""
from __future__ import annotations

import csv
import io
import math
import subprocess
import sys

import torch

#: what each profile row holds (``ncu --metrics``): tensor-pipe activity (wgmma counts under
#: hmma_hgmma_qgmma), wgmma and mma instructions, bank conflicts of wgmma's shared-memory reads, the
#: launch's time, registers and active warps, stall reasons per issued instruction, the
#: special-function unit (xu: MUFU.EX2) against the float32 (fma) and integer (alu) pipes, and issue
NCU_METRICS = (
    "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_gmma.sum",
    "gpu__time_duration.sum",
    "launch__registers_per_thread",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    *(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
      for reason in ("gmma", "barrier", "long_scoreboard", "math_pipe_throttle", "wait", "short_scoreboard")),
    *(f"sm__inst_executed_pipe_{pipe}.avg.pct_of_peak_sustained_active" for pipe in ("xu", "fma", "alu")),
    "sm__issue_active.avg.pct_of_peak_sustained_active",
)
#: short names for the metrics the book quotes
TENSOR = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
DURATION = "gpu__time_duration.sum"
SETS = ("ladder", "options", "overlap", "shipped")
#: the build options set ``overlap`` adds, one at a time, to cuda_attention's Hopper build
OVERLAP_OPTIONS = ("pin_overlap", "pin_anchor", "lazy_rescale", "desc_step")
#: cuda_attention's Hopper build options per head dim when the committed profiles were taken
#: (ncu_hopper_h200.json, ncu_overlap_h200.json), which the sets ``ladder`` and ``overlap`` launch as "its
#: build": since then the D = 64 build also has the short query block first and the warpgroup index known
#: uniform (configs.HOPPER_OPTIONS, book/perflog_hopper.md), which only the set ``shipped`` launches
#: (ncu_shipped_h100.json)
PROFILED_OPTIONS = {64: {"c3_turns": True}, 128: {"tma_store": True}}
#: the profiled case: the protocol's N = 4096 shape
N, TOKENS, HIDDEN, DTYPE = 4096, 16384, 2048, torch.float16
#: the kernels' names ncu filters on (SDPA's flash_fwd_kernel and our flash_fwd_*)
KERNEL_REGEX = "regex:flash_fwd"


def _kernel_of(impl: str) -> str:
    """What the name of the kernel that registry implementation ``impl`` launches contains."""
    if impl == "sdpa-flash":
        return "flash_fwd_kernel"
    if impl == "cuda-mma":
        return "flash_fwd_v"
    return "flash_fwd_" + impl.split("-")[1][:2]          # hopper-w3[c3,turns] -> flash_fwd_w3


def launches(set_name: str, D: int) -> list[tuple[str, bool]]:
    """``(registry name, causal)`` of each launch of set ``set_name`` at head dim ``D``, in order."""
    from ..cuda.configs import HOPPER_CONSUMERS, HOPPER_HEAD_DIMS, HOPPER_OPTIONS
    from . import registry

    if set_name not in SETS:
        raise ValueError(f"set must be one of {', '.join(SETS)}, got {set_name!r}")
    if D not in HOPPER_HEAD_DIMS:
        raise ValueError(f"D must be one of {HOPPER_HEAD_DIMS}, got {D!r}")
    consumers = HOPPER_CONSUMERS[D]
    wide = "hopper-w3" if consumers == 2 else "hopper-w3[c3]"
    default = registry.hopper_name("w3", consumers, PROFILED_OPTIONS[D])
    w4 = registry.hopper_name("w4", consumers, {})
    if set_name == "ladder":
        names = ["sdpa-flash", "cuda-mma", "hopper-w1", "hopper-w2", "hopper-w3", wide, default, w4]
        names = list(dict.fromkeys(names))
        return [(n, False) for n in names] + [(default, True), (w4, True)]
    if set_name == "shipped":
        names = list(dict.fromkeys([default, registry.hopper_name("w3", consumers, HOPPER_OPTIONS[D])]))
        return [(n, causal) for causal in (False, True) for n in names]
    if set_name == "overlap":
        names = [default] + [registry.hopper_name("w3", consumers, {**PROFILED_OPTIONS[D], option: True})
                             for option in OVERLAP_OPTIONS]
        return [(n, causal) for causal in (False, True) for n in names]
    prefix = wide[:-1] + "," if wide.endswith("]") else wide + "["
    options = [n for n in registry.names() if registry.get(n).group == "hopper-options" and n.startswith(prefix)
               and (consumers == 3 or "c3" not in n)]
    return [(n, causal) for causal in (False, True) for n in [wide, *options]]


def shipped_entries(D: int) -> list[tuple[str, str, int, bool]]:
    """:func:`table`'s entries ``(label, impl, D, causal)`` for each launch of set ``shipped`` at ``D``, in
    order: "as profiled before" and "as it ships" where the two builds differ, else "cuda_attention's
    build" ("..., causal" for the causal launches)."""
    runs = launches("shipped", D)
    names = list(dict.fromkeys(name for name, _ in runs))
    labels = (dict(zip(names, ("as profiled before", "as it ships"))) if len(names) == 2
              else {names[0]: "cuda_attention's build"})
    return [(labels[name] + (", causal" if causal else ""), name, D, causal) for name, causal in runs]


#: a profile table's columns: header -> (metric, format); ms from ncu's nanoseconds
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TABLE_COLUMNS = {
    "ms": (DURATION, "ms"), "tensor pipe %": (TENSOR, ".1f"),
    "xu %": ("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", ".1f"),
    "issue %": ("sm__issue_active.avg.pct_of_peak_sustained_active", ".1f"),
    "warps active %": ("sm__warps_active.avg.pct_of_peak_sustained_active", ".1f"),
    "registers": ("launch__registers_per_thread", ".0f"),
    **{reason.replace("_", " "): (STALL.format(reason), ".2f")
       for reason in ("wait", "barrier", "long_scoreboard", "math_pipe_throttle")},
}


def metric(rows: list[dict], impl: str, D: int, causal: bool, name: str, set_name: str = "ladder") -> float:
    """Metric ``name`` of the launch of ``impl`` at ``D`` (``causal``) in set ``set_name`` of profile
    ``rows``; KeyError naming the launch when the rows hold none."""
    for r in rows:
        if (r.get("kind"), r.get("set"), r["impl"], r["D"], r["causal"]) == ("profile", set_name, impl, D, causal):
            value = r["metrics"].get(name)
            return math.nan if value is None else value
    raise KeyError(f"no profile of {impl} at D = {D} (causal {causal}) in set {set_name!r}")


def table(rows: list[dict], entries, columns: dict | None = None, set_name: str = "ladder"):
    """(header, body) of one line per entry ``(label, impl, D, causal)`` with the :data:`TABLE_COLUMNS`
    (or ``columns``) of its launch in set ``set_name``, for ``flashtut.notebook.show_table`` or a
    Markdown table."""
    columns = TABLE_COLUMNS if columns is None else columns
    body = []
    for label, impl, D, causal in entries:
        cells = [str(D), label]
        for name, spec in columns.values():
            value = metric(rows, impl, D, causal, name, set_name)
            cells.append(f"{value / 1e6:.3f}" if spec == "ms" else format(value, spec))
        body.append(cells)
    return ["D", "kernel", *columns], body


def run_launches(set_name: str, D: int) -> None:
    """Launch each implementation of the set once (the child process ncu profiles)."""
    from . import registry

    B, H = TOKENS // N, HIDDEN // D
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=DTYPE, generator=g) for _ in range(3))
    for name, causal in launches(set_name, D):
        impl = registry.get(name)
        with impl.context():
            impl.forward(q, k, v, causal, D ** -0.5)
    torch.cuda.synchronize()


def _number(text: str) -> float:
    # ncu writes thousands with commas ("663,776") and "n/a" where a metric does not apply
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu's ``--csv`` metrics report as one dict per profiled kernel, in launch order:
    ``{"id", "kernel", "metrics": {name: value}, "units": {name: unit}}``. Lines before the header
    (ncu's ==PROF== notes, the program's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (\"ID\",\"Process ID\",...) in the text: not `ncu --csv` output")
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID") or not row["ID"].isdigit():
            continue
        entry = kernels.setdefault(row["ID"], {"id": int(row["ID"]), "kernel": row["Kernel Name"],
                                               "metrics": {}, "units": {}})
        entry["metrics"][row["Metric Name"]] = _number(row["Metric Value"])
        entry["units"][row["Metric Name"]] = row["Metric Unit"]
    return sorted(kernels.values(), key=lambda e: e["id"])


def profile_rows(set_name: str, D: int, profiled: list[dict]) -> list[dict]:
    """One ``profile`` row per launch of :func:`launches`, paired in order with ``profiled``
    (:func:`parse_ncu_csv`); ValueError when the counts differ or a kernel is not its launch's."""
    plan = launches(set_name, D)
    if len(plan) != len(profiled):
        raise ValueError(f"set {set_name!r} at D = {D} launches {len(plan)} kernels, ncu profiled "
                         f"{len(profiled)}: {[p['kernel'][:40] for p in profiled]}")
    rows = []
    for (name, causal), entry in zip(plan, profiled):
        if _kernel_of(name) not in entry["kernel"]:
            raise ValueError(f"launch {name} (causal {causal}) should run a kernel named *{_kernel_of(name)}*, "
                             f"ncu profiled {entry['kernel']!r}")
        rows.append({"kind": "profile", "set": set_name, "impl": name, "kernel": entry["kernel"], "mode": "fwd",
                     "B": TOKENS // N, "H": HIDDEN // D, "N": N, "D": D, "dtype": str(DTYPE).split(".")[-1],
                     "causal": causal, "metrics": entry["metrics"], "units": entry["units"]})
    return rows


def ncu_command(set_name: str, D, ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles set ``set_name`` at ``D`` (clocks as the benchmark runs them)."""
    return [ncu, "--clock-control", "none", "-k", KERNEL_REGEX, "--metrics", ",".join(NCU_METRICS), "--csv",
            *child_command(set_name, D)]


def child_command(set_name: str, D: int) -> list[str]:
    """The process ncu profiles: the command line's ``profile --launch SET D``, which launches the set once."""
    return [sys.executable, "-m", "flashtut.bench", "profile", "--launch", set_name, str(D)]


def profile(set_name: str, D: int, ncu: str = "ncu", timeout_s: float = 300) -> list[dict]:
    """Profile set ``set_name`` at ``D``: a run without ncu first (it compiles and caches every kernel, so
    that ncu's process spends its time on the launches), then the profiled run."""
    warm = child_command(set_name, D)
    subprocess.run(warm, check=True, timeout=timeout_s, capture_output=True)
    res = subprocess.run(ncu_command(set_name, D, ncu), capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        raise RuntimeError(f"ncu exited with {res.returncode}: {res.stderr[-2000:] or res.stdout[-2000:]}")
    return profile_rows(set_name, D, parse_ncu_csv(res.stdout))
