"""Hopper rungs W1 to W4 (fwd_w1_wgmma.cu, fwd_w2_tma.cu, fwd_w3_pingpong.cu, fwd_w4_persistent.cu,
flashtut.cuda.hopper):
CPU evidence, and GPU correctness on sm_90.

On the CPU (nvcc and the NVRTC wheel, no driver needed):
* every build ``forward_hopper`` makes compiles for sm_90a with nvcc
  (``-gencode=arch=compute_90a,code=sm_90a``) and through NVRTC with ``-arch=sm_90a``;
* the SASS of both holds the warpgroup MMA (HGMMA) the source asks for: ``HEAD_DIM / 16`` with both
  operands in shared memory per key tile, and the P V ones with A from registers and B transposed
  (``tnspB``), and no mma.sync (HMMA); built for plain sm_90 the same file has no HGMMA at all;
* ptxas reports no spills, no warning and no C75xx performance message: a serialised wgmma (C7510 to
  C7515) and an ignored setmaxnreg (C7508) are reported as "info", not as warnings; at least the
  registers that the accumulators need;
* W2, W3 and W4: the TMA loads (UTMALDG), mbarriers (SYNCS) and both register reallocations (USETMAXREG);
  W3 and W4 also their named barriers (BAR.SYNC / BAR.ARV on a register id, 256 threads), the one pipelined
  wgmma wait (WARPGROUP.DEPBAR.LE gsb0, 0x1) and no register above the consumers' 240;
* the kernel's own address and descriptor functions, compiled for the host, agree with the CPU
  model ``flashtut.cuda.models.hopper_layout``.
On an sm_90 GPU (``gpu`` tests): the FlashAttention error criterion on odd shapes, causal both
alignments, grouped heads, rows that see no key, and the lse; W4 also with few persistent blocks,
each walking many query blocks.
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flashtut.bench.sass import (exp2_between_waits, find_cuobjdump, nvcc_sass, opcode_histogram, pipelined_loop,
                                 split_functions)
from flashtut.cuda import compile as cc
from flashtut.cuda import configs
from flashtut.cuda import hopper, hopper_launch
from flashtut.cuda.models import hopper_layout as hl
from test_cuda_compile import NVRTC, nvrtc_compile, parse_ptxas
from conftest import load_committed

NVCC = shutil.which("nvcc")
HAS_CUDA = torch.cuda.is_available()
IS_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)


CUOBJDUMP = find_cuobjdump()
needs_nvcc = pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="needs nvcc and cuobjdump")
needs_nvrtc = pytest.mark.skipif(NVRTC is None or CUOBJDUMP is None, reason="needs the NVRTC wheel and cuobjdump")

#: what cuda_attention runs on sm_90 (configs.HOPPER_OPTIONS per head dim, both dtypes) and each rung at its
#: defaults (float16; configs.hopper_builds, both dtypes, in the full matrix)
SHIPPED = [configs.hopper_config("w3", dt, D, consumers=configs.HOPPER_CONSUMERS[D], **configs.HOPPER_OPTIONS[D])
           for dt in configs.DTYPES for D in configs.HOPPER_HEAD_DIMS] + [
    c for c in configs.hopper_builds() if c.define_dict["FT_BF16"] == 0]
#: the shapes and options chapter 11 measures against them: compiled in the full matrix (pytest -m slow)
OTHER_BUILDS = [c for c in configs.hopper_builds() if c not in SHIPPED] + [
    configs.hopper_config("w1", torch.float16, 128, pv_split=False),
    configs.hopper_config("w1", torch.float16, 128, block_n=64),
    configs.hopper_config("w1", torch.bfloat16, 64, block_n=64),
    configs.hopper_config("w2", torch.float16, 128, stages=3),
    configs.hopper_config("w2", torch.bfloat16, 64, block_n=64, stages=4),
    configs.hopper_config("w3", torch.float16, 128, stages=3),
    configs.hopper_config("w3", torch.bfloat16, 64, block_n=64, stages=4),
    configs.hopper_config("w3", torch.float16, 128, block_n=64),
    configs.hopper_config("w4", torch.float16, 128, stages=3),
    configs.hopper_config("w4", torch.bfloat16, 64, block_n=64, stages=4, consumers=3),
    configs.hopper_config("w3", torch.float16, 64, consumers=3, tma_store=True),
    configs.hopper_config("w3", torch.bfloat16, 128, tma_store=True),
    configs.hopper_config("w3", torch.float16, 64, consumers=3, c3_turns=True),
    configs.hopper_config("w3", torch.bfloat16, 64, consumers=3, c3_turns=True, tma_store=True),
    configs.hopper_config("w4", torch.float16, 64, consumers=3, c3_turns=True),
    configs.hopper_config("w3", torch.float16, 64, consumers=3, c3_turns=True, tail_first=True),
    configs.hopper_config("w3", torch.bfloat16, 128, tail_first=True),
    configs.hopper_config("w3", torch.float16, 64, consumers=3, c3_turns=True, uniform_wg=True),
    configs.hopper_config("w3", torch.bfloat16, 128, tma_store=True, uniform_wg=True),
    configs.hopper_config("w4", torch.float16, 64, consumers=3, c3_turns=True, uniform_wg=True),
    configs.hopper_config("w3", torch.bfloat16, 64, consumers=3, c3_turns=True, tail_first=True, uniform_wg=True),
]
#: every build the CPU tests compile
BUILDS = SHIPPED + [pytest.param(c, marks=pytest.mark.slow) for c in OTHER_BUILDS if c not in SHIPPED]

#: the kernels with a producer warpgroup (TMA, mbarriers, setmaxnreg)
TMA_KERNELS = ("flash_fwd_w2", "flash_fwd_w3", "flash_fwd_w4")
#: the kernels with W3's consumers (pipelined, ping-pong or three warpgroups); W4 is W3 made persistent
W3_KERNELS = ("flash_fwd_w3", "flash_fwd_w4")
_TMP = Path(tempfile.mkdtemp(prefix="flashtut_hopper_"))


def _label(cfg) -> str:
    return cfg.kernel + ":" + ",".join(f"{k}={v}" for k, v in cfg.defines)


def sass(cubin: Path) -> str:
    res = subprocess.run([CUOBJDUMP, "--dump-sass", str(cubin)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


@functools.lru_cache(maxsize=None)
def nvcc_build(defines: tuple, arch: str = "90a", source: str = "fwd_w1_wgmma.cu") -> tuple[str, str]:
    """(ptxas log, SASS) of ``source`` built by nvcc for ``arch``."""
    return nvcc_sass(source, dict(defines), arch, NVCC)


def hgmma_counts(text: str) -> dict:
    """HGMMA instructions by kind: both operands from shared memory ("ss", A is a descriptor) or A
    from registers with B transposed ("rs_t"), keyed with their shape."""
    out = {}
    for line in text.splitlines():
        m = re.search(r"HGMMA\.(\d+x\d+x\d+)\.F32(\.BF16)?\s+R\d+,\s*(gdesc|R\d+)", line)
        if m:
            kind = "ss" if m.group(3) == "gdesc" else ("rs_t" if ".tnspB" in line else "rs")
            key = (kind, m.group(1), bool(m.group(2)))
            out[key] = out.get(key, 0) + 1
    return out


def expected_hgmma(cfg) -> dict:
    d = cfg.define_dict
    prefix = {"flash_fwd_w1": "W1", "flash_fwd_w2": "W2", "flash_fwd_w3": "W3", "flash_fwd_w4": "W3"}[cfg.kernel]
    D, bn, bf = d["HEAD_DIM"], d[f"{prefix}_BLOCK_N"], bool(d["FT_BF16"])
    split = (prefix != "W1" or d["W1_PV_SPLIT"]) and D == 128
    pv_n = 64 if split else D
    # W3 issues each product in two places: Q K^T in slot 0 and in the pipelined loop, P V in the loop
    # and in the last slot
    copies = 2 if prefix == "W3" else 1
    return {("ss", f"64x{bn}x16", bf): copies * D // 16,
            ("rs_t", f"64x{pv_n}x16", bf): copies * (bn // 16) * (D // pv_n)}


def consumers(cfg) -> int:
    """The build's consumer warpgroups: 2, or 3 for W3's (and W4's) 192-row variant."""
    return cfg.define_dict.get("W3_CONSUMERS", 2)


def consumer_regs(cfg) -> int:
    """What setmaxnreg grants each consumer thread of a TMA build."""
    return configs.W3_WIDE["regs"] if consumers(cfg) == 3 else configs.W2_REGS["consumer"]


def check_resources(log: str, cfg) -> dict:
    rows = [r for r in parse_ptxas(log) if r["kernel"] == cfg.kernel]
    assert len(rows) == 1, log
    r = rows[0]
    assert r["spill_st"] == 0 and r["spill_ld"] == 0 and r["stack"] == 0, f"{_label(cfg)}: spills\n{log}"
    assert "warning" not in log.lower(), f"{_label(cfg)}: ptxas warns\n{log}"
    # "Potential Performance Loss: wgmma.mma_async instructions are serialized ..." (C7510-C7515) and
    # "setmaxnreg ignored" (C7508) come as ptxas info lines
    assert not re.search(r"C75\d\d|serializ|setmaxnreg", log, re.I), f"{_label(cfg)}: ptxas reports\n{log}"
    d = cfg.define_dict
    if cfg.kernel in TMA_KERNELS:
        # 384 threads (512 with three consumers): ptxas reports the launch's share (65536 / threads,
        # rounded down to 8: 168 or 128); the consumers' 240 (160) after setmaxnreg are a run-time
        # grant, so the accumulators are checked against that
        w3 = cfg.kernel in W3_KERNELS
        budget = hl.w3_register_budget if w3 else hl.w1_register_budget
        need = sum(budget(d["HEAD_DIM"], d["W3_BLOCK_N" if w3 else "W2_BLOCK_N"]).values())
        assert r["regs"] == 65536 // cfg.threads // 8 * 8 and need <= consumer_regs(cfg), (need, r)
        return r
    need = sum(hl.w1_register_budget(d["HEAD_DIM"], d["W1_BLOCK_N"]).values())
    assert need <= r["regs"] <= 255, (need, r)
    return r


@needs_nvcc
@pytest.mark.parametrize("cfg", BUILDS, ids=_label)
def test_nvcc_sm90a_emits_hgmma(cfg, record_property):
    log, text = nvcc_build(cfg.defines, source=cfg.source)
    r = check_resources(log, cfg)
    record_property("nvcc sm_90a " + _label(cfg), f"{r['regs']} registers, spill 0")
    print(f"nvcc sm_90a {_label(cfg)}: {r['regs']} registers")
    assert hgmma_counts(text) == expected_hgmma(cfg), text[:2000]
    assert not re.search(r"\bHMMA\b", text), "mma.sync in the wgmma kernel"
    assert "WARPGROUP.ARRIVE" in text and "WARPGROUP.DEPBAR" in text  # wgmma.fence, wgmma.wait_group
    if cfg.kernel in TMA_KERNELS:
        # TMA loads (one per 64-column box: Q, K and V), no cp.async; both register reallocations
        assert text.count("UTMALDG.3D") == 3 * (cfg.define_dict["HEAD_DIM"] // 64) and "LDGSTS" not in text
        # (the grant's success lands in a uniform predicate, whichever ptxas picks)
        grant = rf"USETMAXREG\.TRY_ALLOC\.CTAPOOL UP\d, {consumer_regs(cfg):#x}\b"
        assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in text and re.search(grant, text)
        assert "SYNCS.PHASECHK.TRANS64.TRYWAIT" in text and "SYNCS.ARRIVE.TRANS64" in text  # mbarriers
    if cfg.kernel in W3_KERNELS:
        check_w3_sass(text, consumers(cfg), consumer_regs(cfg), bool(cfg.define_dict.get("W3_TMA_STORE")),
                      consumers(cfg) == 2 or bool(cfg.define_dict.get("W3_C3_TURNS")))
    if cfg.kernel in W3_KERNELS:
        # ptxas places the wait for the P V in flight above the loop's softmax of S_j (W3) or all but a few
        # of its exponentials (W4): what chapter 11 reads in the machine code
        slot = cfg.block_n // 2 + 2   # P's exponentials and the two alpha
        between = exp2_between_waits(text)
        assert between == 0 if cfg.kernel == "flash_fwd_w3" else between < slot // 4, between
    if cfg.define_dict.get("FT_WG_UNIFORM"):
        # the warpgroup index known uniform: the pipelined loop moves no descriptor into the uniform registers
        # and is shorter for it; the same products
        _, base = nvcc_build(tuple((k, v) for k, v in cfg.defines if k != "FT_WG_UNIFORM"), source=cfg.source)
        loop, base_loop = (pipelined_loop(split_functions(t)[cfg.kernel], cfg.define_dict["HEAD_DIM"], cfg.block_n)
                           for t in (text, base))
        assert loop and base_loop and hgmma_counts(text) == hgmma_counts(base)
        assert opcode_histogram(loop)["R2UR"] == 0 < opcode_histogram(base_loop)["R2UR"]
        assert len(loop) < len(base_loop), (len(loop), len(base_loop))
    if cfg.define_dict.get("W3_TMA_STORE"):
        # one TMA store per 64-column box of the output tile, and no 4-byte store of O from registers
        # (what is left of STG: the lse)
        _, base = nvcc_build(tuple((k, v) for k, v in cfg.defines if k != "W3_TMA_STORE"), source=cfg.source)
        D = cfg.define_dict["HEAD_DIM"]
        assert text.count("UTMASTG.3D") == D // 64 and "UTMASTG" not in base
        assert base.count("STG.E ") - text.count("STG.E ") == 2 * D // 8, (base.count("STG.E "), text.count("STG.E "))


def check_w3_sass(text: str, n_consumers: int = 2, grant: int = 240, tma_store: bool = False,
                  turns: bool = True) -> None:
    """What makes W3 W3 in its SASS: the turns (two consumers, or three with ``c3_turns``) and the pipelined
    wait (``tma_store``: and one more named barrier, each warpgroup's before its TMA store, bar.sync on
    128 = 0x80 threads)."""
    if tma_store:
        stores = re.findall(r"BAR\.SYNC(?:\.DEFER_BLOCKING)? R\d+, 0x80 ", text)
        assert len(stores) == 1, stores
        text = re.sub(r"BAR\.SYNC(?:\.DEFER_BLOCKING)? R\d+, 0x80 ", "", text)
    if turns:
        # the turns: bar.sync on the warpgroup's own id (a register), bar.arrive on the next one's (and
        # the first turn, id 1, as an immediate), 256 = 0x100 threads each
        assert re.search(r"BAR\.SYNC\.DEFER_BLOCKING R\d+, 0x100", text), "no named bar.sync"
        assert re.search(r"BAR\.ARV R\d+, 0x100", text) and "BAR.ARV 0x1, 0x100" in text, "no named bar.arrive"
    else:
        # three consumers without turns: the only barrier is the __syncthreads before the roles split
        assert n_consumers == 3
        assert len(re.findall(r"\bBAR\.(SYNC|ARV)", text)) == 1 and "BAR.ARV" not in text, "a named barrier"
    # one wait_group 1 (S_j done, P V in flight) in the loop; wait_group 0 after slot 0, in the loop and
    # after the last P V: ptxas added no wait of its own (a serialised wgmma gets one per instruction)
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x\d)", text)
    assert sorted(waits) == ["0x0", "0x0", "0x0", "0x1"], waits
    # every register in the consumers' code fits what setmaxnreg grants them (240, or 160 for three)
    assert max(int(r) for r in re.findall(r"\bR(\d+)\b", text)) < grant


@needs_nvcc
def test_plain_sm90_has_no_wgmma():
    # the same file built for sm_90 (no "a"): the wgmma path is compiled out, which is why the launcher
    # builds for sm_90a
    for cfg in (configs.hopper_config(v, torch.float16, 64) for v in configs.HOPPER_VARIANTS):
        _, text = nvcc_build(cfg.defines, arch="90", source=cfg.source)
        assert "HGMMA" not in text and "UTMALDG" not in text and cfg.kernel in text
        assert "TRAP" in text  # the body is __trap(): launched there by mistake, it fails loudly


@needs_nvrtc
@pytest.mark.parametrize("cfg", SHIPPED, ids=_label)
def test_nvrtc_sm90a_emits_hgmma(cfg):
    out = _TMP / f"nvrtc_{abs(hash(cfg.defines))}.cubin"
    opts = cc.nvrtc_options(configs.HOPPER_ARCH, cfg.define_dict)
    assert opts[-1] == "-arch=sm_90a"
    rc, log = nvrtc_compile(cc.load_source(cfg.source), opts + ["-Xptxas", "-v"], out)
    assert rc == 0, log
    check_resources(log, cfg)
    text = sass(out)
    assert hgmma_counts(text) == expected_hgmma(cfg)
    if cfg.kernel == "flash_fwd_w3":
        # the runtime's compiler also places the wait for the P V above the whole softmax (no pin here)
        assert exp2_between_waits(text) == 0


@needs_nvcc
def test_kernel_address_functions_match_the_model():
    src = _TMP / "host_layout.cu"
    src.write_text(
        '#include "ft_wgmma.cuh"\n#include <cstdio>\n'
        "int main() {\n"
        "  for (int r = 0; r < 128; ++r) for (int c = 0; c < 128; ++c) printf(\"%u\\n\", sw128_offset<128>(r, c));\n"
        "  for (int r = 0; r < 64; ++r) for (int c = 0; c < 128; ++c) printf(\"%u\\n\", sw128_offset<64>(r, c));\n"
        "  unsigned v[][3] = {{0, 16, 1024}, {1056, 16384, 1024}, {198656, 8192, 1024}, {262128, 16, 16}};\n"
        "  for (auto& x : v) printf(\"%llu\\n\", wgmma_desc(x[0], x[1], x[2]));\n"
        "}\n")
    exe = _TMP / "host_layout"
    res = subprocess.run([NVCC, "-std=c++17", f"-I{cc.KERNEL_DIR}", "-o", str(exe), str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    want = [hl.tile_offset(r, c, 128) for r in range(128) for c in range(128)]
    want += [hl.tile_offset(r, c, 64) for r in range(64) for c in range(128)]
    want += [hl.encode_descriptor(a, lbo, sbo, "128B") for a, lbo, sbo in
             ((0, 16, 1024), (1056, 16384, 1024), (198656, 8192, 1024), (262128, 16, 16))]
    assert got == want


# ------------------------------------------------------------------ the launcher, on the CPU

def test_configs_fit_an_h100():
    for cfg in SHIPPED + OTHER_BUILDS:
        assert cfg.dynamic_smem <= configs.SMEM_PER_BLOCK[90], cfg
        # consumer warpgroups of 64 rows (two; three in W3's 192-row variant) and W2's and W3's
        # producer warpgroup
        assert cfg.block_m == 64 * consumers(cfg)
        assert cfg.threads == (128 * (1 + consumers(cfg)) if cfg.kernel in TMA_KERNELS else 256)
    assert configs.w2_smem_bytes(128) == (128 + 4 * 128) * 128 * 2 + 1024 + 8 * 7
    # W3: one more mbarrier per stage (K and V released apart)
    assert configs.w3_smem_bytes(128, stages=3) == (128 + 6 * 128) * 128 * 2 + 1024 + 8 * 13
    assert configs.hopper_config("w3", torch.bfloat16, 128, stages=3).dynamic_smem <= configs.SMEM_PER_BLOCK[90]
    assert configs.hopper_config("w2", torch.float16, 128, stages=3).dynamic_smem <= configs.SMEM_PER_BLOCK[90]
    assert configs.W2_REGS["producer"] * 128 + configs.W2_REGS["consumer"] * 256 <= 65536
    assert configs.w1_smem_bytes(128) == (128 + 4 * 128) * 128 * 2 + 1024


#: (arguments of configs.hopper_config, what the ValueError says)
CONFIG_ERRORS = [
    (("w9", torch.float16, 64), {}, "variant"),
    (("w1", torch.float32, 64), {}, "dtype"),
    (("w1", torch.float16, 96), {}, "head dim"),
    (("w1", torch.float16, 64), dict(block_n=96), "block_n"),
    (("w2", torch.float16, 64), dict(stages=5), "stages"),
    (("w1", torch.float16, 64), dict(stages=3), "stages applies to W2"),
    (("w2", torch.float16, 128), dict(pv_split=False), "pv_split"),
    (("w3", torch.float16, 128), dict(pv_split=False), "W3 always splits"),
    (("w3", torch.float16, 64), dict(stages=1), "stages"),
    (("w2", torch.float16, 64), dict(consumers=3), "consumers must be 2, or 3 with variant 'w3' or 'w4', got 3 with 'w2'"),
    (("w4", torch.float16, 64), dict(consumers=4), "consumers must be 2.*got 4"),
    (("w4", torch.float16, 128), dict(consumers=3), "consumers=3 is built for head dim 64 only.*got D = 128"),
    (("w4", torch.float16, 64), dict(tma_store=True), r"tma_store is built for variant 'w3' only, got 'w4'"),
    (("w2", torch.float16, 64), dict(c3_turns=True), r"c3_turns is built for variant 'w3' or 'w4' only"),
    (("w3", torch.float16, 64), dict(c3_turns=True), r"c3_turns \(.*\) needs consumers=3; two consumers always take turns, got consumers=2"),
    (("w3", torch.float16, 64), dict(tree=True), r"unknown Hopper build option 'tree'; accepted: tma_store, c3_turns"),
    (("w1", torch.float16, 64), dict(uniform_wg=True), r"uniform_wg is built for variant 'w3' or 'w4' only, got 'w1'"),
    (("w3", torch.float16, 64), dict(tail_first=1), r"tail_first \(.*\) takes a bool, got 1"),
    (("w4", torch.float16, 64), dict(tail_first=True), r"tail_first is built for variant 'w3' only, got 'w4'"),
    # the options that lost their measurement are gone from the kernels (tag lab/options-2026-12)
    *[(("w3", torch.float16, 64), {name: True}, f"unknown Hopper build option '{name}'")
      for name in ("exp2_poly", "row_tree", "section_order", "heads_first", "pin_overlap", "pin_anchor",
                   "desc_step", "lazy_rescale", "named_handover", "static_schedule")],
]


@pytest.mark.parametrize("args,kwargs,match", CONFIG_ERRORS, ids=[m[:40] for _, _, m in CONFIG_ERRORS])
def test_config_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        configs.hopper_config(*args, **kwargs)


def test_only_w4_is_persistent():
    # only W4 keeps its blocks resident (the launch sizes its grid by the SM count and adds a counter)
    assert [v for v in configs.HOPPER_VARIANTS if configs.hopper_config(v, torch.float16, 64).persistent] == ["w4"]


def test_causal_alignments():
    assert hopper._causal_offset(False, 5, 9) == (False, 0)
    assert hopper._causal_offset(True, 5, 9) == (True, 0)
    assert hopper._causal_offset("top-left", 5, 9) == (True, 0)
    assert hopper._causal_offset("bottom-right", 5, 9) == (True, 4)
    assert hopper._causal_offset("bottom-right", 9, 5) == (True, -4)
    with pytest.raises(ValueError, match="causal"):
        hopper._causal_offset("diagonal", 5, 9)
    with pytest.raises(TypeError, match="causal"):
        hopper._causal_offset(0.5, 5, 9)


def test_input_errors():
    q = torch.randn(1, 4, 5, 64, dtype=torch.float16)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        hopper.forward_hopper(q, q.numpy(), q)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        hopper.forward_hopper(q, q[:, :3], q[:, :3])
    with pytest.raises(ValueError, match="same number of heads"):
        hopper.forward_hopper(q, q[:, :2], q[:, :1])
    with pytest.raises(ValueError, match="variant"):
        hopper.forward_hopper(q, q, q, variant="w9")
    # said before the machine is looked at (these tensors are on the CPU)
    with pytest.raises(ValueError, match="consumers must be 2, or 3 with variant 'w3' or 'w4', got 3 with 'w1'"):
        hopper.forward_hopper(q, q, q, consumers=3)
    with pytest.raises(ValueError, match=r"uniform_wg is built for variant 'w3' or 'w4' only, got 'w1'"):
        hopper.forward_hopper(q, q, q, uniform_wg=True)
    with pytest.raises(ValueError, match=r"tma_store .*got 1.5"):
        hopper.forward_hopper(q, q, q, variant="w3", tma_store=1.5)
    with pytest.raises(ValueError, match=r"unknown Hopper build option 'ctas_per_sm'"):
        hopper.forward_hopper(q, q, q, variant="w3", ctas_per_sm=2)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match=f"ctas .* positive int with variant 'w4', got {bad!r}"):
            hopper.forward_hopper(q, q, q, variant="w4", ctas=bad)
    with pytest.raises(ValueError, match="ctas .* with variant 'w4', got 3 with 'w3'"):
        hopper.forward_hopper(q, q, q, variant="w3", ctas=3)


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU message")
def test_no_gpu_is_a_runtime_error():
    q = torch.randn(1, 2, 5, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        hopper.forward_hopper(q, q[:, :1], q[:, :1])


def test_builds_for_sm90a(monkeypatch):
    calls = []

    def fake_get_function(source, kernel, defines=None, arch=None):
        calls.append((source, kernel, arch))
        raise RuntimeError("stop here")

    monkeypatch.setattr(hopper_launch, "get_function", fake_get_function)
    monkeypatch.setattr(hopper_launch, "max_smem_per_block", lambda index: 232448)
    monkeypatch.setattr(hopper_launch.torch.cuda, "device", lambda index: __import__("contextlib").nullcontext())
    hopper_launch._plan.cache_clear()
    with pytest.raises(RuntimeError, match="stop here"):
        hopper_launch._plan("w1", torch.float16, 128, 0, 128, True)
    assert calls == [("fwd_w1_wgmma.cu", "flash_fwd_w1", "90a")]
    hopper_launch._plan.cache_clear()


# ------------------------------------------------------------------ which forward cuda_attention runs

@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90, 100, 120])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("nvrtc", [None, (11, 8), (12, 0), (13, 0)], ids=str)
def test_auto_takes_wgmma_exactly_where_the_hopper_rungs_run(arch, dtype, D, nvrtc):
    choice = configs.choose_forward("auto", arch, dtype, D, nvrtc)
    runs_wgmma = arch == 90 and D in (64, 128) and nvrtc is not None and nvrtc >= (12, 0)
    if runs_wgmma:
        assert choice[:2] == ("wgmma", configs.HOPPER_DEFAULT)
        assert choice.consumers == (3 if D == 64 else 2)
    else:
        assert choice.kernel == "mma" and choice.variant == configs.fast_variant(D, arch)
        assert choice.reason  # says why wgmma was not taken
        expect = "sm_90" if arch != 90 else ("head dim" if D == 256 else "NVRTC")
        assert expect in choice.reason
    assert configs.choose_forward("mma", arch, dtype, D, nvrtc)[:2] == ("mma", configs.fast_variant(D, arch))


def test_asking_for_wgmma_where_it_cannot_run_says_why():
    assert configs.choose_forward("wgmma", 90, torch.bfloat16, 64, (12, 4))[:2] == ("wgmma", configs.HOPPER_DEFAULT)
    with pytest.raises(RuntimeError, match="sm_90 GPUs only.*sm_80.*forward_kernel='mma'"):
        configs.choose_forward("wgmma", 80, torch.float16, 128, (12, 4))
    with pytest.raises(ValueError, match="head dims 64 and 128.*D = 256"):
        configs.choose_forward("wgmma", 90, torch.float16, 256, (12, 4))
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        configs.choose_forward("wgmma", 90, torch.float32, 64, (12, 4))
    with pytest.raises(RuntimeError, match="NVRTC .*11, 8.*cupy-cuda12x"):
        configs.choose_forward("wgmma", 90, torch.float16, 64, (11, 8))
    with pytest.raises(ValueError, match="forward_kernel must be one of 'auto', 'mma', 'wgmma', got 'hopper'"):
        configs.choose_forward("hopper", 90, torch.float16, 64, (12, 4))
    with pytest.raises(TypeError, match="forward_kernel must be one of .*, got int 1"):
        configs.check_forward_kernel(1)


def test_forward_kernel_is_checked_before_the_machine():
    import flashtut

    q = torch.randn(1, 2, 5, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="forward_kernel"):
        flashtut.cuda_attention(q, q, q, forward_kernel="fastest")


def _dispatch(monkeypatch, arch, nvrtc=(12, 8)):
    """cuda_attention's autograd forward on CPU tensors with the GPU faked: which launch it makes, with what."""
    from flashtut.cuda import attention as ca

    calls = []

    def fake_hopper(q, k, v, causal, scale, variant="w1", diag_offset=0, block_n=128, pv_split=True,
                    stages=2, consumers=2, **options):
        assert options == configs.HOPPER_OPTIONS[q.shape[-1]]
        calls.append(("wgmma", f"{variant}c{consumers}", q.shape[-1], k.shape[1], causal, diag_offset))
        return torch.zeros_like(q), torch.zeros(q.shape[:3])

    def fake_mma(q, k, v, causal, scale, variant="v3", *rest, kv_group=None, diag_offset=0):
        calls.append(("mma", variant, q.shape[-1], k.shape[1], causal, diag_offset))
        return torch.zeros_like(q), torch.zeros(q.shape[:3])

    monkeypatch.setattr(ca, "capability", lambda device: divmod(arch, 10))
    monkeypatch.setattr(ca, "nvrtc_version", lambda: nvrtc)
    monkeypatch.setattr(ca, "max_smem_per_block", lambda device=None: configs.SMEM_PER_BLOCK.get(arch, 227 * 1024))
    monkeypatch.setattr(ca, "run_hopper", fake_hopper)
    monkeypatch.setattr(ca, "_forward", fake_mma)

    def run(D, alignment=None, dtype=torch.float16, Hkv=4, Nq=7, Nk=11, forward_kernel="auto"):
        q = torch.randn(2, 4, Nq, D).to(dtype)
        k, v = (torch.randn(2, Hkv, Nk, D).to(dtype) for _ in range(2))
        o = ca.CudaAttention.apply(q, k, v, alignment, 0.1, False, forward_kernel)
        assert o.shape == q.shape
        return calls.pop()
    return run


def test_cuda_attention_runs_the_hopper_forward_on_sm90(monkeypatch):
    # rung HOPPER_DEFAULT with two consumer warpgroups (ping-pong) at D = 128, three at D = 64
    # (configs.HOPPER_CONSUMERS)
    run = _dispatch(monkeypatch, 90)
    c2, c3 = f"{configs.HOPPER_DEFAULT}c2", f"{configs.HOPPER_DEFAULT}c3"
    assert run(128) == ("wgmma", c2, 128, 4, False, 0)
    assert run(40, dtype=torch.bfloat16) == ("wgmma", c3, 64, 4, False, 0)         # padded to 64
    assert run(64, "top-left", Hkv=2) == ("wgmma", c3, 64, 2, True, 0)             # grouped heads
    assert run(128, "bottom-right", Hkv=1, Nq=7, Nk=11) == ("wgmma", c2, 128, 1, True, 4)
    assert run(128, "bottom-right", Nq=11, Nk=7) == ("wgmma", c2, 128, 4, True, -4)
    assert run(256) == ("mma", "v3", 256, 4, False, 0)                               # no Hopper D = 256
    assert run(80)[:3] == ("mma", configs.fast_variant(96, 90), 96)                # nor the padded D = 96
    assert run(128, forward_kernel="mma") == ("mma", "v5", 128, 4, False, 0)
    assert run(64, "top-left", forward_kernel="wgmma") == ("wgmma", c3, 64, 4, True, 0)


@pytest.mark.parametrize("arch", [75, 80, 89, 100])
def test_cuda_attention_keeps_mma_elsewhere(monkeypatch, arch):
    run = _dispatch(monkeypatch, arch)
    assert run(128, "bottom-right", Hkv=2) == ("mma", configs.fast_variant(128, arch), 128, 2, True, 4)
    with pytest.raises(RuntimeError, match=f"sm_{arch}"):
        run(128, forward_kernel="wgmma")


def test_old_nvrtc_falls_back_on_sm90(monkeypatch):
    run = _dispatch(monkeypatch, 90, nvrtc=(11, 8))
    assert run(128)[:2] == ("mma", "v5")
    with pytest.raises(RuntimeError, match="NVRTC"):
        run(128, forward_kernel="wgmma")


# ------------------------------------------------------------------ GPU: correctness on sm_90

def reference(q, k, v, scale, causal, diag):
    """float64 output and lse with the kernel's masking; rows that see no key: o = 0, lse = -inf."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    Nq, Nk = s.shape[-2:]
    visible = torch.ones(Nq, Nk, dtype=torch.bool, device=s.device)
    if causal:
        i = torch.arange(Nq, device=s.device)[:, None]
        visible = torch.arange(Nk, device=s.device)[None, :] <= i + diag
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return p @ v, lse, visible.any(-1)


def torch_error(q, k, v, scale, causal, diag, ref, rows):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    mask = None
    if causal:
        Nq, Nk = q.shape[2], k.shape[2]
        mask = torch.arange(Nk, device=q.device)[None, :] <= torch.arange(Nq, device=q.device)[:, None] + diag
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return (out.double() - ref)[..., rows, :].abs().max().item()


GPU_CASES = [  # (B, H, Hkv, Nq, Nk, D, causal)
    (2, 3, 3, 200, 333, 64, False), (2, 3, 3, 333, 200, 128, False), (1, 2, 2, 257, 257, 128, True),
    (1, 4, 2, 130, 391, 64, True), (1, 2, 1, 1, 77, 128, False), (1, 2, 2, 300, 150, 64, "bottom-right"),
    (1, 2, 2, 150, 300, 128, "bottom-right"),
]


@pytest.mark.gpu
@pytest.mark.skipif(HAS_CUDA and not IS_SM90, reason="wgmma needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("block_n,pv_split", [(128, True), (128, False), (64, True)])
def test_w1_matches_the_reference(case, dtype, block_n, pv_split):
    B, H, Hkv, Nq, Nk, D, causal = case
    g = torch.Generator().manual_seed(Nq * 7 + Nk)
    q = torch.randn(B, H, Nq, D, generator=g).cuda().to(dtype)
    k = torch.randn(B, Hkv, Nk, D, generator=g).cuda().to(dtype)
    v = torch.randn(B, Hkv, Nk, D, generator=g).cuda().to(dtype)
    scale = 1.3 / math.sqrt(D)
    o, lse = hopper.forward_hopper(q, k, v, causal=causal, scale=scale, block_n=block_n, pv_split=pv_split)
    is_causal, diag = hopper._causal_offset(causal, Nq, Nk)
    ref, ref_lse, rows = reference(q, k, v, scale, is_causal, diag)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, H, Nq)
    err = (o.double() - ref).abs().max().item()
    t_err = torch_error(q, k, v, scale, is_causal, diag, ref, rows)
    assert math.isfinite(err) and err <= 2 * t_err + 1e-3, (err, t_err)
    assert torch.allclose(lse[..., rows].double(), ref_lse[..., rows], atol=2e-3, rtol=1e-3)
    if not rows.all():  # rows that see no key
        assert (o[..., ~rows, :] == 0).all() and torch.isneginf(lse[..., ~rows]).all()


@pytest.mark.gpu
@pytest.mark.skipif(IS_SM90, reason="checks the message on GPUs without wgmma")
def test_other_gpus_get_a_runtime_error():
    q = torch.randn(1, 1, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="sm_90"):
        hopper.forward_hopper(q, q, q)


@pytest.mark.gpu
@pytest.mark.skipif(HAS_CUDA and not IS_SM90, reason="wgmma needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [(2, 4, 2, 301, 451, 128, False), (1, 4, 4, 333, 200, 64, True),
                                  (2, 4, 1, 150, 300, 128, "bottom-right"), (1, 2, 2, 257, 130, 40, True)], ids=str)
def test_cuda_attention_runs_w3_on_sm90_and_its_gradients_pass(case, dtype):
    """The default forward on an H100/H200 is W3 (three consumer warpgroups where the head dim pads to
    64); forward and backward meet the yardstick with it and with the mma.sync forward."""
    import flashtut
    from flashtut.bench.accuracy import yardstick_tolerance
    from flashtut.cuda import attention as ca

    B, H, Hkv, Nq, Nk, D, causal = case
    g = torch.Generator().manual_seed(Nq + 3 * Nk + D)
    q = torch.randn(B, H, Nq, D, generator=g).cuda().to(dtype)
    k, v = (torch.randn(B, Hkv, Nk, D, generator=g).cuda().to(dtype) for _ in range(2))
    do = torch.randn(B, H, Nq, D, generator=g).cuda().to(dtype)
    assert tuple(ca.forward_kernel_for(q)[::3]) == ("wgmma", 3 if ca.padded_dim(D) == 64 else 2)
    assert ca.forward_kernel_for(q).variant == configs.HOPPER_DEFAULT
    scale = 0.9 / math.sqrt(D)
    is_causal, diag = hopper._causal_offset(causal, Nq, Nk)
    rep = H // Hkv
    # float64 reference with autograd, and PyTorch's own error in the input dtype (its yardstick)
    leaves64 = [x.double().requires_grad_() for x in (q, k, v)]
    ref, _, rows = reference(*leaves64, scale, is_causal, diag)
    ref.backward(do.double())
    low = [x.clone().requires_grad_() for x in (q, k, v)]
    s = (low[0] @ low[1].repeat_interleave(rep, 1).transpose(-1, -2)).float() * scale
    if is_causal:
        s = s.masked_fill(torch.arange(Nk, device="cuda")[None] > torch.arange(Nq, device="cuda")[:, None] + diag,
                          float("-inf"))
    o_low = torch.softmax(s, -1).to(dtype) @ low[2].repeat_interleave(rep, 1)
    o_low.backward(do)
    outs = {}
    for kernel in ("auto", "wgmma", "mma"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = flashtut.cuda_attention(*leaves, causal=causal, scale=scale, forward_kernel=kernel)
        o.backward(do)
        outs[kernel] = o
        for name, got, want, lp in [("o", o, ref, o_low)] + [
                (f"d{n}", x.grad, r.grad, y.grad) for n, x, r, y in zip("qkv", leaves, leaves64, low)]:
            err = (got.double() - want.detach()).abs().max().item()
            tol = yardstick_tolerance(dtype, (lp.detach().double() - want.detach()).abs().max().item())
            assert err <= tol, f"{kernel} {case} {name}: error {err:.3g} above {tol:.3g}"
    assert torch.equal(outs["auto"], outs["wgmma"])  # auto is the default rung here, bit for bit


# ------------------------------------------------------------------ GPU: rungs W2 and W3 (TMA, mbarriers, setmaxnreg)

TMA_SETTINGS = [(128, 2), (128, 3), (64, 4)]   # (block_n, stages)
#: W3's causal cases with 64-key tiles: blocks whose lower warpgroup reads fewer tiles than the upper one
#: and releases the rest in its idle turns; and blocks whose upper warpgroup has no row (rows past Nq)
W3_EXTRA_CASES = [(1, 2, 2, 190, 190, 128, True), (1, 2, 1, 64, 700, 64, "bottom-right"),
                  (2, 2, 2, 513, 1000, 64, False), (1, 1, 1, 129, 60, 128, "bottom-right")]
_TMA_HUNG: list = []   # ((variant, consumers, options label), dtype) whose child process timed out: the next one is skipped, not waited for


#: W4's cases with more query blocks than an H200 has SMs (132), so that blocks walk several at the default
#: grid too: causal of both alignments (the heaviest first), grouped heads, and not causal
W4_EXTRA_CASES = [(2, 8, 2, 1100, 1100, 128, True), (1, 16, 4, 2100, 1500, 64, "bottom-right"),
                  (3, 8, 8, 700, 900, 64, False)]
#: W4's grids besides the default (one block per SM): one block walking every query block, and five
W4_CTAS = (None, 1, 5)


#: (variant, consumers, build options) the GPU test runs: every TMA rung, and W3 (and W4) with each option
TMA_RUNS = [("w2", 2, {}), ("w3", 2, {}), ("w3", 3, {}), ("w4", 2, {}), ("w4", 3, {}),
            ("w3", 3, {"tma_store": True}), ("w3", 2, {"tma_store": True}),
            ("w3", 3, {"c3_turns": True}), ("w3", 3, {"c3_turns": True, "tma_store": True}),
            ("w4", 3, {"c3_turns": True}),
            ("w3", 3, {"c3_turns": True, "tail_first": True}), ("w3", 2, {"tail_first": True}),
            ("w3", 3, {"c3_turns": True, "uniform_wg": True}), ("w3", 2, {"tma_store": True, "uniform_wg": True}),
            ("w3", 3, {"c3_turns": True, "tail_first": True, "uniform_wg": True}),
            ("w4", 2, {"uniform_wg": True}), ("w4", 3, {"c3_turns": True, "uniform_wg": True})]



def _options_label(options: dict) -> str:
    return ",".join(f"{k}={int(v)}" for k, v in sorted(options.items())) or "plain"


def tma_cases(variant: str, consumers: int = 2) -> list:
    """The GPU cases a TMA rung runs: W3 and W4 add W3's extra causal cases, W4 its cases with many query
    blocks; three consumers take D = 64 only."""
    cases = GPU_CASES + (W3_EXTRA_CASES if variant in configs.W3_FAMILY else [])
    cases += W4_EXTRA_CASES if variant == "w4" else []
    return [c for c in cases if consumers == 2 or c[5] in configs.W3_WIDE["head_dims"]]


def tma_check(variant: str, dtype_name: str, consumers: int = 2, options: dict | None = None) -> None:
    """Every GPU case through TMA rung ``variant`` ("w2", "w3" or "w4", W3 and W4 with 2 or 3 consumer
    warpgroups and the build ``options`` of configs.W3_OPTIONS) at each of :data:`TMA_SETTINGS`,
    with W1's criteria; W4 at each grid of :data:`W4_CTAS`
    must also equal W3 bit for bit (the same arithmetic per query block, only the block that runs it
    differs). Run in a child process by the test below, so that a rung that never finishes (a lost
    mbarrier phase, a named barrier short of arrivals) or faults costs that process, not the session."""
    dtype, options = getattr(torch, dtype_name), options or {}
    for block_n, stages in TMA_SETTINGS:
        for case in tma_cases(variant, consumers):
            B, H, Hkv, Nq, Nk, D, causal = case
            cfg = configs.hopper_config(variant, dtype, D, block_n, stages=stages, consumers=consumers, **options)
            if cfg.dynamic_smem > configs.SMEM_PER_BLOCK[90]:
                continue
            g = torch.Generator().manual_seed(Nq * 7 + Nk)
            q = torch.randn(B, H, Nq, D, generator=g).cuda().to(dtype)
            k = torch.randn(B, Hkv, Nk, D, generator=g).cuda().to(dtype)
            v = torch.randn(B, Hkv, Nk, D, generator=g).cuda().to(dtype)
            scale = 1.3 / math.sqrt(D)
            is_causal, diag = hopper._causal_offset(causal, Nq, Nk)
            ref, ref_lse, rows = reference(q, k, v, scale, is_causal, diag)
            t_err = torch_error(q, k, v, scale, is_causal, diag, ref, rows)
            w1, _ = hopper.forward_hopper(q, k, v, causal=causal, scale=scale, block_n=block_n)
            run = functools.partial(hopper.forward_hopper, q, k, v, causal=causal, scale=scale, block_n=block_n,
                                    stages=stages, consumers=consumers, **options)
            # W3 with the same options, less those built for W4 alone (its schedule), and less those that
            # only change the order of the same arithmetic (the turns order the issue of the same products,
            # the pin the instructions of one slot): the same bits as without them
            w4_only = {k: False for k in options if "w3" not in configs.W3_OPTIONS[k][2]}
            order_only = {k: False for k in configs.W3_ORDER_ONLY if options.get(k)}
            w3 = run(variant="w3", **w4_only, **order_only)[0] if variant == "w4" or order_only else None
            for ctas in (W4_CTAS if variant == "w4" else (None,)):
                o, lse = run(variant=variant, **({} if ctas is None else {"ctas": ctas}))
                torch.cuda.synchronize()
                err = (o.double() - ref).abs().max().item()
                name = f"{variant.upper()} c{consumers} {_options_label(options)} n{block_n} s{stages} ctas {ctas} {dtype_name} {case}"
                assert math.isfinite(err) and err <= 2 * t_err + 1e-3, (name, err, t_err)
                assert torch.allclose(lse[..., rows].double(), ref_lse[..., rows], atol=2e-3, rtol=1e-3), name
                if not rows.all():
                    assert (o[..., ~rows, :] == 0).all() and torch.isneginf(lse[..., ~rows]).all(), name
                # W1's arithmetic per tile in the same order (W3 only moves the rescale of O after the P V
                # of the tile before, where W1 does it too): equal to rounding
                torch.testing.assert_close(o, w1, atol=2e-3, rtol=2e-3, msg=name)
                if w3 is not None:
                    assert torch.equal(o, w3), f"{name}: differs from W3 built without {_options_label(options)}"
                print("ok", name, f"error {err:.2e} (PyTorch {t_err:.2e})", flush=True)


@pytest.mark.gpu
@pytest.mark.skipif(HAS_CUDA and not IS_SM90, reason="TMA and wgmma need an sm_90 GPU")
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("variant,consumers,options", TMA_RUNS, ids=[f"{v}-c{c}-{_options_label(o)}" for v, c, o in TMA_RUNS])
def test_tma_rung_matches_the_reference_and_w1(variant, consumers, options, dtype_name):
    key = (variant, consumers, _options_label(options))
    hung = [d for v, d in _TMA_HUNG if v == key]
    if hung:
        pytest.skip(f"{variant.upper()} did not finish for {hung[0]}: not started again")
    here = Path(__file__).resolve().parent
    code = (f"import sys; sys.path[:0] = [{str(here)!r}]; import test_cuda_hopper as t; "
            f"t.tma_check({variant!r}, {dtype_name!r}, {consumers}, {options!r})")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    limit = 180 if variant == "w4" else 90   # W4 runs each case at three grids, with W3 beside it
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired as exc:
        _TMA_HUNG.append((key, dtype_name))
        pytest.fail(f"{variant.upper()} did not finish in {limit} s (a deadlock in its barriers?); output so far:\n"
                    f"{exc.stdout}")
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert res.stdout.count(f"ok {variant.upper()} c{consumers} {_options_label(options)} ") >= \
        len(tma_cases(variant, consumers)), \
        res.stdout


def test_the_default_hopper_rung_is_the_one_that_measured_fastest(monkeypatch):
    """``hopper-w3``, ``hopper-w3[c3]`` and W4's are in the ``hopper`` preset (launched as variant "w3"
    or "w4" with two or three consumers), and ``cuda_attention``'s forward on sm_90 is, per head dim, the build the committed
    H200 run (``hopper_h200.json``) found fastest at every protocol case, against every other Hopper rung
    and the mma.sync forward, with the build options that beat it in every case of their own runs."""
    from flashtut import results_data
    from flashtut.bench import registry, sweeps

    impls = {i.name: i for i in registry.expand(sweeps.PRESETS["hopper"]["impls"])}
    assert {"hopper-w2", "hopper-w3"} <= set(impls) and impls["hopper-w3"].group == "hopper"
    calls = []
    monkeypatch.setattr(hopper, "forward_hopper", lambda *a, **kw: calls.append(kw) or "o")
    q = torch.zeros(1, 1, 4, 64, dtype=torch.float16)
    assert impls["hopper-w3"].forward(q, q, q, True, 0.125) == "o"
    assert calls == [dict(causal=True, scale=0.125, variant="w3", block_n=128, pv_split=True)]
    assert impls["hopper-w3[c3]"].forward(q, q, q, False, 0.125) == "o"
    assert calls[1] == dict(causal=False, scale=0.125, variant="w3", block_n=128, pv_split=True, consumers=3)
    assert impls["hopper-w4[c3]"].forward(q, q, q, False, 0.125) == "o"
    assert calls[2] == dict(causal=False, scale=0.125, variant="w4", block_n=128, pv_split=True, consumers=3)
    default_impl = {}
    for dtype in (torch.float16, torch.bfloat16):
        for D in configs.HOPPER_HEAD_DIMS:
            for kernel in ("auto", "wgmma"):
                choice = configs.choose_forward(kernel, 90, dtype, D, (12, 8))
                assert (choice.variant, choice.consumers) == (configs.HOPPER_DEFAULT, configs.HOPPER_CONSUMERS[D])
            default_impl[D] = f"hopper-{choice.variant}" + ("[c3]" if choice.consumers == 3 else "")
    assert default_impl == {128: f"hopper-{configs.HOPPER_DEFAULT}", 64: f"hopper-{configs.HOPPER_DEFAULT}[c3]"}
    # each build option measured against that build (hopper_softmax_h200.json, hopper_options_h200.json) is
    # in HOPPER_OPTIONS at a head dim exactly when it was faster than the build without it in all 8 cases there
    from flashtut.bench.report import gains

    chosen = {D: set() for D in configs.HOPPER_HEAD_DIMS}
    for name, options, dims in (("hopper_softmax_h200.json", ("poly1", "poly2", "tree"), (64, 128)),
                                ("hopper_options_h200.json", ("order", "store"), (64, 128)),
                                ("hopper_turns_h200.json", ("turns",), (64,))):
        rows, _ = load_committed(name)
        for D, base in ((D, default_impl[D]) for D in dims):
            for option in options:
                impl = base[:-1] + f",{option}]" if base.endswith("]") else f"{base}[{option}]"
                by_case = gains(rows, impl, base)[D]
                assert len(by_case) == 8, (name, impl)
                if min(by_case.values()) > 0:
                    chosen[D].add(option)
    # options worth a percent or two, timed in alternated rounds against the build without them (hopper_ab
    # --pair): kept where no case's median falls below -PAIR_NOISE_PCT and some case's rises above it
    from flashtut.bench.paired import PAIR_NOISE_PCT, pair_gains

    for name, base, impl, D, option in (
            ("hopper_pair_uni_d64_h200.json", "hopper-w3[c3,turns]", "hopper-w3[c3,turns,uni]", 64, "uni"),
            ("hopper_pair_tail_d64_h200.json", "hopper-w3[c3,turns,uni]", "hopper-w3[c3,turns,tail,uni]", 64, "tail"),
            ("hopper_pair_uni_d128_h200.json", "hopper-w3[store]", "hopper-w3[store,uni]", 128, "uni")):
        rows, _ = load_committed(name)          # a run no chapter draws lives with its experiment
        by_case = [g for (d, *_), (g, _, n) in pair_gains(rows, base, impl).items() if d == D and n == 7]
        assert len(by_case) == 8, (name, impl)
        if min(by_case) > -PAIR_NOISE_PCT and max(by_case) > PAIR_NOISE_PCT:
            chosen[D].add(option)
    spelled = {"tma_store": "store", "c3_turns": "turns", "tail_first": "tail", "uniform_wg": "uni"}
    assert chosen == {D: {spelled[k] for k in configs.HOPPER_OPTIONS[D]} for D in chosen}
    rows, _ = results_data.load_results("hopper_h200.json")
    cases = {}
    for r in rows:
        if r["impl"].startswith(("hopper-", "cuda-mma")) and r.get("tflops"):
            cases.setdefault((r["dtype"], r["D"], r["N"], r["causal"]), {})[r["impl"]] = r["tflops"]
    assert len(cases) == 16
    for case, speeds in cases.items():
        assert max(speeds, key=speeds.get) == default_impl[case[1]], (case, speeds)


def test_the_order_only_options_are_w3_options():
    # the gpu tests build W3's reference without them; an unknown or W4-only name would break that quietly
    w3_takes = {name for name, (_, _, rungs, _) in configs.W3_OPTIONS.items() if "w3" in rungs}
    assert configs.W3_ORDER_ONLY and set(configs.W3_ORDER_ONLY) <= w3_takes
