"""Session replay and a short profiled run of the built-in 1B server on one GPU, then a table last.

1. The same synthetic sessions (a shared system prompt, each turn's new tokens on top of the whole
   conversation so far) replayed twice against the built-in 1B server: with its prefix cache on
   (the default) and started with ``--no-enable-prefix-caching``. The table gives the cached prompt
   tokens, the server's hit rate from ``/metrics``, fresh vs reused prompt-token throughput, TTFT by
   turn and output tok/s.
2. With ``--trace``: a short profiled run (few steps) whose trace and analysis are copied out: its
   kernels are the built-in server's own, so they resolve to source files in this repository.

Usage (repository root on the GPU machine; engine/ needs pydantic, msgspec, aiohttp, pyyaml,
prometheus-client and torch with Triton; no network):

    PYTHONPATH=. python3 benchmarks/gpu_sessions.py RESULTS_DIR [--out DIR] [--trace]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

SESSION_ARGS = ["--dataset-name", "sessions", "--num-sessions", "48", "--session-turns", "6",
                "--system-prompt-len", "1024", "--input-len", "128", "--output-len", "64",
                "--concurrency", "16", "--warmup", "2", "--repeats", "2"]


def run_cli(argv: list[str], timeout: float) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "engine.cli", *argv]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # the run writes its report on SIGINT
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    return code, time.monotonic() - t0


def newest_run(results: Path) -> Path | None:
    found = sorted(results.glob("benchmark_*"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def config_file(results: Path, name: str, *, prefix_caching: bool = True, profiled: bool = False) -> Path:
    bench = yaml.safe_load((REPO / "examples/benchmarks/builtin_1b_gpu.yaml").read_text())["benchmark"]
    bench["server"]["prefix_caching"] = prefix_caching
    if profiled:
        bench["envs"] = {"CONC": 8, "ISL": 512, "OSL": 32, "NUM_PROMPTS": 32, "RANDOM_RANGE_RATIO": 1}
        bench["client"] = {"warmup": 2, "repeats": 1}
        bench["profiler"] = {"torch_profiler": {"enabled": True, "num_steps": 12},
                             "tracelens": {"enabled": True, "analysis_mode": "inference", "analysis_stages": "all",
                                           "export_format": "csv"}}
    path = results / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"benchmark": bench}, sort_keys=False))
    return path


def sessions_section(report: dict) -> dict:
    """The first ``sessions`` section in the report (a point's repeat, or the aggregate)."""
    stack = [report]
    while stack:
        node = stack.pop(0)
        if isinstance(node, dict):
            if isinstance(node.get("sessions"), dict) and "sessions_completed" in node["sessions"]:
                return node["sessions"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return {}


def metric(report: dict, key: str) -> float | None:
    stack = [report]
    while stack:
        node = stack.pop(0)
        if isinstance(node, dict):
            if key in node:
                v = node[key]
                return v.get("mean") if isinstance(v, dict) else v
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--trace", action="store_true", help="also a short profiled run for its trace")
    args = ap.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, caching in (("cache_on", True), ("cache_off", False)):
        cfg = config_file(args.results, name, prefix_caching=caching)
        out = args.results / name
        code, wall = run_cli(["benchmark", "-b", str(cfg), "-o", str(out), *SESSION_ARGS], 240)
        ws = newest_run(out)
        report = json.loads((ws / "benchmark_report.json").read_text()) if ws and (ws / "benchmark_report.json").exists() else {}
        s = sessions_section(report)
        pc = s.get("server_prefix_cache") or {}
        rows.append({"run": name, "exit": code, "wall_s": round(wall, 1),
                     "sessions": f"{s.get('sessions_completed')}/{s.get('sessions')}",
                     "cached": s.get("cached_prompt_tokens"), "prompt": s.get("prompt_tokens"), "share": s.get("cached_share"),
                     "hit_rate": pc.get("hit_rate"), "fresh_tok_s": s.get("fresh_prompt_throughput"),
                     "reused_tok_s": s.get("reused_prompt_throughput"),
                     "ttft_by_turn": {k: v["ttft"]["median_ms"] for k, v in (s.get("ttft_by_turn") or {}).items()},
                     "output_tok_s": metric(report, "output_throughput")})
        if ws and args.out:
            dest = args.out / name
            dest.mkdir(parents=True, exist_ok=True)
            for f in ("benchmark_report.json", "summary.txt", "config.yaml", "events.jsonl", "server.log"):
                if (ws / f).exists():
                    shutil.copy(ws / f, dest / f)
    trace_row = None
    if args.trace:
        cfg = config_file(args.results, "profiled", profiled=True)
        out = args.results / "profiled"
        code, wall = run_cli(["benchmark", "-b", str(cfg), "-o", str(out)], 300)
        ws = newest_run(out)
        traces = sorted(ws.rglob("*.pt.trace.json*")) if ws else []
        trace_row = {"exit": code, "wall_s": round(wall, 1), "run": ws.name if ws else None,
                     "traces": [(t.name, t.stat().st_size) for t in traces]}
        if ws and args.out:
            shutil.copytree(ws, args.out / "profiled" / ws.name, dirs_exist_ok=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_sessions.json").write_text(json.dumps({"rows": rows, "trace": trace_row}, indent=1))
    print("\n| run | exit | wall s | sessions | cached / prompt tokens | share | hit rate | fresh tok/s | "
          "reused tok/s | out tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    for r in rows:
        print(f"| {r['run']} | {r['exit']} | {r['wall_s']} | {r['sessions']} | {r['cached']} / {r['prompt']} | "
              f"{f(r['share'], '.1%')} | {f(r['hit_rate'], '.1%')} | {f(r['fresh_tok_s'])} | {f(r['reused_tok_s'])} | "
              f"{f(r['output_tok_s'])} |")
    for r in rows:
        print(f"{r['run']} TTFT median by turn (ms): {r['ttft_by_turn']}")
    if trace_row:
        print(f"profiled: {trace_row}")
    return 0 if all(r["exit"] == 0 for r in rows) and (trace_row is None or trace_row["exit"] == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
