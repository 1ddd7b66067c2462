"""tiled_attention never materialises the N x N matrix; `import flashtut` needs no triton or cupy."""
import subprocess
import sys
import textwrap

import pytest

MEASURE = textwrap.dedent("""
    import sys, torch, flashtut
    from flashtut.bench.memory import peak_extra_memory
    torch.set_num_threads(2)
    N, D, mode = int(sys.argv[1]), 64, sys.argv[2]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, N, D, generator=g) for _ in range(3))
    # warm up allocator and kernels at a small size so their one-off cost is not counted
    flashtut.tiled_attention(q[:, :, :512], k[:, :, :512], v[:, :, :512], block_m=256, block_n=256)
    if mode == "tiled":
        # 512 x 512 tiles: 1 MiB of scores each, 256 tile steps (smaller tiles only cost time)
        fn = lambda: flashtut.tiled_attention(q, k, v, block_m=512, block_n=512)
    else:
        fn = lambda: flashtut.naive_attention(q, k, v)
    # the benchmark's measurement: the resident-set high-water mark, reset just before fn runs
    print(peak_extra_memory(fn, "cpu") / 2**20)
""")


def peak_growth_mib(n: int, mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(n), mode], capture_output=True, text=True,
                         timeout=600, check=True)
    return float(out.stdout.split()[-1])


def test_tiled_attention_memory_stays_small_at_8k():
    # N = 8192, a quarter of the arithmetic of 16384: one score matrix is four times the bound, so any
    # N x N tensor, or a quarter of one, fails
    n = 8192
    score_matrix_mib = n * n * 4 / 2**20          # one fp32 score matrix: 256 MiB
    grown = peak_growth_mib(n, "tiled")
    print(f"tiled_attention N={n}: peak RSS grew by {grown:.1f} MiB "
          f"(one fp32 {n}x{n} score matrix would be {score_matrix_mib:.0f} MiB)")
    assert grown < score_matrix_mib / 4


def test_naive_attention_memory_grows_with_n_squared():
    # the contrast that makes the test above meaningful: the same probe sees naive's N x N matrices
    n = 4096
    grown = peak_growth_mib(n, "naive")
    print(f"naive_attention N={n}: peak RSS grew by {grown:.1f} MiB")
    assert grown > n * n * 4 / 2**20  # at least one fp32 score matrix (64 MiB)


def test_import_without_triton_or_cupy():
    code = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None   # make `import triton` fail, as on a laptop without it
        sys.modules["cupy"] = None
        import torch, flashtut
        q = torch.randn(1, 2, 17, 64)
        o = flashtut.tiled_attention(q, q, q)
        assert "triton" not in sys.modules or sys.modules["triton"] is None
        # arguments each kernel accepts, so that what is missing is the package or the GPU
        for fn, x in ((flashtut.triton_attention, q), (flashtut.cuda_attention, q.half())):
            try:
                fn(x, x, x)
            except RuntimeError as e:
                print(type(e).__name__, e)
            else:
                raise SystemExit(f"{fn.__name__} ran without its package")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("RuntimeError") and "pip install triton" in lines[0]
    # the CUDA path names the first thing missing: the GPU on this machine, else CuPy
    assert lines[1].startswith("RuntimeError") and ("pip install cupy" in lines[1] or "CUDA GPU" in lines[1])
