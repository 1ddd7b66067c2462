"""``flashtut.results_data`` (finding and loading the committed measurements, locally or from the
repository), the chapter 09 checkers, and chapter 09 itself run on a folder of results.

Results files here are written by the harness itself (``flashtut.bench``) on tiny CPU cases, or
built from invented rows that say so in their provenance; nothing is read from the network: the
download path runs against a stand-in for ``urlopen``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is part of the book toolchain (requirements-dev.txt)")
import torch

from flashtut import bench, colab, results_data
from flashtut.bench.sweeps import Case
from flashtut.exercises import ch09

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "book" / "data"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch, tmp_path):
    monkeypatch.delenv(results_data.DATA_ENV, raising=False)


def _speed_file(path: Path, date: str, impl: str = "naive", N: int = 17, command: str = "test run") -> Path:
    """A real (tiny) speed run of the harness on the CPU, saved with the given provenance date."""
    rows = bench.run_speed([impl], [Case(1, 2, N, N + 4, 8, torch.float32, causal=True)], ("fwd",), "cpu",
                           warmup_ms=1, rep_ms=2, progress=False)
    prov = bench.provenance("cpu", call=command)
    prov["date"] = date
    return bench.save_results(path, "speed", rows, prov)


def _memory_file(path: Path) -> Path:
    rows = bench.run_memory(["naive", "tiled"], [64, 128], B=1, H=2, D=16, dtype=torch.float32, device="cpu",
                            progress=False)
    return bench.save_results(path, "memory", rows, bench.provenance("cpu", call="test memory run"))


# --- finding files -------------------------------------------------------------------------------

def test_data_path_finds_the_checkouts_files():
    committed = sorted(p.name for p in DATA.glob("*.json"))
    assert committed, "book/data holds no JSON file"
    for name in committed:
        assert results_data.data_path(name).resolve() == (DATA / name).resolve()
    # one copy: the package's data folder is the book's, through a link
    assert results_data.local_data_dir().resolve() == DATA.resolve()
    assert (ROOT / "src" / "flashtut" / "data").is_symlink()


def test_every_committed_file_loads_with_provenance():
    for path in sorted(DATA.glob("*.json")):
        rows, prov = results_data.load_results(path.name)
        assert rows, f"{path.name}: no rows"
        assert [p["file"] for p in prov] == [path.name]
        assert all(r["source"] == path.name and r.get("kind") for r in rows)
        if path.name in ("anchors_h200_sdpa.json", "h200_roofline.json") or path.name.startswith(("bench_", "memory_")):
            assert all(r["kind"] in ("speed", "memory", "roofline") for r in rows), path.name
        text = results_data.describe(prov[0])
        assert path.name in text
        # every file says what it is or how it was made
        assert any(k in prov[0] for k in ("what", "command", "call", "provisional")), path.name


def test_one_file_loses_no_row_to_the_merge():
    """Within one file every row is its own measurement: the merge key must tell apart rows that
    differ only in an instruction (mma.sync vs wgmma), K/V heads, a window or a packed layout."""
    import json

    for path in sorted(DATA.glob("*.json")):
        raw = json.loads(path.read_text())["rows"]
        rows, _ = results_data.load_results(path.name)
        assert len(rows) == len(raw), f"{path.name}: {len(raw)} rows on disk, {len(rows)} loaded"
    peaks, _ = results_data.load_results("h200_instruction_peaks.json")
    assert {r["instruction"] for r in peaks} == {"mma.sync", "wgmma"}


def test_data_dir_argument_and_environment_variable(tmp_path, monkeypatch):
    _speed_file(tmp_path / "bench_x.json", "2026-01-01T00:00:00+00:00")
    rows, prov = results_data.load_results("bench_x.json", data_dir=tmp_path)
    assert rows and rows[0]["source"] == "bench_x.json" and rows[0]["status"] == "ok"
    assert prov[0]["kind"] == "speed" and prov[0]["rows"] == len(rows) and prov[0]["path"] == str(tmp_path / "bench_x.json")
    monkeypatch.setenv(results_data.DATA_ENV, str(tmp_path))
    assert results_data.data_path("bench_x.json") == tmp_path / "bench_x.json"
    # the variable is authoritative: the checkout's files are not looked at
    with pytest.raises(results_data.ResultsMissing):
        results_data.data_path("anchors_h200_sdpa.json")
    monkeypatch.setenv(results_data.DATA_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="FLASHTUT_DATA"):
        results_data.data_path("bench_x.json")


def test_pattern_loads_every_match_newest_wins(tmp_path):
    _speed_file(tmp_path / "bench_h200.json", "2026-01-01T00:00:00+00:00", command="old")
    _speed_file(tmp_path / "bench_h200_rerun.json", "2026-02-01T00:00:00+00:00", command="new")
    _speed_file(tmp_path / "bench_h200_more.json", "2026-01-15T00:00:00+00:00", N=33)
    (tmp_path / "other.json").write_text("{}")
    rows, prov = results_data.load_results("bench_h200*.json", data_dir=tmp_path)
    assert sorted(p["file"] for p in prov) == ["bench_h200.json", "bench_h200_more.json", "bench_h200_rerun.json"]
    # N=17 measured twice: the later run's row is kept, once; N=33 once
    assert sorted(r["N"] for r in rows) == [17, 33]
    assert next(r for r in rows if r["N"] == 17)["source"] == "bench_h200_rerun.json"
    assert all(r["device"] for r in rows)
    # the plotting command line reads files by path with the same rule, whatever their order
    files = [tmp_path / n for n in ("bench_h200_rerun.json", "bench_h200.json", "bench_h200_more.json")]
    cli_rows = bench.load_rows(*files)
    assert sorted((r["N"], r["source"]) for r in cli_rows) == sorted((r["N"], r["source"]) for r in rows)


def test_missing_file_names_it_and_the_folder(tmp_path, capsys):
    with pytest.raises(results_data.ResultsMissing) as info:
        results_data.load_results("memory_h200.json", data_dir=tmp_path)
    msg = str(info.value)
    assert msg.startswith("memory_h200.json: not found") and str(tmp_path) in msg and "book/data/README.md" in msg
    assert isinstance(info.value, FileNotFoundError) and info.value.name == "memory_h200.json"
    with pytest.raises(results_data.ResultsMissing, match="bench_h200"):
        results_data.find("bench_h200*.json", data_dir=tmp_path)
    assert results_data.load_results("bench_h200*.json", data_dir=tmp_path, missing="print") == ([], [])
    assert "bench_h200*.json: not found" in capsys.readouterr().out


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="name"):
        results_data.load_results(3)
    with pytest.raises(ValueError, match="name"):
        results_data.load_results("../secrets.json")
    with pytest.raises(ValueError, match="missing"):
        results_data.load_results("x.json", data_dir=tmp_path, missing="ignore")
    with pytest.raises(ValueError, match="data_dir"):
        results_data.load_results("x.json", data_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="pattern"):
        results_data.data_path("bench_*.json", data_dir=tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        results_data.load_results("broken.json", data_dir=tmp_path)


def test_every_committed_file_is_in_the_one_format():
    for path in sorted(DATA.glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc.get("schema") == "flashtut.bench/1" and doc.get("kind") in bench.results.KINDS, path.name
        prov = doc["provenance"]
        # the file describes itself: what it holds, and a command (or why there is none)
        assert prov.get("what") or prov.get("summary"), f"{path.name}: provenance says not what it holds"
        assert prov.get("command") or prov.get("call") or prov.get("rerun") or prov.get("provisional") \
            or "copied" in (prov.get("summary") or ""), f"{path.name}: no command"


def test_a_legacy_layout_is_refused(tmp_path):
    doc = {"provenance": {"provisional": True, "device": "NVIDIA H200", "note": "placeholder figures"},
           "copy_bandwidth_GBps": 4321.5, "matmul_tflops": {"float16": 777.0, "float32": 51.0}}
    (tmp_path / "h200_roofline.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="not a flashtut.bench results file"):
        results_data.load_results("h200_roofline.json", data_dir=tmp_path)


def test_the_roofline_loader_takes_only_roofline_files(tmp_path):
    data = results_data.load_roofline_data()
    assert data["provenance"]["measured"]["command"].startswith("python -m flashtut.bench roofline")
    with pytest.raises(ValueError, match="roofline"):
        results_data.load_roofline_data(DATA / "memory_h200.json")


def test_describe_prints_the_provenance(tmp_path):
    _speed_file(tmp_path / "bench_x.json", "2026-03-04T05:06:07+00:00", command="my exact command")
    _, prov = results_data.load_results("bench_x.json", data_dir=tmp_path)
    text = results_data.describe(prov[0])
    for part in ("bench_x.json", "speed", "my exact command", "2026-03-04T05:06:07", f"torch {torch.__version__}"):
        assert part in text, part


def test_describe_wraps_every_line_and_breaks_a_command_only_at_spaces():
    # a notebook prints this under a table: a line wider than ~90 characters scrolls sideways
    command = ("python -m flashtut.bench memory --preset protocol --impl naive,sdpa-flash,triton,cuda"
               " --no-progress --out /root/out/memory_h200.json")
    prov = {"file": "bench_h200_protocol_d128_float16.json", "kind": "speed", "rows": 240,
            "device": {"name": "NVIDIA H200", "compute_capability": "9.0"},
            "versions": {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": "91900",
                         "triton": "3.6.0", "cupy": "14.2.0 (cupy-cuda13x)", "flashtut": "0.1.0"},
            "date": "2026-11-29T11:14:08+00:00", "command": command}
    text = results_data.describe(prov)
    assert max(len(line) for line in text.splitlines()) <= 90, text
    # the command as a reader can run it: the measuring machine's folder is not shown
    assert " ".join(text.split()).count(results_data.public_command(command)) == 1, text
    assert "/root/out" not in text and "--out memory_h200.json" in " ".join(text.split())
    assert "cupy 14.2.0 (cupy-cuda13x)" in " ".join(text.split())
    dirty = dict(prov, git={"commit": "0123456789abcdef", "dirty": True})
    assert "uncommitted" not in results_data.describe(dirty)
    narrow = results_data.describe(prov, width=60)
    assert max(len(line) for line in narrow.splitlines()) <= 60, narrow


def test_provenance_rows_give_one_table_row_per_file(tmp_path):
    from flashtut.notebook import show_provenance

    _speed_file(tmp_path / "bench_a.json", "2026-03-04T05:06:07+00:00", command="first | exact command")
    _speed_file(tmp_path / "bench_b.json", "2026-03-05T05:06:07+00:00", command="second command")
    _, prov = results_data.load_results("bench_*.json", data_dir=tmp_path)
    header, body, commands = results_data.provenance_rows(prov)
    assert len(body) == 2 and all(len(row) == len(header) for row in body)
    first = dict(zip(header, body[0]))
    assert "bench_a.json" in first["file"] and first["measured (UTC)"].startswith("2026-03-04 05:06")
    assert f"torch {torch.__version__}" in first["software"] and "command" not in header
    assert commands == ["`bench_a.json`: `first | exact command`", "`bench_b.json`: `second command`"]
    md = show_provenance(prov).data.splitlines()
    table = [line for line in md if line.startswith("|")]
    assert len(table) == 4 and not any("command" in line for line in table)
    # the commands follow the table as list items, exactly as recorded (no pipe to escape there)
    assert md[-2:] == ["* `bench_a.json`: `first | exact command`", "* `bench_b.json`: `second command`"]


def test_instruction_ceilings_of_one_dtype_are_not_merged(tmp_path):
    # mma.sync and wgmma share what='instruction' and the dtype; both rows must survive loading
    rows = [{"kind": "roofline", "what": "instruction", "instruction": name, "dtype": "float16",
             "tflops": t, "ms": 1.0, "flops": t * 1e9, "status": "ok"}
            for name, t in (("mma.sync", 600.0), ("wgmma", 800.0))]
    bench.save_results(tmp_path / "peaks.json", "roofline", rows, bench.provenance("cpu", call="test"))
    loaded, _ = results_data.load_results("peaks.json", data_dir=tmp_path)
    assert sorted(r["instruction"] for r in loaded) == ["mma.sync", "wgmma"]


# --- described once, shipped with the package, read by a page ---------------------------------------

def test_the_data_readme_is_the_manifest_of_the_files():
    # book/data/README.md is generated from the files' own provenance; regenerate it when this fails:
    #   python -m flashtut.results_data --manifest > book/data/README.md
    assert (DATA / "README.md").read_text() == results_data.manifest(DATA)
    lines = [ln for ln in results_data.manifest(DATA).splitlines() if ln.startswith("| `")]
    assert [ln.split("`")[1] for ln in lines] == sorted(p.name for p in DATA.glob("*.json"))


def test_the_manifest_follows_the_files(tmp_path):
    path = _speed_file(tmp_path / "bench_x.json", "2026-01-01T00:00:00+00:00", command="python -m x")
    doc = json.loads(path.read_text())
    doc["provenance"]["what"] = "a tiny run | on the CPU"
    path.write_text(json.dumps(doc))
    text = results_data.manifest(tmp_path)
    row = next(ln for ln in text.splitlines() if "bench_x.json" in ln)
    assert "a tiny run / on the CPU" in row and "2026-01-01" in row and "`python -m x`" in row
    doc["provenance"]["rerun"] = "python -m y --out book/data/bench_x.json"
    path.write_text(json.dumps(doc))
    assert "`python -m y --out book/data/bench_x.json`" in results_data.manifest(tmp_path)


def _loaded_names(text: str) -> set[str]:
    """The names or patterns passed to results_data's loaders (and chapter helpers that take one) in a
    notebook's or page's code; an f-string's fields become ``*``."""
    import re

    calls = r"(?:load_results|data_path|load_roofline_data|find|\bload)\(\s*f?\\?[\"']([A-Za-z0-9_.*?\[\]{}-]+\.json)" \
        r"\\?[\"'](?!\s*,\s*data_dir)"     # a reader's own file, read from their folder, is not the book's
    return {re.sub(r"\{[^}]*\}", "*", name) for name in re.findall(calls, text)}


def _pages() -> dict[str, str]:
    pages = {p.name: p.read_text() for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}
    pages.update({p.name: p.read_text() for p in sorted((ROOT / "book").glob("*.md"))})
    return pages


def test_every_committed_file_is_read_by_a_chapter_or_a_page():
    import fnmatch

    pages = _pages()
    loaded = set().union(*(_loaded_names(t) for t in pages.values()))
    # the library's own figure helpers load some files by name for the chapters that call them
    for path in sorted((ROOT / "src" / "flashtut").rglob("*.py")):
        loaded |= _loaded_names(path.read_text())
    unread = []
    for path in sorted(DATA.glob("*.json")):
        if any(fnmatch.fnmatchcase(path.name, pat) for pat in loaded):
            continue
        if not any(path.name in text for text in pages.values()):
            unread.append(path.name)
    assert not unread, f"book/data files no chapter or page reads (move them to experiments/<study>/data): {unread}"


def test_every_file_a_chapter_loads_is_committed():
    import fnmatch

    names = sorted(p.name for p in DATA.glob("*.json"))
    for page, text in _pages().items():
        for pattern in _loaded_names(text):
            assert any(fnmatch.fnmatchcase(n, pattern) for n in names), f"{page} loads {pattern}, which is not in book/data"


@pytest.mark.slow
def test_an_installed_wheel_draws_every_chapter_dataset_without_the_repository(tmp_path):
    # a reader who opens one notebook in Colab has flashtut but not the repository: build a wheel, install
    # it (not editable) into a folder of its own and load, from outside any checkout, every file the
    # notebooks load
    import subprocess
    import sys

    import shutil

    wheels, target, elsewhere, tree = (tmp_path / n for n in ("wheels", "site", "elsewhere", "tree"))
    elsewhere.mkdir()
    # built from a copy of what a clone holds (the build writes build/ next to pyproject.toml), the
    # link src/flashtut/data -> ../../book/data kept a link
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for part in ("pyproject.toml", "README.md", "src", "book/data"):
        (shutil.copytree(ROOT / part, tree / part, symlinks=True, ignore=skip) if (ROOT / part).is_dir()
         else (tree / part).parent.mkdir(parents=True, exist_ok=True) or shutil.copy(ROOT / part, tree / part))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(tree)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("flashtut-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    loaded = set().union(*(_loaded_names(t) for t in _pages().values()))
    assert loaded, "no loader call found in the notebooks"
    # what the notebooks name in loader calls, and every committed file (some are named through helpers)
    patterns = sorted(loaded | {p.name for p in DATA.glob("*.json")})
    script = (
        "import json, sys\n"
        "import flashtut, flashtut.results_data as rd\n"
        "assert 'site' in flashtut.__file__, flashtut.__file__\n"
        "out = {}\n"
        "for pat in json.loads(sys.argv[1]):\n"
        "    rows, prov = rd.load_results(pat)\n"
        "    out[pat] = [len(rows), [p['file'] for p in prov], str(rd.data_path(prov[0]['file']))]\n"
        "print(json.dumps(out))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    run = subprocess.run([sys.executable, "-c", script, json.dumps(patterns)], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    for pat in patterns:
        n_rows, files, path = got[pat]
        assert n_rows > 0 and files, pat
        assert path.startswith(str(target)), path        # read from the installed copy, not the checkout
    size = sum(p.stat().st_size for p in (target / "flashtut" / "data").glob("*.json"))
    assert size < 4_000_000, f"the package ships {size / 1e6:.1f} MB of data"


# --- chapter 09 checkers -----------------------------------------------------------------------------

def test_check_tflops_accepts_the_protocol_and_names_the_mistake():
    assert ch09.check_tflops(ch09.reference_tflops)
    assert ch09.check_tflops(lambda *a: bench.tflops(bench.attention_flops(a[0], a[1], a[2], a[2], a[3], a[4], a[5]), a[6]))
    no_causal = lambda B, H, N, D, c, m, ms: 4 * B * H * N * N * D * (2.5 if m == "bwd" else 1) / (ms * 1e-3) / 1e12  # noqa: E731
    res = ch09.check_tflops(no_causal)
    assert not res and "causal mask halves" in res.message and "causal=True" in res.message
    seconds = lambda B, H, N, D, c, m, ms: ch09.reference_tflops(B, H, N, D, c, m, ms) / 1e3  # noqa: E731
    assert "milliseconds" in ch09.check_tflops(seconds).message
    no_bwd = lambda B, H, N, D, c, m, ms: ch09.reference_tflops(B, H, N, D, c, "fwd", ms)  # noqa: E731
    assert "backward" in ch09.check_tflops(no_bwd).message
    assert not ch09.check_tflops(lambda *a: 1 / 0)
    assert not ch09.check_tflops(lambda *a: float("nan"))


def _right_ratios(rows, baseline):
    base = {(r["mode"], r["dtype"], r["D"], r["N"], r["causal"]): r["tflops"] for r in rows
            if r["impl"] == baseline and r.get("tflops")}
    out = {}
    for r in rows:
        key = (r["mode"], r["dtype"], r["D"], r["N"], r["causal"])
        if r["impl"] != baseline and r.get("tflops") and key in base:
            out.setdefault(key, {})[r["impl"]] = r["tflops"] / base[key]
    return out


def test_check_ratios_accepts_right_and_catches_wrong():
    assert ch09.check_ratios(_right_ratios)
    rows = ch09.synthetic_speed_rows()
    assert any(r["impl"] == "sdpa-flash" and r["tflops"] is None for r in rows), "a failed baseline is a trap"

    def with_baseline(rows, baseline):
        out = _right_ratios(rows, baseline)
        for v in out.values():
            v[baseline] = 1.0
        return out

    def inverted(rows, baseline):
        return {k: {i: 1 / x for i, x in v.items()} for k, v in _right_ratios(rows, baseline).items()}

    def every_case(rows, baseline):
        out = _right_ratios(rows, baseline)
        for r in rows:
            out.setdefault((r["mode"], r["dtype"], r["D"], r["N"], r["causal"]), {})
        return out

    assert "baseline itself" in ch09.check_ratios(with_baseline).message
    assert "inverted" in ch09.check_ratios(inverted).message
    assert "should not be there" in ch09.check_ratios(every_case).message
    assert not ch09.check_ratios(lambda rows, b: [])
    assert not ch09.check_ratios(lambda rows, b: rows[10**6])


def test_check_ratios_on_a_real_run(tmp_path):
    rows = bench.run_speed(["naive", "tiled"], [Case(1, 2, 40, 40, 16, torch.float32)], ("fwd", "bwd"), "cpu",
                           warmup_ms=1, rep_ms=2, progress=False)
    assert ch09.check_ratios(_right_ratios, rows=rows, baseline="naive")
    table = bench.report.ratio_table(rows, "naive")
    assert [set(e["ratios"]) for e in table] == [{"tiled"}, {"tiled"}]
    assert all(math.isfinite(e["ratios"]["tiled"]) for e in table)


# --- chapter 09 on a folder of results ---------------------------------------------------------------

def _invented_h200_files(folder: Path) -> None:
    """Speed and memory files in the harness's layout with invented numbers (provenance says so):
    every implementation kind the chapter draws, the CUDA kernels' protocol file, an OOM. No
    instruction ceilings and no SASS file, so the chapter also takes its 'missing' path."""
    import random

    rng = random.Random(9)
    prov = {"date": "2026-01-01T00:00:00+00:00", "command": "invented by tests/bench/test_results_data.py",
            "device": {"name": "Test GPU", "compute_capability": "9.0"}, "versions": {"torch": torch.__version__}}
    speed = []
    for mode in ("fwd", "bwd"):
        for D in (64, 128):
            for causal in (False, True):
                for N in (1024, 4096):
                    for impl in ("naive", "sdpa-flash", "sdpa-cudnn", "triton", "cuda", "cuda-v1", "cuda-v2"):
                        if impl.startswith("cuda-v") and mode == "bwd":
                            continue
                        tf = rng.uniform(10, 500)
                        speed.append({"kind": "speed", "impl": impl, "mode": mode, "dtype": "float16",
                                      "B": 16384 // N, "H": 2048 // D, "N": N, "Nq": N, "Nk": N, "D": D,
                                      "causal": causal, "tflops": tf, "ms": 1.0, "status": "ok"})
    bench.save_results(folder / "bench_h200_protocol_d64_float16.json", "speed", speed, prov)
    # the CUDA kernels' own protocol file: cuda_attention, its mma.sync forward and SDPA, N = 4096
    protocol = [dict(r, impl=impl) for r in speed if r["N"] == 4096
                for impl in ({"cuda": ("cuda", "cuda-mma")}.get(r["impl"], (r["impl"],)))
                if impl in ("sdpa-flash", "sdpa-cudnn", "cuda", "cuda-mma")]
    bench.save_results(folder / "cuda_protocol_h200.json", "speed", protocol, prov)
    memory = []
    for impl, per_n2 in (("naive", 80.0), ("sdpa-flash", None)):
        for N in (1024, 2048, 4096, 8192):
            oom = impl == "naive" and N == 8192
            b = int(per_n2 * N * N) if per_n2 else 4096 * N
            memory.append({"kind": "memory", "impl": impl, "mode": "fwd", "N": N, "Nq": N, "Nk": N, "B": 1,
                           "H": 16, "D": 128, "dtype": "float16", "causal": False,
                           "status": "oom" if oom else "ok", "peak_extra_bytes": None if oom else b})
    bench.save_results(folder / "memory_h200.json", "memory", memory, prov)


def test_chapter_09_runs_on_a_folder_of_results(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    _invented_h200_files(tmp_path)
    monkeypatch.setenv(results_data.DATA_ENV, str(tmp_path))        # the kernel inherits it
    nb = nbformat.read(ROOT / "notebooks" / "09_results.ipynb", as_version=4)
    NotebookClient(nb, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = []
    images = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{out.ename}: {out.evalue}"
            text.append(out.get("text", "") + out.get("data", {}).get("text/markdown", ""))
            images += "image/png" in out.get("data", {})
    text = "\n".join(text)
    assert images == 2 + 1, f"expected two speed figures and the memory figure, got {images} images"
    assert "h200_instruction_peaks.json: not found" in text             # the missing path, no crash
    assert "invented by" not in text                      # provenance is the worklog's, not the page's
    assert "out of memory at N = 8192" in text
    assert "| CUDA mma.sync (ch. 8) |" in text and "| cuDNN |" in text     # the ratio table
