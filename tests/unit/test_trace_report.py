"""The TraceLens-compatible perf report (engine.trace.report) against TraceLens's own CSVs.

The golden folders under tests/data/tracelens-golden/ were written by AMD TraceLens (commit
171dd747) for the traces next to them; their README says which command made each. Every CSV our
report writes must match: the same files, the same header, the same rows in the same order, text
cells equal, float cells within 1e-6 relative (np.float64 reprs inside kernel-detail cells are
parsed and compared element by element).
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from pathlib import Path

import pytest

from engine.hw.specs import get_arch_spec
from engine.trace.arch import arch_from_spec, load_arch_json, resolve_arch
from engine.trace.csvout import NpFloat, format_cell, write_csvs
from engine.trace.load import load_trace
from engine.trace.report import histogram, np_sum, pytorch_report
from engine.trace.tree import build_tree

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "tracelens-golden"
ARCH = GOLDEN / "arch" / "H200.json"
SPLIT = GOLDEN / "synthetic_vllm" / "trace_split"
# TraceLens_generate_perf_report_pytorch_inference --group_by_parent_module --enable_pseudo_ops
# --group_by_num_kernels (kernel summary and short-kernel study are off by default in that CLI).
INFERENCE = dict(inference=True, group_by_parent_module=True, group_by_num_kernels=True)

CASES = {
    "h200_real/pytorch": ("h200_real/h200_block_bf16.json.gz", {}),
    "synthetic_vllm/pytorch": ("synthetic_vllm/synthetic_vllm.json.gz", {}),
    "synthetic_vllm/tracelens/prefilldecode": (
        "synthetic_vllm/trace_split/synthetic_vllm_annotation_iteration_4_execute_514_context_1_"
        "sq512sk512sqsq262144sqsk262144_generation_2_sq2sk2048sqsq2sqsk2048.json.gz", INFERENCE),
    "synthetic_vllm/tracelens/decode_only": (
        "synthetic_vllm/trace_split/synthetic_vllm_annotation_iteration_6_execute_3_context_0_"
        "sq0sk0sqsq0sqsk0_generation_3_sq3sk3090sqsq3sqsk3090.json.gz", INFERENCE),
}

needs_golden = pytest.mark.skipif(not GOLDEN.is_dir(), reason="golden TraceLens data not present")


# ---------------------------------------------------------------------------- comparison helper

_NP = re.compile(r"np\.float64\(([^()]*)\)")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return True
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and _close(float(a), float(b))
    return a == b


def cells_match(expected: str, actual: str) -> bool:
    if expected == actual:
        return True
    fe, fa = _num(expected), _num(actual)
    if fe is not None and fa is not None:  # numbers: "600" and "600.0" are the same value
        return _close(fe, fa)
    if "np.float64" in expected or "np.float64" in actual:
        try:
            ve = ast.literal_eval(_NP.sub(r"\1", expected))
            va = ast.literal_eval(_NP.sub(r"\1", actual))
        except (ValueError, SyntaxError):
            return False
        return _same_value(ve, va)
    return False


def csv_differences(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Differences between two folders of CSVs, the first one first ([] when they match)."""
    exp = sorted(p.name for p in expected_dir.glob("*.csv"))
    act = sorted(p.name for p in actual_dir.glob("*.csv"))
    if exp != act:
        return [f"files differ: missing {sorted(set(exp) - set(act))}, extra {sorted(set(act) - set(exp))}"]
    out: list[str] = []
    for name in exp:
        e = list(csv.reader((expected_dir / name).open(encoding="utf-8", newline="")))
        a = list(csv.reader((actual_dir / name).open(encoding="utf-8", newline="")))
        if e[0] != a[0]:
            out.append(f"{name}: header differs\n  expected {e[0]}\n  actual   {a[0]}")
            continue
        if len(e) != len(a):
            out.append(f"{name}: {len(e) - 1} rows expected, {len(a) - 1} written")
            continue
        for i, (er, ar) in enumerate(zip(e[1:], a[1:])):
            for col, x, y in zip(e[0], er, ar):
                if not cells_match(x, y):
                    out.append(f"{name} row {i} column {col!r}: expected {x[:300]!r}, got {y[:300]!r}")
    return out


# ---------------------------------------------------------------------------- golden cases

@needs_golden
@pytest.mark.parametrize("case", list(CASES))
def test_matches_tracelens_golden_csvs(case: str, tmp_path: Path) -> None:
    trace_rel, kwargs = CASES[case]
    tree = build_tree(load_trace(GOLDEN / trace_rel))
    tables = pytorch_report(tree, load_arch_json(ARCH), **kwargs)
    write_csvs(tables, tmp_path)
    diffs = csv_differences(GOLDEN / case, tmp_path)
    assert not diffs, f"{len(diffs)} difference(s); first: {diffs[0]}"


@needs_golden
def test_golden_files_are_byte_identical(tmp_path: Path) -> None:
    """Beyond the 1e-6 tolerance: the CSV text itself, for every golden file."""
    for case, (trace_rel, kwargs) in CASES.items():
        out = tmp_path / case
        write_csvs(pytorch_report(build_tree(load_trace(GOLDEN / trace_rel)), load_arch_json(ARCH), **kwargs), out)
        for p in sorted((GOLDEN / case).glob("*.csv")):
            assert (out / p.name).read_bytes() == p.read_bytes(), f"{case}/{p.name} is not byte-identical"


def test_comparison_helper_reports_the_first_difference(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "e" / "t.csv").write_text("x,y,z\n1.0,abc,\"[{'d': np.float64(2.5)}]\"\n", encoding="utf-8")
    (tmp_path / "a" / "t.csv").write_text("x,y,z\n1.0000000001,abc,\"[{'d': np.float64(2.5000000001)}]\"\n",
                                          encoding="utf-8")
    assert csv_differences(tmp_path / "e", tmp_path / "a") == []
    (tmp_path / "a" / "t.csv").write_text("x,y,z\n1.1,abc,\"[{'d': np.float64(2.5)}]\"\n", encoding="utf-8")
    diffs = csv_differences(tmp_path / "e", tmp_path / "a")
    assert diffs and diffs[0].startswith("t.csv row 0 column 'x'")


# ---------------------------------------------------------------------------- small synthetic traces

def _meta() -> list[dict]:
    return [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 1, "tid": 1, "args": {"name": "main"}},
    ]


def _op(name: str, ts: float, dur: float, args: dict | None = None) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args or {}}


def _launch(corr: int, ts: float, gpu_ts: float, kernel: str, kdur: float, name: str = "cudaLaunchKernel",
            cat: str = "kernel") -> list[dict]:
    """A runtime launch, its ac2g flow pair and the GPU event it starts."""
    return [
        {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1.0,
         "args": {"correlation": corr}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": ts},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": gpu_ts, "bp": "e"},
        {"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": 7, "ts": gpu_ts, "dur": kdur,
         "args": {"correlation": corr, "stream": 7}},
    ]


def _report(tmp_path: Path, events: list[dict], arch: dict | None = None, device: str | None = None, **kw):
    doc: dict = {"traceEvents": _meta() + events}
    if device is not None:
        doc["deviceProperties"] = [{"id": 0, "name": device}]
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    trace = load_trace(p)
    return trace, pytorch_report(build_tree(trace), arch, **kw)


MM_ARGS = {"Input Dims": [[256, 512], [512, 1024]], "Input type": ["c10::BFloat16", "c10::BFloat16"],
           "Input Strides": [[512, 1], [1, 512]], "Concrete Inputs": ["", ""]}


def _mm_events() -> list[dict]:
    return [_op("aten::mm", 0, 10, MM_ARGS), *_launch(1, 1, 100, "nvjet_sm90_tst_128x64_64x4_1x2_h_bz_TNT", 5.0)]


def test_gemm_flops_bytes_and_roofline(tmp_path: Path) -> None:
    arch = load_arch_json(ARCH) if ARCH.is_file() else {"name": "x", "mem_bw_gbps": 4800,
                                                         "max_achievable_tflops": {"matrix_bf16": 989}}
    _, t = _report(tmp_path, _mm_events(), arch)
    gemm = t["GEMM"].records()[0]
    M, K, N = 256, 512, 1024
    flops, nbytes = 2 * M * N * K, (M * K + K * N + M * N) * 2
    assert gemm["param: M"] == "256" and gemm["param: N"] == "1024" and gemm["param: K"] == "512"
    assert gemm["param: transpose"] == "(True, False)"  # parsed from the nvjet name's "TNT"
    assert gemm["GFLOPS_first"] == flops / 1e9
    assert gemm["Data Moved (MB)_first"] == nbytes / 2 ** 20
    assert gemm["TFLOPS/s_mean"] == pytest.approx(flops / 1e12 / 5e-6)
    assert gemm["TB/s_mean"] == pytest.approx(nbytes / 1e12 / 5e-6)
    assert gemm["Compute Spec"] == "matrix_bf16"
    compute_us, memory_us = flops / 989e12 * 1e6, nbytes / 4800e9 * 1e6
    assert gemm["Roofline Time (µs)_first"] == pytest.approx(max(compute_us, memory_us))
    assert gemm["Roofline Bound_first"] == ("COMPUTE_BOUND" if compute_us >= memory_us else "MEMORY_BOUND")
    assert gemm["Pct Roofline_mean"] == pytest.approx(max(compute_us, memory_us) / 5.0 * 100)
    unified = t["unified_perf_summary"].records()[0]
    assert unified["name"] == "aten::mm" and unified["has_perf_model"] is True
    assert unified["perf_params"]["M"] == 256 and unified["Kernel Time (µs)_sum"] == 5.0


def test_no_arch_means_no_roofline_columns(tmp_path: Path) -> None:
    trace, t = _report(tmp_path, _mm_events(), None, device="Synthetic GPU")
    assert resolve_arch(None, trace) is None  # unknown device: no arch
    for sheet in ("GEMM", "unified_perf_summary"):
        cols = t[sheet].columns
        assert not [c for c in cols if "Roofline" in c], (sheet, cols)
    assert "Compute Spec" in t["GEMM"].columns and "GFLOPS" in t["unified_perf_summary"].columns


def test_bleed_rule_decides_which_op_owns_a_kernel(tmp_path: Path) -> None:
    # B starts 0.5 us before A ends: a small bleed, B becomes A's sibling and launches its kernel.
    small = [_op("custom::a", 0, 10), *_launch(1, 1, 100, "kernel_a", 2.0),
             _op("custom::b", 9.5, 3), *_launch(2, 10.5, 110, "kernel_b", 3.0)]
    _, t = _report(tmp_path, small)
    assert sorted(t["ops_summary"].column("name")) == ["custom::a", "custom::b"]
    # B starts 5 us before A ends and ends after it: dropped from the tree, so its launch (inside
    # A's time) hangs under A, and A owns both kernels.
    big = [_op("custom::a", 0, 10), *_launch(1, 1, 100, "kernel_a", 2.0),
           _op("custom::b", 5, 6), *_launch(2, 6, 110, "kernel_b", 3.0)]
    _, t = _report(tmp_path, big)
    ops = t["ops_summary"].records()
    assert [r["name"] for r in ops] == ["custom::a"] and ops[0]["total_direct_kernel_time_sum"] == 5.0
    assert set(t["kernel_summary"].column("Parent cpu_op")) == {"custom::a"}


def test_graph_launch_links_every_kernel_of_its_correlation(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 0, "dur": 5,
         "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "graph_kernel_1", "pid": 0, "tid": 7, "ts": 10, "dur": 4,
         "args": {"correlation": 9, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "graph_kernel_2", "pid": 0, "tid": 7, "ts": 12, "dur": 4,
         "args": {"correlation": 9, "stream": 7}},
        _op("custom::other", 20, 5), *_launch(3, 21, 30, "kernel_c", 1.0),
    ]
    _, t = _report(tmp_path, events)
    timeline = {r[0]: r[1] for r in t["gpu_timeline"].rows}
    assert timeline["busy_time"] == pytest.approx(0.007)  # union [10, 16) + [30, 31)
    ops = {r["name"]: r for r in t["ops_summary"].records()}
    assert ops["cudaGraphLaunch"]["total_direct_kernel_time_sum"] == 6.0 and ops["cudaGraphLaunch"]["Count"] == 1
    ks = {r["Kernel name"]: r for r in t["kernel_summary"].records()}
    assert ks["graph_kernel_1"]["Parent cpu_op"] == "cudaGraphLaunch"
    assert ks["graph_kernel_1"]["Parent op category"] == "graph"
    names = set(t["unified_perf_summary"].column("name"))
    assert "cudaGraphLaunch->graph_kernel_1 (Synthetic Op)" in names and "custom::other" in names


def test_inference_attention_uses_the_step_annotation(tmp_path: Path) -> None:
    attn = {"Input Dims": [[514, 8, 64], [514, 2, 64], [514, 2, 64], [514, 8, 64], []],
            "Input type": ["c10::BFloat16"] * 4 + [""], "Input Strides": [[512, 64, 1]] * 4 + [[]],
            "Concrete Inputs": ["", "", "", "", "'l0'"]}
    step = {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 100, "args": {},
            "name": "execute_514_context_1(sq512sk512sqsq262144sqsk262144)_generation_2(sq2sk2048sqsq2sqsk2048)"}
    _, t = _report(tmp_path, [step, _op("vllm::unified_attention_with_output", 10, 10, attn),
                              *_launch(1, 11, 200, "kernel_unified_attention_2d", 40.0)])
    row = t["InferenceAttention_fwd"].records()[0]
    assert row["GFLOPS_first"] == pytest.approx(0.27262976)  # §4.4 worked example
    assert row["Data Moved (MB)_first"] == pytest.approx(2.25390625)
    assert row["param: c_sqsk"] == "262144" and row["param: g_sk"] == "2048"


def test_arch_helpers(tmp_path: Path) -> None:
    spec = get_arch_spec("H200")
    assert spec is not None
    a = arch_from_spec(spec)
    maf = a["max_achievable_tflops"]
    assert a["mem_bw_gbps"] == pytest.approx(4800)
    assert maf["matrix_bf16"] == spec.peak_tflops["bf16"] and maf["matrix_fp32"] == spec.peak_tflops["fp32"]
    assert maf["vector_bf16"] == 2 * maf["vector_fp32"] and maf["matrix_fp64"] == spec.peak_tflops["fp64_tensor"]
    assert resolve_arch("h200")["name"] == "H200"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mem_bw_gbps": 1000, "max_achievable_tflops": {"matrix_bf16": -1}}))
    with pytest.raises(ValueError, match=r"bad\.json: field 'max_achievable_tflops\.matrix_bf16'"):
        load_arch_json(bad)
    bad.write_text(json.dumps({"max_achievable_tflops": {"matrix_bf16": 1}}))
    with pytest.raises(ValueError, match="field 'mem_bw_gbps': required"):
        resolve_arch(str(bad))
    with pytest.raises(ValueError, match="unknown GPU"):
        resolve_arch("no-such-gpu")
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [], "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}))
    assert resolve_arch(None, load_trace(p))["max_achievable_tflops"]["matrix_bf16"] == spec.peak_tflops["bf16"]


def test_csv_cells_format_like_pandas() -> None:
    assert format_cell(float("nan")) == "" and format_cell(None) == ""
    assert format_cell(0.1 + 0.2) == "0.30000000000000004" and format_cell(600.0) == "600.0"
    assert format_cell(True) == "True" and format_cell(7) == "7"
    assert format_cell((4096,)) == "(4096,)"
    assert format_cell([{"mean_duration_us": NpFloat(1.5)}]) == "[{'mean_duration_us': np.float64(1.5)}]"


def test_numpy_compatible_helpers() -> None:
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    for n in (1, 3, 7, 8, 9, 100, 129, 1000):
        v = list(rng.uniform(0, 1e3, n))
        assert np_sum(v) == float(np.sum(np.array(v)))
        counts, edges = histogram(v, 100)
        c, e = np.histogram(np.array(v), bins=100)
        assert counts == list(c) and edges == [float(x) for x in e]


def test_backward_ops_get_the_forward_model(tmp_path: Path) -> None:
    """A backward op linked to its forward op by Sequence number: SDPA_bwd sheet row for the forward
    op, and a unified row for the backward op with the forward model's backward FLOPs."""
    q = [2, 8, 1024, 64]
    fwd_args = {"Input Dims": [q, q, q, [], [], [], []], "Input type": ["c10::BFloat16"] * 3 + ["Scalar"] * 3 + [""],
                "Input Strides": [[524288, 65536, 64, 1]] * 3 + [[]] * 4,
                "Concrete Inputs": ["", "", "", "0.", "True", "False", ""], "Sequence number": 5}
    bwd_thread = [
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0",
         "pid": 1, "tid": 2, "ts": 100, "dur": 50, "args": {"Sequence number": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "ScaledDotProductFlashAttentionBackward0", "pid": 1, "tid": 2,
         "ts": 101, "dur": 40, "args": {"Sequence number": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_scaled_dot_product_flash_attention_backward", "pid": 1, "tid": 2,
         "ts": 102, "dur": 30, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 103, "dur": 1,
         "args": {"correlation": 2}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 2, "pid": 1, "tid": 2, "ts": 103},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 2, "pid": 0, "tid": 7, "ts": 300, "bp": "e"},
        {"ph": "X", "cat": "kernel", "name": "flash_bwd_kernel", "pid": 0, "tid": 7, "ts": 300, "dur": 80,
         "args": {"correlation": 2, "stream": 7}},
    ]
    events = [_op("aten::_scaled_dot_product_flash_attention", 0, 20, fwd_args),
              *_launch(1, 1, 200, "flash_fwd_kernel", 40.0), *bwd_thread]
    _, t = _report(tmp_path, events)
    fwd = t["SDPA_fwd"].records()[0]
    bwd = t["SDPA_bwd"].records()[0]
    assert fwd["name"] == bwd["name"] == "aten::_scaled_dot_product_flash_attention"
    assert fwd["GFLOPS_first"] == pytest.approx(2.147483648)  # §4.3 worked example
    assert bwd["Kernel Time (µs)_sum"] == 80.0 and bwd["GFLOPS_first"] > fwd["GFLOPS_first"]
    unified = {r["name"]: r for r in t["unified_perf_summary"].records()}
    assert unified["ScaledDotProductFlashAttentionBackward0"]["has_perf_model"] is True
    assert unified["ScaledDotProductFlashAttentionBackward0"]["GFLOPS"] == bwd["GFLOPS_first"]
    assert t["ops_summary_by_category"].records()[0]["op category"] in ("SDPA_bwd", "SDPA_fwd")


def test_convolution_model(tmp_path: Path) -> None:
    args = {"Input Dims": [[8, 64, 56, 56], [128, 64, 3, 3], [], [], [], [], [], [], []],
            "Input type": ["c10::BFloat16", "c10::BFloat16", "", "ScalarList", "ScalarList", "ScalarList",
                           "Scalar", "ScalarList", "Scalar"],
            "Input Strides": [[200704, 3136, 56, 1], [576, 9, 3, 1], [], [], [], [], [], [], []],
            "Concrete Inputs": ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]}
    _, t = _report(tmp_path, [_op("aten::convolution", 0, 10, args), *_launch(1, 1, 100, "conv_kernel", 10.0)])
    row = t["CONV_fwd"].records()[0]
    out = 8 * 128 * 56 * 56
    assert row["GFLOPS_first"] == 2 * 64 * 3 * 3 * out / 1e9
    assert row["Data Moved (MB)_first"] == (8 * 64 * 56 * 56 + 128 * 64 * 9 + out) * 2 / 2 ** 20
    assert row["param: bias"] == "False" and row["Compute Spec"] == "matrix_bf16"  # known without an arch
