"""Serving metrics exactly as `vllm bench serve` (0.32) computes them, plus repeats and comparisons.

Definitions (serving-reference §1.2), over successful requests only:

* TTFT: first `choices` message − request start. E2EL: last `choices` message − start.
* TPOT: (E2EL − TTFT) / (output tokens − 1), only for requests with more than one output token.
  For goodput a one-token request counts as TPOT = 0.
* ITL: every gap between consecutive `choices` messages of every request, pooled (a chunk that
  carries k tokens is one sample).
* Output tokens: the server's `usage.completion_tokens`; when the server sent no usage, the
  client-side count (vLLM re-tokenises the text instead; we count streamed tokens, see
  `loadgen`); when that is 0 too, 1 (vLLM's no-tokenizer rule).
* Statistics: numpy mean, median, population std, linearly interpolated percentiles, in ms;
  an empty list gives 0.
* Goodput: requests meeting every given SLO (value ≤ SLO in ms, names ttft/tpot/e2el) / duration.
* max_output_tokens_per_s / max_concurrent_requests: one-second buckets since the earliest
  start; the fullest bucket of chunk arrivals, and the most requests active in any bucket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_NAMES = ("ttft", "tpot", "e2el")


@dataclass(slots=True)
class RequestOutput:
    """One request as the client saw it. Times are seconds from `time.perf_counter()`.

    `output_tokens` is the server's usage count (0 when the server sent none); `counted_tokens`
    is the client's own count, used only when `output_tokens` is 0.
    """

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    counted_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    queue_time: float = 0.0
    generated_text_len: int = 0
    request_id: str = ""

    @property
    def effective_output_tokens(self) -> int:
        return self.output_tokens or self.counted_tokens or 1


@dataclass
class BenchmarkMetrics:
    """vLLM's BenchmarkMetrics, field for field. Percentile lists hold (percentile, value_ms)."""

    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    percentiles_ttft_ms: list[tuple[float, float]]
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    percentiles_tpot_ms: list[tuple[float, float]]
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    percentiles_itl_ms: list[tuple[float, float]]
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    percentiles_e2el_ms: list[tuple[float, float]]
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    rtfx: float = 0.0
    duration: float = 0.0
    goodput_slos: dict[str, float] | None = None
    # With SLOs and a quantile (the capacity search's goodput target): the SLO margins
    # (``slo_margins``) and the requests that met each SLO on its own, failed ones counted as missing it.
    slo_margin: float | None = None
    slo_margins: dict[str, float | None] | None = None
    goodput_slo_met: dict[str, int] | None = None

    def to_result(self, percentile_metrics: Sequence[str] = PERCENTILE_METRICS) -> dict[str, Any]:
        """The scalar keys of vLLM's result JSON, in vLLM's order (`request_goodput` is None without SLOs)."""
        out: dict[str, Any] = {
            "duration": self.duration,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input,
            "total_output_tokens": self.total_output,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput if self.goodput_slos else None,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_concurrent_requests": self.max_concurrent_requests,
            "rtfx": self.rtfx,
        }
        for m in percentile_metrics:
            out[f"mean_{m}_ms"] = getattr(self, f"mean_{m}_ms")
            out[f"median_{m}_ms"] = getattr(self, f"median_{m}_ms")
            out[f"std_{m}_ms"] = getattr(self, f"std_{m}_ms")
            for p, v in getattr(self, f"percentiles_{m}_ms"):
                out[f"p{percentile_word(p)}_{m}_ms"] = v
        if self.goodput_slo_met is not None:
            out.update(slo_margin=self.slo_margin, slo_margins=self.slo_margins, goodput_slo_met=self.goodput_slo_met)
        return out


def percentile_word(p: float) -> str:
    """vLLM's key spelling: 99 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if int(p) == p else str(p)


def detailed_lists(outputs: Sequence[RequestOutput]) -> dict[str, list[Any]]:
    """vLLM's per-request result lists (`--save-detailed`), in request order, seconds."""
    return {
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": [o.effective_output_tokens if o.success else 0 for o in outputs],
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "queue_times": [o.queue_time for o in outputs],
        "errors": [o.error for o in outputs],
    }


def _stats(values: list[float], percentiles: Sequence[float]) -> tuple[float, float, float, list[tuple[float, float]]]:
    # vLLM passes `values or 0` to numpy, so an empty list yields zeros, not NaN.
    x: Any = values or 0
    return (float(np.mean(x)) * 1000, float(np.median(x)) * 1000, float(np.std(x)) * 1000,
            [(p, float(np.percentile(x, p)) * 1000) for p in percentiles])


def _check_slos(slos: Mapping[str, float]) -> None:
    for name, value in slos.items():
        if name not in SLO_NAMES:
            raise ValueError(f"unknown SLO {name!r}; use one of {list(SLO_NAMES)}")
        if value < 0:
            raise ValueError(f"SLO {name} must be non-negative, got {value}")


def slo_margins(ratios: Mapping[str, Sequence[float]], failed: int, quantile: float
                ) -> tuple[float | None, dict[str, float | None], dict[str, int]]:
    """The SLO margins of one run: each request's latency over its limit (``ratios``: one list per
    SLO, a value per completed request; ``failed`` more requests count as missing every SLO) read at
    ``quantile`` (the goodput target) over all requests. The margin (the largest ratio of each
    request, at the quantile) is at most 1 exactly when the share of requests meeting every SLO
    reaches the quantile, so it says by how much a run passes or misses, where the share says only
    whether; each SLO's margin on its own says which binds. None: the quantile falls on a failed
    request. Also the requests that met each SLO."""
    names = list(ratios)
    cols = [np.asarray(ratios[k], dtype=float) for k in names]
    n_ok = len(cols[0]) if cols else 0
    n = n_ok + failed
    rank = max(1, math.ceil(quantile * n - 1e-9)) - 1 if n else 0  # the ceil(q n)-th smallest, 0-based

    def at(vals: np.ndarray) -> float | None:
        if not n or rank >= n_ok:
            return None
        v = float(np.partition(vals, rank)[rank])
        return v if math.isfinite(v) else None
    worst = np.max(np.vstack(cols), axis=0) if cols and n_ok else np.zeros(0)
    return (at(worst) if cols else None, {k: at(c) for k, c in zip(names, cols)},
            {k: int(np.sum(c <= 1.0)) for k, c in zip(names, cols)})


def compute_metrics(outputs: Sequence[RequestOutput], duration_s: float, *,
                    selected_percentiles: Sequence[float] = (50, 90, 99),
                    goodput_slos: Mapping[str, float] | None = None,
                    slo_quantile: float | None = None) -> BenchmarkMetrics:
    """vLLM's calculate_metrics over `outputs` (warm-up excluded by the caller), SLOs in ms; with
    ``slo_quantile`` too, the SLO margins at that quantile (``slo_margins``)."""
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    if goodput_slos:
        _check_slos(goodput_slos)
    ok = [o for o in outputs if o.success]
    total_input = total_output = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    e2els: list[float] = []
    itls: list[float] = []
    for o in ok:
        n_out = o.effective_output_tokens
        total_output += n_out
        total_input += o.prompt_len
        tpot = 0.0
        if n_out > 1:
            tpot = (o.latency - o.ttft) / (n_out - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += o.itl
        ttfts.append(o.ttft)
        e2els.append(o.latency)

    good = 0
    if goodput_slos:
        per_metric = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        # vLLM compares seconds against ms / 1000; keep the same arithmetic for identical ties.
        checks = [(per_metric[k], goodput_slos[k] / 1000) for k in SLO_NAMES if k in goodput_slos]
        good = sum(all(slo >= vals[i] for vals, slo in checks) for i in range(len(ok)))
    margin: tuple[Any, Any, Any] = (None, None, None)
    if goodput_slos and slo_quantile is not None:
        margin = slo_margins({k: [v / (goodput_slos[k] / 1000) if goodput_slos[k] > 0 else (0.0 if v <= 0 else math.inf)
                                  for v in per_metric[k]] for k in SLO_NAMES if k in goodput_slos},
                             len(outputs) - len(ok), slo_quantile)

    peak_tokens, peak_conc = _peaks(ok)
    t_mean, t_med, t_std, t_pct = _stats(ttfts, selected_percentiles)
    p_mean, p_med, p_std, p_pct = _stats(tpots, selected_percentiles)
    i_mean, i_med, i_std, i_pct = _stats(itls, selected_percentiles)
    e_mean, e_med, e_std, e_pct = _stats(e2els, selected_percentiles)
    return BenchmarkMetrics(
        completed=len(ok), failed=len(outputs) - len(ok),
        total_input=total_input, total_output=total_output,
        request_throughput=len(ok) / duration_s, request_goodput=good / duration_s,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        mean_ttft_ms=t_mean, median_ttft_ms=t_med, std_ttft_ms=t_std, percentiles_ttft_ms=t_pct,
        mean_tpot_ms=p_mean, median_tpot_ms=p_med, std_tpot_ms=p_std, percentiles_tpot_ms=p_pct,
        mean_itl_ms=i_mean, median_itl_ms=i_med, std_itl_ms=i_std, percentiles_itl_ms=i_pct,
        mean_e2el_ms=e_mean, median_e2el_ms=e_med, std_e2el_ms=e_std, percentiles_e2el_ms=e_pct,
        max_output_tokens_per_s=peak_tokens, max_concurrent_requests=peak_conc,
        duration=duration_s, goodput_slos=dict(goodput_slos) if goodput_slos else None,
        slo_margin=margin[0], slo_margins=margin[1], goodput_slo_met=margin[2],
    )


def _peaks(ok: Sequence[RequestOutput]) -> tuple[float, int]:
    """vLLM 0.32's whole-second buckets: (most chunk arrivals in one second, most requests active in one second)."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    t_end = max(o.start_time + o.latency for o in ok)
    n = int(np.ceil(t_end - t0)) + 1
    chunks = np.zeros(n)
    active = np.zeros(n)
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if 0 <= b < n:
                chunks[b] += 1
        first, last = int(o.start_time - t0), int(o.start_time + o.latency - t0)
        active[first:min(last, n - 1) + 1] += 1
    return float(chunks.max()), int(active.max())


# ---- repeats and comparisons -------------------------------------------------------------------

# Direction of "better" for the scalar result keys; keys not listed (counts, duration) get none.
_HIGHER_IS_BETTER = ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                     "max_output_tokens_per_s")


def _better_direction(key: str) -> int:
    if key in _HIGHER_IS_BETTER:
        return 1
    if key.endswith("_ms"):
        return -1
    return 0


def t_quantile_975(df: int) -> float:
    """Two-sided 95% Student-t critical value for `df` degrees of freedom."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    # Cornish-Fisher expansion around the normal quantile; error < 1e-5 for df > 30.
    z = 1.959963984540054
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


_T975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252,
         2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688,
         2.131449546, 2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845,
         2.073873068, 2.068657610, 2.063898562, 2.059538553, 2.055529439, 2.051830516, 2.048407142,
         2.045229642, 2.042272456)


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


MIN_REPEATS_FOR_CI = 3
CI_NOT_MEANINGFUL = "not meaningful with fewer than 3 repeats"


def aggregate_repeats(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric across repeated runs: mean, sample std, and the 95% t-interval of the mean.

    `runs` are result dicts (`BenchmarkMetrics.to_result()`); only keys that are numeric in every
    run are aggregated. With fewer than `MIN_REPEATS_FOR_CI` runs the interval is None and
    `ci95_note` says why (two samples give a t-interval of +-12.7 std: no noise estimate). Every
    metric of a run (throughputs, latencies, counts, durations) is >= 0, so the interval is
    clipped at 0 (`ci95_clipped` says so): it is never shown outside what is possible.
    """
    if not runs:
        raise ValueError("no runs to aggregate")
    keys = [k for k in runs[0] if all(_numeric(r.get(k)) for r in runs)]
    out: dict[str, dict[str, Any]] = {}
    n = len(runs)
    for k in keys:
        x = np.array([float(r[k]) for r in runs])
        mean = float(x.mean())
        std = float(x.std(ddof=1)) if n > 1 else 0.0
        stat: dict[str, Any] = {"mean": mean, "std": std, "n": n, "ci95": None, "values": x.tolist()}
        if n < MIN_REPEATS_FOR_CI:
            stat["ci95_note"] = CI_NOT_MEANINGFUL
        else:
            half = t_quantile_975(n - 1) * std / math.sqrt(n)
            low = mean - half
            stat["ci95"] = [max(0.0, low), mean + half]
            if low < 0.0:
                stat["ci95_clipped"] = True
        out[k] = stat
    return out


def format_interval(stat: Mapping[str, Any] | None, fmt: str = ".3f") -> str:
    """The interval as the summary and the workbench show it: "[lo, hi]", or why there is none."""
    if not stat:
        return ""
    ci, n = stat.get("ci95"), stat.get("n") or 0
    if n < 2:
        return "no interval (one run)"
    if not ci or n < MIN_REPEATS_FOR_CI:  # also a report written before this rule
        return stat.get("ci95_note") or CI_NOT_MEANINGFUL
    lo, hi = (max(0.0, float(ci[0])), float(ci[1]))  # a report written before the clipping
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def _side(report: Mapping[str, Any], key: str) -> tuple[float, list[float] | None] | None:
    v: Any = report.get(key)
    if isinstance(v, Mapping) and _numeric(v.get("mean")):
        vals = v.get("values")
        return float(v["mean"]), ([float(t) for t in vals] if vals and len(vals) > 1 else None)
    if _numeric(v):
        return float(v), None
    return None


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-metric delta b − a, and whether it lies inside the run-to-run noise.

    Each side is a single run's result dict or an `aggregate_repeats` output. When both sides have
    repeats, the delta's 95% Welch interval is computed: `noise` is "inside" when it contains 0,
    else "outside"; otherwise `noise` is "unknown" (one run says nothing about noise).
    `verdict` is "better"/"worse" for a delta outside the noise on a metric with a direction,
    "tie" inside the noise, "unknown" without repeats, None for metrics without a direction.
    """
    out: dict[str, dict[str, Any]] = {}
    for k in a:
        sa, sb = _side(a, k), _side(b, k)
        if sa is None or sb is None:
            continue
        (ma, va), (mb, vb) = sa, sb
        ci = _welch_interval(va, vb) if va is not None and vb is not None else None
        out[k] = _delta(k, ma, mb, mb - ma, ci)
    return out


def _delta(key: str, ma: float, mb: float, delta: float, ci: list[float] | None) -> dict[str, Any]:
    """One metric's delta entry: whether its interval ``ci`` (None: no noise estimate) holds 0, and
    the verdict that follows on a metric with a direction."""
    noise = "unknown" if ci is None else ("inside" if ci[0] <= 0.0 <= ci[1] else "outside")
    direction = _better_direction(key)
    verdict: str | None
    if direction == 0:
        verdict = None
    elif noise == "unknown":
        verdict = "unknown"
    elif noise == "inside":
        verdict = "tie"
    else:
        verdict = "better" if delta * direction > 0 else "worse"
    return {"a": ma, "b": mb, "delta": delta, "rel_delta": delta / ma if ma else None, "delta_ci95": ci,
            "noise": noise, "verdict": verdict}


def compare_paired(a_runs: Sequence[Mapping[str, Any]], b_runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-metric delta b − a over rounds run in pairs (round i of A beside round i of B, in
    turn), as ``compare_reports`` gives it, but the interval is the paired one: the 95% t-interval
    of the mean of the per-round differences (n − 1 degrees of freedom). A drift of the machine
    over the rounds lands on both sides of each pair and leaves the differences alone."""
    if len(a_runs) != len(b_runs) or not a_runs:
        raise ValueError("paired rounds: give both sides the same number of rounds, at least one")
    n = len(a_runs)
    keys = [k for k in a_runs[0] if all(_numeric(r.get(k)) for r in (*a_runs, *b_runs))]
    out: dict[str, dict[str, Any]] = {}
    for k in keys:
        xa = np.array([float(r[k]) for r in a_runs])
        xb = np.array([float(r[k]) for r in b_runs])
        d = xb - xa
        delta = float(d.mean())
        ci: list[float] | None = None
        if n >= 2:
            half = t_quantile_975(n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
            ci = [delta - half, delta + half]
        out[k] = {**_delta(k, float(xa.mean()), float(xb.mean()), delta, ci), "paired_rounds": n,
                  "a_values": xa.tolist(), "b_values": xb.tolist()}
    return out


def _welch_interval(va: Sequence[float], vb: Sequence[float]) -> list[float]:
    xa, xb = np.asarray(va, dtype=float), np.asarray(vb, dtype=float)
    qa, qb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    delta = float(xb.mean() - xa.mean())
    se2 = qa + qb
    if se2 == 0.0:
        return [delta, delta]
    # Welch-Satterthwaite degrees of freedom, rounded down (conservative).
    df = se2**2 / (qa**2 / (xa.size - 1) + qb**2 / (xb.size - 1))
    half = t_quantile_975(max(1, int(df))) * math.sqrt(se2)
    return [delta - half, delta + half]
