"""Chapter 12's measurement: the small GPT trained and run with each attention backend.

    FLASHTUT_TRITON_AUTOTUNE=0 python -m flashtut.model.measure --out capstone_h200.json
    python -m flashtut.model.measure --preset cpu --out capstone_cpu.json     # tiny, seconds

Four sections, each a list of rows (``kind`` ``"model"``, ``section`` saying which) in one results
file with provenance (``flashtut.bench.results`` format). They run in the order loss, generation,
packed, scaling (the longest last), and the file is written after each, so a run cut short keeps
the sections it finished; ``--sections`` runs a subset:

``loss``
    the same model, seed and batches trained for ``steps`` steps with each backend: the loss of
    every step, the evaluation loss at the end, the wall time (compilation included).
``scaling``
    one training step (forward, backward, AdamW) at context lengths that double, the tokens per
    step held fixed (``batch = tokens // context``, at least 1): tokens per second and the step's
    peak extra memory, until a backend runs out of memory (then ``status`` ``"oom"`` and no longer
    contexts for it).
``generation``
    greedy generation of ``new_tokens`` after prompts of several lengths: recomputing the whole
    prefix for every token, against a KV cache read by the split-KV decoder (``flashtut.split_kv_attention``)
    or by the backend itself.
``packed``
    one forward and backward over sequences of very different lengths, padded to the longest or
    packed end to end (``cu_seqlens``): time, real and computed tokens, FLOPs of each.

On a GPU the model trains under bfloat16 autocast (float16 where there is no bfloat16); on the
CPU in float32. Times are medians of a few wall-clock runs after a warm-up
(``flashtut.bench.timing.time_wall``), memory is ``flashtut.bench.memory.peak_extra_memory``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

from ..bench.memory import is_oom, peak_extra_memory, release_cached
from ..bench.provenance import collect
from ..bench.report import format_table
from ..bench.results import MODEL_SECTIONS, save_results
from ..bench.timing import time_wall
from ..decode import suggest_num_splits
from .attention import BACKENDS, REAL_MODEL_API, packed_path, unavailable_reason
from .batching import model_flops, packed_batch, padded_batch, random_windows
from .corpus import load_corpus
from .generation import generate
from .gpt import GPT, GPTConfig
from .training import autocast, autocast_dtype, evaluate, make_optimizer, train

#: what each preset measures; options on the command line replace single values
PRESETS = {
    "gpu": dict(config=dict(n_layer=4, d_model=512, n_head=8, n_kv_head=2), backends="naive,sdpa,triton,cuda",
                steps=60, batch=16, context=256, lr=3e-3, eval_batches=8,
                contexts=[512, 1024, 2048, 4096, 8192, 16384, 32768], step_tokens=16384,
                prompts=[128, 512, 2048], new_tokens=64, packed_sequences=32, packed_max=2048,
                packed_backend="triton"),
    "cpu": dict(config=dict(n_layer=2, d_model=64, n_head=4, n_kv_head=2), backends="naive,sdpa,tiled",
                steps=12, batch=4, context=48, lr=3e-3, eval_batches=2,
                contexts=[32, 64, 128], step_tokens=128,
                prompts=[16, 48], new_tokens=8, packed_sequences=6, packed_max=96,
                packed_backend="naive"),
}


def _row(section: str, **fields) -> dict:
    return {"kind": "model", "section": section, **fields}


def _model(config: GPTConfig, backend, device, seed: int) -> GPT:
    return GPT(config, attention_backend=backend, seed=seed).to(device)


def measure_loss(config, backends, tokens, device, dtype, steps, batch, context, lr, eval_batches, seed=0):
    """Rows of the ``loss`` section: one per backend, same model, seed and batches."""
    batches = random_windows(tokens, batch, context, steps, seed=seed)
    held_out = random_windows(tokens, batch, context, eval_batches, seed=seed + 1)
    rows = []
    for backend in backends:
        model = _model(config, backend, device, seed)
        try:
            losses = []
            ms = time_wall(lambda: losses.extend(train(model, batches, lr=lr, dtype=dtype)), device,
                           runs=1, warmup=0)
            eval_loss = evaluate(model, held_out, dtype=dtype)
            # the wall time includes the kernels' first-call compilation: speed is the scaling section's
            rows.append(_row("loss", backend=backend, status="ok", steps=steps, batch=batch, context=context,
                             losses=losses, final_loss=losses[-1], eval_loss=eval_loss, train_seconds=ms * 1e-3))
        except Exception as e:                       # a backend that cannot run here says why
            rows.append(_row("loss", backend=backend, status="oom" if is_oom(e) else "error",
                             error=f"{type(e).__name__}: {e}"[:300]))
            release_cached(device)
        del model
    return rows


def measure_scaling(config, backends, device, dtype, contexts, step_tokens, seed=0):
    """Rows of the ``scaling`` section: tokens/s and peak extra memory of one training step."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for backend in backends:
        stop = False
        for T in contexts:
            B = max(1, step_tokens // T)
            row = dict(backend=backend, context=T, batch=B, tokens=B * T)
            if stop:
                rows.append(_row("scaling", status="skipped", **row))
                continue
            x = torch.randint(0, config.vocab_size, (B, T), generator=gen).to(device)
            y = torch.randint(0, config.vocab_size, (B, T), generator=gen).to(device)
            model = _model(config, backend, device, seed)
            opt = make_optimizer(model)

            def step():
                with autocast(device, dtype):
                    _, loss = model(x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            try:
                step()                                # optimiser state exists before the peak is taken
                peak = peak_extra_memory(step, device)
                if peak is None:
                    raise torch.OutOfMemoryError("out of memory")
                ms = time_wall(step, device, runs=3, warmup=0)
                rows.append(_row("scaling", status="ok", ms=ms, tokens_per_s=B * T / (ms * 1e-3),
                                 peak_extra_bytes=peak, **row))
            except Exception as e:
                if not is_oom(e):
                    rows.append(_row("scaling", status="error", error=f"{type(e).__name__}: {e}"[:300], **row))
                else:
                    rows.append(_row("scaling", status="oom", **row))
                stop = True
            del model, opt, x, y
            release_cached(device)
    return rows


def measure_generation(config, backends, tokens, device, dtype, prompts, new_tokens, seed=0):
    """Rows of the ``generation`` section: tokens/s of greedy generation per method and prompt length."""
    rows = []
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    for P in prompts:
        prompt = tokens[:P][None]
        splits = suggest_num_splits(1, config.n_head, 1, P + new_tokens, num_sms)
        methods = [("split-kv cache", "sdpa", dict(use_cache=True, decode="split-kv", num_splits=splits))]
        for b in backends:
            methods += [(f"{b} cache", b, dict(use_cache=True, decode="backend")),
                        (f"{b} recompute", b, dict(use_cache=False))]
        reference = None
        for method, backend, kw in methods:
            model = _model(config, backend, device, seed)
            out = []
            try:
                ms = time_wall(lambda: out.append(generate(model, prompt, new_tokens, dtype=dtype, **kw)),
                               device, runs=1, warmup=1)
                same = None if reference is None else bool((out[-1] == reference).all())
                reference = out[-1] if reference is None else reference
                rows.append(_row("generation", status="ok", method=method, backend=backend, prompt=P,
                                 new_tokens=new_tokens, num_splits=kw.get("num_splits"), ms=ms,
                                 tokens_per_s=new_tokens / (ms * 1e-3), same_tokens_as_first=same))
            except Exception as e:
                rows.append(_row("generation", status="oom" if is_oom(e) else "error", method=method,
                                 backend=backend, prompt=P, error=f"{type(e).__name__}: {e}"[:300]))
                release_cached(device)
            del model
    return rows


def packed_lengths(n: int, longest: int, seed: int = 0) -> list[int]:
    """``n`` sequence lengths spread log-uniformly from ``longest / 32`` to ``longest`` (the last
    one exactly ``longest``): documents of very different sizes, as in a real corpus."""
    gen = torch.Generator().manual_seed(seed)
    low = max(2, longest // 32)
    u = torch.rand(n - 1, generator=gen)
    lengths = [int(math.exp(math.log(low) + float(t) * (math.log(longest) - math.log(low)))) for t in u]
    return lengths + [longest]


def measure_packed(config, backend, tokens, device, dtype, n_sequences, longest, seed=0):
    """Rows of the ``packed`` section: one forward and backward, padded against packed."""
    lengths = packed_lengths(n_sequences, longest, seed)
    starts = torch.cumsum(torch.tensor([0] + [n + 1 for n in lengths[:-1]]), 0).tolist()
    need = starts[-1] + lengths[-1] + 1
    stream = tokens.repeat(math.ceil(need / tokens.numel()))
    seqs = [stream[s:s + n + 1] for s, n in zip(starts, lengths)]
    real = sum(lengths)
    rows = []
    model = _model(config, backend, device, seed)
    layouts = {"padded": padded_batch(seqs), "packed": packed_batch(seqs)}
    for layout, batch in layouts.items():
        batch = [t.to(device) for t in batch]

        def step():
            with autocast(device, dtype):
                if layout == "padded":
                    _, loss = model(batch[0], batch[1])
                else:
                    _, loss = model(batch[0], batch[1], cu_seqlens=batch[2], positions=batch[3])
            model.zero_grad(set_to_none=True)
            loss.backward()
            return loss.detach()

        computed = batch[0].numel()
        flops = model_flops(config, lengths, padded_to=max(lengths) if layout == "padded" else None)
        try:
            loss = float(step())
            ms = time_wall(step, device, runs=3, warmup=1)
            rows.append(_row("packed", status="ok", layout=layout, backend=backend,
                             path=packed_path(backend) if layout == "packed" else "padded batch",
                             sequences=len(lengths), real_tokens=real, computed_tokens=computed,
                             flops=flops, ms=ms, loss=loss, real_tokens_per_s=real / (ms * 1e-3)))
        except Exception as e:
            rows.append(_row("packed", status="oom" if is_oom(e) else "error", layout=layout, backend=backend,
                             error=f"{type(e).__name__}: {e}"[:300]))
            release_cached(device)
    return rows


def run(preset: str = "cpu", device=None, sections=MODEL_SECTIONS, on_section=None,
        **overrides):
    """Measure the sections of ``preset`` on ``device``; returns ``(rows, meta)``. ``on_section(rows,
    meta)`` is called after each section with everything so far (the CLI saves the file each time,
    so a run cut short keeps what it measured)."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    sections = tuple(sections)
    if not sections or any(name not in MODEL_SECTIONS for name in sections):
        raise ValueError(f"sections must be a non-empty subset of {', '.join(MODEL_SECTIONS)}, got {sections}")
    p = {**PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}}
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = autocast_dtype(device)
    config = GPTConfig(**p["config"])
    asked = [b for b in p["backends"].split(",") if b]
    skipped = {b: unavailable_reason(b, device) for b in asked if unavailable_reason(b, device)}
    backends = [b for b in asked if b not in skipped]
    tokens = load_corpus().tokens()
    torch.manual_seed(0)
    meta = {"preset": preset, "model": p["config"], "dtype": str(dtype).replace("torch.", "") if dtype else "float32",
            "real_model_api": REAL_MODEL_API, "triton_autotune": os.environ.get("FLASHTUT_TRITON_AUTOTUNE", "1"),
            "section_seconds": {}, **{k: v for k, v in p.items() if k != "config"}}
    gen_backends = [b for b in backends if b != "naive"] or backends
    jobs = {
        "loss": lambda: measure_loss(config, backends, tokens, device, dtype, p["steps"], p["batch"], p["context"],
                                     p["lr"], p["eval_batches"]),
        "scaling": lambda: measure_scaling(config, backends, device, dtype, p["contexts"], p["step_tokens"]),
        "generation": lambda: measure_generation(config, gen_backends, tokens, device, dtype, p["prompts"],
                                                 p["new_tokens"]),
        "packed": lambda: measure_packed(config, p["packed_backend"], tokens, device, dtype, p["packed_sequences"],
                                         p["packed_max"]),
    }
    rows = [_row(name, backend=b, status="unavailable", error=why) for b, why in skipped.items() for name in sections
            if name != "packed" or b == p["packed_backend"]]
    if p["packed_backend"] in skipped:
        sections = tuple(name for name in sections if name != "packed")
    for name in sections:
        t0 = time.perf_counter()
        rows += jobs[name]()
        meta["section_seconds"][name] = round(time.perf_counter() - t0, 1)
        if on_section is not None:
            on_section(rows, meta)
    return rows, meta


def summary(rows) -> str:
    """Markdown tables of a run: per backend the loss after the last step, and tokens/s and peak
    memory at each context; generation speed per method; packed against padded."""
    out = []
    loss = [r for r in rows if r["section"] == "loss"]
    scaling = [r for r in rows if r["section"] == "scaling"]
    if loss or scaling:
        contexts = sorted({r["context"] for r in scaling if "context" in r})
        by = {(r["backend"], r.get("context")): r for r in scaling}

        def at(b, n):
            r = by.get((b, n))
            if r is None or r["status"] != "ok":
                return "-" if r is None else r["status"]
            return f"{r['tokens_per_s'] / 1e3:,.1f}k, {r['peak_extra_bytes'] / 2**20:,.0f} MiB"

        names = list(dict.fromkeys(r["backend"] for r in loss + scaling))
        lossd = {r["backend"]: r for r in loss}
        out.append(format_table(
            ["backend", "loss after the last step", "held-out loss"] + [f"N={n}: tok/s, peak" for n in contexts],
            [[b, f"{lossd[b]['final_loss']:.4f}" if lossd.get(b, {}).get("status") == "ok" else lossd.get(b, {}).get("status", "-"),
              f"{lossd[b]['eval_loss']:.4f}" if lossd.get(b, {}).get("status") == "ok" else "-"]
             + [at(b, n) for n in contexts] for b in names], markdown=True))
    gen = [r for r in rows if r["section"] == "generation" and r["status"] == "ok"]
    if gen:
        out.append(format_table(["method", "prompt", "generated tokens/s", "same tokens as the first method"],
                                [[r["method"], str(r["prompt"]), f"{r['tokens_per_s']:,.1f}", str(r["same_tokens_as_first"])]
                                 for r in gen], markdown=True))
    packed = [r for r in rows if r["section"] == "packed" and r["status"] == "ok"]
    if packed:
        out.append(format_table(["layout", "path", "real tokens", "tokens computed", "GFLOP", "ms"],
                                [[r["layout"], r["path"], str(r["real_tokens"]), str(r["computed_tokens"]),
                                  f"{r['flops'] / 1e9:,.2f}", f"{r['ms']:.2f}"] for r in packed], markdown=True))
    bad = [r for r in rows if r["status"] in ("error", "unavailable")]
    out += [f"{r['section']} {r['backend']}: {r['status']}: {r.get('error', '')}" for r in bad]
    return "\n\n".join(out)


class _Parser(argparse.ArgumentParser):
    """Errors as one line (``prog: error: ...``) and exit status 2, with no usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _device(text: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` of a GPU that is here."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r} asks for a CUDA GPU and this machine has none; use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r}: there are {torch.cuda.device_count()} GPU(s), "
                                             f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def _choices(accepted, what: str):
    def parse(text: str) -> str:
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"expected at least one {what} from {','.join(accepted)}, got {text!r}")
        bad = [n for n in names if n not in accepted]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(bad)}; accepted: {','.join(accepted)}")
        return ",".join(names)
    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _out_file(text: str) -> str:
    """The results file: not a folder, in a folder that exists (checked before measuring)."""
    path = os.path.abspath(os.path.expanduser(text)) if text else ""
    if not text or os.path.isdir(path) or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; accepted: the path of a .json file to write")
    if not os.path.isdir(os.path.dirname(path)):
        raise argparse.ArgumentTypeError(f"the folder of {text!r} does not exist")
    if not os.access(os.path.dirname(path), os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m flashtut.model.measure", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, metavar="FILE.json", type=_out_file,
                        help="where to write the results")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="gpu (default on a GPU) or cpu")
    parser.add_argument("--device", type=_device, help="cpu, cuda or cuda:N (default: the GPU when there is one)")
    parser.add_argument("--sections", default=",".join(MODEL_SECTIONS), type=_choices(MODEL_SECTIONS, "section"),
                        help=f"comma-separated subset of {','.join(MODEL_SECTIONS)} (default: all, in this order)")
    parser.add_argument("--backends", type=_choices(BACKENDS, "backend"),
                        help=f"comma-separated, from {','.join(BACKENDS)}")
    parser.add_argument("--steps", type=_positive_int, help="training steps of the loss section")
    return parser


def parse_args(argv=None):
    """The options, every one checked before anything is measured: a bad one exits with status 2
    and one line naming it. Returns ``(args, device, preset, sections)``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    device = args.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    preset = args.preset or ("gpu" if device.type == "cuda" else "cpu")
    asked = (args.backends or PRESETS[preset]["backends"]).split(",")
    if all(unavailable_reason(b, device) for b in asked):
        why = "; ".join(f"{b}: {unavailable_reason(b, device)}" for b in asked)
        parser.error(f"argument --backends: none of them can run on {device} ({why})")
    return args, device, preset, tuple(args.sections.split(","))


def main(argv=None) -> int:
    try:
        args, device, preset, sections = parse_args(argv)
    except SystemExit as done:          # --help (0) or a bad option (2, its line already printed)
        return done.code if isinstance(done.code, int) else 2
    argv = sys.argv[1:] if argv is None else list(argv)
    prov = collect(device, call="python -m flashtut.model.measure " + " ".join(argv))

    def saved(rows, meta):
        save_results(args.out, "model", rows, prov, meta)
        name, seconds = list(meta["section_seconds"].items())[-1]
        print(f"[{name}: {seconds} s, {args.out} written]", flush=True)

    rows, meta = run(preset, device, sections, on_section=saved, backends=args.backends, steps=args.steps)
    print(summary(rows))
    failed = [r for r in rows if r.get("status") == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
