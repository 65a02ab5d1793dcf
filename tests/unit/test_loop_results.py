"""The loop's step results are typed where they are written (engine.loop.results): every step builds
its result through its model, strictly (a wrong type or an unknown key is an error in the step that
wrote it), ``loop.json`` keeps the shape it had, and reading stays lenient for other versions' files."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import ValidationError

from engine.loop import run as loop_run
from engine.loop.results import (
    RESULT_MODELS,
    BottlenecksResult,
    CandidateRow,
    CandidatesResult,
    IntegrateResult,
    RebenchmarkResult,
    VerdictResult,
    step_result,
    written_result,
)
from engine.loop.schema import LOOP_FILE, load_loop_file

RECORDED = Path(__file__).resolve().parents[1] / "tui" / "data" / "issue33" / "loop_builtin-tiny_20261206_114807_a57b81"


def _loop(tmp_path: Path) -> loop_run.Loop:
    """The recorded loop (baseline .. candidates done, no winner) in a folder of its own, its clean
    config a small built-in one."""
    root = Path(shutil.copytree(RECORDED, tmp_path / "loop"))
    clean = tmp_path / "clean.yaml"
    clean.write_text(yaml.safe_dump({"benchmark": {"framework": "builtin", "server": {}}}))
    loop = load_loop_file(root)
    loop.config = str(clean)
    quiet = SimpleNamespace(events=SimpleNamespace(emit=lambda *a, **k: None))
    # The steps run here start no benchmark or compare: a loop given the modes' run_request gets one that refuses.
    runs = {"run_request": _no_runs} if "run_request" in inspect.signature(loop_run.Loop).parameters else {}
    return loop_run.Loop(root, loop, quiet, log=lambda line: None, **runs)


def _no_runs(*args, **kwargs):
    raise AssertionError("these steps start no run")


def test_recorded_results_build_strictly_and_are_written_back_byte_for_byte():
    loop = load_loop_file(RECORDED)
    written = [s for s in loop.steps if s.result]
    assert {s.name for s in written} == {"baseline", "profiled", "bottlenecks", "harness", "candidates", "verdict"}
    for step in written:
        model = RESULT_MODELS[step.name]
        built = model(**step.result)  # the strict path: raises on any key or type the model does not know
        assert json.dumps(built.written()) == json.dumps(step.result), step.name  # same keys, order, ints, floats
        assert json.dumps(written_result(step.name, step.result)) == json.dumps(step.result)


def test_a_misspelt_key_or_a_wrong_type_is_an_error_at_the_writer():
    with pytest.raises(ValidationError, match="unknown key.*'winer'"):
        CandidatesResult(op="rmsnorm", winer="a")
    with pytest.raises(ValidationError, match="rows.0.speedup"):
        CandidatesResult(rows=[{"id": "a", "speedup": "fast"}])
    with pytest.raises(ValidationError, match="unknown key.*'verdic'"):
        CandidatesResult(rows=[CandidateRow(id="a"), {"id": "b", "verdic": "faster"}])
    with pytest.raises(ValidationError, match="unknown key.*'share'"):
        BottlenecksResult(top_replaceable={"registry_op": "rmsnorm", "share": 3.0})
    with pytest.raises(ValidationError, match="not an object"):
        RebenchmarkResult(kernel_after="12%")
    with pytest.raises(ValidationError, match="changed"):
        IntegrateResult(changed={"field": "benchmark.server.kernels.rmsnorm"})
    with pytest.raises(ValidationError, match="not a bool"):
        VerdictResult(success="yes")
    with pytest.raises(ValidationError, match="finite"):
        VerdictResult(kernel={"speedup": float("nan")})
    with pytest.raises(ValidationError, match="unknown key.*'report'"):  # the profiled step writes no report
        RESULT_MODELS["profiled"](report="x")
    with pytest.raises(ValidationError, match="unknown key.*'typo'"):
        written_result("verdict", {"success": True, "typo": 1})
    with pytest.raises(TypeError, match="not a VerdictResult"):
        written_result("verdict", CandidatesResult(op="rmsnorm"))
    # Reading the same data (a loop.json of another version) never fails: bad values read as unset.
    read = CandidatesResult.model_validate({"op": "rmsnorm", "winer": "a", "rows": [{"id": 3, "verdict": "tie"}, 7]})
    assert read.op == "rmsnorm" and read.winner is None and [(r.id, r.verdict) for r in read.rows] == [(None, "tie"),
                                                                                                         (None, None)]
    assert RebenchmarkResult.model_validate({"kernel_after": "12%", "metrics": []}).kernel_after is None
    assert VerdictResult.model_validate({"success": "yes"}).decided is False


def test_a_step_whose_builder_misspells_a_key_fails_there(tmp_path, monkeypatch):
    runner = _loop(tmp_path)
    step = runner.loop.step("verdict")
    monkeypatch.setitem(loop_run.STEPS, "verdict", lambda loop, st: {"success": False, "mesage": "no gain"})
    assert runner._run_step(step) is False
    assert step.state == "failed" and "mesage" in step.error and not step.result
    assert load_loop_file(runner.root).step("verdict").state == "failed"  # recorded as the step's failure
    monkeypatch.setitem(loop_run.STEPS, "verdict", lambda loop, st: CandidatesResult(op="rmsnorm"))
    assert runner._run_step(step) is False and "not a VerdictResult" in step.error


def test_the_verdict_step_without_a_winner_writes_what_the_recorded_loop_has(tmp_path):
    runner = _loop(tmp_path)
    recorded = load_loop_file(RECORDED).step("verdict").result
    step = runner.loop.step("verdict")
    assert runner._run_step(step) is True and step.state == "done"
    assert json.dumps(step.result) == json.dumps(recorded)
    on_disk = json.loads((runner.root / LOOP_FILE).read_text())
    assert next(s for s in on_disk["steps"] if s["name"] == "verdict")["result"] == recorded
    assert json.loads((runner.root / "verdict" / "verdict.json").read_text()) == recorded


def _report(mean: float) -> dict:
    values = [mean - 1.0, mean, mean + 1.0]
    return {"repeats": {"output_throughput": {"mean": mean, "values": values, "ci95": [mean - 2.5, mean + 2.5]},
                        "failed": {"mean": 0.0, "values": [0.0, 0.0, 0.0], "ci95": [0.0, 0.0]}}}


def _through_integrate(tmp_path: Path, share: float) -> loop_run.Loop:
    """The recorded loop run on to a winner: the real harness step on a bottleneck table where the
    op takes ``share``% of the profiled time, a winner 1.5x [1.25, 1.75] faster, integrated; the
    first baseline at 100 tok/s (base_run)."""
    runner = _loop(tmp_path)
    root = runner.root
    table = {"device": "cpu", "stages": {"all": {"rows": [
        {"rank": 1, "name": "rmsnorm", "registry_op": "rmsnorm", "replaceable": True, "share_pct": share, "calls": 4,
         "mapping": {"confidence": "high", "method": "call-site annotation"},
         "call_args": [{"args": [{"shape": [2, 8], "dtype": "float32"}, {"shape": [8], "dtype": "float32"},
                                 {"scalar": 1e-05}], "share_of_op_pct": 100.0}]}]}}}
    (root / "bottlenecks").mkdir(exist_ok=True)
    (root / "bottlenecks" / "bottlenecks.json").write_text(json.dumps(table))
    harness = runner.loop.step("harness")
    assert runner._run_step(harness) is True, harness.error
    typed = step_result(harness)
    assert typed.op == "rmsnorm" and typed.row.rank == 1 and typed.row.calls == 4 and typed.device == "cpu"
    assert json.dumps(RESULT_MODELS["harness"](**harness.result).written()) == json.dumps(harness.result)
    assert list(harness.result) == ["op", "file", "implementation", "shapes", "scalars", "row", "device"]
    assert (root / typed.file).is_file()

    # A winner, integrated and re-benchmarked: 100 -> 120 tok/s, outside the noise.
    for name, mean, kernels in (("base_run", 100.0, {}), ("new_run", 120.0, {"rmsnorm": "pkg.mod:fast"})):
        _run_folder(root / name, _report(mean), kernels)
    runner.loop.step("baseline").run_dir = "base_run"
    runner.loop.step("baseline").result = {**runner.loop.step("baseline").result, "report": "base_run/benchmark_report.json"}
    cand = runner.loop.step("candidates")
    cand.result = written_result("candidates", {**cand.result, "op": "rmsnorm", "winner": "fast",
                                                "winner_path": "pkg.mod:fast", "speedup": 1.5, "ci95": [1.25, 1.75],
                                                "stopped": None})
    integrate = runner.loop.step("integrate")
    integrate.state, integrate.result = "done", written_result("integrate", IntegrateResult(
        config="integrate/integrated_config.yaml", framework="builtin", kernels={"rmsnorm": "pkg.mod:fast"},
        changed=[{"field": "benchmark.server.kernels.rmsnorm", "clean": None, "integrated": "pkg.mod:fast"}]))
    return runner


_TRACES: dict[str, Path] = {}
WINNER_MODULE = "import torch\n\n\ndef fast(x, w, eps):\n    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)\n"


def _record_traces(folder: Path) -> dict[str, Path]:
    """Two real torch-profiler traces on the CPU, as the built-in server records a registry call
    (inside ``magpie_kernel::rmsnorm``, Python stacks on): the server's own rmsnorm (before) and
    the winner ``pkg.mod:fast`` (after). Recorded once per test session."""
    if _TRACES:
        return _TRACES
    import importlib.util

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from engine.serve.kernels import rmsnorm
    (folder / "src" / "pkg").mkdir(parents=True)
    (folder / "src" / "pkg" / "__init__.py").write_text("")
    (folder / "src" / "pkg" / "mod.py").write_text(WINNER_MODULE)
    spec = importlib.util.spec_from_file_location("_loop_results_winner", folder / "src" / "pkg" / "mod.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fast = module.fast
    x, w = torch.randn(4, 8), torch.ones(8)
    for side, fn in (("before", rmsnorm), ("after", fast)):
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
            for _ in range(4):
                with record_function("magpie_kernel::rmsnorm"):
                    fn(x, w, 1e-5)
        prof.export_chrome_trace(str(folder / f"{side}.pt.trace.json"))
        _TRACES[side] = folder / f"{side}.pt.trace.json"
    return _TRACES


def _profiled_traces(runner: loop_run.Loop, tmp_path_factory_dir: Path, profiled_run: str,
                     after_side: str = "after") -> None:
    """The profiled step's trace (before) and the profiled run's after integration (``after_side``:
    the winner's trace, or "before": the server's own rmsnorm ran again), in the loop folder."""
    traces = _record_traces(tmp_path_factory_dir)
    root = runner.root
    before = root / "profiled_run" / "torch_trace" / "before.pt.trace.json"
    after = root / profiled_run / "torch_trace" / "after.pt.trace.json"
    for src, dst in ((traces["before"], before), (traces[after_side], after)):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    prof = runner.loop.step("profiled")
    prof.result = {**prof.result, "traces": [str(before.relative_to(root))]}


def _run_folder(folder: Path, report: dict, kernels: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"benchmark": {"server": {"kernels": kernels}}}))
    (folder / "benchmark_report.json").write_text(json.dumps(report))


@pytest.mark.parametrize("share", [60.0, 12.5])
def test_the_harness_and_verdict_steps_build_their_results_through_the_models(tmp_path, tmp_path_factory, share):
    """The real builders on small inputs: the harness from a bottleneck table, the verdict of a
    winner from two reports; each result is valid strictly and typed for the steps after it.
    The op at 60% of the profiled time, 1.5x [1.25, 1.75] faster, can give up to +34.6% (Amdahl):
    the measured +20% is a success. At 12.5% it can give at most +5.7%: +20% is not the kernel's."""
    runner = _through_integrate(tmp_path, share)
    root = runner.root
    _profiled_traces(runner, tmp_path_factory.getbasetemp() / "loop_traces", "rebenchmark_profiled/x")
    reb = runner.loop.step("rebenchmark")
    reb.state, reb.run_dir, reb.result = "done", "new_run", written_result("rebenchmark", RebenchmarkResult(
        report="new_run/benchmark_report.json", repeats=3, metrics={}, profiled_run="rebenchmark_profiled/x",
        kernel_after={"share_pct": 4.0, "avg_us": 2.5, "calls": 4, "time_us": 10.0},
        top_after={"name": "aten::linear", "registry_op": None, "share_pct": 60.0}))
    verdict = runner.loop.step("verdict")
    assert runner._run_step(verdict) is True, verdict.error
    v = step_result(verdict)
    bound = 100.0 * (1.0 / (1.0 - share / 100.0 * (1.0 - 1.0 / 1.75)) - 1.0)
    assert v.gain_bound_pct == pytest.approx(bound)
    if share == 12.5:
        assert v.success is False and v.regression is False and v.message.startswith("NOT ATTRIBUTABLE"), v.message
        assert [c.name for c in v.checks if not c.ok] == ["gain the kernel can explain"]
        plausible = next(c for c in v.checks if c.name == "gain the kernel can explain")
        assert f"allows at most {bound:+.2f}%" in plausible.detail and "+5.7%" in v.message
        return
    assert v.success is True and v.regression is False and v.top_changed is True, v.message
    assert [c.name for c in v.checks if not c.ok] == []
    assert v.kernel.op == "rmsnorm" and v.kernel.speedup == 1.5 and v.kernel_after.calls == 4
    assert {r.metric: r.verdict for r in v.end_to_end} == {"output_throughput": "better", "failed": None}
    assert list(verdict.result) == ["success", "regression", "message", "kernel", "end_to_end", "checks",
                                    "kernel_after", "top_bottleneck_after", "top_changed", "gain_bound_pct",
                                    "trace_diff", "engagement"]
    # The winner's own function ran under the op's call site in the profiled run after integration.
    assert v.engagement.ok and v.engagement.function == "pkg/mod.py: fast" and v.engagement.calls_after == 4
    assert v.engagement.winner_frames_after == 4 and v.engagement.winner_frames_before == 0
    assert v.trace_diff.basis == "cpu" and (root / v.trace_diff.report).is_file() and v.trace_diff.top_kernels
    assert json.dumps(VerdictResult(**verdict.result).written()) == json.dumps(verdict.result)
    assert "+20.0% output throughput" in v.message and "output_throughput" in loop_run.format_status(str(root))


def test_the_verdict_compares_interleaved_rounds_in_pairs_and_reports_the_drift(tmp_path, tmp_path_factory):
    """Three ABBA rounds on a machine slowing down (the baseline 100, 90, 80 tok/s; the winner 5
    more each round): the pairs say +5.9% outside the noise where two unpaired sets (Welch) could
    not; the first baseline (120 tok/s, before the machine slowed) is reported as drift."""
    runner = _through_integrate(tmp_path, 60.0)
    root = runner.root
    first = {"repeats": {"output_throughput": {"mean": 120.0, "values": [119.0, 120.0, 121.0], "ci95": [117.5, 122.5]},
                         "failed": {"mean": 0.0, "values": [0.0, 0.0, 0.0], "ci95": [0.0, 0.0]}}}
    (root / "base_run" / "benchmark_report.json").write_text(json.dumps(first))
    rounds = []
    for i, base in enumerate((100.0, 90.0, 80.0), 1):
        for side, tok_s, kernels in (("baseline", base, {}), ("winner", base + 5.0, {"rmsnorm": "pkg.mod:fast"})):
            _run_folder(root / f"r{i}_{side}", {"result": {"output_throughput": tok_s, "failed": 0}}, kernels)
        rounds.append({"index": i, "order": ["baseline", "winner"] if i != 2 else ["winner", "baseline"],
                       "baseline_run": f"r{i}_baseline", "baseline_report": f"r{i}_baseline/benchmark_report.json",
                       "winner_run": f"r{i}_winner", "winner_report": f"r{i}_winner/benchmark_report.json"})
    _profiled_traces(runner, tmp_path_factory.getbasetemp() / "loop_traces", "rebenchmark_profiled/y")
    reb = runner.loop.step("rebenchmark")
    reb.state, reb.run_dir, reb.result = "done", "r1_winner", written_result("rebenchmark", RebenchmarkResult(
        report="r1_winner/benchmark_report.json", repeats=3, metrics={}, rounds=rounds,
        profiled_run="rebenchmark_profiled/y"))
    verdict = runner.loop.step("verdict")
    assert runner._run_step(verdict) is True, verdict.error
    v = step_result(verdict)
    primary = next(r for r in v.end_to_end if r.metric == "output_throughput")
    assert (primary.baseline_mean, primary.new_mean, primary.delta) == (90.0, 95.0, 5.0)
    assert primary.delta_ci95 == [5.0, 5.0] and primary.verdict == "better"  # the same +5 in every pair
    from engine.bench.metrics import aggregate_repeats, compare_reports
    unpaired = compare_reports(aggregate_repeats([{"output_throughput": x} for x in (100.0, 90.0, 80.0)]),
                               aggregate_repeats([{"output_throughput": x} for x in (105.0, 95.0, 85.0)]))
    assert unpaired["output_throughput"]["noise"] == "inside"  # what comparing the sets alone would say
    assert v.success is True, v.message
    assert v.drift.baseline_mean == 120.0 and v.drift.new_mean == 90.0 and v.drift.noise == "outside"
    lines = loop_run.format_status(str(root))
    assert "baseline drift since the first baseline: output_throughput 120 -> 90" in \
        (root / "verdict" / "summary.txt").read_text(), lines


def test_a_winner_that_did_not_run_after_integration_is_never_a_success(tmp_path, tmp_path_factory):
    """The same winning numbers (+20% outside the noise, explainable by the kernel), but the profiled
    run after integration ran the server's own rmsnorm: the winner's engagement fails, and so does
    the verdict, saying why."""
    runner = _through_integrate(tmp_path, 60.0)
    _profiled_traces(runner, tmp_path_factory.getbasetemp() / "loop_traces", "rebenchmark_profiled/x", "before")
    reb = runner.loop.step("rebenchmark")
    reb.state, reb.run_dir, reb.result = "done", "new_run", written_result("rebenchmark", RebenchmarkResult(
        report="new_run/benchmark_report.json", repeats=3, metrics={}, profiled_run="rebenchmark_profiled/x"))
    verdict = runner.loop.step("verdict")
    assert runner._run_step(verdict) is True, verdict.error
    v = step_result(verdict)
    assert v.success is False and v.message.startswith("NOT ENGAGED: the winner's function fast (pkg/mod.py)")
    assert [c.name for c in v.checks if not c.ok] == ["winner engaged"]
    assert v.engagement.calls_after == 4 and v.engagement.winner_frames_after == 0
    assert "[NO] winner engaged" in (runner.root / "verdict" / "summary.txt").read_text()
