"""One small launch of every CUDA kernel (each forward ladder step, the fast kernel at its default
and its 32-rows-per-warp tile shapes, steps 4 to 7 with grouped K/V heads and both causal
alignments, the backward with atomic dQ and with the deterministic dQ pass, from sm_80 the
backward's warp-grid rung (``experiment_configs``, ``warp_grid=True``: shared P^T/dS^T tiles between
warp pairs) with grouped heads and both alignments, and on an sm_90 GPU every build of the Hopper
rungs), for compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tools/sanitizer_launches.py
    compute-sanitizer --tool racecheck python3 tools/sanitizer_launches.py

Odd lengths (77 queries, 131 keys, and the reverse for the Hopper rungs) so that every masked tail
is exercised; the Hopper launches also cover grouped heads and both causal alignments.

``--dims``: instead, only the head dims added after 64 and 128: the fast forward and both
backward paths at D = 32 and 96, and from sm_80 at D = 256 (whose dK/dV kernel splits dK and dV
over two blocks), with grouped heads and both causal alignments (experiments/compile_time/gpu_cuda_dims.sh).

``--w4``: instead, only rung W4: its scheduler's counter handed over with q_full (``counter``) and the
same with the warpgroup index known uniform (``uniform``); names after it (``--w4 uniform``) keep only
those.

``--defaults``: instead, only ``cuda_attention``'s Hopper forward (rung W3 with configs.HOPPER_CONSUMERS and
configs.HOPPER_OPTIONS per head dim), both dtypes, D = 64 and 128.

``--w3-options``: instead, only Hopper rung W3 with each of its build options (configs.W3_OPTIONS: the
output stored by TMA, the short query block first, at D = 64 the turns of three consumers (alone, with the
TMA store and with the short block first), and on cuda_attention's build the warpgroup index known
uniform) at cuda_attention's consumers per head dim (sm_90; run once their gpu tests have passed); option
names after it (``--w3-options c3_turns``) keep only those options.
"""
import os
import sys

import torch

import flashtut
from flashtut.cuda.attention import _forward, cuda_backward
from flashtut.cuda.compile import max_smem_per_block
from flashtut.cuda.attention import cuda_forward as forward
from flashtut.cuda.configs import V4_STEPS, experiment_configs


def new_dims():
    wide = (256,) if torch.cuda.get_device_capability()[0] >= 8 else ()
    for D in (32, 96, *wide):
        q = torch.randn(1, 4, 77, D, device="cuda", dtype=torch.float16, requires_grad=True)
        k, v = (torch.randn(1, 2, 131, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(2))
        for causal in (False, True, "bottom-right"):
            for deterministic in (False, True):
                flashtut.cuda_attention(q, k, v, causal=causal, deterministic=deterministic).sum().backward()
                flashtut.cuda_attention(k.repeat(1, 2, 1, 1), q[:, :2], q[:, :2], causal=causal,
                                        deterministic=deterministic).sum().backward()   # Nq > Nk
    torch.cuda.synchronize()
    print("sanitizer launches (new head dims) done")


def w3_options(only=()):
    from flashtut.cuda.configs import HOPPER_CONSUMERS, HOPPER_OPTIONS, W3_OPTIONS

    unknown = set(only) - set(W3_OPTIONS)
    if unknown:
        sys.exit(f"unknown W3 option(s) {sorted(unknown)}; accepted: {', '.join(W3_OPTIONS)}")

    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            q = torch.randn(1, 4, 77, D, device="cuda", dtype=dtype)
            k, v = (torch.randn(1, 2, 131, D, device="cuda", dtype=dtype) for _ in range(2))
            for options in ({"tma_store": True}, {"tail_first": True},
                            *([{"c3_turns": True}, {"c3_turns": True, "tma_store": True},
                               {"c3_turns": True, "tail_first": True}] if HOPPER_CONSUMERS[D] == 3 else []),
                            {**HOPPER_OPTIONS[D], "uniform_wg": True}):
                if only and not set(options) & set(only):
                    continue
                w3_options_launches(q, k, v, variant="w3", consumers=HOPPER_CONSUMERS[D], **options)
    torch.cuda.synchronize()
    print("sanitizer launches (W3 options) done")


def w3_options_launches(q, k, v, **run):
    """W3 with ``run`` (forward_hopper's keywords) over the causal settings, Nq above and below Nk, and
    64-key tiles."""
    from flashtut.cuda.hopper import forward_hopper

    for causal in (False, True, "bottom-right"):
        forward_hopper(q, k, v, causal=causal, **run)
        forward_hopper(k.repeat(1, 2, 1, 1), q[:, :2], q[:, :2], causal=causal, **run)   # Nq > Nk
    forward_hopper(k[:, :, :131], k, v, causal=True, block_n=64, **run)


def w4_launches(D, q, k, v, **options):
    """W4 at the default grid, and one and three blocks that each walk many query blocks (the ring's
    phases and Q's refills carry over), with two consumers and at D = 64 three, with and without turns."""
    from flashtut.cuda.hopper import forward_hopper

    for consumers, turns in (((2, False), (3, False), (3, True)) if D == 64 else ((2, False),)):
        run = dict(variant="w4", consumers=consumers, **options, **({"c3_turns": True} if turns else {}))
        for causal, ctas in ((False, None), (True, 1), ("bottom-right", 3)):
            forward_hopper(q, k, v, causal=causal, ctas=ctas, **run)
            forward_hopper(k.repeat(1, 2, 1, 1), q[:, :2], q[:, :2], causal=causal, ctas=ctas, **run)
        forward_hopper(k[:, :, :131], k, v, causal=True, block_n=64, ctas=2, **run)


#: W4's builds, name -> build options: its counter as it is, and with the warpgroup index known uniform
W4_SCHEDULES = {"counter": {}, "uniform": {"uniform_wg": True}}

if "--w4" in sys.argv[1:]:
    picked = [name for name in W4_SCHEDULES if name in sys.argv[1:]] or list(W4_SCHEDULES)
    for D in (64, 128):
        q = torch.randn(1, 2, 77, D, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, 2, 131, D, device="cuda", dtype=torch.float16) for _ in range(2))
        for name in picked:
            w4_launches(D, q, k, v, **W4_SCHEDULES[name])
    torch.cuda.synchronize()
    print(f"sanitizer launches (W4: {', '.join(picked)}) done")
    sys.exit(0)
if "--dims" in sys.argv[1:]:
    new_dims()
    sys.exit(0)
if "--defaults" in sys.argv[1:]:
    # cuda_attention's Hopper forward alone: rung W3 with its consumers and build options per head dim
    from flashtut.cuda.configs import HOPPER_CONSUMERS, HOPPER_DEFAULT, HOPPER_OPTIONS

    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            q = torch.randn(1, 4, 77, D, device="cuda", dtype=dtype)
            k, v = (torch.randn(1, 2, 131, D, device="cuda", dtype=dtype) for _ in range(2))
            w3_options_launches(q, k, v, variant=HOPPER_DEFAULT, consumers=HOPPER_CONSUMERS[D], **HOPPER_OPTIONS[D])
    torch.cuda.synchronize()
    print("sanitizer launches (cuda_attention's Hopper forward) done")
    sys.exit(0)
if "--w3-options" in sys.argv[1:]:
    w3_options(sys.argv[sys.argv.index("--w3-options") + 1:])
    sys.exit(0)

for D in (64, 128):
    q, k, v = (torch.randn(1, 2, 77, D, device="cuda", dtype=torch.float16) for _ in range(3))
    k2, v2 = (torch.randn(1, 2, 131, D, device="cuda", dtype=torch.float16) for _ in range(2))
    for variant in ("v1", "v2", "v3", *V4_STEPS):
        for causal in (False, True):
            forward(q, k2, v2, causal=causal, variant=variant)
    for causal in (False, True):
        forward(q, k2, v2, causal=causal, warps=4, block_n=64, m_tiles=2)
    kv1 = k2[:, :1].contiguous(), v2[:, :1].contiguous()      # one K/V head for two query heads
    for variant in V4_STEPS:
        for offset in (131 - 77, -20):                        # bottom-right; rows that see no key
            _forward(q, *kv1, True, D ** -0.5, variant, diag_offset=offset)
    if torch.cuda.get_device_capability()[0] >= 8:
        grids = [c for c in experiment_configs(D).values() if c.warp_grid and c.dkdv_smem <= max_smem_per_block()]
        for cfg in grids:
            for qq, kv, causal in ((q, kv1, "bottom-right"), (q, (k2, v2), True), (k2, (q, q), "bottom-right"),
                                   (k2, (q, q), False)):   # Nq < Nk and Nq > Nk (rows that see no key)
                o, lse = flashtut.tiled_attention(qq, *kv, causal=causal, return_lse=True)
                cuda_backward(qq, *kv, o, lse, torch.randn_like(qq), causal, config=cfg)
    q.requires_grad_(); k2.requires_grad_(); v2.requires_grad_()
    for deterministic in (False, True):
        flashtut.cuda_attention(q, k2, v2, causal=True, deterministic=deterministic).sum().backward()
if torch.cuda.get_device_capability() == (9, 0):
    from flashtut.cuda.hopper import forward_hopper

    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            q = torch.randn(1, 4, 77, D, device="cuda", dtype=dtype)
            k, v = (torch.randn(1, 2, 131, D, device="cuda", dtype=dtype) for _ in range(2))
            for causal in (False, True, "bottom-right"):
                forward_hopper(q, k, v, causal=causal)
                forward_hopper(k.repeat(1, 2, 1, 1), q[:, :2], q[:, :2], causal=causal)  # Nq > Nk
            for block_n, pv_split in ((64, True), (128, False)):
                forward_hopper(q, k, v, causal=True, block_n=block_n, pv_split=pv_split)
            # rung W2 (TMA, mbarriers) only when asked: until its gpu test has passed on the machine, a
            # kernel that never finishes would cost every tool's whole run
            # (FLASHTUT_SANITIZE_W2=1); rung W3 (named-barrier ping-pong on top of W2's ring) the same way
            for variant in ("w2", "w3"):
                if os.environ.get(f"FLASHTUT_SANITIZE_{variant.upper()}") != "1":
                    continue
                for causal in (False, True, "bottom-right"):
                    forward_hopper(q, k, v, causal=causal, variant=variant)
                    forward_hopper(k.repeat(1, 2, 1, 1), q[:, :2], q[:, :2], causal=causal, variant=variant)
                forward_hopper(q, k, v, causal=True, variant=variant, block_n=64, stages=3)
                # 64-key tiles, causal, 131 queries: the upper consumer reads more tiles than the lower one,
                # and the last block's upper consumer has no row (W3's idle turns)
                forward_hopper(k[:, :, :131], k, v, causal=True, variant=variant, block_n=64)
            # W3 with three consumer warpgroups (192-row blocks, D = 64), behind its own switch
            # (FLASHTUT_SANITIZE_W3C3=1) for the same reason
            if D == 64 and os.environ.get("FLASHTUT_SANITIZE_W3C3") == "1":
                for causal in (False, True, "bottom-right"):
                    forward_hopper(q, k, v, causal=causal, variant="w3", consumers=3)
                    forward_hopper(k.repeat(1, 2, 1, 1), q[:, :2], q[:, :2], causal=causal, variant="w3",
                                   consumers=3)
                forward_hopper(k[:, :, :131], k, v, causal=True, variant="w3", block_n=64, consumers=3)
            # W4 (W3 with persistent blocks), behind FLASHTUT_SANITIZE_W4=1
            if os.environ.get("FLASHTUT_SANITIZE_W4") == "1":
                w4_launches(D, q, k, v)
torch.cuda.synchronize()
print("sanitizer launches done")
