"""The bottleneck table's steady-state window: ramp-up and drain left out, recorded with why, and
the old rule (every step but the first) when the trace is too short for one."""

from pathlib import Path

import pytest
from trace_builder import TraceBuilder

from engine.loop.bottlenecks import analyze_trace
from engine.loop.window import FALLBACK_RULE, STEADY_RULE, choose_window, describe
from engine.serve.engine import step_annotation

VLLM_TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "vllm-cpu-trace" / "rank0.vllm-cpu.pt.trace.json.gz"


def _trace(path: Path, batches: list[int], prefill_at: tuple[int, ...] = ()) -> Path:
    """One step annotation per entry (its decode batch; steps in ``prefill_at`` also prefill one
    16-token prompt), each 1000 us long and holding one 100 us ``aten::mm_step<i>`` op."""
    tb = TraceBuilder()
    for i, batch in enumerate(batches):
        t0 = 1000.0 * i
        context = [(16, 16)] if i in prefill_at or batch == 0 else []
        tb.annotation(step_annotation(context, [(1, 40)] * batch), t0, 900.0)
        tb.op(f"aten::mm_step{i}", t0 + 100, 100.0, dims=[[batch or 1, 8], [8, 8]])
    return tb.write(path)


def _ops(table: dict) -> set[int]:
    return {int(r["name"].removeprefix("aten::mm_step")) for r in table["stages"]["all"]["rows"]}


def test_ramp_up_and_drain_are_left_out_and_the_window_is_recorded(tmp_path):
    # Ramp-up 1..3, a steady batch of 8 with a two-step dip (requests finishing, the next ones'
    # prefills), then drain.
    batches = [1, 2, 3, 5, 8, 8, 7, 8, 8, 4, 5, 8, 8, 9, 8, 8, 8, 8, 5, 3, 1]
    table = analyze_trace(_trace(tmp_path / "t.json", batches, prefill_at=(9, 10)))
    w = table["window"]
    assert w["steady"] and w["rule"] == STEADY_RULE and w["fallback_reason"] is None
    assert w["decode_batch_median"] == 8 and w["band"] == [6.0, 10.0]
    assert w["step_range"] == [4, 17] and w["steps"] == 14 and w["steps_in_trace"] == 21
    assert (w["steps_before"], w["steps_after"]) == (4, 3)
    assert w["time_range_us"] == [4000.0, 17900.0] and w["duration_us"] == 13900.0
    assert w["decode_batch_range"] == [4, 9]
    assert _ops(table) == set(range(4, 18))  # only the window's ops are in the table
    assert table["stages"]["prefilldecode"]["steps"] == 2  # the dip's prefills stay in
    text = describe(w)
    assert text.startswith("steps 4-17 of 21 (0.004-0.018 s into the trace): steady decode batch 8 (band 6-10)")
    assert "4 step(s) before and 3 after left out" in text


def test_the_longest_steady_run_wins_over_a_shorter_one_after_a_long_lull():
    batches = [1, 4, 4, 4, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4, 1]
    first, last, info = choose_window(batches)
    assert info["steady"] and info["max_dip_steps"] == 8
    assert (first, last) == (16, 22)  # the lull of ten batch-1 steps splits the two runs


def test_a_short_or_decode_free_trace_falls_back_to_every_step_but_the_first(tmp_path):
    table = analyze_trace(_trace(tmp_path / "short.json", [1, 2, 2, 2, 1]))
    w = table["window"]
    assert not w["steady"] and w["rule"] == FALLBACK_RULE
    assert w["fallback_reason"] == "the trace has 5 step(s): too few to pick a steady state (at least 8)"
    assert w["step_range"] == [1, 4] and _ops(table) == {1, 2, 3, 4}
    assert describe(w).endswith(f"{FALLBACK_RULE}, because {w['fallback_reason']}")
    first, last, info = choose_window([0] * 10)
    assert (first, last, info["steady"]) == (1, 9, False) and "prefill only" in info["fallback_reason"]
    # A batch that never settles (it doubles, three times over): no run of 4 steps within the
    # band, however generous the dips allowed inside one.
    first, last, info = choose_window([1, 2, 4, 8, 16, 32, 64, 128] * 3)
    assert not info["steady"] and info["fallback_reason"].startswith("no steady run") and (first, last) == (1, 23)


@pytest.mark.slow  # 2-5 s: a 2.9 MB gzipped trace of 160k events
@pytest.mark.skipif(not VLLM_TRACE.is_file(), reason="needs ../shared/data/vllm-cpu-trace")
def test_the_window_of_a_real_vllm_trace_leaves_its_ramp_up_and_drain_out():
    """vLLM 0.32 (CPU) at concurrency 4, 40 requests: its native step annotations."""
    table = analyze_trace(VLLM_TRACE)
    w = table["window"]
    assert w["steady"] and w["decode_batch_median"] == 4 and w["steps_in_trace"] == 342
    assert w["steps_before"] >= 3 and w["steps_after"] >= 1 and w["steps"] > 300
    # No Python stacks in this trace (they were removed to keep it small): rows say so.
    assert table["python_stacks"]["recorded"] is False
    rows = table["stages"]["all"]["rows"]
    assert all(r["mapping"]["lines"] == [] and "mapped by name only" in r["mapping"]["stack"] for r in rows
               if r["mapping"]["confidence"] != "high")
    attention = next(r for r in rows if r["name"] == "vllm::unified_attention_with_output")
    assert attention["mapping"]["confidence"] == "low" and attention["mapping"]["method"] == "kernel name"


def test_prompts_sent_in_one_burst_keep_their_prefill_steps(tmp_path):
    # A closed loop that sends every prompt at once prefills them all in the ramp-up: the steady
    # decode window alone would leave the prefill stage (and its attention op) empty.
    # Steps 0-1 prefill only, step 2 prefills the last prompts beside the first decodes.
    batches = [0, 0, 3, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 1]
    table = analyze_trace(_trace(tmp_path / "t.json", batches, prefill_at=(2,)))
    w = table["window"]
    assert w["steady"] and w["step_range"] == [4, 13] and w["prompt_steps_outside"] == 2
    assert table["stages"]["prefill_only"]["steps"] == 1  # step 1; step 0 (cold) stays out
    assert table["stages"]["prefilldecode"]["steps"] == 1  # step 2
    assert _ops(table) == {1, 2} | set(range(4, 14))  # step 3 (ramp-up decode only) stays out
    assert w["time_range_us"] == [4000.0, 13900.0]  # the steady run's span
    assert "2 step(s) with prompts among them kept" in describe(w)
