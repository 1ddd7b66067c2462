"""Compile the CUDA C kernels at run time with NVRTC (through CuPy) and launch them on torch's stream.

The ``.cu`` files in ``kernels/`` are plain CUDA C: each compiles as-is with
``nvcc -std=c++17`` and through NVRTC with exactly the options :func:`nvrtc_options` returns.
Everything that varies between builds (element type, head dim, variant) goes in as ``-D``
defines, and every define has an ``#ifndef`` default in the source, so one file serves every
configuration and the build is cached per (GPU architecture, source, kernel, defines). The
architecture is the GPU's own by default (``"90"`` on an H100/H200); a kernel that needs the
architecture-specific features of one GPU generation (Hopper's ``wgmma`` and ``setmaxnreg``:
``"90a"``) asks for it with ``get_function(..., arch="90a")``.

Conventions the kernel files follow (forward and backward alike):

* ``FT_BF16``: 0 for float16 (the default), 1 for bfloat16 (sm_80 and newer only);
* ``HEAD_DIM``: the head dimension (32, 64, 96, 128, or 256 from sm_80, at run time; the default is 64);
* kernels are ``extern "C"`` and their names contain ``fwd`` or ``bwd`` (``peak`` for the
  instruction microbenchmarks of ``peak_mma.cu``);
* no system headers (NVRTC has none): half/bfloat16 are handled as raw 16-bit patterns with
  inline PTX conversions, see ``ft_common.cuh``.

Local ``#include "name.cuh"`` lines are expanded here, in Python, before the text goes to NVRTC:
CuPy's on-disk cache is keyed by the source text, so an edit to a header must change that text.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
import warnings
from pathlib import Path

import torch

#: the folder that holds the ``.cu`` and ``.cuh`` files
KERNEL_DIR = Path(__file__).resolve().parent / "kernels"

#: options every build uses. -ftz=true (flush denormals) is what CuPy adds to every NVRTC
#: build anyway; we state it so the CI compile sees the same thing. No --use_fast_math: the
#: kernels call the approximate exp2 (ex2.approx) explicitly where they want it, and keep IEEE
#: division and the rest, so the numerics are written in the source, not in a flag.
BASE_OPTIONS = ("-std=c++17", "-ftz=true")
#: options CuPy's RawModule appends on its own to every NVRTC build (with the -arch option)
CUPY_APPENDED = ("-ftz=true", "--device-as-default-execution-space")

_INSTALL_HINT = (
    "flashtut.cuda compiles its CUDA C kernels at run time with NVRTC through CuPy, which is not "
    "installed. Install the CuPy wheel that matches your CUDA driver: `pip install cupy-cuda12x` "
    "(CUDA 12) or `pip install cupy-cuda13x` (CUDA 13); Colab has cupy-cuda12x already.")


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # keep the reason: a broken install reads differently from none
        raise RuntimeError(f"{_INSTALL_HINT} (import failed: {exc})") from exc
    return cupy


def define_options(defines: dict | None) -> list[str]:
    """``{"HEAD_DIM": 128}`` -> ``["-DHEAD_DIM=128"]``, sorted so equal dicts give equal builds."""
    out = []
    for name, value in sorted((defines or {}).items()):
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise ValueError(f"define name must be an upper-case C identifier, got {name!r}")
        if isinstance(value, bool):
            value = int(value)
        out.append(f"-D{name}={value}")
    return out


def normalize_arch(arch) -> str:
    """``90``, ``"90"``, ``"sm_90"`` -> ``"90"``; ``"90a"``, ``"sm_90a"`` -> ``"90a"`` (the
    architecture-specific target: code built for it runs on that generation only)."""
    name = str(arch).removeprefix("sm_").removeprefix("compute_")
    if isinstance(arch, bool) or not re.fullmatch(r"[1-9][0-9]+a?", name):
        raise ValueError(f"arch must look like '90', 'sm_90', '90a' or 'sm_90a', got {arch!r}")
    return name


def nvrtc_options(arch: str, defines: dict | None = None) -> list[str]:
    """The exact NVRTC option list a build for ``arch`` (``"90"``, ``"sm_90"``, ``"90a"``) uses.

    It is what :func:`get_function` hands to CuPy plus what CuPy appends itself (``-ftz=true``,
    ``--device-as-default-execution-space`` and ``-arch=sm_XX``), so the CI test that feeds this
    list to NVRTC directly compiles what the runtime compiles.
    """
    arch = normalize_arch(arch)
    opts = list(BASE_OPTIONS) + define_options(defines)
    opts += [o for o in CUPY_APPENDED if o not in opts]
    opts.append(f"-arch=sm_{arch}")
    return opts


def _runtime_options(defines: dict | None) -> tuple[str, ...]:
    # what we pass to RawModule: nvrtc_options minus the parts CuPy adds on its own
    return tuple(o for o in BASE_OPTIONS + tuple(define_options(defines)) if o not in CUPY_APPENDED)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.M)


def load_source(source: str) -> str:
    """The text NVRTC compiles: ``source`` is a file name in :data:`KERNEL_DIR` (``"fwd_v3_fast.cu"``)
    or CUDA C text; local ``#include "x.cuh"`` lines are replaced by the header's text (once each)."""
    if "\n" not in source and source.endswith((".cu", ".cuh")):
        path = KERNEL_DIR / source
        if not path.is_file():
            raise ValueError(f"source {source!r} is not a file in {KERNEL_DIR}; accepted: "
                             f"{sorted(p.name for p in KERNEL_DIR.glob('*.cu'))} or CUDA C text")
        source = path.read_text()
    seen: set[str] = set()

    def expand(match):
        name = match.group(1)
        if name in seen:
            return f"// {name} already included"
        seen.add(name)
        path = KERNEL_DIR / name
        if not path.is_file():
            raise ValueError(f"#include \"{name}\": no such header in {KERNEL_DIR}")
        return _INCLUDE.sub(expand, path.read_text())

    return _INCLUDE.sub(expand, source)


def _device_index(device=None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return torch.cuda.current_device() if device.index is None else device.index


# A GPU's capability and limits never change while the process runs; torch answers each query
# through a properties lookup, which every kernel call would otherwise pay again.
@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _smem_optin(index: int) -> int:
    props = torch.cuda.get_device_properties(index)
    for attr in ("shared_memory_per_block_optin", "max_shared_memory_per_block_optin"):
        if hasattr(props, attr):
            return int(getattr(props, attr))
    return 48 * 1024


def capability(device=None) -> tuple[int, int]:
    """``(major, minor)`` of ``device`` (the current CUDA device by default), asked once per GPU."""
    return _capability(_device_index(device))


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the NVRTC that CuPy compiles with, or None when CuPy cannot say (no CuPy,
    no NVRTC library): the Hopper kernels need 12.0 or newer for the sm_90a target."""
    try:
        from cupy.cuda import nvrtc
        return tuple(int(x) for x in nvrtc.getVersion())[:2]
    except Exception:  # noqa: BLE001 - any failure means the version is unknown, which the caller handles
        return None


def device_arch(device=None) -> str:
    """``"90"`` for an H100/H200, ``"75"`` for a T4 ... (the current CUDA device by default)."""
    major, minor = capability(device)
    return f"{major}{minor}"


def nvrtc_cubin(code: str, arch: str, defines: dict | None = None) -> bytes:
    """Compile CUDA C ``code`` (``load_source``'s text) with CuPy's NVRTC and exactly
    :func:`nvrtc_options` for ``arch``; returns the cubin. No cache: this is the cost a first call
    pays (``experiments/compile_time`` times it)."""
    from cupy.cuda import nvrtc

    arch = normalize_arch(arch)
    prog = nvrtc.createProgram(code, "flashtut.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, nvrtc_options(arch, defines))
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC could not compile for sm_{arch}:\n{nvrtc.getProgramLog(prog)}") from exc
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _cubin(code: str, arch: str, defines: dict) -> Path:
    # CuPy's RawModule compiles for the device's own architecture only (-arch=sm_90, never
    # sm_90a); any other target is compiled here with CuPy's NVRTC, with the same options, into
    # a file named by a hash of the text and options, which RawModule then loads
    options = nvrtc_options(arch, defines)
    digest = hashlib.sha256("\0".join([code, *options]).encode()).hexdigest()[:32]
    path = Path(tempfile.gettempdir()) / "flashtut-cubin" / f"sm_{arch}-{digest}.cubin"
    if path.is_file():
        return path
    binary = nvrtc_cubin(code, arch, defines)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")   # another process may write the same file
    partial.write_bytes(binary)
    partial.replace(path)
    return path


def build_cubin(source: str, defines: dict | None = None, arch: str = "90a") -> Path:
    """Compile ``source`` (file name or text) with ``defines`` for ``arch`` into a cubin file, with the
    options of :func:`nvrtc_options` (what :func:`get_function` runs for that target), and return its
    path: for reading the machine code (``cuobjdump --dump-sass``). Needs CuPy's NVRTC, not a GPU."""
    _cupy()
    return _cubin(load_source(source), normalize_arch(arch), dict(defines or {}))


@functools.lru_cache(maxsize=None)
def _function(arch: str, native: bool, source: str, kernel: str, defines: tuple):
    # one build per (arch, source, kernel, defines) and process: a kernel file is read and its
    # headers expanded once, not on every call (a call at small N is over in tens of microseconds)
    cupy = _cupy()
    code = load_source(source)
    if native:   # CuPy compiles for the current device and caches on disk by the source text
        module = cupy.RawModule(code=code, options=_runtime_options(dict(defines)), backend="nvrtc")
    else:
        module = cupy.RawModule(path=str(_cubin(code, arch, dict(defines))))
    return module.get_function(kernel)


def get_function(source: str, kernel: str, defines: dict | None = None, arch: str | None = None):
    """Compile ``source`` (file name or text) with ``defines`` for ``arch`` and return ``kernel``
    as a ``cupy.RawKernel``. ``arch``: the current GPU's own architecture by default (``"90"``
    on an H100/H200), or e.g. ``"90a"`` for a kernel that uses ``wgmma`` or ``setmaxnreg``.
    Cached per (arch, source, kernel, defines) for the life of the process, so an edited ``.cu``
    file is picked up after :func:`clear_cache` or a restart."""
    own = None if arch is None else normalize_arch(arch)   # argument errors before the environment
    _cupy()
    if not torch.cuda.is_available():
        raise RuntimeError("flashtut.cuda kernels need a CUDA GPU and none is visible to torch; "
                           "run on a GPU machine (on Colab: Runtime > Change runtime type > GPU)")
    device = device_arch()
    target = device if own is None else own
    return _function(target, target == device, source, kernel, tuple(sorted((defines or {}).items())))


def clear_cache() -> None:
    """Forget every build of this process (after editing a kernel file in a running notebook)."""
    _function.cache_clear()


def set_max_dynamic_smem(fn, nbytes: int) -> None:
    """Allow ``fn`` to use ``nbytes`` of dynamic shared memory (above 48 KB needs this opt-in)."""
    if fn.max_dynamic_shared_size_bytes < nbytes:
        fn.max_dynamic_shared_size_bytes = int(nbytes)


def max_smem_per_block(device=None) -> int:
    """The opt-in shared memory limit per block: 64 KB on a T4, 163 KB A100, 227 KB H100/H200."""
    return _smem_optin(_device_index(device))


def _as_arg(a):
    import numpy as np

    if isinstance(a, torch.Tensor):
        if not a.is_cuda:
            raise ValueError(f"kernel arguments must be CUDA tensors, got one on {a.device}")
        return np.uint64(a.data_ptr())  # zero-copy: the kernel reads torch's memory in place
    if isinstance(a, bool):
        return np.int32(a)
    if isinstance(a, int):
        return np.int32(a)
    if isinstance(a, float):
        return np.float32(a)  # a bare Python float would be passed as a C double
    return a


@functools.lru_cache(maxsize=64)
def _cupy_stream(handle: int, device: int):
    # CuPy's view of torch's stream (no new stream is created). CuPy 14 deprecates
    # ExternalStream in favour of Stream.from_external, which needs the __cuda_stream__
    # protocol that older torch streams lack; ExternalStream works with every version.
    cupy = _cupy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle)  # device: cache key only (torch streams belong to one)


def launch(fn, grid, block, args, shared_mem: int = 0) -> None:
    """Launch ``fn`` on torch's current stream, so it is ordered with the torch work around it.

    Tensors go in as raw device pointers (no copy), Python ints as ``int32`` and floats as
    ``float32``; numpy scalars pass through unchanged.
    """
    stream = _cupy_stream(torch.cuda.current_stream().cuda_stream, torch.cuda.current_device())
    with stream:
        fn(tuple(int(g) for g in grid), tuple(int(b) for b in block),
           tuple(_as_arg(a) for a in args), shared_mem=int(shared_mem))
