"""The optimize loop's verdict evidence (engine.loop.engagement): the profiled traces before and
after integration diffed, and the proof that the winner ran in the one after, on CPU traces
recorded here with the real torch profiler, the way the built-in server records its registry
calls (inside ``record_function("magpie_kernel::<op>")``, Python stacks on)."""

from pathlib import Path

import pytest

from engine.loop.engagement import trace_evidence, winner_function
from engine.loop.results import VerdictCheck, VerdictResult
from engine.loop.verdict import verdict_lines

torch = pytest.importorskip("torch")

WINNER = "rmsnorm_torch_fused"
WINNER_PATH = "engine.library.rmsnorm:rmsnorm_torch_fused"
CALLS = 3


def _record(path: Path, fn, annotate: bool = True, with_stack: bool = True) -> Path:
    from torch.profiler import ProfilerActivity, profile, record_function
    x, w = torch.randn(4, 256), torch.ones(256)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=with_stack) as prof:
        for _ in range(CALLS):
            if annotate:
                with record_function("magpie_kernel::rmsnorm"):
                    fn(x, w, 1e-5)
            else:
                fn(x, w, 1e-5)
            torch.relu(x)  # the rest of the model
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    from engine.library.rmsnorm import rmsnorm_torch_fused
    from engine.serve.kernels import rmsnorm
    d = tmp_path_factory.mktemp("engagement")
    return {
        "before": _record(d / "before.pt.trace.json", rmsnorm),
        "after": _record(d / "after.pt.trace.json", rmsnorm_torch_fused),
        "not_integrated": _record(d / "same.pt.trace.json", rmsnorm),
        "not_called": _record(d / "none.pt.trace.json", lambda x, w, eps: x, annotate=False),
        "before_nostack": _record(d / "before_ns.pt.trace.json", rmsnorm, with_stack=False),
        "after_nostack": _record(d / "after_ns.pt.trace.json", rmsnorm_torch_fused, with_stack=False),
        "same_nostack": _record(d / "same_ns.pt.trace.json", rmsnorm, with_stack=False),
    }


def _evidence(tmp_path, before, after):
    return trace_evidence(tmp_path, before, after, "rmsnorm", WINNER, WINNER_PATH, tmp_path / "verdict" / "trace_diff")


def test_winner_function_names_the_file_its_frames_carry():
    assert winner_function(WINNER_PATH) == ("engine/library/rmsnorm.py", WINNER)
    assert winner_function("engine.library.rmsnorm.rmsnorm_torch_fused") == ("engine/library/rmsnorm.py", WINNER)
    assert winner_function("/tmp/cands/my_norm.py:rmsnorm") == ("my_norm.py", "rmsnorm")


def test_the_winner_engaged_shows_its_own_kernels_and_frames(traces, tmp_path):
    diff, eng = _evidence(tmp_path, traces["before"], traces["after"])
    assert eng.ok, eng.detail
    assert eng.calls_after == eng.calls_before == CALLS
    assert eng.winner_frames_after >= CALLS and eng.winner_frames_before == 0
    after = {k.name: k.calls for k in eng.kernels_after}
    before = {k.name: k.calls for k in eng.kernels_before}
    assert after and before and after != before
    # F.rms_norm is one call into C++: its own ops sit below aten::rms_norm, never in the baseline.
    assert any(name.startswith("aten::rms_norm") for name in after) and not any("rms_norm" in n for n in before)
    assert all(c % CALLS == 0 for c in after.values())
    assert "rmsnorm_torch_fused (engine/library/rmsnorm.py) in" in eng.detail
    # The diff of the two traces: CPU time, its movers with the kernels under the op's call site.
    assert diff.error is None and diff.basis == "cpu" and diff.kernels_only_after > 0 and diff.kernels_only_before > 0
    assert (tmp_path / diff.report).is_file() and (tmp_path / "verdict" / "trace_diff" / "kernel_summary.csv").is_file()
    assert any("magpie_kernel::rmsnorm" in m.stack for m in diff.top_kernels)
    moved = [abs(m.delta_us) for m in diff.top_kernels]
    assert moved == sorted(moved, reverse=True)
    # What the verdict writes into loop.json reads back the same.
    v = VerdictResult(success=False, message="m", checks=[VerdictCheck(name="winner engaged", ok=eng.ok,
                                                                       detail=eng.detail)],
                      trace_diff=diff, engagement=eng)
    back = VerdictResult.model_validate(v.written())
    assert back.engagement.ok and back.trace_diff.top_kernels[0].name == diff.top_kernels[0].name
    text = "\n".join(verdict_lines(back))
    assert "[ok] winner engaged" in text and "trace diff, profiled before -> after (CPU time" in text


def test_the_baseline_still_running_is_a_failed_check(traces, tmp_path):
    _, eng = _evidence(tmp_path, traces["before"], traces["not_integrated"])
    assert eng.ok is False and eng.calls_after == CALLS and eng.winner_frames_after == 0
    assert "is in none of the after-trace's Python frames" in eng.detail and "another implementation" in eng.detail


def test_an_op_that_never_ran_is_a_failed_check(traces, tmp_path):
    _, eng = _evidence(tmp_path, traces["before"], traces["not_called"])
    assert eng.ok is False and eng.calls_after == 0 and not eng.kernels_after
    assert "no magpie_kernel::rmsnorm call in the after-trace" in eng.detail


def test_without_python_frames_the_kernels_under_the_call_decide(traces, tmp_path):
    _, eng = _evidence(tmp_path, traces["before_nostack"], traces["after_nostack"])
    assert eng.ok and eng.winner_frames_after is None and eng.kernels_after != eng.kernels_before
    _, same = _evidence(tmp_path, traces["before_nostack"], traces["same_nostack"])
    assert same.ok is False and "the same CPU ops" in same.detail


def test_a_missing_trace_fails_the_check(traces, tmp_path):
    diff, eng = _evidence(tmp_path, traces["before"], None)
    assert eng.ok is False and "left no trace" in eng.detail and diff.error
    diff, eng = _evidence(tmp_path, traces["before"], tmp_path / "gone.json")
    assert eng.ok is False and "could not be compared" in eng.detail and "gone.json" in eng.detail


def _gpu_trace(path: Path, triton: bool) -> Path:
    """A GPU-shaped trace (Kineto's layout: launch -> kernel by correlation and an ac2g flow) of four
    registry calls inside ``magpie_kernel::rmsnorm``: the reference's aten ops and their kernels, or
    the winner's one Triton launch (a runtime call under the span, no cpu_op); an aten::linear
    outside the span in both."""
    from trace_builder import TraceBuilder
    tb = TraceBuilder()
    t, g = 1000.0, 5000.0
    for _ in range(4):
        tb.annotation("magpie_kernel::rmsnorm", t, 40.0)
        if triton:
            tb.launch(t + 2.0, "_rmsnorm_kernel", g, 3.0, runtime="cuLaunchKernel")
        else:
            tb.op_with_kernel("aten::pow", t + 2.0, "pow_kernel", g, 2.0)
            tb.op_with_kernel("aten::mul", t + 15.0, "mul_kernel", g + 5.0, 2.0)
        tb.op_with_kernel("aten::linear", t + 50.0, "gemm_kernel", g + 10.0, 8.0)
        t, g = t + 100.0, g + 100.0
    return tb.write(path)


def test_on_a_gpu_trace_the_kernels_under_the_call_decide(tmp_path):
    before = _gpu_trace(tmp_path / "before.json", triton=False)
    after = _gpu_trace(tmp_path / "after.json", triton=True)
    diff, eng = trace_evidence(tmp_path, before, after, "rmsnorm", "rmsnorm_triton",
                               "engine.library.rmsnorm:rmsnorm_triton", tmp_path / "out")
    assert eng.ok, eng.detail
    assert eng.calls_after == eng.calls_before == 4 and eng.winner_frames_after is None
    assert [(k.name, k.calls) for k in eng.kernels_after] == [("cuLaunchKernel > _rmsnorm_kernel", 4)]
    assert {k.name for k in eng.kernels_before} == {"aten::pow > pow_kernel", "aten::mul > mul_kernel"}
    assert "GPU kernels" in eng.detail and diff.basis == "gpu"
    assert {m.name for m in diff.top_kernels if m.status == "only_b"} == {"_rmsnorm_kernel"}
    gemm = next(m for m in diff.top_kernels if m.name == "gemm_kernel")
    assert gemm.status == "both" and gemm.delta_us == 0 and gemm.stack == ["aten::linear"]
    _, same = trace_evidence(tmp_path, before, _gpu_trace(tmp_path / "same.json", triton=False), "rmsnorm",
                             "rmsnorm_triton", "engine.library.rmsnorm:rmsnorm_triton", tmp_path / "out2")
    assert same.ok is False and "the same GPU kernels" in same.detail
