"""flashtut.bench.sass: instruction counts of compiled kernels, on the CPU.

The parsing runs on made-up cuobjdump text; the whole path (a library's text listing, disassembly by
function name, a Triton-style cache folder) runs on small binaries built here with nvcc, so it needs
nvcc and a cuobjdump (the one in Triton's wheel will do) but no GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from flashtut.bench import cli, results, sass

SASS_TEXT = """
	code for sm_90
		Function : kernel_a
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;             /* 0x00000a00ff017b82 */
                                                                      /* 0x000fe20000000800 */
        /*0010*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ, !UPT ;  /* 0x0 */
        /*0020*/              @!P0 HGMMA.64x128x16.F32 R24, gdesc[UR8], R24 ;   /* 0x0 */
        /*0030*/              @UP1 LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;  /* 0x0 */
        /*0040*/                   WARPGROUP.ARRIVE ;  /* 0x0 */
        /*0050*/                   NOP;  /* 0x0 */
		Function : kernel_b
        /*0000*/                   HMMA.16816.F32 R4, R8, R12, R4 ;  /* 0x0 */
        /*0010*/                   LDSM.16.M88.4 R8, [R2] ;  /* 0x0 */
        /*0020*/                   EXIT ;  /* 0x0 */
	code for sm_90
		Function : kernel_a
        /*0000*/                   EXIT ;  /* 0x0 */
"""


def test_split_and_count():
    funcs = sass.split_functions(SASS_TEXT)
    assert list(funcs) == ["kernel_a", "kernel_b"] and len(funcs["kernel_a"]) == 6  # the second copy is dropped
    a = sass.count_row(funcs["kernel_a"])
    assert a["counts"]["HGMMA"] == 2 and a["counts"]["LDGSTS"] == 1 and a["counts"]["WARPGROUP"] == 1
    assert a["counts"]["HMMA"] == 0 and a["instructions"] == 5                      # NOP not counted
    b = sass.count_row(funcs["kernel_b"])
    assert (b["counts"]["HMMA"], b["counts"]["LDSM"], b["counts"]["HGMMA"], b["instructions"]) == (1, 1, 0, 3)
    assert set(a["counts"]) == set(sass.KEY_OPCODES)



def _listing(ops: list[str]) -> list[str]:
    """A function's instruction lines as split_functions gives them, 16 bytes apart from 0."""
    return [f"        /*{16 * i:04x}*/                   {op} ;  /* 0x0 */" for i, op in enumerate(ops)]


def test_pipelined_loop_is_the_shortest_backward_range_holding_one_slot():
    assert [sass.slot_hgmma(*a) for a in ((64, 128), (128, 128), (64, 64))] == [12, 24, 8]
    # a prologue, the slot's loop (4 + 8 HGMMA at D = 64, its wait's retry branching far below), an outer
    # loop round it (the same 12 HGMMA in a longer range), the epilogue, and the retry block after the
    # function's end jumping back into the loop (longer ranges again)
    ops = ["MOV R1, R2"] * 3
    loop_start = len(ops)
    ops += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3", "@!P0 BRA 0x0500"]  # wait; its retry far below
    ops += ["HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ"] * 4 + ["MUFU.EX2 R5, R6"] * 3
    ops += ["HGMMA.64x64x16.F32 R88, R40, gdesc[UR12], R88"] * 8 + ["R2UR UR12, R7", "IADD3 R9, R9, 0x1, RZ"]
    ops += [f"@P1 BRA {16 * loop_start:#06x}"]
    end_loop = len(ops)
    ops += ["@P2 BRA 0x0000", "EXIT"]
    while len(ops) < 0x50:
        ops.append("NOP")
    ops += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3", f"@!P0 BRA {16 * (loop_start + 1):#06x}",
            f"BRA {16 * (loop_start + 2):#06x}"]
    lines = _listing(ops)
    loop = sass.pipelined_loop(lines, 64)
    assert loop == lines[loop_start:end_loop]
    assert sass.opcode_histogram(loop)["R2UR"] == 1 and sass.opcode_histogram(loop)["HGMMA"] == 12
    assert sass.pipelined_loop(lines, 128) == []                      # no range holds 24
    assert sass.pipelined_loop(lines[:loop_start + 5], 64) == []      # no backward branch


def test_flash_kernel_names_pick_the_head_dim_dtype_and_arch():
    base = "_ZN13pytorch_flash16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi{d}ELi128ELi64ELi4ELb0ELb0EN7cutlass{t}EELb0ELb{c}EEEvNS_16Flash_fwd_paramsE"
    names = [base.format(d=d, t=t, c=c) for d in (64, 128) for t in ("6half_t", "10bfloat16_t") for c in (0, 1)]
    split = "_ZN13pytorch_flash24flash_fwd_splitkv_kernelI23Flash_fwd_kernel_traitsILi128EN7cutlass6half_tEEEvv"
    listing = "\n".join(f"SASS text section {i} : x-{n}.{sm}.elf.bin"
                        for i, (n, sm) in enumerate([(n, sm) for sm in ("sm_80", "sm_90") for n in names + [split]]))
    got = sass.flash_kernel_names(listing, "sm_90", 128, "half_t")
    assert got == [base.format(d=128, t="6half_t", c=c) for c in (0, 1)]
    assert len(sass.flash_kernel_names(listing, "sm_90", 64, "bfloat16_t")) == 2
    assert sass.flash_kernel_names(listing, "sm_100", 128) == []
    assert len(sass.flash_kernel_names(listing, "sm_90", None, None)) == 8   # no filter: every flash forward


def test_speed_rows_are_tagged_with_their_setting_and_ratio():
    case = dict(mode="fwd", dtype="float16", B=4, H=16, N=4096, D=128, causal=False, status="ok")
    rows = [dict(case, impl="sdpa-flash", ms=2.0, tflops=1.0), dict(case, impl="triton", ms=1.0, tflops=2.0)]
    default = sass.tag_speed_rows(rows, "default")
    assert [r["impl"] for r in default] == ["sdpa-flash", "triton"]
    assert default[1]["speedup_vs_sdpa_flash"] == 2.0 and default[0]["setting"] == "default"
    off = sass.tag_speed_rows(rows, "DISABLE_MMA_V3=1")
    assert [r["impl"] for r in off] == ["sdpa-flash[DISABLE_MMA_V3=1]", "triton[DISABLE_MMA_V3=1]"]
    keys = {results.measurement_key(r) for r in default + off}
    assert len(keys) == 4   # the two processes' rows stay four measurements


def test_sass_rows_in_the_results_format(tmp_path):
    ok = {"kind": "sass", "impl": "triton", "kernel": "attn_fwd_kernel", "counts": {"HGMMA": 12, "HMMA": 0}}
    assert results.check_row(ok) is None
    assert "counts" in results.check_row(dict(ok, counts={"HGMMA": -1}))
    assert "counts" in results.check_row(dict(ok, counts={}))
    assert results.check_row(dict(sass.error_row("sdpa-flash", "default", OSError("no lib")))) is None
    assert "kernel" in results.check_row(dict(ok, kernel=None))
    speed = {"kind": "speed", "impl": "triton", "mode": "fwd", "B": 1, "H": 1, "N": 8, "D": 64, "dtype": "float16",
             "tflops": 1.0}
    path = results.save_results(tmp_path / "s.json", "sass", [ok, speed], {"date": "x"})
    doc = results.load_results(path)
    assert [r["kind"] for r in doc["rows"]] == ["sass", "speed"]


def test_setting_arguments(tmp_path):
    a, x = tmp_path / "a", tmp_path / "x.json"
    a.mkdir()
    x.write_text("{}")
    assert cli._setting_path(f"DISABLE_MMA_V3=1={a}") == ("DISABLE_MMA_V3=1", str(a))
    assert cli._setting_path(f"default={x}") == ("default", str(x))
    with pytest.raises(Exception, match="SETTING=PATH"):
        cli._setting_path("nothing")
    with pytest.raises(Exception, match="triton, cuda, sdpa"):
        cli._sass_parts("triton,ptx")


# ------------------------------------------------------------------------------- with real binaries

NVCC = shutil.which("nvcc")
CUOBJDUMP = sass.find_cuobjdump()
needs_tools = pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="needs nvcc and cuobjdump")

LIBRARY_SOURCE = r"""
namespace cutlass { struct half_t { unsigned short x; }; struct bfloat16_t { unsigned short x; }; }
template <int D, int N, typename T> struct Traits {};
namespace pytorch_flash {
template <typename K, bool Causal> __global__ void flash_fwd_kernel(float* c, const unsigned* a, const unsigned* b) {
    float d[4] = {c[0], c[1], c[2], c[3]};
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
    for (int i = 0; i < 4; ++i) c[i] = Causal ? -d[i] : d[i];
}
template <typename K> __global__ void flash_fwd_splitkv_kernel(float* c) { c[0] = 1; }
template __global__ void flash_fwd_kernel<Traits<128, 64, cutlass::half_t>, false>(float*, const unsigned*, const unsigned*);
template __global__ void flash_fwd_kernel<Traits<128, 64, cutlass::half_t>, true>(float*, const unsigned*, const unsigned*);
template __global__ void flash_fwd_kernel<Traits<64, 64, cutlass::half_t>, true>(float*, const unsigned*, const unsigned*);
template __global__ void flash_fwd_kernel<Traits<128, 64, cutlass::bfloat16_t>, true>(float*, const unsigned*, const unsigned*);
template __global__ void flash_fwd_splitkv_kernel<Traits<128, 64, cutlass::half_t>>(float*);
}
__global__ void unrelated(float* c) { c[0] = 2; }
"""


@pytest.fixture(scope="module")
def fake_torch_library(tmp_path_factory):
    d = tmp_path_factory.mktemp("lib")
    (d / "lib.cu").write_text(LIBRARY_SOURCE)
    lib = d / "libfake_cuda.so"
    res = subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", "-gencode=arch=compute_80,code=sm_80",
                          "-gencode=arch=compute_90,code=sm_90", "-o", str(lib), str(d / "lib.cu")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return lib


@needs_tools
def test_sdpa_flash_rows_read_the_library_by_name(fake_torch_library):
    rows = sass.sdpa_flash_rows(CUOBJDUMP, fake_torch_library, "sm_90", 128, "half_t")
    assert len(rows) == 2   # the two D = 128 float16 instantiations; not D = 64, bf16, split-KV or others
    for r in rows:
        assert r["impl"] == "sdpa-flash" and r["arch"] == "sm_90" and r["binary"] == "libfake_cuda.so"
        assert r["counts"]["HMMA"] >= 1 and r["counts"]["HGMMA"] == 0
        assert "flash_fwd_kernel" in r["kernel"] and results.check_row(r) is None
    with pytest.raises(RuntimeError, match="architectures in it: \\['sm_80', 'sm_90'\\]"):
        sass.sdpa_flash_rows(CUOBJDUMP, fake_torch_library, "sm_100", 128, "half_t")


@needs_tools
def test_triton_cache_rows_read_each_cubin_and_its_metadata(tmp_path, fake_torch_library):
    entry = tmp_path / "cache" / "ABCDEF0123456789XYZ"
    entry.mkdir(parents=True)
    res = subprocess.run([NVCC, "-cubin", "-gencode=arch=compute_90,code=sm_90", "-o", str(entry / "attn_fwd_kernel.cubin"),
                          "-x", "cu", "-"], input=LIBRARY_SOURCE, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    (entry / "attn_fwd_kernel.json").write_text(json.dumps({"name": "attn_fwd_kernel", "num_warps": 8,
                                                            "num_stages": 3, "shared": 1024, "target": {"arch": 90}}))
    rows = sass.triton_cache_rows(tmp_path / "cache", CUOBJDUMP, "DISABLE_MMA_V3=1")
    assert len(rows) == 6   # every function of the cubin
    assert {r["setting"] for r in rows} == {"DISABLE_MMA_V3=1"} and {r["arch"] for r in rows} == {"sm_90"}
    assert rows[0]["launch"] == {"num_warps": 8, "num_stages": 3, "shared": 1024}
    assert rows[0]["binary"] == "triton cache ABCDEF0123456789"
    assert sum(r["counts"]["HMMA"] for r in rows) >= 4


@needs_tools
def test_dump_sass_tries_each_cuobjdump_until_one_reads_the_binary(tmp_path):
    cubin = tmp_path / "k.cubin"
    res = subprocess.run([NVCC, "-cubin", "-gencode=arch=compute_90,code=sm_90", "-o", str(cubin), "-x", "cu", "-"],
                         input=LIBRARY_SOURCE, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    old = tmp_path / "old_cuobjdump"     # a toolkit's cuobjdump older than the NVRTC that built the cubin
    old.write_text("#!/bin/sh\necho \"cuobjdump info    : File does not contain device code\" >&2\nexit 255\n")
    old.chmod(0o755)
    text = sass.dump_sass(cubin, [str(old), CUOBJDUMP])
    assert "flash_fwd_kernel" in text and "HMMA" in text
    with pytest.raises(RuntimeError, match="does not contain device code"):
        sass.dump_sass(cubin, [str(old)])
    with pytest.raises(RuntimeError, match="cuobjdump not found"):
        sass.dump_sass(cubin, [])
    assert CUOBJDUMP in sass.cuobjdump_candidates()
    assert len(set(map(os.path.realpath, sass.cuobjdump_candidates()))) == len(sass.cuobjdump_candidates())


def test_sass_and_setting_tables_summarise_a_results_file():
    from flashtut.bench.report import sass_table, setting_table

    counts = lambda hg, hm: {"HGMMA": hg, "HMMA": hm, "LDSM": 8, "LDGSTS": 48, "UTMALDG": 0, "USETMAXREG": 0}
    rows = [dict(kind="sass", impl="sdpa-flash", setting="default", kernel="void ns::flash_fwd_kernel<A, 1>(P)",
                 counts=counts(0, 256)),
            dict(kind="sass", impl="sdpa-flash", setting="default", kernel="void ns::flash_fwd_kernel<B, 2>(P)",
                 counts=counts(0, 1024)),
            dict(kind="sass", impl="triton", setting="default", kernel="attn_fwd_kernel", counts=counts(24, 0)),
            dict(kind="sass", impl="cuda", setting="default", kernel="?", counts={}, status="error", error="x"),
            dict(kind="speed", impl="triton", setting="default", mode="fwd", N=4096, causal=False, tflops=476.0,
                 speedup_vs_sdpa_flash=1.4),
            dict(kind="speed", impl="triton[DISABLE_MMA_V3=1]", setting="DISABLE_MMA_V3=1", mode="fwd", N=4096,
                 causal=False, tflops=273.0, speedup_vs_sdpa_flash=0.77),
            dict(kind="speed", impl="sdpa-flash", setting="default", mode="fwd", N=4096, causal=False, tflops=340.0)]
    table = sass_table(rows).splitlines()
    assert len(table) == 4                              # header, rule, one line per (impl, setting, kernel)
    assert "| ns::flash_fwd_kernel" in table[2] and "| 2 " in table[2] and "256-1024" in table[2]
    assert "attn_fwd_kernel" in table[3] and "| 24 " in table[3]
    ablation = setting_table(rows).splitlines()
    assert "triton default" in ablation[0] and "DISABLE_MMA_V3=1" in ablation[0]
    assert ablation[2].replace(" ", "") == "|fwd|4096|no|476(1.40)|273(0.77)|"
