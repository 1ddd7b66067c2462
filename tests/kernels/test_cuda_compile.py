"""Every CUDA C kernel compiles for sm_75, sm_80 and sm_90, with nvcc and through NVRTC (CPU only).

* NVRTC, loaded from the ``nvidia-cuda-nvrtc`` wheel, with exactly ``nvrtc_options`` (what CuPy's
  RawModule hands NVRTC at run time) on each (source, defines) build the runtime makes on a T4 (sm_75),
  an A100 (sm_80) and an H100/H200 (sm_90); the default run compiles what ``cuda_attention`` runs
  (``configs.kernel_plan`` per dtype and head dim, both backward paths) and each ladder step at its
  default, the rest of the matrix (every step at every built head dim and dtype, the backward's measured
  alternatives) is marked ``slow`` (``make test-all``);
* nvcc -std=c++17: each .cu as-is (default macros) for the three archs; the runtime builds again, with
  nvcc, only in the full matrix (``slow``): NVRTC already compiles each shipped one with the runtime's
  own compiler and options, and nvcc starts a process per build, several times NVRTC's cost;
* ptxas' resource report (registers, shared memory, stack, spills) is printed (``pytest -rA``
  shows it) and attached to the test report with ``record_property``; the fast kernels
  (step 2, step 3, and the backward) must not spill to local memory.
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from flashtut.cuda import compile as cc
from flashtut.cuda import configs as cfgs

ARCHS = (75, 80, 90)
CU_FILES = sorted(p.name for p in cc.KERNEL_DIR.glob("*.cu"))
NVCC = shutil.which("nvcc")


def _is_fast(name: str) -> bool:
    return not name.startswith("fwd_v1")  # step 1 is the register-hungry teaching kernel


def _generic_builds(source: str, arch: int):
    """(FT_BF16, HEAD_DIM) combinations, for kernel files the configs do not build (the Hopper
    rungs, at their head dims; the microbenchmarks, whose HEAD_DIM is unused, at the same)."""
    for bf16 in ((0, 1) if arch >= 80 else (0,)):
        for d in cfgs.HOPPER_HEAD_DIMS:
            yield source, {"FT_BF16": bf16, "HEAD_DIM": d}


def warp_grid_builds(arch: int) -> list[tuple[str, dict]]:
    """The dK/dV builds of the warp-grid rung (``experiment_configs``, ``warp_grid=True``) at both
    dims and dtypes, on sm_80 and sm_90, wherever an H100/H200 holds them, whether or not this
    arch's GPU does (an A100 runs D = 64 only): its ptxas report covers both archs."""
    if arch < 80:
        return []
    return [cfgs.kernel_builds(cfg, dt)["dkdv"][::2] for d in cfgs.EXPERIMENT_DIMS
            for cfg in cfgs.experiment_configs(d).values()
            if cfg.warp_grid and cfg.dkdv_smem <= cfgs.SMEM_PER_BLOCK[90] for dt in cfgs.DTYPES]


def runtime_builds(arch: int) -> list[tuple[str, dict]]:
    builds = [(c.source, c.define_dict) for c in cfgs.forward_builds(arch)]
    covered = {s for s, _ in builds}
    bwd = [(src, dict(defs)) for src, defs in cfgs.backward_builds(arch)]
    bwd += [b for b in warp_grid_builds(arch) if b not in bwd]
    builds += bwd
    covered |= {s for s, _ in bwd}
    for name in CU_FILES:
        if name not in covered:
            builds += list(_generic_builds(name, arch))
    return builds


def shipped_builds(arch: int) -> list[tuple[str, dict]]:
    """What ``cuda_attention`` compiles on a GPU of ``arch``, for every dtype and head dim it takes
    (``configs.kernel_plan``: the mma.sync forward where it runs, the backward with atomic and with
    deterministic dQ) and each ladder step at float16 and D = 64 (the chapter's default); a subset of
    :func:`runtime_builds`. (The Hopper rungs' files are built for sm_90a, as they ship, by
    test_cuda_hopper.py; :func:`test_nvcc_defaults` builds every file at its defaults for every arch.)"""
    out: list[tuple[str, dict]] = []

    def add(source, defs):
        if (source, dict(defs)) not in out:
            out.append((source, dict(defs)))

    limit = cfgs.SMEM_PER_BLOCK[arch]
    for dtype in (cfgs.DTYPES if arch >= 80 else (torch.float16,)):
        for d in cfgs.HEAD_DIMS + (cfgs.WIDE_DIMS if arch >= 80 else ()):
            for det in (False, True):
                plan = cfgs.kernel_plan((arch // 10, arch % 10), dtype, d, deterministic=det, forward_kernel="mma")
                add(plan.forward.source, plan.forward.define_dict)
                for source, _, defs in plan.backward_kernels.values():
                    add(source, defs)
    for variant in cfgs.VARIANTS:
        c = cfgs.launch_config(variant, torch.float16, 64, arch, limit)
        add(c.source, c.define_dict)
    return out


def test_the_shipped_builds_are_runtime_builds_and_cover_every_file():
    sources = set()
    for arch in ARCHS:
        shipped, full = shipped_builds(arch), runtime_builds(arch)
        assert all(b in full for b in shipped), [b for b in shipped if b not in full]
        assert len(shipped) < len(full)
        sources |= {s for s, _ in shipped}
    # every file a configuration builds (not the Hopper kernels', whose sm_90a builds have their own tests,
    # not the microbenchmarks')
    assert sources == {s for s in CU_FILES if not s.startswith(("fwd_w", "bwd_hopper", "peak_"))}


def test_the_warp_grid_is_compiled_on_sm80_and_sm90():
    for arch in (80, 90):
        grid = [d for s, d in runtime_builds(arch) if s == "bwd_dkdv.cu" and d.get("DKDV_WARP_GRID")]
        assert {(d["HEAD_DIM"], d["DKDV_BLOCK_M"], d["FT_BF16"]) for d in grid} == \
            {(128, 64, 0), (128, 64, 1), (64, 64, 0), (64, 64, 1), (64, 128, 0), (64, 128, 1)}
    assert not warp_grid_builds(75)


def test_every_cu_file_is_built_by_the_runtime():
    for arch in ARCHS:
        built = {s for s, _ in runtime_builds(arch)}
        assert set(CU_FILES) <= built, f"sm_{arch}: no runtime build of {set(CU_FILES) - built}"


def test_kernel_names_and_defaults():
    for name in CU_FILES:
        text = cc.load_source(name)
        kernels = re.findall(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)', text)
        assert kernels, f"{name}: no extern \"C\" __global__ kernel"
        for k in kernels:
            # attention kernels say fwd or bwd; the instruction microbenchmarks (peak_mma.cu) say peak
            assert "fwd" in k or "bwd" in k or (name.startswith("peak_") and k.startswith("peak_")), \
                f"{name}: kernel {k} should say fwd or bwd"
        assert "#include <" not in text, f"{name}: NVRTC has no system headers"
        # every macro the file tests with #ifndef gets a default right after it
        for macro in re.findall(r"#ifndef\s+(\w+)", text):
            assert re.search(rf"#define\s+{macro}\b", text), f"{name}: {macro} has no default"


# ---------------------------------------------------------------- ptxas resource report

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> list[dict]:
    """One dict per (kernel, arch) from ``-Xptxas -v`` output."""
    out, cur = [], None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            cur = {"kernel": m.group(1), "arch": m.group(2), "stack": 0, "spill_st": 0, "spill_ld": 0,
                   "regs": None, "smem": 0}
            out.append(cur)
        elif cur is not None and (m := _FRAME.search(line)):
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
        elif cur is not None and (m := _USED.search(line)):
            cur["regs"] = int(m.group(1))
            cur["smem"] = int(m.group(2) or 0)
    return out


def _report(record_property, label: str, rows: list[dict], source: str) -> None:
    lines = [f"{label}: {r['kernel']} {r['arch']}: {r['regs']} registers, {r['smem']} B static smem, "
             f"{r['stack']} B stack, spill {r['spill_st']} B stores / {r['spill_ld']} B loads" for r in rows]
    print("\n".join(lines))
    record_property(label, "; ".join(lines))
    assert rows, f"{label}: no ptxas report"
    if _is_fast(source):
        for r in rows:
            assert r["spill_st"] == 0 and r["spill_ld"] == 0, f"{label}: {r['kernel']} spills on {r['arch']}"


def _defs_label(defs: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(defs.items()))


# ---------------------------------------------------------------- nvcc

def _nvcc_run(source: str, defs: dict, archs) -> tuple[int, str, str]:
    gencode = []
    for a in archs:
        gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    cmd = [NVCC, "-std=c++17", "-fatbin", "-Xptxas", "-v", *gencode, *cc.define_options(defs),
           "-o", os.devnull, str(cc.KERNEL_DIR / source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    return res.returncode, " ".join(cmd), res.stderr + res.stdout


def _nvcc(source: str, defs: dict, archs) -> str:
    rc, cmd, log = _nvcc_run(source, defs, archs)
    assert rc == 0, f"nvcc failed for {source} {defs}:\n{cmd}\n{log}"
    return log


#: concurrent compiler processes (nvcc and NVRTC builds are independent of each other)
WORKERS = max(1, min(8, os.cpu_count() or 1))


def _nvcc_groups():
    """Runtime builds grouped by (source, defines), with the archs that use each; all of them in the full
    matrix only (slow: test_nvrtc_runtime_builds compiles the shipped ones in the default run)."""
    groups = defaultdict(set)
    for arch in ARCHS:
        for source, defs in runtime_builds(arch):
            groups[(source, tuple(sorted(defs.items())))].add(arch)
    return [pytest.param(g, marks=pytest.mark.slow) for g in sorted(groups.items())]


needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")


@needs_nvcc
@pytest.mark.parametrize("source", CU_FILES)
def test_nvcc_defaults(source, record_property):
    log = _nvcc(source, {}, ARCHS)
    rows = parse_ptxas(log)
    assert {r["arch"] for r in rows} == {f"sm_{a}" for a in ARCHS}
    _report(record_property, f"nvcc {source} (defaults)", rows, source)


@pytest.fixture(scope="module")
def nvcc_logs(request):
    """nvcc's output for every runtime build this session selected, compiled WORKERS at a time up
    front (the builds take minutes one after the other); each test then reads its own."""
    groups = {}   # (source, defines) -> archs
    for item in request.session.items:
        if getattr(item, "originalname", None) == "test_nvcc_runtime_builds":
            key, archs = item.callspec.params["group"]
            groups[key] = sorted(archs)
    with ThreadPoolExecutor(WORKERS) as pool:
        logs = list(pool.map(lambda kv: _nvcc_run(kv[0][0], dict(kv[0][1]), kv[1]), groups.items()))
    return dict(zip(groups, logs))


@needs_nvcc
@pytest.mark.parametrize("group", _nvcc_groups(),
                         ids=lambda g: f"{g[0][0]}[{_defs_label(dict(g[0][1]))}]")
def test_nvcc_runtime_builds(group, record_property, nvcc_logs):
    (source, defs), archs = group
    rc, cmd, log = nvcc_logs[(source, defs)]
    assert rc == 0, f"nvcc failed for {source} {dict(defs)}:\n{cmd}\n{log}"
    rows = parse_ptxas(log)
    _report(record_property, f"nvcc {source} [{_defs_label(dict(defs))}]", rows, source)


# ---------------------------------------------------------------- NVRTC with the runtime's options

def _find_nvrtc():
    pats = []
    for sp in sys.path:
        pats += [f"{sp}/nvidia/cu13/lib/libnvrtc.so*", f"{sp}/nvidia/cuda_nvrtc/lib/libnvrtc.so*",
                 f"{sp}/nvidia/cu12/lib/libnvrtc.so*"]
    for pat in pats:
        for path in sorted(glob.glob(pat)):
            if "builtins" not in path:
                return ctypes.CDLL(path)
    return None


NVRTC = _find_nvrtc()


def nvrtc_compile(text: str, options: list[str], cubin=None) -> tuple[int, str]:
    """Compile ``text`` with NVRTC: (status, log); the cubin is written to the path ``cubin`` if given."""
    prog = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"kernel.cu", 0, None, None) == 0
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = NVRTC.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        NVRTC.nvrtcGetProgramLog(prog, log)
        if rc == 0 and cubin is not None:
            NVRTC.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            assert NVRTC.nvrtcGetCUBIN(prog, buf) == 0
            cubin.write_bytes(buf.raw)
        return rc, log.value.decode(errors="replace")
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.skipif(NVRTC is None, reason="no libnvrtc (pip install nvidia-cuda-nvrtc)")
@pytest.mark.parametrize("shipped", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["shipped", "others"])
@pytest.mark.parametrize("arch", ARCHS)
def test_nvrtc_runtime_builds(arch, shipped, record_property):
    failures, rows_all = [], []
    builds = [b for b in runtime_builds(arch) if (b in shipped_builds(arch)) == shipped]

    def build(sd):
        opts = cc.nvrtc_options(str(arch), sd[1])
        return opts, nvrtc_compile(cc.load_source(sd[0]), opts + ["-Xptxas", "-v"])

    # NVRTC compiles separate programs concurrently, and ctypes lets go of the GIL during the call
    with ThreadPoolExecutor(WORKERS) as pool:
        done = list(pool.map(build, builds))
    for (source, defs), (opts, (rc, log)) in zip(builds, done):
        if rc != 0:
            failures.append(f"{source} {opts}:\n{log}")
            continue
        rows = parse_ptxas(log)
        rows_all.append((source, defs, rows))
    assert not failures, "NVRTC failed:\n" + "\n".join(failures)
    for source, defs, rows in rows_all:
        _report(record_property, f"nvrtc sm_{arch} {source} [{_defs_label(defs)}]", rows, source)


def test_nvrtc_options_are_what_cupy_gets():
    opts = cc.nvrtc_options("sm_90", {"HEAD_DIM": 128, "FT_BF16": 1})
    assert opts[-1] == "-arch=sm_90" and "-std=c++17" in opts
    assert "-DFT_BF16=1" in opts and "-DHEAD_DIM=128" in opts
    assert "--use_fast_math" not in opts
    runtime = cc._runtime_options({"HEAD_DIM": 128, "FT_BF16": 1})
    # CuPy appends -ftz=true, --device-as-default-execution-space and -arch itself
    assert set(opts) == set(runtime) | set(cc.CUPY_APPENDED) | {"-arch=sm_90"}
    with pytest.raises(ValueError, match="arch"):
        cc.nvrtc_options("hopper", {})
    with pytest.raises(ValueError, match="arch"):
        cc.nvrtc_options("sm_90b", {})
    with pytest.raises(ValueError, match="define name"):
        cc.define_options({"bad-name": 1})


# Hopper's architecture-specific instructions (wgmma, setmaxnreg) exist only for sm_90a
_SM90A_KERNEL = r"""
extern "C" __global__ void fwd_probe_setmaxnreg(float *out) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    out[threadIdx.x] = 1.0f;
}
"""


def test_arch_specific_targets():
    assert cc.normalize_arch("90a") == cc.normalize_arch("sm_90a") == "90a"
    assert cc.normalize_arch(90) == cc.normalize_arch("sm_90") == "90"
    assert cc.nvrtc_options("90a")[-1] == "-arch=sm_90a"
    assert cc.nvrtc_options("sm_90a", {"HEAD_DIM": 64})[-1] == "-arch=sm_90a"
    with pytest.raises(ValueError, match="arch"):
        cc.get_function("fwd_v3_fast.cu", "flash_fwd_v3", arch="hopper")   # before any GPU/CuPy check


def test_build_cache_is_keyed_on_the_full_arch(monkeypatch, tmp_path):
    # stand-ins for CuPy and the GPU: record which build each request makes
    made = []

    class FakeModule:
        def __init__(self, **kwargs):
            made.append(kwargs)

        def get_function(self, name):
            return (name, len(made))

    monkeypatch.setattr(cc, "_cupy", lambda: type("cupy", (), {"RawModule": FakeModule}))
    monkeypatch.setattr(cc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cc, "device_arch", lambda device=None: "90")
    monkeypatch.setattr(cc, "_cubin", lambda code, arch, defines: tmp_path / f"sm_{arch}.cubin")
    cc.clear_cache()
    try:
        own = cc.get_function("fwd_v3_fast.cu", "flash_fwd_v3", {"HEAD_DIM": 64})
        assert "code" in made[-1] and made[-1]["backend"] == "nvrtc"       # CuPy builds for the device
        assert cc.get_function("fwd_v3_fast.cu", "flash_fwd_v3", {"HEAD_DIM": 64}, arch="sm_90") is own
        specific = cc.get_function("fwd_v3_fast.cu", "flash_fwd_v3", {"HEAD_DIM": 64}, arch="90a")
        assert specific != own and made[-1] == {"path": str(tmp_path / "sm_90a.cubin")}
        assert len(made) == 2
    finally:
        cc.clear_cache()


@pytest.mark.skipif(NVRTC is None, reason="no libnvrtc (pip install nvidia-cuda-nvrtc)")
def test_nvrtc_compiles_for_sm_90a_only_with_the_a_target():
    rc, log = nvrtc_compile(_SM90A_KERNEL, cc.nvrtc_options("90a"))
    assert rc == 0, log
    rc, log = nvrtc_compile(_SM90A_KERNEL, cc.nvrtc_options("90"))
    assert rc != 0 and "setmaxnreg" in log, log    # the plain target refuses it: the suffix matters


def test_load_source_expands_local_headers():
    text = cc.load_source("fwd_v3_fast.cu")
    assert '#include "' not in text
    assert "mma_16x8x16" in text and "ft_to_float" in text
    assert text.count("__device__ __forceinline__ float ft_to_float") == 1  # once, though included twice
    with pytest.raises(ValueError, match="not a file"):
        cc.load_source("no_such_kernel.cu")


def test_launch_configs_fit_shared_memory():
    for arch, limit in cfgs.SMEM_PER_BLOCK.items():
        for cfg in cfgs.forward_builds(arch):
            d = cfg.define_dict
            assert cfg.dynamic_smem <= limit, (arch, cfg)
            if cfg.source == "fwd_v3_fast.cu" and arch < 80:
                assert d["V3_STAGES"] == 1  # no cp.async before sm_80
    # on an H200 the fast kernel gets its measured tile shapes, double buffered (V3_TILES)
    h200 = {c.define_dict["HEAD_DIM"]: c for c in cfgs.forward_builds(90) if c.source == "fwd_v3_fast.cu"}
    d128, d64 = h200[128].define_dict, h200[64].define_dict
    assert (d128["V3_WARPS"], d128["V3_BLOCK_N"], d128.get("V3_MT", 1), d128["V3_STAGES"]) == (8, 128, 1, 2)
    assert h200[128].dynamic_smem == (128 + 2 * 2 * 128) * 128 * 2
    assert (d64["V3_WARPS"], d64["V3_BLOCK_N"], d64["V3_MT"], d64["V3_STAGES"]) == (4, 64, 2, 2)
    # a T4 keeps the single-buffered 64-key tile at D = 128 (64 KB, its whole allowance)
    t4 = {c.define_dict["HEAD_DIM"]: c for c in cfgs.forward_builds(75) if c.source == "fwd_v3_fast.cu"}
    assert t4[128].dynamic_smem == 64 * 1024 and t4[128].define_dict["V3_BLOCK_N"] == 64


def test_no_cupy_or_gpu_is_a_runtime_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(RuntimeError, match="cupy-cuda12x"):
        cc.get_function("fwd_v3_fast.cu", "flash_fwd_v3", {})
