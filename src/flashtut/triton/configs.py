"""Launch configurations for the Triton attention kernels: the autotuning search space.

A configuration fixes the tile shape (``BLOCK_M`` query rows x ``BLOCK_N`` key rows),
the number of warps that share a program and the depth of the software pipeline
(``num_stages``: how many K/V tiles are in flight in shared memory while the current one
is multiplied). The search space is small on purpose: every entry costs a compilation
(seconds) and a timing run per new autotuning key, and the good corners are known from
the hardware:

* Hopper (sm_90, 228 KB shared memory per SM, warpgroup MMA): ``BLOCK_M = 128`` rows per
  program, 4 or 8 warps (one or two warpgroups), 3-4 stages.
* Ampere/Ada (sm_80..89, 100-164 KB shared memory): the same shapes with fewer stages,
  and a smaller fallback that fits the 100 KB parts.
* Head dims above 128 (160 to 256, padded to 256): a 256-wide tile row takes twice
  the shared memory and registers of a 128-wide one, so the tiles shrink (32 or 64
  keys, two stages) to fit the 227 KB of a Hopper block, the 163 KB of an A100's and
  the 99 KB of the Ampere/Ada parts (sm_86/89); when the first entry does not fit a
  GPU, the launch takes the next one that does.
* float32 inputs use exact fp32 dot products (no tensor cores), whose tiles take twice
  the shared memory and registers: small tiles only.
* The interpreter (CPU) gets one tiny fixed configuration, no sweep: it runs each
  program in NumPy, so tiles of 16 keep the tests fast and still exercise partial tiles
  and multi-tile loops.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def check_tile_config(name: str, cfg: TileConfig) -> TileConfig:
    """Every shape the kernels can run: block sizes powers of two from 16 (``tl.arange``
    needs a power of two and ``tl.dot`` at least 16 rows), warps a power of two, one
    stage or more. Any pair of block sizes gives right results (the loops of each kernel
    tile on one grid)."""
    for field in ("block_m", "block_n", "num_warps", "num_stages"):
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}.{field} must be a positive int, got {value!r}")
    for field in ("block_m", "block_n"):
        value = getattr(cfg, field)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name}.{field} must be a power of two >= 16, "
                             f"got {value}")
    if cfg.num_warps & (cfg.num_warps - 1):
        raise ValueError(f"{name}.num_warps must be a power of two, "
                         f"got {cfg.num_warps}")
    return cfg


def _cfgs(rows):
    return [TileConfig(*r) for r in rows]


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel, GPU generation and head-dim
# class (``head_dim_class``), best first; the measurements behind each list are in
# the worklog, book/perflog_triton.md.
FWD = {
    ("hopper", "small"): _cfgs([(128, 64, 4, 3), (128, 128, 8, 3),
                                (128, 64, 8, 3), (128, 64, 8, 4)]),
    ("hopper", "large"): _cfgs([(128, 64, 8, 3), (128, 128, 8, 3),
                                (128, 64, 8, 4), (128, 128, 8, 2)]),
    ("ampere", "small"): _cfgs([(128, 64, 4, 3), (128, 32, 4, 3),
                                (64, 64, 4, 3), (64, 32, 4, 2)]),
    ("ampere", "large"): _cfgs([(128, 64, 8, 3), (128, 32, 4, 3),
                                (64, 64, 4, 3), (64, 32, 4, 2)]),
    ("hopper", "wide"): _cfgs([(128, 32, 8, 3), (128, 32, 8, 2),
                               (64, 32, 4, 1)]),
    ("ampere", "wide"): _cfgs([(64, 64, 8, 2), (64, 32, 4, 2),
                               (64, 32, 4, 1)]),
}
# dK/dV kernel: BLOCK_N keys stay in the program, BLOCK_M query rows stream past them
BWD_DKDV = {
    ("hopper", "small"): _cfgs([(64, 64, 4, 3), (64, 128, 8, 3),
                                (32, 128, 8, 3), (32, 64, 4, 3)]),
    ("hopper", "large"): _cfgs([(64, 128, 8, 3), (64, 128, 8, 2),
                                (32, 128, 8, 3), (32, 64, 4, 3)]),
    ("ampere", "small"): _cfgs([(32, 128, 8, 2), (64, 64, 4, 2),
                                (32, 64, 4, 2), (32, 32, 4, 1)]),
    ("ampere", "large"): _cfgs([(64, 64, 8, 2), (32, 128, 8, 2),
                                (32, 64, 4, 2), (32, 32, 4, 1)]),
    ("hopper", "wide"): _cfgs([(32, 32, 4, 2), (32, 64, 8, 2),
                               (64, 64, 8, 2)]),
    ("ampere", "wide"): _cfgs([(64, 64, 8, 2), (32, 64, 8, 2),
                               (32, 32, 4, 2)]),
}
# dQ kernel: BLOCK_M query rows stay in the program, BLOCK_N keys stream past them
BWD_DQ = {
    ("hopper", "small"): _cfgs([(64, 64, 4, 3), (128, 64, 8, 3),
                                (128, 32, 4, 3)]),
    ("hopper", "large"): _cfgs([(128, 64, 8, 3), (128, 64, 8, 4),
                                (64, 64, 4, 3), (128, 32, 8, 3)]),
    ("ampere", "small"): _cfgs([(64, 64, 4, 2), (128, 32, 4, 2),
                                (64, 32, 4, 2), (32, 32, 4, 1)]),
    ("ampere", "large"): _cfgs([(64, 64, 4, 2), (128, 32, 8, 2),
                                (32, 32, 4, 1)]),
    ("hopper", "wide"): _cfgs([(128, 32, 8, 2), (64, 64, 8, 2),
                               (64, 32, 4, 2)]),
    ("ampere", "wide"): _cfgs([(64, 64, 8, 2), (64, 32, 4, 2),
                               (32, 32, 4, 1)]),
}
# The first entry of a list is what runs with autotuning off; a sliding window (every
# dK/dV program sees the same short query range) puts its own first choice in front.
WINDOW_FIRST = {
    ("dkdv", "hopper", "large"): TileConfig(64, 128, 8, 2),
}
# exact fp32 dot products: small tiles, whatever the generation
FP32 = {
    "fwd": _cfgs([(64, 32, 4, 2), (32, 32, 4, 2)]),
    "dkdv": _cfgs([(32, 64, 4, 2), (32, 32, 4, 1)]),
    "dq": _cfgs([(64, 32, 4, 2), (32, 32, 4, 1)]),
}
# float32 with a head dim above 128: a 256-wide float32 row is 1 KB: the smallest tiles
FP32_WIDE = {
    "fwd": _cfgs([(32, 16, 4, 1), (16, 16, 4, 1)]),
    "dkdv": _cfgs([(16, 32, 4, 1), (16, 16, 4, 1)]),
    "dq": _cfgs([(32, 16, 4, 1), (16, 16, 4, 1)]),
}
# the interpreter: one fixed, tiny, deterministic choice per kernel
INTERPRETER = {
    "fwd": TileConfig(16, 16, 1, 1),
    "dkdv": TileConfig(16, 32, 1, 1),
    "dq": TileConfig(32, 16, 1, 1),
}
_TABLES = {"fwd": FWD, "dkdv": BWD_DKDV, "dq": BWD_DQ}


def generation(capability: tuple[int, int]) -> str:
    """``"hopper"`` for sm_90 and newer, ``"ampere"`` for sm_80..89."""
    return "hopper" if capability[0] >= 9 else "ampere"


def head_dim_class(block_d: int) -> str:
    """The tile tables' head-dim class of a padded head dim: ``"small"`` (up to 64),
    ``"large"`` (128) or ``"wide"`` (256)."""
    if block_d <= 64:
        return "small"
    return "large" if block_d <= 128 else "wide"


def search_space(kernel: str, capability: tuple[int, int], fp32: bool, block_d: int,
                 window: bool = False) -> list[TileConfig]:
    """The configurations the autotuner times for ``kernel`` (``"fwd"``, ``"dkdv"``,
    ``"dq"``), first the one used when autotuning is off (``window``: the sliding
    window's first choice, ``WINDOW_FIRST``, moved to the front). Head dims of 32 or
    less time only two: their tiles are cheap and those sizes are not where the time
    goes. With autotuning off, a launch takes the first entry that fits the GPU's
    shared memory."""
    if fp32:
        return list(FP32[kernel]) if block_d <= 128 else list(FP32_WIDE[kernel])
    gen, size = generation(capability), head_dim_class(block_d)
    space = list(_TABLES[kernel][gen, size])
    first = WINDOW_FIRST.get((kernel, gen, size)) if window else None
    if first is not None:
        space = [first] + [c for c in space if c != first]
    if block_d <= 32:
        space = space[:2]
    return space


def fused_backward_default(capability: tuple[int, int], fp32: bool, causal: bool,
                           window: bool) -> bool:
    """Whether the backward runs fused (dQ added with float32 atomics by the dK/dV
    program) by default. Measured on the H200 (``tools/gpu_triton_window.sh``): the
    deterministic two-kernel backward is kept everywhere until a measurement shows the
    fused one ahead."""
    return False


def length_bucket(n: int) -> int:
    """Autotuning key for a sequence length: the next power of two (at least 128), so a
    sweep runs once per size class rather than once per exact length."""
    b = 128
    while b < n:
        b *= 2
    return b
