"""Report-vs-report comparison refuses runs that measured different workloads
(engine.bench.report_compare), on pairs built from a recorded run folder: a copy with its
config.yaml and report edited as a profiled run, another load or a kernel override would record
them. The command line is run in process (engine.cli.main)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from engine.bench.report_compare import KERNEL, NOTED, WORKLOAD, compare_runs
from engine.cli import main

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "examples" / "runs" / "benchmark_builtin-tiny_20261129_192724_793ef2"  # one point, 3 repeats
SWEEP_RUN = REPO / "examples" / "runs" / "benchmark_builtin-tiny_20261129_192715_db9427"
WINNER = "engine.library.rmsnorm:rmsnorm_torch_fused"


def copy_run(tmp_path: Path, name: str, config=None, report=None, src: Path = RUN) -> Path:
    """A copy of a recorded run folder, its config.yaml and benchmark_report.json edited in place."""
    dst = tmp_path / name
    shutil.copytree(src, dst)
    if config is not None:
        doc = yaml.safe_load((dst / "config.yaml").read_text())
        config(doc["benchmark"])
        (dst / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if report is not None:
        doc = json.loads((dst / "benchmark_report.json").read_text())
        report(doc)
        (dst / "benchmark_report.json").write_text(json.dumps(doc))
    return dst


def profiled(cfg):
    cfg["profiler"]["torch_profiler"].update(enabled=True, num_steps=64, with_stack=True)
    cfg["profiler"]["tracelens"]["enabled"] = True
    cfg["gap_analysis"]["enabled"] = True
    cfg["client"]["repeats"] = 1


def profiled_report(r):
    r.update(run_kind="diagnostic", profiling_enabled=True, reward_eligible=False)


def conc4(cfg):
    cfg["envs"]["CONC"] = "4"


def conc4_report(r):
    r["envs"]["CONC"] = "4"


def with_kernel(cfg):
    cfg["server"]["kernels"] = {"rmsnorm": WINNER}


def with_kernel_report(r):
    r["server"]["argv"][5:5] = ["--kernel", f"rmsnorm={WINNER}"]


def fields(cmp, kind=None):
    return {d.field: d for d in cmp.differences if kind is None or d.kind == kind}


def test_the_same_run_compares_with_no_difference():
    cmp = compare_runs(RUN, RUN)
    assert not cmp.refused and cmp.differences == [] and cmp.deltas["output_throughput"]["delta"] == 0
    assert cmp.message() == "same workload"


def test_clean_against_profiled_is_refused(tmp_path):
    prof = copy_run(tmp_path, "profiled", profiled, profiled_report)
    cmp = compare_runs(RUN, prof)
    assert cmp.refused and cmp.deltas is None
    wl = fields(cmp, WORKLOAD)
    assert wl["run_kind"].a == "measurement" and wl["run_kind"].b == "diagnostic"
    assert wl["profiling_enabled"].b is True and "profiling perturbs latency" in wl["profiling_enabled"].why
    assert {"benchmark.profiler.torch_profiler.enabled", "benchmark.profiler.torch_profiler.with_stack",
            "benchmark.gap_analysis.enabled", "benchmark.profiler.tracelens.enabled"} <= set(wl)
    assert [d.field for d in cmp.differences][:2] == ["run_kind", "profiling_enabled"]  # the headline first
    # tracelens' own settings are trace post-processing: never a difference
    assert "benchmark.profiler.tracelens.analysis_stages" not in fields(cmp)
    assert fields(cmp, NOTED)["benchmark.client.repeats"].b == 1
    assert "--allow-different-workloads" in cmp.lines()[-1]


def test_another_concurrency_is_refused(tmp_path):
    other = copy_run(tmp_path, "conc4", conc4, conc4_report)
    cmp = compare_runs(RUN, other)
    assert cmp.refused
    assert [(d.field, d.a, d.b) for d in cmp.workload] == [("benchmark.envs.CONC", "2", "4")]


def test_a_kernel_override_is_what_a_comparison_is_for(tmp_path):
    kern = copy_run(tmp_path, "kernel", with_kernel, with_kernel_report)
    cmp = compare_runs(RUN, kern)
    assert not cmp.refused and cmp.workload == []
    k = fields(cmp, KERNEL)["benchmark.server.kernels.rmsnorm"]
    assert (k.a, k.b) == (None, WINNER)
    assert cmp.deltas and "output_throughput" in cmp.deltas
    assert cmp.message() == "same workload (the server's kernels differ)"


def test_the_vllm_plugin_environment_is_kernel_selection(tmp_path):
    site = tmp_path / "integrate" / "site"
    (site / "magpie_oot_rmsnorm").mkdir(parents=True)
    fork = tmp_path / "vllm_fork"
    (fork / "vllm").mkdir(parents=True)

    def plugin(folder, plugins):
        def edit(cfg):
            cfg["server_env"] = {"PYTHONPATH": f"{folder}:{REPO}", "VLLM_PLUGINS": plugins,
                                 "CUDA_VISIBLE_DEVICES": "3"}
        return edit

    def clean(cfg):
        cfg["server_env"] = {"PYTHONPATH": str(REPO), "VLLM_PLUGINS": "platform"}

    a = copy_run(tmp_path, "clean", clean)
    b = copy_run(tmp_path, "plugin", plugin(site, "platform,magpie_oot_rmsnorm"))
    cmp = compare_runs(a, b)
    assert not cmp.refused, cmp.lines()
    assert set(fields(cmp, KERNEL)) == {"benchmark.server_env.PYTHONPATH", "benchmark.server_env.VLLM_PLUGINS"}
    assert "benchmark.server_env.CUDA_VISIBLE_DEVICES" not in fields(cmp)  # which GPU, not which model
    # A folder that holds vLLM itself replaces the server, not a kernel
    c = copy_run(tmp_path, "fork", plugin(fork, "platform"))
    cmp = compare_runs(a, c)
    assert cmp.refused and "holds the server's own code" in fields(cmp)["benchmark.server_env.PYTHONPATH"].why
    # Folders taken away are not an addition either
    d = copy_run(tmp_path, "fewer", lambda cfg: cfg.update(server_env={"PYTHONPATH": str(site)}))
    assert compare_runs(a, d).refused


def test_provenance_framework_version_refuses_the_tool_commit_is_noted(tmp_path):
    def prov(**kw):
        def edit(r):
            r["provenance"] = {"framework_version": "0.1.0+gaaaa", "git_commit": "aaaa", "gpu_name": None,
                               "model_revision": None, **kw}
        return edit
    a = copy_run(tmp_path, "a", report=prov())
    b = copy_run(tmp_path, "b", report=prov(git_commit="bbbb"))
    c = copy_run(tmp_path, "c", report=prov(framework_version="0.1.0+gbbbb", gpu_name="NVIDIA H100"))
    ab = compare_runs(a, b)
    assert not ab.refused and fields(ab, NOTED)["provenance.git_commit"].b == "bbbb"
    ac = compare_runs(a, c)
    assert ac.refused and set(fields(ac, WORKLOAD)) == {"provenance.framework_version"}
    assert fields(ac, NOTED)["provenance.gpu_name"].why.endswith("not known on one side")
    assert any("no provenance" in n for n in compare_runs(RUN, a).notes)


def test_a_report_without_its_config_is_compared_on_its_own_keys(tmp_path):
    a = tmp_path / "a.json"
    shutil.copy(RUN / "benchmark_report.json", a)
    b = copy_run(tmp_path, "b", report=conc4_report)
    (b / "config.yaml").unlink()
    cmp = compare_runs(a, b)
    assert cmp.refused and [d.field for d in cmp.workload] == ["envs.CONC"]
    assert sum("config.yaml not available: compared on the report's own keys" in n for n in cmp.notes) == 2
    # --kernel in the server's argv is the kernel override there
    k = copy_run(tmp_path, "k", report=with_kernel_report)
    (k / "config.yaml").unlink()
    cmp = compare_runs(a, k)
    assert not cmp.refused and set(fields(cmp, KERNEL)) == {"server.kernels.rmsnorm"}


def test_an_older_config_lacking_a_key_has_its_default(tmp_path):
    old = copy_run(tmp_path, "old", lambda cfg: (cfg["client"].pop("http_client", None),
                                                 cfg["server"].pop("eager", None)))
    assert not compare_runs(RUN, old).differences


def test_cli_refuses_with_every_difference_and_the_flag(tmp_path, capsys):
    prof = copy_run(tmp_path, "profiled", profiled, profiled_report)
    assert main(["benchmark", "--compare-reports", str(RUN), str(prof)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    first, *rest = err.splitlines()
    assert first.startswith("error: A and B measure different workloads")
    for field in ("run_kind", "profiling_enabled", "benchmark.profiler.torch_profiler.enabled",
                  "benchmark.client.repeats"):
        assert any(line.split()[1].rstrip(":") == field for line in rest if len(line.split()) > 1), field
    assert "pass --allow-different-workloads" in err
    assert "│" not in err and " tie" not in err and "better" not in err  # no table, no verdicts


def test_cli_with_the_flag_prints_the_differences_above_the_verdict(tmp_path, capsys):
    other = copy_run(tmp_path, "conc4", conc4, conc4_report)
    assert main(["benchmark", "--compare-reports", str(RUN), str(other), "--allow-different-workloads"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    diff_at = next(i for i, ln in enumerate(lines) if "benchmark.envs.CONC: A 2  ->  B 4" in ln)
    verdict_at = next(i for i, ln in enumerate(lines) if "verdict" in ln)
    assert lines[0].startswith("compared although A and B measure different workloads") and diff_at < verdict_at
    assert "DIFFERENT WORKLOADS" in out and "output_throughput" in out


def test_cli_kernel_override_compares_and_lists_the_kernel(tmp_path, capsys):
    kern = copy_run(tmp_path, "kernel", with_kernel, with_kernel_report)
    assert main(["benchmark", "--compare-reports", str(RUN), str(kern)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "same workload (the server's kernels differ)"
    assert f"kernel    benchmark.server.kernels.rmsnorm: A (unset)  ->  B {WINNER}" in out
    assert "DIFFERENT WORKLOADS" not in out


def test_sweep_against_single_point_recorded_runs_are_refused():
    cmp = compare_runs(SWEEP_RUN, RUN)
    assert cmp.refused and [d.field for d in cmp.workload] == ["benchmark.client.sweep.concurrency"]
    allowed = compare_runs(SWEEP_RUN, RUN, allow_different_workloads=True)
    assert not allowed.refused and allowed.deltas and allowed.workload


@pytest.mark.parametrize("bad", ["missing", "empty"])
def test_unreadable_or_unmeasured_reports_are_config_errors(tmp_path, capsys, bad):
    path = tmp_path / bad
    if bad == "empty":
        path.mkdir()
        (path / "benchmark_report.json").write_text(json.dumps({"state": "failed"}))
    assert main(["benchmark", "--compare-reports", str(RUN), str(path)]) == 2
    err = capsys.readouterr().err
    assert ("cannot read a benchmark report" if bad == "missing" else "no measured result") in err


def test_cli_refuses_the_workloads_flag_without_two_reports(capsys):
    # Silently ignored, it would let a user believe a benchmark had been compared with something.
    assert main(["benchmark", "-b", "whatever.yaml", "--allow-different-workloads"]) == 2
    err = capsys.readouterr().err
    assert "--allow-different-workloads applies only to --compare-reports" in err and "nothing was run" in err
