"""Sweeps: which cases to measure (presets) and the loops that measure them.

``run_speed`` checks and times each implementation on each case, forward and backward, and
returns one row per (case, implementation, mode). ``run_memory`` measures the peak extra memory
of one call as N grows, stopping an implementation once it runs out of memory. Both take the
same inputs for every implementation of a case (random normal, never zeros: zeros hide unwritten
outputs and can run faster than real data), and never raise for a failing implementation: its
row says what happened (``status``: ``ok``, ``failed`` the check, ``unavailable``, ``oom``,
``error``, or ``skipped``).
"""
from __future__ import annotations

import gc
import itertools
from dataclasses import asdict, dataclass

import torch

from . import registry
from .accuracy import Reference
from ..costs.flops import MODES, attention_flops, tflops
from .memory import cpu_method, is_oom, peak_extra_memory, release_cached
from .registry import AUTOGRAD, Impl
from .timing import time_fn, timer_name
from ..devices import default_device

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16,
          "fp32": torch.float32, "fp64": torch.float64}


def parse_dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[str(name).lower().replace("torch.", "")]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; accepted: float16, bfloat16, float32, float64 "
                         "(or fp16, bf16, fp32, fp64)") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Case:
    """One attention problem: shape, dtype, causal, scale (``None`` = ``1/sqrt(D)``)."""
    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    dtype: torch.dtype
    causal: bool = False
    scale: float | None = None

    def __post_init__(self):
        for name in ("B", "H", "Nq", "Nk", "D"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"scale must be positive or None, got {self.scale!r}")

    @property
    def shape(self):
        return (self.B, self.H, self.Nq, self.Nk, self.D)

    def describe(self) -> dict:
        d = asdict(self)
        d["dtype"] = dtype_name(self.dtype)
        d["N"] = self.Nq
        return d


# ------------------------------------------------------------------------------- presets
#: name -> what it is, and the sweep (tokens: batch = tokens // N; heads from hidden // D); ``impls``
#: (when there) is the preset's default list of implementations
PRESETS = {
    "protocol": dict(
        what="the book's performance protocol (FlashAttention-2 paper sweep): 16k tokens, hidden 2048",
        tokens=16384, hidden=2048, head_dims=(64, 128), seqlens=(512, 1024, 2048, 4096, 8192, 16384),
        dtypes=("float16", "bfloat16"), causal=(False, True), modes=("fwd", "bwd")),
    "cpu": dict(
        what="the protocol scaled down for a CPU: 512 tokens, hidden 256, float32",
        tokens=512, hidden=256, head_dims=(64, 128), seqlens=(64, 128, 256, 512),
        dtypes=("float32",), causal=(False, True), modes=("fwd", "bwd")),
    "smoke": dict(
        what="a seconds-long check that everything runs: 2 heads, N 61 and 128 (odd on purpose)",
        tokens=128, hidden=64, head_dims=(32,), seqlens=(61, 128), dtypes=("float32",),
        causal=(False, True), modes=("fwd", "bwd")),
    "triton-autotune": dict(
        what="chapter 07: the Triton kernels against SDPA flash at the protocol's long shapes (run it "
             "with autotuning on; the picked configurations are saved with the results)",
        impls=("triton", "sdpa-flash"), tokens=16384, hidden=2048, head_dims=(64, 128), seqlens=(4096, 16384),
        dtypes=("float16", "bfloat16"), causal=(False, True), modes=("fwd", "bwd")),
    "triton-sweep": dict(
        what="chapter 07's speed against N: Triton, SDPA flash and naive attention, D 128, float16",
        impls=("triton", "sdpa-flash", "naive"), tokens=16384, hidden=2048, head_dims=(128,),
        seqlens=(512, 1024, 2048, 4096, 8192, 16384), dtypes=("float16",), causal=(False, True),
        modes=("fwd", "bwd")),
    "cuda-ladder": dict(
        what="chapter 08: naive attention, every CUDA forward step (forward only), the fast kernel and SDPA "
             "flash, forward and backward, N 4096 and 16384, D 128 and 64, float16 and bfloat16",
        impls=("naive", "cuda-ladder", "cuda", "sdpa-flash"), tokens=16384, hidden=2048, head_dims=(128, 64),
        seqlens=(4096, 16384), dtypes=("float16", "bfloat16"), causal=(False, True), modes=("fwd", "bwd")),
    "hopper": dict(
        what="chapter 11: the Hopper rungs (sm_90 only) against SDPA flash and cuDNN and the fast mma.sync CUDA "
             "kernel, forward, N 4096 and 16384, D 128 and 64, float16 and bfloat16",
        impls=("sdpa-flash", "sdpa-cudnn", "cuda-mma", "hopper"), tokens=16384, hidden=2048, head_dims=(128, 64),
        seqlens=(4096, 16384), dtypes=("float16", "bfloat16"), causal=(False, True), modes=("fwd",)),
    "cuda-tiles": dict(
        what="the fast CUDA forward at other tile shapes (registry.TILE_CHOICES), float16, N 4096 and 16384",
        impls=("cuda-tiles", "cuda"), tokens=16384, hidden=2048, head_dims=(128, 64), seqlens=(4096, 16384),
        dtypes=("float16",), causal=(False, True), modes=("fwd",)),
}

MEMORY_PRESETS = {
    "protocol": dict(what="the book's memory sweep: one forward, B=1, H=16, D=128, float16",
                     B=1, H=16, D=128, dtype="float16", n_min=1024, n_max=131072),
    "cpu": dict(what="the memory sweep scaled down for a CPU: B=1, H=2, D=64, float32",
                B=1, H=2, D=64, dtype="float32", n_min=256, n_max=4096),
}


def protocol_cases(tokens: int, seqlens, head_dims, dtypes, causal=(False, True), hidden: int | None = None,
                   heads: int | None = None, batch: int | None = None, nk=None, scale=None) -> list[Case]:
    """Cases of a sweep: batch = ``tokens // N`` (at least 1) unless ``batch`` is given; heads
    = ``hidden // D`` unless ``heads`` is given; ``nk`` (if given) is the key length for all N."""
    if heads is None and hidden is None:
        raise ValueError("give heads or hidden (heads = hidden // D)")
    cases = []
    for D, dt, c, N in itertools.product(head_dims, dtypes, causal, seqlens):
        H = heads if heads is not None else max(1, hidden // D)
        B = batch if batch is not None else max(1, tokens // N)
        cases.append(Case(B, H, N, nk if nk is not None else N, D, parse_dtype(dt), bool(c), scale))
    return cases


def preset_cases(name: str) -> tuple[list[Case], tuple]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    p = PRESETS[name]
    return (protocol_cases(p["tokens"], p["seqlens"], p["head_dims"], p["dtypes"], p["causal"], hidden=p["hidden"]),
            p["modes"])


# ------------------------------------------------------------------------------- helpers
def make_inputs(case: Case, device, seed: int = 0):
    """``q, k, v, do`` of the case: standard normal, on ``device``, from ``seed``."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    B, H, Nq, Nk, D = case.shape

    def rnd(n):
        return torch.randn((B, H, n, D), generator=g, device=device, dtype=case.dtype)
    return rnd(Nq), rnd(Nk), rnd(Nk), rnd(Nq)


def split_output(out):
    """``(o, lse)`` from an implementation's forward, which returns ``o`` or ``(o, lse)``."""
    if isinstance(out, (tuple, list)):
        return out[0], (out[1] if len(out) > 1 else None)
    return out, None


class BackwardRun:
    """A forward done once (not timed) and a ``step()`` that runs only the backward."""

    def __init__(self, impl: Impl, q, k, v, do, causal, scale):
        self.impl, self.do = impl, do
        if impl.backward == AUTOGRAD:
            self.leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            with torch.enable_grad():
                self.o, _ = split_output(impl.forward(*self.leaves, causal, scale))
            self._step = self._autograd_step
        elif callable(impl.backward):
            if impl.forward_lse is None:
                raise ValueError(f"{impl.name}: an explicit backward needs forward_lse")
            self.leaves = []
            self.q, self.k, self.v = q, k, v
            self.causal, self.scale = causal, scale
            self.o, self.lse = impl.forward_lse(q, k, v, causal, scale)
            self._step = self._explicit_step
        else:
            raise ValueError(f"{impl.name} has no backward")

    def _autograd_step(self):
        # retain_graph: the same graph is replayed for every timed run, the forward is not redone
        self.o.backward(self.do, retain_graph=True)
        return tuple(t.grad for t in self.leaves)

    def _explicit_step(self):
        return self.impl.backward(self.q, self.k, self.v, self.o, self.lse, self.do, self.causal, self.scale)

    def step(self):
        for t in self.leaves:
            t.grad = None
        return self._step()


def _classify(exc: BaseException) -> tuple[str, str]:
    """Row status and message for an exception raised by an implementation."""
    msg = f"{type(exc).__name__}: {exc}".strip()
    if is_oom(exc):
        return "oom", "OOM: " + msg.splitlines()[0][:300]
    if isinstance(exc, (ValueError, NotImplementedError, ImportError)):
        return "unavailable", msg[:500]
    if isinstance(exc, RuntimeError) and "no available kernel" in msg.lower():
        return "unavailable", msg.splitlines()[0][:500]
    return "error", msg[:500]


# ------------------------------------------------------------------------------- speed
def _measure(impl: Impl, mode: str, case: Case, inputs, ref: Reference, device, warmup_ms, rep_ms,
             measure_memory: bool, row: dict) -> None:
    q, k, v, do = inputs
    c, s = case.causal, case.scale
    with impl.context():
        if mode == "fwd":
            with torch.no_grad():
                # the check sees the log-sum-exp too when the implementation can return it
                o, lse = split_output((impl.forward_lse or impl.forward)(q, k, v, c, s))
                check = ref.check_forward(o, lse)
                del o, lse
            row.update(check)
            if not check["passed"]:
                row["status"], row["reason"] = "failed", "result differs from the reference beyond tolerance"
                return

            def fn():
                return impl.forward(q, k, v, c, s)
            grads_to_reset = None
        else:
            run = BackwardRun(impl, q, k, v, do, c, s)
            grads = run.step()
            check = ref.check_backward(grads, run.o)
            del grads
            row.update(check)
            if not check["passed"]:
                row["status"], row["reason"] = "failed", "gradients differ from the reference beyond tolerance"
                return
            fn, grads_to_reset = run.step, run.leaves
        with torch.no_grad() if mode == "fwd" else torch.enable_grad():
            ms = time_fn(fn, device, warmup_ms, rep_ms, grad_to_none=grads_to_reset)
            if measure_memory:
                row["peak_extra_bytes"] = peak_extra_memory(fn, device)
    row["ms"] = ms
    row["tflops"] = tflops(row["flops"], ms)
    row["status"] = "ok"


def run_speed(impls, cases, modes=MODES, device=None, warmup_ms: float = 25, rep_ms: float = 100,
              seed: int = 0, force: bool = False, ref_budget_bytes: int | None = None,
              measure_memory: bool = False, progress: bool | None = None, on_row=None) -> list[dict]:
    """Check and time ``impls`` (names or ``Impl``) on ``cases``, in ``modes``; return the rows.

    ``ref_budget_bytes`` caps the memory of the reference (default: 4 GiB on a GPU, unlimited on
    the CPU); ``progress`` shows a tqdm bar (``None``: only on a terminal); ``on_row(row)`` is
    called as each row is done.
    """
    device = torch.device(device) if device is not None else default_device()
    impls = [registry.get(i) if isinstance(i, str) else i for i in impls]
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; accepted: {', '.join(MODES)}")
    if ref_budget_bytes is None and device.type == "cuda":
        ref_budget_bytes = 4 * 2**30
    from tqdm import tqdm

    bar = tqdm(total=len(cases) * len(impls) * len(modes), disable=(None if progress is None else not progress),
               desc="bench", unit="run", leave=False)
    timer = timer_name(device)
    rows = []
    try:
        for n, case in enumerate(cases):
            try:
                inputs = make_inputs(case, device, seed + n)
                ref = Reference(*inputs, case.causal, case.scale, ref_budget_bytes)
                setup_error = None
            except Exception as e:  # noqa: BLE001 - the inputs themselves may not fit
                inputs = ref = None
                setup_error = _classify(e)
                release_cached(device)
            for impl in impls:
                reason = impl.check(device, case.dtype, case.D, case.shape, "speed", force)
                for mode in modes:
                    bar.set_postfix_str(f"{impl.name} {mode} N={case.Nq} D={case.D}", refresh=False)
                    row = {"kind": "speed", "impl": impl.name, "mode": mode, **case.describe(),
                           "flops": attention_flops(*case.shape, causal=case.causal, mode=mode),
                           "ms": None, "tflops": None, "status": None, "reason": None,
                           "timer": timer, "seed": seed + n}
                    if ref is not None:
                        row["ref"] = ref.info()
                    if setup_error is not None:
                        row["status"], row["reason"] = setup_error
                    elif reason is not None:
                        row["status"], row["reason"] = "unavailable", reason
                    elif mode == "bwd" and not impl.has_backward:
                        row["status"], row["reason"] = "unavailable", f"{impl.name} is forward only"
                    else:
                        try:
                            _measure(impl, mode, case, inputs, ref, device, warmup_ms, rep_ms,
                                     measure_memory, row)
                        except Exception as e:  # noqa: BLE001 - a row says what went wrong
                            row["status"], row["reason"] = _classify(e)
                            del e
                            release_cached(device)
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
                    bar.update()
            del inputs, ref
            release_cached(device)
    finally:
        bar.close()
    return rows


# ------------------------------------------------------------------------------- memory
def run_memory(impls, seqlens, B: int = 1, H: int = 16, D: int = 128, dtype=torch.float16,
               causal: bool = False, modes=("fwd",), device=None, seed: int = 0, force: bool = False,
               progress: bool | None = None, on_row=None) -> list[dict]:
    """Peak extra memory of one call (``fwd``: a forward; ``bwd``: forward and backward) for
    each implementation as N grows (Nq = Nk = N). Once an implementation runs out of memory,
    its larger N are recorded as ``skipped``. On the CPU an implementation that materialises
    the score matrix is not started when it would need more than the free memory (the
    operating system would kill the process rather than raise an error): its row says ``oom``
    with the estimate."""
    device = torch.device(device) if device is not None else default_device()
    dtype = parse_dtype(dtype)
    impls = [registry.get(i) if isinstance(i, str) else i for i in impls]
    method = ("torch.cuda.max_memory_allocated" if device.type == "cuda" else cpu_method())
    from tqdm import tqdm

    seqlens = sorted(seqlens)
    bar = tqdm(total=len(impls) * len(seqlens) * len(modes),
               disable=(None if progress is None else not progress), desc="memory", unit="run", leave=False)
    rows = []
    try:
        for impl, mode in itertools.product(impls, modes):
            oom_at = None
            for N in seqlens:
                case = Case(B, H, N, N, D, dtype, causal)
                row = {"kind": "memory", "impl": impl.name, "mode": mode, **case.describe(),
                       "peak_extra_bytes": None, "status": None, "reason": None, "method": method}
                reason = impl.check(device, dtype, D, case.shape, "memory", force)
                if oom_at is not None:
                    row["status"], row["reason"] = "skipped", f"ran out of memory at N={oom_at}"
                elif reason is not None:
                    row["status"], row["reason"] = "unavailable", reason
                elif mode == "bwd" and not impl.has_backward:
                    row["status"], row["reason"] = "unavailable", f"{impl.name} is forward only"
                else:
                    _measure_memory(impl, mode, case, device, seed, row)
                    if row["status"] == "oom":
                        oom_at = N
                rows.append(row)
                if on_row is not None:
                    on_row(row)
                bar.update()
    finally:
        bar.close()
    return rows


def _measure_memory(impl: Impl, mode: str, case: Case, device, seed: int, row: dict) -> None:
    if device.type == "cpu" and impl.quadratic_bytes is not None:
        import psutil

        need = impl.quadratic_bytes(*case.shape, case.dtype)
        free = psutil.virtual_memory().available
        if need > 0.7 * free:
            row["status"] = "oom"
            row["reason"] = (f"not run: needs about {need / 2**30:.1f} GiB, "
                             f"{free / 2**30:.1f} GiB available")
            return
    try:
        q, k, v, do = make_inputs(case, device, seed)
        c, s = case.causal, case.scale
        with impl.context():
            if mode == "fwd":
                def fn():
                    with torch.no_grad():
                        return impl.forward(q, k, v, c, s)
            else:
                def fn():
                    run = BackwardRun(impl, q, k, v, do, c, s)
                    return run.step()
            # one call first: lazily created workspaces (BLAS, cuBLAS, Triton autotuning) are
            # paid once per process, not by every call, and must not be counted as the call's
            peak = peak_extra_memory(fn, device)
            if peak is not None:
                peak = peak_extra_memory(fn, device)
    except Exception as e:  # noqa: BLE001
        row["status"], row["reason"] = _classify(e)
        del e
        release_cached(device)
        return
    finally:
        q = k = v = do = None
        gc.collect()
    if peak is None:
        row["status"], row["reason"] = "oom", "OOM"
        release_cached(device)
    else:
        row["status"], row["peak_extra_bytes"] = "ok", peak
