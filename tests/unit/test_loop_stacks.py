"""The bottleneck table's source lines: from the Python stacks of a real trace of the built-in
server's profiler (CPU), from synthetic GPU traces, and what a trace without stacks says. The
exact call lines of the model's aten calls (magpie_site spans): test_loop_exact_sites.py."""

import gzip
import inspect
import json

import pytest
from trace_builder import TraceBuilder

from engine.loop.bottlenecks import analyze_trace
from engine.loop.stacks import short_file
from engine.serve.engine import step_annotation
from engine.serve.model import LlamaModel

MODEL_FILE = short_file(inspect.getsourcefile(LlamaModel))


def _method_line(name: str) -> int:
    return inspect.getsourcelines(getattr(LlamaModel, name))[1]


def test_a_server_trace_names_the_model_functions_that_called_each_row(server_trace):
    table = analyze_trace(server_trace)
    assert table["python_stacks"]["recorded"] and table["python_stacks"]["frames"] > 0
    rows = {r["name"]: r for r in table["stages"]["all"]["rows"]}
    # Not a registry op: the stack is what maps it, so its confidence is raised from none. (Its
    # line is the exact call line from the model's magpie_site span, test_loop_exact_sites.py.)
    linear = rows["aten::linear"]["mapping"]
    assert (linear["method"], linear["confidence"]) == ("call-line annotation + Python stack", "medium")
    assert linear["unlocated_pct"] == 0.0 and sum(ln["share_pct"] for ln in linear["lines"]) == pytest.approx(100, abs=0.1)
    assert all(ln["module"] == "Linear" for ln in linear["lines"])  # through the nn.Linear modules, from the stack
    # An op with no call-line span (the residual add): the model function, at its first line.
    add = rows["aten::add"]["mapping"]
    assert (add["method"], add["confidence"]) == ("Python stack", "medium")
    assert add["lines"] and all(ln["file"] == MODEL_FILE and ln["line"] == _method_line(ln["function"])
                                and ln["line_kind"] == "function start" for ln in add["lines"])
    residual = [ln for ln in add["lines"] if "x + " in inspect.getsource(getattr(LlamaModel, ln["function"]))]
    assert residual and residual[0]["function"] == "_finish_layer" and residual[0]["share_pct"] > 0
    # A registry op: the line is the model function that called it, not the annotating wrapper.
    norm = rows["rmsnorm"]["mapping"]
    assert norm["confidence"] == "high" and norm["method"] == "call-site annotation + Python stack"
    assert len(norm["lines"]) >= 2 and all(ln["file"] == MODEL_FILE and ln["line"] == _method_line(ln["function"])
                                           and ln["line_kind"] == "function start" and ln["module"] is None
                                           for ln in norm["lines"])
    assert sum(ln["share_pct"] for ln in norm["lines"]) == pytest.approx(100, abs=0.1)


def test_the_same_trace_without_stacks_maps_by_name_only_and_says_so(server_trace, tmp_path):
    with gzip.open(server_trace, "rt") as fh:
        data = json.load(fh)
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "python_function"]
    (tmp_path / "bare.json").write_text(json.dumps(data))
    with_stacks = {r["name"]: r for r in analyze_trace(server_trace)["stages"]["all"]["rows"]}
    table = analyze_trace(tmp_path / "bare.json")
    assert table["python_stacks"] == {"recorded": False, "frames": 0, "note": table["python_stacks"]["note"]}
    rows = {r["name"]: r for r in table["stages"]["all"]["rows"]}
    assert rows.keys() == with_stacks.keys()  # the same rows, the same times: only the mapping differs
    assert all(rows[k]["time_us"] == with_stacks[k]["time_us"] for k in rows)
    assert rows["aten::add"]["mapping"] == {
        "method": "none", "confidence": "none", "lines": [],
        "stack": "none in the trace (recorded without with_stack): mapped by name only"}
    # The model's magpie_site spans still name the GEMMs' call lines (without the module: no stack).
    linear = rows["aten::linear"]["mapping"]
    assert (linear["method"], linear["confidence"]) == ("call-line annotation", "medium")
    assert linear["lines"] == [{**ln, "module": None} for ln in with_stacks["aten::linear"]["mapping"]["lines"]]
    assert "magpie_site spans" in linear["stack"]
    assert rows["rmsnorm"]["mapping"]["confidence"] == "high" and rows["rmsnorm"]["mapping"]["lines"] == []
    assert "call-site annotation only" in rows["rmsnorm"]["mapping"]["stack"]


def _frame(tb: TraceBuilder, name: str, ts: float, dur: float, pid: int, parent=None) -> int:
    tb.events.append({"ph": "X", "cat": "python_function", "name": name, "pid": tb.cpu[0], "tid": tb.cpu[1],
                      "ts": ts, "dur": dur, "args": {"Python id": pid, "Python parent id": parent}})
    return pid


def test_a_gpu_kernel_found_by_name_is_raised_to_medium_by_the_model_line_of_its_launch(tmp_path):
    """vLLM-shaped: a CustomOp's rms_norm, launched from two model functions, 30 + 10 us of GPU
    time; and a sampler GEMM outside the model code, located at its caller."""
    tb = TraceBuilder()
    tb.annotation(step_annotation([], [(1, 40)] * 4), 0.0, 900.0)  # the first step: left out
    tb.annotation(step_annotation([], [(1, 41)] * 4), 1000.0, 900.0)
    model = "/venv/lib/python3.12/site-packages/vllm/model_executor/models/llama.py"
    layer = "/venv/lib/python3.12/site-packages/vllm/model_executor/layers/layernorm.py"
    _frame(tb, "vllm/v1/worker/gpu_model_runner.py(2000): execute_model", 1010.0, 800.0, 1)
    _frame(tb, f"{model}(310): forward", 1020.0, 300.0, 2, 1)
    _frame(tb, "nn.Module: RMSNorm_0", 1030.0, 100.0, 3, 2)
    _frame(tb, f"{layer}(120): forward_cuda", 1031.0, 90.0, 4, 3)
    _frame(tb, "torch/_ops.py(1200): __call__", 1032.0, 80.0, 5, 4)
    tb.op_with_kernel("_C::rms_norm", 1040.0, "rms_norm_kernel", 1100.0, 30.0)
    _frame(tb, f"{model}(250): forward", 1400.0, 200.0, 6, 1)
    _frame(tb, f"{layer}(120): forward_cuda", 1410.0, 90.0, 7, 6)
    tb.op_with_kernel("_C::rms_norm", 1420.0, "rms_norm_kernel", 1500.0, 10.0)
    _frame(tb, "vllm/v1/sample/sampler.py(80): forward", 1650.0, 100.0, 8, 1)
    tb.op_with_kernel("aten::mm", 1660.0, "nvjet_gemm", 1700.0, 5.0)
    table = analyze_trace(tb.write(tmp_path / "t.json"))
    rows = {r["name"]: r for r in table["stages"]["all"]["rows"]}
    norm = rows["rms_norm_kernel"]["mapping"]
    assert (norm["method"], norm["confidence"]) == ("kernel name + Python stack", "medium")
    assert [(ln["file"], ln["line"], ln["function"], ln["module"], ln["share_pct"]) for ln in norm["lines"]] == [
        ("vllm/model_executor/models/llama.py", 310, "forward", "RMSNorm", 75.0),
        ("vllm/model_executor/models/llama.py", 250, "forward", None, 25.0)]
    # No magpie_site spans in a vLLM trace: its lines are where the functions start, and say so.
    assert table["call_lines_annotated"] is False and {ln["line_kind"] for ln in norm["lines"]} == {"function start"}
    gemm = rows["nvjet_gemm"]["mapping"]
    # No frame of the model's code: the innermost caller that is not torch, said to be so.
    assert gemm["confidence"] == "none" and gemm["lines"][0]["model_code"] is False
    assert gemm["lines"][0]["function"] == "forward" and gemm["lines"][0]["file"] == "vllm/v1/sample/sampler.py"
    assert gemm["stack"] == "recorded, but no frame of the model's code calls this row"


def test_the_profiled_twin_asks_vllm_and_sglang_for_python_stacks(tmp_path):
    import yaml

    from engine.bench.launch import server_command
    from engine.config.benchmark import load_benchmark_config
    from engine.loop.run import profiled_twin

    def twin_command(framework: str, profiler: dict):
        raw = {"benchmark": {"framework": framework, "model": "m", "profiler": profiler}}
        path = tmp_path / f"{framework}.yaml"
        path.write_text(yaml.safe_dump(profiled_twin(raw)))
        cfg, _ = load_benchmark_config(path)
        return server_command(cfg, 8123, profile_dir=tmp_path / "traces")

    argv = twin_command("vllm", {}).argv
    assert json.loads(argv[argv.index("--profiler-config") + 1])["torch_profiler_with_stack"] is True
    assert twin_command("sglang", {}).env["SGLANG_PROFILE_WITH_STACK"] == "1"
    # An explicit choice in the clean YAML stands (the table then maps by name only, and says so).
    argv = twin_command("vllm", {"torch_profiler": {"with_stack": False}}).argv
    assert json.loads(argv[argv.index("--profiler-config") + 1])["torch_profiler_with_stack"] is False
