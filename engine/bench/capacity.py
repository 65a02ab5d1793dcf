"""SLO capacity search: the highest load (concurrency, or request rate) at which the share of
requests meeting every SLO (goodput, vLLM's definition: TTFT, TPOT and E2EL each at or under its
limit in ms) reaches a target, e.g. 90%.

Two searches (``client.capacity_search``):

``bisect`` (the default) doubles the level from the start (concurrency 1, or 1 request/s) until a
level fails or the ceiling is reached, then bisects between the highest level that passed and the
lowest that failed: concurrency until the two are adjacent integers, request rate until they are
within 5% of each other, and never more than `max_steps` levels in all. A level passes when the
mean goodput share over its repeats reaches the target.

``margin`` reads how far each run passed or missed, not only whether: a run's SLO margin is its
requests' latency over the SLO limit (the largest ratio of each request) at the target quantile
(``metrics.slo_margins``), at most 1 exactly when the run meets the target. While climbing, the
next level is where the line through the last two margins reaches 1 (at most 4x the last, at
least one step up); inside the bracket, where the line between the bracket's margins crosses 1
(regula falsi; a probe that did not halve the bracket is followed by a bisection, so a cliff costs
at most about twice bisection's levels). When the bracket is adjacent (or within 5% for a rate),
its two ends are each run a second time (``DISPERSION_LEVELS``: the server's run-to-run drift,
not only its requests' sampling, then widens the interval, see ``drift``), then again, at most
``MAX_RUNS`` times each, while their verdict is undecided: the Wilson interval of the level's good
requests over all its runs straddles the target. Each replicate counts against `max_steps`.

Whatever the search, the summary reads every level tried at once: the goodput shares (good over
sent requests, pooled over a level's runs) made non-increasing in the level by isotonic
regression (pool adjacent violators, weighted by requests: a noisy level cannot reverse the
curve), the knee (the highest level whose smoothed share meets the target; its interval [knee,
lowest level above it that misses]), the boundary (where the smoothed curve, linear between
levels, crosses the target) with a 95% interval [highest level whose Wilson interval lies above
the target, lowest above it whose interval lies below] (the levels whose verdict the requests
decide; monotone curve assumed). Where levels were run more than once, the run-to-run drift of
their SLO margins (``drift``: a pooled standard deviation of log margin, with Student's t for its
few degrees of freedom) must agree too: a level whose mean margin is within that drift of 1 is
undecided, one far from it stays decided; without margins the shares' dispersion widens the
Wilson intervals instead. Then the binding SLO (the largest SLO margin at the first level
beyond the boundary, or ``errors`` where failed requests alone miss the target there) and whether
the boundary is a cliff (across a bracket within one step or 5%, the margin grows far faster than
the level: ``_shape``) or smooth.
``benchmarks/capacity_search.py`` compares the two searches on simulated servers.

``client.capacity_mode: ramp`` takes the same levels in one continuous run instead, a window each,
then holds at the knee (``engine.bench.ramp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from engine.bench.metrics import aggregate_repeats

DEFAULT_CEILING = 1024.0
RATE_TOLERANCE = 0.05
SEARCHES = ("bisect", "margin")
Z_DECIDE = 1.96  # each end of the boundary's interval is one-sided 97.5%: the two together 95%
# Student's t at 97.5% by degrees of freedom: the drift is estimated from a few repeated runs, and
# with z in its place the interval held the true boundary 92% of the time at 5% run-to-run noise.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)


def t975(df: int) -> float:
    """Student's t quantile at 97.5% for ``df`` degrees of freedom (within 0.1% beyond the table)."""
    return _T975[df - 1] if 1 <= df <= len(_T975) else Z_DECIDE + 2.5 / max(df, 1)
MAX_RUNS = 4  # runs of one level (the first and its replicates) in the margin search
MAX_GROWTH = 4.0  # the margin search climbs at most this factor a level
# Levels the margin search runs twice beside the boundary before it reads its interval. With every
# level run once the interval held only the requests' sampling: on simulated servers whose latency
# moves 5% from run to run it held the true boundary 84% of the time, 97% with them and the drift.
DISPERSION_LEVELS = 2
CLIFF_DROP = 0.5
CLIFF_MARGIN = 1.5
CLIFF_ELASTICITY = 4.0


def goodput_share(result: dict) -> float:
    """Requests meeting every SLO over all requests sent (failed ones count as missing it)."""
    sent = (result.get("completed") or 0) + (result.get("failed") or 0)
    if not sent:
        return 0.0
    good = (result.get("request_goodput") or 0.0) * (result.get("duration") or 0.0)
    return min(1.0, round(good) / sent)


def good_and_sent(result: dict) -> tuple[int, int]:
    sent = (result.get("completed") or 0) + (result.get("failed") or 0)
    return min(sent, round((result.get("request_goodput") or 0.0) * (result.get("duration") or 0.0))), sent


def wilson(good: int, sent: int, z: float = Z_DECIDE) -> tuple[float, float]:
    """Wilson score interval of a binomial share (0, 1 without requests)."""
    return wilson_share(good / sent, sent, z) if sent > 0 else (0.0, 1.0)


def wilson_share(p: float, sent: float, z: float = Z_DECIDE) -> tuple[float, float]:
    if sent <= 0:
        return 0.0, 1.0
    d = 1 + z * z / sent
    mid = (p + z * z / (2 * sent)) / d
    half = z * math.sqrt(p * (1 - p) / sent + z * z / (4 * sent * sent)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def antitonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-increasing sequence closest to ``values`` in weighted least squares (pool adjacent
    violators): a level's share may not exceed a lower level's."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for y, w in zip(values, weights):
        blocks.append([y, max(w, 1e-12), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _w, n in blocks:
        out += [v] * int(n)
    return out


def crossing(levels: list[float], fitted: list[float], target: float) -> Optional[float]:
    """Where the non-increasing curve through (level, fitted) falls below ``target``, linear
    between levels; None when no level tried misses it or the first does."""
    for i in range(1, len(levels)):
        if fitted[i - 1] >= target > fitted[i]:
            x0, x1, y0, y1 = levels[i - 1], levels[i], fitted[i - 1], fitted[i]
            return x0 + (x1 - x0) * (y0 - target) / (y0 - y1)
    return None


def _mean(vals: list[Optional[float]]) -> Optional[float]:
    """The mean, None when any is None (a run whose margin fell on a failed request)."""
    if not vals or any(v is None for v in vals):
        return None
    return sum(v for v in vals if v is not None) / len(vals)


@dataclass
class Level:
    level: float
    runs: list[dict]
    target: float

    @property
    def share(self) -> float:
        return sum(goodput_share(r) for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.runs) and self.share >= self.target

    @property
    def counts(self) -> tuple[int, int]:
        """Good and sent requests over the runs."""
        pairs = [good_and_sent(r) for r in self.runs]
        return sum(g for g, _ in pairs), sum(n for _, n in pairs)

    def decide(self, phi: float = 1.0, sent: Optional[int] = None, drift: Optional[tuple[float, int]] = None,
               runs: Optional[int] = None) -> Optional[bool]:
        """True: the Wilson interval of the good requests lies at or above the target; False:
        below it; None: it straddles the target (the requests do not decide). ``phi``: the
        run-to-run dispersion (``dispersion``), the requests count as ``sent / phi``; ``sent``:
        as if that many requests had been sent at the same share (would more runs decide it?).
        ``drift``: the run-to-run spread of log(SLO margin) and its degrees of freedom
        (``CapacitySearch.drift``); a level with a margin in every run is then decided only where
        its mean log margin, within t(97.5%, df) times the spread / sqrt(runs) (``runs``: as if
        run that often), lies on the same side of 0 as the requests say: a server whose latency
        moves from run to run may meet the target in one run and miss it in the next."""
        good, n = self.counts
        if not n:
            return None
        n_eff = (sent or n) / max(phi, 1.0)
        lo, hi = wilson_share(good / n, n_eff)
        by_requests = True if lo >= self.target else False if hi < self.target else None
        logs = self.log_margins()
        if drift is None or by_requests is None or logs is None:
            return by_requests
        mean_log = sum(logs) / len(logs)
        spread, df = drift
        half = t975(df) * spread / math.sqrt(runs or len(logs))
        by_margin = True if mean_log + half <= 0 else False if mean_log - half > 0 else None
        return by_requests if by_margin is by_requests else None

    def log_margins(self) -> Optional[list[float]]:
        """log(SLO margin) of each run; None unless every run has a positive margin."""
        margins = [r.get("slo_margin") for r in self.runs]
        if not margins or any(not isinstance(m, (int, float)) or m <= 0 for m in margins):
            return None
        return [math.log(m) for m in margins]

    @property
    def decided(self) -> Optional[bool]:
        return self.decide()

    @property
    def margin(self) -> Optional[float]:
        """The runs' mean SLO margin (None without one: no margins measured, or a run whose
        margin fell on a failed request)."""
        if not self.runs or any("slo_margin" not in r for r in self.runs):
            return None
        return _mean([r.get("slo_margin") for r in self.runs])

    def slo_margins(self) -> dict[str, Optional[float]]:
        names = {k for r in self.runs for k in (r.get("slo_margins") or {})}
        return {k: _mean([(r.get("slo_margins") or {}).get(k) for r in self.runs]) for k in sorted(names)}

    def slo_shares(self) -> dict[str, float]:
        """Each SLO's share of sent requests that met it, over the runs."""
        met: dict[str, int] = {}
        sent = 0
        for r in self.runs:
            sent += (r.get("completed") or 0) + (r.get("failed") or 0)
            for k, v in (r.get("goodput_slo_met") or {}).items():
                met[k] = met.get(k, 0) + int(v)
        return {k: v / sent for k, v in sorted(met.items())} if sent else {}

    def to_dict(self, over: str, phi: float = 1.0, drift: Optional[tuple[float, int]] = None) -> dict[str, Any]:
        first = self.runs[0] if self.runs else {}

        def mean(key: str) -> Optional[float]:
            vals = [r[key] for r in self.runs if isinstance(r.get(key), (int, float))]
            return sum(vals) / len(vals) if vals else None
        shares = [{"goodput_share": goodput_share(r)} for r in self.runs]
        agg = aggregate_repeats(shares)["goodput_share"] if len(self.runs) > 1 else None
        good, sent = self.counts
        decided = self.decide(phi, drift=drift)
        return {"level": self.level, "over": over, "passed": self.passed, "goodput_share": self.share,
                "goodput_share_ci95": agg["ci95"] if agg else None,
                "repeats": len(self.runs), "request_throughput": mean("request_throughput"),
                "output_throughput": mean("output_throughput"), "request_goodput": mean("request_goodput"),
                "latency_ms": {m: {p: mean(f"{p}_{m}_ms") for p in ("mean", "median", "p90", "p99")}
                               for m in ("ttft", "tpot", "e2el")},
                "completed": sum(r.get("completed") or 0 for r in self.runs),
                "failed": sum(r.get("failed") or 0 for r in self.runs),
                "errors": first.get("errors", []),
                "good_requests": good,
                "goodput_share_wilson95": list(wilson_share(good / sent, sent / max(phi, 1.0))) if sent else None,
                "verdict": "pass" if decided else "fail" if decided is False else "undecided",
                "slo_margin": self.margin, "slo_margins": self.slo_margins() or None,
                "slo_shares": self.slo_shares() or None}


@dataclass
class CapacitySearch:
    """Which level to try next, given the levels tried so far (pure logic: the caller runs them).
    ``next_level`` may return a level already tried (the margin search's replicate); ``record``
    then adds the runs to it. ``max_steps`` bounds the probes (levels tried plus replicates)."""

    over: str = "concurrency"
    target: float = 0.9
    ceiling: float = DEFAULT_CEILING
    max_steps: int = 10
    start: float = 1.0
    search: str = "bisect"
    precision: float = RATE_TOLERANCE
    tried: list[Level] = field(default_factory=list)
    probes: int = 0
    _interpolated: list[tuple[float, float, bool]] = field(default_factory=list)  # (lo, hi, bisected)

    def __post_init__(self) -> None:
        if self.search not in SEARCHES:
            raise ValueError(f"capacity search {self.search!r}: use one of {', '.join(SEARCHES)}")

    def _fmt(self, x: float) -> float:
        return float(int(x)) if self.over == "concurrency" else round(x, 3)

    def _level(self, level: float) -> Optional[Level]:
        return next((t for t in self.tried if t.level == level), None)

    def next_level(self) -> Optional[float]:
        if self.probes >= self.max_steps or len(self.tried) >= self.max_steps:
            return None
        if not self.tried:
            return self._fmt(min(self.start, self.ceiling))
        if self.search == "margin":
            return self._next_margin()
        passed = [t.level for t in self.tried if t.passed]
        failed = [t.level for t in self.tried if not t.passed]
        lo = max(passed) if passed else None
        hi = min((f for f in failed if lo is None or f > lo), default=None)
        if hi is None:  # still climbing
            if lo is None or lo >= self.ceiling:
                return None
            return self._fmt(min(lo * 2, self.ceiling))
        if lo is None:  # the first level already failed: nothing lower to try for concurrency 1
            if self.over == "concurrency" and hi <= 1:
                return None
            nxt = self._fmt(hi / 2)
            return nxt if nxt > 0 and nxt not in [t.level for t in self.tried] else None
        if self.over == "concurrency":
            if hi - lo <= 1:
                return None
            return float(int((lo + hi) // 2))
        if (hi - lo) / hi <= RATE_TOLERANCE:
            return None
        return self._fmt((lo + hi) / 2)

    def record(self, level: float, runs: list[dict]) -> Level:
        self.probes += 1
        lv = self._level(level)
        if lv is not None:
            lv.runs = lv.runs + list(runs)
            return lv
        lv = Level(level, list(runs), self.target)
        self.tried.append(lv)
        return lv

    # ---- the smoothed curve -----------------------------------------------------------------------

    def fit(self) -> tuple[list[Level], list[float], list[float]]:
        """The levels tried (ascending), their pooled shares and the isotonic fit."""
        order = sorted(self.tried, key=lambda t: t.level)
        counts = [t.counts for t in order]
        raw = [g / n if n else 0.0 for g, n in counts]
        return order, raw, antitonic(raw, [float(n) for _, n in counts])

    def bracket(self) -> tuple[Optional[float], Optional[float]]:
        """The highest level whose smoothed share meets the target, and the lowest above it that misses."""
        order, _raw, fitted = self.fit()
        lo = max((t.level for t, y in zip(order, fitted) if y >= self.target), default=None)
        hi = min((t.level for t, y in zip(order, fitted) if y < self.target and (lo is None or t.level > lo)),
                 default=None)
        return lo, hi

    def dispersion(self) -> float:
        """Run-to-run dispersion of the goodput share beyond the binomial's (quasi-binomial:
        Pearson's chi-square over its degrees of freedom, pooled over the levels run more than
        once; at least 1, and 1 while no level was). A server whose latency moves from run to run
        makes a level's requests less independent than they look; their interval widens by sqrt(phi)."""
        chi2 = df = 0.0
        for t in self.tried:
            pairs = [good_and_sent(r) for r in t.runs]
            pairs = [(g, n) for g, n in pairs if n]
            good, sent = sum(g for g, _ in pairs), sum(n for _, n in pairs)
            if len(pairs) < 2 or not 0 < good < sent:
                continue
            p = good / sent
            chi2 += sum((g - n * p) ** 2 / (n * p * (1 - p)) for g, n in pairs)
            df += len(pairs) - 1
        return max(1.0, chi2 / df) if df else 1.0

    def drift(self) -> Optional[tuple[float, int]]:
        """The run-to-run spread of the SLO margin: the pooled standard deviation of log(margin)
        between the runs of one level, over the levels run more than once with a margin in every
        run, and its degrees of freedom; None while there is none. Unlike ``dispersion`` it reads
        how far each run passed or missed, so it applies to every level alike: a level far from the
        boundary stays decided, one whose margin is within the drift of 1 does not."""
        ss = df = 0.0
        for t in self.tried:
            logs = t.log_margins()
            if logs is None or len(logs) < 2:
                continue
            mean = sum(logs) / len(logs)
            ss += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
        return (math.sqrt(ss / df), int(df)) if df else None

    def spread(self) -> tuple[float, Optional[tuple[float, int]]]:
        """(phi, drift) that widen a level's verdict: the margins' drift where measured (the
        requests then count as sampled: phi 1), else the shares' dispersion."""
        drift = self.drift()
        return (1.0 if drift is not None else self.dispersion()), drift

    def interval(self) -> tuple[Optional[float], Optional[float]]:
        """The boundary's 95% interval: the highest level decided to pass, the lowest above it
        decided to miss (None: below the lowest tried, or above the highest); ``Level.decide``
        with the run-to-run ``spread``."""
        phi, drift = self.spread()
        lo = max((t.level for t in self.tried if t.decide(phi, drift=drift)), default=None)
        hi = min((t.level for t in self.tried if t.decide(phi, drift=drift) is False and (lo is None or t.level > lo)),
                 default=None)
        return lo, hi

    def _narrow(self, lo: float, hi: float) -> bool:
        if self.over == "concurrency":
            return hi - lo <= 1
        return (hi - lo) / hi <= self.precision

    # ---- the margin search -------------------------------------------------------------------------

    def _next_margin(self) -> Optional[float]:
        lo, hi = self.bracket()
        if hi is None:  # climbing
            if lo is None or lo >= self.ceiling:
                return None
            return self._fmt(min(self._climb(lo), self.ceiling))
        if lo is None:  # the first level already misses: come down
            if self.over == "concurrency" and hi <= 1:
                return None
            m = self._level(hi).margin  # type: ignore[union-attr]
            factor = max(1 / MAX_GROWTH, min(0.5, 1 / m)) if m else 0.5
            nxt = self._fmt(hi * factor)
            return nxt if nxt > 0 and self._level(nxt) is None else None
        if not self._narrow(lo, hi):
            return self._inside(lo, hi)
        return self._confirm(lo, hi)

    def _close(self, low: float, high: float) -> bool:
        """Whether an interval [low, high] is as narrow as asked: adjacent, or within ``precision``."""
        if self.over == "concurrency":
            return high - low <= max(1.0, math.floor(self.precision * low))
        return (high - low) / high <= self.precision

    def _confirm(self, lo: float, hi: float) -> Optional[float]:
        """With the smoothed bracket [lo, hi] narrow: the next run that moves an end of the 95%
        interval towards it. On the wider side, a level tried there whose verdict is undecided
        but that ``MAX_RUNS`` runs at its share so far would decide (the nearest to the bracket);
        else an untried level between the interval's end and the levels tried on that side (where
        the margins say one run should decide); None when neither side has one, or the interval
        is already narrow."""
        again = self._replicate_for_dispersion(lo, hi)
        if again is not None:
            return again
        low, high = self.interval()
        if low is not None and high is not None and self._close(low, high):
            return None
        phi, drift = self.spread()
        per_run = max([1] + [sum(good_and_sent(r)[1] for r in t.runs) // len(t.runs) for t in self.tried if t.runs])
        sides = []
        if low is None or low < lo:
            floor = low if low is not None else 0.0
            cands = [t for t in self.tried if floor < t.level <= lo and t.decide(phi, drift=drift) is None
                     and len(t.runs) < MAX_RUNS and t.decide(phi, per_run * MAX_RUNS, drift, MAX_RUNS) is True]
            nearest = min((t.level for t in self.tried if floor < t.level <= lo), default=lo)
            pick = max(cands, key=lambda t: t.level).level if cands else self._toward(floor, nearest, True, phi, drift)
            if pick is not None:
                sides.append(((lo - floor) / max(lo, 1e-9), pick))
        if high is None or high > hi:
            ceil = high if high is not None else min(self.ceiling, 2 * max(t.level for t in self.tried))
            cands = [t for t in self.tried if hi <= t.level < ceil and t.decide(phi, drift=drift) is None
                     and len(t.runs) < MAX_RUNS and t.decide(phi, per_run * MAX_RUNS, drift, MAX_RUNS) is False]
            nearest = max((t.level for t in self.tried if hi <= t.level < ceil), default=hi)
            pick = min(cands, key=lambda t: t.level).level if cands else self._toward(nearest, ceil, False, phi, drift)
            if pick is not None:
                sides.append(((ceil - hi) / max(hi, 1e-9), pick))
        return max(sides)[1] if sides else None

    def _replicate_for_dispersion(self, lo: float, hi: float) -> Optional[float]:
        """While fewer than ``DISPERSION_LEVELS`` levels were run more than once: the end of the
        bracket [lo, hi] run only once, the one whose share is nearer the target first (None when
        both ends were run again)."""
        if sum(1 for t in self.tried if len(t.runs) > 1) >= DISPERSION_LEVELS:
            return None
        ends = [t for t in (self._level(lo), self._level(hi)) if t is not None and len(t.runs) == 1]
        return min(ends, key=lambda t: abs(t.share - self.target)).level if ends else None

    def _toward(self, a: float, b: float, passing: bool, phi: float,
                drift: Optional[tuple[float, int]] = None) -> Optional[float]:
        """An untried level strictly between a and b where one run should decide: where the line
        between their margins reaches the margin of the decided level nearest the boundary
        (the largest margin decided to pass, the smallest decided to miss); half way without."""
        decided = [t.margin for t in self.tried if t.decide(phi, drift=drift) is passing and t.margin is not None]
        la, lb = self._level(a), self._level(b)
        ma, mb = (la.margin if la else None), (lb.margin if lb else None)
        if decided and ma is not None and mb is not None and mb > ma:
            m = max(decided) if passing else min(decided)
            if ma < m < mb:
                x = a + (b - a) * (m - ma) / (mb - ma)
                x = float(math.floor(x) if passing else math.ceil(x)) if self.over == "concurrency" else self._fmt(x)
                if a < x < b and self._level(x) is None:
                    return x
        return self._between(a, b)

    def _between(self, a: float, b: float) -> Optional[float]:
        """An untried level half way between a and b (strictly inside), or None."""
        x = self._fmt((a + b) / 2)
        if self.over == "concurrency":
            x = float(math.floor((a + b) / 2))
        if a < x < b and self._level(x) is None and x > 0:
            return x
        return None

    def _step(self, lo: float) -> float:
        return lo + 1 if self.over == "concurrency" else lo * (1 + self.precision)

    def _climb(self, lo: float) -> float:
        """Where the line through the two highest levels' margins reaches 1 (between one step
        and ``MAX_GROWTH`` times above ``lo``); twice ``lo`` without two margins to go by."""
        pts = [(t.level, t.margin) for t in sorted(self.tried, key=lambda t: t.level) if t.level <= lo]
        pts = [(x, m) for x, m in pts if m is not None][-2:]
        if len(pts) < 2 or pts[1][1] <= pts[0][1]:
            if len(pts) == 1 and pts[0][1] > 0:  # latency grows at most in proportion to the load beyond saturation
                return max(self._step(lo), lo * min(MAX_GROWTH, max(2.0, 1 / pts[0][1])))
            return max(self._step(lo), lo * (MAX_GROWTH if pts else 2.0))
        (x0, m0), (x1, m1) = pts
        x = x1 + (1 - m1) * (x1 - x0) / (m1 - m0)
        x = x if self.over != "concurrency" else math.ceil(x)
        return min(lo * MAX_GROWTH, max(self._step(lo), x))

    def _inside(self, lo: float, hi: float) -> float:
        """The next level inside an open bracket: where the margins' line crosses 1, or the
        smoothed shares' line the target; the middle after a probe that did not halve the bracket."""
        mid = self._fmt((lo + hi) / 2)
        if self._interpolated:
            plo, phi, was_mid = self._interpolated[-1]
            step = 1.0 if self.over == "concurrency" else 0.0
            if not was_mid and (hi - lo) > 0.5 * (phi - plo) + step:  # the last interpolation did not halve its bracket
                self._interpolated.append((lo, hi, True))
                return self._snap(mid, lo, hi)
        a, b = self._level(lo), self._level(hi)
        ma, mb = (a.margin if a else None), (b.margin if b else None)
        if ma is not None and mb is not None and 0 < ma < 1 < mb:
            # Half way between the lines through the margins and through their logarithms: a queue's
            # margin grows in proportion to the load, a saturated server's faster.
            x = lo + (hi - lo) * ((1 - ma) / (mb - ma) - math.log(ma) / math.log(mb / ma)) / 2
        else:
            order, _raw, fitted = self.fit()
            root = crossing([t.level for t in order], fitted, self.target)
            x = root if root is not None and lo < root < hi else (lo + hi) / 2
        nxt = self._snap(x, lo, hi)
        self._interpolated.append((lo, hi, False))
        return nxt

    def _snap(self, x: float, lo: float, hi: float) -> float:
        """``x`` as a level strictly inside (lo, hi): the nearest integer for concurrency, at
        least half a precision step from either end for a rate."""
        if self.over == "concurrency":
            c = float(round(x))
            return min(max(c, lo + 1), hi - 1)
        gap = self.precision * hi / 2
        return self._fmt(min(max(x, lo + gap), hi - gap))

    # ---- the summary --------------------------------------------------------------------------------

    def knee(self) -> Optional[float]:
        return self.bracket()[0]

    def summary(self, slos: dict[str, float]) -> dict[str, Any]:
        order, raw, fitted = self.fit()
        knee_level, upper = self.bracket()
        knee = self._level(knee_level) if knee_level is not None else None
        if knee is None:
            verdict = f"no level tried met the target (lowest tried: {min(t.level for t in self.tried):g})" \
                if self.tried else "no level was run"
        elif upper is None:
            verdict = f"every level up to the ceiling {self.ceiling:g} met the target: the capacity is at least that"
        else:
            verdict = f"capacity between {knee.level:g} (meets the target) and {upper:g} (misses it)"
        levels = [t.level for t in order]
        boundary = crossing(levels, fitted, self.target)
        ci = self.interval()
        beyond = self._level(upper) if upper is not None else (order[-1] if order else None)
        binding, binding_by = self._binding(beyond, knee)
        shape = self._shape(knee, self._level(upper) if upper is not None else None, dict(zip(levels, fitted)))
        fit_by_level = dict(zip(levels, fitted))
        rows = []
        phi, drift = self.spread()
        for t in self.tried:
            row = t.to_dict(self.over, phi, drift)
            row["smoothed_share"] = fit_by_level.get(t.level)
            rows.append(row)
        return {"over": self.over, "search": self.search, "slos_ms": dict(slos), "goodput_target": self.target,
                "ceiling": self.ceiling,
                "knee": knee.level if knee else None, "knee_interval": [knee.level if knee else None, upper],
                "boundary": boundary, "boundary_ci95": list(ci), "boundary_shape": shape,
                "binding_slo": binding, "binding_slo_margins": binding_by, "monotone": all(
                    raw[i] >= raw[i + 1] for i in range(len(raw) - 1)), "probes": self.probes,
                "dispersion": round(self.dispersion(), 4),
                "margin_drift": round(drift[0], 4) if drift is not None else None,
                "margin_drift_df": drift[1] if drift is not None else None,
                "replicated_levels": sum(1 for t in self.tried if len(t.runs) > 1),
                "verdict": verdict, "levels": rows}

    def _binding(self, lv: Optional[Level], knee: Optional[Level]) -> tuple[Optional[str], Optional[dict]]:
        """What binds at ``lv`` (the first level beyond the boundary, else the highest tried):
        ``errors`` when its failed requests alone miss the target, else the SLO with the largest
        margin there (at the knee when ``lv``'s margins fell on failed requests), else the SLO the
        fewest requests met."""
        if lv is None:
            return None, None
        good, sent = lv.counts
        failed = sum(r.get("failed") or 0 for r in lv.runs)
        if sent and failed / sent > 1 - self.target:
            return "errors", {"level": lv.level, "failed_share": failed / sent}
        for at in (lv, knee):
            margins = at.slo_margins() if at is not None else {}
            if at is not None and margins and all(v is not None for v in margins.values()):
                return max(margins, key=lambda k: margins[k] or 0.0), {"level": at.level, "margins": margins}
        shares = lv.slo_shares()
        if shares:
            return min(shares, key=lambda k: shares[k]), {"level": lv.level, "met": shares}
        return None, None

    def _shape(self, knee: Optional[Level], upper: Optional[Level], fitted: dict[float, float]) -> Optional[str]:
        """cliff or smooth, judged across a bracket within one step (5% for a rate); None when the
        bracket is wider than that (the curve between is not known). A cliff: the margin grows at
        least ``CLIFF_MARGIN``-fold and ``CLIFF_ELASTICITY`` times faster than the level (latency
        that jumps, not a queue that grows with the load), or the level beyond has requests failing
        where the one below had a margin; without margins, a smoothed share that falls by at least
        ``CLIFF_DROP``."""
        if knee is None or upper is None or not self._narrow(knee.level, upper.level):
            return None
        ma, mb = knee.margin, upper.margin
        if ma is not None and ma > 0:
            if mb is None:
                return "cliff"
            growth = math.log(mb / ma) / math.log(upper.level / knee.level) if mb > 0 else 0.0
            return "cliff" if mb / ma >= CLIFF_MARGIN and growth >= CLIFF_ELASTICITY else "smooth"
        return "cliff" if fitted[knee.level] - fitted[upper.level] >= CLIFF_DROP else "smooth"


def capacity_table(section: dict) -> list[str]:
    """The levels tried, in level order, as text rows (the CLI summary), then the boundary."""
    over = section["over"]
    rows = [f"SLO capacity over {over}: goodput target {section['goodput_target']:.0%} of requests meeting "
            + ", ".join(f"{k} <= {v:g} ms" for k, v in section["slos_ms"].items())
            + (f" ({section['search']} search, {section['probes']} runs)" if section.get("search") else ""),
            f"{over:>14} {'runs':>4} {'goodput':>8} {'smoothed':>8} {'margin':>7} {'req/s':>8} {'out tok/s':>10} "
            f"{'TTFT p99':>9} {'TPOT p99':>9} {'E2EL p99':>9}  result"]

    def cell(lat: dict, m: str) -> str:
        v = lat[m]["p99"]
        return f"{v:9.1f}" if isinstance(v, (int, float)) and not math.isnan(v) else f"{'-':>9}"

    def num(v: Any, fmt: str, width: int) -> str:
        return f"{v:{width}{fmt}}" if isinstance(v, (int, float)) else f"{'-':>{width}}"
    for lv in sorted(section["levels"], key=lambda x: x["level"]):
        lat = lv["latency_ms"]
        verdict = lv.get("verdict")
        result = "pass" if lv["passed"] else "FAIL"
        if verdict == "undecided":
            result += " (undecided)"
        rows.append(f"{lv['level']:>14g} {lv.get('repeats') or 1:>4} {lv['goodput_share']:>8.1%} "
                    f"{num(lv.get('smoothed_share'), '.1%', 8)} {num(lv.get('slo_margin'), '.2f', 7)} "
                    f"{lv['request_throughput'] or 0:>8.2f} {lv['output_throughput'] or 0:>10.1f} {cell(lat, 'ttft')} "
                    f"{cell(lat, 'tpot')} {cell(lat, 'e2el')}  {result}")
    rows.append(section["verdict"])
    rows += boundary_lines(section)
    rows += capacity_plot(section)
    if section.get("mode") == "ramp":  # the one-run ramp: its windows in time order, then the hold
        from engine.bench.ramp import ramp_lines
        rows += ramp_lines(section)
    return rows


def boundary_lines(section: dict) -> list[str]:
    """The boundary, its 95% interval, what binds and its shape, in words (nothing for a report
    written before these keys existed)."""
    if "boundary_ci95" not in section:
        return []
    over = section["over"]
    lo, hi = section["boundary_ci95"]
    b = section.get("boundary")
    low = f"{lo:g}" if lo is not None else "below the lowest level tried"
    high = f"{hi:g}" if hi is not None else "above the highest level tried"
    line = (f"boundary {b:.4g} {over} (smoothed goodput crosses the target); " if b is not None else "") + \
        f"95% interval [{low}, {high}]"
    if lo is None or hi is None:
        line += " (no level on that side had enough requests to decide)"
    rows = [line]
    # What the interval holds: the requests' sampling at the levels run, widened by the run-to-run
    # drift only where a level was run more than once. On an H100 two margin searches minutes apart,
    # every level run once, gave 153.4 [153, 154] and 145.8 [137, 164]: the drift was in neither.
    if section.get("replicated_levels") == 0:
        rows.append("interval: the requests' sampling at the levels run; no level was run twice, so a drift of the "
                    "server between runs is not in it (--repeats 2, more --capacity-steps or a second search "
                    "measures it)")
    elif section.get("margin_drift") is not None:
        rows.append(f"interval: the requests' sampling and the run-to-run drift of the SLO margin "
                    f"({math.expm1(section['margin_drift']):.1%} a run, from {section['replicated_levels']} level(s) "
                    f"run more than once, {section.get('margin_drift_df')} degrees of freedom)")
    elif section.get("replicated_levels"):
        rows.append(f"interval: widened by the run-to-run dispersion at the {section['replicated_levels']} level(s) "
                    f"run more than once (x{section.get('dispersion', 1.0):.2f} the binomial variance)")
    binding, by = section.get("binding_slo"), section.get("binding_slo_margins") or {}
    if binding == "errors":
        rows.append(f"binding: failed requests ({by.get('failed_share', 0):.0%} of those at {by.get('level', 0):g})")
    elif binding:
        detail = ", ".join(f"{k} {v:.2f}" for k, v in (by.get("margins") or {}).items() if v is not None)
        rows.append(f"binding SLO: {binding}" + (f" (SLO margins at {by['level']:g}: {detail})" if detail else ""))
    shape = section.get("boundary_shape")
    rows.append(f"boundary: {shape}" if shape else "boundary: smooth or cliff not known (the bracket is wider than one "
                "step)")
    if section.get("monotone") is False:
        rows.append("the goodput shares were not monotone in the level: the smoothed column pools the levels that "
                    "disagree (a noisy level, or an unstable server)")
    return rows


def capacity_plot(section: dict, width: int = 48, height: int = 8) -> list[str]:
    """Goodput share against the level as text: ``*`` a level's share, ``o`` its smoothed share
    where they differ, ``-`` the target, ``|`` the boundary (nothing for fewer than 2 levels, or a
    report without smoothed shares)."""
    levels = sorted(section["levels"], key=lambda x: x["level"])
    if len(levels) < 2 or any(lv.get("smoothed_share") is None for lv in levels):
        return []
    xs = [lv["level"] for lv in levels]
    log = xs[0] > 0 and xs[-1] / xs[0] >= 8  # doubled levels read better on a log axis
    a, b = (math.log(xs[0]), math.log(xs[-1])) if log else (xs[0], xs[-1])

    def col(x: float) -> int:
        v = math.log(x) if log else x
        return 0 if b == a else min(width - 1, max(0, round((v - a) / (b - a) * (width - 1))))

    def row(share: float) -> int:
        return min(height - 1, max(0, round((1 - share) * (height - 1))))
    grid = [[" "] * width for _ in range(height)]
    target_row = row(section["goodput_target"])
    grid[target_row] = ["-"] * width
    if section.get("boundary") is not None:
        c = col(section["boundary"])
        for r in range(height):
            grid[r][c] = "|"
    for lv in levels:
        grid[row(lv["smoothed_share"])][col(lv["level"])] = "o"
        grid[row(lv["goodput_share"])][col(lv["level"])] = "*"
    out = [f"goodput share by {section['over']} ({'log' if log else 'linear'} axis; * measured, o smoothed, "
           "- target, | boundary)"]
    for r, cells in enumerate(grid):
        share = section["goodput_target"] if r == target_row else 1 - r / (height - 1)
        label = f"{share:>4.0%}" if r in (0, height - 1, target_row) else "    "
        out.append(f"{label} {''.join(cells)}")
    out.append(f"     {xs[0]:<{width // 2}g}{xs[-1]:>{width - width // 2}g}")
    return out
