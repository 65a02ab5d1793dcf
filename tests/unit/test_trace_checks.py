"""The trace analysis checks itself (engine.trace.checks, engine.trace.graphs) and explains its idle
gaps (engine.trace.idle_causes): each check fails on a small trace built to break it, and passes on
the real traces of tests/data."""

import csv
from pathlib import Path

import pytest

from engine.runs.workspace import Workspace
from engine.trace.analyze import TraceAnalysisOptions, run_trace_analysis
from engine.trace.idle_causes import is_launch_call, is_sync_call
from trace_builder import TraceBuilder

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "tracelens-golden"
REAL = [GOLDEN / "h200_real" / "h200_block_bf16.json.gz", GOLDEN / "synthetic_vllm" / "synthetic_vllm.json.gz",
        REPO / "tests" / "data" / "trace_split" / "mixed_steady_state_prefill_0_prefilldecode_1_decode_3_bs130_conc3_"
                                                 "synthetic_vllm.json.gz"]
DECODE = "execute_context_0(0)_generation_4(4)"
PREFILL = "execute_context_1(8)_generation_0(0)"


def _analyse(tmp_path, trace_path, **opts):
    ws = Workspace.create(tmp_path / "out", "trace", "t")
    result = run_trace_analysis(Path(trace_path), TraceAnalysisOptions(tracelens=False, **opts), ws)
    checks = {c["check"]: c for c in result.report["trace_checks"]["checks"]}
    return result.report, checks, ws


def _graph_launch(b, ts, kernels, dur=3.0):
    """A cudaGraphLaunch whose replay ran ``kernels`` [(name, start, length)] (none: not recorded)."""
    c = b.corr
    b.corr += 1
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": b.cpu[0], "tid": b.cpu[1],
                     "ts": ts, "dur": dur, "args": {"correlation": c}})
    for name, start, length in kernels:
        b.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start, "dur": length,
                         "args": {"correlation": c, "stream": 7, "device": 0}})


def _graph_trace(second_recorded: bool, unlinked_kernel: bool = False):
    b = TraceBuilder()
    b.op("vllm::decode", 0, 60)
    _graph_launch(b, 5, [("k1", 100, 10), ("k2", 111, 9)])
    _graph_launch(b, 25, [("k1", 200, 10), ("k2", 211, 9)] if second_recorded else [])
    _graph_launch(b, 45, [("k1", 300, 10), ("k2", 311, 9)])
    if unlinked_kernel:  # a GPU event with no launch, where the missing replay ran
        b.events.append({"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 200, "dur": 10,
                         "args": {"stream": 7, "device": 0}})
    return b


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name[:30])
def test_every_check_passes_on_the_real_traces(tmp_path, path):
    report, checks, ws = _analyse(tmp_path, path)
    assert report["trace_checks"]["passed"] and not report["trace_checks"]["warnings"]
    assert {c["status"] for c in checks.values()} <= {"passed", "skipped"}
    assert checks["kernel_time"]["status"] == checks["kernel_counts"]["status"] == "passed"
    n = checks["kernel_time"]["numbers"]
    assert n["report_kernel_us"] == pytest.approx(report["gap_analysis"]["total_kernel_time_us"])
    assert n["report_events"] == n["trace_counted_events"] > 0
    assert "report kernel time" in checks["kernel_time"]["compared"]
    # every idle microsecond is in one class or under the noise floor
    idle = report["gap_analysis"]["idle"]["0"]
    causes = report["gap_analysis"]["idle_causes"]["0"]
    assert causes["idle_classified_us"] + causes["below_noise_floor"]["idle_us"] == pytest.approx(
        idle["total_idle_us"], abs=0.01)
    assert idle["idle_inside_unrecorded_graph_replays_us"] == 0.0
    assert sum(c["idle_us"] for c in causes["by_cause"].values()) == pytest.approx(causes["idle_classified_us"],
                                                                                   abs=0.01)
    rows = list(csv.DictReader(open(causes["file"])))
    assert len(rows) == causes["gaps_classified"]
    assert all(float(r["duration_us"]) >= 5.0 for r in rows)
    summary = (ws.root / "trace_analysis_summary.txt").read_text()
    assert "trace check kernel_time (rank 0) passed" in summary and "WARNING" not in summary
    # with step annotations, each step's critical path: its segments add up to the step's length
    paths = report["gap_analysis"].get("critical_path", {}).get("0")
    if paths:
        for r in csv.DictReader(open(paths["file"])):
            parts = sum(float(r[k]) for k in ("gpu_us", "gpu_wait_us", "launch_latency_us", "host_launch_us",
                                               "host_other_us", "sync_wait_us", "before_step_us"))
            assert parts == pytest.approx(float(r["path_us"]), abs=0.01)
        assert paths["steps"] == paths["gpu_bound"] + paths["host_bound"] > 0
    assert report["summary_lines"] == summary.splitlines()


def test_graph_replay_without_its_kernels_is_not_idle(tmp_path):
    report, checks, ws = _analyse(tmp_path, _graph_trace(second_recorded=False).write(tmp_path / "g.json"))
    g = checks["graph_replays"]
    assert g["status"] == "failed" and not report["trace_checks"]["passed"]
    assert g["numbers"]["launches"] == 3 and g["numbers"]["empty"] == 1 and g["numbers"]["recorded"] == 2
    # the GPU was "idle" 120..300 only because the middle replay was not recorded: 180 of 182 us excluded
    assert g["numbers"]["idle_us"] == 182.0 and g["numbers"]["idle_excluded_us"] == 180.0
    assert "1 of 3 graph replays have no GPU event in the trace" in g["warning"]
    assert "180.0 us of the 182.0 us idle" in g["warning"]
    idle = report["gap_analysis"]["idle"]["0"]
    assert idle["total_idle_us"] == 182.0  # today's number, unchanged
    assert idle["idle_inside_unrecorded_graph_replays_us"] == 180.0
    assert idle["idle_without_unrecorded_graph_replays_us"] == 2.0
    causes = report["gap_analysis"]["idle_causes"]["0"]
    assert causes["graph_unrecorded"] == {"gaps": 1, "idle_us": 180.0}
    assert causes["idle_classified_us"] == 0.0 and causes["by_cause"] == {}
    assert any(line.startswith("WARNING trace check graph_replays (rank 0)") for line in report["summary_lines"])
    assert "WARNING trace check graph_replays" in (ws.root / "trace_analysis_summary.txt").read_text()
    # the other checks still pass: the kernels that are there are reported
    assert checks["kernel_time"]["status"] == checks["kernel_counts"]["status"] == "passed"


def test_graph_replays_all_recorded_pass(tmp_path):
    report, checks, _ = _analyse(tmp_path, _graph_trace(second_recorded=True).write(tmp_path / "g.json"))
    g = checks["graph_replays"]
    assert g["status"] == "passed" and g["numbers"]["idle_excluded_us"] == 0.0
    assert g["compared"] == "3 graph launches: 3 with GPU events in the trace (2..2 per replay), none missing"


def test_unlinked_gpu_events_fail_the_timeline_reconciliation(tmp_path):
    """A missing replay's window holding a GPU event without a launch: not excluded (it may be the replay's
    kernel), and the TraceLens timeline, built from linked events only, misses its time."""
    report, checks, _ = _analyse(tmp_path, _graph_trace(False, unlinked_kernel=True).write(tmp_path / "g.json"))
    g = checks["graph_replays"]
    assert g["status"] == "failed" and g["numbers"]["idle_excluded_us"] == 0.0
    assert g["numbers"]["missing_with_unlinked_gpu_events"] == 1 and "not excluded" in g["warning"]
    k = checks["kernel_time"]
    assert k["status"] == "failed" and k["numbers"]["unlinked_gpu_events"] == 1
    assert k["numbers"]["timeline_busy_us"] == 38.0 and k["numbers"]["all_gpu_events_busy_us"] == 48.0
    assert "1 GPU events (10.0 us) are linked to no launch" in k["warning"]


def test_overlapping_kernels_on_one_stream_fail_the_kernel_time_check(tmp_path):
    b = TraceBuilder()
    b.op_with_kernel("aten::mm", 0, "gemm", 100, 50)
    b.op_with_kernel("aten::mm", 20, "gemm", 110, 50)  # on the same stream, inside the first: counted twice
    _, checks, _ = _analyse(tmp_path, b.write(tmp_path / "o.json"))
    k = checks["kernel_time"]
    assert k["status"] == "failed"
    assert k["numbers"]["streams_over_busy"] == [{"stream": "device 0 / stream 7", "kernel_us": 100.0, "busy_us": 60.0}]
    assert "counted twice" in k["warning"]


def test_options_that_leave_kernels_out_are_said_not_failed(tmp_path):
    b = TraceBuilder()
    b.op_with_kernel("aten::mm", 0, "gemm", 100, 50)
    b.op_with_kernel("aten::add", 20, "add", 160, 2)
    _, checks, _ = _analyse(tmp_path, b.write(tmp_path / "m.json"), min_duration_us=5.0)
    k = checks["kernel_time"]
    assert k["status"] == "passed" and k["numbers"]["left_out_by_options_events"] == 1
    assert "1 GPU events (2.0 us) left out by the options" in k["compared"]
    assert checks["kernel_counts"]["status"] == "passed"


def test_report_counts_reconciled_with_the_tree(tmp_path, monkeypatch):
    """A report whose calls differ from the trace's GPU events (here: one event dropped from it) fails."""
    import engine.trace.analyze as analyze
    real = analyze.aggregate_kernels

    def dropping(*a, **k):
        aggs = real(*a, **k)
        aggs["gemm"].durations.pop()
        return aggs

    monkeypatch.setattr(analyze, "aggregate_kernels", dropping)
    b = TraceBuilder()
    for i in range(3):
        b.op_with_kernel("aten::mm", i * 20, "gemm", 100 + i * 20, 10)
    _, checks, _ = _analyse(tmp_path, b.write(tmp_path / "c.json"))
    c = checks["kernel_counts"]
    assert c["status"] == "failed" and c["numbers"]["mismatches"] == [{"name": "gemm", "report": 2, "tree": 3}]
    assert "gemm: report 2, tree 3" in c["warning"]
    assert checks["kernel_time"]["status"] == "failed"  # 2 events reported of 3 in the window


def _steps_trace(with_kernels, big=None):
    b = TraceBuilder()
    for i in range(32):
        t0 = i * 100.0
        b.annotation(DECODE, t0, 90)
        if i in with_kernels:
            b.op_with_kernel("aten::mm", t0 + 5, "gemm", t0 + 20, 10000 if i == big else 5)
    return b


def test_most_steps_without_gpu_events_fail(tmp_path):
    report, checks, _ = _analyse(tmp_path, _steps_trace({0, 1}).write(tmp_path / "s.json"))
    s = checks["steps_with_gpu_work"]
    assert s["status"] == "failed"
    assert s["numbers"]["steps"] == 32 and s["numbers"]["steps_without_gpu_events"] == 30
    assert "30 of 32 steps have no GPU event in the trace" in s["warning"]
    assert s["compared"].startswith("2 of 32 steps launched GPU events")


def test_one_event_holding_the_kernel_time_fails(tmp_path):
    _, checks, _ = _analyse(tmp_path, _steps_trace(set(range(32)), big=3).write(tmp_path / "s.json"))
    s = checks["steps_with_gpu_work"]
    assert s["status"] == "failed" and s["numbers"]["steps_without_gpu_events"] == 0
    assert s["numbers"]["largest_gpu_event"]["dur_us"] == 10000
    assert "one GPU event (gemm, 10.000 ms)" in s["warning"]


def test_steps_with_gpu_work_pass(tmp_path):
    _, checks, _ = _analyse(tmp_path, _steps_trace(set(range(32))).write(tmp_path / "s.json"))
    s = checks["steps_with_gpu_work"]
    assert s["status"] == "passed" and s["compared"].startswith("32 of 32 steps launched GPU events")


def _runtime(b, name, ts, dur):
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": b.cpu[0], "tid": b.cpu[1], "ts": ts,
                     "dur": dur, "args": {}})


def test_idle_gaps_explained(tmp_path):
    b = TraceBuilder()
    b.annotation(PREFILL, 0, 250)
    b.op_with_kernel("aten::mm", 0, "A", 20, 10)  # launch 1-4, kernel 20-30
    _runtime(b, "cudaDeviceSynchronize", 12, 20)  # 12-32: blocked while the queue drained at 30
    b.op("aten::cpu_work", 33, 60)
    b.op_with_kernel("aten::add", 95, "B", 110, 5)  # gap 30-110: sync drain
    b.annotation(DECODE, 250, 350)
    b.op_with_kernel("aten::mul", 250, "C", 260, 5)  # gap 115-260: the host did nothing recorded
    ext = b.op("aten::mul2", 261, 31)
    b.launch(262, "D", 292, 5, ext=ext, dur=28.0)  # gap 265-292: the host was in a 28 us launch call
    b.op("aten::python_work", 298, 82)
    b.op_with_kernel("aten::relu", 381, "E", 390, 5)  # gap 297-390: the host was busy on the CPU
    ext = b.op("aten::sub", 399, 5)
    b.launch(400, "F", 440, 5, ext=ext)  # queued at 403, started at 440: gap 395-440 is launch latency
    ext = b.op("aten::div", 429, 6)
    b.launch(430, "G", 480, 5, ext=ext)  # queued at 433 before F ended: gap 445-480 queued, not started
    b.op_with_kernel("aten::neg", 470, "H", 487, 3)  # gap 485-487: under the noise floor
    report, _, _ = _analyse(tmp_path, b.write(tmp_path / "i.json"))
    causes = report["gap_analysis"]["idle_causes"]["0"]
    rows = {r["after"]: r for r in csv.DictReader(open(causes["file"]))}
    assert {a: rows[a]["cause"] for a in rows} == {
        "B": "sync_drain", "C": "host_idle", "D": "host_launching", "E": "host_cpu", "F": "launch_latency",
        "G": "queued_not_started"}
    assert rows["B"]["drain"] == "sync_drain" and rows["B"]["sync_call"] == "cudaDeviceSynchronize"
    assert all(rows[a]["drain"] == "no_sync" for a in "CDEFG")
    assert float(rows["D"]["host_launching_us"]) == 25.0 and rows["D"]["host"] == "launching"
    assert float(rows["D"]["launch_call_us"]) == 28.0 and float(rows["D"]["launch_to_start_us"]) == 2.0
    assert float(rows["E"]["host_cpu_us"]) == 88.0 and float(rows["E"]["host_idle_us"]) == 2.0
    assert float(rows["F"]["launch_to_start_us"]) == 37.0 and rows["F"]["prequeued"] == "False"
    assert rows["G"]["prequeued"] == "True"
    assert {a: rows[a]["stage"] for a in rows} == {"B": "prefill", "C": "decode", "D": "decode", "E": "decode",
                                                  "F": "decode", "G": "decode"}
    assert causes["below_noise_floor"] == {"gaps": 1, "idle_us": 2.0}
    assert causes["by_stage"] == {"prefill": {"sync_drain": 80.0},
                                  "decode": {"host_idle": 145.0, "host_cpu": 93.0, "launch_latency": 45.0,
                                             "queued_not_started": 35.0, "host_launching": 27.0}}
    assert causes["by_drain"]["sync_drain"] == {"gaps": 1, "idle_us": 80.0, "pct": round(80 / 425 * 100, 2)}
    assert causes["idle_classified_us"] == 425.0
    line = next(x for x in report["summary_lines"] if x.startswith("rank 0: idle gaps"))
    assert line.startswith("rank 0: idle gaps >= 5 us: 6 gaps, 0.425 ms: host_idle 34% (0.145 ms)")


def test_call_names():
    assert all(map(is_sync_call, ["cudaDeviceSynchronize", "cudaStreamSynchronize", "hipStreamSynchronize",
                                  "cuCtxSynchronize", "cudaMemcpy", "hipMemcpy", "cuMemcpyDtoH_v2",
                                  "cudaEventSynchronize"]))
    assert not any(map(is_sync_call, ["cudaMemcpyAsync", "cudaLaunchKernel", "cudaStreamWaitEvent"]))
    assert all(map(is_launch_call, ["cudaLaunchKernel", "cuLaunchKernelEx", "hipModuleLaunchKernel",
                                    "cudaGraphLaunch", "hipGraphLaunch", "cudaMemcpyAsync", "hipMemsetAsync"]))
    assert not any(map(is_launch_call, ["cudaStreamIsCapturing", "cudaMalloc", "cudaDeviceSynchronize"]))


def test_profiled_benchmark_report_carries_the_checks(tmp_path):
    """The benchmark's own analysis of its traces (engine.bench.run) puts the checks in its report and the
    warning into summary.txt's text."""
    from engine.bench.run import _analyse_traces, summary_text
    from engine.config.benchmark import load_benchmark_config
    cfg, _ = load_benchmark_config(REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml")
    cfg.gap_analysis.enabled = True
    cfg.profiler.tracelens.enabled = False
    traces = tmp_path / "torch_trace"
    traces.mkdir()
    _graph_trace(second_recorded=False).write(traces / "host-rank-0.1.pt.trace.json")
    ws = Workspace.create(tmp_path / "out", "benchmark", "b")
    report = {"errors": [], "framework": "builtin", "model": "tiny", "state": "completed", "run_kind": "single",
              "profiling_enabled": True, "workspace_dir": str(ws.root)}
    _analyse_traces(cfg, ws, traces, report, lambda s: None)
    assert not report["errors"] and report["trace_checks"]["failed"] == 1
    assert report["gap_analysis"]["idle_causes"]["0"]["graph_unrecorded"]["idle_us"] == 180.0
    text = summary_text(report)
    assert "WARNING trace check graph_replays (rank 0): 1 of 3 graph replays have no GPU event" in text
    assert "trace check kernel_time (rank 0) passed" in text


def _path_row(report):
    rows = list(csv.DictReader(open(report["gap_analysis"]["critical_path"]["0"]["file"])))
    assert len(rows) == 1
    return {k: (float(v) if k.endswith("_us") else v) for k, v in rows[0].items()}


def test_critical_path_of_a_gpu_bound_step(tmp_path):
    """Three launches queue 167 us of kernels and the host waits in a stream sync: the path runs from the
    step's end back through the sync to the kernels, one after another, and to the first launch."""
    b = TraceBuilder()
    b.annotation(DECODE, 0, 200)
    b.op_with_kernel("aten::mm", 5, "K1", 12, 48)     # launch 6-9, kernel 12-60
    b.op_with_kernel("aten::mm", 15, "K2", 60, 50)    # launch 16-19, kernel 60-110 (waits for K1)
    b.op_with_kernel("aten::mm", 25, "K3", 111, 69)   # launch 26-29, kernel 111-180
    _runtime(b, "cudaStreamSynchronize", 35, 146)     # 35-181: waits for K3
    report, _, _ = _analyse(tmp_path, b.write(tmp_path / "p.json"))
    r = _path_row(report)
    assert r["bound"] == "gpu" and r["path_us"] == 200.0
    assert (r["gpu_us"], r["gpu_wait_us"], r["sync_wait_us"], r["launch_latency_us"]) == (167.0, 1.0, 1.0, 3.0)
    assert (r["host_other_us"], r["host_launch_us"], r["before_step_us"]) == (25.0, 3.0, 0.0)
    assert r["kernels_on_path"] == "3" and r["top_kernels"] == "K3; K2; K1"
    s = report["gap_analysis"]["critical_path"]["0"]
    assert s["gpu_bound"] == 1 and s["by_kind"] == {"decode": {"steps": 1, "gpu_bound": 1, "host_bound": 0}}
    assert any(x.startswith("rank 0: critical path of 1 steps: 1 GPU-bound, 0 host-bound") for x in report["summary_lines"])


def test_critical_path_of_a_host_bound_step(tmp_path):
    b = TraceBuilder()
    b.annotation(DECODE, 0, 200)
    b.op_with_kernel("aten::mm", 5, "K1", 12, 5)
    b.op("aten::python_glue", 20, 100)
    b.op_with_kernel("aten::mm", 130, "K2", 140, 5)
    report, _, _ = _analyse(tmp_path, b.write(tmp_path / "h.json"))
    r = _path_row(report)
    assert r["bound"] == "host" and r["gpu_us"] == 0.0
    assert r["host_other_us"] + r["host_launch_us"] == 200.0 and r["host_launch_us"] == 6.0


def test_a_cpu_only_run_is_not_flagged_but_lost_gpu_activity_is(tmp_path):
    b = TraceBuilder()
    for i in range(4):
        b.annotation(DECODE, i * 100.0, 90)
        b.op("aten::mm", i * 100.0 + 5, 50)
    report, checks, _ = _analyse(tmp_path, b.write(tmp_path / "cpu.json"))
    assert report["trace_checks"]["passed"] and {c["status"] for c in checks.values()} == {"skipped"}
    assert "a CPU-only run" in checks["kernel_time"]["compared"] and "critical_path" not in report["gap_analysis"]
    # the same steps with launch calls whose GPU events were all lost
    for i in range(4):
        _runtime(b, "cudaLaunchKernel", i * 100.0 + 10, 3)
    report, checks, _ = _analyse(tmp_path / "lost", b.write(tmp_path / "lost.json"))
    assert checks["kernel_time"]["status"] == "failed"
    assert "4 launch calls but not one GPU event" in checks["kernel_time"]["warning"]
    assert checks["steps_with_gpu_work"]["status"] == "failed"


def test_tracelens_report_reconciled_with_its_gpu_timeline(tmp_path, monkeypatch):
    """The TraceLens perf report against its own GPU timeline: a graph replay outside any op is a synthetic
    op of the report, so it passes; a report that lost an op's kernels fails, saying how much."""
    arch = str(GOLDEN / "arch" / "H200.json")
    b = TraceBuilder()
    b.op_with_kernel("aten::mm", 0, "gemm", 100, 10, dims=[[64, 128], [128, 256]])
    _graph_launch(b, 30, [("graph_k1", 120, 30), ("graph_k2", 150, 20)])  # no cpu_op above it
    path = b.write(tmp_path / "t.json")

    def check(where):
        ws = Workspace.create(tmp_path / where, "trace", "t")
        result = run_trace_analysis(path, TraceAnalysisOptions(gpu_arch=arch), ws)
        return {c["check"]: c for c in result.report["trace_checks"]["checks"]}["tracelens_report (pytorch)"]

    c = check("good")
    assert c["status"] == "passed" and c["numbers"]["perf_report_kernel_us"] == 60.0
    assert c["compared"] == ("perf report kernel time 60.0 us (3 op rows) >= the GPU timeline's computation + memcpy "
                             "60.0 us; kernel_summary calls per kernel name against the trace's linked kernels (3 vs 3)")
    import engine.trace.report as report_module
    real = report_module.pytorch_report

    def losing(*a, **k):  # a report that lost the graph replay's first kernel
        tables = real(*a, **k)
        unified, ks = tables["unified_perf_summary"], tables["kernel_summary"]
        unified.rows = [r for r in unified.rows if "graph_k1" not in str(r[0])]
        ks.rows = [r for r in ks.rows if r[2] != "graph_k1"]
        return tables

    monkeypatch.setattr(report_module, "pytorch_report", losing)
    c = check("lossy")
    assert c["status"] == "failed" and c["numbers"]["perf_report_kernel_us"] == 30.0
    assert "30.0 us of GPU work is in no op of the report" in c["warning"]
    assert "graph_k1: report 0, tree 1" in c["warning"]
    monkeypatch.setattr(report_module, "pytorch_report", real)
    for trace in REAL[:2]:  # the real traces pass (inference stages included)
        ws = Workspace.create(tmp_path / trace.name, "trace", "t")
        result = run_trace_analysis(trace, TraceAnalysisOptions(gpu_arch=arch), ws)
        tl_checks = [c for c in result.report["trace_checks"]["checks"] if c["check"].startswith("tracelens_report")]
        assert tl_checks and all(c["status"] == "passed" for c in tl_checks), tl_checks
        assert result.report["trace_checks"]["passed"]


def test_a_gemm_without_shapes_leaves_its_kernel_time_out_of_the_perf_report(tmp_path):
    """A GEMM recorded without input shapes: the perf report's op row has no kernel time, while the GPU
    timeline counts the kernel; the report check says so instead of letting the total look complete."""
    b = TraceBuilder()
    b.op_with_kernel("aten::mm", 0, "gemm", 100, 10)  # no Input Dims
    b.op_with_kernel("aten::add", 20, "add", 120, 5, dims=[[4, 16], [4, 16]])
    ws = Workspace.create(tmp_path / "out", "trace", "t")
    result = run_trace_analysis(b.write(tmp_path / "t.json"),
                                TraceAnalysisOptions(gpu_arch=str(GOLDEN / "arch" / "H200.json")), ws)
    c = {c["check"]: c for c in result.report["trace_checks"]["checks"]}["tracelens_report (pytorch)"]
    assert c["status"] == "failed"
    assert (c["numbers"]["perf_report_kernel_us"], c["numbers"]["timeline_computation_us"]) == (5.0, 15.0)
    assert "10.0 us of GPU work is in no op of the report" in c["warning"]
    assert c["numbers"]["op_rows_without_kernel_time"] == ["aten::mm"] and "left out: aten::mm" in c["warning"]


def test_profiler_steps_are_checked_without_inference_annotations(tmp_path):
    """A training trace's ProfilerStep#N ranges stand in for step annotations in the step check."""
    b = TraceBuilder()
    for i in range(8):
        b.annotation(f"ProfilerStep#{i}", i * 100.0, 90)
        if i == 7:
            b.op_with_kernel("aten::mm", i * 100.0 + 5, "gemm", i * 100.0 + 20, 5)
    report, checks, _ = _analyse(tmp_path, b.write(tmp_path / "p.json"))
    s = checks["steps_with_gpu_work"]
    assert s["status"] == "failed" and "7 of 8 steps have no GPU event" in s["warning"]
    assert report["gap_analysis"]["idle"]["0"]["steps"] == 0  # the step tables stay those of inference steps


def test_span_union_merges_as_one_interval_at_a_time_would():
    import random

    import numpy as np

    from engine.trace.idle_causes import _Columns, _overlaps, _Spans
    rng = random.Random(7)
    for _ in range(200):
        ivs = sorted((s, s + rng.choice([0.0, 0.5, 1, 3, 10])) for s in (rng.uniform(0, 50) for _ in range(rng.randint(0, 30))))
        one = _Spans()
        for s, e in ivs:
            one.add(s, e)
        fast = _Spans.union([s for s, _ in ivs], [e for _, e in ivs])
        assert (fast.starts, fast.ends) == (one.starts, one.ends)
        assert fast.cum == pytest.approx(one.cum)
        pairs = [tuple(sorted((rng.uniform(-5, 55), rng.uniform(-5, 55)))) for _ in range(8)]
        for a, b in pairs:
            assert fast.overlap(a, b) == pytest.approx(one.overlap(a, b))
        cols = _Columns(np.array([s for s, _ in ivs]), np.array([e for _, e in ivs]))  # the numpy columns
        assert (cols.starts.tolist(), cols.ends.tolist()) == (one.starts, one.ends)
        many = _overlaps(cols, np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
        assert many.tolist() == pytest.approx([one.overlap(a, b) for a, b in pairs])  # all at once, the same


def test_tracelens_timeline_idle_inside_unrecorded_graph_replays_is_flagged(tmp_path):
    """TraceLens issue 728: the report's GPU timeline shows idle where a graph replay ran unrecorded."""
    ws = Workspace.create(tmp_path / "out", "trace", "t")
    result = run_trace_analysis(_graph_trace(second_recorded=False).write(tmp_path / "g.json"),
                                TraceAnalysisOptions(gpu_arch=str(GOLDEN / "arch" / "H200.json")), ws)
    c = {c["check"]: c for c in result.report["trace_checks"]["checks"]}["tracelens_report (pytorch)"]
    assert c["status"] == "failed"
    assert c["numbers"]["timeline_idle_us"] == 182.0 and c["numbers"]["idle_inside_unrecorded_graph_replays_us"] == 180.0
    assert "its GPU timeline's idle 182.0 us holds 180.0 us inside them" in c["warning"]


def test_idle_causes_csv_is_written_as_the_csv_module_writes_it():
    import io

    from engine.trace.idle_causes import CSV_COLUMNS, _write_columns
    rows = [(0, 1000000.125, 1000010.5, 10.375, 'void k<4, "x">(int)', "plain", "host_cpu", "no_sync", "", "cpu",
             1.0, 0.0, 9.375, 0.0, "", 2.5, False, "decode", "decode[bs=2 ctx=[1,2]]"),
            ("GPU 1", 1e-05, 2.0, 1.99999, "a\nb", "k,2", "sync_drain", "sync_drain", "cudaDeviceSynchronize",
             "idle", 0.0, 0.0, 0.0, 1.99999, 3.0, "", True, "none", "")]
    assert len(rows[0]) == len(CSV_COLUMNS)
    ours, theirs = io.StringIO(), io.StringIO()
    _write_columns(ours, [list(c) for c in zip(*rows)])
    csv.writer(theirs).writerows(rows)
    assert ours.getvalue() == theirs.getvalue()
