"""Compile the CUDA C kernels at run time with NVRTC (through CuPy) and launch them on torch's stream.

The ``.cu`` files next to this module are plain CUDA C: each compiles as-is with
``nvcc -std=c++17`` and through NVRTC with exactly the options :func:`nvrtc_options` returns.
Everything that varies between builds (element type, head dim, variant) goes in as ``-D``
defines, and every define has an ``#ifndef`` default in the source, so one file serves every
configuration and the build is cached per (GPU architecture, source, kernel, defines).

Conventions the kernel files follow (forward and backward alike):

* ``FT_BF16``: 0 for float16 (the default), 1 for bfloat16 (sm_80 and newer only);
* ``HEAD_DIM``: the head dimension (64 or 128 at run time; the default is 64);
* kernels are ``extern "C"`` and their names contain ``fwd`` or ``bwd``;
* no system headers (NVRTC has none): half/bfloat16 are handled as raw 16-bit patterns with
  inline PTX conversions, see ``ft_common.cuh``.

Local ``#include "name.cuh"`` lines are expanded here, in Python, before the text goes to NVRTC:
CuPy's on-disk cache is keyed by the source text, so an edit to a header must change that text.
"""
from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path

import torch

from ..hardware import GPUS

#: the folder that holds the ``.cu`` and ``.cuh`` files
CUDA_DIR = Path(__file__).resolve().parent

#: element type name -> the defines that select it in every kernel file
DTYPE_DEFINES = {torch.float16: {"FT_BF16": 0}, torch.bfloat16: {"FT_BF16": 1}}
#: head dims the kernels are built for
HEAD_DIMS = (64, 128)


def _smem_by_arch() -> tuple[dict, dict]:
    # the book's reference GPUs (flashtut.hardware: T4, A100, H100/H200), plus sm_86/89 (A10, L4:
    # 99 KB per block, 100 KB per SM, from the CUDA guide's compute-capability table)
    per_block, per_sm = {86: 99 * 1024, 89: 99 * 1024}, {86: 100 * 1024, 89: 100 * 1024}
    for gpu in GPUS.values():
        arch = 10 * gpu.compute_capability[0] + gpu.compute_capability[1]
        per_block.setdefault(arch, gpu.smem_per_block_kib * 1024)
        per_sm.setdefault(arch, gpu.smem_per_sm_kib * 1024)
    return dict(sorted(per_block.items())), dict(sorted(per_sm.items()))


#: opt-in shared memory per block, and shared memory per SM, of a typical GPU of each architecture
#: (75, 80, 86, 89, 90): lets CI build exactly the configurations those GPUs would run, without them
SMEM_PER_BLOCK, SMEM_PER_SM = _smem_by_arch()

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


def nvrtc_options(arch: str, defines: dict | None = None) -> list[str]:
    """The exact NVRTC option list a build for ``arch`` (``"90"``, ``"sm_90"``) uses.

    It is what :func:`get_function` hands to CuPy plus what CuPy appends itself (``-ftz=true``,
    ``--device-as-default-execution-space`` and ``-arch=sm_XX``), so the CI test that feeds this
    list to NVRTC directly compiles what the runtime compiles.
    """
    arch = str(arch).removeprefix("sm_").removeprefix("compute_")
    if not arch.isdigit():
        raise ValueError(f"arch must look like '90' or 'sm_90', got {arch!r}")
    opts = list(BASE_OPTIONS) + define_options(defines)
    opts += [o for o in CUPY_APPENDED if o not in opts]
    opts.append(f"-arch=sm_{arch}")
    return opts


def _runtime_options(defines: dict | None) -> tuple[str, ...]:
    # what we pass to RawModule: nvrtc_options minus the parts CuPy adds on its own
    return tuple(o for o in BASE_OPTIONS + tuple(define_options(defines)) if o not in CUPY_APPENDED)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.M)


def load_source(source: str) -> str:
    """The text NVRTC compiles: ``source`` is a file name in :data:`CUDA_DIR` (``"fwd_v3_mma.cu"``)
    or CUDA C text; local ``#include "x.cuh"`` lines are replaced by the header's text (once each)."""
    if "\n" not in source and source.endswith((".cu", ".cuh")):
        path = CUDA_DIR / source
        if not path.is_file():
            raise ValueError(f"source {source!r} is not a file in {CUDA_DIR}; accepted: "
                             f"{sorted(p.name for p in CUDA_DIR.glob('*.cu'))} or CUDA C text")
        source = path.read_text()
    seen: set[str] = set()

    def expand(match):
        name = match.group(1)
        if name in seen:
            return f"// {name} already included"
        seen.add(name)
        path = CUDA_DIR / name
        if not path.is_file():
            raise ValueError(f"#include \"{name}\": no such header in {CUDA_DIR}")
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


def device_arch(device=None) -> str:
    """``"90"`` for an H100/H200, ``"75"`` for a T4 ... (the current CUDA device by default)."""
    major, minor = capability(device)
    return f"{major}{minor}"


@functools.lru_cache(maxsize=None)
def _function(arch: str, source: str, kernel: str, defines: tuple):
    # one build per (arch, source, kernel, defines) and process: a kernel file is read and its
    # headers expanded once, not on every call (a call at small N is over in tens of microseconds)
    cupy = _cupy()
    # arch is in the key only: CuPy compiles for the current device (one RawModule per arch)
    module = cupy.RawModule(code=load_source(source), options=_runtime_options(dict(defines)),
                            backend="nvrtc")
    return module.get_function(kernel)


def get_function(source: str, kernel: str, defines: dict | None = None):
    """Compile ``source`` (file name or text) with ``defines`` and return ``kernel`` as a
    ``cupy.RawKernel``; cached per (GPU arch, source, kernel, defines) for the life of the
    process, so an edited ``.cu`` file is picked up after :func:`clear_cache` or a restart."""
    _cupy()
    if not torch.cuda.is_available():
        raise RuntimeError("flashtut.cuda kernels need a CUDA GPU and none is visible to torch; "
                           "run on a GPU machine (on Colab: Runtime > Change runtime type > GPU)")
    return _function(device_arch(), source, kernel, tuple(sorted((defines or {}).items())))


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


def to_cupy(t: torch.Tensor):
    """A CuPy view of a CUDA tensor through DLPack (no copy), for code that wants arrays."""
    cupy = _cupy()
    return cupy.from_dlpack(t.detach())
