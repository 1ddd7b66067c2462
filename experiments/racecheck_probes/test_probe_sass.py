"""The probes keep their handover in shared memory (CPU, nvcc): racecheck can only judge a store and a load
that are there (a word written as a constant is forwarded by the compiler and leaves neither).

    pytest experiments/racecheck_probes
"""
import re
import shutil

import pytest

from flashtut.bench.sass import nvcc_sass
from flashtut.cuda.compile import KERNEL_DIR

from probe_launches import SOURCE, probe_kernels


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_racecheck_probes_keep_their_handover_in_shared_memory(tmp_path):
    # nvcc_sass builds files of the kernel directory: a copy of the probe beside a link to each header
    for header in KERNEL_DIR.glob("*.cuh"):
        (tmp_path / header.name).symlink_to(header)
    (tmp_path / SOURCE.name).write_text(SOURCE.read_text())
    import flashtut.cuda.compile as cc
    old, cc.KERNEL_DIR = cc.KERNEL_DIR, tmp_path
    try:
        _, text = nvcc_sass(SOURCE.name, {}, "90a")
    finally:
        cc.KERNEL_DIR = old
    bodies = re.split(r"\n\s*Function : ", text)[1:]
    kernels = {body.split()[0]: body for body in bodies}
    found = probe_kernels()[0]
    assert set(kernels) == set(found) and len(found) == 8
    for name, body in kernels.items():
        assert len(re.findall(r"\bSTS\b", body)) == 1 and len(re.findall(r"\bLDS\b", body)) == 1, (name, body)
