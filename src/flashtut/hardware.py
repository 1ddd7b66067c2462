"""GPU facts for chapter 01 and the roofline model: datasheets only (no I/O, no measuring).

The table holds vendor figures (datasheets and architecture whitepapers, named in each entry's
``source``); the CUDA C++ Programming Guide's table of compute capabilities gives the shared-memory
limits. Tensor-core rates are *dense* (the datasheets also print a figure "with sparsity", twice
as large, that only 2:4-sparse matrices reach); the TF32 rate is the tensor cores' rate for
float32 matrices rounded to TF32, which Ampere introduced and PyTorch uses only when
``torch.backends.cuda.matmul.allow_tf32`` is on. Capacities and bandwidths are in the vendor's
decimal units: 1 GB = 1e9 bytes, 1 TB/s = 1e12 bytes per second.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

_CUDA_GUIDE = ("NVIDIA, CUDA C++ Programming Guide, 'Compute Capabilities' table "
               "(shared memory per SM and per block), https://docs.nvidia.com/cuda/cuda-c-programming-guide/")


@dataclass(frozen=True)
class GPUSpec:
    """Published figures of one GPU model."""
    name: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_gb: float                 # device memory (HBM or GDDR), GB = 1e9 bytes
    memory_type: str
    memory_bandwidth_gbps: float     # GB/s
    sm_count: int
    smem_per_sm_kib: int             # largest shared-memory carve-out of one SM
    smem_per_block_kib: int          # largest shared memory one thread block may opt into
    l2_mib: float
    registers_per_sm_kib: int        # 65536 32-bit registers on all of these
    boost_clock_mhz: int
    fp16_tensor_tflops: float        # dense, fp32 accumulate where the datasheet says so
    bf16_tensor_tflops: float | None  # None: no bf16 tensor cores
    fp32_tflops: float               # plain fp32 on the CUDA cores (no tensor cores)
    source: str
    tf32_tensor_tflops: float | None = None  # dense TF32 (Ampere and newer); None: no TF32 mode
    #: exponentials (``ex2``, the special-function unit MUFU) per clock per SM: 16 from compute
    #: capability 7.x to 9.0 (CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table)
    exp_per_clock_per_sm: int = 16
    #: the clock (MHz) the datasheet's dense tensor rate is quoted at, None: ``boost_clock_mhz``.
    #: The H100 SXM's 989.4 TFLOP/s is 4096 FLOP per clock per SM at 1830 MHz, below its 1980 MHz
    #: maximum boost; the exponential rate is taken at the same clock.
    rated_clock_mhz: int | None = None

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def smem_bandwidth_tbps(self) -> float:
        """Aggregate shared-memory bandwidth, TB/s: each SM serves 32 banks x 4 bytes per clock.

        An upper bound at boost clock; it is the "about 19 TB/s" of on-chip SRAM that the
        FlashAttention paper quotes for the A100.
        """
        return self.sm_count * 32 * 4 * self.boost_clock_mhz * 1e6 / 1e12

    @property
    def smem_total_mib(self) -> float:
        """All the shared memory of the chip together, MiB: tiny next to device memory."""
        return self.sm_count * self.smem_per_sm_kib / 1024

    @property
    def exp_tera_per_s(self) -> float:
        """Exponentials per second (10^12) of the special-function units at the rated clock:
        ``sm_count * exp_per_clock_per_sm * clock``. On an H100/H200, 132 x 16 x 1830 MHz = 3.9
        (the "3.9 TFLOPS of special functions" of the FlashAttention-3 paper), 256 times fewer
        than its 989.4 dense float16 TFLOP/s: one exponential per score costs as much time as the
        2d = 256 FLOPs of a d = 128 dot product."""
        clock = self.rated_clock_mhz or self.boost_clock_mhz
        return self.sm_count * self.exp_per_clock_per_sm * clock * 1e6 / 1e12

    def peak_tflops(self, dtype: torch.dtype = torch.float16) -> float:
        """The dense matrix rate for ``dtype`` (tensor cores for 16-bit types, CUDA cores for fp32)."""
        if dtype == torch.float16:
            return self.fp16_tensor_tflops
        if dtype == torch.bfloat16:
            if self.bf16_tensor_tflops is None:
                raise ValueError(f"dtype: the {self.name} has no bfloat16 tensor cores; accepted: float16, float32")
            return self.bf16_tensor_tflops
        if dtype == torch.float32:
            return self.fp32_tflops
        raise ValueError(f"dtype: got {dtype}; accepted: float16, bfloat16, float32")

    def ridge_point(self, dtype: torch.dtype = torch.float16) -> float:
        """FLOP per byte at which the roofline turns: below it a kernel is memory-bound."""
        return self.peak_tflops(dtype) * 1e12 / (self.memory_bandwidth_gbps * 1e9)


_A100 = GPUSpec(
    name="A100 40GB SXM", architecture="Ampere (GA100)", compute_capability=(8, 0),
    memory_gb=40, memory_type="HBM2", memory_bandwidth_gbps=1555, sm_count=108,
    smem_per_sm_kib=164, smem_per_block_kib=163, l2_mib=40, registers_per_sm_kib=256,
    boost_clock_mhz=1410, fp16_tensor_tflops=312, bf16_tensor_tflops=312, fp32_tflops=19.5,
    source="NVIDIA A100 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/a100/); "
           "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020); " + _CUDA_GUIDE,
    tf32_tensor_tflops=156)

_H100 = GPUSpec(
    name="H100 SXM", architecture="Hopper (GH100)", compute_capability=(9, 0),
    memory_gb=80, memory_type="HBM3", memory_bandwidth_gbps=3350, sm_count=132,
    smem_per_sm_kib=228, smem_per_block_kib=227, l2_mib=50, registers_per_sm_kib=256,
    boost_clock_mhz=1980, fp16_tensor_tflops=989.4, bf16_tensor_tflops=989.4, fp32_tflops=67,
    source="NVIDIA H100 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h100/); "
           "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022); " + _CUDA_GUIDE,
    tf32_tensor_tflops=494.7, rated_clock_mhz=1830)

GPUS: dict[str, GPUSpec] = {
    "T4": GPUSpec(
        name="T4", architecture="Turing (TU104)", compute_capability=(7, 5),
        memory_gb=16, memory_type="GDDR6", memory_bandwidth_gbps=320, sm_count=40,
        smem_per_sm_kib=64, smem_per_block_kib=64, l2_mib=4, registers_per_sm_kib=256,
        boost_clock_mhz=1590, fp16_tensor_tflops=65, bf16_tensor_tflops=None, fp32_tflops=8.1,
        source="NVIDIA T4 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/tesla-t4/); "
               "NVIDIA Turing GPU Architecture whitepaper (2018); " + _CUDA_GUIDE),
    "A100-40GB": _A100,
    "A100-80GB": replace(_A100, name="A100 80GB SXM", memory_gb=80, memory_type="HBM2e",
                         memory_bandwidth_gbps=2039),
    "H100-SXM": _H100,
    # the same GH100 compute as the H100 SXM, with more and faster memory
    "H200-SXM": replace(
        _H100, name="H200 SXM", memory_gb=141, memory_type="HBM3e", memory_bandwidth_gbps=4800,
        source="NVIDIA H200 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h200/), "
               "same GH100 compute as the H100 SXM; " + _CUDA_GUIDE),
}


def spec_for(device_name: str) -> GPUSpec | None:
    """The table entry for a device name as CUDA reports it (``torch.cuda.get_device_name()``),
    or ``None`` for a GPU the table does not hold. PCIe boards share the SXM entry's chip but run
    slower clocks and memory, so their measured rates sit below it."""
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str, got {type(device_name).__name__}")
    name = device_name.upper()
    if "H200" in name:
        return GPUS["H200-SXM"]
    if "H100" in name:
        return GPUS["H100-SXM"]
    if "A100" in name:
        return GPUS["A100-80GB" if "80G" in name else "A100-40GB"]
    if "T4" in name.replace("RTX", ""):
        return GPUS["T4"]
    return None


def gpu_table(names=None) -> list[dict]:
    """One dict per GPU (for display), with the derived columns next to the published ones."""
    rows = []
    for key in names or GPUS:
        g = GPUS[key]
        row = asdict(g)
        row["compute_capability"] = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        row["smem_bandwidth_tbps"] = round(g.smem_bandwidth_tbps, 1)
        row["smem_total_mib"] = round(g.smem_total_mib, 1)
        row["ridge_fp16_flop_per_byte"] = round(g.ridge_point(torch.float16), 1)
        row["exp_tera_per_s"] = g.exp_tera_per_s
        rows.append(row)
    return rows


def format_gpu_table(names=None, part: str = "all") -> str:
    """A markdown table of the published figures (for ``IPython.display.Markdown``). ``part``:
    ``"all"`` (ten columns), or one of two halves narrow enough for a book's text column:
    ``"memory"`` (compute capability, memory, bandwidth, SMs, shared memory, L2) and
    ``"compute"`` (the dense tensor rates, plain fp32 and the exponential rate)."""
    if part not in ("all", "memory", "compute"):
        raise ValueError(f"part: got {part!r}; accepted: 'all', 'memory' or 'compute'")
    columns = {  # header, alignment, cell
        "compute capability": ("---", lambda r: r["compute_capability"]),
        "memory": ("---", lambda r: f'{r["memory_gb"]:g} GB {r["memory_type"]}'),
        "bandwidth (GB/s)": ("---:", lambda r: f'{r["memory_bandwidth_gbps"]:,}'),
        "SMs": ("---:", lambda r: str(r["sm_count"])),
        "shared memory per SM / per block (KiB)": (
            "---", lambda r: f'{r["smem_per_sm_kib"]} / {r["smem_per_block_kib"]}'),
        "L2 (MiB)": ("---:", lambda r: f'{r["l2_mib"]:g}'),
        "fp16 tensor (TFLOP/s)": ("---:", lambda r: f'{r["fp16_tensor_tflops"]:g}'),
        "bf16 tensor (TFLOP/s)": ("---:", lambda r: "none" if r["bf16_tensor_tflops"] is None
                                  else f'{r["bf16_tensor_tflops"]:g}'),
        "fp32 (TFLOP/s)": ("---:", lambda r: f'{r["fp32_tflops"]:g}'),
        "exp (10¹²/s)": ("---:", lambda r: f'{r["exp_tera_per_s"]:.1f}'),
    }
    names_of = {"memory": list(columns)[:6], "compute": list(columns)[6:],
                "all": list(columns)[:9]}
    chosen = names_of[part]
    lines = ["| GPU | " + " | ".join(chosen) + " |",
             "| --- | " + " | ".join(columns[c][0] for c in chosen) + " |"]
    for r in gpu_table(names):
        lines.append(f'| {r["name"]} | ' + " | ".join(columns[c][1](r) for c in chosen) + " |")
    return "\n".join(lines)


def attainable_tflops(intensity, peak_tflops: float, bandwidth_gbps: float):
    """The roofline: ``min(peak, bandwidth * intensity)`` in TFLOP/s.

    ``intensity`` (FLOP per byte of device-memory traffic) may be a number or a tensor.
    """
    if not (peak_tflops > 0 and bandwidth_gbps > 0):
        raise ValueError(f"peak_tflops and bandwidth_gbps must be positive, got {peak_tflops}, {bandwidth_gbps}")
    memory_roof = bandwidth_gbps * 1e9 * intensity / 1e12
    if isinstance(intensity, torch.Tensor):
        return torch.clamp(memory_roof, max=peak_tflops)
    return min(peak_tflops, memory_roof)
