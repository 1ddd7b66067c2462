"""The committed measurements in ``book/data``: find them, load them, say how to make them again.

A chapter without a GPU draws its figures from JSON files measured once on a GPU and committed
with their provenance (``book/data/README.md`` lists them). This module is how every chapter gets
at them::

    from flashtut import results_data
    rows, provenance = results_data.load_results("bench_h200*.json")   # every matching file
    for p in provenance:
        print(results_data.describe(p))                               # device, versions, command

Where a name is looked up, in order:

1. ``data_dir=`` when given (a reader's own run, a test's temporary folder), and only there;
2. ``$FLASHTUT_DATA`` when set, and only there;
3. the ``book/data`` folder of the checkout this package was installed from (editable install),
   else of the working directory or one of its parents;
4. with no ``book/data`` folder anywhere (``pip install`` on Colab): the repository itself, read
   from the URL and branch of the book's ``_config.yml``, downloaded once into ``~/.cache/flashtut/data``.

A file that is not there raises :class:`ResultsMissing` (a ``FileNotFoundError``) whose message
names the file and the command that produces it; ``missing="print"`` prints that message and
returns empty lists instead, so a notebook cell can go on without the data.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import torch

from .bench import results as _results
from .bench.roofline import ceilings_from_rows, measure_roofline

DATA_ENV = "FLASHTUT_DATA"
#: the folder of the committed results, relative to the repository root
REPO_DATA_DIR = "book/data"

#: what each committed file (or family of files) holds and the command that makes it again, run on
#: a GPU from the repository root; book/data/README.md repeats these (a test keeps them in step).
#: Specific names come first: ``producer()`` answers with the first entry that matches. The
#: H200 files were measured with ``FLASHTUT_TRITON_AUTOTUNE=0`` (Triton's first configuration;
#: tools/gpu_check.sh sets it), which the files' provenance does not record, so it is written here.
#: Files measured before the harness had a preset for them (the kernel chapters' runs, the host
#: time) were converted to this format once by ``python tools/convert_results.py``; their
#: provenance keeps the command that measured them, and the command here measures them again.
_SWEEP = ("FLASHTUT_TRITON_AUTOTUNE=0 python -m flashtut.bench run --preset protocol --warmup-ms 5 "
          "--rep-ms 25")
_IMPLS = "naive,tiled,sdpa-flash,sdpa-cudnn,sdpa-efficient,triton,cuda,cuda-ladder"
PRODUCERS = {
    "bench_h200_kernels.json": (
        "our Triton and CUDA kernels and SDPA flash, D 64 and 128, N 4096 and 16384, both dtypes and "
        "masks, forward and backward (the first H200 measurement; chapters 07 and 08, the perf logs)",
        "FLASHTUT_TRITON_AUTOTUNE=0 python -m flashtut.bench run --impl triton,cuda,sdpa-flash -D 128,64 "
        "-N 4096,16384 --dtype float16,bfloat16 --causal both --mode fwd,bwd --tokens 16384 --hidden 2048 "
        "--warmup-ms 5 --rep-ms 40 --out book/data/bench_h200_kernels.json"),
    **{f"bench_h200_protocol_d{D}_{dt}.json": (
        f"the protocol sweep at D={D}, {dt}: every implementation (tiled up to N=2048), the CUDA ladder, "
        "forward and backward, causal and not, in one process",
        f"{_SWEEP} -D {D} --dtype {dt} --causal both --impl {_IMPLS} "
        f"--out book/data/bench_h200_protocol_d{D}_{dt}.json")
       for D in (128, 64) for dt in ("float16", "bfloat16")},
    "bench_h200*.json": ("speed rows of every implementation over the performance protocol (all the "
                         "files above; the whole protocol again, in one file, with this command)",
                         "python -m flashtut.bench run --preset protocol --out book/data/bench_h200.json"),
    "memory_h200.json": ("peak extra memory of one forward against N",
                         "FLASHTUT_TRITON_AUTOTUNE=0 python -m flashtut.bench memory --preset protocol "
                         "--impl naive,sdpa-flash,triton,cuda --out book/data/memory_h200.json"),
    "h200_roofline.json": ("copy bandwidth and matrix-multiply rates",
                           "python -m flashtut.bench roofline --dtype float16,bfloat16,float32,tf32 "
                           "--out book/data/h200_roofline.json"),
    "h200_instruction_peaks.json": ("each tensor-core instruction's own ceiling: mma.sync and wgmma issued "
                                    "back to back on operands in place, float16 and bfloat16 (chapter 09)",
                                    "python -m flashtut.bench roofline --what instruction --dtype float16,bfloat16 "
                                    "--out book/data/h200_instruction_peaks.json"),
    "capstone_h200.json": ("chapter 12's small GPT with each attention backend: loss per step, tokens/s and "
                           "peak memory against context, KV-cache generation against recompute, packed "
                           "against padded batches",
                           "FLASHTUT_TRITON_AUTOTUNE=0 python -m flashtut.model.measure "
                           "--out book/data/capstone_h200.json"),
    "real_models_h200.json": ("Triton with grouped-query heads (32 over 8), a window of 4096 and packed "
                              "batches against SDPA flash, N 16384, D 128, TFLOP/s of visible keys",
                              "FLASHTUT_TRITON_AUTOTUNE=0 python -m flashtut.bench real-models --warmup-ms 10 "
                              "--rep-ms 50 --out book/data/real_models_h200.json"),
    "anchors_h200_sdpa.json": ("PyTorch SDPA and FlexAttention reference figures, copied from the "
                               "project's H200 anchor file", None),
    # the kernel chapters' own runs
    "triton_h200.json": ("chapter 07's Triton kernels against SDPA flash, autotuned: speed, errors and the "
                         "configurations the autotuner picked (the committed run, from the retired script, "
                         "also holds every configuration's time per shape, which a re-run does not record)",
                         "python -m flashtut.bench run --preset triton-autotune --warmup-ms 25 --rep-ms 150 "
                         "--out book/data/triton_h200.json"),
    "triton_h200_sweep.json": ("chapter 07's speed against N: Triton, SDPA flash and naive attention, "
                               "D 128, float16, autotuned",
                               "python -m flashtut.bench run --preset triton-sweep --warmup-ms 10 --rep-ms 60 "
                               "--out book/data/triton_h200_sweep.json"),
    "cuda_h200.json": ("chapter 08's CUDA ladder and fast kernel against naive attention and SDPA flash",
                       "python -m flashtut.bench run --preset cuda-ladder --out book/data/cuda_h200.json"),
    "cuda_h200_v3_first.json": ("the same run with the fast kernel's first tile shape (8 warps of 16 rows, "
                                "64-key tiles at both head dims), quoted by the perf logs' history",
                                "git checkout f9f88b4 && OUT=<folder> bash tools/gpu_cuda.sh --quick"),
    "cuda_tiles_h200.json": ("the fast kernel's forward at other tile shapes (warps, keys per tile, rows "
                             "per warp), the measurement behind V3_TILES",
                             "python -m flashtut.bench run --preset cuda-tiles --out book/data/cuda_tiles_h200.json"),
    "cuda_ladder_h200.json": ("the CUDA forward ladder's steps 3-7 and the backward's dQ strategies against SDPA "
                              "flash; in its provenance the first-call compile times, the correctness checks and "
                              "Nsight Compute per kernel (perflog_cuda, perflog_cuda_bwd)",
                              "OUT=<folder> bash tools/gpu_ladder.sh"),
    "cuda_ladder_bwd_h200.json": ("the backward's dQ strategies and FlashAttention-2's warp grid for dK/dV "
                                  "(atomic-dq-w8-split2x4, -m128) against SDPA flash, one process, the "
                                  "protocol's N 4096 and 16384; in its provenance the correctness checks on "
                                  "odd shapes (perflog_cuda_bwd, chapter 08)",
                                  "python -m flashtut.bench.cuda_ladder --bwd-only "
                                  "--out book/data/cuda_ladder_bwd_h200.json"),
    "cuda_protocol_h200.json": ("cuda_attention (its default, on an H200 the W3 forward with the TMA store at D 128 "
                                "and at D 64 three consumer warpgroups taking turns, the short query block first "
                                "and the warpgroup index known uniform, and forward_kernel='mma') against SDPA "
                                "flash and SDPA cuDNN at the protocol's N 4096 and 16384, backward with the warp "
                                "grid (H200, 2026-12-02 17:43 UTC, commit de5ab7d)",
                                "python -m flashtut.bench run --impl cuda,cuda-mma,sdpa-flash,sdpa-cudnn --mode fwd,bwd "
                                "-D 128,64 -N 4096,16384 --dtype float16,bfloat16 --causal both --tokens 16384 "
                                "--hidden 2048 --warmup-ms 5 --rep-ms 40 --no-progress "
                                "--out book/data/cuda_protocol_h200.json"),
    "host_path_h200_protocol_d*.json": ("the protocol sweep after the CUDA host-path change and before the "
                                        "tile-shape change (perflog_cuda compares it with both)",
                                        "git checkout c269288 && OUT=<folder> bash tools/gpu_protocol.sh"),
    "hopper_h200_w1_first.json": ("chapter 11's first Hopper run: rung W1 (wgmma) and its variants against SDPA "
                                  "flash, SDPA cuDNN and cuda-v3 at N = 4096, float16",
                                  "git checkout 98cfec4 && OUT=<folder> bash tools/gpu_hopper.sh --quick"),
    "hopper_h200.json": ("chapter 11's Hopper ladder through rung W3 (softmax overlapped with the tensor cores: "
                         "pipelined and ping-pong consumer warpgroups): W1, its variants, W2, W3 and W3 with three "
                         "consumer warpgroups at D 64 (hopper-w3[c3]) against SDPA flash, SDPA cuDNN and the "
                         "mma.sync CUDA forward, N 4096 and 16384, D 128 and 64, float16 and bfloat16, causal and "
                         "not (H200, 2026-12-02 03:18 UTC)",
                         "python -m flashtut.bench run --preset hopper --out book/data/hopper_h200.json"),
    "hopper_w4_h200.json": ("chapter 11's rung W4 (W3 with persistent blocks and a dynamic tile scheduler) in the "
                            "hopper preset beside every other rung: W4 and W4 with three consumers at D 64 "
                            "(hopper-w4, hopper-w4[c3]) against W3, SDPA flash, SDPA cuDNN and the mma.sync CUDA "
                            "forward, the protocol's 16 cases (H200, 2026-12-02 03:55 UTC, commit 4b5e2f6)",
                            "python -m flashtut.bench run --preset hopper --out book/data/hopper_w4_h200.json"),
    "hopper_softmax_h200.json": ("rung W3 with two changes to its softmax, each its own build against W3 in one "
                                 "process: k of every 8 exponentials by a cubic on the float32 pipe "
                                 "(hopper-w3[c3,polyk], hopper-w3[polyk]) and each tile's row maxima and sums as "
                                 "trees of pairs (hopper-w3[c3,tree], hopper-w3[tree]), with SDPA flash and cuDNN, "
                                 "the protocol's 16 cases (H200, 2026-12-02 05:54 UTC, commit 59e14f0): both slower",
                                 "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3,"
                                 "hopper-w3[c3],hopper-w3[c3,poly1],hopper-w3[c3,poly2],hopper-w3[c3,poly3],"
                                 "hopper-w3[poly1],hopper-w3[poly2],hopper-w3[c3,tree],hopper-w3[tree]' "
                                 "--out book/data/hopper_softmax_h200.json"),
    "hopper_options_h200.json": ("rung W3 with W4's causal order for its grid (hopper-w3[order], hopper-w3[c3,order]) "
                                 "and with the TMA store of its output (hopper-w3[store], hopper-w3[c3,store]), "
                                 "each against W3 in one process with SDPA flash and cuDNN, the protocol's 16 cases "
                                 "(H200, 2026-12-02 06:07 UTC, commit a558ac5): the store faster at D 128",
                                 "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3,"
                                 "hopper-w3[c3],hopper-w3[order],hopper-w3[c3,order],hopper-w3[store],"
                                 "hopper-w3[c3,store]' --out book/data/hopper_options_h200.json"),
    "hopper_c3_tiles_h200.json": ("rung W3 with three consumer warpgroups at D 64 with a ring of 3 K/V stages "
                                  "(hopper-w3[c3,s3]) and with 64-key tiles (hopper-w3[c3,n64]) against its default "
                                  "(2 stages, 128-key tiles), SDPA flash and cuDNN, one process, the protocol's 8 "
                                  "D 64 cases (H200, 2026-12-02 06:23 UTC, commit 2e69e68): both slower",
                                  "python -m flashtut.bench run --preset hopper --impl \'sdpa-flash,sdpa-cudnn,hopper-w3[c3],hopper-w3[c3,s3],hopper-w3[c3,n64]\' -D 64 --out book/data/hopper_c3_tiles_h200.json"),
    "hopper_turns_h200.json": ("the three-consumer W3 build at D 64 with its consumers taking turns in a ring "
                               "(hopper-w3[c3,turns]) against the same without (hopper-w3[c3]), SDPA flash and "
                               "cuDNN, the protocol's 8 cases at D 64 (H200, 2026-12-02 08:37 UTC, commit "
                               "acfba6a): the turns faster in every case",
                               "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3],hopper-w3[c3,turns]' -D 64 --out book/data/hopper_turns_h200.json"),
    "hopper_turns_stack_h200.json": ("on top of the three consumers' turns (hopper-w3[c3,turns]), the options that "
                                     "lost without them (the TMA store, row trees, 1 of 8 exponentials by a cubic) "
                                     "and W4 with and without turns, SDPA flash and cuDNN, 8 cases at D 64 (H200, "
                                     "2026-12-02 08:41 UTC, commit 758b193)",
                                     "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3,turns],hopper-w3[c3,turns,store],hopper-w3[c3,turns,tree],hopper-w3[c3,turns,poly1],hopper-w4[c3],hopper-w4[c3,turns]' -D 64 --out book/data/hopper_turns_stack_h200.json"),
    "hopper_turns_store_h200.json": ("the TMA store on top of the three consumers' turns against the turns alone, in "
                                     "one process, with SDPA flash and cuDNN, 8 cases at D 64 (H200, 2026-12-02 "
                                     "08:49 UTC, commit 3061470): faster in 5 of 8 cases, not kept",
                                     "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3,turns],hopper-w3[c3,turns,store]' -D 64 --out book/data/hopper_turns_store_h200.json"),
    "hopper_w4_static_h200.json": ("W4 with its scheduler's counter and with the static schedule (no handover "
                                   "through shared memory), against cuda_attention's W3 builds, SDPA flash and "
                                   "cuDNN, the protocol's 16 cases (H200, 2026-12-02 09:14 UTC, commit d5036ba)",
                                   "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[store],hopper-w3[c3,turns],hopper-w4,hopper-w4[c3],hopper-w4[static],hopper-w4[c3,static]' --out book/data/hopper_w4_static_h200.json"),
    "hopper_w4_named_h200.json": ("W4 with its counter handed over on q_full and on two named barriers "
                                  "(named_handover), two consumers and at D 64 three with turns, SDPA flash and "
                                  "cuDNN, the protocol's 16 cases (H200, 2026-12-02 14:04 UTC, commit f97f28a): "
                                  "no faster, and racecheck reports the named form's slot too",
                                  "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w4,hopper-w4[named],hopper-w4[c3,turns],hopper-w4[c3,turns,named]' --out book/data/hopper_w4_named_h200.json"),
    'hopper_pin_d64_h200.json': ("cuda_attention's D 64 build (three consumers with turns) against the same with its softmax pinned under the P V in flight (pin_overlap), with the lazy rescale (lazy_rescale) and with both, SDPA flash and cuDNN, 8 cases at D 64 (H200, 2026-12-02 10:58 UTC, commit f1af591): both slower in every case",
        "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3,turns],hopper-w3[c3,turns,pin],hopper-w3[c3,turns,lazy],hopper-w3[c3,turns,pin,lazy]' -D 64 --out book/data/hopper_pin_d64_h200.json"),
    'hopper_pin_d128_h200.json': ("cuda_attention's D 128 build (the TMA store) against the same with pin_overlap, with lazy_rescale and with both, SDPA flash and cuDNN, 8 cases at D 128 (H200, 2026-12-02 10:59 UTC, commit f1af591): the pin faster in 7 of 8 cases, the lazy rescale in none",
        "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[store],hopper-w3[store,pin],hopper-w3[store,lazy],hopper-w3[store,pin,lazy]' -D 128 --out book/data/hopper_pin_d128_h200.json"),
    'hopper_anchor_d64_h200.json': ("cuda_attention's D 64 build against the same with the pin on a barrier of its own (pin_anchor) and with pin_overlap, SDPA flash and cuDNN, 8 cases at D 64 (H200, 2026-12-02 11:03 UTC, commit 9f3c31a): both slower in every case",
        "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3,turns],hopper-w3[c3,turns,anchor],hopper-w3[c3,turns,pin]' -D 64 --out book/data/hopper_anchor_d64_h200.json"),
    'hopper_anchor_d128_h200.json': ("cuda_attention's D 128 build against the same with pin_anchor and with pin_overlap, SDPA flash and cuDNN, 8 cases at D 128 (H200, 2026-12-02 11:03 UTC, commit 9f3c31a)",
        "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[store],hopper-w3[store,anchor],hopper-w3[store,pin]' -D 128 --out book/data/hopper_anchor_d128_h200.json"),
    'hopper_ds_d64_h200.json': ("cuda_attention's D 64 build and W4 with turns, each with and without stepped wgmma descriptors (desc_step), SDPA flash and cuDNN, 8 cases at D 64 (H200, 2026-12-02 11:12 UTC, commit 4a407ae)",
        "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3,turns],hopper-w3[c3,turns,ds],hopper-w4[c3,turns],hopper-w4[c3,turns,ds]' -D 64 --out book/data/hopper_ds_d64_h200.json"),
    'hopper_ds_d128_h200.json': ("cuda_attention's D 128 build with and without desc_step and pin_overlap, and W4 with and without desc_step, SDPA flash and cuDNN, 8 cases at D 128 (H200, 2026-12-02 11:12 UTC, commit 4a407ae)",
        "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[store],hopper-w3[store,ds],hopper-w3[store,pin],hopper-w3[store,pin,ds],hopper-w4,hopper-w4[ds]' -D 128 --out book/data/hopper_ds_d128_h200.json"),
    "ncu_overlap_h200.json": ("Nsight Compute metrics of one launch of cuda_attention's Hopper build alone and with "
                              "each of pin_overlap, pin_anchor, lazy_rescale and desc_step (set overlap), float16, "
                              "N 4096, D 128 and 64 (H200, 2026-12-02 11:21 UTC, commit 36e6fb2)",
                              "python -m flashtut.bench profile --set overlap -D 128,64 --out book/data/ncu_overlap_h200.json"),
    "ncu_shipped_h100.json": ("Nsight Compute metrics of one launch of cuda_attention's Hopper build as it ships "
                              "(D 64 with the short query block first and the uniform warpgroup index) beside the "
                              "build the other profiles launch (set shipped), not causal and causal, float16, N 4096, "
                              "D 128 and 64 (H100, 2026-12-07 08:12 UTC, commit 4f7db29)",
                              "python -m flashtut.bench profile --set shipped --out book/data/ncu_shipped_h100.json"),
    "cuda_protocol_rerun_h200.json": ("the protocol run again at the final kernel source of 2026-12-02 (cuda_attention's "
                                      "default builds byte-identical to those of cuda_protocol_h200.json), forward and "
                                      "backward, with cuda-mma, SDPA flash and cuDNN, 32 cases (H200, 2026-12-02 11:29 "
                                      "UTC, commit 779574c)",
                                      "python -m flashtut.bench run --impl cuda,cuda-mma,sdpa-flash,sdpa-cudnn --mode fwd,bwd -D 128,64 -N 4096,16384 --dtype float16,bfloat16 --causal both --tokens 16384 --hidden 2048 --warmup-ms 5 --rep-ms 40 --out book/data/cuda_protocol_rerun_h200.json"),
    "hopper_ds_d64_again_h200.json": ("cuda_attention's D 64 build with and without desc_step again, SDPA flash and cuDNN, "
                                      "8 cases at D 64 (H200, 2026-12-02 11:35 UTC, commit 779574c)",
                                      "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3,turns],hopper-w3[c3,turns,ds]' -D 64 --out book/data/hopper_ds_d64_again_h200.json"),
    "hopper_ds_d64_swapped_h200.json": ("cuda_attention's D 64 build with and without desc_step, the change timed "
                                        "first, SDPA flash and cuDNN, 8 cases at D 64 (H200, 2026-12-02 12:13 UTC, "
                                        "commit 779574c)",
                                        "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[c3,turns,ds],hopper-w3[c3,turns]' -D 64 --out book/data/hopper_ds_d64_swapped_h200.json"),
    "hopper_pin_d128_swapped_h200.json": ("cuda_attention's D 128 build with and without pin_overlap, the change timed "
                                          "first, SDPA flash and cuDNN, 8 cases at D 128 (H200, 2026-12-02 12:13 UTC, "
                                          "commit 779574c)",
                                          "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[store,pin],hopper-w3[store]' -D 128 --out book/data/hopper_pin_d128_swapped_h200.json"),
    "ncu_hopper_h200.json": ("Nsight Compute metrics of one launch of each Hopper forward, SDPA flash and the "
                             "mma.sync forward (set ladder) and of W3 with each build option (set options), "
                             "float16, N 4096, D 128 and 64 (H200, 2026-12-02 09:00 UTC, commit cd5bbd9)",
                             "python -m flashtut.bench profile --set ladder,options -D 128,64 --out book/data/ncu_hopper_h200.json"),
    "hopper_heads_h200.json": ("cuda_attention's W3 builds (three consumers at D 64, the TMA store at D 128) against "
                               "the same with the grid as (heads, query blocks) (hopper-w3[c3,heads], "
                               "hopper-w3[heads,store]), SDPA flash and cuDNN, the protocol's 16 cases (H200, "
                               "2026-12-02 06:26 UTC, commit f3f3b62): heads first slower in every case",
                               "python -m flashtut.bench run --preset hopper --impl \'sdpa-flash,sdpa-cudnn,hopper-w3[c3],hopper-w3[c3,heads],hopper-w3[store],hopper-w3[heads,store]\' --out book/data/hopper_heads_h200.json"),
    "hopper_ab_h200.json": ("rung W3 with its tensor maps copied from pageable memory, blocking "
                            "(hopper-w3[pageable-maps]), and from pinned memory, not blocking (hopper-w3), "
                            "and SDPA flash, each at do_bench budgets of 5/40 and 25/100 ms, one process, "
                            "float16, D 128 and 64, N 4096 and 16384, causal and not (perflog_hopper, chapter 11)",
                            "python -m flashtut.bench.hopper_ab --out book/data/hopper_ab_h200.json"),
    "hopper_ring_h200.json": ("rung W3 with 2, 3 and 4 K/V stages in its TMA ring (hopper-w3, hopper-w3[s3], "
                              "hopper-w3[s4]) against SDPA flash, one process, float16, D 64 and 128, N 4096 and "
                              "16384, causal and not; measured before the pinned tensor maps (perflog_hopper)",
                              "python -m flashtut.bench run --impl 'hopper-w3,hopper-w3[s3],hopper-w3[s4],sdpa-flash' "
                              "-D 64,128 -N 4096,16384 --dtype float16 --causal both --mode fwd --tokens 16384 "
                              "--hidden 2048 --warmup-ms 5 --rep-ms 40 --out book/data/hopper_ring_h200.json"),
    "sass_evidence_h200.json": ("instruction counts (SASS) of our Triton forward and backward with and without "
                                "DISABLE_MMA_V3=1, of W1, the mma.sync CUDA forward and SDPA flash, with Triton's "
                                "speed against SDPA flash under both settings (chapter 09; issues 12 and 14)",
                                "OUT=<folder> bash tools/gpu_sass_evidence.sh"),
    "host_overhead_h200.json": ("host time per call of cuda_attention, triton_attention and SDPA at a tiny "
                                "size, before and after the CUDA host-path change (perflog_cuda)",
                                "python -m flashtut.bench host --label after --out book/data/host_overhead_h200.json"),
    "hopper_pair_uni_d64_h200.json": ("cuda_attention's former D 64 build (three consumers with turns) against the same "
                                      "with the warpgroup index known uniform (uniform_wg), SDPA flash, 7 alternated "
                                      "rounds per case, 8 cases at D 64 (H200, 2026-12-02 17:38 UTC, commit 43135df)",
                                      "python -m flashtut.bench.hopper_ab --pair 'hopper-w3[c3,turns]' 'hopper-w3[c3,turns,uni]' --out book/data/hopper_pair_uni_d64_h200.json"),
    "hopper_pair_tail_d64_h200.json": ("the D 64 build with the uniform warpgroup index against the same with the short "
                                       "query block first (tail_first), SDPA flash, 7 alternated rounds per case, 8 "
                                       "cases at D 64 (H200, 2026-12-02 17:39 UTC, commit 43135df)",
                                       "python -m flashtut.bench.hopper_ab --pair 'hopper-w3[c3,turns,uni]' 'hopper-w3[c3,turns,tail,uni]' --out book/data/hopper_pair_tail_d64_h200.json"),
    "hopper_pair_uni_d128_h200.json": ("cuda_attention's D 128 build (the TMA store) and W3 with two consumers at D 64, "
                                       "each against the same with the warpgroup index known uniform, SDPA flash, 7 "
                                       "alternated rounds per case, 16 cases (H200, 2026-12-02 17:39 UTC, commit "
                                       "43135df)",
                                       "python -m flashtut.bench.hopper_ab --pair 'hopper-w3[store]' 'hopper-w3[store,uni]' --out book/data/hopper_pair_uni_d128_h200.json"),
    "hopper_uniform_h200.json": ("the builds with the warpgroup index known uniform in one run: cuda_attention's "
                                 "then builds with and without it, the D 64 build with the short query block first, "
                                 "W4 with it (two consumers, and three with turns at D 64), SDPA flash and cuDNN, the "
                                 "protocol's 16 cases (H200, 2026-12-02 17:29 UTC, commit 41523aa)",
                                 "python -m flashtut.bench run --preset hopper --impl 'sdpa-flash,sdpa-cudnn,hopper-w3[store],hopper-w3[store,uni],hopper-w3[c3,turns],hopper-w3[c3,turns,uni],hopper-w3[c3,turns,tail,uni],hopper-w4[uni],hopper-w4[c3,turns,uni]' --out book/data/hopper_uniform_h200.json"),
}

# --- the repository (its _config.yml names it; flashtut.colab writes it into notebooks) ---------

DEFAULT_REPO_URL = "https://github.com/flashtut/flash-attention-from-scratch"
DEFAULT_BRANCH = "main"

# In a source checkout this file is src/flashtut/results_data.py, so the book root is two levels up.
# An installed copy (site-packages) has no _config.yml there and falls back to the defaults.
_CHECKOUT_ROOT = Path(__file__).resolve().parents[2]

_URL_RE = re.compile(r"^https://[A-Za-z0-9.-]+(?::[0-9]+)?(/[A-Za-z0-9._~%/-]*)?$")
_BRANCH_RE = re.compile(r"^[A-Za-z0-9._/-]+$")


def _check_repo_url(url) -> str:
    if not isinstance(url, str):
        raise TypeError(f"repo: expected a str URL, got {type(url).__name__}")
    url = url.strip().rstrip("/")
    if url.endswith(".git"):
        url = url[:-4]
    if not _URL_RE.match(url):
        raise ValueError(f"repo: got {url!r}; accepted: an https:// repository URL without spaces, "
                         "quotes or query, e.g. https://github.com/you/flash-attention-from-scratch")
    return url


def _check_branch(branch) -> str:
    if not isinstance(branch, str):
        raise TypeError(f"branch: expected a str, got {type(branch).__name__}")
    if not _BRANCH_RE.match(branch) or ".." in branch or branch.startswith(("-", "/")):
        raise ValueError(f"branch: got {branch!r}; accepted: a git branch name such as 'main'")
    return branch


def _repository_block(lines: list[str]) -> tuple[int, int]:
    """Line span [start, end) of the top-level ``repository:`` mapping of a YAML file, start
    pointing at the ``repository:`` line itself; (-1, -1) when there is none."""
    for i, line in enumerate(lines):
        if re.match(r"^repository:\s*(#.*)?$", line):
            end = i + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
                end += 1
            return i, end
    return -1, -1


def _unquote(value: str) -> str:
    value = re.sub(r"\s+#.*$", "", value.strip())
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return value


def read_repository(config_path: str | Path) -> tuple[str, str]:
    """``(url, branch)`` from the ``repository:`` section of a Jupyter Book ``_config.yml``.

    A line-based reader, so that ``flashtut`` needs no YAML library on a reader's machine; it
    understands the block mapping that ``_config.yml`` uses (``url:`` and ``branch:`` keys).
    """
    lines = Path(config_path).read_text().splitlines()
    start, end = _repository_block(lines)
    url, branch = DEFAULT_REPO_URL, DEFAULT_BRANCH
    if start < 0:
        return url, branch
    for line in lines[start + 1:end]:
        m = re.match(r"^\s+(url|branch):\s*(.*)$", line)
        if m and _unquote(m.group(2)):
            if m.group(1) == "url":
                url = _check_repo_url(_unquote(m.group(2)))
            else:
                branch = _check_branch(_unquote(m.group(2)))
    return url, branch



def _default_repository() -> tuple[str, str]:
    config = _CHECKOUT_ROOT / "_config.yml"
    if config.is_file():
        try:
            return read_repository(config)
        except (OSError, ValueError):
            pass
    return DEFAULT_REPO_URL, DEFAULT_BRANCH


REPO_URL, BRANCH = _default_repository()


_GLOB_CHARS = re.compile(r"[*?\[]")
_NAME_RE = re.compile(r"^[A-Za-z0-9._*?\[\]-]+$")
_TIMEOUT_S = 15


class ResultsMissing(FileNotFoundError):
    """A committed results file is not where it was looked for. ``name`` is the file (or
    pattern) asked for, ``command`` the command that produces it (or None)."""

    def __init__(self, name: str, where: str, command: str | None = None, detail: str | None = None):
        self.name, self.where, self.command = name, where, command
        lines = [f"{REPO_DATA_DIR}/{name}: not found {where}."]
        if detail:
            lines.append(detail)
        if command:
            lines.append(f"It is produced on a GPU, from the repository root, by:\n    {command}")
        else:
            lines.append(f"See {REPO_DATA_DIR}/README.md for how it is produced.")
        super().__init__("\n".join(lines))


# --- where ----------------------------------------------------------------------------------------

def _check_name(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name: expected a file name or pattern (str), got {type(name).__name__}")
    if not _NAME_RE.match(name):
        raise ValueError(f"name: got {name!r}; accepted: a file name of {REPO_DATA_DIR} such as "
                         "'memory_h200.json', or a pattern such as 'bench_h200*.json' (no folders)")
    return name


def producer(name: str) -> tuple[str, str | None] | None:
    """``(what it holds, command)`` for a committed file name or pattern, or None if unknown."""
    for pattern, entry in PRODUCERS.items():
        if name == pattern or fnmatch.fnmatchcase(name, pattern):
            return entry
    return None


def _command(name: str) -> str | None:
    entry = producer(name)
    return entry[1] if entry else None


def local_data_dir() -> Path | None:
    """The ``book/data`` folder this session can read, or None (an installed package without
    the repository). ``$FLASHTUT_DATA`` wins when set; it must then be a folder."""
    env = os.environ.get(DATA_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise ValueError(f"${DATA_ENV}: got {env!r}, which is not a folder; accepted: the path of "
                             f"a folder of results files (such as a checkout's {REPO_DATA_DIR}), or unset")
        return path
    checkout = Path(__file__).resolve().parents[2] / REPO_DATA_DIR
    here = Path.cwd().resolve()
    for candidate in (checkout, *(p / REPO_DATA_DIR for p in (here, *here.parents))):
        if candidate.is_dir():
            return candidate
    return None


def raw_url(name: str, repo_url: str | None = None, branch: str | None = None) -> str:
    """The address of ``book/data/<name>`` as a plain file in the repository (default: the
    repository and branch of the book's ``_config.yml``)."""
    _check_name(name)
    if _GLOB_CHARS.search(name):
        raise ValueError(f"name: got the pattern {name!r}; a download needs one file name")
    url = _check_repo_url(repo_url if repo_url is not None else REPO_URL)
    branch = _check_branch(branch if branch is not None else BRANCH)
    m = re.match(r"^https://github\.com/([^/]+)/([^/]+)$", url)
    if m:
        return f"https://raw.githubusercontent.com/{m.group(1)}/{m.group(2)}/{branch}/{REPO_DATA_DIR}/{name}"
    # GitLab, Gitea and Forgejo serve (or redirect) <repo>/raw/<branch>/<path>
    return f"{url}/raw/{branch}/{REPO_DATA_DIR}/{name}"


def cache_dir() -> Path:
    """Where downloaded results are kept: ``$XDG_CACHE_HOME/flashtut/data`` or ``~/.cache/...``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flashtut" / "data"


def _fetch(url: str) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": "flashtut"})
    with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
        return resp.read()


def _offline_detail(url: str, exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 404:
        return (f"The repository has no such file on branch {BRANCH} ({url} answered 404): "
                "it has not been committed yet.")
    reason = getattr(exc, "reason", None) or exc
    return (f"Downloading it from {url} failed ({reason}): no network here? Clone the repository "
            f"(git clone {REPO_URL}) and run from the checkout, or set ${DATA_ENV} to a "
            "folder that holds the file.")


def _download(name: str, refresh: bool) -> Path:
    target = cache_dir() / BRANCH / name
    if target.is_file() and not refresh:
        return target
    url = raw_url(name)
    try:
        data = _fetch(url)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise ResultsMissing(name, "in this installation, which has no book/data folder",
                             _command(name), _offline_detail(url, exc)) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".part")
    tmp.write_bytes(data)
    tmp.replace(target)           # never leave half a file where the next call would trust it
    return target


def _remote_names(pattern: str) -> list[str]:
    """File names of the repository's book/data matching ``pattern`` (GitHub's contents API)."""
    m = re.match(r"^https://github\.com/([^/]+)/([^/]+)$", REPO_URL)
    if not m:
        raise ResultsMissing(pattern, "in this installation, which has no book/data folder", _command(pattern),
                             f"Listing files of {REPO_URL} is only supported on GitHub: ask for one "
                             "exact file name, or clone the repository.")
    url = (f"https://api.github.com/repos/{m.group(1)}/{m.group(2)}/contents/{REPO_DATA_DIR}"
           f"?ref={BRANCH}")
    try:
        listing = json.loads(_fetch(url))
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        raise ResultsMissing(pattern, "in this installation, which has no book/data folder",
                             _command(pattern), _offline_detail(url, exc)) from None
    return sorted(e["name"] for e in listing if isinstance(e, dict) and fnmatch.fnmatchcase(e.get("name", ""), pattern))


def _folder(data_dir) -> Path | None:
    if data_dir is None:
        return local_data_dir()
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ValueError(f"data_dir: got {str(data_dir)!r}, which is not a folder; accepted: a folder "
                         "of results files, or None for the book's own")
    return path


def find(pattern: str, data_dir=None, refresh: bool = False) -> list[Path]:
    """The files of ``book/data`` (or ``data_dir``) whose names match ``pattern``, sorted by
    name; downloaded when there is no local folder. Raises :class:`ResultsMissing` if none."""
    _check_name(pattern)
    folder = _folder(data_dir)
    if folder is not None:
        paths = sorted(p for p in folder.glob(pattern) if p.is_file()) if _GLOB_CHARS.search(pattern) \
            else [p for p in (folder / pattern,) if p.is_file()]
        if not paths:
            raise ResultsMissing(pattern, f"in {folder}", _command(pattern))
        return paths
    names = _remote_names(pattern) if _GLOB_CHARS.search(pattern) else [pattern]
    if not names:
        raise ResultsMissing(pattern, "in the repository", _command(pattern))
    return [_download(n, refresh) for n in names]


def data_path(name: str, data_dir=None, refresh: bool = False) -> Path:
    """The path of one committed file, ``book/data/<name>``: local when there is a checkout,
    else downloaded (``refresh=True`` downloads again). Raises :class:`ResultsMissing`."""
    _check_name(name)
    if _GLOB_CHARS.search(name):
        raise ValueError(f"name: got the pattern {name!r}; data_path takes one file name "
                         "(find() and load_results() take patterns)")
    return find(name, data_dir, refresh)[0]


# --- what -----------------------------------------------------------------------------------------

def load_results(pattern_or_name: str, data_dir=None, missing: str = "raise",
                 refresh: bool = False) -> tuple[list[dict], list[dict]]:
    """Rows and provenance of every committed file matching ``pattern_or_name``.

    Returns ``(rows, provenance_list)``. Rows are in ``flashtut.bench``'s layout (so
    ``flashtut.figures.bench_plots`` draws them), each tagged with ``source`` (its file's name) and
    ``device`` (the GPU's name from the file's provenance, else the file's stem). When several
    files measure the same thing, the one with the latest provenance date wins. Each provenance
    entry is the file's ``provenance`` block plus ``file``, ``path``, ``kind``, ``config`` and
    ``rows`` (how many rows it gave). ``missing``: ``"raise"`` raises :class:`ResultsMissing`,
    ``"print"`` prints its message and returns ``([], [])``.
    """
    if missing not in ("raise", "print"):
        raise ValueError(f"missing: got {missing!r}; accepted: 'raise' or 'print'")
    try:
        paths = find(pattern_or_name, data_dir, refresh)
    except ResultsMissing as exc:
        if missing == "raise":
            raise
        print(exc)
        return [], []
    docs = []
    for path in paths:
        doc = _results.load_results(path)
        prov = dict(doc.get("provenance") or {})
        docs.append((str(prov.get("date") or ""), path, doc, prov))
    tagged, provenance = [], []
    for date, path, doc, prov in docs:
        device = (prov.get("device") or {}).get("name") if isinstance(prov.get("device"), dict) else prov.get("device")
        rows = [dict(r, source=path.name) for r in doc["rows"]]
        for r in rows:
            r.setdefault("device", device or path.stem)
        tagged.append((date, path.name, rows))
        provenance.append(dict(prov, file=path.name, path=str(path), kind=doc.get("kind"),
                               config=doc.get("config") or {}, rows=len(doc["rows"])))
    provenance.sort(key=lambda p: (str(p.get("date") or ""), p["file"]))
    return _results.merge_latest(tagged), provenance


_MACHINE_DIR = re.compile(r"(?:/root/out|/tmp/tmp[\w.-]*|/tmp)/(?=[^\s/])")


def public_command(command: str) -> str:
    """``command`` as a reader can run it: the folders of the machine that measured (``/root/out/``,
    a ``/tmp/tmp...`` directory) dropped, so that ``--out /root/out/x.json`` reads ``--out x.json``."""
    if not isinstance(command, str):
        raise TypeError(f"command must be a str, got {type(command).__name__}")
    return _MACHINE_DIR.sub("", command)


def describe(prov: dict, width: int = 90) -> str:
    """A few lines a reader can check a number against: file, device, versions, date, command
    (every line wrapped at ``width`` characters, so that a notebook's output box does not scroll
    sideways; a command breaks only at spaces)."""
    dev = prov.get("device")
    if isinstance(dev, dict):
        device = dev.get("name") or "?"
        if dev.get("compute_capability"):
            device += f" (compute capability {dev['compute_capability']})"
    else:
        device = dev or "device not recorded"
    versions = prov.get("versions") or {}
    vtext = ", ".join(f"{k} {v}" for k, v in versions.items() if v and k in
                      ("torch", "cuda", "cudnn", "triton", "cupy", "python", "flashtut"))
    git = prov.get("git") or {}
    wrap = lambda text: textwrap.fill(text, width, subsequent_indent="    ",  # noqa: E731
                                      break_long_words=False, break_on_hyphens=False)
    lines = [wrap(f"{prov.get('file', '?')} ({prov.get('kind') or 'results'}, {prov.get('rows', '?')} rows): "
                  f"{device}")]
    if prov.get("provisional"):
        lines.append(wrap("  PROVISIONAL: reference figures, not a measurement of this project; "
                          + (prov.get("note") or "to be replaced by a measured run")))
    if prov.get("what"):
        lines.append(wrap(f"  what: {prov['what']}"))
    if vtext:
        lines.append(wrap(f"  versions: {vtext}"))
    if prov.get("date"):
        lines.append(f"  measured: {prov['date']}")
    if prov.get("command") or prov.get("call"):
        lines.append(wrap(f"  command: {public_command(prov.get('command') or prov.get('call'))}"))
    if git.get("commit"):
        lines.append(f"  git commit: {git['commit'][:12]}")
    return "\n".join(lines)


def provenance_rows(provs: list[dict]) -> tuple[list[str], list[list[str]], list[str]]:
    """The provenance of several files as ``(header, body, commands)``: a table with one row per
    file (what :func:`describe` says, in cells that a narrow screen can wrap;
    ``flashtut.notebook.show_provenance`` renders it) and, apart, the command that measured each
    file. A command in a table cell either widens the table past the page or, wrapped, squeezes
    its column to a word a line, so it goes under the table, where it wraps like a sentence."""
    header = ["file", "device", "measured (UTC)", "software"]
    body, commands = [], []
    for prov in provs:
        dev = prov.get("device")
        device = (dev.get("name") or "?") if isinstance(dev, dict) else (dev or "not recorded")
        versions = prov.get("versions") or {}
        software = ", ".join(f"{k} {v}" for k, v in versions.items()
                             if v and k in ("torch", "cuda", "triton", "cupy"))
        command = public_command(prov.get("command") or prov.get("call") or "")
        name = prov.get("file", "?")
        what = [f"`{name}` ({prov.get('kind') or 'results'}, {prov.get('rows', '?')} rows)"]
        if prov.get("provisional"):
            what.append("provisional: reference figures, not a measurement of this project")
        if prov.get("what"):
            what.append(str(prov["what"]))
        body.append(["; ".join(what), device, str(prov.get("date") or "?")[:16].replace("T", " "),
                     software or "-"])
        commands.append(f"`{name}`: `{command}`" if command else f"`{name}`: no command recorded")
    return header, body, commands


# --- chapter 01's roofline ---------------------------------------------------------------------

def data_dir() -> Path:
    """The book's ``book/data`` folder (``$FLASHTUT_DATA`` if set), as :func:`local_data_dir`
    finds it; ``FileNotFoundError`` when there is none."""
    found = local_data_dir()
    if found is None:
        raise FileNotFoundError(
            "book/data not found: run from a checkout of the book's repository, or set FLASHTUT_DATA "
            "to its book/data folder (flashtut.results_data.data_path downloads single files)")
    return found


def load_roofline_data(path=None) -> dict:
    """The committed copy bandwidth and matrix rates (``book/data/h200_roofline.json``, written by
    ``python -m flashtut.bench roofline``), in the layout of
    :func:`flashtut.bench.roofline.ceilings_from_rows`, with the file's ``provenance`` (device,
    versions, date, command) under ``provenance["measured"]``."""
    path = Path(path) if path is not None else data_path("h200_roofline.json")
    doc = _results.load_results(path)
    if doc.get("kind") != "roofline":
        raise ValueError(f"{path}: holds {doc.get('kind')!r} results; accepted: the output of "
                         "`python -m flashtut.bench roofline`")
    prov = doc.get("provenance") or {}
    name = (prov.get("device") or {}).get("name", "unknown GPU")
    note = f"measured on {prov.get('date', '?')} with `{prov.get('command', '?')}`"
    out = ceilings_from_rows(doc["rows"], name, note)
    out["provenance"]["measured"] = prov
    return out


def roofline_data(device=None) -> dict:
    """Measure the reader's GPU when there is one, else load the committed H200 figures."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        return measure_roofline(device)
    return load_roofline_data()


__all__ = ["DATA_ENV", "PRODUCERS", "ResultsMissing", "load_results", "data_path", "find", "describe",
           "local_data_dir", "raw_url", "cache_dir", "producer", "data_dir", "load_roofline_data",
           "roofline_data", "read_repository", "REPO_URL", "BRANCH"]
