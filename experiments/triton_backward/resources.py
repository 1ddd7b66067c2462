"""Shared memory, registers and spills of the Triton kernels for a GPU we do not have, on the CPU.

``python experiments/triton_backward/resources.py [--arch 90 80 86] [--dims 64 128 256]``
compiles each kernel of ``flashtut.triton`` with every tile configuration of its search space
(``flashtut.triton.configs``) for the named architectures (Triton's compiler runs without a GPU:
``triton.compile`` with a ``GPUTarget``), then runs ``ptxas -v`` on the PTX. It prints one line per
(arch, kernel, head dim, tile): the shared memory Triton allocates (bytes), the registers per thread
and the spill stores, and whether the shared memory fits the architecture's limit per block. The
numbers come from the local triton (the GPU machine's may differ a little): a filter for the tile
tables, not a measurement of speed.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import triton
import triton.language as tl  # noqa: F401  (the kernels' module needs it loaded)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashtut.triton import backward, configs, forward
from flashtut.triton.configs import TileConfig

#: shared memory per block (bytes) that a kernel may allocate: sm_80 (A100) 163 KB, sm_86/89 99 KB,
#: sm_90 (H100/H200) 227 KB
SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
_F32_PTRS = {"LSE", "DELTA"}
_I32_PTRS = {"CU_Q", "CU_K", "FLAG"}
_FLOATS = {"scale", "qk_scale"}


def _signature(fn, dtype: str, constexprs: dict, fused_dq: bool = False):
    """ASTSource arguments for ``fn``: pointer types from the names, 16-divisibility hints where
    the launches would have them (pointers, strides, lengths that are multiples of 16)."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name.isupper() or name in _I32_PTRS:
            if name in _F32_PTRS or (fused_dq and name == "DQ"):
                sig[name] = "*fp32"
            elif name in _I32_PTRS:
                sig[name] = "*i32"
            else:
                sig[name] = f"*{dtype}"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in _FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("stride_") or name in ("n_heads", "n_kv_heads", "head_dim"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_kernel(kernel: str, arch: int, D: int, cfg: TileConfig, dtype: str = "fp16", causal: bool = True,
                   extra: dict | None = None):
    """Compile ``kernel`` (``fwd``, ``dkdv``, ``dq``, or ``dkdv_fused``) for ``sm_<arch>``; returns
    ``(shared bytes, registers, spill-store bytes)``."""
    block_d = max(16, triton.next_power_of_2(D))
    common = dict(CAUSAL=causal, BOTTOM_RIGHT=False, WINDOW=False, VARLEN=False, BLOCK_D=block_d,
                  PAD_D=block_d != D, DOT_PREC="tf32", BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    fn = {"fwd": forward.attn_fwd_kernel, "dq": backward.bwd_dq_kernel}.get(kernel, backward.bwd_dkdv_kernel)
    cx = dict(common)
    if kernel != "fwd":
        cx.update(DS_FP32=False)
    if kernel.startswith("dkdv"):
        cx.update(FUSED_DQ=kernel == "dkdv_fused", GROUPED=False, WIDE_ROWS=False)
    cx.update(extra or {})
    cx = {k: v for k, v in cx.items() if k in fn.arg_names}
    sig, attrs = _signature(fn, dtype, cx, fused_dq=kernel == "dkdv_fused")
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    opts = backend.parse_options({"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    cc = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs), target=target,
                        options=opts.__dict__)
    regs, spills = _ptxas(cc.asm["ptx"], arch)
    return cc.metadata.shared, regs, spills


def _ptxas(ptx: str, arch: int):
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(arch).path if callable(get_ptxas) else get_ptxas()
    path = f"/tmp/flashtut_res_{os.getpid()}.ptx"
    with open(path, "w") as f:
        f.write(ptx)
    name = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    res = subprocess.run([ptxas, "-v", f"--gpu-name={name}", path, "-o", "/dev/null"], capture_output=True, text=True)
    os.unlink(path)
    text = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    return (int(regs.group(1)) if regs else -1), (int(spill.group(1)) if spill else -1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[90, 80, 86])
    ap.add_argument("--dims", type=int, nargs="+", default=[256])
    ap.add_argument("--kernels", nargs="+", default=["fwd", "dkdv", "dq"])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--causal", type=int, default=1, choices=[0, 1])
    a = ap.parse_args(argv)
    for arch in a.arch:
        cap = (arch // 10, arch % 10)
        for D in a.dims:
            bd = max(16, triton.next_power_of_2(D))
            for kernel in a.kernels:
                for cfg in configs.search_space(kernel, cap, False, bd):
                    try:
                        smem, regs, spills = compile_kernel(kernel, arch, D, cfg, a.dtype, bool(a.causal))
                    except Exception as e:  # noqa: BLE001 - report and go on
                        print(f"sm_{arch} {kernel:5s} D={D} {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                        continue
                    fits = "fits" if smem <= SMEM_LIMIT.get(arch, 0) else "TOO BIG"
                    print(f"sm_{arch} {kernel:5s} D={D:3d} {cfg.block_m:3d}x{cfg.block_n:<3d} w{cfg.num_warps} "
                          f"s{cfg.num_stages}: smem {smem:6d} B ({fits}), {regs} regs, spill {spills} B", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
