"""The capacity search's two searches (``engine.bench.capacity``) on many simulated servers: the
probes each uses, and whether the interval it reports holds the true boundary.

A simulated server has two SLOs (TTFT and TPOT). At concurrency c each request's latency over its
limit is median_k(c) * exp(sigma_k * Z) per SLO, and the median grows with the load: TTFT once the
server saturates (a queue: 1 + g * (c/s - 1)^e above s slots), TPOT slowly from the start. A
"cliff" server also multiplies both by J (3-8x) above a load C, and may fail some of those
requests (preemption, time-outs). Each run (probe) draws its own run-wide factor exp(tau * N)
(run-to-run noise: 0, 5% or 15%) and then its requests; it is judged as the workbench judges a
run: goodput share, SLO margins at the target quantile (``metrics.slo_margins``), requests meeting
each SLO. The true boundary is the highest concurrency (continuous) whose expected goodput share
reaches the target, the binding SLO the one fewest requests meet just above it.

Per group of servers and search it prints: mean probes (runs), how often the knee is the true one
(the floor of the boundary), how often the reported interval holds the true boundary (coverage),
the interval's median width (over the boundary), how often the binding SLO and the shape (smooth or cliff)
are right. ``bisect`` reports [knee, first failing level] today; ``bisect+ci`` is the same search
read through the new summary (its interval from the Wilson rule); ``bisect x3`` runs every level
three times; ``margin`` is the margin-guided search with replicates.

    python benchmarks/capacity_search.py [--servers 300] [--requests 100] [--target 0.9]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench.capacity import CapacitySearch  # noqa: E402
from engine.bench.metrics import slo_margins  # noqa: E402

CEILING = 1024
GH_X, GH_W = np.polynomial.hermite_e.hermegauss(24)  # E over the run-wide factor
GH_W = GH_W / GH_W.sum()


def _ndtr(x: np.ndarray) -> np.ndarray:
    """The standard normal's CDF, element by element."""
    return np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])


@dataclass
class Server:
    cliff: bool
    slots: float
    r0: tuple[float, float]  # (ttft, tpot) median ratio at no load
    g: float
    e: float
    h: float
    sigma: tuple[float, float]
    cliff_at: float
    jump: float
    fail: float
    tau: float

    def medians(self, c: float) -> tuple[float, float]:
        over = max(0.0, c / self.slots - 1.0)
        ttft = self.r0[0] * (1 + self.g * over ** self.e)
        tpot = self.r0[1] * (1 + self.h * c / self.slots)
        if self.cliff and c > self.cliff_at:
            ttft, tpot = ttft * self.jump, tpot * self.jump
        return ttft, tpot

    def fail_rate(self, c: float) -> float:
        return self.fail if self.cliff and c > self.cliff_at else 0.0

    def shares(self, c: float) -> tuple[float, float, float]:
        """Expected share meeting every SLO, TTFT and TPOT (over the run-wide factor)."""
        m = self.medians(c)
        p = [_ndtr(-(math.log(mk) + self.tau * GH_X) / sk) for mk, sk in zip(m, self.sigma)]
        ok = 1 - self.fail_rate(c)
        return float(GH_W @ (p[0] * p[1])) * ok, float(GH_W @ p[0]) * ok, float(GH_W @ p[1]) * ok

    def boundary(self, target: float) -> float:
        lo, hi = 0.0, float(CEILING)
        if self.cliff and self.shares(self.cliff_at)[0] >= target > self.shares(self.cliff_at + 1e-6)[0]:
            return self.cliff_at
        for _ in range(45):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.shares(mid)[0] >= target else (lo, mid)
        return lo

    def run(self, c: float, n: int, target: float, rng: np.random.Generator) -> dict:
        eps = self.tau * rng.standard_normal()
        failed = int(rng.binomial(n, self.fail_rate(c)))
        ok = n - failed
        ratios = {k: m * np.exp(eps + s * rng.standard_normal(ok))
                  for k, m, s in zip(("ttft", "tpot"), self.medians(c), self.sigma)}
        good = int(np.sum((ratios["ttft"] <= 1) & (ratios["tpot"] <= 1)))
        margin, per_slo, met = slo_margins(ratios, failed, target)
        return {"completed": ok, "failed": failed, "duration": 1.0, "request_goodput": float(good),
                "slo_margin": margin, "slo_margins": per_slo, "goodput_slo_met": met}


def random_server(rng: np.random.Generator, cliff: bool, tau: float, target: float) -> tuple[Server, float]:
    while True:
        s = Server(cliff=cliff, slots=float(math.exp(rng.uniform(math.log(2), math.log(300)))),
                   r0=(rng.uniform(0.15, 0.5), rng.uniform(0.2, 0.5)), g=rng.uniform(1, 6), e=rng.uniform(1, 2),
                   h=rng.uniform(0.05, 0.6), sigma=(rng.uniform(0.1, 0.4), rng.uniform(0.05, 0.2)),
                   cliff_at=0.0, jump=rng.uniform(3, 8), fail=float(rng.choice([0.0, 0.2])), tau=tau)
        s.cliff_at = float(math.floor(s.slots * rng.uniform(0.8, 2.0))) + 0.5 * (rng.random() < 0.3)
        b = s.boundary(target)
        if 2 <= b <= CEILING / 2 and (not cliff or b == s.cliff_at):
            return s, b


def truth_binding(s: Server, b: float, target: float) -> str:
    """What binds just above the boundary: failed requests when they alone miss the target, else
    the SLO whose own latency ratio at the target quantile is the larger."""
    c = math.floor(b) + 1
    if s.fail_rate(c) > 1 - target:
        return "errors"
    z = statistics.NormalDist().inv_cdf(target)
    m = s.medians(c)
    return "ttft" if math.log(m[0]) + s.sigma[0] * z >= math.log(m[1]) + s.sigma[1] * z else "tpot"


def search_once(s: Server, style: str, repeats: int, requests: int, target: float, seed: int,
                max_steps: int) -> dict:
    rng = np.random.default_rng(seed)
    search = CapacitySearch(over="concurrency", target=target, ceiling=CEILING, max_steps=max_steps, search=style)
    runs = 0
    while (level := search.next_level()) is not None:
        search.record(level, [s.run(level, requests, target, rng) for _ in range(repeats)])
        runs += repeats
    summary = search.summary({"ttft": 1.0, "tpot": 1.0})
    summary["runs"] = runs
    return summary


def score(rows: list[tuple[dict, float, Server]], interval_key: str, target: float) -> dict:
    holds, widths, knee_ok, bind_ok, shape_ok, probes = [], [], [], [], [], []
    for summary, b, s in rows:
        lo, hi = summary[interval_key]
        lo = 0.0 if lo is None else lo
        hi = math.inf if hi is None else hi
        holds.append(lo <= b <= hi)
        widths.append((hi - lo) / b)
        knee_ok.append(summary["knee"] == math.floor(b))
        bind_ok.append(summary["binding_slo"] == truth_binding(s, b, target))
        shape_ok.append(summary["boundary_shape"] == ("cliff" if s.cliff else "smooth"))
        probes.append(summary["runs"])
    n = len(rows)
    return {"probes": sum(probes) / n, "knee": sum(knee_ok) / n, "cover": sum(holds) / n,
            "width": statistics.median(widths), "binding": sum(bind_ok) / n, "shape": sum(shape_ok) / n}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=300, help="random servers per group")
    ap.add_argument("--requests", type=int, default=100, help="requests a run")
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--budgets", default="10,20", help="most runs a search may take (capacity_steps), comma-separated")
    args = ap.parse_args(argv)
    styles = [("bisect", "bisect", 1, "knee_interval"), ("bisect+ci", "bisect", 1, "boundary_ci95"),
              ("bisect x3", "bisect", 3, "knee_interval"), ("margin", "margin", 1, "boundary_ci95")]
    table = []
    budgets = [int(b) for b in args.budgets.split(",")]
    for cliff in (False, True):
        for tau in (0.0, 0.05, 0.15):
            rng = np.random.default_rng(1000 * cliff + int(tau * 100))
            servers = [random_server(rng, cliff, tau, args.target) for _ in range(args.servers)]
            group = f"{'cliff' if cliff else 'smooth'} noise {tau:.0%}"
            for budget in budgets:
                cache: dict[tuple[str, int], list] = {}
                for name, style, repeats, key in styles:
                    if (style, repeats) not in cache:
                        cache[(style, repeats)] = [
                            (search_once(s, style, repeats, args.requests, args.target, 7 + i, budget), b, s)
                            for i, (s, b) in enumerate(servers)]
                    table.append((group, budget, name, score(cache[(style, repeats)], key, args.target)))
    print(f"{args.servers} random servers a group, {args.requests} requests a run, goodput target "
          f"{args.target:.0%}; budget: the most levels a search may take (bisect x3: three runs each); covers: "
          "the reported interval holds the true boundary")
    print(f"{'servers':18} {'budget':>6} {'search':10} {'runs':>6} {'knee ok':>8} {'covers':>7} {'width':>7} {'binding':>8} "
          f"{'shape':>6}")
    for group, budget, name, r in table:
        print(f"{group:18} {budget:6d} {name:10} {r['probes']:6.1f} {r['knee']:8.0%} {r['cover']:7.0%} {r['width']:7.1%} "
              f"{r['binding']:8.0%} {r['shape']:6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
