"""Tokens per second of chapter 12's serving loop: the PyTorch reference, SDPA over a dense cache and the
Triton kernel over a paged cache (eager and in a CUDA graph), at several prompt lengths, batch 1 and a
mixed batch (``flashtut.model.paged_decoding.measure_serving``).

    PYTHONPATH=src python experiments/decode/run_serving.py --out decode_serving.json
"""
from __future__ import annotations

import argparse
import sys

import torch

from flashtut.bench.provenance import collect
from flashtut.bench.decode import serving_table
from flashtut.bench.results import save_results
from flashtut.model.paged_decoding import measure_serving


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", default="1024,4096,16384,65536")
    p.add_argument("--batches", default="1,mixed-32")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--reference-tokens", type=int, default=4)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    device = torch.device("cuda")
    argv = sys.argv[1:] if argv is None else list(argv)
    prov = collect(device, call="python experiments/decode/run_serving.py " + " ".join(argv))
    config = {"prompts": args.prompts, "batches": args.batches, "new_tokens": args.new_tokens,
              "reference_tokens": args.reference_tokens}
    rows = []

    def keep(row):
        rows.append(row)
        save_results(args.out, "model", rows, prov, config)
        print(f"{row['layout']:>16s} prompt {row['prompt']:>6d} {row['method']:>20s}: "
              f"{row.get('tokens_per_s') or 0:10.1f} tokens/s {row['status']} {row.get('error', '')}", flush=True)

    measure_serving(device, [int(x) for x in args.prompts.split(",")], args.batches.split(","),
                    new_tokens=args.new_tokens, reference_tokens=args.reference_tokens, on_row=keep)
    print(serving_table(rows))
    return 1 if any(r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
