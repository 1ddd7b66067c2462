"""JSON files of benchmark results: one schema for speed, memory and roofline runs.

A file is ``{"schema": ..., "kind": "speed" | "memory" | "roofline", "provenance": {...},
"config": {...}, "rows": [...]}``. Rows are flat dicts (one measurement each) so a notebook can
filter them with a list comprehension or load them into a DataFrame.

``normalise_rows`` also accepts the older layout of ``shared/anchors/h200.json`` (one row per
shape with ``fwd_tflops``/``bwd_tflops``, and ``mem`` rows), so plots work on both.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

SCHEMA = "flashtut.bench/1"
KINDS = ("speed", "memory", "roofline", "model")


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


def load_results(path) -> dict:
    """Read one results file; a file without ``kind`` (the anchors layout) is normalised."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path} has no 'rows' list: not a flashtut.bench results file")
    if "kind" not in doc:
        doc = {"schema": None, "kind": "mixed", "provenance": {"what": doc.get("what")},
               "config": {}, "rows": doc["rows"]}
    doc["rows"] = normalise_rows(doc["rows"], kind=doc["kind"])
    return doc


def measurement_key(row: dict) -> tuple:
    """What one measurement is of: two rows with the same key measured the same thing (on the same
    device), so a newer one replaces an older one. Rows of a layout this module does not know
    (kind ``mixed``) are never merged."""
    if row.get("kind") not in ("speed", "memory", "roofline"):
        return ("unmerged", id(row))
    if row.get("kind") == "roofline":
        return ("roofline", row.get("device"), row.get("what"), row.get("dtype"))
    return (row.get("kind"), row.get("device"), row.get("impl"), row.get("mode"), row.get("dtype"),
            row.get("B"), row.get("H"), row.get("Nq", row.get("N")), row.get("Nk", row.get("N")),
            row.get("D"), bool(row.get("causal")))


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


def normalise_rows(rows: list[dict], kind: str | None = None) -> list[dict]:
    """Rows in this module's layout: ``anchors``-style rows are split per mode and tagged."""
    out = []
    for r in rows:
        if "kind" in r:
            out.append(r)
        elif "mem" in r:        # anchors: {"mem": impl, "N": .., "extra_peak_MiB": ..}
            mib = r.get("extra_peak_MiB")
            mib = mib if isinstance(mib, (int, float)) and not isinstance(mib, bool) else None  # "OOM"
            out.append({"kind": "memory", "impl": r["mem"], "mode": "fwd", "N": r["N"],
                        "Nq": r["N"], "Nk": r["N"], "B": r.get("B", 1), "H": r.get("H", 16),
                        "D": r.get("D", 128), "dtype": r.get("dtype", "float16"), "causal": False,
                        "status": "ok" if mib is not None else "oom",
                        "peak_extra_bytes": None if mib is None else int(mib * 2**20)})
        elif "fwd_tflops" in r or "bwd_tflops" in r:
            for mode in ("fwd", "bwd"):
                t = r.get(f"{mode}_tflops")
                if t is None:
                    continue
                row = {k: v for k, v in r.items() if not k.endswith("_tflops")}
                row.update(kind="speed", mode=mode, tflops=t, status="ok",
                           Nq=r.get("N"), Nk=r.get("N"), causal=r.get("causal", False),
                           dtype=r.get("dtype", "float32"))
                out.append(row)
        else:
            out.append(dict(r, kind=kind))
    return out
