"""``python -m flashtut.figures plot FILE.json ... --out-dir DIR``: draw result files.

Why the drawing command lives here and not in ``python -m flashtut.bench``: ``bench`` is the layer
that measures and writes results, and ``figures`` sits above it (and above ``results_data``); a
``bench plot`` subcommand would make the measuring layer import the drawing one, the upward import
the package's layering forbids. So the measuring CLI never loads matplotlib, and this command,
the top of the stack, reads files with ``flashtut.bench.results`` (the one format), draws with
``flashtut.figures.bench_plots`` (the one set of charts) and writes the images.

It writes every figure the rows allow (speed against N per head dim and pass, memory against N,
the CUDA ladder, the roofline) and the Markdown table of ratios to the baseline. Bad arguments
(an unknown format, an output folder that is a file or lies under one, a missing file, a file
that is not a results file or holds a malformed row) exit with status 2 and one line saying what
is wrong, before anything is drawn; nothing to draw exits 1.
"""
from __future__ import annotations

import argparse
import sys

from ..bench.cli import Parser, output_dir
from ..bench.results import load_rows

FORMATS = ("png", "svg", "pdf")


def _formats(text: str) -> list[str]:
    formats = [f.strip() for f in text.split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            raise argparse.ArgumentTypeError(f"unknown format {f!r}; accepted: {', '.join(FORMATS)} (comma-separated)")
    if not formats:
        raise argparse.ArgumentTypeError(f"no format given; accepted: {', '.join(FORMATS)} (comma-separated)")
    return formats


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m flashtut.figures",
                                     description="Draw the book's benchmark figures from results files.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("plot", help="draw the figures from result files",
                       description="Draw TFLOP/s against N (per head dim and mode), memory against N, "
                                   "the CUDA ladder, the roofline, and the table of ratios to the baseline.")
    p.add_argument("files", nargs="+", metavar="FILE.json",
                   help="results written by python -m flashtut.bench (run, memory, roofline, ...)")
    p.add_argument("--out-dir", type=output_dir, default="bench-figures", help="where to write (default bench-figures/)")
    p.add_argument("--format", type=_formats, default=["png", "svg"], help="comma-separated: png, svg, pdf (default png,svg)")
    p.add_argument("--baseline", default="sdpa-flash", help="implementation the ratio table divides by")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rows = load_rows(*args.files)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    import matplotlib

    matplotlib.use("Agg")           # files only: no display needed
    import matplotlib.pyplot as plt

    from .bench_plots import all_figures

    try:
        figures, table = all_figures(rows, args.baseline)
    except ValueError as e:             # rows that load but cannot be drawn together: say why
        print(f"nothing written: {e}", file=sys.stderr)
        return 1
    if not figures and table is None:
        print("nothing to draw: no successful rows in " + ", ".join(args.files), file=sys.stderr)
        return 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for stem, fig in figures:
        for fmt in args.format:
            path = args.out_dir / f"{stem}.{fmt}"
            fig.savefig(path, bbox_inches="tight")
            print(f"wrote {path}")
        plt.close(fig)
    if table is not None:
        path = args.out_dir / f"ratios_to_{args.baseline}.md"
        path.write_text(table + "\n")
        print(f"wrote {path}")
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
