"""Bound and % of roofline in the loop's bottleneck table: the registry ops' own work counts, the
trace analysis's perf models for other ops, and the GPU's ceilings named by the trace."""

import json

import pytest

from engine.hw.specs import get_arch_spec
from engine.loop.bottlenecks import analyze_trace
from engine.loop.roofline import Work, registry_work, row_roofline
from engine.serve.engine import step_annotation

H200 = get_arch_spec("NVIDIA H200")
BW = H200.memory_bw_tbs * 1e12  # bytes/s, the datasheet figure the table uses


def test_registry_work_counts_what_each_op_must_move_and_compute():
    bf16 = lambda *shape: {"shape": list(shape), "dtype": "bfloat16"}  # noqa: E731
    w = registry_work("rmsnorm", [bf16(16, 2048), bf16(2048), {"scalar": 1e-5}])
    assert (w.flops, w.bytes, w.spec) == (4 * 16 * 2048, 2 * (2 * 16 * 2048 + 2048), "vector_bf16")
    w = registry_work("activation", [bf16(16, 16384)])
    assert w.bytes == 3 * 2 * 16 * 8192
    # Decode attention reads each sequence's first lengths[b] keys and values of every kv head.
    lengths = {"shape": [3], "dtype": "int32", "values": [10, 20, 30]}
    w = registry_work("decode_attention", [bf16(3, 32, 64), bf16(5, 128, 8, 64), bf16(5, 128, 8, 64),
                                           {"shape": [3], "dtype": "int64", "values": [0, 1, 2]}, lengths, {"scalar": 0.125}])
    assert w.bytes == 2 * (2 * 60 * 8 * 64 + 2 * 3 * 32 * 64) and w.flops == 4 * 60 * 32 * 64 and w.spec == "matrix_bf16"
    # Varlen causal: a whole 4-token prompt has 10 (query, key) pairs; 2 new tokens after 3 cached, 4 + 5 = 9.
    cu_q = {"shape": [3], "dtype": "int32", "values": [0, 4, 6]}
    cu_k = {"shape": [3], "dtype": "int32", "values": [0, 4, 9]}
    w = registry_work("attention", [bf16(6, 32, 64), bf16(9, 8, 64), bf16(9, 8, 64), cu_q, cu_k, {"scalar": 0.125}])
    assert w.flops == 4 * 19 * 32 * 64
    # Without the lengths' values (a batch over the recorded limit) there is nothing to count.
    assert registry_work("decode_attention", [bf16(3, 32, 64), bf16(5, 128, 8, 64), bf16(5, 128, 8, 64),
                                              {"shape": [3], "dtype": "int64"}, {"shape": [3], "dtype": "int32"}]) is None


def test_row_roofline_takes_the_larger_of_compute_and_memory_time():
    arch = {"name": "x", "mem_bw_gbps": 1.0, "max_achievable_tflops": {"vector_bf16": 1.0}}
    memory = Work(flops=1e6, nbytes=1e6, spec="vector_bf16")  # 1 us of compute, 1 ms of memory
    out = row_roofline([(memory, 10, 20_000.0)], arch)  # 10 calls in 20 ms: 10 ms is the least
    assert out["bound"] == "memory" and out["roofline_pct"] == 50.0
    assert row_roofline([(memory, 10, 20_000.0)], None)["roofline_pct"] is None


def _gpu_trace(path):
    """Two decode steps (the first is left out of the window), each with an rmsnorm registry call
    (its magpie_args span, one 2 us kernel) and an aten::linear (one 20 us GEMM kernel)."""
    events, corr = [], 0
    name = step_annotation([], [(1, 100)] * 16)
    for step in range(2):
        t0 = 1000.0 * step
        events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": t0, "dur": 900.0, "pid": 1, "tid": 1})
        events.append({"ph": "X", "cat": "user_annotation", "name": "magpie_kernel::rmsnorm", "ts": t0 + 10, "dur": 50.0,
                       "pid": 1, "tid": 1})
        events.append({"ph": "X", "cat": "user_annotation", "name": "magpie_args::bfloat16[16,2048];bfloat16[2048];s=1e-05",
                       "ts": t0 + 11, "dur": 0.0, "pid": 1, "tid": 1})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": t0 + 100, "dur": 60.0, "pid": 1, "tid": 1,
                       "args": {"Input Dims": [[16, 2048], [8192, 2048]], "Input type": ["c10::BFloat16", "c10::BFloat16"],
                                "Input Strides": [[2048, 1], [2048, 1]]}})
        for launch_ts, kernel, dur in ((t0 + 20, "rmsnorm_kernel", 2.0), (t0 + 110, "nvjet_gemm", 20.0)):
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch_ts, "dur": 5.0,
                           "pid": 1, "tid": 1, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": kernel, "ts": launch_ts + 50, "dur": dur, "pid": 0, "tid": 7,
                           "args": {"correlation": corr}})
    path.write_text(json.dumps({"deviceProperties": [{"name": "NVIDIA H200"}], "traceEvents": events}))
    return path


def test_the_bottleneck_table_of_a_gpu_trace_has_bound_and_roofline_per_row(tmp_path):
    table = analyze_trace(_gpu_trace(tmp_path / "t.json"))
    assert table["gpu_arch"] == H200.key and table["window"]["steps"] == 1
    rows = {r["name"]: r for r in table["stages"]["decode_only"]["rows"]}
    norm, gemm = rows["rmsnorm"], rows["nvjet_gemm"]
    assert norm["calls"] == 1 and norm["bound"] == "memory"
    assert norm["roofline_pct"] == pytest.approx(100 * 2 * (2 * 16 * 2048 + 2048) / BW / 2e-6, abs=0.1)
    # 16 x 2048 @ 2048 x 8192 in bf16: 33.6 MB of weights dominate; memory-bound at this batch.
    assert gemm["bound"] == "memory" and gemm["registry_op"] is None
    least = 2 * (16 * 2048 + 8192 * 2048 + 16 * 8192) / BW
    assert gemm["roofline_pct"] == pytest.approx(100 * least / 20e-6, rel=0.02)


def test_a_cpu_trace_says_why_it_has_no_roofline(tmp_path):
    data = json.loads(_gpu_trace(tmp_path / "t.json").read_text())
    data["traceEvents"] = [e for e in data["traceEvents"] if e["cat"] not in ("kernel", "cuda_runtime")]
    (tmp_path / "cpu.json").write_text(json.dumps(data))
    table = analyze_trace(tmp_path / "cpu.json")
    row = table["stages"]["all"]["rows"][0]
    assert table["device"] == "cpu" and row["bound"] is None and "CPU trace" in row["roofline_note"]
