"""Exact metric math of engine.bench.metrics on hand-built requests, checked against hand-computed
values; plus the random dataset and the arrival process, which decide what the metrics measure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.bench.dataset import length_bounds, sample_random_requests
from engine.bench.loadgen import arrival_offsets
from engine.bench.metrics import (RequestOutput, aggregate_repeats, compare_reports, compute_metrics,
                                  t_quantile_975)


def _outputs() -> list[RequestOutput]:
    return [
        # 5 tokens in 4 chunks (one chunk carried two): TPOT uses 5, ITL has 3 gaps.
        RequestOutput(success=True, prompt_len=10, output_tokens=5, ttft=0.1, itl=[0.02, 0.03, 0.05],
                      latency=0.2, start_time=0.0),
        # no usage chunk: the client's count (3) is used.
        RequestOutput(success=True, prompt_len=20, output_tokens=0, counted_tokens=3, ttft=0.2, itl=[0.1, 0.1],
                      latency=0.4, start_time=0.9),
        # one token: no TPOT sample, TPOT = 0 for goodput.
        RequestOutput(success=True, prompt_len=5, output_tokens=1, ttft=0.05, latency=0.05, start_time=1.2),
        # failed: excluded from every statistic and total, counted in `failed`.
        RequestOutput(success=False, error="HTTP 500", prompt_len=7, output_tokens=9, ttft=0.01, itl=[9.0],
                      latency=10.0, start_time=0.0),
        # no usage and nothing counted: 1 token (vLLM's no-tokenizer rule).
        RequestOutput(success=True, prompt_len=3, ttft=0.3, latency=0.3, start_time=2.0),
    ]


def test_totals_and_throughputs():
    m = compute_metrics(_outputs(), 4.0)
    assert (m.completed, m.failed) == (4, 1)
    assert m.total_input == 38 and m.total_output == 10
    assert m.request_throughput == 1.0
    assert m.output_throughput == 2.5
    assert m.total_token_throughput == 12.0


def test_latency_statistics_by_hand():
    m = compute_metrics(_outputs(), 4.0, selected_percentiles=(50, 90, 99))
    # TTFT ms: [100, 200, 50, 300] -> sorted [50, 100, 200, 300]
    assert m.mean_ttft_ms == pytest.approx(162.5)
    assert m.median_ttft_ms == pytest.approx(150.0)
    assert m.std_ttft_ms == pytest.approx(math.sqrt(36875 / 4))  # population std
    assert m.percentiles_ttft_ms == [(50, pytest.approx(150.0)), (90, pytest.approx(270.0)),
                                     (99, pytest.approx(297.0))]
    # TPOT ms: (200-100)/4 = 25 and (400-200)/2 = 100; the 1-token requests are left out.
    assert m.mean_tpot_ms == pytest.approx(62.5)
    assert m.std_tpot_ms == pytest.approx(37.5)
    assert dict(m.percentiles_tpot_ms) == {50: pytest.approx(62.5), 90: pytest.approx(92.5),
                                           99: pytest.approx(99.25)}
    # ITL ms: every chunk gap pooled: [20, 30, 50, 100, 100]
    assert m.mean_itl_ms == pytest.approx(60.0)
    assert m.median_itl_ms == pytest.approx(50.0)
    assert m.std_itl_ms == pytest.approx(math.sqrt(1160))
    assert dict(m.percentiles_itl_ms)[90] == pytest.approx(100.0)
    # E2EL ms: [200, 400, 50, 300]
    assert m.mean_e2el_ms == pytest.approx(237.5)
    assert m.median_e2el_ms == pytest.approx(250.0)
    assert dict(m.percentiles_e2el_ms)[90] == pytest.approx(370.0)


@pytest.mark.parametrize("slos, good", [
    ({"ttft": 250, "tpot": 50}, 2),  # r1 (100 ms, 25 ms) and r3 (50 ms, tpot 0)
    ({"tpot": 100}, 4),  # the 100 ms TPOT of r2 is on the boundary: good
    ({"e2el": 100}, 1),  # only r3
    ({"ttft": 100}, 2),  # r1 exactly on the boundary, r3
])
def test_goodput(slos, good):
    m = compute_metrics(_outputs(), 4.0, goodput_slos=slos)
    assert m.request_goodput == pytest.approx(good / 4.0)
    assert m.to_result()["request_goodput"] == pytest.approx(good / 4.0)


def test_goodput_rejects_unknown_slo():
    with pytest.raises(ValueError, match="itl"):
        compute_metrics(_outputs(), 1.0, goodput_slos={"itl": 5})


def test_peak_buckets():
    m = compute_metrics(_outputs(), 4.0)
    # second 0: r1's 4 chunks; second 1: r2's 3 + r3's 1. Active: r1+r2 in s0, r2+r3 in s1.
    assert m.max_output_tokens_per_s == 4.0
    assert m.max_concurrent_requests == 2


def test_result_keys_follow_vllm():
    m = compute_metrics(_outputs(), 4.0, selected_percentiles=(99.9, 50))
    r = m.to_result()
    assert r["request_goodput"] is None  # no SLO given
    assert list(r)[:9] == ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                           "request_throughput", "request_goodput", "output_throughput",
                           "total_token_throughput"]
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99.9", "p50"):
            assert f"{stat}_{metric}_ms" in r
    assert r["p50_ttft_ms"] == r["median_ttft_ms"]


def test_no_success_gives_zeros_not_nan():
    m = compute_metrics([RequestOutput(success=False, error="x")], 2.0, goodput_slos={"ttft": 1})
    assert (m.completed, m.failed, m.total_output) == (0, 1, 0)
    r = m.to_result()
    assert all(v == 0 for k, v in r.items() if k.endswith("_ms"))
    assert r["max_concurrent_requests"] == 0 and r["request_goodput"] == 0


# ---- repeats and comparisons ------------------------------------------------------------------

def test_aggregate_repeats_t_interval():
    agg = aggregate_repeats([{"x": 1.0, "s": "a", "n": None}, {"x": 2.0, "s": "b", "n": 1}, {"x": 3.0}])
    assert set(agg) == {"x"}  # only keys numeric in every run
    half = 4.302652730 / math.sqrt(3)  # t(0.975, df=2) * s / sqrt(n), s = 1
    assert agg["x"]["mean"] == 2.0 and agg["x"]["std"] == 1.0
    assert agg["x"]["ci95"] == pytest.approx([max(0.0, 2.0 - half), 2.0 + half])  # clipped at 0
    agg = aggregate_repeats([{"x": 11.0}, {"x": 12.0}, {"x": 13.0}])
    assert agg["x"]["ci95"] == pytest.approx([12.0 - half, 12.0 + half])
    assert aggregate_repeats([{"x": 5.0}])["x"]["ci95"] is None


def test_t_quantile():
    assert t_quantile_975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile_975(60) == pytest.approx(2.000298, abs=1e-5)
    assert t_quantile_975(10_000) == pytest.approx(1.96020, abs=1e-4)


def test_compare_reports_noise_flags():
    a = aggregate_repeats([{"mean_ttft_ms": v, "output_throughput": t, "completed": 10}
                           for v, t in ((10, 100), (11, 101), (12, 99))])
    b = aggregate_repeats([{"mean_ttft_ms": v, "output_throughput": t, "completed": 10}
                           for v, t in ((20, 100.5), (21, 99.5), (22, 101))])
    d = compare_reports(a, b)
    assert d["mean_ttft_ms"]["delta"] == pytest.approx(10.0)
    assert d["mean_ttft_ms"]["noise"] == "outside" and d["mean_ttft_ms"]["verdict"] == "worse"
    lo, hi = d["mean_ttft_ms"]["delta_ci95"]
    assert lo == pytest.approx(10 - 2.776445105 * math.sqrt(2 / 3))  # Welch df = 4
    assert hi == pytest.approx(10 + 2.776445105 * math.sqrt(2 / 3))
    assert d["output_throughput"]["noise"] == "inside" and d["output_throughput"]["verdict"] == "tie"
    assert d["completed"]["verdict"] is None  # no better/worse direction
    single = compare_reports({"mean_ttft_ms": 10.0}, {"mean_ttft_ms": 8.0})
    assert single["mean_ttft_ms"]["noise"] == "unknown" and single["mean_ttft_ms"]["verdict"] == "unknown"
    assert single["mean_ttft_ms"]["rel_delta"] == pytest.approx(-0.2)
    mixed = compare_reports(a, {"mean_ttft_ms": 30.0})
    assert mixed["mean_ttft_ms"]["noise"] == "unknown"


# ---- dataset and arrivals -------------------------------------------------------------------------

def test_random_dataset_matches_vllm_sampling():
    reqs = sample_random_requests(5, input_len=20, output_len=8, range_ratio=0.5, prefix_len=3, seed=7,
                                  vocab_size=50, special_ids=[0, 1], num_special_tokens=1)
    (in_lo, in_hi), (out_lo, out_hi) = length_bounds(20, 8, 0.5, 1)
    assert (in_lo, in_hi, out_lo, out_hi) == (9, 29, 4, 12)
    # The same draws in vLLM's order: input lens, output lens, offsets, then the prefix.
    rng = np.random.default_rng(7)
    in_lens = rng.integers(9, 30, size=5)
    out_lens = rng.integers(4, 13, size=5)
    offsets = rng.integers(0, 50, size=5)
    allowed = np.arange(2, 50)
    prefix = allowed[rng.integers(0, 48, size=3)].tolist()
    for i, r in enumerate(reqs):
        body = allowed[(offsets[i] + i + np.arange(in_lens[i])) % 48].tolist()
        assert r.prompt == prefix + body
        assert r.prompt_len == 3 + in_lens[i] and r.output_len == out_lens[i]
        assert not {0, 1} & set(r.prompt)
    assert reqs == sample_random_requests(5, input_len=20, output_len=8, range_ratio=0.5, prefix_len=3,
                                          seed=7, vocab_size=50, special_ids=[0, 1], num_special_tokens=1)


def test_random_dataset_fixed_lengths_and_separate_ratios():
    reqs = sample_random_requests(4, input_len=16, output_len=4, vocab_size=100)
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(16, 4)}
    (in_lo, in_hi), (out_lo, out_hi) = length_bounds(100, 10, {"input": 0.0, "output": 0.5})
    assert (in_lo, in_hi, out_lo, out_hi) == (100, 100, 5, 15)
    with pytest.raises(ValueError):
        length_bounds(10, 10, 1.0)


class _WordTokenizer:
    """Exact round trip: id i <-> word 'w<i>'; id 0 is BOS (special)."""

    vocab_size = 40
    all_special_ids = [0]

    def num_special_tokens_to_add(self) -> int:
        return 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [int(w[1:]) for w in text.split()]
        return ([0] if add_special_tokens else []) + ids

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_random_dataset_text_mode_equals_token_mode_for_exact_tokenizer():
    tok = _WordTokenizer()
    text = sample_random_requests(3, input_len=12, output_len=5, range_ratio=0.2, prefix_len=2, seed=1,
                                  tokenizer=tok)
    ids = sample_random_requests(3, input_len=12, output_len=5, range_ratio=0.2, prefix_len=2, seed=1,
                                 vocab_size=40, special_ids=[0], num_special_tokens=1)
    for t, i in zip(text, ids):
        assert t.prompt == tok.decode(i.prompt)
        assert (t.prompt_len, t.output_len) == (i.prompt_len, i.output_len)


def test_arrivals_match_vllm_gamma_stream_and_rescale():
    n, rate, burst = 50, 10.0, 0.5
    offs = arrival_offsets(n, rate, burst, seed=3)
    np.random.seed(3)  # vLLM: np.random.seed(seed), then one gamma draw per request
    gaps = [np.random.gamma(shape=burst, scale=1.0 / (rate * burst)) for _ in range(n)]
    expect = np.cumsum(gaps) * ((n / rate) / np.sum(gaps))
    assert offs == pytest.approx(expect.tolist())
    assert offs[-1] == pytest.approx(n / rate)
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    assert arrival_offsets(4, 2.0, math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_repeat_intervals_stay_physical_and_need_three_repeats():
    from engine.bench.metrics import CI_NOT_MEANINGFUL, format_interval
    two = aggregate_repeats([{"request_throughput": 12.0, "completed": 40}, {"request_throughput": 69.3, "completed": 40}])
    # two repeats: t(1) = 12.7 would give [-128.3, 184.9] req/s; no interval, the reason instead
    assert two["request_throughput"]["ci95"] is None and two["request_throughput"]["ci95_note"] == CI_NOT_MEANINGFUL
    assert format_interval(two["request_throughput"]) == "not meaningful with fewer than 3 repeats"
    wide = aggregate_repeats([{"request_throughput": v, "mean_ttft_ms": t, "failed": f}
                              for v, t, f in ((1.0, 5.0, 0), (1.2, 900.0, 0), (30.0, 7.0, 9))])
    for key in ("request_throughput", "mean_ttft_ms", "failed"):
        lo, hi = wide[key]["ci95"]
        assert lo == 0.0 and hi > wide[key]["mean"] and wide[key]["ci95_clipped"] is True
    tight = aggregate_repeats([{"output_throughput": v} for v in (100.0, 101.0, 99.0)])["output_throughput"]
    assert 0 < tight["ci95"][0] < 100 < tight["ci95"][1] and "ci95_clipped" not in tight
    assert format_interval(tight, ".1f") == f"[{tight['ci95'][0]:.1f}, {tight['ci95'][1]:.1f}]"
    # a report written before these rules: n = 2 with an interval, or a negative low end
    assert format_interval({"n": 2, "mean": 40.6, "ci95": [-128.3, 184.9]}) == CI_NOT_MEANINGFUL
    assert format_interval({"n": 3, "mean": 4.0, "ci95": [-1.0, 9.0]}, ".1f") == "[0.0, 9.0]"
