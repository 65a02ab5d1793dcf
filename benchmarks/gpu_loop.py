"""The optimization loop on a GPU, in one call: ``magpie optimize`` on the built-in 1B server for
each op given, each loop in its own process group with a timeout, then a table last.

Usage (repository root on the GPU machine; engine/ needs pydantic, msgspec, aiohttp, pyyaml,
prometheus-client and torch with Triton; no network):

    PYTHONPATH=. python3 benchmarks/gpu_loop.py RESULTS_DIR [--kernels attention,decode_attention]
        [-b examples/optimize/builtin_1b_gpu.yaml] [--budget S] [--out DIR]

Per loop it prints the chain (``magpie optimize --status``) and the verdict; with ``--out`` it copies
each loop's small files (loop.json, reports, bottleneck tables, the harness, the verdict; no traces)
there. The table: the op, the exit code (0 proven gain, 3 no proven gain, 1 a step failed), the
baseline's output tok/s, the winner and its kernel speedup, the end-to-end output-throughput
change with its verdict, and each step's wall time.
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

REPO = Path(__file__).resolve().parents[1]
SMALL = (".json", ".yaml", ".txt", ".py", ".csv", ".jsonl", ".md")


def run_loop(results: Path, config: str, op: str, timeout: float) -> tuple[int, Path | None, float]:
    before = set(results.glob("loop_*"))
    cmd = [sys.executable, "-m", "engine.cli", "optimize", "-b", config, "--kernel", op, "-o", str(results)]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # the loop writes its state and reports on SIGINT
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    wall = time.monotonic() - t0
    new = sorted(set(results.glob("loop_*")) - before)
    return code, (new[-1] if new else None), wall


def summarise(loop_dir: Path) -> dict:
    data = json.loads((loop_dir / "loop.json").read_text())
    steps = {s["name"]: s for s in data["steps"]}
    row: dict = {"steps": {n: (round(s["finished"] - s["started"], 1) if s.get("started") and s.get("finished") else None,
                               s["state"]) for n, s in steps.items()}}
    base = steps["baseline"].get("result", {}).get("metrics", {})
    row["baseline_tok_s"] = (base.get("output_throughput") or {}).get("mean") if isinstance(
        base.get("output_throughput"), dict) else base.get("output_throughput")
    cand = steps["candidates"].get("result", {})
    row["winner"] = cand.get("winner")
    row["speedup"], row["ci95"] = cand.get("speedup"), cand.get("ci95")
    row["stopped"] = cand.get("stopped")
    verdict = loop_dir / "verdict" / "verdict.json"
    if verdict.exists():
        v = json.loads(verdict.read_text())
        row["message"] = v.get("message")
        prim = next((r for r in v.get("end_to_end", []) if r["metric"] == "output_throughput"), None)
        row["e2e"] = prim
    return row


def copy_small(loop_dir: Path, out: Path) -> None:
    for p in loop_dir.rglob("*"):
        if p.is_file() and p.suffix in SMALL and "torch_trace" not in p.parts and p.stat().st_size < 5_000_000:
            dest = out / loop_dir.name / p.relative_to(loop_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("-b", "--config", default="examples/optimize/builtin_1b_gpu.yaml")
    ap.add_argument("--kernels", default="attention,decode_attention")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all loops together")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    ops = [k for k in args.kernels.split(",") if k]
    deadline = time.monotonic() + args.budget
    rows = []
    for i, op in enumerate(ops):
        left = deadline - time.monotonic()
        timeout = left / (len(ops) - i)
        code, loop_dir, wall = run_loop(results, args.config, op, timeout)
        row = {"op": op, "code": code, "wall_s": round(wall, 1)}
        if loop_dir and (loop_dir / "loop.json").exists():
            subprocess.run([sys.executable, "-m", "engine.cli", "optimize", "--status", str(loop_dir)], cwd=REPO)
            summary = loop_dir / "verdict" / "summary.txt"
            if summary.exists():
                print(summary.read_text())
            row.update(summarise(loop_dir))
            if args.out:
                copy_small(loop_dir, Path(args.out))
        rows.append(row)
    if args.out:
        Path(args.out, "gpu_loop.json").write_text(json.dumps(rows, indent=1, default=str))
    print("\n| op | exit | baseline tok/s | winner | kernel speedup [95% CI] | e2e output tok/s | verdict | wall |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ci = r.get("ci95") or [None, None]
        sp = f"{r['speedup']:.3f}x" if r.get("speedup") else "-"
        if ci[0] is not None:
            sp += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
        e2e = r.get("e2e")
        e2e_s = (f"{e2e['baseline_mean']:.0f} -> {e2e['new_mean']:.0f} ({e2e['delta_pct']:+.1f}%, {e2e['verdict']})"
                 if e2e else "-")
        base = f"{r['baseline_tok_s']:.0f}" if isinstance(r.get("baseline_tok_s"), (int, float)) else "-"
        steps = ", ".join(f"{n} {t}s" for n, (t, st) in r.get("steps", {}).items() if t is not None)
        print(f"| {r['op']} | {r['code']} | {base} | {r.get('winner') or '-'} | {sp} | {e2e_s} | "
              f"{r.get('message') or r.get('stopped') or '-'} | {r['wall_s']} s ({steps}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
