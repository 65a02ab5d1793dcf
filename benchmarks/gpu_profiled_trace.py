"""A real profiled serving trace from one GPU, and a Triton compare through the fork server; a table last.

1. ``magpie compare`` of the Triton softmax example (examples/kernels/softmax_triton/compare.yaml):
   its workers are forked from the compile server, so this checks that a GPU machine's workers run
   compiled Triton (the verdicts, and times in microseconds rather than an interpreter's seconds).
2. The profiled twin of a clean benchmark config (the one ``magpie optimize`` derives: the profiler
   with Python stacks, 64 steps, the inference-stage analysis and the gap analysis on, one repeat),
   run with ``magpie benchmark``; its trace is copied out in parts under 15 MiB (``cat`` them back
   together), with the events counted and the trace analysis timed on two cores of this machine.

Usage (repository root on the GPU machine; engine/ needs pydantic, msgspec, aiohttp, pyyaml,
prometheus-client and torch with Triton; no network):

    PYTHONPATH=. python3 benchmarks/gpu_profiled_trace.py RESULTS_DIR [--out DIR]
        [-b examples/optimize/builtin_1b_gpu_reference_attention.yaml]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_sessions import REPO, newest_run, run_cli  # noqa: E402

PART = 15 * 1024 * 1024


def compare_row(results: Path) -> dict:
    out = results / "compare"
    code, wall = run_cli(["compare", "-k", str(REPO / "examples/kernels/softmax_triton/compare.yaml"), "-o", str(out)], 300)
    summaries = sorted(out.rglob("summary.txt"), key=lambda p: p.stat().st_mtime)
    return {"exit": code, "wall_s": round(wall, 1), "summary": summaries[-1].read_text() if summaries else None}


def count_events(trace: Path) -> int:
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rb") as f:
        return len(json.load(f).get("traceEvents") or [])


def split_copy(trace: Path, dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    with open(trace, "rb") as f:
        i = 0
        while chunk := f.read(PART):
            name = f"{trace.name}.part{i:02d}"
            (dest / name).write_bytes(chunk)
            names.append(name)
            i += 1
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("-b", "--benchmark-config", default="examples/optimize/builtin_1b_gpu_reference_attention.yaml")
    ap.add_argument("--skip-compare", action="store_true")
    args = ap.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    if not args.skip_compare:
        summary["compare"] = compare_row(args.results)
        print(summary["compare"]["summary"], flush=True)

    from engine.loop.context import profiled_twin

    raw = yaml.safe_load((REPO / args.benchmark_config).read_text())
    twin = args.results / "profiled_twin.yaml"
    twin.write_text(yaml.safe_dump(profiled_twin(raw), sort_keys=False))
    out = args.results / "profiled"
    code, wall = run_cli(["benchmark", "-b", str(twin), "-o", str(out)], 420)
    ws = newest_run(out)
    traces = sorted(ws.rglob("*.pt.trace.json*")) if ws else []
    row: dict = {"exit": code, "wall_s": round(wall, 1), "run": ws.name if ws else None,
                 "traces": [(t.name, t.stat().st_size) for t in traces]}
    if traces:
        trace = max(traces, key=lambda t: t.stat().st_size)
        t0 = time.monotonic()
        row["events"] = count_events(trace)
        row["count_s"] = round(time.monotonic() - t0, 1)
        # The analysis on two cores of this machine, for scale (the figures that count are the CPU machine's).
        cmd = ["taskset", "-c", "0,1", sys.executable, "-m", "engine.cli", "benchmark", "--trace-dir", str(trace),
               "--gpu-arch", "H100", "-o", str(args.results / "analysis"), "--timings"]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        row["analysis"] = {"exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 2),
                           "timings": [ln for ln in proc.stdout.splitlines() + proc.stderr.splitlines() if " s" in ln][-30:]}
        if args.out:
            row["parts"] = split_copy(trace, args.out / "trace")
    if ws and args.out:
        dest = args.out / "profiled_run"
        dest.mkdir(parents=True, exist_ok=True)
        for f in ws.iterdir():
            if f.is_file() and f.stat().st_size < PART and ".pt.trace" not in f.name:
                shutil.copy(f, dest / f.name)
    summary["profiled"] = row
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_profiled_trace.json").write_text(json.dumps(summary, indent=1))
    print("\n| step | exit | wall s | detail |\n|---|---|---|---|")
    if "compare" in summary:
        c = summary["compare"]
        print(f"| triton compare | {c['exit']} | {c['wall_s']} | see its summary above |")
    print(f"| profiled run | {row['exit']} | {row['wall_s']} | {row.get('events')} events, {row['traces']} |")
    if "analysis" in row:
        print(f"| analysis (2 cores) | {row['analysis']['exit']} | {row['analysis']['wall_s']} | |")
    return 0 if row["exit"] == 0 and summary.get("compare", {}).get("exit", 0) in (0, 3) else 1


if __name__ == "__main__":
    sys.exit(main())
