"""flashtut.bench.profile: which launches each Nsight Compute set makes, reading ncu's CSV, pairing its
entries with the launches, and the ``profile`` rows they become (on the CPU, from CSV text written here)."""
from __future__ import annotations

import csv
import io
import math

import pytest

from flashtut.bench import cli, profile, registry, results
from flashtut.cuda import configs


def fake_csv(entries, notes=True) -> str:
    """ncu --csv text for ``entries`` [(kernel name, {metric: value text})], with ncu's own notes and the
    program's output before the header, as ncu prints them."""
    out = io.StringIO()
    if notes:
        out.write("==PROF== Connected to process 1 (/usr/bin/python3)\nsome output of the program\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
                "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"])
    for i, (kernel, metrics) in enumerate(entries):
        for name, value in metrics.items():
            w.writerow([i, 1, "python3", "host", kernel, 1, 7, "(384, 1, 1)", "(32, 32, 1)", 0, "9.0", "Command line",
                        name, "%" if "pct" in name else "", value])
    return out.getvalue()


def kernel_name(impl: str) -> str:
    return {"sdpa-flash": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>(Params)",
            "cuda-mma": "flash_fwd_v4"}.get(impl, "flash_fwd_" + impl.split("-")[1][:2])


def test_each_set_launches_registry_implementations_and_cuda_attentions_build():
    # "its build" is cuda_attention's as profiled: at D = 128 today's, at D = 64 today's less the two options
    # added after the profiles
    assert profile.PROFILED_OPTIONS[128] == configs.HOPPER_OPTIONS[128]
    assert profile.PROFILED_OPTIONS[64] == {k: v for k, v in configs.HOPPER_OPTIONS[64].items()
                                            if k not in ("tail_first", "uniform_wg")}
    for D in configs.HOPPER_HEAD_DIMS:
        default = registry.hopper_name("w3", configs.HOPPER_CONSUMERS[D], profile.PROFILED_OPTIONS[D])
        for set_name in (s for s in profile.SETS if s != "overlap"):   # overlap's options left the kernels
            plan = profile.launches(set_name, D)
            assert all(registry.get(name) for name, _ in plan)
            assert len(set(plan)) == len(plan)                     # each launch once
        ladder = profile.launches("ladder", D)
        assert ladder[:5] == [(n, False) for n in ("sdpa-flash", "cuda-mma", "hopper-w1", "hopper-w2", "hopper-w3")]
        assert (default, False) in ladder and (default, True) in ladder
        # options: the plain build at cuda_attention's consumers and every option of the registry's group at
        # that consumer count, not causal then causal
        options = profile.launches("options", D)
        half = len(options) // 2
        assert [n for n, c in options[:half]] == [n for n, c in options[half:]]
        assert not any(c for _, c in options[:half]) and all(c for _, c in options[half:])
        wanted = {n for n in registry.names() if registry.get(n).group == "hopper-options"
                  and n.startswith("hopper-w3[") and ("c3" in n) == (configs.HOPPER_CONSUMERS[D] == 3)}
        assert {n for n, _ in options[1:half]} == wanted
        # shipped: cuda_attention's build as it ships and, where it differs, as the other sets profiled it
        shipped = registry.hopper_name("w3", configs.HOPPER_CONSUMERS[D], configs.HOPPER_OPTIONS[D])
        names = [default] if shipped == default else [default, shipped]
        assert profile.launches("shipped", D) == [(n, c) for c in (False, True) for n in names]
    assert profile.launches("shipped", 64) == [(n, c) for c in (False, True)
                                               for n in ("hopper-w3[c3,turns]", "hopper-w3[c3,turns,tail,uni]")]
    assert profile.launches("shipped", 128) == [("hopper-w3[store]", False), ("hopper-w3[store]", True)]
    assert ("hopper-w3[c3,turns]", True) in profile.launches("options", 64)
    with pytest.raises(ValueError, match="set must be one of ladder, options, overlap"):
        profile.launches("rungs", 64)
    with pytest.raises(ValueError, match="D must be one of"):
        profile.launches("ladder", 96)


def test_hopper_name_finds_each_named_build():
    for name, build in registry.HOPPER_IMPLS.items():
        if (build.block_n, build.pv_split, build.stages) == (128, True, 2):
            assert registry.hopper_name(build.variant, build.consumers, build.option_dict) == name
    with pytest.raises(ValueError, match="no Hopper implementation of rung 'w3' with 3 consumers"):
        registry.hopper_name("w3", 3, {"tma_store": True})


def test_ncu_csv_is_read_per_kernel_in_launch_order():
    text = fake_csv([("flash_fwd_w3", {profile.DURATION: "1,095,104", profile.TENSOR: "53.77",
                                       "sm__inst_executed_pipe_tensor_op_gmma.sum": "n/a"}),
                     ("flash_fwd_w4", {profile.DURATION: "648,000", profile.TENSOR: "48.4"})])
    got = profile.parse_ncu_csv(text)
    assert [e["id"] for e in got] == [0, 1] and [e["kernel"] for e in got] == ["flash_fwd_w3", "flash_fwd_w4"]
    assert got[0]["metrics"][profile.DURATION] == 1095104.0 and got[1]["metrics"][profile.TENSOR] == 48.4
    assert math.isnan(got[0]["metrics"]["sm__inst_executed_pipe_tensor_op_gmma.sum"])
    assert got[0]["units"][profile.TENSOR] == "%"
    with pytest.raises(ValueError, match="no ncu CSV header"):
        profile.parse_ncu_csv("==PROF== nothing profiled\n")


def test_rows_pair_each_launch_with_its_kernel_and_are_valid_results(tmp_path):
    plan = profile.launches("ladder", 64)
    entries = [(kernel_name(n), {m: f"{i + 1}.5" for m in profile.NCU_METRICS}) for i, (n, _) in enumerate(plan)]
    entries[0][1][profile.DURATION] = "n/a"
    rows = profile.profile_rows("ladder", 64, profile.parse_ncu_csv(fake_csv(entries)))
    assert [(r["impl"], r["causal"]) for r in rows] == plan
    assert {(r["N"], r["D"], r["B"], r["H"], r["dtype"]) for r in rows} == {(4096, 64, 4, 32, "float16")}
    assert rows[3]["metrics"][profile.TENSOR] == 4.5 and set(rows[3]["metrics"]) == set(profile.NCU_METRICS)
    path = results.save_results(tmp_path / "p.json", "profile", rows, {"date": "now"})
    back = results.load_results(path)["rows"]
    assert back[0]["metrics"][profile.DURATION] is None and back[3]["metrics"] == rows[3]["metrics"]
    assert len({results.measurement_key(r) for r in back}) == len(back)
    # a kernel that is not the launch's, or one entry too few, is refused
    swapped = entries[:]
    swapped[2], swapped[3] = swapped[3], swapped[2]
    with pytest.raises(ValueError, match=r"launch hopper-w1 \(causal False\) should run a kernel named \*flash_fwd_w1\*"):
        profile.profile_rows("ladder", 64, profile.parse_ncu_csv(fake_csv(swapped)))
    with pytest.raises(ValueError, match="launches 10 kernels, ncu profiled 9"):
        profile.profile_rows("ladder", 64, profile.parse_ncu_csv(fake_csv(entries[:-1])))


@pytest.mark.parametrize("change,why", [
    ({"metrics": {}}, "metrics: empty"), ({"metrics": {"x": "5"}}, "metrics: got"), ({"kernel": None}, "kernel: got"),
    ({"D": 0}, "D: got 0"), ({"causal": 1}, "causal: got 1")])
def test_profile_rows_are_checked(change, why):
    row = {"kind": "profile", "impl": "hopper-w3", "kernel": "flash_fwd_w3", "N": 4096, "D": 64, "causal": False,
           "metrics": {profile.TENSOR: 50.0, profile.DURATION: None}}
    assert results.check_row(row) is None
    assert why in results.check_row({**row, **change})


def test_the_ncu_command_and_the_cli():
    cmd = profile.ncu_command("options", 64, "/opt/ncu")
    assert cmd[:5] == ["/opt/ncu", "--clock-control", "none", "-k", "regex:flash_fwd"]
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(profile.NCU_METRICS)
    assert cmd[-6:] == ["-m", "flashtut.bench", "profile", "--launch", "options", "64"]
    args = cli.build_parser().parse_args(["profile", "--set", "options", "-D", "64"])
    assert (args.set, args.head_dim) == (["options"], [64])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["profile", "--set", "rungs"])
    if not (profile.torch.cuda.is_available() and profile.torch.cuda.get_device_capability() == (9, 0)):
        with pytest.raises(SystemExit):     # parser.error: profile runs the Hopper kernels under ncu
            cli.main(["profile", "--set", "ladder", "-D", "64"])


def test_a_profile_table_reads_each_launch_of_its_set():
    plan = profile.launches("ladder", 64)
    entries = [(kernel_name(n), {m: f"{i + 1}.25" for m in profile.NCU_METRICS}) for i, (n, _) in enumerate(plan)]
    entries[4][1][profile.DURATION] = "1,289,000"
    rows = profile.profile_rows("ladder", 64, profile.parse_ncu_csv(fake_csv(entries)))
    header, body = profile.table(rows, [("W3", "hopper-w3", 64, False), ("W3 turns causal", "hopper-w3[c3,turns]", 64, True)])
    assert header[:4] == ["D", "kernel", "ms", "tensor pipe %"] and len(header) == 2 + len(profile.TABLE_COLUMNS)
    assert body[0][:4] == ["64", "W3", "1.289", "5.2"] and body[1][3] == "9.2"   # the 9th launch: W3 turns, causal
    assert profile.metric(rows, "hopper-w3", 64, False, profile.TENSOR) == 5.25
    with pytest.raises(KeyError, match=r"no profile of hopper-w3 at D = 64 \(causal True\) in set 'ladder'"):
        profile.metric(rows, "hopper-w3", 64, True, profile.TENSOR)


def test_the_shipped_set_reads_the_build_as_it_ships_beside_the_one_profiled_before():
    plan = profile.launches("shipped", 64)
    entries = [(kernel_name(n), {m: f"{i + 1}.5" for m in profile.NCU_METRICS}) for i, (n, _) in enumerate(plan)]
    rows = profile.profile_rows("shipped", 64, profile.parse_ncu_csv(fake_csv(entries)))
    assert [(r["set"], r["impl"], r["causal"]) for r in rows] == [("shipped", n, c) for n, c in plan]
    # the third launch is the build profiled before, causal; the fourth the shipped one, causal
    assert profile.metric(rows, "hopper-w3[c3,turns]", 64, True, profile.TENSOR, "shipped") == 3.5
    assert profile.metric(rows, "hopper-w3[c3,turns,tail,uni]", 64, True, profile.TENSOR, "shipped") == 4.5
    with pytest.raises(ValueError, match="launches 4 kernels, ncu profiled 3"):
        profile.profile_rows("shipped", 64, profile.parse_ncu_csv(fake_csv(entries[:3])))
