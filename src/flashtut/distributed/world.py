"""A small world of CPU processes on gloo, for the tests and the chapter: ``run_world(fn, world)``.

Each rank is a fresh process (``torch.multiprocessing`` with the ``forkserver`` start method where
the platform has it, else ``spawn``: both work in a script, under pytest and in a Jupyter kernel) that joins a gloo process group through a file
store in a temporary folder (no port to pick), runs ``fn(rank, world, *args)`` and sends back what
it returned. ``fn`` must be importable by name (a function of a module, not one defined in a
notebook cell). Every process group gets ``timeout``: a rank that raises or stops leaves its peers a
``RuntimeError`` after that long instead of a hang, and :func:`run_world` raises one error that
names every rank that failed and why.
"""
from __future__ import annotations

import io
import os
import queue as queue_mod
import shutil
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..checks import check_block, check_number


def _pack(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


def _rank_main(rank: int, fn, world: int, store: str, timeout_s: float, results, args) -> None:
    torch.set_num_threads(1)          # world processes share the machine's cores
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        try:
            results.put((rank, True, _pack(fn(rank, world, *args))))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:      # reported to the parent, which raises for every rank at once
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class WorldError(RuntimeError):
    """One or more ranks of :func:`run_world` failed; ``errors`` maps each failed rank to its error
    text, ``results`` each rank that finished to what it returned."""

    def __init__(self, errors: dict[int, str], results: dict | None = None):
        self.errors, self.results = errors, results or {}
        first = {r: e.splitlines()[0] for r, e in sorted(errors.items())}
        super().__init__("ranks failed: " + "; ".join(f"rank {r}: {e}" for r, e in first.items()))


def _start_method() -> str:
    """``forkserver`` where the platform has it: one server process imports torch once, and every
    rank of every world after the first is a cheap fork of it (a fresh ``spawn`` pays the import of
    torch per rank, seconds each); ``spawn`` elsewhere."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", __name__])
    return "forkserver"


def run_world(fn, world: int, *args, timeout: float = 30.0):
    """Run ``fn(rank, world, *args)`` on ``world`` CPU processes joined in a gloo group whose
    operations time out after ``timeout`` seconds; return the list of what each rank returned, in
    rank order. If any rank raises, :class:`WorldError` (a ``RuntimeError``) names every failed rank
    with its error, once all ranks have ended (a rank waiting on a failed peer ends at ``timeout``).
    """
    world = check_block("world", world)
    timeout = check_number("timeout", timeout, 0.0)
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(rank, world, *args), got {type(fn).__name__}")
    method = _start_method()
    ctx = mp.get_context(method)
    results = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="flashtut_world_")
    try:
        procs = mp.start_processes(_rank_main, args=(fn, world, os.path.join(folder, "store"), timeout, results,
                                                     args),
                                   nprocs=world, join=False, start_method=method)
        got: dict[int, tuple[bool, object]] = {}
        # generous: starting Python and torch in each process, then the work, then one timeout
        deadline = time.monotonic() + 120 + 3 * timeout
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, ok, payload = results.get(timeout=0.2)
                got[rank] = (ok, payload)
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs.processes) and results.empty():
                    break
        for p in procs.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        errors = {r: payload for r, (ok, payload) in got.items() if not ok}
        errors.update({r: "ended without a result (killed, or past the deadline)" for r in range(world)
                       if r not in got})
        if errors:
            raise WorldError(errors, {r: _unpack(payload) for r, (ok, payload) in got.items() if ok})
        return [_unpack(got[r][1]) for r in range(world)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["run_world", "WorldError"]
