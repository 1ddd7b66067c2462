"""JSON files of benchmark results: one schema for every measurement the book commits.

A file is ``{"schema": "flashtut.bench/1", "kind": "speed" | "memory" | "roofline" | "host" | "model" | "compile" | "sass"
| "profile" | "decode",
"provenance": {...}, "config": {...}, "rows": [...]}``. Rows are flat dicts (one measurement
each) so a notebook can filter them with a list comprehension or load them into a DataFrame.
``check_row`` says what each kind of row must hold; :func:`load_results` checks every row and
names the file and row that is malformed. A row may name its own ``kind``: a ``sass`` file (the
instruction counts of compiled kernels, ``flashtut.bench.sass``) also holds the speed rows measured
with those kernels. A ``profile`` row is one kernel launch's Nsight Compute metrics
(``flashtut.bench.profile``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

SCHEMA = "flashtut.bench/1"
KINDS = ("speed", "memory", "roofline", "host", "model", "compile", "sass", "profile", "decode")
#: what a ``decode`` row measured (``flashtut.bench.decode``): one decode-attention call over a KV cache
DECODE_WHATS = ("kernel",)
#: what a ``compile`` row timed (``experiments/compile_time``): one NVRTC build, or a whole
#: first call (compile + load + launch) of ``cuda_attention``'s forward or backward
COMPILE_WHATS = ("nvrtc", "first-call")
#: the sections of a ``model`` file (``flashtut.model.measure``), in the order it measures them
MODEL_SECTIONS = ("loss", "generation", "packed", "scaling")
#: what a ``roofline`` row measured (``flashtut.bench.roofline``): copy bandwidth, a library matrix
#: product, or one tensor-core instruction issued back to back (``instruction_peak``)
ROOFLINE_WHATS = ("copy", "matmul", "instruction")


def _clean(x):
    """JSON has no NaN or infinity: store them as null; tuples become lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def save_results(path, kind: str, rows: list[dict], provenance: dict, config: dict | None = None) -> Path:
    """Write one results file (parents created) and return its path."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    doc = {"schema": SCHEMA, "kind": kind, "provenance": provenance, "config": config or {},
           "rows": rows}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(doc), indent=1, allow_nan=False) + "\n")
    return path


#: the largest size a row may record: a tensor dimension is an int64 (a larger N would reach a
#: figure's axis as an integer no float holds and fail there, far from the file that carries it)
MAX_COUNT = 2**63 - 1


def _number(x) -> bool:
    if isinstance(x, int) and not isinstance(x, bool):
        return abs(x) <= MAX_COUNT              # math.isfinite raises on an int beyond a float's range
    return isinstance(x, float) and math.isfinite(x)


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 < x <= MAX_COUNT


def check_row(row, kind: str | None = None) -> str | None:
    """Why ``row`` is not a valid results row (of ``kind``, else of its own ``kind``), or None."""
    if not isinstance(row, dict):
        return f"expected an object, got {type(row).__name__}"
    kind = row.get("kind", kind)
    if kind not in KINDS:
        return f"kind: got {kind!r}; accepted: {', '.join(KINDS)}"
    status = row.get("status", "ok")
    if not isinstance(status, str):
        return f"status: got {status!r}; accepted: a string such as 'ok'"
    optional_numbers = {"speed": ("tflops", "ms"), "memory": ("peak_extra_bytes",),
                        "roofline": ("tflops", "gb_per_s", "ms"), "host": (),
                        "model": ("tokens_per_s", "peak_extra_bytes", "ms", "flops"),
                        "compile": ("seconds",), "sass": (), "profile": (),
                        "decode": ("ms", "gb_per_s", "bytes")}[kind]
    for key in optional_numbers:
        if row.get(key) is not None and not (_number(row[key]) and row[key] >= 0):
            return f"{key}: got {row[key]!r}; accepted: a non-negative number or null"
    if kind in ("speed", "memory"):
        if not isinstance(row.get("impl"), str):
            return f"impl: got {row.get('impl')!r}; accepted: an implementation name"
        for key in ("B", "H", "N", "D"):
            if not _count(row.get(key)):
                return f"{key}: got {row.get(key)!r}; accepted: a positive integer up to 2**63 - 1"
        if not isinstance(row.get("dtype"), str):
            return f"dtype: got {row.get('dtype')!r}; accepted: a dtype name such as 'float16'"
        if not isinstance(row.get("causal", False), bool):
            return f"causal: got {row.get('causal')!r}; accepted: true or false"
    if kind == "speed":
        if row.get("mode") not in ("fwd", "bwd"):
            return f"mode: got {row.get('mode')!r}; accepted: 'fwd' or 'bwd'"
        if status == "ok" and row.get("tflops") is None:
            return "tflops: missing in a row whose status is 'ok'"
    if kind == "roofline":
        if row.get("what") not in ROOFLINE_WHATS:
            return f"what: got {row.get('what')!r}; accepted: {', '.join(map(repr, ROOFLINE_WHATS))}"
        if row["what"] != "copy" and not isinstance(row.get("dtype"), str):
            return f"dtype: got {row.get('dtype')!r}; accepted: a matmul dtype name"
        if row["what"] == "instruction" and not isinstance(row.get("instruction"), str):
            return f"instruction: got {row.get('instruction')!r}; accepted: an instruction name such as 'wgmma'"
        if status == "ok" and row.get("gb_per_s" if row["what"] == "copy" else "tflops") is None:
            return "a row whose status is 'ok' has no measured rate"
    if kind == "host":
        if not isinstance(row.get("entry"), str):
            return f"entry: got {row.get('entry')!r}; accepted: the name of what was called"
        if not (_number(row.get("us_per_call")) and row["us_per_call"] > 0):
            return f"us_per_call: got {row.get('us_per_call')!r}; accepted: a positive number"
    if kind == "sass":           # flashtut.bench.sass: one compiled kernel's instruction counts
        for key in ("impl", "kernel"):
            if not isinstance(row.get(key), str):
                return f"{key}: got {row.get(key)!r}; accepted: a name"
        counts = row.get("counts")
        if not isinstance(counts, dict) or not all(isinstance(k, str) and isinstance(v, int)
                                                   and not isinstance(v, bool) and v >= 0 for k, v in counts.items()):
            return f"counts: got {counts!r}; accepted: an object of opcode -> non-negative integer"
        if status == "ok" and not counts:
            return "counts: empty in a row whose status is 'ok'"
    if kind == "profile":        # flashtut.bench.profile: one launch's Nsight Compute metrics
        for key in ("impl", "kernel"):
            if not isinstance(row.get(key), str):
                return f"{key}: got {row.get(key)!r}; accepted: a name"
        for key in ("N", "D"):
            if not _count(row.get(key)):
                return f"{key}: got {row.get(key)!r}; accepted: a positive integer"
        if not isinstance(row.get("causal"), bool):
            return f"causal: got {row.get('causal')!r}; accepted: true or false"
        metrics = row.get("metrics")
        # a metric that does not apply to a kernel is null (ncu's n/a)
        if not isinstance(metrics, dict) or not all(isinstance(k, str) and (v is None or _number(v))
                                                    for k, v in metrics.items()):
            return f"metrics: got {metrics!r}; accepted: an object of metric name -> number or null"
        if status == "ok" and not metrics:
            return "metrics: empty in a row whose status is 'ok'"
    if kind == "compile":        # experiments/compile_time: first-call build time of the CUDA kernels
        if row.get("what") not in COMPILE_WHATS:
            return f"what: got {row.get('what')!r}; accepted: {', '.join(COMPILE_WHATS)}"
        for key in ("step", "arch"):
            if not isinstance(row.get(key), str):
                return f"{key}: got {row.get(key)!r}; accepted: a string"
        if status == "ok" and row.get("seconds") is None:
            return "seconds: missing in a row whose status is 'ok'"
    if kind == "decode":         # flashtut.bench.decode: decode attention over a KV cache
        if row.get("what") not in DECODE_WHATS:
            return f"what: got {row.get('what')!r}; accepted: {', '.join(map(repr, DECODE_WHATS))}"
        if not isinstance(row.get("impl"), str) or not isinstance(row.get("dtype"), str):
            return f"impl, dtype: got {row.get('impl')!r}, {row.get('dtype')!r}; accepted: names"
        for key in ("B", "H", "Hkv", "N", "D"):
            if not _count(row.get(key)):
                return f"{key}: got {row.get(key)!r}; accepted: a positive integer up to 2**63 - 1"
        if status == "ok" and row.get("ms") is None:
            return "ms: missing in a row whose status is 'ok'"
    if kind == "model":          # flashtut.model.measure: the small GPT of chapter 12
        if row.get("section") not in MODEL_SECTIONS:
            return f"section: got {row.get('section')!r}; accepted: {', '.join(MODEL_SECTIONS)}"
        if not isinstance(row.get("backend"), str):
            return f"backend: got {row.get('backend')!r}; accepted: an attention backend name"
    return None


def load_results(path) -> dict:
    """Read one results file, checking its layout and every row; ``ValueError`` names the file
    and, for a malformed row, its index and what is wrong with it."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path} has no 'rows' list: not a flashtut.bench results file")
    if doc.get("schema") != SCHEMA or doc.get("kind") not in KINDS:
        raise ValueError(f"{path}: schema {doc.get('schema')!r}, kind {doc.get('kind')!r}; accepted: "
                         f"schema {SCHEMA!r} and kind one of {', '.join(KINDS)} (the files "
                         "`python -m flashtut.bench` writes)")
    if not isinstance(doc.get("provenance"), dict):
        raise ValueError(f"{path}: 'provenance' must be an object (where the measurement came from)")
    for i, row in enumerate(doc["rows"]):
        why = check_row(row, doc["kind"])
        if why:
            raise ValueError(f"{path}: row {i}: {why}")
    doc["rows"] = [dict(r, kind=r.get("kind", doc["kind"])) for r in doc["rows"]]
    return doc


def measurement_key(row: dict) -> tuple:
    """What one measurement is of: two rows with the same key measured the same thing (on the same
    device), so a newer one replaces an older one."""
    if row.get("kind") not in KINDS:
        return ("unmerged", id(row))
    if row.get("kind") == "roofline":
        # an instruction ceiling is one per instruction and dtype: mma.sync and wgmma are two rows
        return ("roofline", row.get("device"), row.get("what"), row.get("instruction"), row.get("dtype"))
    if row.get("kind") == "host":
        return ("host", row.get("device"), row.get("entry"), row.get("version"))
    if row.get("kind") == "sass":
        return ("sass", row.get("device"), row.get("impl"), row.get("setting"), row.get("kernel"), row.get("binary"))
    if row.get("kind") == "profile":
        return ("profile", row.get("device"), row.get("set"), row.get("impl"), row.get("dtype"), row.get("D"),
                row.get("N"), row.get("causal"))
    if row.get("kind") == "compile":
        return ("compile", row.get("device"), row.get("arch"), row.get("what"), row.get("cache"), row.get("step"),
                row.get("dtype"), row.get("D"), str(sorted((row.get("defines") or {}).items())))
    if row.get("kind") == "decode":
        return ("decode", row.get("device"), row.get("what"), row.get("impl"), row.get("layout"),
                row.get("page_size"), row.get("dtype"), row.get("B"), row.get("H"), row.get("Hkv"), row.get("N"),
                row.get("D"), row.get("Nq"))
    if row.get("kind") == "model":
        return ("model", row.get("device"), row.get("section"), row.get("backend"), row.get("method"),
                row.get("layout"), row.get("context"), row.get("prompt"))
    # the real-model options (grouped K/V heads, a window, a packed or padded batch) are part of what
    # was measured: without them a GQA row and a full-heads row of one shape would replace each other;
    # so is a timing budget that a row records (experiments/hopper_options/hopper_ab.py times one case under two), and the round
    # of an A/B timed in rounds (hopper_ab.py --pair), and FlexAttention's mask and score mod
    return (row.get("kind"), row.get("device"), row.get("impl"), row.get("mode"), row.get("dtype"),
            row.get("B"), row.get("H"), row.get("Nq", row.get("N")), row.get("Nk", row.get("N")),
            row.get("D"), bool(row.get("causal")), row.get("Hkv"), row.get("window"), row.get("layout"),
            row.get("warmup_ms"), row.get("rep_ms"), row.get("round"), row.get("mask"), row.get("score_mod"))


def merge_latest(tagged_docs) -> list[dict]:
    """The rows of several files, each case once: ``tagged_docs`` is ``(date, name, rows)`` per
    file, and where two files measured the same case (:func:`measurement_key`) the row of the file
    with the later date (then the later name) is kept."""
    by_key: dict = {}
    for _, _, rows in sorted(tagged_docs, key=lambda d: (d[0], d[1])):   # oldest first
        for r in rows:
            by_key[measurement_key(r)] = r
    return list(by_key.values())


def load_rows(*paths) -> list[dict]:
    """The rows of one or more results files, each tagged with ``source`` (the file name) and
    ``device`` (the device name from the file's provenance, else the file's name). A case measured
    in several of the files appears once, from the file with the latest provenance date (the
    rule of ``flashtut.results_data.load_results``, which the book uses)."""
    tagged = []
    for p in paths:
        doc = load_results(p)
        prov = doc.get("provenance") or {}
        device = (prov.get("device") or {}).get("name")
        rows = []
        for r in doc["rows"]:
            r = dict(r)
            r.setdefault("source", Path(p).name)
            r.setdefault("device", device or Path(p).stem)   # no provenance: name the file
            rows.append(r)
        tagged.append((str(prov.get("date") or ""), Path(p).name, rows))
    return merge_latest(tagged)
