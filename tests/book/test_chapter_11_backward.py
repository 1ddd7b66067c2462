"""Chapter 11b (the backward on Hopper), on the CPU: the model of the kernel's steps and layouts against the
kernel's own code and against the layout maths of chapter 11, the exercise checkers (right answers pass,
plausible wrong ones fail and say where), the figure, the chapter's shape (headings, one caption per
measurement naming the GPU and the files) and the numbers its text and its worklog quote from the data."""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from conftest import load_committed, measured_cells, notebook_cells  # noqa: E402

from flashtut.cuda import hopper_backward as hb  # noqa: E402
from flashtut.cuda.models import hopper_bwd as hbm  # noqa: E402
from flashtut.cuda.models import hopper_layout as hl  # noqa: E402
from flashtut.exercises import ch11b  # noqa: E402
from flashtut.figures import hopper_bwd_plots  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNEL = (ROOT / "src" / "flashtut" / "cuda" / "kernels" / "bwd_hopper.cu").read_text()
NOTEBOOK = ROOT / "notebooks" / "11_hopper_backward.ipynb"


def _cells():
    return notebook_cells(NOTEBOOK.name)


def _text():
    return " ".join(" ".join(src.split()) for kind, src, _ in _cells() if kind == "markdown")


# ---------------------------------------------------------------- the model against the kernel

@pytest.mark.parametrize("head_dim", [64, 128])
def test_ds_store_offsets_are_the_tile_layout(head_dim):
    bm = hbm.block_m(head_dim)
    assert bm * head_dim == 8192
    for wg in (0, 1):
        seen = set()
        for t in range(128):
            for i in range(0, bm // 2, 2):
                r, c = hl.accumulator_element(t, i, bm)
                off = hbm.ds_store_offset(t, i, wg)
                assert off == hl.tile_offset(64 * wg + r, c, 128)
                seen.add(off)
        assert len(seen) == 64 * bm // 2           # each pair of the warpgroup's 64 x BM once
    # the kernel computes the same expression
    assert "(64 * wg + 16 * warp + g) * 128 + (g << 4) + 4 * t" in KERNEL
    assert "((xrow + 1024u * ((i / 2) % 2) + (i / 32) * (BWDH_BLOCK_N * 128)) ^ (((i / 4) % 8) << 4))" in KERNEL


def test_dq_descriptors_read_ds_and_k_and_match_the_kernel():
    assert ch11b.check_dq_descriptors(hbm.dq_descriptors)
    # the kernel: LBO = SBO = 1024, the dS^T tile of query block qb and the K block cb, 2048 bytes a k-step
    assert "wgmma_desc(ds_addr, 1024, 1024), db = wgmma_desc(kq, 1024, 1024)" in KERNEL
    assert "wgmma_desc_step(da, kp * 2048), wgmma_desc_step(db, kp * 2048)" in KERNEL
    assert "qb * (BWDH_BLOCK_N * 128)" in KERNEL and "k_s + cb * (BWDH_BLOCK_N * 128)" in KERNEL
    # both operands transposed: trans-a and trans-b set in the dQ wgmma
    assert "p, 1, 1, 1, 1;" in KERNEL


@pytest.mark.parametrize("head_dim", [64, 128])
def test_q_tile_is_read_k_major_for_st_and_mn_major_for_dk(head_dim):
    bm = hbm.block_m(head_dim)
    rng = random.Random(head_dim)
    q = [[rng.random() for _ in range(head_dim)] for _ in range(bm)]
    k = [[rng.random() for _ in range(head_dim)] for _ in range(128)]
    K0 = 1 << 16
    smem = {hl.tile_offset(r, c, bm): q[r][c] for r in range(bm) for c in range(head_dim)}
    smem.update({K0 + hl.tile_offset(r, c, 128): k[r][c] for r in range(128) for c in range(head_dim)})
    for wg in (0, 1):
        for ks in range(head_dim // 16):
            a, b = hbm.s_t_descriptors(ks, head_dim, wg, k_base=K0)
            assert all(smem[hl.operand_address(a, m, kk, "K")] == k[64 * wg + m][16 * ks + kk]
                       for m in range(64) for kk in range(16))
            assert all(smem[hl.operand_address(b, n, kk, "K")] == q[n][16 * ks + kk]
                       for n in range(bm) for kk in range(16))
    for kp in range(bm // 16):
        descs = hbm.dkdv_b_descriptors(kp, head_dim)
        assert [c for c, _ in descs] == list(range(0, head_dim, 64))
        for c0, desc in descs:
            assert all(smem[hl.operand_address(desc, n, kk, "MN")] == q[16 * kp + kk][c0 + n]
                       for n in range(64) for kk in range(16))
    # the kernel's calls: the forward's helpers with the tiles' roles swapped, stepped descriptors
    assert "wg_qk<BWDH_BLOCK_M>(sc, kw, q_addr)" in KERNEL and "wg_pv<BWDH_BLOCK_M>(dk_acc, dsf, q_addr)" in KERNEL
    assert hb.HopperBackwardConfig().define_dict["FT_DESC_STEP"] == 1


def test_only_the_transposed_scores_are_already_the_a_operand():
    assert hbm.a_operand_in_place(True, 64) == 64 * 64 and hbm.a_operand_in_place(True, 128) == 64 * 128
    assert hbm.a_operand_in_place(False, 64) == 64            # the diagonal only
    with pytest.raises(ValueError):
        hbm.a_operand_in_place(True, 96)


def test_issue_orders_are_the_rungs_and_keep_every_dependency():
    assert list(hbm.ISSUE_ORDER) == list(hb.RUNGS)
    for rung, order in hbm.ISSUE_ORDER.items():
        hbm.check_order(order)
        dq_first = order.index("dQ") < order.index("dV")
        assert dq_first == bool(hb.RUNGS[rung][2])   # BWDH_DQ_FIRST
    assert hbm.in_flight_at(hbm.issue_order("b4"), "add dQ") == ["dV", "dK"]
    assert hbm.in_flight_at(hbm.issue_order("b3"), "add dQ") == []
    assert hbm.in_flight_at(hbm.issue_order("b3"), "release") == ["dQ"]   # wgmma_wait<1> before release_stage
    # the kernel's b4 branch: dQ, then dV and dK, wait for dQ, store it, then release
    b4 = KERNEL[KERNEL.index("#if BWDH_DQ && BWDH_DQ_FIRST"):KERNEL.index("#elif BWDH_DQ\n")]
    assert [w for w in re.findall(r"issue_dq|issue_dkdv|store_dq|release_stage", b4)] == \
        ["issue_dq", "issue_dkdv", "store_dq", "release_stage"]
    with pytest.raises(ValueError, match="'dK' is issued before 'dS\\^T'"):
        hbm.check_order(["load", "S^T", "dP^T", "P^T", "dK", "dS^T", "store dS^T", "barrier", "dQ", "dV",
                         "add dQ", "release"])
    with pytest.raises(ValueError, match="missing"):
        hbm.check_order(hbm.issue_order("b4")[:-1])
    with pytest.raises(ValueError, match="rung"):
        hbm.issue_order("b5")


def test_dq_reduction_costs():
    for d in (64, 128):
        costs = hbm.dq_reduction(4096, 4096, d)
        assert costs["atomics"]["bytes added per step"] == costs["tma reduce-add"]["bytes added per step"] == 32768
        assert costs["atomics"]["adds per step"] == 2 * 128 * 16         # 16 red.v2 per consumer thread
        assert costs["tma reduce-add"]["adds per step"] == 4             # two boxes of 32 columns per consumer
        assert costs["separate pass"]["products per tile"] == 7 and costs["separate pass"]["deterministic"]
        assert hbm.dq_bytes_per_flop(d) == 4 / 1280
    assert KERNEL.count("cp.reduce.async.bulk.tensor") == 1 and "for (int h = 0; h < 2; ++h)" in KERNEL
    with pytest.raises(ValueError):
        hbm.dq_reduction(0, 128, 64)
    with pytest.raises(ValueError):
        hbm.block_m(96)


# ---------------------------------------------------------------- checkers

def test_checkers_pass_the_right_answers_and_fail_the_wrong_ones():
    assert ch11b.check_dq_descriptors(hbm.dq_descriptors)
    k_major = ch11b.check_dq_descriptors(lambda kp, qb, cb, d, k: (
        hl.encode_descriptor(d + qb * 16384 + kp * 32, 16, 1024), hl.encode_descriptor(k + cb * 16384 + kp * 32, 16, 1024)))
    assert not k_major and "expected dS[query 0][key 16]" in k_major.message
    swapped = ch11b.check_dq_descriptors(lambda kp, qb, cb, d, k: hbm.dq_descriptors(kp, cb, qb, d, k))
    assert not swapped
    no_swizzle = ch11b.check_dq_descriptors(lambda kp, qb, cb, d, k: (
        hl.encode_descriptor(d + qb * 16384 + kp * 2048, 1024, 1024, "none"),) * 2)
    assert not no_swizzle and "failed" in no_swizzle.message
    raised = ch11b.check_dq_descriptors(lambda *a: 1 // 0)
    assert not raised and "ZeroDivisionError" in raised.message

    assert ch11b.check_step_order(lambda: hbm.issue_order("b4"))
    b3 = ch11b.check_step_order(lambda: hbm.issue_order("b3"))
    assert not b3 and "Issue the dQ product before dV and dK" in b3.message
    early = hbm.issue_order("b4")
    early.remove("release")
    early.insert(early.index("dK"), "release")
    bad = ch11b.check_step_order(lambda: early)
    assert not bad and "'release' is issued before 'dK'" in bad.message


def test_figure_draws_every_step_in_each_order():
    units = {n: s.unit for n, s in hbm.STEPS.items()}
    deps = {n: s.deps for n, s in hbm.STEPS.items()}
    fig = hopper_bwd_plots.step_orders(units, deps, {"b3": hbm.issue_order("b3"), "b4": hbm.issue_order("b4")})
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert len(ax.patches) == len(units)
        assert sum(len(d) for d in deps.values()) == len([t for t in ax.texts if not t.get_text()])
        assert min(t.get_fontsize() for t in ax.texts if t.get_text()) >= 9
    with pytest.raises(ValueError, match="each step"):
        hopper_bwd_plots.step_orders(units, deps, {"short": hbm.issue_order("b3")[:-1]})
    plt.close("all")


# ---------------------------------------------------------------- the chapter and its data

def test_chapter_shape():
    cells = _cells()
    text = _text()
    headings = re.findall(r"^## (11b\.\d+) ", "\n".join(src for kind, src, _ in cells if kind == "markdown"), re.M)
    assert headings == [f"11b.{i}" for i in range(1, 9)]
    for lab in ("UTC", "/root/out", "/tmp/tmp", "this run"):
        assert lab not in text
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text.replace("0x", ""))       # no commit hashes
    for kind in ("Figure", "Table"):
        numbers = [int(n) for _, src, _ in cells for n in re.findall(rf"^\*{kind} 11b\.(\d+):", src, re.M)]
        assert numbers == list(range(1, len(numbers) + 1)) and numbers, kind
    # every measured cell folded, its caption one line naming the GPU and every file it loads
    measured = measured_cells(cells)
    for tags, (_, caption, _), files in measured:
        assert "hide-input" in tags
        assert re.match(r"\*Table 11b\.\d+: ", caption) and "\n" not in caption.strip()
        assert "H100" in caption and all(f"`{f}`" in caption for f in files)
    assert len(measured) == 2      # the ladder (11b.7) and the protocol through cuda_attention (11b.8)
    # the kernel is shown from the package, never copied into the notebook
    code = "\n".join(src for kind, src, _ in cells if kind == "code")
    assert 'show_file("cuda/kernels/bwd_hopper.cu"' in code and "asm volatile" not in code
    long = [line for kind, src, _ in cells[2:] if kind == "code" for line in src.splitlines() if len(line) > 80]
    assert not long, long


def test_the_toc_lists_the_chapter_and_its_worklog_after_chapter_11():
    toc = (ROOT / "_toc.yml").read_text()
    assert "- file: notebooks/11_hopper\n      - file: notebooks/11_hopper_backward\n" in toc
    assert "- file: book/perflog_hopper_bwd\n" in toc


def _ratios():
    from flashtut.bench.report import ratio_summary

    out = {}
    for name in ("hopper_bwd_h100.json", "hopper_bwd_b4_h100.json"):
        rows, _ = load_committed(name)
        impls = sorted({r["impl"] for r in rows} - {"sdpa_flash"})
        out[name] = {(s["impl"], s["D"]): s for s in ratio_summary(rows, impls, baseline="sdpa_flash")}
    return out


def test_the_ladder_table_and_the_text_match_the_data():
    r = _ratios()
    first, second = r["hopper_bwd_h100.json"], r["hopper_bwd_b4_h100.json"]
    rows = [load_committed(n)[0] for n in ("hopper_bwd_h100.json", "hopper_bwd_b4_h100.json")]
    header, body = hopper_bwd_plots.ladder_table(rows, {})
    table = {row[0]: dict(zip(header, row)) for row in body}
    assert table["b1"]["D = 64"] == "1.05-1.11x" and table["b4"]["D = 128"] == "1.35-1.47x"
    # b1-b3 and mma.sync from the first sweep, b4 from its own
    assert table["b3"]["D = 128"] == f"{first['hopper_b3', 128]['min']:.2f}-{first['hopper_b3', 128]['max']:.2f}x"
    # the text: b3 and b4 ahead of SDPA flash and of mma.sync everywhere, none at 1.5x
    for table_ in (first, second):
        for (impl, D), s in table_.items():
            if impl in ("hopper_b3", "hopper_b4"):
                assert 1.0 < s["min"] and s["max"] < 1.5
    text = _text()
    assert "at $D = 64$ it measured below b3 in the same process in 7 of 8 cases, by at most 3%" in text
    b3 = {(r_["N"], r_["dtype"], r_["causal"]): r_["ratio_to_sdpa_flash"]
          for r_ in rows[1] if r_["impl"] == "hopper_b3" and r_["D"] == 64}
    below = [1 - r_["ratio_to_sdpa_flash"] / b3[r_["N"], r_["dtype"], r_["causal"]]
             for r_ in rows[1] if r_["impl"] == "hopper_b4" and r_["D"] == 64]
    assert sum(x > 0 for x in below) == 7 and max(below) <= 0.03 and len(below) == 8
    assert "A third stage of $Q$ and $dO$ lost 3 to 5% at $D = 128$" in text
    # a head's float32 dQ at the protocol's sizes: 1 to 8 MB
    sizes = [N * D * 4 / 2**20 for N in (4096, 16384) for D in (64, 128)]
    assert (min(sizes), max(sizes)) == (1, 8) and "float32 $dQ$ is 1 to 8 MB" in text
    # b1 gained about half its predicted 20% (geometric mean over the mma.sync backward)
    g = first["hopper_b1", 64]["gmean"] / first["cuda_mma", 64]["gmean"], \
        first["hopper_b1", 128]["gmean"] / first["cuda_mma", 128]["gmean"]
    assert all(1.06 < x < 1.11 for x in g) and "b1 gained about half of what was predicted" in text
    loss = [1 - second[f"hopper_{x}:3", 128]["max"] / second[f"hopper_{x}", 128]["max"] for x in ("b3", "b4")]
    assert all(0.02 <= x <= 0.05 for x in loss), loss


def test_the_worklog_opens_with_the_ladder_from_the_data():
    from flashtut.bench.report import format_table, ladder_summary, ratio_summary

    page = (ROOT / "book" / "perflog_hopper_bwd.md").read_text()
    assert page.startswith("# Performance log: the backward on Hopper")
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings[0] == "## What we learned"
    learned = page[page.index("## What we learned"):page.index(headings[1])]
    first = {"mma.sync backward (chapter 8)": "cuda_mma", "b1: wgmma, dQ by float32 reductions": "hopper_b1",
             "b2: TMA producer, ring of stages": "hopper_b2", "b3: dQ by TMA reduce-add": "hopper_b3"}
    header, body = ladder_summary(load_committed("hopper_bwd_h100.json")[0], first, baseline="sdpa_flash", mode="bwd")
    _, b4 = ladder_summary(load_committed("hopper_bwd_b4_h100.json")[0], {"b4: dQ issued before dV and dK": "hopper_b4"},
                           baseline="sdpa_flash", mode="bwd")
    assert format_table(header, body + b4, markdown=True) in learned
    assert len([line for line in learned.splitlines() if line.startswith("- **")]) >= 4
    assert "/root/out" not in page
    # the gains the opening quotes, geometric means of one rung over the one before it
    g = {name: {(s["impl"], s["D"]): s["gmean"] for s in ratio_summary(load_committed(name)[0], [
        "hopper_b1", "hopper_b2", "hopper_b3", "hopper_b4"], baseline="sdpa_flash")}
         for name in ("hopper_bwd_h100.json", "hopper_bwd_b4_h100.json")}
    first, second = g["hopper_bwd_h100.json"], g["hopper_bwd_b4_h100.json"]
    gain = lambda a, b, D, t=first: round(100 * (t[a, D] / t[b, D] - 1))   # noqa: E731
    assert (gain("hopper_b2", "hopper_b1", 64), gain("hopper_b2", "hopper_b1", 128)) == (10, 13)
    assert (gain("hopper_b3", "hopper_b2", 64), gain("hopper_b3", "hopper_b2", 128)) == (9, 9)
    assert (gain("hopper_b4", "hopper_b3", 128, second), gain("hopper_b4", "hopper_b3", 64, second)) == (7, -1)
    assert "+10% at D = 64, +13% at D = 128" in page and "gained 9% at both head dims" in page
    assert "gained 7% more at D = 128 and lost 1% at D = 64" in page


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_registers_the_chapter_quotes_are_ptxas_report():
    from flashtut.bench.sass import nvcc_sass

    src = "\n".join(s for _, s, _ in _cells())
    quoted = {"b1": (255, 238), "b2": (168, 168), "b3": (168, 168), "b4": (168, 168)}
    spills = {("b2", 64): 16, ("b3", 64): 12}
    for rung, regs in quoted.items():
        for D, want in zip((64, 128), regs):
            log, _ = nvcc_sass(hb.SOURCE, hb.HopperBackwardConfig(rung, False, D, 2).define_dict)
            m = re.search(r"Compiling entry function 'bwd_hopper'.*?(\d+) bytes spill stores.*?Used (\d+) registers",
                          log, re.S)
            assert (int(m.group(2)), int(m.group(1))) == (want, spills.get((rung, D), 0)), (rung, D)
    assert '"b1": "255 / 238"' in src and "16 B spilled at D = 64" in src and "12 B spilled at D = 64" in src


def test_ladder_table_takes_a_tensor_pipe_column_from_profile_rows():
    from flashtut.bench.profile import TENSOR

    rows = [load_committed(n)[0] for n in ("hopper_bwd_h100.json", "hopper_bwd_b4_h100.json")]
    prof = [{"kind": "profile", "mode": "bwd", "impl": f"hopper_{r}", "D": D, "metrics": {TENSOR: 40.0 + i}}
            for i, r in enumerate(hb.RUNGS) for D in (64, 128)]
    header, body = hopper_bwd_plots.ladder_table(rows, {"b1": "255 / 238"}, hopper_bwd_plots.tensor_pipe(prof))
    table = {row[0]: dict(zip(header, row)) for row in body}
    assert table["b3"]["tensor pipe %, D = 64 / 128"] == "42 / 42" and table["mma.sync"]["registers"] == "-"
    assert table["mma.sync"]["tensor pipe %, D = 64 / 128"] == "- / -"
    with pytest.raises(ValueError, match="sweeps"):
        hopper_bwd_plots.ladder_table(rows[0], {})


def test_show_file_finds_a_section_by_its_markers():
    from flashtut.notebook import show_file

    shown = show_file("cuda/kernels/bwd_hopper.cu", start="auto issue_dq", end="        };").data
    lines = shown.splitlines()
    assert lines[0].strip() == "auto issue_dq = [&]() {" and lines[-1] == "        };"
    assert "bwdh_wgmma_tt" in shown and "issue_dkdv" not in shown
    # numbers still work, and a marker no line holds is an error naming the argument
    assert show_file("cuda/kernels/bwd_hopper.cu", start=1, end=1).data.startswith("// bwd_hopper.cu")
    with pytest.raises(ValueError, match="end: no line contains"):
        show_file("cuda/kernels/bwd_hopper.cu", start="auto issue_dq", end="no such line")
