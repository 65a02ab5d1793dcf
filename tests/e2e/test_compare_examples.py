"""compare through the CLI on the shipped PyTorch and Triton (interpreter) examples."""

import json

import pytest

from conftest import EXAMPLES, only_workspace, read_events, read_report, run_magpie

# Not with the timed verdicts alone: one_pass is about 9x three_pass, far beyond what a busy machine
# can hide, and the rmsnorm candidate's verdict is checked against its own interval, not fixed.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def softmax_compare(tmp_path_factory):
    out = tmp_path_factory.mktemp("softmax")
    proc = run_magpie("compare", "-k", EXAMPLES / "softmax_triton" / "compare.yaml", "-o", out, "--repeats", "8")
    return proc, out


def test_wrong_candidate_is_rejected_and_correct_one_ranked(softmax_compare):
    proc, out = softmax_compare
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = read_report(out)
    res = report["results"]
    ids = [k["kernel_id"] for k in res["kernel_results"]]
    assert ids == ["three_pass", "one_pass", "unmasked"]
    assert res["comparison_metrics"]["correctness"] == [True, True, False]
    assert res["comparison_metrics"]["all_correct"] is False
    unmasked = res["kernel_results"][2]
    assert unmasked["correctness_state"] == "FAILED"
    assert unmasked["performance_state"] == "SKIPPED"
    assert "NaN/Inf where the reference is finite" in unmasked["errors"][0]
    assert unmasked["speedup"] is None and unmasked["verdict"] == "incorrect"
    # The incorrect kernel is never ranked, however fast.
    assert [r[0] for r in res["rankings"]] == [1, 0]
    one = res["kernel_results"][1]
    lo, hi = one["speedup_ci"]
    assert lo <= one["speedup"] <= hi
    assert one["verdict"] == "faster" and lo > 1.0
    assert res["winner"] == 1 and report["winner_id"] == "one_pass"
    assert report["baseline"] == {"index": 0, "id": "three_pass", "chosen_by": "baseline: true"}
    assert res["comparison_metrics"]["perf_scores"][2] is None
    t = one["timing"]
    assert t["n"] == 8 and set(t) >= {"median", "mean", "min", "std", "iqr", "cv"}
    assert one["performance_result"]["backend"] == "harness-cpu-perf_counter"
    # The harness ran Triton in its interpreter and compared against the baseline's saved outputs.
    harness = one["correctness_result"]["harness"]
    assert harness["device"]["triton_interpret"] is True
    # three input sets of its own, and the first one redrawn from two other distributions
    assert harness["reference"] == "baseline outputs" and len(harness["seeds"]) == 5
    assert [d["distribution"] for d in harness["input_distributions"]["used"]] == ["problem", "uniform", "pareto"]


def test_workspace_contract(softmax_compare):
    _, out = softmax_compare
    ws = only_workspace(out)
    assert ws.name.startswith("compare_three_pass_")
    for name in ("config.yaml", "events.jsonl", "summary.txt", "compare_report.json"):
        assert (ws / name).is_file(), name
    assert (ws / "logs" / "one_pass" / "harness.stderr.log").is_file()
    events = read_events(ws)
    assert events[0]["event"] == "run_started" and events[-1]["event"] == "run_finished"
    assert events[-1]["state"] == "completed" and events[-1]["exit_code"] == 0
    stages = {(e["kernel"], e["stage"], e["state"]) for e in events if e["event"] == "stage"}
    assert ("unmasked", "harness", "FAILED") in stages and ("one_pass", "performance", "SUCCESS") in stages
    summary = (ws / "summary.txt").read_text()
    assert "one_pass" in summary and "faster" in summary and "Winner: one_pass" in summary
    report = json.loads((ws / "compare_report.json").read_text())
    env = report["environment"]
    assert env["torch"] and env["triton"] and any(v.startswith("sha256:") for v in env["source_hashes"].values())


def test_baseline_flag_is_used(tmp_path):
    proc = run_magpie("compare", "-k", EXAMPLES / "softmax_triton" / "compare.yaml", "-o", tmp_path,
                      "--baseline", "one_pass", "--repeats", "5")
    assert proc.returncode == 0, proc.stderr
    report = read_report(tmp_path)
    assert report["baseline"] == {"index": 1, "id": "one_pass", "chosen_by": "--baseline"}
    three = report["results"]["kernel_results"][0]
    assert three["verdict"] == "slower" and three["speedup"] < 1.0
    assert report["results"]["winner"] == 1  # nothing beats the new baseline
    assert {"field": "baseline", "yaml": "three_pass", "cli": "one_pass", "flag": "--baseline"} in report["overrides"]
    assert "override: baseline" in proc.stderr


def test_pytorch_rmsnorm_fused_candidate(tmp_path):
    proc = run_magpie("compare", "-k", EXAMPLES / "rmsnorm_pytorch" / "compare.yaml", "-o", tmp_path,
                      "--repeats", "15")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = read_report(tmp_path)
    res = report["results"]
    assert res["comparison_metrics"]["correctness"] == [True, True]
    fused = res["kernel_results"][1]
    assert fused["correctness_result"]["harness"]["weights_from_reference"] is True
    assert fused["verdict"] in ("faster", "slower", "tie")
    lo, hi = fused["speedup_ci"]
    assert lo <= fused["speedup"] <= hi
    m = report["tie_margin"]
    assert m == 0.10  # the CPU timer's default margin
    assert (fused["verdict"] == "tie") == (lo <= 1.0 + m and hi >= 1.0 / (1.0 + m))
