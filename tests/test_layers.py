"""The package's layers: each module imports only from its own layer or the layers below it, and no
import cycle exists anywhere. Imports inside functions count too: deferring an import hides a loop
from Python, not from a reader who has to understand the code.

The layers, bottom up (the book's "How the code is laid out" page draws the same list):
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "flashtut"

#: layer name -> the module prefixes it holds, bottom up
LAYERS = (
    ("core", ("flashtut.version", "flashtut.checks", "flashtut.softmax", "flashtut.reference", "flashtut.tiled",
              "flashtut.decode", "flashtut.paged_cache", "flashtut.constants", "flashtut.devices", "flashtut.block_mask",
              "flashtut.masks", "flashtut.flex_reference")),
    ("hardware facts", ("flashtut.hardware",)),
    ("cost models", ("flashtut.costs",)),
    ("kernels", ("flashtut.triton", "flashtut.cuda")),
    ("bench", ("flashtut.bench",)),
    ("results data", ("flashtut.results_data", "flashtut.repository")),
    ("figures", ("flashtut.figures",)),
    ("tools for readers", ("flashtut.exercises", "flashtut.notebook", "flashtut.colab",
                                             "flashtut.model", "flashtut.distributed")),
)
#: the public facade re-exports the layers; entry points (``python -m``) sit above everything
FACADE = "flashtut"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every ``flashtut`` module that ``module`` imports, at any depth of its code."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import x` names submodules or names of the package itself: only the latter
            # reads the package's __init__
            subs = {f"{target}.{a.name}" for a in node.names} & set(known)
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(target)
    out = set()
    for name in found:
        if name == FACADE or name.startswith(FACADE + "."):
            # an import of a.b.c also runs a and a.b; the facade counts only when named itself
            while name not in known and "." in name:
                name = name.rpartition(".")[0]
            if name in known and name != module:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if m != FACADE and not m.endswith("__main__") and layer_of(m) is None]
    assert not unplaced, (f"modules outside every layer: {unplaced}; add them to LAYERS here and to the "
                          "layout section of the README")


def test_no_upward_import():
    bad = []
    for module, targets in graph().items():
        if module == FACADE or module.endswith("__main__"):
            continue
        mine = layer_of(module)
        for t in sorted(targets):
            if t == FACADE:
                bad.append(f"{module} imports the facade `flashtut` (import from the module that holds the name)")
            elif layer_of(t) is not None and mine is not None and layer_of(t) > mine:
                bad.append(f"{module} ({LAYERS[mine][0]}) imports {t} ({LAYERS[layer_of(t)][0]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    g = graph()
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == "open":
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("source, expected", [
    ("from ..checks import x\ndef f():\n    from ..bench import sweeps\n",
     {"flashtut.checks", "flashtut.bench.sweeps"}),
    ("import flashtut.cuda.compile as cc\n", {"flashtut.cuda.compile"}),
    ("from .. import triton_attention\n", {"flashtut"}),
    ("import triton\nfrom .style import INK\n", {"flashtut.figures.style"}),
    ("from . import style\n", {"flashtut.figures.style"}),
])
def test_the_walker_sees_imports_inside_functions(tmp_path, source, expected):
    # the walker is this test's own machinery: prove it sees what the rules depend on
    known = {name: tmp_path / f"{name}.py" for name in (
        "flashtut", "flashtut.checks", "flashtut.bench", "flashtut.bench.sweeps", "flashtut.cuda",
        "flashtut.cuda.compile", "flashtut.figures", "flashtut.figures.style", "flashtut.figures.demo")}
    path = tmp_path / "demo.py"
    path.write_text(source)
    assert imports_of("flashtut.figures.demo", path, known) == expected


def test_nothing_points_readers_outside_the_repository():
    # the public contract lives in the book's API reference page, generated from the docstrings
    root = PACKAGE.parents[1]
    stale = []
    for pattern in ("src/**/*.py", "src/**/*.cu", "src/**/*.cuh", "tools/*", "book/*.md", "notebooks/*.ipynb",
                    "README.md", "Makefile", "pyproject.toml", "_config.yml"):
        for path in root.glob(pattern):
            text = path.read_text(errors="replace") if path.is_file() else ""
            for name in ("API" + ".md", "DESIGN" + ".md"):
                if name in text:
                    stale.append(f"{path.relative_to(root)} mentions {name}")
    assert not stale, "\n".join(stale)


def test_the_package_never_imports_the_experiments():
    # experiments/ (option studies, A/B runners, their data) imports flashtut; never the other way, and
    # the default test run does not collect it
    root = PACKAGE.parents[1]
    studies = {p.stem for p in (root / "experiments").rglob("*.py")} | {"experiments"}
    bad = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{module} imports {n}" for n in names if n.split(".")[0] in studies]
        if "experiments/" in path.read_text():
            text = path.read_text()
            if "sys.path" in text or "runpy" in text or "import_module" in text:
                bad.append(f"{module} names experiments/ and loads code by path")
    assert not bad, "\n".join(bad)
    import tomllib

    testpaths = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert testpaths == ["tests"], testpaths


def test_the_layer_story_is_told_the_same_way_everywhere():
    # the package docstring and the layout page number the same nine layers as this test (the ninth,
    # notebooks and book pages, sits outside the package)
    import flashtut

    names = [name for name, _ in LAYERS] + ["notebooks and book pages"]
    page = (PACKAGE.parents[1] / "book" / "code_layout.md").read_text()
    for text, where in ((flashtut.__doc__, "src/flashtut/__init__.py"), (page, "book/code_layout.md")):
        text = text.lower().replace("*", "")
        missing = [f"{i}. {name}" for i, name in enumerate(names, 1) if f"{i}. {name}" not in text]
        assert not missing, f"{where} does not number these layers as tests/test_layers.py does: {missing}"


def test_the_repository_is_named_in_one_public_module():
    # results_data and colab read the repository's URL and branch from flashtut.repository, and no module
    # reaches into another's private names for them
    known = modules()
    for user in ("flashtut.results_data", "flashtut.colab"):
        tree = ast.parse(known[user].read_text())
        private = [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   for a in n.names if a.name.startswith("_")]
        assert not private, f"{user} imports private names: {private}"
        assert "flashtut.repository" in imports_of(user, known[user], known), user
    for path in known.values():
        text = path.read_text()
        if path != known["flashtut.repository"]:
            assert "flash-attention-from-scratch\"" not in text, f"{path.name} names the repository itself"
