"""Run every notebook's code cells top to bottom in one plain Python process per notebook.

For machines without the Jupyter toolchain (the GPU machine has torch, triton and cupy but no
nbclient): IPython magics and shell lines are skipped, ``display`` falls back to print, and
figures go to the Agg backend. It checks that the GPU branches of the chapters run, which the
CPU-only book build cannot. Usage: python tools/run_notebooks_plain.py [notebooks/NN_*.ipynb ...]
"""
import json
import sys
import time
import traceback
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


def code_of(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    cells = []
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        lines = [l for l in "".join(c["source"]).splitlines()
                 if not l.lstrip().startswith(("%", "!"))]
        cells.append("\n".join(lines))
    return cells


def _stand_in_ipython():
    """A minimal IPython.display where IPython is not installed: rich objects keep their text."""
    import types

    class _Rich:
        def __init__(self, data=None, *args, **kwargs):
            self.data = data

        def __repr__(self):
            return str(self.data)[:2000]

    mod = types.ModuleType("IPython.display")
    for name in ("Code", "Markdown", "HTML", "Image", "SVG", "Math", "Latex", "JSON"):
        setattr(mod, name, type(name, (_Rich,), {}))
    mod.display = lambda *objs, **kw: [print(repr(o)[:2000]) for o in objs]
    pkg = types.ModuleType("IPython")
    pkg.display = mod
    pkg.version_info = (8, 0, 0)  # matplotlib and torch look at these when IPython is imported
    pkg.get_ipython = lambda: None
    sys.modules.setdefault("IPython", pkg)
    sys.modules.setdefault("IPython.display", mod)


def run(path: Path) -> bool:
    try:
        import IPython.display  # noqa: F401
    except ImportError:
        _stand_in_ipython()
    from IPython.display import display
    ns = {"__name__": "__main__", "display": display}
    t0 = time.perf_counter()
    for i, src in enumerate(code_of(path)):
        try:
            exec(compile(src, f"{path.name}[cell {i}]", "exec"), ns)
        except Exception:
            print(f"FAIL {path.name} cell {i}:\n{src[:400]}\n{traceback.format_exc()[-2500:]}")
            return False
        import matplotlib.pyplot as plt
        plt.close("all")
    print(f"ok   {path.name} ({time.perf_counter() - t0:.1f} s)")
    return True


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    paths = [Path(p).resolve() for p in sys.argv[1:]] or sorted((root / "notebooks").glob("*.ipynb"))
    import os
    os.chdir(root / "notebooks")
    results = [run(p.resolve()) for p in paths]
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)
