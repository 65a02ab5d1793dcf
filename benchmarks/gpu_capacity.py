"""Capacity search on a real server: the margin search against bisection (and the one-run ramp) on
the same built-in server, started once, searches interleaved, a table last.

1. Calibration: a short run at a few concurrencies gives TPOT and TTFT p99; the SLOs are set from
   them so that the boundary falls inside the range searched (``--tpot-at``: the concurrency whose
   interpolated TPOT p99 becomes the TPOT limit; TTFT gets a limit twice its p99 there).
2. ``magpie benchmark --find-capacity tpot:X ttft:Y`` with ``--capacity-search margin`` and
   ``bisect`` alternately (``--rounds`` pairs), then one ``--capacity-mode ramp``, until the budget.
   Each search: probes (runs), the boundary, its 95% interval and width, the binding SLO, the shape.

Usage (repository root on the GPU machine; see gpu_serving.py for what engine/ needs):

    PYTHONPATH=. python3 benchmarks/gpu_capacity.py RESULTS_DIR [--size 1b] [--max-batch 64]
        [--tpot-at 40] [--rounds 2 | --plan margin,margin,margin] [--budget 500] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_serving import load_report, run_cli, say, stat, workspace  # noqa: E402
from gpu_serving_ab import REPO, Server  # noqa: E402

LOAD = ["--input-len", "512", "--output-len", "64", "--range-ratio", "1"]


def p99(report: dict, metric: str) -> float | None:
    s = stat(report, f"p99_{metric}_ms")
    return s and s["mean"]


def interpolate(points: list[tuple[int, float]], at: float) -> float:
    points = sorted(points)
    for (c0, v0), (c1, v1) in zip(points, points[1:]):
        if c0 <= at <= c1:
            return v0 + (v1 - v0) * (at - c0) / (c1 - c0)
    return points[-1][1] if at > points[-1][0] else points[0][1]


def levels(cap: dict) -> list[tuple[float, float]]:
    return [(lv["level"], round(lv["goodput_share"], 3)) for lv in sorted(cap.get("levels") or [], key=lambda x: x["level"])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--size", default="1b")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--calibrate", default="8,24,48,96")
    ap.add_argument("--tpot-at", type=float, default=40.0)
    ap.add_argument("--num-prompts", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--plan", help="the searches in order, comma-separated (margin, bisect, ramp); default: "
                    "--rounds pairs of margin and bisect with the ramp after the first pair")
    ap.add_argument("--steps", type=int, help="--capacity-steps of each search (default: the tool's)")
    ap.add_argument("--budget", type=float, default=500.0, help="seconds; no search starts past it")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    args.results.mkdir(parents=True, exist_ok=True)
    config = args.results / "builtin.yaml"
    config.write_text(f"benchmark:\n  framework: builtin\n  server: {{size: {args.size}, max_batch: {args.max_batch}}}\n")
    server = Server("builtin", REPO, [], args.size, args.max_batch)
    cal: list[dict[str, Any]] = []
    searches: list[dict[str, Any]] = []
    try:
        server.ready.wait(300)
        if server.url is None:
            raise SystemExit(f"the server did not start (exit {server.proc.poll()})")
        say(f"server ready after {time.monotonic() - t0:.0f} s")
        for conc in (int(c) for c in args.calibrate.split(",")):
            out = args.results / f"cal_c{conc}"
            rc, wall = run_cli(f"calibrate c{conc}", ["benchmark", "-b", str(config), "--base-url", server.url,
                                                      "--concurrency", str(conc), "--num-prompts", str(2 * conc), *LOAD,
                                                      "--warmup", str(conc), "--repeats", "1", "-o", str(out)], 120)
            report = load_report(workspace(out))
            cal.append({"conc": conc, "rc": rc, "tpot_p99": p99(report, "tpot"), "ttft_p99": p99(report, "ttft")})
            say(f"calibration {cal[-1]}")
        ok = [c for c in cal if c["tpot_p99"] and c["ttft_p99"]]
        if len(ok) < 2:
            raise SystemExit(f"calibration failed: {cal}")
        tpot = round(interpolate([(c["conc"], c["tpot_p99"]) for c in ok], args.tpot_at), 2)
        ttft = round(2 * interpolate([(c["conc"], c["ttft_p99"]) for c in ok], args.tpot_at), 1)
        say(f"SLOs: tpot <= {tpot} ms, ttft <= {ttft} ms (from the calibration at concurrency {args.tpot_at:g})")
        if args.plan:
            plan = args.plan.split(",")
        else:
            plan = [m for _ in range(args.rounds) for m in ("margin", "bisect")]
            plan.insert(2, "ramp")
        for i, how in enumerate(plan):
            if time.monotonic() - t0 > args.budget:
                say(f"budget {args.budget:.0f} s reached before {how} #{i}")
                break
            out = args.results / f"{i:02d}_{how}"
            mode = ["--capacity-mode", "ramp", "--ramp-window", "6", "--ramp-hold", "12"] if how == "ramp" else \
                ["--capacity-search", how]
            if args.steps:
                mode += ["--capacity-steps", str(args.steps)]
            rc, wall = run_cli(f"{how} #{i}", ["benchmark", "-b", str(config), "--base-url", server.url,
                                               "--find-capacity", f"tpot:{tpot}", f"ttft:{ttft}", "--capacity-max", "256",
                                               *mode, "--num-prompts", str(args.num_prompts), *LOAD, "--warmup", "8",
                                               "--repeats", "1", "-o", str(out)], 300)
            ws = workspace(out)
            cap = (load_report(ws).get("capacity") or {}) if ws else {}
            lo, hi = (cap.get("boundary_ci95") or [None, None])[:2]
            searches.append({"search": how, "rc": rc, "wall_s": round(wall, 1), "probes": cap.get("probes"),
                             "boundary": cap.get("boundary"), "ci95": [lo, hi],
                             "width": (hi - lo) / cap["boundary"] if cap.get("boundary") and lo is not None and hi is not None
                             else None, "binding": cap.get("binding_slo"), "shape": cap.get("boundary_shape"),
                             "knee": cap.get("knee"), "levels": levels(cap), "replicated": cap.get("replicated_levels"),
                             "drift": cap.get("margin_drift"), "dispersion": cap.get("dispersion")})
            say(f"search {searches[-1]}")
            if args.out and ws:
                dest = args.out / out.name
                dest.mkdir(parents=True, exist_ok=True)
                for f in ("benchmark_report.json", "summary.txt"):
                    if (ws / f).exists():
                        shutil.copy(ws / f, dest / f)
    finally:
        server.stop()
    result = {"calibration": cal, "slos_ms": {"tpot": tpot, "ttft": ttft}, "searches": searches}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_capacity.json").write_text(json.dumps(result, indent=1))
    print("\n| search | exit | wall s | runs | boundary | 95% interval | width | binds | shape | run twice | margin drift "
          "| levels (goodput) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in searches:
        lo, hi = s["ci95"]
        print(f"| {s['search']} | {s['rc']} | {s['wall_s']} | {s['probes']} | {s['boundary']} | {lo}-{hi} | "
              f"{'-' if s['width'] is None else format(s['width'], '.1%')} | {s['binding']} | {s['shape']} | "
              f"{s.get('replicated')} | {s.get('drift')} | {s['levels']} |")
    print(f"calibration: {cal}")
    return 0 if searches and all(s["rc"] == 0 for s in searches) else 1


if __name__ == "__main__":
    sys.exit(main())
