"""Event tree, gap analysis and GPU idle analysis on small traces built in the test."""

import pytest

from engine.trace.discover import discover_traces, rank_of
from engine.trace.gaps import aggregate_kernels, gap_rows, idle_analysis, merge_ranks, step_launch_analysis, trace_window
from engine.trace.load import load_trace
from engine.trace.tree import build_tree
from trace_builder import TraceBuilder


def _two_stream_trace(tmp_path):
    b = TraceBuilder()
    # kernel A twice (10 us and 30 us), kernel B once, a comm kernel on stream 20.
    b.op_with_kernel("aten::mm", 0, "gemm_A", 100, 10, dims=[[4, 8], [8, 16]])
    b.op_with_kernel("aten::mm", 20, "gemm_A", 120, 30, dims=[[4, 8], [8, 16]])
    b.op_with_kernel("aten::add", 40, "add_B", 200, 5, dims=[[4, 16], [4, 16]])
    b.op_with_kernel("nccl:all_reduce", 50, "ncclDevKernel_AllReduce", 130, 40, stream=20)
    return b


def test_tree_links_and_bleed_rule(tmp_path):
    b = TraceBuilder()
    b.op("aten::linear", 0, 20)
    b.op("aten::addmm", 1, 10)           # child
    b.op("aten::bleeds_a_lot", 18, 10)    # starts 2 us before linear ends, ends after it: dropped
    b.op("aten::bleeds_little", 19.5, 5)  # overlaps linear by 0.5 us only: its sibling, kept
    b.launch(2, "gemm", 100, 10)           # under addmm
    b.launch(5, "orphan", 120, 5, flows=False)  # no flow pair: never linked
    t = build_tree(load_trace(b.write(tmp_path / "t.json")))
    by = {e.name: e for e in t.trace.events}  # views of the trace's rows: equal, not identical
    assert by["aten::addmm"].parent == by["aten::linear"]
    assert by["aten::bleeds_little"].parent is None and by["aten::bleeds_little"] in t.cpu_roots
    assert by["aten::bleeds_a_lot"] in t.dropped
    assert [g.name for g in by["aten::linear"].gpu_events] == ["gemm"]
    assert by["gemm"].linked and not by["orphan"].linked
    assert t.launcher_cpu_op(by["gemm"]) == by["aten::addmm"]


def test_graph_launch_links_every_gpu_event_with_its_key(tmp_path):
    b = TraceBuilder()
    b.op("vllm::model_step", 0, 50)
    c = b.launch(5, "k1", 100, 5, runtime="cudaGraphLaunch", flows=False)
    b.events.append({"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 106, "dur": 4,
                     "args": {"correlation": c}})
    t = build_tree(load_trace(b.write(tmp_path / "g.json")))
    root = t.cpu_roots[0]
    assert sorted(g.name for g in root.gpu_events) == ["k1", "k2"]


def test_gap_analysis_window_filters_and_spread(tmp_path):
    trace = load_trace(_two_stream_trace(tmp_path).write(tmp_path / "t.json"))
    w = trace_window(trace)
    aggs = aggregate_kernels(trace, w)
    rows = {r[0]: r for r in gap_rows(aggs, top_k=10)}
    name, calls, total, avg, pct, shapes, mn, mx, std, median = rows["gemm_A"]
    assert (calls, total, avg, mn, mx, median) == (2, 40.0, 20.0, 10.0, 30.0, 20.0)
    assert std == pytest.approx(14.142, abs=1e-3)
    assert pct == pytest.approx(40 / 85 * 100, abs=0.01) and shapes == "[4,8]x[8,16]"
    assert list(rows) == ["gemm_A", "ncclDevKernel_AllReduce", "add_B"]
    assert [r[0] for r in gap_rows(aggs, top_k=1)] == ["gemm_A"]
    # min duration and categories
    assert "add_B" not in aggregate_kernels(trace, w, min_duration_us=6)
    assert aggregate_kernels(trace, w, categories=("cuda_runtime",)).keys() == {"cudaLaunchKernel"}
    # The window keeps overlapping events whole: 80-100% of [0, 205] starts at 164.
    late = aggregate_kernels(trace, trace_window(trace, 80, 100))
    assert set(late) == {"add_B", "ncclDevKernel_AllReduce"}
    with pytest.raises(ValueError):
        trace_window(trace, 50, 20)


def test_ranks_merge(tmp_path):
    a = load_trace(_two_stream_trace(tmp_path).write(tmp_path / "a.json"))
    per = {0: aggregate_kernels(a, trace_window(a)), 1: aggregate_kernels(a, trace_window(a))}
    merged = merge_ranks(per)
    assert len(merged["gemm_A"].durations) == 4


def test_idle_gaps_and_host_bound_detection(tmp_path):
    b = TraceBuilder()
    b.op_with_kernel("aten::mm", 0, "k1", 100, 10)
    # launched at 101, before k1 ends at 110: GPU idle 110..130 is NOT the host's fault
    b.launch(101, "k2", 130, 10, ext=b.op("aten::add", 100, 3), dur=1.0)
    # launched at 200, after k2 ended at 140: the GPU waited on the host from 140 to 205
    b.op_with_kernel("aten::mul", 199, "k3", 205, 5)
    t = build_tree(load_trace(b.write(tmp_path / "t.json")))
    idle = idle_analysis(t, trace_window(t.trace))
    gaps = sorted(idle["gaps"], key=lambda g: g.start)
    assert [(g.start, g.end, g.host_bound) for g in gaps] == [(110, 130, False), (140, 205, True)]
    assert gaps[1].launch_delay_us == pytest.approx(60.0) and gaps[1].after == "k3"
    assert "aten::mul" not in gaps[0].cpu_ops
    assert idle["host_bound_idle_pct"] == pytest.approx(65 / 85 * 100)
    (s,) = idle["streams"]
    assert (s["busy_us"], s["idle_us"], s["gaps"], s["largest_gap_us"]) == (25, 85, 2, 65)
    steps = step_launch_analysis(t, [("step", 0, 300)], idle["gaps"])
    assert steps[0]["launches"] == 3 and steps[0]["gpu_busy_us"] == 25
    assert steps[0]["gpu_waited_on_host_us"] == 65 and steps[0]["launch_bound"] is False


def test_discovery_ranks_and_workspace(tmp_path):
    ws = tmp_path / "benchmark_x" / "torch_trace"
    for name in ("host-rank-1.123.pt.trace.json.gz", "host-rank-0.456.pt.trace.json.gz"):
        (ws / "rank_0").mkdir(parents=True, exist_ok=True)
        (ws / name).write_bytes(b"x")
    (ws / "trace_split").mkdir()
    (ws / "trace_split" / "step-rank-0.pt.trace.json.gz").write_bytes(b"x")
    found = discover_traces(tmp_path / "benchmark_x")
    assert [(r, p.name) for r, p in found] == [(0, "host-rank-0.456.pt.trace.json.gz"),
                                              (1, "host-rank-1.123.pt.trace.json.gz")]
    assert rank_of(tmp_path / "dp0_tp3" / "t.json", tmp_path) == 3
    assert rank_of(tmp_path / "rank_5" / "t.json", tmp_path) == 5
    with pytest.raises(FileNotFoundError):
        discover_traces(tmp_path / "nothing")
