"""The optimization loop's pieces: call-argument records, the harness it writes, the verdict rules."""

import json
import sys

import pytest
import torch

from engine.loop import bottlenecks
from engine.loop.harness import chosen_calls, load_harness, write_candidate, write_harness
from engine.loop.kernel_steps import gather_candidates, summarize_compare
from engine.loop.verdict import end_to_end
from engine.serve import kernels
from engine.serve.call_args import describe_args, parse_call_args


def test_the_loops_list_of_registry_ops_is_the_servers():
    assert bottlenecks.KERNEL_KEYS == kernels.KERNEL_KEYS


def test_call_arguments_survive_the_trip_through_a_trace_name():
    args = [torch.zeros(3, 4, dtype=torch.bfloat16), torch.tensor([0, 3, 7], dtype=torch.int32),
            torch.arange(300), 1e-5, 0.125, True, 3]
    text = describe_args(args)
    assert '"' not in text and "\\" not in text  # the profiler writes names into its JSON unescaped
    assert parse_call_args(text) == [
        {"shape": [3, 4], "dtype": "bfloat16"}, {"shape": [3], "dtype": "int32", "values": [0, 3, 7]},
        {"shape": [300], "dtype": "int64"},  # too long to record its values
        {"scalar": 1e-5}, {"scalar": 0.125}, {"scalar": True}, {"scalar": 3}]
    assert parse_call_args("float32[2,x]") is None and parse_call_args("s=abc") is None


def test_chosen_calls_keep_the_heavy_shapes_first():
    row = {"call_args": [{"args": [1], "share_of_op_pct": 70.0}, {"args": [2], "share_of_op_pct": 20.0},
                         {"args": [3], "share_of_op_pct": 4.0}, {"args": [4], "share_of_op_pct": 6.0}]}
    assert [c["args"] for c in chosen_calls(row)] == [[1], [2], [4]]
    assert chosen_calls({"call_args": [{"args": [9], "share_of_op_pct": 1.0}]})[0]["args"] == [9]


def test_written_harness_rebuilds_the_recorded_calls_and_calls_the_implementation(tmp_path):
    calls = [{"args": [{"shape": [8], "dtype": "int64"}, {"shape": [8, 4, 16], "dtype": "float32"},
                       {"shape": [8, 2, 16], "dtype": "float32"}, {"shape": [64, 16], "dtype": "float32"}],
              "share_of_op_pct": 80.0},
             {"args": [{"shape": [1], "dtype": "int64"}, {"shape": [1, 4, 16], "dtype": "float32"},
                       {"shape": [1, 2, 16], "dtype": "float32"}, {"shape": [64, 16], "dtype": "float32"}],
              "share_of_op_pct": 20.0}]
    result = write_harness(tmp_path / "harness", "rotary", "engine.serve.kernels:rotary", calls)
    assert result["shapes"][0]["args"] == "(int64[8], float32[8,4,16], float32[8,2,16], float32[64,16])"
    mod = load_harness(tmp_path / result["file"])
    inputs = mod.get_inputs()
    assert [tuple(t.shape) for t in inputs] == [(8,), (8, 4, 16), (8, 2, 16), (64, 16)]
    assert int(inputs[0].max()) < 64  # positions index the cos/sin cache
    assert torch.allclose(inputs[3][:, :8] ** 2 + inputs[3][:, 8:] ** 2, torch.ones(64, 8))  # a real cos|sin table
    assert [tuple(s[1].shape) for s in mod.get_correctness_inputs()] == [(1, 4, 16)]
    q, k = mod.Model()(*inputs)
    ref_q, ref_k = kernels.rotary(*inputs)
    assert torch.equal(q, ref_q) and torch.equal(k, ref_k)
    cand = write_candidate(tmp_path / "candidates", "same", "engine.serve.kernels:rotary", "the default again",
                           tmp_path / result["file"])
    sys.path.insert(0, str(cand.parent))
    try:
        import importlib
        model_new = importlib.import_module("same").ModelNew()
    finally:
        sys.path.remove(str(cand.parent))
        sys.modules.pop("same", None)
    assert all(torch.equal(a, b) for a, b in zip(model_new(*inputs), (ref_q, ref_k)))


def test_attention_harness_uses_the_recorded_sequence_layout(tmp_path):
    args = [{"shape": [3, 4, 8], "dtype": "float32"}, {"shape": [12, 2, 8], "dtype": "float32"},
            {"shape": [12, 2, 8], "dtype": "float32"}, {"shape": [3], "dtype": "int32", "values": [0, 1, 3]},
            {"shape": [3], "dtype": "int32", "values": [0, 5, 12]}, {"scalar": 0.35}]
    result = write_harness(tmp_path / "h", "attention", "engine.serve.kernels:varlen_attention",
                           [{"args": args, "share_of_op_pct": 100.0}])
    mod = load_harness(tmp_path / result["file"])
    inputs = mod.get_inputs()
    assert inputs[3].tolist() == [0, 1, 3] and inputs[4].tolist() == [0, 5, 12] and mod.SCALARS == [0.35]
    out = mod.Model()(*inputs)
    assert out.shape == (3, 4, 8) and torch.isfinite(out).all()


def test_user_candidates_need_a_function_named_after_the_op(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("def rmsnorm(x, w, eps):\n    return x\n")
    bad.write_text("def something(x):\n    return x\n")
    usable, left_out = gather_candidates("rmsnorm", "cpu", [str(tmp_path)], False, tmp_path / "c")
    assert [u["id"] for u in usable] == ["user_good"] and usable[0]["path"].endswith("user_good.py:rmsnorm")
    assert (tmp_path / "c" / "user" / "user_good.py").read_text() == good.read_text()  # measured from a copy
    assert left_out == [{"id": "user_bad", "path": str(bad), "origin": "user",
                         "reason": "defines no function rmsnorm() or kernel()"}]


def test_a_file_path_kernel_resolves_in_the_server_registry(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text("def rmsnorm(x, weight, eps):\n    return x * weight\n")
    k = kernels.resolve_kernels({"rmsnorm": f"{f}:rmsnorm"})
    assert k.sources["rmsnorm"] == f"{f}:rmsnorm"
    assert torch.equal(k.rmsnorm(torch.ones(2, 3), torch.full((3,), 2.0), 1e-5), torch.full((2, 3), 2.0))
    with pytest.raises(kernels.KernelError, match="kernels.rmsnorm: cannot import module"):
        kernels.resolve_kernels({"rmsnorm": f"{tmp_path / 'missing.py'}:rmsnorm"})


def _kernel(kid, verdict, correct=True, speedup=None, rejected=False, errors=()):
    return {"kernel_id": kid, "verdict": verdict, "correctness_state": "SUCCESS" if correct else "FAILED",
            "guards": {"rejected": rejected}, "errors": list(errors), "speedup": speedup,
            "speedup_ci": [speedup * 0.9, speedup * 1.1] if speedup else None, "timing": {"median": 1.0}}


def test_the_winner_must_be_faster_not_a_tie():
    usable = [{"id": "a", "path": "p.a:f", "origin": "library"}, {"id": "b", "path": "p.b:f", "origin": "user"}]
    tie = {"winner_id": "baseline", "winner_reason": "no correct candidate is faster",
           "results": {"kernel_results": [_kernel("baseline", "baseline", speedup=1.0), _kernel("a", "tie", speedup=1.01),
                                          _kernel("b", "faster", correct=False, errors=["outputs differ"])]}}
    r = summarize_compare(tie, "rmsnorm", usable, [], "candidates/compare_x")
    assert r.winner is None and "no correct candidate is faster" in r.stopped
    assert [(x.id, x.verdict) for x in r.rows] == [("baseline", "baseline"), ("a", "tie"), ("b", "incorrect")]
    win = {"winner_id": "a", "results": {"kernel_results": [_kernel("baseline", "baseline", speedup=1.0),
                                                            _kernel("a", "faster", speedup=1.5)]}}
    r = summarize_compare(win, "rmsnorm", usable, [], "candidates/compare_x")
    assert r.winner == "a" and r.winner_path == "p.a:f" and r.speedup == 1.5
    rejected = {"winner_id": "a", "results": {"kernel_results": [_kernel("a", "faster", speedup=3.0, rejected=True)]}}
    assert summarize_compare(rejected, "rmsnorm", usable, [], "c").winner is None


def test_end_to_end_deltas_say_what_lies_inside_the_noise():
    base = {"repeats": {"output_throughput": {"mean": 100.0, "values": [99.0, 100.0, 101.0], "ci95": [97.5, 102.5]},
                        "median_tpot_ms": {"mean": 10.0, "values": [10.0, 10.1, 9.9], "ci95": [9.75, 10.25]}}}
    new = {"repeats": {"output_throughput": {"mean": 120.0, "values": [119.0, 120.0, 121.0], "ci95": [117.5, 122.5]},
                       "median_tpot_ms": {"mean": 10.05, "values": [9.9, 10.2, 10.05], "ci95": [9.7, 10.4]}}}
    rows = {r.metric: r for r in end_to_end(base, new)}
    assert rows["output_throughput"].verdict == "better" and rows["output_throughput"].delta_pct == pytest.approx(20.0)
    assert rows["median_tpot_ms"].verdict == "within noise"
    worse = {"repeats": {"output_throughput": {"mean": 80.0, "values": [79.0, 80.0, 81.0]}}}
    assert {r.metric: r for r in end_to_end(base, worse)}["output_throughput"].verdict == "worse"
    json.dumps([r.written() for r in rows.values()])  # the verdict is written as JSON


def test_the_integrated_path_is_checked_without_importing_it(tmp_path):
    import subprocess
    code = ("import sys; from engine.loop.kernel_steps import check_kernel_path; "
            "check_kernel_path('rmsnorm', 'engine.library.rmsnorm:rmsnorm_triton'); print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # a Triton candidate's module is read, not imported
    f = tmp_path / "mine.py"
    f.write_text("from torch.nn.functional import rms_norm as rmsnorm\n")
    from engine.loop.kernel_steps import check_kernel_path
    check_kernel_path("rmsnorm", f"{f}:rmsnorm")
    from engine.loop.run import LoopError
    with pytest.raises(LoopError, match="defines no 'nope'"):
        check_kernel_path("rmsnorm", f"{f}:nope")
    with pytest.raises(LoopError, match="cannot find the module"):
        check_kernel_path("rmsnorm", "no_such_package.mod:f")
