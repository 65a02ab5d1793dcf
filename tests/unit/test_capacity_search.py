"""The capacity search's reading of the levels (engine/bench/capacity.py): the isotonic fit, the
Wilson verdicts and the boundary's interval, the margin search against bisection on the same
simulated servers, the binding SLO and smooth vs cliff; and the SLO margins of a run
(engine/bench/metrics.py)."""

import math
import random

import pytest

from engine.bench.capacity import CapacitySearch, antitonic, capacity_table, wilson
from engine.bench.metrics import RequestOutput, compute_metrics, slo_margins


def _run(good, sent, margin=None, margins=None, failed=0):
    out = {"completed": sent - failed, "failed": failed, "duration": 1.0, "request_goodput": float(good),
           "request_throughput": float(sent), "output_throughput": 10.0 * sent}
    if margins is not None:
        out.update(slo_margin=margin, slo_margins=margins, goodput_slo_met={k: good for k in margins})
    return out


def _server(boundary, cliff=False, n=200, tpot=0.3):
    """A noiseless server: TTFT's margin grows in proportion to the level (a queue), or jumps 4x
    past ``boundary`` (a cliff); the share is all or nothing at margin 1."""
    def run(level):
        ttft = (0.5 if level <= boundary else 2.0) if cliff else level / boundary
        good = n if max(ttft, tpot) <= 1 else 0
        return _run(good, n, max(ttft, tpot), {"ttft": ttft, "tpot": tpot})
    return run


def _search(style, server, **kw):
    s = CapacitySearch(target=0.9, ceiling=1024, max_steps=30, search=style, **kw)
    while (level := s.next_level()) is not None:
        s.record(level, [server(level)])
    return s


def test_antitonic_pools_adjacent_violators_by_weight_and_wilson_bounds():
    assert antitonic([1.0, 0.8, 0.9, 0.2], [1, 1, 1, 1]) == pytest.approx([1.0, 0.85, 0.85, 0.2])
    assert antitonic([0.5, 0.9], [3, 1]) == pytest.approx([0.6, 0.6])
    lo, hi = wilson(90, 100)
    assert lo == pytest.approx(0.8256, abs=1e-3) and hi == pytest.approx(0.9448, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0) and wilson(10, 10)[1] == 1.0


def test_margin_search_needs_fewer_levels_than_bisection_on_a_queue_and_reports_the_boundary():
    server = _server(148.5)
    bisect, margin = _search("bisect", server), _search("margin", server)
    assert bisect.summary({})["knee"] == margin.summary({})["knee"] == 148
    # climbs by the margins' line, lands next to the boundary; then runs the bracket's two ends again
    assert len(margin.tried) < bisect.probes - 4 and margin.probes == len(margin.tried) + 2 < bisect.probes
    s = margin.summary({"ttft": 100.0, "tpot": 50.0})
    assert s["search"] == "margin" and s["knee_interval"] == [148, 149] and 148 <= s["boundary"] <= 149
    assert s["boundary_ci95"] == [148, 149] and s["binding_slo"] == "ttft" and s["boundary_shape"] == "smooth"
    assert s["binding_slo_margins"]["margins"]["tpot"] == pytest.approx(0.3)
    assert all(lv["verdict"] in ("pass", "fail") for lv in s["levels"])
    text = "\n".join(capacity_table(s))
    assert "margin search" in text and "95% interval [148, 149]" in text and "binding SLO: ttft" in text
    assert "boundary: smooth" in text
    # The bracket's ends run twice: the interval would hold the server's drift between runs (none here).
    assert {lv["level"]: lv["repeats"] for lv in s["levels"] if lv["repeats"] > 1} == {148: 2, 149: 2}
    assert s["replicated_levels"] == 2 and s["dispersion"] == 1.0 and s["margin_drift"] == 0.0
    assert "run-to-run drift of the SLO margin (0.0% a run, from 2 level(s) run more than once" in text
    # Bisection runs each level once: its interval is the requests' sampling only, and says so.
    b = bisect.summary({"ttft": 100.0})
    assert b["replicated_levels"] == 0 and "no level was run twice" in "\n".join(capacity_table(b))
    plot = text[text.index("goodput share by concurrency (log axis"):].splitlines()
    assert len(plot) == 10 and plot[1].startswith("100% *") and "|" in plot[4] and plot[-1].split() == ["1", "192"]


def test_a_cliff_is_named_and_costs_the_margin_search_little_more_than_bisection():
    server = _server(37, cliff=True)
    bisect, margin = _search("bisect", server), _search("margin", server)
    s = margin.summary({"ttft": 100.0})
    assert s["knee_interval"] == [37, 38] and s["boundary_shape"] == "cliff" and s["boundary_ci95"] == [37, 38]
    assert margin.probes <= bisect.probes + 2
    assert bisect.summary({})["boundary_shape"] == "cliff"  # bisection's levels read the same way


def test_undecided_ends_run_again_and_the_interval_widens_to_what_the_requests_decide():
    rng = random.Random(0)

    def server(level):  # 40 requests a run; the share falls from 1 at 10 to 0.6 at 30
        p = min(1.0, max(0.0, 1 - (level - 10) / 50))
        good = sum(rng.random() < p for _ in range(40))
        ttft = 0.5 + level / 30
        return _run(good, 40, ttft, {"ttft": ttft})
    s = _search("margin", server)
    summary = s.summary({"ttft": 100.0})
    runs = {lv["level"]: lv["repeats"] for lv in summary["levels"]}
    assert max(runs.values()) > 1 and max(runs.values()) <= 4  # replicates, at most MAX_RUNS a level
    assert summary["probes"] == sum(runs.values())
    lo, hi = summary["boundary_ci95"]
    assert lo is not None and hi is not None and lo <= 15 <= hi  # the true boundary: share 0.9 at 15
    assert summary["replicated_levels"] == sum(r > 1 for r in runs.values()) > 0 and summary["dispersion"] >= 1
    text = "\n".join(capacity_table(summary))
    assert "run more than once" in text and "no level was run twice" not in text
    assert all(summary["levels"][i]["smoothed_share"] is not None for i in range(len(runs)))


def test_failed_requests_that_alone_miss_the_target_bind_and_the_knee_margins_otherwise():
    def server(level):
        if level <= 8:
            return _run(100, 100, 0.6, {"ttft": 0.6, "e2el": 0.3})
        return _run(70, 100, None, {"ttft": None, "e2el": None}, failed=30)  # time-outs past 8
    s = _search("margin", server).summary({"ttft": 100.0, "e2el": 900.0})
    assert s["knee_interval"] == [8, 9] and s["binding_slo"] == "errors"
    assert s["binding_slo_margins"]["failed_share"] == pytest.approx(0.3) and s["boundary_shape"] == "cliff"
    assert "binding: failed requests (30% of those at 9)" in "\n".join(capacity_table(s))


def test_a_rate_search_stops_within_five_percent_and_a_report_without_margins_still_reads():
    s = _search("margin", lambda rate: _run(100 if rate <= 23.7 else 0, 100, rate / 23.7, {"ttft": rate / 23.7}))
    s.over = "request_rate"
    s2 = CapacitySearch(over="request_rate", target=0.9, max_steps=30, search="margin")
    while (level := s2.next_level()) is not None:
        s2.record(level, [_run(100 if level <= 23.7 else 0, 100, level / 23.7, {"ttft": level / 23.7})])
    lo, hi = s2.summary({})["knee_interval"]
    assert lo <= 23.7 < hi and (hi - lo) / hi <= 0.05
    plain = _search("margin", lambda level: _run(100 if level <= 5 else 0, 100))  # results without margins
    summary = plain.summary({"ttft": 100.0})
    assert summary["knee_interval"] == [5, 6] and summary["binding_slo"] is None
    assert summary["boundary_shape"] == "cliff"  # the share falls from 1 to 0 across one step


def test_slo_margin_is_at_most_one_exactly_when_the_share_meets_the_quantile():
    margin, per_slo, met = slo_margins({"ttft": [0.5, 0.9, 1.2, 0.7], "tpot": [0.1, 1.1, 0.2, 0.3]}, 0, 0.5)
    assert margin == pytest.approx(0.7) and per_slo == {"ttft": pytest.approx(0.7), "tpot": pytest.approx(0.2)}
    assert met == {"ttft": 3, "tpot": 3}
    assert slo_margins({"ttft": [0.5, 0.9, 1.2, 0.7], "tpot": [0.1, 1.1, 0.2, 0.3]}, 0, 0.75)[0] == pytest.approx(1.1)
    assert slo_margins({"ttft": [0.5]}, 3, 0.5)[0] is None  # the quantile falls on a failed request
    outs = [RequestOutput(success=True, ttft=t, latency=t + 0.01, output_tokens=2, prompt_len=3)
            for t in (0.01, 0.02, 0.03, 0.04, 0.06)]
    for q in (0.6, 0.8, 0.9):
        r = compute_metrics(outs, 1.0, goodput_slos={"ttft": 35}, slo_quantile=q).to_result()
        share = r["request_goodput"] / 5
        assert (r["slo_margin"] <= 1) == (share >= q - 1e-9) and r["goodput_slo_met"] == {"ttft": 3}
    assert "slo_margin" not in compute_metrics(outs, 1.0, goodput_slos={"ttft": 35}).to_result()
    assert math.isclose(compute_metrics(outs, 1.0, goodput_slos={"ttft": 35}, slo_quantile=0.6)
                        .to_result()["slo_margins"]["ttft"], 30 / 35)


def test_a_server_that_drifts_between_runs_widens_the_interval_to_its_mean_boundary():
    # Run by run the server's capacity is 100 or 112 at random (a clock, a neighbour, a cache): each
    # run alone is exact (200 requests, no sampling noise), so only a level run twice shows the drift.
    rng = random.Random(14)

    def server(level):
        capacity = rng.choice((100.0, 112.0))
        share = min(1.0, max(0.0, 0.9 - 2.0 * (level / capacity - 1)))
        return _run(round(share * 200), 200, level / capacity, {"ttft": level / capacity})
    s = _search("margin", server).summary({"ttft": 100.0})
    # The expected share (both capacities alike) meets 90% up to 105.7. Read from runs of one level
    # each, this search's interval was [109, 113]; with the bracket's ends run twice it holds 105.7.
    lo, hi = s["boundary_ci95"]
    assert lo is not None and hi is not None and lo <= 105.66 <= hi
    assert s["replicated_levels"] >= 2 and s["dispersion"] > 1 and s["margin_drift"] > 0
    text = "\n".join(capacity_table(s))
    assert "run-to-run drift of the SLO margin" in text and "degrees of freedom" in text


def test_the_margins_drift_leaves_levels_far_from_the_boundary_decided():
    # Two runs of the level at the boundary disagree (0.95 and 0.84 of 600 requests, margins 0.96 and
    # 1.04), the levels below pass with every request far inside the SLO. The shares' dispersion
    # alone (phi > 10) would leave every level undecided; the margins' drift (about 4% a run, two
    # degrees of freedom: t 4.3) keeps 48 and 55 decided and the one at the boundary not.
    s = CapacitySearch(target=0.9, search="margin")
    s.record(48, [_run(480, 480, 0.75, {"tpot": 0.75})])
    s.record(55, [_run(535, 550, 0.8, {"tpot": 0.8})])
    s.record(60, [_run(570, 600, 0.96, {"tpot": 0.96})])
    s.record(60, [_run(504, 600, 1.04, {"tpot": 1.04})])
    s.record(62, [_run(430, 620, 1.2, {"tpot": 1.2})])
    s.record(62, [_run(440, 620, 1.18, {"tpot": 1.18})])
    assert s.dispersion() > 10
    summary = s.summary({"tpot": 10.0})
    assert summary["boundary_ci95"] == [55, 62]
    verdicts = {lv["level"]: lv["verdict"] for lv in summary["levels"]}
    assert verdicts == {48: "pass", 55: "pass", 60: "undecided", 62: "fail"}
