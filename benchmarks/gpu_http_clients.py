"""The load generator's two HTTP clients end to end on a GPU: the same clean `magpie benchmark` of
the built-in ~1B server, once reading through aiohttp and once through the lean client (the
default), then `magpie benchmark --compare-reports` on the two (per-metric deltas, and which lie
inside the run-to-run noise of the repeats).

Usage (repository root, on the GPU machine; engine/ needs pydantic and msgspec, not textual):

    PYTHONPATH=. python3 benchmarks/gpu_http_clients.py RESULTS_DIR [--config YAML] [--args "FLAGS"]
        [--out DIR]

Each run is `python -m engine.cli benchmark -b CONFIG --http-client C ARGS -o RESULTS_DIR/C`. With
`--out` (default `$OUT` when set) both reports and the comparison are copied there. Printed last:
the comparison table of our CLI.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

CONFIG = "examples/benchmarks/builtin_1b_gpu.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--args", default="--num-prompts 160", help="CLI flags for both runs")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args(argv)
    workspaces: dict[str, Path] = {}
    for client in ("aiohttp", "lean"):
        out = args.results / client
        cmd = [sys.executable, "-m", "engine.cli", "benchmark", "-b", args.config, "--http-client", client,
               *shlex.split(args.args), "-o", str(out)]
        print("$ " + " ".join(cmd), flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(cmd).returncode
        print(f"{client}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
        found = sorted(p for p in out.glob("*") if (p / "benchmark_report.json").exists())
        if not found:
            print(f"{client}: no report written", flush=True)
            return 1
        workspaces[client] = found[-1]
    compare = subprocess.run([sys.executable, "-m", "engine.cli", "benchmark", "--compare-reports",
                              str(workspaces["aiohttp"]), str(workspaces["lean"])], capture_output=True, text=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for client, ws in workspaces.items():
            shutil.copy(ws / "benchmark_report.json", args.out / f"{client}_benchmark_report.json")
            shutil.copy(ws / "summary.txt", args.out / f"{client}_summary.txt")
        (args.out / "compare.txt").write_text(compare.stdout + compare.stderr)
    print("\n== the same clean run, aiohttp (A) then the lean client (B) ==")
    print(compare.stdout + compare.stderr, flush=True)
    return compare.returncode


if __name__ == "__main__":
    sys.exit(main())
