"""SLO capacity search: the highest load (concurrency, or request rate) at which the share of
requests meeting every SLO (goodput, vLLM's definition: TTFT, TPOT and E2EL each at or under its
limit in ms) reaches a target, e.g. 90%.

The search doubles the level from the start (concurrency 1, or 1 request/s) until a level fails
or the ceiling is reached, then bisects between the highest level that passed and the lowest
that failed: concurrency until the two are adjacent integers, request rate until they are within
5% of each other, and never more than `max_steps` levels in all. A level passes when the mean
goodput share over its repeats reaches the target. The knee is the highest passing level; its
interval is [knee, lowest failing level above it] (the capacity lies in between), and each level
carries the 95% t-interval of its goodput share over the repeats (with 3 or more repeats).

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


def goodput_share(result: dict) -> float:
    """Requests meeting every SLO over all requests sent (failed ones count as missing it)."""
    sent = (result.get("completed") or 0) + (result.get("failed") or 0)
    if not sent:
        return 0.0
    good = (result.get("request_goodput") or 0.0) * (result.get("duration") or 0.0)
    return min(1.0, round(good) / sent)


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

    def to_dict(self, over: str) -> dict[str, Any]:
        first = self.runs[0] if self.runs else {}

        def mean(key: str) -> Optional[float]:
            vals = [r[key] for r in self.runs if isinstance(r.get(key), (int, float))]
            return sum(vals) / len(vals) if vals else None
        shares = [{"goodput_share": goodput_share(r)} for r in self.runs]
        agg = aggregate_repeats(shares)["goodput_share"] if len(self.runs) > 1 else None
        return {"level": self.level, "over": over, "passed": self.passed, "goodput_share": self.share,
                "goodput_share_ci95": agg["ci95"] if agg else None,
                "repeats": len(self.runs), "request_throughput": mean("request_throughput"),
                "output_throughput": mean("output_throughput"), "request_goodput": mean("request_goodput"),
                "latency_ms": {m: {p: mean(f"{p}_{m}_ms") for p in ("mean", "median", "p90", "p99")}
                               for m in ("ttft", "tpot", "e2el")},
                "completed": sum(r.get("completed") or 0 for r in self.runs),
                "failed": sum(r.get("failed") or 0 for r in self.runs),
                "errors": first.get("errors", [])}


@dataclass
class CapacitySearch:
    """Which level to try next, given the levels tried so far (pure logic: the caller runs them)."""

    over: str = "concurrency"
    target: float = 0.9
    ceiling: float = DEFAULT_CEILING
    max_steps: int = 10
    start: float = 1.0
    tried: list[Level] = field(default_factory=list)

    def _fmt(self, x: float) -> float:
        return float(int(x)) if self.over == "concurrency" else round(x, 3)

    def next_level(self) -> Optional[float]:
        if len(self.tried) >= self.max_steps:
            return None
        if not self.tried:
            return self._fmt(min(self.start, self.ceiling))
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
        lv = Level(level, runs, self.target)
        self.tried.append(lv)
        return lv

    def summary(self, slos: dict[str, float]) -> dict[str, Any]:
        passed = [t for t in self.tried if t.passed]
        knee = max(passed, key=lambda t: t.level) if passed else None
        above = [t.level for t in self.tried if not t.passed and (knee is None or t.level > knee.level)]
        upper = min(above) if above else None
        if knee is None:
            verdict = f"no level tried met the target (lowest tried: {min(t.level for t in self.tried):g})" \
                if self.tried else "no level was run"
        elif upper is None:
            verdict = f"every level up to the ceiling {self.ceiling:g} met the target: the capacity is at least that"
        else:
            verdict = f"capacity between {knee.level:g} (meets the target) and {upper:g} (misses it)"
        return {"over": self.over, "slos_ms": dict(slos), "goodput_target": self.target, "ceiling": self.ceiling,
                "knee": knee.level if knee else None, "knee_interval": [knee.level if knee else None, upper],
                "verdict": verdict,
                "levels": [t.to_dict(self.over) for t in self.tried]}


def capacity_table(section: dict) -> list[str]:
    """The levels tried, in level order, as text rows (the CLI summary)."""
    over = section["over"]
    rows = [f"SLO capacity over {over}: goodput target {section['goodput_target']:.0%} of requests meeting "
            + ", ".join(f"{k} <= {v:g} ms" for k, v in section["slos_ms"].items()),
            f"{over:>14} {'goodput':>8} {'req/s':>8} {'out tok/s':>10} {'TTFT p99':>9} {'TPOT p99':>9} "
            f"{'E2EL p99':>9}  result"]
    def cell(lat: dict, m: str) -> str:
        v = lat[m]["p99"]
        return f"{v:9.1f}" if isinstance(v, (int, float)) and not math.isnan(v) else f"{'-':>9}"
    for lv in sorted(section["levels"], key=lambda x: x["level"]):
        lat = lv["latency_ms"]
        rows.append(f"{lv['level']:>14g} {lv['goodput_share']:>8.1%} {lv['request_throughput'] or 0:>8.2f} "
                    f"{lv['output_throughput'] or 0:>10.1f} {cell(lat, 'ttft')} {cell(lat, 'tpot')} {cell(lat, 'e2el')}  "
                    f"{'pass' if lv['passed'] else 'FAIL'}")
    rows.append(section["verdict"])
    if section.get("mode") == "ramp":  # the one-run ramp: its windows in time order, then the hold
        from engine.bench.ramp import ramp_lines
        rows += ramp_lines(section)
    return rows
