"""One decision for every compare path: the local (and container) report and the Ray report turn
the same outcomes into the same verdicts, speedups, ranking, winner and reason
(engine.kernels.report.compare_results). The Ray evaluator is built without a cluster: its
report only reads the time tasks' results."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.cluster.ray_eval import Placement, RayEvaluator
from engine.cluster.settings import RaySettings
from engine.kernels.pipeline import FAILED, SKIPPED, SUCCESS, KernelOutcome, StageResult
from engine.kernels.plan import KernelSpec, Plan, RunSettings
from engine.kernels.report import build_compare_report, render_text
from engine.kernels.stats import summarize


def _spec(i: int) -> KernelSpec:
    return KernelSpec(index=i, id=f"k{i}", type="hip", source_files=[], working_dir=Path("."), env={}, compile=[],
                      testcase=[], prof=[], baseline=i == 0)


def _timed(i: int, median: float, **kw) -> KernelOutcome:
    samples = list(median * (1 + 0.01 * np.sin(np.arange(40))))
    return KernelOutcome(spec=_spec(i), compile=StageResult(SUCCESS), correctness=StageResult(SUCCESS),
                         performance=StageResult(SUCCESS, details={"backend": "harness-cuda-events"}),
                         timing=summarize(samples), samples_ms=samples, **kw)


def _incorrect(i: int) -> KernelOutcome:
    return KernelOutcome(spec=_spec(i), compile=StageResult(SUCCESS), correctness=StageResult(FAILED, ["wrong"]),
                         performance=StageResult(SKIPPED))


def _not_judged(i: int) -> KernelOutcome:
    return replace(KernelOutcome(spec=_spec(i), compile=StageResult(SUCCESS)), environment=["no compiler"])


REJECT = [{"guard": "timing", "message": "rejected: writes its inputs"}]

CASES = {
    "a clear winner": [_timed(0, 1.0), _timed(1, 0.5), _timed(2, 1.0), _timed(3, 2.0)],
    "all ties: the baseline stands": [_timed(0, 1.0), _timed(1, 1.0), _timed(2, 1.005)],
    "a rejected faster candidate": [_timed(0, 1.0), _timed(1, 0.3, rejections=REJECT), _timed(2, 0.8)],
    "a rejected baseline": [_timed(0, 1.0, rejections=REJECT), _timed(1, 0.5)],
    "an incorrect baseline": [_incorrect(0), _timed(1, 0.5)],
    "incorrect and not judged candidates": [_timed(0, 1.0), _incorrect(1), _not_judged(2), _timed(3, 0.9)],
}


def _local(plan: Plan, outcomes: list, tmp_path: Path, state: str = "completed", degenerate=None) -> dict:
    return build_compare_report(plan, outcomes, state, str(tmp_path), None, degenerate=degenerate)[0]


def _ray(plan: Plan, outcomes: list, tmp_path: Path, state: str = "completed", degenerate=None,
         pairs: dict | None = None, models: dict | None = None, allow_mixed: bool = False) -> tuple[dict, list]:
    """The Ray report of a run whose time tasks timed each candidate beside ``pairs[i]`` (else the
    baseline outcome itself), on ``models[i]`` (else one model)."""
    ev = RayEvaluator.__new__(RayEvaluator)
    ev.settings = RaySettings(allow_mixed_gpus=allow_mixed)
    ev.placement = Placement("gpu", "test")
    ev.execution, ev.board, ev.not_run, ev.degenerate = {}, None, None, degenerate
    base = outcomes[plan.baseline_index]

    def task_result(o: KernelOutcome) -> dict:  # a time task's kernels are indexed 0 (baseline), 1 (candidate)
        pair = [(pairs or {}).get(o.spec.index, base), o]
        return {"outcomes": [replace(x, spec=replace(x.spec, index=j)) for j, x in enumerate(pair)],
                "node": {"node_ip": "10.0.0.1"}, "gpu": {"model": (models or {}).get(o.spec.index, "H100")}}

    ev.timed = {o.spec.index: task_result(o) for o in outcomes if o is not base and o.performance.state == SUCCESS}
    return ev.build_report(plan, outcomes, state, str(tmp_path), None, degenerate=degenerate)


def _decision(report: dict) -> dict:
    rows = report["results"]["kernel_results"]
    return {"verdicts": [r["verdict"] for r in rows], "speedups": [r["speedup"] for r in rows],
            "intervals": [r["speedup_ci"] for r in rows], "rankings": report["results"]["rankings"],
            "perf_scores": report["results"]["comparison_metrics"]["perf_scores"],
            "winner": report["results"]["winner"], "winner_id": report["winner_id"],
            "winner_reason": report["winner_reason"], "tie_margin": report["tie_margin"]}


def _plan(outcomes: list) -> Plan:
    return Plan(mode="compare", kernels=[o.spec for o in outcomes], settings=RunSettings(), baseline_index=0)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("state,degenerate", [("completed", None), ("cancelled", None),
                                              ("completed", "degenerate test: all zeros pass")])
def test_local_and_ray_decide_alike(case, state, degenerate, tmp_path):
    outcomes = CASES[case]
    plan = _plan(outcomes)
    local_report, local_rend = build_compare_report(plan, outcomes, state, str(tmp_path), None, degenerate=degenerate)
    local = _decision(local_report)
    ray_report, rend = _ray(plan, outcomes, tmp_path, state, degenerate)
    assert _decision(ray_report) == local
    assert rend[-1] == local_rend[-1] and rend[-1].startswith("Winner: ") and local["winner_reason"] in rend[-1]
    assert render_text(rend[:1]) == render_text(local_rend[:1])  # the table, its verdict column included


def test_the_decisions_themselves():
    """What the shared function decides for the cases above (the Ray path used to differ on the
    rejected baseline: it let the baseline stand)."""
    expect = {"a clear winner": ("k1", ["baseline", "faster", "tie", "slower"]),
              "all ties: the baseline stands": ("k0", ["baseline", "tie", "tie"]),
              "a rejected faster candidate": ("k2", ["baseline", "rejected", "faster"]),
              "a rejected baseline": (None, ["rejected", "not measured"]),
              "an incorrect baseline": (None, ["incorrect", "not measured"]),
              "incorrect and not judged candidates": ("k3", ["baseline", "incorrect", "not judged", "faster"])}
    for case, (winner, verdicts) in expect.items():
        report = _local(_plan(CASES[case]), CASES[case], Path("."))
        assert (report["winner_id"], _decision(report)["verdicts"]) == (winner, verdicts), case
    assert _local(_plan(CASES["a rejected baseline"]), CASES["a rejected baseline"], Path("."))["winner_reason"] \
        == "the baseline was rejected"


def test_ray_speedups_come_from_each_candidates_own_baseline(tmp_path):
    """A candidate timed beside a slower run of the baseline (another GPU) is faster against that
    run, though not against the first; a candidate whose own baseline run failed has no speedup
    and no speed verdict (it used to keep the local, cross-GPU one)."""
    outcomes = [_timed(0, 1.0), _timed(1, 0.99), _timed(2, 0.5)]
    plan = _plan(outcomes)
    slow_base, bad_base = _timed(0, 2.0), _incorrect(0)
    report, _ = _ray(plan, outcomes, tmp_path, pairs={1: slow_base, 2: bad_base})
    d = _decision(report)
    assert d["verdicts"] == ["baseline", "faster", "not measured"] and d["speedups"][2] is None
    assert d["winner_id"] == "k1" and d["rankings"] == [[0, 1.0], [1, pytest.approx(2.0 / 0.99, rel=0.02)]][::-1]
    assert [b["with"] for b in report["same_gpu"]["baseline_runs"]] == ["k1", "k2"]


def test_ray_candidates_on_several_gpu_models_are_not_ranked(tmp_path):
    outcomes = CASES["a clear winner"]
    plan = _plan(outcomes)
    report, _ = _ray(plan, outcomes, tmp_path, models={1: "H100", 2: "H200", 3: "H100"})
    assert report["winner_id"] is None and report["results"]["rankings"] == []
    assert report["winner_reason"].startswith("candidates were timed on different GPU models (H100, H200)")
    assert _decision(report)["verdicts"] == ["baseline", "faster", "tie", "slower"]
    allowed, _ = _ray(plan, outcomes, tmp_path, models={1: "H100", 2: "H200", 3: "H100"}, allow_mixed=True)
    assert _decision(allowed) == _decision(_local(plan, outcomes, tmp_path))
