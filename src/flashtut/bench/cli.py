"""The ``python -m flashtut.bench`` command line (documented in ``flashtut.bench``)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

from . import registry
from ..costs.flops import MODES
from .profile import SETS as PROFILE_SETS
from .provenance import collect
from .report import memory_table, notes, roofline_table, speed_table
from .results import load_results, save_results
from .roofline import INSTRUCTIONS, MATMUL_DTYPES, copy_bandwidth, instruction_peak, matmul_rate
from .sweeps import MEMORY_PRESETS, PRESETS, dtype_name, parse_dtype, protocol_cases, run_memory, run_speed

EXAMPLES = """examples:
  python -m flashtut.bench list
  python -m flashtut.bench run --preset smoke
  python -m flashtut.bench run --preset protocol --impl sdpa-flash,sdpa-cudnn,triton,cuda --out speed.json
  python -m flashtut.bench run --impl naive,tiled -N 200,333 --nk 257 -D 64 --heads 2 --batch 1 --dtype float32
  python -m flashtut.bench memory --preset protocol --impl naive,sdpa-flash,triton,cuda --out memory.json
  python -m flashtut.bench roofline --out roofline.json
  python -m flashtut.bench run --preset cuda-ladder --out ladder.json      # presets: see run --help
  python -m flashtut.bench host --label after --out host.json
  python -m flashtut.bench decode --lengths 1024,4096,16384,65536 --batch 1,32 --out decode.json
  python -m flashtut.figures plot speed.json memory.json roofline.json --out-dir figures   # draw them
"""

#: upper bounds of the numeric options: beyond them a run would not finish (a warm-up of hours) or
#: a value cannot be used at all (torch seeds are 64-bit)
MAX_BUDGET_MS = 60_000.0
MAX_SEED = 2**63 - 1
MAX_THREADS = 4096
MAX_INT = 2**31 - 1            # sizes, counts: beyond it no tensor dimension or loop is meaningful


#: the largest copy (MiB) and square matmul the roofline measures: 64 GiB, and three n x n float32
#: matrices of 12 GiB; beyond them no GPU holds the operands
MAX_COPY_MIB = 65536
MAX_MATMUL_N = 32768
MAX_REF_GIB = 1024.0


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (what was wrong) and exit status 2, without the usage
    block: the rule for every command line of the package."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ------------------------------------------------------------------------------- parsing
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    if value > MAX_INT:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to 2**31 - 1, got {value}")
    return value


def _at_most(parse, limit, what: str):
    """``parse`` (``_positive_int`` or ``_positive_float``), then at most ``limit`` ``what``."""
    def bounded(text: str):
        value = parse(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"expected at most {limit:g} {what}, got {text!r}")
        return value
    return bounded


def _label(text: str) -> str:
    if not text.strip() or "\n" in text:
        raise argparse.ArgumentTypeError(f"expected a non-empty one-line label, got {text!r}")
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


_ref_gib = _at_most(_positive_float, MAX_REF_GIB, "GiB")
_budget_ms = _at_most(_positive_float, MAX_BUDGET_MS, "ms per measurement")
_thread_count = _at_most(_positive_int, MAX_THREADS, "threads")


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to 2**63 - 1, got {text!r}")
    return value


def _writable_parent(path: Path, what: str) -> None:
    """The first existing folder above ``path`` must be a writable folder (not a file)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{what} {str(path)!r} lies under {str(parent)!r}, which is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{what} {str(path)!r}: the folder {str(parent)!r} is not writable")


def output_file(text: str) -> Path:
    """An ``--out`` file, checked before anything is measured: not a folder, not under a file."""
    path = Path(text).expanduser()
    if not text or path.is_dir() or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; accepted: the path of a .json file to write")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not writable")
    _writable_parent(path, "output file")
    return path


def output_dir(text: str) -> Path:
    """An ``--out-dir`` folder, checked before anything is drawn: a folder, or creatable as one."""
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a file; accepted: a folder (created if missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"the folder {text!r} is not writable")
        return path
    _writable_parent(path, "output folder")
    return path


def _int_list(text: str) -> list[int]:
    values = [_positive_int(t) for t in text.split(",") if t.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive integers, got {text!r}")
    return values


#: the longest a single ncu run may be given (an hour): beyond it a limit stops nothing
MAX_TIMEOUT_S = 3600.0


def _timeout_s(text: str) -> float:
    value = _positive_float(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TIMEOUT_S:g} seconds, got {text!r}")
    return value


def _dtype_list(text: str) -> list[torch.dtype]:
    try:
        dtypes = [parse_dtype(t.strip()) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not dtypes:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of dtypes, got {text!r}")
    return dtypes


def _mode_list(text: str) -> list[str]:
    modes = [t.strip() for t in text.split(",") if t.strip()]
    if not modes:
        raise argparse.ArgumentTypeError(f"no mode given; accepted: {', '.join(MODES)} (comma-separated)")
    for m in modes:
        if m not in MODES:
            raise argparse.ArgumentTypeError(f"unknown mode {m!r}; accepted: {', '.join(MODES)} (comma-separated)")
    return modes


def _device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; accepted: auto, cpu, cuda, cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"device must be auto, cpu or cuda[:N], got {text!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("--device cuda was asked for but torch sees no CUDA GPU")
    return dev


_CAUSAL = {"yes": (True,), "no": (False,), "both": (False, True)}


def _flatten(values):
    return [x for v in values for x in v] if values else None


def _threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=_thread_count,
                   help="CPU threads for torch (torch.set_num_threads); on a busy machine 1 gives steadier times")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=_device, default="auto", help="auto (GPU if present), cpu, cuda or cuda:N")
    p.add_argument("--impl", action="append", metavar="LIST",
                   help="implementations or groups, comma-separated or repeated (see `list`); "
                        "default: naive,tiled on the CPU, all on a GPU")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--force", action="store_true", help="run tiled even above its size limit")
    _threads(p)
    p.add_argument("--out", metavar="FILE.json", type=output_file,
                   help="write the rows and their provenance as JSON here (rewritten as the sweep goes)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show it")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m flashtut.bench",
        description="Check and time attention implementations side by side "
                    "(naive, tiled, PyTorch SDPA backends, Triton, CUDA) and write the results; "
                    "python -m flashtut.figures plot draws them. Full documentation: "
                    "the docstring of flashtut.bench (python -c 'import flashtut.bench as b; help(b)').",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("list", help="list the implementations and whether each can run here",
                       description="List the implementations and whether each can run on this device.")
    p.add_argument("--device", type=_device, default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", type=_dtype_list, default=None, help="dtype to ask about (default: float16 on a GPU, float32 on the CPU)")
    p.add_argument("-D", "--head-dim", type=_positive_int, default=64, help="head dim to ask about (default 64)")

    p = sub.add_parser("run", help="check and time implementations over a sweep of shapes",
                       description="Check every implementation against a reference, then time it "
                                   "(median, warm-up excluded), forward and backward.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="; ".join(f"{k}: {v['what']}" for k, v in PRESETS.items())
                        + " (default: protocol on a GPU, cpu on the CPU)")
    p.add_argument("--mode", type=_mode_list, action="append", metavar="LIST", help="fwd, bwd or fwd,bwd")
    p.add_argument("--dtype", type=_dtype_list, action="append", metavar="LIST",
                   help="float16, bfloat16, float32, float64 (comma-separated)")
    p.add_argument("-N", "--seqlen", type=_int_list, action="append", metavar="LIST",
                   help="query lengths N (comma-separated)")
    p.add_argument("--nk", type=_positive_int, help="key length for every case (default: Nk = N)")
    p.add_argument("-D", "--head-dim", type=_int_list, action="append", metavar="LIST", help="head dims")
    heads = p.add_mutually_exclusive_group()
    heads.add_argument("-H", "--heads", type=_positive_int, help="heads (default: hidden // D)")
    heads.add_argument("--hidden", type=_positive_int, help="hidden size: heads = hidden // D")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("-B", "--batch", type=_positive_int, help="batch size (default: tokens // N)")
    batch.add_argument("--tokens", type=_positive_int, help="total tokens: batch = tokens // N")
    p.add_argument("--causal", choices=sorted(_CAUSAL), help="causal masking: yes, no or both")
    p.add_argument("--scale", type=_positive_float, help="softmax scale (default 1/sqrt(D))")
    p.add_argument("--warmup-ms", type=_budget_ms, default=25.0, help="warm-up budget per measurement (ms)")
    p.add_argument("--rep-ms", type=_budget_ms, default=100.0, help="timing budget per measurement (ms)")
    p.add_argument("--ref-budget-gib", type=_ref_gib,
                   help="memory for the reference on a GPU (default 4): it runs on a slice of batch and heads that fits")
    p.add_argument("--memory", action="store_true", help="also record each call's peak extra memory")
    p.add_argument("--baseline", default="sdpa-flash", help="implementation the ratio column divides by")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")

    p = sub.add_parser("memory", help="peak extra memory of one call against N",
                       description="Peak extra memory of one forward (or forward + backward) as N "
                                   "doubles; an implementation that runs out of memory is not tried at larger N.")
    _common(p)
    p.add_argument("--preset", choices=sorted(MEMORY_PRESETS),
                   help="; ".join(f"{k}: {v['what']}" for k, v in MEMORY_PRESETS.items())
                        + " (default: protocol on a GPU, cpu on the CPU)")
    p.add_argument("-B", "--batch", type=_positive_int)
    p.add_argument("-H", "--heads", type=_positive_int)
    p.add_argument("-D", "--head-dim", type=_positive_int)
    p.add_argument("--dtype", type=_dtype_list)
    p.add_argument("--n-min", type=_positive_int, help="first N (doubled up to --n-max)")
    p.add_argument("--n-max", type=_positive_int, help="last N")
    p.add_argument("-N", "--seqlen", type=_int_list, help="explicit N list (instead of --n-min/--n-max)")
    p.add_argument("--causal", choices=["yes", "no"], default="no")
    p.add_argument("--mode", type=_mode_list, default=["fwd"], help="fwd (one forward) and/or bwd (forward + backward)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")

    p = sub.add_parser("roofline", help="copy bandwidth and matmul TFLOP/s (the roofline's ceilings)",
                       description="Measure device-to-device copy bandwidth and square matmul TFLOP/s.")
    p.add_argument("--device", type=_device, default="auto")
    p.add_argument("--dtype", default="float16,bfloat16,float32",
                   help=f"matmul dtypes, comma-separated, of {', '.join(MATMUL_DTYPES)}")
    p.add_argument("--what", default="copy,matmul",
                   help="comma-separated, of copy, matmul and instruction (each tensor-core instruction's "
                        f"own ceiling: {', '.join(INSTRUCTIONS)}, in the 16-bit dtypes of --dtype)")
    p.add_argument("--copy-mib", type=_at_most(_positive_int, MAX_COPY_MIB, "MiB"),
                   help=f"bytes copied, MiB (default 2048 on a GPU, 256 on the CPU; at most {MAX_COPY_MIB})")
    p.add_argument("--matmul-n", type=_at_most(_positive_int, MAX_MATMUL_N, "rows"),
                   help=f"matrix size n (default 8192 on a GPU, 1024 on the CPU; at most {MAX_MATMUL_N})")
    p.add_argument("--warmup-ms", type=_budget_ms, default=25.0)
    p.add_argument("--rep-ms", type=_budget_ms, default=100.0)
    p.add_argument("--seed", type=_seed, default=0)
    _threads(p)
    p.add_argument("--out", metavar="FILE.json", type=output_file)

    p = sub.add_parser("host", help="host time per call at a tiny size (per-call overhead)",
                       description="Microseconds per call of each entry point, forward and forward + "
                                   "backward, at B=1, H=1, N=128, D=64, float16: best of five runs of "
                                   "back-to-back calls. GPU only.")
    p.add_argument("--impl", action="append", metavar="LIST",
                   help="implementations, comma-separated or repeated (default cuda,triton,sdpa-flash)")
    p.add_argument("--calls", type=_positive_int, default=1000, help="calls per run (default 1000)")
    p.add_argument("--label", type=_label, default="this checkout", help="the version measured (default 'this checkout')")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--out", metavar="FILE.json", type=output_file)

    p = sub.add_parser("real-models", help="grouped-query heads, a sliding window and packed batches: "
                                           "Triton against SDPA flash",
                       description="Grouped-query heads (32 over 8, D 128, N 16384), a window of 4096 at "
                                   "N 16384 (TFLOP/s of visible keys: SDPA flash has no window and runs full "
                                   "causal), and packed against padded batches of the same 16384 tokens; "
                                   "each checked against a reference before it is timed, forward and backward.")
    p.add_argument("--device", type=_device, default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--small", action="store_true", help="tiny sizes (for a CPU: Triton through its interpreter)")
    p.add_argument("--warmup-ms", type=_budget_ms, default=25.0, help="warm-up budget per measurement (ms)")
    p.add_argument("--rep-ms", type=_budget_ms, default=100.0, help="timing budget per measurement (ms)")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--out", metavar="FILE.json", type=output_file)

    p = sub.add_parser("decode", help="decode attention over a KV cache: bandwidth fraction, paged cost, x SDPA",
                       description="One new query per sequence against caches of --lengths positions: the Triton "
                                   "split-KV kernel over a contiguous and a paged cache, and SDPA's fused backends "
                                   "on the dense cache; bytes per step over time against the copy bandwidth "
                                   "measured in the same run. Each checked, then timed by CUDA-graph replays.")
    p.add_argument("--device", type=_device, default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--lengths", type=_int_list, default=[1024, 4096, 16384, 65536], help="cache lengths")
    p.add_argument("--batch", type=_int_list, default=[1, 32], help="batch sizes")
    p.add_argument("--dtype", type=_dtype_list, default=None, help="default float16,bfloat16 (float32 on the CPU)")
    p.add_argument("--heads", type=_positive_int, default=32, help="query heads (default 32)")
    p.add_argument("--kv-heads", type=_positive_int, default=8, help="key/value heads (default 8)")
    p.add_argument("-D", "--head-dim", type=_positive_int, default=128, help="head dim (default 128)")
    p.add_argument("--page-sizes", type=_int_list, default=[64, 16],
                   help="page sizes of the paged rows; each must divide the largest (default 64,16)")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--out", metavar="FILE.json", type=output_file)

    p = sub.add_parser("sass", help="instruction counts (SASS) of compiled kernels: ours and SDPA flash",
                       description="Count the instructions (HGMMA, HMMA, UTMALDG, LDGSTS, LDSM ...) in the "
                                   "machine code of our Triton kernels (the cubins of Triton cache folders), "
                                   "our CUDA forward kernels (NVRTC builds) and SDPA's flash forward (in "
                                   "libtorch_cuda.so), and write them, with the speed rows given, as one file "
                                   "(flashtut.bench.sass).")
    p.add_argument("--what", type=_sass_parts, default=["triton", "cuda", "sdpa"],
                   help="comma-separated: triton, cuda, sdpa (default: all three)")
    p.add_argument("--triton-cache", action="append", default=[], type=_setting_path, metavar="SETTING=DIR",
                   help="a Triton cache folder that one process filled, and the setting it ran under")
    p.add_argument("--speed", action="append", default=[], type=_setting_path, metavar="SETTING=FILE.json",
                   help="speed rows of one `run` process, and the setting it ran under")
    p.add_argument("--part", action="append", default=[], metavar="FILE.json", type=_existing_file,
                   help="the rows of another sass file to include (a part run in parallel)")
    p.add_argument("--listings", metavar="DIR", type=output_dir, help="also write each Triton kernel's whole SASS there")
    p.add_argument("--torch-lib", type=_existing_file,
                   help="the library with SDPA's kernels (default: torch's libtorch_cuda.so)")
    p.add_argument("--arch", default="sm_90", type=_arch, help="architecture of the SDPA kernels to read (default sm_90)")
    p.add_argument("-D", "--head-dim", type=_positive_int, default=128, help="head dim of the kernels (default 128)")
    p.add_argument("--out", metavar="FILE.json", type=output_file)

    p = sub.add_parser("profile", help="Nsight Compute metrics of one launch of each Hopper forward (ncu, sm_90)",
                       description="Run ncu over one launch of each forward of a set (flashtut.bench.profile: "
                                   "'ladder', SDPA flash, the mma.sync forward and the Hopper rungs; 'options', "
                                   "W3 with each build option; 'overlap', cuda_attention's build with each "
                                   "softmax pin, the lazy rescale and stepped descriptors; 'shipped', "
                                   "cuda_attention's Hopper build as it ships and as the other sets profiled "
                                   "it) at the protocol's "
                                   "N = 4096, float16, and write "
                                   "each launch's metrics (tensor pipe, stall reasons, pipes, issue) as one row.")
    p.add_argument("--set", type=_profile_sets, default=["ladder", "options"],
                   help=f"comma-separated: {', '.join(PROFILE_SETS)} (default: ladder,options)")
    p.add_argument("-D", "--head-dim", type=_int_list, default=[128, 64], help="head dims (default 128,64)")
    p.add_argument("--ncu", default="ncu", help="the Nsight Compute command line tool (default: ncu)")
    p.add_argument("--timeout-s", type=_timeout_s, default=300.0, help="limit per set and head dim (s, at most 3600)")
    p.add_argument("--launch", nargs=2, metavar=("SET", "D"), help=argparse.SUPPRESS)   # the child ncu profiles
    p.add_argument("--out", metavar="FILE.json", type=output_file)

    for name, p in sub.choices.items():     # the GPU scripts pass --no-progress to every command
        if "--no-progress" not in p._option_string_actions:
            p.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                           help=f"accepted everywhere; `{name}` shows no progress bar anyway")
    return parser


def _names_from(allowed: tuple[str, ...]):
    """An argparse type: a non-empty comma-separated list of names from ``allowed``."""
    def parse(text: str) -> list[str]:
        parts = [t.strip() for t in text.split(",") if t.strip()]
        if not parts or any(t not in allowed for t in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(allowed)}, got {text!r}")
        return parts
    return parse


_sass_parts = _names_from(("triton", "cuda", "sdpa"))


def _arch(text: str) -> str:
    import re

    if not re.fullmatch(r"sm_[0-9]{2,3}a?", text):
        raise argparse.ArgumentTypeError(f"expected an architecture such as sm_90 or sm_80, got {text!r}")
    return text
_profile_sets = _names_from(PROFILE_SETS)


def _setting_path(text: str) -> tuple[str, str]:
    # a setting may itself hold "=" (DISABLE_MMA_V3=1=dir): the path is what follows the last one
    setting, _, path = text.rpartition("=")
    if not setting or not path:
        raise argparse.ArgumentTypeError(f"expected SETTING=PATH, got {text!r}")
    if not Path(path).expanduser().exists():
        raise argparse.ArgumentTypeError(f"{path!r} (in {text!r}) does not exist")
    return setting, path


def _existing_file(text: str) -> str:
    if not Path(text).expanduser().is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return text


# ------------------------------------------------------------------------------- commands
def _impls(parser, args, device, preset=None):
    default = (["naive", "tiled"] if device.type == "cpu" else ["all"])
    spec = _flatten([[s] for s in args.impl]) if args.impl else list((preset or {}).get("impls") or default)
    try:
        return registry.expand(spec)
    except ValueError as e:
        parser.error(str(e))


class _Saver:
    """Rewrites the JSON file every few seconds during a sweep, so a run that is cut short
    (a time limit on a lent GPU) keeps what it measured."""

    def __init__(self, path, kind, provenance, config, every_s: float = 5.0):
        self.path, self.kind, self.prov, self.config, self.every = path, kind, provenance, config, every_s
        self.rows, self.last = [], time.monotonic()

    def __call__(self, row):
        self.rows.append(row)
        if self.path and time.monotonic() - self.last > self.every:
            self.flush()

    def flush(self):
        if self.path:
            save_results(self.path, self.kind, self.rows, self.prov, self.config)
            self.last = time.monotonic()


def _cmd_list(args) -> int:
    device = args.device
    dtype = (args.dtype or [torch.float16 if device.type == "cuda" else torch.float32])[0]
    print(f"implementations on {device} for {dtype_name(dtype)}, D={args.head_dim}:")
    for name in registry.names():
        impl = registry.get(name)
        reason = impl.check(device, dtype, args.head_dim)
        modes = "fwd,bwd" if impl.has_backward else "fwd"
        state = "available" if reason is None else f"unavailable: {reason}"
        print(f"  {name:15s} {modes:8s} {state}")
        print(f"  {'':15s} {'':8s} {impl.description}")
    variants, why = registry.ladder_variants()
    if why:
        print(f"  cuda-v*         fwd      unavailable: {why}")
    return 0


def _cmd_run(parser, args, argv) -> int:
    device = args.device
    preset = PRESETS[args.preset or ("protocol" if device.type == "cuda" else "cpu")]
    impls = _impls(parser, args, device, preset)
    modes = _flatten(args.mode) or list(preset["modes"])
    dtypes = _flatten(args.dtype) or [parse_dtype(d) for d in preset["dtypes"]]
    seqlens = _flatten(args.seqlen) or list(preset["seqlens"])
    head_dims = _flatten(args.head_dim) or list(preset["head_dims"])
    causal = _CAUSAL[args.causal] if args.causal else tuple(preset["causal"])
    hidden = None if args.heads else (args.hidden or preset["hidden"])
    tokens = None if args.batch else (args.tokens or preset["tokens"])
    try:
        cases = protocol_cases(tokens, seqlens, head_dims, dtypes, causal, hidden=hidden, heads=args.heads,
                               batch=args.batch, nk=args.nk, scale=args.scale)
    except ValueError as e:
        parser.error(str(e))
    try:
        registry.get(args.baseline)
    except (KeyError, ValueError):
        parser.error(f"--baseline: unknown implementation {args.baseline!r}; accepted: a name of "
                     "`python -m flashtut.bench list`, such as sdpa-flash")
    config = {"impls": [i.name for i in impls], "modes": modes, "dtypes": [dtype_name(d) for d in dtypes],
              "seqlens": seqlens, "nk": args.nk, "head_dims": head_dims, "causal": list(causal),
              "heads": args.heads, "hidden": hidden, "batch": args.batch, "tokens": tokens, "scale": args.scale,
              "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "seed": args.seed, "force": args.force,
              "preset": args.preset}
    saver = _Saver(args.out, "speed", collect(device, argv), config)
    budget = int(args.ref_budget_gib * 2**30) if args.ref_budget_gib else None
    print(f"{len(cases)} cases x {len(impls)} implementations x {len(modes)} modes on {device}", file=sys.stderr)
    try:
        rows = run_speed(impls, cases, modes, device, args.warmup_ms, args.rep_ms, args.seed, args.force,
                         budget, args.memory, args.progress, on_row=saver)
    finally:                            # an interrupted sweep still leaves what it measured
        if any(i.name == "triton" for i in impls):
            config["triton_configs"] = registry.triton_tuning()
        saver.flush()
    print(speed_table(rows, args.baseline, args.markdown))
    for line in notes(rows):
        print(line)
    if args.out:
        print(f"wrote {len(rows)} rows to {args.out}")
    bad = [r for r in rows if r["status"] in ("failed", "error")]
    if bad:
        print(f"{len(bad)} measurement(s) failed their check or raised an error (see above)", file=sys.stderr)
    return 1 if bad else 0


def _cmd_memory(parser, args, argv) -> int:
    device = args.device
    preset = MEMORY_PRESETS[args.preset or ("protocol" if device.type == "cuda" else "cpu")]
    if args.impl:
        impls = _impls(parser, args, device)
    else:
        default = ["naive", "tiled"] if device.type == "cpu" else ["naive", "sdpa", "triton", "cuda"]
        impls = registry.expand(default)
    B = args.batch or preset["B"]
    H = args.heads or preset["H"]
    D = args.head_dim or preset["D"]
    dtype = (args.dtype or [parse_dtype(preset["dtype"])])[0]
    if args.seqlen:
        seqlens = args.seqlen
    else:
        lo, hi = args.n_min or preset["n_min"], args.n_max or preset["n_max"]
        if lo > hi:
            parser.error(f"--n-min ({lo}) must not exceed --n-max ({hi})")
        seqlens = []
        while lo <= hi:
            seqlens.append(lo)
            lo *= 2
    config = {"impls": [i.name for i in impls], "B": B, "H": H, "D": D, "dtype": dtype_name(dtype),
              "seqlens": seqlens, "causal": args.causal == "yes", "modes": args.mode, "preset": args.preset}
    saver = _Saver(args.out, "memory", collect(device, argv), config)
    try:
        rows = run_memory(impls, seqlens, B, H, D, dtype, args.causal == "yes", args.mode, device, args.seed,
                          args.force, args.progress, on_row=saver)
    finally:
        saver.flush()
    print(f"peak extra memory of one {'forward' if args.mode == ['fwd'] else 'call'}: "
          f"B={B}, H={H}, D={D}, {dtype_name(dtype)}, on {device} ({rows[0]['method'] if rows else ''})")
    print(memory_table(rows, args.markdown))
    for line in notes(rows):
        print(line)
    if args.out:
        print(f"wrote {len(rows)} rows to {args.out}")
    return 1 if any(r["status"] == "error" for r in rows) else 0


def _cmd_roofline(parser, args, argv) -> int:
    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    for d in dtypes:
        if d not in MATMUL_DTYPES:
            parser.error(f"unknown matmul dtype {d!r}; accepted: {', '.join(MATMUL_DTYPES)}")
    what = [w.strip() for w in args.what.split(",") if w.strip()]
    for w in what:
        if w not in ("copy", "matmul", "instruction"):
            parser.error(f"unknown --what {w!r}; accepted: copy, matmul, instruction")
    copy_bytes = args.copy_mib * 2**20 if args.copy_mib else None
    saver = _Saver(args.out, "roofline", collect(args.device, argv),
                   {"dtypes": dtypes, "copy_bytes": copy_bytes, "matmul_n": args.matmul_n, "what": what},
                   every_s=0.0)
    try:                                    # each row is saved as soon as it is measured
        if "copy" in what:
            saver(copy_bandwidth(args.device, copy_bytes, args.warmup_ms, args.rep_ms, args.seed))
        for dtype in dtypes if "matmul" in what else ():
            saver(matmul_rate(args.device, dtype, args.matmul_n, args.warmup_ms, args.rep_ms, args.seed))
        for instruction in INSTRUCTIONS if "instruction" in what else ():
            for dtype in (d for d in dtypes if d in ("float16", "bfloat16")):
                saver(instruction_peak(args.device, instruction, dtype, args.warmup_ms, args.rep_ms))
    finally:
        saver.flush()
    rows = saver.rows
    print(f"roofline ceilings on {args.device}:")
    print(roofline_table(rows))
    if args.out:
        print(f"wrote {len(rows)} rows to {args.out}")
    return 1 if any(r.get("status") == "error" for r in rows) else 0


def _cmd_host(parser, args, argv) -> int:
    from .host import HOST_IMPLS, run_host

    if not torch.cuda.is_available():
        parser.error("host needs a CUDA GPU (it times kernel launches); torch sees none")
    spec = _flatten([[s] for s in args.impl]) if args.impl else list(HOST_IMPLS)
    try:
        impls = [i.name for i in registry.expand(spec)]
    except ValueError as e:
        parser.error(str(e))
    saver = _Saver(args.out, "host", collect(torch.device("cuda"), argv),
                   {"impls": impls, "calls": args.calls, "label": args.label}, every_s=0.0)
    try:
        run_host(impls, args.calls, args.label, seed=args.seed, on_row=saver)
    finally:
        saver.flush()
    for r in saver.rows:
        value = f"{r['us_per_call']:8.1f} us per call" if r["us_per_call"] is not None else f"{r['status']}: {r['reason']}"
        print(f"{args.label:>14s}  {r['entry']:24s} {value}")
    if args.out:
        print(f"wrote {len(saver.rows)} rows to {args.out}")
    return 1 if any(r["status"] == "error" for r in saver.rows) else 0


def _cmd_real_models(parser, args, argv) -> int:
    from .real_models import run_real_models, summary

    if args.device.type == "cpu" and not args.small:
        parser.error("real-models at full size needs a CUDA GPU; add --small for a CPU run")
    if args.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("real-models --small on a CPU runs Triton through its interpreter, which must be chosen "
                     "before triton is imported: TRITON_INTERPRET=1 python -m flashtut.bench real-models --small")
    config = {"small": args.small, "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "seed": args.seed}
    saver = _Saver(args.out, "speed", collect(args.device, argv), config, every_s=0.0)
    try:
        run_real_models(args.device, args.warmup_ms, args.rep_ms, args.seed, small=args.small, on_row=saver)
    finally:
        saver.flush()
    for line in summary(saver.rows):
        print(line)
    if args.out:
        print(f"wrote {len(saver.rows)} rows to {args.out}")
    return 1 if any(r["status"] in ("failed", "error") for r in saver.rows) else 0


def _cmd_decode(parser, args, argv) -> int:
    from .decode import run_decode, summary_table

    if args.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("decode on a CPU runs Triton through its interpreter, which must be chosen before triton "
                     "is imported: TRITON_INTERPRET=1 python -m flashtut.bench decode --device cpu ...")
    if args.heads % args.kv_heads:
        parser.error(f"argument --kv-heads: {args.kv_heads} does not divide --heads {args.heads}")
    if args.head_dim > 128:
        parser.error(f"argument -D/--head-dim: the decode kernel takes 1 to 128, got {args.head_dim}")
    big = max(args.page_sizes)
    if any(big % p for p in args.page_sizes):
        parser.error(f"argument --page-sizes: each must divide the largest ({big}), got {args.page_sizes}")
    dtypes = args.dtype or ([torch.float16, torch.bfloat16] if args.device.type == "cuda" else [torch.float32])
    config = {"lengths": args.lengths, "batch": args.batch, "dtypes": [dtype_name(d) for d in dtypes],
              "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
              "page_sizes": args.page_sizes, "seed": args.seed}
    saver = _Saver(args.out, "decode", collect(args.device, argv), config, every_s=0.0)
    try:
        run_decode(args.device, args.lengths, args.batch, dtypes, args.heads, args.kv_heads, args.head_dim,
                   tuple(args.page_sizes), args.seed, on_row=saver)
    finally:
        saver.flush()
    print(summary_table(saver.rows))
    if args.out:
        print(f"wrote {len(saver.rows)} rows to {args.out}")
    return 1 if any(r.get("status") in ("failed", "error") for r in saver.rows) else 0


def _cmd_sass(parser, args, argv) -> int:
    from . import sass

    if "triton" in args.what and not args.triton_cache:
        parser.error("--what triton counts the kernels of Triton cache folders: give at least one "
                     "--triton-cache SETTING=DIR (a folder one `run` process filled), or leave triton out of --what")
    for setting, folder in args.triton_cache:
        if not Path(folder).expanduser().is_dir():
            parser.error(f"--triton-cache: {folder!r} (setting {setting!r}) is not a folder")
    for setting, path in args.speed:
        if not Path(path).expanduser().is_file():
            parser.error(f"--speed: {path!r} (setting {setting!r}) is not a file")
    cuobjdump = sass.find_cuobjdump()
    if cuobjdump is None and ("triton" in args.what or "sdpa" in args.what):
        parser.error("cuobjdump not found: install the CUDA toolkit, or triton (its wheel carries one)")
    rows, failed = [], False
    for setting, path in [(None, p) for p in args.part] + list(args.speed):
        try:
            got = load_results(path)["rows"]
        except (OSError, ValueError) as exc:   # a part cut off by its time limit: say so, keep the rest
            failed = True
            print(f"{path}: {exc}", flush=True)
            continue
        rows += got if setting is None else sass.tag_speed_rows(got, setting)
    steps = []
    if "triton" in args.what:
        steps += [(f"triton {setting}", "triton", setting,
                   lambda d=d, setting=setting: sass.triton_cache_rows(d, cuobjdump, setting, args.listings))
                  for setting, d in args.triton_cache]
    if "cuda" in args.what:
        steps.append(("cuda", "cuda", "default", lambda: sass.cuda_kernel_rows(head_dim=args.head_dim)))
    if "sdpa" in args.what:
        steps.append(("sdpa-flash", "sdpa-flash", "default",
                      lambda: sass.sdpa_flash_rows(cuobjdump, args.torch_lib, args.arch, args.head_dim,
                                                     timeout_s=45)))
    for what, impl, setting, step in steps:
        try:
            got = step()
            print(f"{what}: {len(got)} kernels", flush=True)
            rows += got
        except Exception as exc:  # noqa: BLE001 - one missing part must not lose the others
            failed = True
            print(f"{what}: {type(exc).__name__}: {exc}", flush=True)
            rows.append(sass.error_row(impl, setting, exc))
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    config = {"what": args.what, "triton_cache": dict(args.triton_cache), "speed": dict(args.speed),
              "arch": args.arch, "head_dim": args.head_dim, "cuobjdump": cuobjdump}
    if args.out:
        save_results(args.out, "sass", rows, collect(device, argv), config)
        print(f"wrote {len(rows)} rows to {args.out}")
    for line in sass.summary(rows):
        print(line)
    return 1 if failed else 0


def _cmd_profile(parser, args, argv) -> int:
    if args.launch:                                  # the child process: launch one set once, under ncu
        set_name, D = args.launch
        if set_name not in PROFILE_SETS or not D.isdigit():
            parser.error(f"--launch: got {set_name} {D}; accepted: a set of {', '.join(PROFILE_SETS)} and a head dim")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        parser.error("profile runs the Hopper kernels under ncu: run it on an sm_90 GPU (H100, H200)")
    from . import profile

    if args.launch:
        profile.run_launches(args.launch[0], int(args.launch[1]))
        return 0

    rows = []
    for D in args.head_dim:
        for set_name in args.set:
            got = profile.profile(set_name, D, args.ncu, args.timeout_s)
            print(f"{set_name} D = {D}: {len(got)} launches profiled", flush=True)
            for r in got:
                m = r["metrics"]
                print(f"  {r['impl']:28s} causal {str(r['causal']):5s} {m.get(profile.DURATION, 0) / 1e6:7.3f} ms  "
                      f"tensor {m.get(profile.TENSOR, 0):5.1f}%", flush=True)
            rows += got
    if args.out:
        config = {"sets": args.set, "head_dims": args.head_dim, "metrics": list(profile.NCU_METRICS),
                  "ncu": " ".join(profile.ncu_command("<set>", "<D>", args.ncu))}
        save_results(args.out, "profile", rows, collect(torch.device("cuda"), argv), config)
        print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command == "list":
        return _cmd_list(args)
    if args.command == "run":
        return _cmd_run(parser, args, argv)
    if args.command == "memory":
        return _cmd_memory(parser, args, argv)
    if args.command == "host":
        return _cmd_host(parser, args, argv)
    if args.command == "real-models":
        return _cmd_real_models(parser, args, argv)
    if args.command == "sass":
        return _cmd_sass(parser, args, argv)
    if args.command == "decode":
        return _cmd_decode(parser, args, argv)
    if args.command == "profile":
        return _cmd_profile(parser, args, argv)
    return _cmd_roofline(parser, args, argv)
