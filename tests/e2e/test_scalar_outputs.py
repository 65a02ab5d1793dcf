"""Tests whose output is one number (loss functions), through the CLI
(examples/kernels/loss_functions): the degenerate-test check must try a constant across the
input sets, so a loss that moves with the inputs gets a real verdict, and one that is the same
for every input set is still called degenerate."""

import pytest

from conftest import EXAMPLES, read_report, run_magpie

pytestmark = pytest.mark.slow  # no timed verdict is asserted (any speed verdict passes): not serial

FOLDER = EXAMPLES / "loss_functions"


def _run(tmp_path, name: str):
    proc = run_magpie("compare", "-k", FOLDER / name, "-o", tmp_path, "--seed", "1", "--repeats", "20")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = read_report(tmp_path)
    return proc, report, report["results"]["kernel_results"]


def test_mse_loss_is_a_real_test_and_gets_a_verdict(tmp_path):
    proc, report, (base, cand) = _run(tmp_path, "mse.compare.yaml")
    detail = f"{proc.stdout[-2000:]}\n{report.get('degenerate_test')}"
    assert report["degenerate_test"] is None, detail
    assert base["correctness_state"] == "SUCCESS" and cand["correctness_state"] == "SUCCESS", detail
    assert base["correctness_result"]["harness"]["seeds"][0]["shape"] == "main", detail
    assert cand["verdict"] in ("faster", "slower", "tie"), detail
    assert report["winner_id"] in ("torch_mse", "manual_mse"), detail
    assert "degenerate" not in report["winner_reason"], detail


def test_a_scalar_that_is_the_same_for_every_input_is_still_degenerate(tmp_path):
    proc, report, (base, const) = _run(tmp_path, "prob_sum.compare.yaml")
    said = report["degenerate_test"]
    # the 3 sets of get_inputs() and the first one redrawn from 2 other distributions
    assert said and "degenerate test" in said and "constant" in said and "all 5 input sets" in said, said
    assert const["correctness_state"] == "SUCCESS"  # the constant passes: the numbers cannot fail it
    assert report["winner_id"] is None
    assert "degenerate test" in report["winner_reason"]
