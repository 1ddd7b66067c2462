"""The Hopper forward (chapter 11): rungs W1 to W4, their builds (:func:`hopper_config`) and shared memory,
and the build ``cuda_attention`` ships on sm_90 (:data:`HOPPER_DEFAULT`, :data:`HOPPER_CONSUMERS`,
:data:`HOPPER_OPTIONS`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .limits import DTYPE_DEFINES, DTYPES

__all__ = ["HOPPER_VARIANTS", "W2_REGS", "W3_WIDE", "HOPPER_HEAD_DIMS", "HOPPER_ARCH", "HopperConfig",
           "w1_smem_bytes", "w2_smem_bytes", "w3_smem_bytes", "w4_smem_bytes", "W3_FAMILY",
           "PERSISTENT_RUNGS", "check_consumers", "W3_OPTIONS", "W3_ORDER_ONLY", "check_w3_options",
           "hopper_config", "hopper_builds", "HOPPER_DEFAULT", "HOPPER_CONSUMERS", "HOPPER_OPTIONS",
           "HOPPER_BACKWARD_RUNG", "HOPPER_DETERMINISTIC_RUNG"]


#: the rungs of the Hopper ladder that exist, name -> what the rung adds
HOPPER_VARIANTS = {
    "w1": "wgmma for S = Q K^T (both operands from shared memory) and O += P V (P from registers), "
          "two consumer warpgroups of 64 rows, 128-byte swizzled tiles, cp.async double buffer",
    "w2": "W1 fed by TMA (cp.async.bulk.tensor) into a ring of shared-memory stages guarded by mbarriers, "
          "from a producer warpgroup that hands its registers to the consumers (setmaxnreg)",
    "w3": "W2 with the softmax overlapped with the tensor cores: each consumer issues the next tile's Q K^T "
          "before its softmax and P V (two wgmma groups in flight), and the two consumers take turns on the "
          "tensor cores through named barriers (ping-pong)",
    "w4": "W3 made persistent: one block per SM takes query blocks from a counter (causal: the heaviest "
          "first), loading the next one's Q and K/V while its consumers finish the last one",
}
#: W2's (and W3's) register split per thread after setmaxnreg: producer warpgroup, each consumer warpgroup
#: (128 * 24 + 256 * 240 = 64512 of an SM's 65536 32-bit registers)
W2_REGS = {"producer": 24, "consumer": 240}

#: W3 with three consumer warpgroups (``hopper_config(..., consumers=3)``): 192-row blocks of 512
#: threads, no ping-pong (turns in a ring with the c3_turns option), each consumer's registers after
#: setmaxnreg ((65536 - 128 * 24) / 384, rounded down to 8), built for D = 64 only (at D = 128 ptxas
#: spills and serialises the wgmma)
W3_WIDE = {"head_dims": (64,), "regs": 160}

#: head dims the Hopper forward is built for (its tiles are 64-column swizzled blocks)
HOPPER_HEAD_DIMS = (64, 128)

#: the target wgmma needs: the "a" suffix names features of this chip that later ones may lack
HOPPER_ARCH = "90a"


@dataclass(frozen=True)
class HopperConfig:
    """How one Hopper rung is built and launched for one (dtype, head dim)."""
    source: str
    kernel: str
    defines: tuple      # sorted (name, value) pairs passed as -D
    block_m: int        # query rows per block: a consumer warpgroup has 64
    block_n: int        # keys per K/V tile
    threads: int
    dynamic_smem: int   # bytes
    persistent: bool = False   # a rung of PERSISTENT_RUNGS

    @property
    def define_dict(self) -> dict:
        return dict(self.defines)

    @property
    def o_map(self) -> bool:
        """Stores its output with TMA (W3_OPTIONS' tma_store): the launch adds a tensor map of o after V's."""
        return bool(self.define_dict.get(W3_OPTIONS["tma_store"][0]))


def w1_smem_bytes(head_dim: int, block_n: int = 128, block_m: int = 128) -> int:
    """Q tile + two K tiles + two V tiles of 16-bit values, plus 1024 bytes of slack so that the
    tiles can start on the 1024-byte boundary the 128-byte swizzle repeats on."""
    return (block_m + 4 * block_n) * head_dim * 2 + 1024


def w2_smem_bytes(head_dim: int, block_n: int = 128, stages: int = 2, block_m: int = 128) -> int:
    """Q tile + ``stages`` K and V tiles, 1024 bytes of alignment slack and the mbarriers (8 bytes
    each: Q full, and per stage K full, V full and K/V empty)."""
    return (block_m + 2 * stages * block_n) * head_dim * 2 + 1024 + 8 * (1 + 3 * stages)


def w3_smem_bytes(head_dim: int, block_n: int = 128, stages: int = 2, block_m: int = 128) -> int:
    """W2's tiles and alignment slack, and one more mbarrier per stage: W3 releases K and V separately
    (Q full, and per stage K full, V full, K empty, V empty)."""
    return (block_m + 2 * stages * block_n) * head_dim * 2 + 1024 + 8 * (1 + 4 * stages)


def w4_smem_bytes(head_dim: int, block_n: int = 128, stages: int = 2, block_m: int = 128) -> int:
    """W3's, one more mbarrier (W4 refills Q for each query block once the consumers release it) and
    two 4-byte slots in which the producer hands the consumers the number of their next query block."""
    return w3_smem_bytes(head_dim, block_n, stages, block_m) + 8 + 8


#: the TMA rungs: variant -> (source, kernel, the prefix of its -D macros, its shared-memory size)
_TMA_RUNGS = {"w2": ("fwd_w2_tma.cu", "flash_fwd_w2", "W2", w2_smem_bytes),
              "w3": ("fwd_w3_pingpong.cu", "flash_fwd_w3", "W3", w3_smem_bytes),
              "w4": ("fwd_w4_persistent.cu", "flash_fwd_w4", "W3", w4_smem_bytes)}
#: the rungs built on W3's consumers, which may have three consumer warpgroups at D = 64
W3_FAMILY = ("w3", "w4")
#: the rungs whose blocks stay resident and take query blocks from a scheduler (grid: at most one block
#: per SM; the launch adds the head count and a counter after the tensor maps)
PERSISTENT_RUNGS = ("w4",)


def check_consumers(variant: str, consumers, head_dim: int | None = None) -> None:
    """ValueError unless rung ``variant`` is built with ``consumers`` consumer warpgroups (at
    ``head_dim``, where given): 2, or 3 for W3 and W4 at the head dims of :data:`W3_WIDE`."""
    if consumers not in (2, 3) or (consumers == 3 and variant not in W3_FAMILY):
        raise ValueError(f"consumers must be 2, or 3 with variant 'w3' or 'w4', got {consumers!r} with {variant!r}")
    if consumers == 3 and head_dim is not None and head_dim not in W3_WIDE["head_dims"]:
        raise ValueError(f"consumers=3 is built for head dim {W3_WIDE['head_dims'][0]} only (at D = 128 "
                         f"each consumer's {W3_WIDE['regs']} registers spill), got D = {head_dim}")


#: the W3 family's build options that ``cuda_attention`` ships (:data:`HOPPER_OPTIONS`): name -> (the -D macro,
#: the accepted values, the first of them the default, the rungs that take it, what it does). The options that
#: lost their measurement are in the history (tag ``lab/options-2026-12``), not in the kernels.
W3_OPTIONS = {
    "tma_store": ("W3_TMA_STORE", (False, True), ("w3",),
                  "each consumer warpgroup writes its output tile into its rows of the Q tile and one TMA copy "
                  "stores it, instead of 4-byte stores from registers"),
    "c3_turns": ("W3_C3_TURNS", (False, True), W3_FAMILY,
                 "three consumers take turns on the tensor cores in a ring 0, 1, 2 (named barriers, as two "
                 "do in ping-pong) instead of issuing whenever ready"),
    "uniform_wg": ("FT_WG_UNIFORM", (False, True), W3_FAMILY,
                   "the warpgroup index is lane 0's, broadcast by a warp shuffle, which ptxas then knows to be "
                   "the same in every lane: the wgmma descriptors stay in uniform registers instead of being "
                   "moved there (R2UR) before every wgmma"),
    "tail_first": ("FT_TAIL_FIRST", (False, True), ("w3",),
                   "causal: the query block short of rows (Nq not a multiple of the block's rows) is the "
                   "first, rows 0 .. Nq mod rows, instead of the last, so that it reads one key tile, not "
                   "every one with some consumers idle (without a mask nothing changes)"),
}


#: the options of :data:`W3_OPTIONS` that change only the order of a warpgroup's instructions (or which block
#: computes a query row), not its arithmetic: a build with them gives the same bits as without (the gpu tests
#: check it with torch.equal)
W3_ORDER_ONLY = ("c3_turns", "tail_first", "uniform_wg")


def check_w3_options(variant: str, options: dict) -> dict:
    """``options`` (:data:`W3_OPTIONS` names -> values) as -D macros for ``variant``; ValueError naming the
    first unknown option, value of the wrong type or value, or option the rung does not take."""
    defines = {}
    for name, value in options.items():
        if name not in W3_OPTIONS:
            raise ValueError(f"unknown Hopper build option {name!r}; accepted: {', '.join(W3_OPTIONS)}")
        macro, values, rungs, what = W3_OPTIONS[name]
        if type(value) is not bool or value not in values:
            raise ValueError(f"{name} ({what}) takes a bool, got {value!r}")
        if value != values[0]:
            if variant not in rungs:
                raise ValueError(f"{name} is built for variant {' or '.join(map(repr, rungs))} only, got {variant!r}")
            defines[macro] = int(value)
    return defines


def hopper_config(variant: str, dtype: torch.dtype, head_dim: int, block_n: int = 128,
                  pv_split: bool = True, stages: int = 2, consumers: int = 2, **options) -> HopperConfig:
    """Build and launch parameters of Hopper rung ``variant``. ``block_n`` (64 or 128): keys per tile,
    the N of the S = Q K^T wgmma. ``pv_split`` (D = 128 only): O += P V as two 64-column wgmma per
    16 keys instead of one 128-column wgmma (whose descriptor needs the leading-dimension offset);
    W2 and W3 always split. ``stages`` (W2 and W3, 2 to 4): K/V stages in their ring.
    ``consumers`` (W3 and W4): consumer warpgroups of 64 rows, 2 (ping-pong) or 3 (192-row blocks,
    FlashAttention-3's shape at head dim 64: :data:`W3_WIDE`; turns in a ring only with ``c3_turns``).
    ``options``: the W3 family's build options, :data:`W3_OPTIONS` (``tma_store``, ``c3_turns``, ``uniform_wg``,
    ``tail_first``), each off by default."""
    if variant not in HOPPER_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(HOPPER_VARIANTS)}, got {variant!r}")
    if dtype not in DTYPE_DEFINES:
        raise ValueError(f"dtype must be float16 or bfloat16, got {dtype}")
    if head_dim not in HOPPER_HEAD_DIMS:
        raise ValueError(f"head dim D = {head_dim} is not supported; accepted: {', '.join(map(str, HOPPER_HEAD_DIMS))}")
    if block_n not in (64, 128):
        raise ValueError(f"block_n must be 64 or 128, got {block_n!r}")
    check_consumers(variant, consumers, head_dim)
    extra = check_w3_options(variant, options)
    if options.get("tail_first") and options.get("tma_store"):
        raise ValueError("tail_first's first query block may end inside a consumer's 64 rows, which tma_store "
                         "writes as one box over the next block's rows; choose one")
    if options.get("c3_turns") and consumers != 3:
        raise ValueError(f"c3_turns ({W3_OPTIONS['c3_turns'][3]}) needs consumers=3; two consumers always "
                         f"take turns, got consumers={consumers}")
    if variant in _TMA_RUNGS:
        source, kernel, prefix, smem = _TMA_RUNGS[variant]
        if not pv_split:
            raise ValueError(f"pv_split=False is a W1 variant; {prefix} always splits P V into 64-column wgmma")
        if stages not in (2, 3, 4):
            raise ValueError(f"stages must be 2, 3 or 4, got {stages!r}")
        d = {**DTYPE_DEFINES[dtype], "HEAD_DIM": head_dim, f"{prefix}_BLOCK_N": block_n, f"{prefix}_STAGES": stages}
        if consumers != 2:
            d["W3_CONSUMERS"] = consumers
        d.update(extra)
        return HopperConfig(source, kernel, tuple(sorted(d.items())), 64 * consumers, block_n,
                            128 * (1 + consumers), smem(head_dim, block_n, stages, block_m=64 * consumers),
                            variant in PERSISTENT_RUNGS)
    if stages != 2:
        raise ValueError(f"stages applies to W2 and W3 only (W1 double-buffers), got {stages!r}")
    d = {**DTYPE_DEFINES[dtype], "HEAD_DIM": head_dim, "W1_BLOCK_N": block_n, "W1_PV_SPLIT": int(bool(pv_split))}
    return HopperConfig("fwd_w1_wgmma.cu", "flash_fwd_w1", tuple(sorted(d.items())), 128, block_n, 256,
                        w1_smem_bytes(head_dim, block_n))


def hopper_builds() -> list[HopperConfig]:
    """Every build the Hopper forward makes at its defaults (the CPU tests compile exactly these)."""
    return ([hopper_config(v, dt, d) for v in HOPPER_VARIANTS for dt in DTYPES for d in HOPPER_HEAD_DIMS]
            + [hopper_config(v, dt, d, consumers=3) for v in W3_FAMILY for dt in DTYPES for d in W3_WIDE["head_dims"]])


#: the Hopper rung ``cuda_attention`` runs on sm_90: W3, the fastest at every case of the protocol
#: (book/perflog_hopper.md; W4 is slower at N = 16384)
HOPPER_DEFAULT = "w3"
#: its consumer warpgroups per head dim, the faster measured: three at D = 64, two (ping-pong) at D = 128
HOPPER_CONSUMERS = {64: 3, 128: 2}
#: its build options per head dim (:data:`W3_OPTIONS`), each kept where the performance log measured it
#: faster than W3 without it in the protocol's cases
HOPPER_OPTIONS = {64: {"c3_turns": True, "tail_first": True, "uniform_wg": True}, 128: {"tma_store": True}}

#: the Hopper backward (``bwd_hopper.cu``) rung ``cuda_attention`` runs on sm_90 per head dim, the faster
#: measured against SDPA flash: b3 (dQ tiles by TMA reduce-add) at D = 64, b4 (dQ issued before dV and
#: dK) at D = 128; other head dims and the deterministic mode keep the mma.sync backward
HOPPER_BACKWARD_RUNG = {64: "b3", 128: "b4"}
#: the rung whose dK/dV-only build the Hopper backward's deterministic mode runs (dQ from the mma.sync
#: backward's separate pass, which adds in a fixed order)
HOPPER_DETERMINISTIC_RUNG = "b2"
