"""examples/kernels/cpp_testcase: two identical g++ -O3 builds of a C++ testcase that times itself.
Each build runs in its rounds' processes, interleaved with the other, under the CPU tie margin."""

import shutil

import pytest

from conftest import EXAMPLES, read_report, run_magpie

pytestmark = [pytest.mark.slow, pytest.mark.serial,  # serial: a timed verdict needs the machine alone
              pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")]


def test_identical_builds_tie_from_interleaved_processes(tmp_path):
    example = tmp_path / "cpp_testcase"
    shutil.copytree(EXAMPLES / "cpp_testcase", example, ignore=shutil.ignore_patterns("*.out"))
    out = tmp_path / "out"
    proc = run_magpie("compare", "-k", example / "compare.yaml", "-o", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_report(out)
    rows = report["results"]["kernel_results"]
    assert [r["verdict"] for r in rows] == ["baseline", "tie"], [r["speedup_ci"] for r in rows]
    assert report["tie_margin"] == 0.10 and report["tie_margin_reason"].startswith("CPU clock")
    rounds = report["settings"]["rounds"]
    a, b = (r["performance_result"] for r in rows)
    assert a["processes"] == b["processes"] == rounds and a["clock"] == "cpu"
    assert sorted(a["process_starts"] + b["process_starts"]) == list(range(2 * rounds))
    assert "interleaved round by round" in proc.stdout
