"""The compare report screen's rows for a cancelled run and for rejected kernels."""

from magpie_tui.screens.reports import VERDICT_CLASS, compare_rows


def _kernel(kid, state, verdict, errors=()):
    return {"kernel_id": kid, "correctness_state": state, "verdict": verdict, "errors": list(errors)}


def test_cancelled_compare_keeps_the_states_reached():
    report = {"baseline": {"id": "base"}, "winner_id": None,
              "winner_reason": "the run was cancelled before every kernel was measured; no winner is declared",
              "results": {"rankings": [], "kernel_results": [
                  _kernel("base", "SUCCESS", "baseline"), _kernel("second", "SUCCESS", "not measured"),
                  _kernel("third", "CANCELLED", "cancelled")]}}
    rows = {r["kernel"]: r for r in compare_rows(report)}
    assert rows["base"]["correct"] == "yes" and rows["base"]["verdict"] == "baseline"
    assert rows["second"]["correct"] == "yes"
    assert rows["third"]["correct"] == "cancelled" and rows["third"]["verdict"] == "cancelled"
    assert VERDICT_CLASS["cancelled"] == "muted"


def test_rejected_kernel_is_shown_with_its_reason():
    report = {"baseline": {"id": "base"}, "results": {"rankings": [[0, 1.0]], "kernel_results": [
        _kernel("base", "SUCCESS", "baseline"),
        _kernel("patch", "FAILED", "rejected", ["tampering: the kernel's code replaced time.perf_counter"])]}}
    rows = {r["kernel"]: r for r in compare_rows(report)}
    assert rows["patch"]["verdict"] == "rejected" and "replaced time.perf_counter" in rows["patch"]["why"]
    assert VERDICT_CLASS["rejected"] == "incorrect"
