"""What the tensor cores are asked to do: instruction counts of compiled attention kernels (SASS).

Chapter 11's claim that the instructions decide the ranking on Hopper rests on this evidence: which
matrix instructions each kernel's machine code holds, next to its speed. Hopper's warpgroup MMA
(``wgmma``) appears in SASS as ``HGMMA``, the older warp-level ``mma.sync`` as ``HMMA``; TMA loads as
``UTMALDG``, ``cp.async`` as ``LDGSTS``, ``ldmatrix`` as ``LDSM``, mbarrier operations as ``SYNCS``,
register reallocation as ``USETMAXREG``. The counts are static (instructions in the binary, not
executed ones): enough to say which instructions a kernel uses and roughly how many per loop trip.

Where the machine code comes from:

* our Triton kernels: the ``.cubin`` files Triton leaves in its cache directory (a fresh
  ``TRITON_CACHE_DIR`` per process holds exactly the kernels that process compiled, each with its
  metadata ``.json``);
* our CUDA kernels: built with NVRTC for the target the runtime uses (``compile.build_cubin``);
* PyTorch SDPA's flash backend (FlashAttention-2 inside PyTorch): the ``flash_fwd_kernel``
  instantiations in ``libtorch_cuda.so``, listed with ``cuobjdump --list-text`` and disassembled
  by name with ``cuobjdump --dump-sass --function``, which is fast even on a library of a gigabyte.

``python -m flashtut.bench sass`` writes the counts as rows of kind ``sass`` (with any speed rows
given to it) in the harness's results format; ``tools/gpu_sass_evidence.sh`` runs it on a GPU with
our Triton kernels timed with and without ``DISABLE_MMA_V3=1`` (Triton's switch that keeps it from
emitting wgmma on sm_90, read by its compiler and part of its cache key).
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

#: the opcodes a row reports by name (every row also has the total): matrix instructions, the ways
#: tiles reach shared memory and registers, the synchronisation they need, and exp2 (MUFU)
KEY_OPCODES = ("HGMMA", "HMMA", "WARPGROUP", "UTMALDG", "UTMASTG", "UBLKCP", "LDGSTS", "LDSM", "STSM",
               "SYNCS", "USETMAXREG", "BAR", "MUFU", "LDG", "STG", "LDS", "STS")

# "        /*0a30*/  @!P0 HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ ;  /* 0x... */"
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_TEXT_SECTION = re.compile(r"SASS text section\s+\d+\s*:\s*x-(\S+)\.(sm_\d+a?)\.elf\.bin")


def split_functions(sass: str) -> dict[str, list[str]]:
    """``cuobjdump --dump-sass`` text -> {function name: its instruction lines}, in order. A function
    that appears twice (a library with the same kernel in two fat binaries) keeps its first body."""
    out: dict[str, list[str]] = {}
    current = None
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = m.group(1) if m.group(1) not in out else None
            if current is not None:
                out[current] = []
        elif current is not None and _INSTRUCTION.match(line):
            out[current].append(line)
    return out


def opcode_histogram(lines) -> Counter:
    """Instructions by opcode, the part before the first dot (``HGMMA.64x128x16.F32`` -> ``HGMMA``)."""
    return Counter(m.group(1) for m in map(_INSTRUCTION.match, lines) if m)


def count_row(lines) -> dict:
    """``counts`` (every :data:`KEY_OPCODES`, zeros included) and ``instructions`` (all, NOPs excluded)."""
    hist = opcode_histogram(lines)
    return {"counts": {op: hist.get(op, 0) for op in KEY_OPCODES},
            "instructions": sum(n for op, n in hist.items() if op != "NOP")}


_ADDRESS_BRANCH = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[0-9T]\s+)?(\S+)(?:\s+(0x[0-9a-f]+))?")


def slot_hgmma(head_dim: int, block_n: int = 128) -> int:
    """The ``HGMMA`` of one slot of a W3-family consumer: S_j = Q K_j^T in ``head_dim / 16`` k-steps and
    P_{j-1} V_{j-1} in ``block_n / 16`` k-steps, one per 64-column block of the head dim."""
    return head_dim // 16 + block_n // 16 * (head_dim // 64)


def pipelined_loop(lines, head_dim: int, block_n: int = 128) -> list[str]:
    """The instruction lines of a Hopper consumer's pipelined loop in one function's SASS (``lines`` as
    :func:`split_functions` gives them): the shortest range from a backward branch's target to the branch
    that holds one slot's :func:`slot_hgmma`. Other backward branches are the retries of mbarrier waits,
    placed after the function's end and jumping back into it, whose ranges hold other counts. Empty when
    none does."""
    hgmma_per_slot = slot_hgmma(head_dim, block_n)
    parsed = []
    for line in lines:
        m = _ADDRESS_BRANCH.match(line)
        if m:
            parsed.append((int(m.group(1), 16), m.group(2), m.group(3), line))
    where = {addr: i for i, (addr, *_rest) in enumerate(parsed)}
    best: list[str] = []
    for i, (addr, op, target, _) in enumerate(parsed):
        if op.startswith("BRA") and target and int(target, 16) < addr and int(target, 16) in where:
            body = [p[3] for p in parsed[where[int(target, 16)]:i + 1]]
            if sum(" HGMMA" in x for x in body) == hgmma_per_slot and (not best or len(body) < len(best)):
                best = body
    return best


def cuobjdump_candidates() -> list[str]:
    """Every ``cuobjdump`` found: on the PATH, next to ``nvcc``, the copy in Triton's wheel (each once)."""
    found = [shutil.which("cuobjdump")]
    if nvcc := shutil.which("nvcc"):
        found.append(str(Path(nvcc).resolve().parent / "cuobjdump"))
    spec = importlib.util.find_spec("triton")   # found without importing triton
    for root in (spec.submodule_search_locations or []) if spec else []:
        found.append(str(Path(root) / "backends" / "nvidia" / "bin" / "cuobjdump"))
    unique = {}
    for path in found:
        if path and Path(path).is_file():
            unique.setdefault(Path(path).resolve(), path)
    return list(unique.values())


def find_cuobjdump() -> str | None:
    """The first of :func:`cuobjdump_candidates`, or None if there is none."""
    return next(iter(cuobjdump_candidates()), None)


def _run(cmd: list[str], timeout_s: float) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({res.returncode}): {res.stderr.strip()[:500]}")
    return res.stdout


def dump_sass(binary, cuobjdump, functions=(), arch: str | None = None, timeout_s: float = 120) -> str:
    """``cuobjdump --dump-sass`` of a cubin or a library, only ``functions`` (mangled names) if given.
    ``cuobjdump`` is one path or several, tried in turn: a cubin from a newer NVRTC than the toolkit's
    own (CuPy's wheel against a CUDA 13.0 toolkit, say) is "no device code" to the older cuobjdump,
    while the newer one in Triton's wheel reads it."""
    tools = [cuobjdump] if isinstance(cuobjdump, (str, Path)) else list(cuobjdump)
    if not tools:
        raise RuntimeError("cuobjdump not found: install the CUDA toolkit or triton (its wheel carries one)")
    cmd = ["--dump-sass"]
    if arch:
        cmd += ["--gpu-architecture", arch]
    if functions:
        cmd += ["--function", ",".join(functions)]
    failures = []
    for tool in tools:
        try:
            return _run([str(tool), *cmd, str(binary)], timeout_s)
        except RuntimeError as exc:
            failures.append(str(exc))
    raise RuntimeError("; ".join(failures))


# ------------------------------------------------------------------------------- Triton

def _triton_mode(name: str) -> str:
    return "fwd" if "fwd" in name else ("bwd" if "bwd" in name else "other")


def triton_cache_rows(cache_dir, cuobjdump: str, setting: str, listing_dir=None) -> list[dict]:
    """One row per ``.cubin`` under a Triton cache directory: the kernel's name, its launch metadata
    (warps, stages, shared memory, from the ``.json`` beside it) and its instruction counts. With
    ``listing_dir``, each cubin's whole SASS is written there too, for reading."""
    rows = []
    for cubin in sorted(Path(cache_dir).rglob("*.cubin")):
        meta_path = cubin.with_suffix(".json")
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        text = dump_sass(cubin, cuobjdump)
        if listing_dir is not None:
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{setting}_{cubin.stem}_{cubin.parent.name[:8]}")
            Path(listing_dir).mkdir(parents=True, exist_ok=True)
            (Path(listing_dir) / f"sass_{safe}.txt").write_text(text)
        funcs = split_functions(text)
        for name, lines in funcs.items():
            target = meta.get("target") or {}
            rows.append({
                "kind": "sass", "impl": "triton", "setting": setting, "kernel": name, "mode": _triton_mode(name),
                "arch": f"sm_{target.get('arch')}" if isinstance(target, dict) and target.get("arch") else None,
                "binary": f"triton cache {cubin.parent.name[:16]}",
                "launch": {k: meta[k] for k in ("num_warps", "num_stages", "num_ctas", "shared", "maxnreg")
                           if k in meta},
                **count_row(lines)})
    return rows


# ------------------------------------------------------------------------------- our CUDA kernels

def cuda_kernel_rows(arch: int = 90, head_dim: int = 128) -> list[dict]:
    """Hopper rung W1 (wgmma, built for sm_90a; ``cuda_attention``'s sm_90 forward when chapter 09's
    evidence was taken, W3 since) and the mma.sync forward ``cuda_attention`` runs elsewhere (built
    for plain sm_``arch``), float16, ``head_dim``: what NVRTC makes of them with the runtime's
    options."""
    import torch

    from ..cuda import configs
    from ..cuda.compile import build_cubin

    cuobjdump = cuobjdump_candidates()
    w1 = configs.hopper_config("w1", torch.float16, head_dim)
    mma_variant = configs.fast_variant(head_dim, arch)
    mma = configs.launch_config(mma_variant, torch.float16, head_dim, arch, configs.SMEM_PER_BLOCK[arch])
    rows = []
    for impl, cfg, target in (("cuda (wgmma, W1)", w1, configs.HOPPER_ARCH), (f"cuda-mma ({mma_variant})", mma, str(arch))):
        cubin = build_cubin(cfg.source, cfg.define_dict, target)
        for name, lines in split_functions(dump_sass(cubin, cuobjdump)).items():
            rows.append({"kind": "sass", "impl": impl, "setting": "default", "kernel": name, "mode": "fwd",
                         "arch": f"sm_{target}", "binary": cfg.source, "dtype": "float16", "D": head_dim,
                         "defines": cfg.define_dict, **count_row(lines)})
    return rows


def exp2_between_waits(text: str) -> int:
    """In the SASS of a W3-family build, the ``MUFU.EX2`` of the loop between its wait for S_j (the one
    ``WARPGROUP.DEPBAR.LE gsb0, 0x1``) and the next wait, for the P V of the tile before (``0x0``): the
    exponentials that run while that P V is on the tensor cores (chapter 11, 11.12)."""
    lines = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", text)
    start = next((i for i, t in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in t), None)
    if start is None:
        raise ValueError("no WARPGROUP.DEPBAR.LE gsb0, 0x1 in this SASS: not a W3-family build")
    end = next(i for i in range(start + 1, len(lines)) if "WARPGROUP.DEPBAR.LE" in lines[i])
    return sum("MUFU.EX2" in t for t in lines[start:end])


def nvcc_sass(source: str, defines: dict | None = None, arch: str = "90a", nvcc: str | None = None,
              timeout_s: float = 300) -> tuple[str, str]:
    """(ptxas log, SASS) of kernel file ``source`` (in ``flashtut.cuda.compile.KERNEL_DIR``) built with
    ``defines`` by ``nvcc`` for sm_``arch`` ("90a", "80" ...): for reading the machine code without CuPy
    or a GPU. (The NVRTC the runtime uses schedules the Hopper loop the same way:
    tests/kernels/test_cuda_hopper.py checks both.)"""
    import tempfile

    from ..cuda.compile import KERNEL_DIR, define_options

    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        raise RuntimeError("nvcc not found: reading the kernels' SASS here needs the CUDA toolkit (12 or later)")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cmd = [nvcc, "-std=c++17", "-cubin", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v",
               *define_options(dict(defines or {})), "-o", str(cubin), str(KERNEL_DIR / source)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\nfailed ({res.returncode}): {res.stderr.strip()[:2000]}")
        return res.stderr + res.stdout, dump_sass(cubin, cuobjdump_candidates())


def hopper_sass_nvcc(cfg, nvcc: str | None = None) -> str:
    """The SASS of Hopper build ``cfg`` (a ``flashtut.cuda.configs.HopperConfig``), by :func:`nvcc_sass`."""
    from ..cuda.configs import HOPPER_ARCH

    return nvcc_sass(cfg.source, cfg.define_dict, HOPPER_ARCH, nvcc)[1]


# ------------------------------------------------------------------------------- PyTorch SDPA flash

def torch_cuda_library() -> Path:
    """``libtorch_cuda.so`` of the installed torch (where SDPA's flash kernels are compiled in)."""
    import torch

    lib = Path(torch.__file__).resolve().parent / "lib" / "libtorch_cuda.so"
    if not lib.is_file():
        raise RuntimeError(f"{lib} not found: SDPA's kernels live in a CUDA build of torch")
    return lib


def flash_kernel_names(listing: str, arch: str, head_dim: int | None = 128, dtype: str | None = "half_t",
                       pattern: str = "flash_fwd_kernel") -> list[str]:
    """The mangled names in a ``cuobjdump --list-text`` listing of the ``pattern`` kernels (not the
    split-KV ones) built for ``arch`` with ``head_dim`` and element type ``dtype`` (cutlass's
    ``half_t`` or ``bfloat16_t``), as Itanium mangling spells the template arguments (None: any)."""
    names = []
    for m in _TEXT_SECTION.finditer(listing):
        name, sm = m.group(1), m.group(2)
        if sm == arch and pattern in name and "splitkv" not in name and name not in names \
                and (head_dim is None or f"ILi{head_dim}E" in name) and (dtype is None or dtype in name):
            names.append(name)
    return names


def sdpa_flash_rows(cuobjdump: str, lib=None, arch: str = "sm_90", head_dim: int = 128,
                    dtype: str = "half_t", limit: int = 48, timeout_s: float = 120) -> list[dict]:
    """One row per instantiation of SDPA's flash forward kernel for ``head_dim`` and ``dtype`` in the
    torch library (every causal / even-size / dropout combination PyTorch compiled: SDPA picks one at
    run time), at most ``limit`` of them."""
    lib = Path(lib) if lib else torch_cuda_library()
    listing = _run([cuobjdump, "--list-text", str(lib)], timeout_s)
    names = flash_kernel_names(listing, arch, head_dim, dtype)
    # a torch whose kernel names spell the head dim or type otherwise: every flash forward of the arch
    matched = bool(names)
    names = names or flash_kernel_names(listing, arch, None, None)
    if not names:
        archs = sorted({sm for _, sm in _TEXT_SECTION.findall(listing)})
        raise RuntimeError(f"no flash_fwd_kernel for {arch}, D {head_dim}, {dtype} in {lib.name}; "
                           f"architectures in it: {archs}")
    funcs = split_functions(dump_sass(lib, cuobjdump, names[:limit], arch, timeout_s))
    demangled = _demangle(list(funcs))
    return [{"kind": "sass", "impl": "sdpa-flash", "setting": "default", "kernel": demangled.get(name, name),
             "mode": "fwd", "arch": arch, "binary": lib.name,
             **({"dtype": "float16" if dtype == "half_t" else dtype, "D": head_dim} if matched else
                {"note": f"no instantiation named for D {head_dim} and {dtype}: every flash forward of {arch}"}),
             **count_row(lines)} for name, lines in funcs.items()]


def _demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {}
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = out.stdout.splitlines()
    return dict(zip(names, lines)) if out.returncode == 0 and len(lines) == len(names) else {}


# ------------------------------------------------------------------------------- the evidence file

def error_row(impl: str, setting: str, exc: BaseException) -> dict:
    """A row that records why a kernel's counts are missing (the file keeps what did work)."""
    return {"kind": "sass", "impl": impl, "setting": setting, "kernel": "?", "counts": {},
            "status": "error", "error": f"{type(exc).__name__}: {exc}"[:800]}


def tag_speed_rows(rows: list[dict], setting: str) -> list[dict]:
    """Speed rows of one process, marked with the ``setting`` it ran under and each row's ratio to the
    SDPA flash row of the same case and mode in that process (the reference every process times). The
    rows of a process other than the default are renamed ``impl[setting]``, so that two settings'
    rows stay two measurements in one file."""
    key = ("mode", "dtype", "B", "H", "N", "D", "causal")
    flash = {tuple(r.get(k) for k in key): r.get("ms") for r in rows if r.get("impl") == "sdpa-flash"}
    out = []
    for r in rows:
        r = dict(r, kind="speed", setting=setting)
        ref = flash.get(tuple(r.get(k) for k in key))
        if ref and r.get("ms"):
            r["speedup_vs_sdpa_flash"] = round(ref / r["ms"], 4)
        if setting != "default":
            r["impl"] = f"{r['impl']}[{setting}]"
        out.append(r)
    return out


def summary(rows: list[dict]) -> list[str]:
    """Lines for the log: matrix instructions per kernel, then Triton's speed in each setting."""
    lines = []
    for r in rows:
        if r.get("kind") == "sass":
            c = r.get("counts") or {}
            what = " ".join(f"{op} {c[op]}" for op in ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "LDSM", "SYNCS")
                            if op in c)
            lines.append(f"{r['impl']:22s} {r.get('setting', ''):18s} {r['kernel'][:60]:60s} "
                         f"{what or r.get('error', '')} | {r.get('instructions', 0)} instructions")
    for r in rows:
        if r.get("kind") == "speed":
            lines.append(f"{r['impl']:34s} {r['mode']} N={r['N']:5d} causal={r['causal']!s:5s} "
                         f"{r.get('tflops') or 0:7.1f} TFLOP/s  x{r.get('speedup_vs_sdpa_flash') or 0:.2f} SDPA flash "
                         f"{r.get('status', '')}")
    return lines


__all__ = ["KEY_OPCODES", "split_functions", "opcode_histogram", "count_row", "cuobjdump_candidates", "find_cuobjdump", "dump_sass",
           "triton_cache_rows", "cuda_kernel_rows", "torch_cuda_library", "flash_kernel_names",
           "sdpa_flash_rows", "tag_speed_rows", "error_row", "summary"]
