"""``flashtut.bench``: measure attention implementations side by side.

Command line (``python -m flashtut.bench --help``; each subcommand has its own ``--help``)::

    python -m flashtut.bench list                          # implementations, and why any cannot run here
    python -m flashtut.bench run                           # the default sweep for this device
    python -m flashtut.bench run --preset protocol --impl sdpa-flash,triton --out results.json
    python -m flashtut.bench run --impl naive,tiled -N 200,333 -D 64 --heads 2 --batch 1 --dtype float32
    python -m flashtut.bench memory --out memory.json      # peak extra memory against N
    python -m flashtut.bench roofline --out roofline.json  # copy bandwidth and matmul TFLOP/s
    python -m flashtut.bench host --out host.json          # host time per call at a tiny size (GPU)
    python -m flashtut.bench decode --out decode.json      # decode over a KV cache vs the bandwidth
    python -m flashtut.figures plot results.json memory.json --out-dir figures/   # drawn one layer up

``run`` checks every implementation against a reference before timing it (float64 on the CPU,
float32 on a slice of the batch and heads on a GPU) and records its errors next to those of
PyTorch's own low-precision attention; a result that is wrong is marked ``failed`` and not timed.
Timing is the median of repeats with warm-up excluded: ``triton.testing.do_bench`` (CUDA
events, L2 flushed) on a GPU, ``time.perf_counter`` on the CPU. Backward times exclude the
forward. TFLOP/s use the protocol's counts (``flops.attention_flops``). Presets:
``protocol`` is the book's performance protocol (16k tokens, hidden 2048, D 64 and 128, N 512..16384,
causal and not, float16 and bfloat16, forward and backward), ``cpu`` a scaled-down version
(the default without a GPU), ``smoke`` a seconds-long check; the kernel chapters' runs are
``triton-autotune``, ``triton-sweep``, ``cuda-ladder`` and ``cuda-tiles`` (each with its own
implementations). Options given next to a preset replace its values.

Implementations (``registry``): ``naive``, ``tiled`` (refused above 1024 tiles unless
``--force``: it is a Python loop), ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``,
``sdpa-math`` (GPU only), ``triton``, ``cuda``, and the CUDA forward ladder ``cuda-v1``,
``cuda-v2``, ... found in ``flashtut.cuda.VARIANTS``, the fast kernel at other tile shapes
``cuda-v3[wW,nN,mtM]``; groups ``all``, ``sdpa``, ``cuda-ladder``, ``cuda-tiles``.
One that cannot run here (no GPU, no triton or cupy, an unsupported dtype) gets a row that says
why instead of stopping the sweep; so does one that runs out of memory (``oom``).

Every JSON file carries provenance: device name and compute capability, versions of Python,
torch, CUDA, cuDNN, triton, cupy and numpy, the date, the command line and the git commit
(no hostname). The exit status is 1 when any result failed its check or raised an unexpected
error, 2 for bad arguments, else 0.

From Python (for notebooks)::

    from flashtut import bench
    rows = bench.run_speed(["naive", "tiled"], bench.protocol_cases(512, [128, 256], [64], ["float32"], heads=2))
    print(bench.report.speed_table(rows))
    fig = flashtut.figures.bench_plots.speed_figure(rows, D=64, mode="fwd")   # figures draw; bench measures
    bench.peak_extra_memory(lambda: flashtut.naive_attention(q, k, v), q.device)   # bytes, None = OOM
"""
from __future__ import annotations

from . import registry, report
from ..costs.flops import attention_flops, tflops
from .host import run_host
from .memory import peak_extra_memory
from .provenance import collect as provenance
from .results import load_results, load_rows, save_results
from .roofline import run_roofline
from .sweeps import (MEMORY_PRESETS, PRESETS, Case, make_inputs, preset_cases, protocol_cases, run_memory,
                     run_speed)
from .timing import time_fn

__all__ = ["run_speed", "run_memory", "run_roofline", "run_host", "Case", "protocol_cases", "preset_cases", "PRESETS",
           "MEMORY_PRESETS", "make_inputs", "attention_flops", "tflops", "peak_extra_memory", "time_fn",
           "provenance", "save_results", "load_results", "load_rows", "registry", "report"]

