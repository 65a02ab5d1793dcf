"""magpie benchmark --trace-dir prints its self-checks: a failed one as a WARNING line on the terminal and
in the report, a passing one with what it compared; the idle gaps by cause beside the gap analysis."""

import json

from conftest import only_workspace, run_magpie
from trace_builder import TraceBuilder


def test_cli_prints_a_failed_check_and_the_idle_causes(tmp_path):
    b = TraceBuilder()
    b.op("vllm::decode", 0, 60)
    for i, (ts, kernels) in enumerate([(5, [(100, 10), (111, 9)]), (25, []), (45, [(300, 10), (311, 9)])]):
        corr = 100 + i
        b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 100, "tid": 100,
                         "ts": ts, "dur": 3.0, "args": {"correlation": corr}})
        for j, (start, length) in enumerate(kernels):
            b.events.append({"ph": "X", "cat": "kernel", "name": f"k{j}", "pid": 0, "tid": 7, "ts": start,
                             "dur": length, "args": {"correlation": corr}})
    b.op_with_kernel("aten::mm", 400, "gemm", 406, 10, dims=[[64, 128], [128, 256]])  # the host came back late: a host-bound gap
    proc = run_magpie("benchmark", "--trace-dir", b.write(tmp_path / "graph.pt.trace.json"), "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps long lines
    assert "WARNING trace check graph_replays (rank 0): 1 of 3 graph replays have no GPU event in the trace" in out
    assert "180.0 us of the 268.0 us idle lies inside those replays" in out
    assert "trace check kernel_time (rank 0) passed: report kernel time 48.0 us (5 events)" in out
    assert "rank 0: idle gaps >= 5 us: 1 gaps, 0.086 ms: host_idle 100% (0.086 ms); 0.180 ms in 1 gaps inside graph" \
           in out
    ws = only_workspace(tmp_path / "out")
    report = json.loads((ws / "trace_analysis_report.json").read_text())
    assert report["trace_checks"]["passed"] is False
    assert [w.split(":")[1].strip() for w in report["trace_checks"]["warnings"]] == ["graph_replays",
                                                                                   "tracelens_report (pytorch)"]
    assert "WARNING trace check tracelens_report (pytorch) (rank 0): 1 of 3 graph replays in this report's trace" in out
    assert (ws / "gap_analysis" / "gpu_idle_causes_rank0.csv").is_file()
    assert str(ws / "gap_analysis" / "gpu_idle_causes_rank0.csv") in report["gap_analysis"]["output_files"]
    assert "WARNING trace check graph_replays" in (ws / "trace_analysis_summary.txt").read_text()
