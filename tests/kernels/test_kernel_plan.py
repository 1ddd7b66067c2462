"""``flashtut.cuda.kernel_plan``: which kernels and tiles cuda_attention runs for a GPU, dtype and head dim,
and the table of it in the book (CPU only)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import flashtut.cuda
from flashtut.cuda import configs

LAYOUT = Path(__file__).resolve().parents[2] / "book" / "code_layout.md"


def book_table() -> str:
    text = LAYOUT.read_text()
    m = re.search(r"<!-- kernel-plan:[^\n]*-->\n(.*?)<!-- /kernel-plan -->", text, re.S)
    assert m, f"{LAYOUT} has no kernel-plan table"
    return m.group(1)


def test_the_book_table_is_the_generated_one():
    assert book_table() == configs.plan_table(), "regenerate it: python -c 'from flashtut.cuda.configs " \
        "import plan_table; print(plan_table())'"


def test_a_changed_cell_is_caught():
    table = configs.plan_table()
    assert table.replace("fwd_w3_pingpong.cu", "fwd_w4_persistent.cu", 1) != table
    assert table.count("\n") == 2 + 4 + 2 * 5 + 2 * 5   # header, T4 (fp16, 4 dims), A100 and H100 (2 x 5)


def test_the_plan_names_the_kernel_that_ships():
    h100 = flashtut.cuda.kernel_plan((9, 0), torch.float16, 64)
    assert (h100.choice.kernel, h100.forward.source, h100.forward.kernel) == ("wgmma", "fwd_w3_pingpong.cu",
                                                                             "flash_fwd_w3")
    assert h100.forward.block_m == 192 and h100.choice.options == tuple(sorted(configs.HOPPER_OPTIONS[64].items()))
    assert h100.backward.dq_atomic and "dq_convert" in h100.backward_kernels
    # 40 is padded to 64; the deterministic backward takes the separate dQ pass
    det = flashtut.cuda.kernel_plan((9, 0), torch.bfloat16, 40, deterministic=True)
    assert det.padded_dim == 64 and not det.backward.dq_atomic and "dq" in det.backward_kernels
    assert det.forward.define_dict["FT_BF16"] == 1
    # no wgmma without an NVRTC for sm_90a, nor at D = 96, nor on an A100
    assert flashtut.cuda.kernel_plan((9, 0), torch.float16, 64, nvrtc_version=(11, 8)).choice.kernel == "mma"
    assert flashtut.cuda.kernel_plan((9, 0), torch.float16, 96).forward.source == "fwd_v4_fa2.cu"
    a100 = flashtut.cuda.kernel_plan((8, 0), torch.float16, 128)
    assert (a100.choice.kernel, a100.choice.variant) == ("mma", configs.fast_variant(128, 80))
    t4 = flashtut.cuda.kernel_plan((7, 5), torch.float16, 128)
    assert t4.choice.variant == "v3" and t4.forward.define_dict["V3_STAGES"] == 1 and t4.backward.stages == 1
    # the same function the runtime asks: the forward it names is configs.choose_forward's
    for cap, d in (((9, 0), 128), ((8, 0), 64), ((7, 5), 32)):
        plan = flashtut.cuda.kernel_plan(cap, torch.float16, d)
        assert plan.choice == configs.choose_forward("auto", 10 * cap[0] + cap[1], torch.float16, d,
                                                     configs.HOPPER_NVRTC)


@pytest.mark.parametrize("args,kwargs,error,match", [
    (("9.0", torch.float16, 64), {}, TypeError, "capability must be a \\(major, minor\\) tuple"),
    (((6, 1), torch.float16, 64), {"smem_limit": 49152}, ValueError, "capability must be \\(7, 5\\) or newer"),
    (((8, 7), torch.float16, 64), {}, ValueError, "no shared-memory entry"),
    (((9, 0), torch.float32, 64), {}, ValueError, "dtype must be torch.float16 or torch.bfloat16"),
    (((7, 5), torch.bfloat16, 64), {}, ValueError, "bfloat16 needs capability \\(8, 0\\)"),
    (((9, 0), torch.float16, 100), {}, ValueError, "head_dim must be a positive multiple of 8"),
    (((7, 5), torch.float16, 256), {}, ValueError, "head_dim .* up to 128 on capability"),
    (((9, 0), torch.float16, 64.0), {}, TypeError, "head_dim must be an int"),
    (((9, 0), torch.float16, 64), {"forward_kernel": "fast"}, ValueError, "forward_kernel must be one of"),
    (((8, 0), torch.float16, 64), {"forward_kernel": "wgmma"}, RuntimeError, "sm_90 GPUs only"),
    (((9, 0), torch.float16, 64), {"backward_kernel": "fast"}, ValueError, "backward_kernel must be one of"),
    (((9, 0), torch.float16, 64), {"backward_kernel": 1}, TypeError, "backward_kernel must be one of"),
    (((8, 0), torch.float16, 64), {"backward_kernel": "wgmma"}, RuntimeError, "backward_kernel='wgmma'.*sm_90"),
    (((9, 0), torch.float16, 32), {"backward_kernel": "wgmma"}, ValueError, "backward_kernel='wgmma'.*head dims"),
    (((9, 0), torch.float16, 64), {"backward_kernel": "wgmma", "nvrtc_version": (11, 8)}, RuntimeError,
     "backward_kernel='wgmma'.*NVRTC"),
    (((9, 0), torch.float16, 64), {"forward_kernel": 1}, TypeError, "forward_kernel must be one of"),
    (((9, 0), torch.float16, 64), {"deterministic": "no"}, TypeError, "deterministic must be True or False"),
    (((9, 0), torch.float16, 64), {"smem_limit": 49152.0}, TypeError, "smem_limit must be an int"),
    (((9, 0), torch.float16, 64), {"smem_limit": 0}, ValueError, "smem_limit must be at least 1"),
])
def test_errors_name_the_argument(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        flashtut.cuda.kernel_plan(*args, **kwargs)
