"""Every report says what produced it (engine.runs.provenance), through the real command line on
this CPU: analyze and compare on an example kernel, the trace analysis of a recorded trace, and two
runs of the built-in server, whose reports then compare (only the kernel override differs)."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO, only_workspace, run_magpie

from engine.bench.report_compare import KERNEL, compare_runs
from engine.runs.provenance import BENCHMARK_KEYS, COMMON_KEYS

pytestmark = pytest.mark.slow

SYNTHETIC = REPO / "tests" / "data" / "tracelens-golden" / "synthetic_vllm" / "synthetic_vllm.json.gz"
RMSNORM = EXAMPLES / "rmsnorm_pytorch"
WINNER = "engine.library.rmsnorm:rmsnorm_torch_fused"


def _head() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _report(out: Path, name: str) -> tuple[Path, dict]:
    ws = only_workspace(out)
    return ws, json.loads((ws / name).read_text())


def _check_common(ws: Path, prov: dict, config_name: str = "config.yaml") -> None:
    missing = [k for k in COMMON_KEYS if k not in prov]
    assert not missing, missing
    for key, value in prov.items():  # nothing unknown without its reason
        if value is None and not key.endswith(("_why", "_source")):
            assert prov.get(f"{key}_why"), key
    assert prov["git_commit"] == _head() and isinstance(prov["git_dirty"], bool)
    assert prov["tool_version"] == __import__("engine").__version__
    assert prov["torch"] and prov["python"]
    assert prov["config_file"] == config_name
    assert prov["config_sha256"] == hashlib.sha256((ws / config_name).read_bytes()).hexdigest()
    if prov["gpu_name"] is None:  # this CPU machine
        assert "no GPU found" in prov["gpu_name_why"] and prov["gpu_driver"] is None


def test_analyze_and_compare_reports_carry_provenance(tmp_path):
    proc = run_magpie("analyze", "-k", RMSNORM / "analyze.yaml", "-o", tmp_path / "a", "--no-perf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, report = _report(tmp_path / "a", "analyze_report.json")
    _check_common(ws, report["provenance"])
    proc = run_magpie("compare", "-k", RMSNORM / "compare.yaml", "-o", tmp_path / "c", "--no-perf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, report = _report(tmp_path / "c", "compare_report.json")
    _check_common(ws, report["provenance"])


def test_trace_analysis_report_carries_provenance(tmp_path):
    proc = run_magpie("benchmark", "--trace-dir", SYNTHETIC, "-o", tmp_path, "--top-k", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, report = _report(tmp_path, "trace_analysis_report.json")
    _check_common(ws, report["provenance"])


def test_builtin_benchmarks_carry_provenance_and_compare_on_their_kernel(tmp_path):
    load = ("--concurrency", "2", "--input-len", "16", "--output-len", "4", "--num-prompts", "4",
            "--range-ratio", "0")
    proc = run_magpie("benchmark", "builtin", *load, "-o", tmp_path / "clean", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, report = _report(tmp_path / "clean", "benchmark_report.json")
    prov = report["provenance"]
    assert not [k for k in BENCHMARK_KEYS if k not in prov]
    _check_common(ws, prov)
    assert prov["framework"] == "builtin" and prov["framework_version"].startswith(
        f"{prov['tool_version']}+g{_head()[:12]}")
    assert prov["model"] == "tiny" and prov["model_revision"] is None and "seeded random weights" in \
        prov["model_revision_why"]
    assert prov["image"] is None and "run_mode local" in prov["image_why"]
    # The same load with a kernel override: the two reports compare, the kernel listed
    cfg = tmp_path / "kernel.yaml"
    cfg.write_text(f"benchmark:\n  framework: builtin\n  server:\n    kernels:\n      rmsnorm: {WINNER}\n")
    proc = run_magpie("benchmark", "-b", cfg, *load, "-o", tmp_path / "kernel", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kws = only_workspace(tmp_path / "kernel")
    cmp = compare_runs(ws, kws)
    assert not cmp.refused, cmp.lines()
    assert [(d.field, d.kind) for d in cmp.differences] == [("benchmark.server.kernels.rmsnorm", KERNEL)]
    assert cmp.notes == [] and cmp.deltas
