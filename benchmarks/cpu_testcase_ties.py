"""Ties of testcase-timed kernels: two identical builds of one testcase, compared N times.

The kernels time themselves (their testcase prints ``MAGPIE_TIMING_JSON: {"samples_ms": [...]}``),
so the right verdict is always "tie". This copies examples/kernels/cpp_testcase/ into a scratch
folder (each compare builds its binaries there, never in the repository), then runs

    python -m engine.cli compare -k <copy>/compare.yaml -o <scratch>/run_<i>   (N times, --runs)

with PYTHONPATH = --engine (a repository root; default this one, so an older checkout, e.g. a
worktree of HEAD, can be measured on the same example), and prints a row per compare and the
verdict tally. Given --engine more than once, the engines take turns (run 1 of each, run 2 of
each, ...), so they meet the same load of a shared machine. ``--strip-clock-key`` removes
``"clock": "cpu"`` from the copy's timing line, so the engine has to tell from the machine which
clock the samples came from. The load average before
and after is printed too: the machine is shared, and the verdicts are only as quiet as it is.

    python benchmarks/cpu_testcase_ties.py --runs 20
    python benchmarks/cpu_testcase_ties.py --runs 20 --engine /tmp/tt_before --engine .
    python benchmarks/cpu_testcase_ties.py --example examples/kernels/cuda_testcase --runs 5   # NVIDIA GPU

``--example`` takes another such folder (default the C++ one; examples/kernels/cuda_testcase is
the same check on a GPU: CUDA-event samples with no clock key, which must count as device times).

Exit status: 0 when every compare left a report (with --strict: and every one was a tie), else 1.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "kernels" / "cpp_testcase"
CLOCK_KEY = ', \\"clock\\": \\"cpu\\"'  # as written inside the C++ string literal


def prepare(scratch: Path, strip_clock_key: bool, example: Path = EXAMPLE) -> Path:
    """A copy of the example (sources and config, no binaries); returns its compare.yaml."""
    dest = scratch / example.name
    shutil.copytree(example, dest, ignore=shutil.ignore_patterns("*.out"))
    if strip_clock_key:
        src = dest / "jacobi.cpp"
        text = src.read_text()
        if CLOCK_KEY not in text:
            raise SystemExit(f"--strip-clock-key: {CLOCK_KEY!r} not found in {src}")
        src.write_text(text.replace(CLOCK_KEY, ""))
    return dest / "compare.yaml"


def run_compare(engine: Path, cfg: Path, out: Path, extra: list[str], timeout_s: float) -> tuple[int | None, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(engine) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "engine.cli", "compare", "-k", str(cfg), "-o", str(out), *extra]
    t0 = time.monotonic()
    with open(out.with_suffix(".log"), "w") as log:
        try:
            code = subprocess.run(cmd, cwd=engine, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.monotonic() - t0


def read_row(out: Path, engine: str, run: int, code: int | None, wall_s: float) -> dict:
    row: dict = {"engine": engine, "run": run, "exit_code": code, "wall_s": round(wall_s, 2), "verdict": None}
    reports = list(out.glob("*/compare_report.json"))
    if len(reports) != 1:
        row["error"] = f"expected one compare_report.json under {out}, found {len(reports)}"
        return row
    report = json.loads(reports[0].read_text())
    rows = report["results"]["kernel_results"]
    base = report["baseline"]["index"]
    cand = next(r for i, r in enumerate(rows) if i != base)
    perf = cand.get("performance_result") or {}
    row.update(verdict=cand.get("verdict"), speedup=cand.get("speedup"), speedup_ci=cand.get("speedup_ci"),
               tie_margin=report.get("tie_margin"), tie_margin_reason=report.get("tie_margin_reason"),
               clock=perf.get("clock"), clock_reason=perf.get("clock_reason"),
               processes=perf.get("processes"), samples=(cand.get("timing") or {}).get("n"),
               interval=perf.get("interval"))
    return row


def fmt(row: dict) -> str:
    sp, ci = row.get("speedup"), row.get("speedup_ci")
    s = "-" if sp is None else f"{sp:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
    margin = "-" if row.get("tie_margin") is None else f"{row['tie_margin']:g}"
    return (f"{row['engine'][:16]:<16} {row['run']:>3} {str(row.get('verdict') or row.get('error', '?'))[:10]:<10} {s:<28} "
            f"{margin:>6} {str(row.get('processes') or '-'):>5} {str(row.get('samples') or '-'):>5} "
            f"{row['wall_s']:>7.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="compares to run (default 20)")
    ap.add_argument("--engine", type=Path, action="append", help="repository root whose engine runs the compares "
                    "(default this one; give it more than once to alternate engines)")
    ap.add_argument("--example", type=Path, default=EXAMPLE, help="folder with the testcase and its compare.yaml "
                    "(default examples/kernels/cpp_testcase)")
    ap.add_argument("--strip-clock-key", action="store_true", help="the C++ testcase prints no \"clock\" key")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed for one compare")
    ap.add_argument("--keep", type=Path, help="keep the scratch folder here (default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, help="write the rows and the tally here")
    ap.add_argument("--strict", action="store_true", help="exit 1 unless every compare is a tie")
    ap.add_argument("extra", nargs="*", help="more arguments for `compare` (after --)")
    args = ap.parse_args(argv)
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="magpie-cpp-ties-"))
    scratch.mkdir(parents=True, exist_ok=True)
    engines = [e.resolve() for e in (args.engine or [REPO])]
    labels = [str(e) for e in engines]
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    load_before = os.getloadavg()
    try:
        cfg = prepare(scratch, args.strip_clock_key, args.example.resolve())
        print(f"engines: {', '.join(labels)}\nconfig: {cfg} (clock key {'stripped' if args.strip_clock_key else 'kept'})\n"
              f"date -u: {started}; cpus: {os.cpu_count()}; load average before: "
              + " ".join(f"{x:.2f}" for x in load_before))
        print(f"{'engine':<16} {'run':>3} {'verdict':<10} {'speedup [95% CI]':<28} {'margin':>6} {'procs':>5} "
              f"{'n':>5} {'wall s':>7}")
        rows = []
        for i in range(1, args.runs + 1):
            for j, engine in enumerate(engines):
                out = scratch / f"run_{i:02d}_{j}"
                code, wall = run_compare(engine, cfg, out, args.extra, args.timeout)
                rows.append(read_row(out, labels[j], i, code, wall))
                print(fmt(rows[-1]), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    tallies = {}
    for label in labels:
        mine = [r for r in rows if r["engine"] == label]
        tallies[label] = tally = collections.Counter(str(r.get("verdict")) for r in mine)
        reasons = sorted({r.get("tie_margin_reason") or "-" for r in mine})
        print(f"tally {label}: " + ", ".join(f"{v} {n}/{len(mine)}" for v, n in tally.most_common())
              + f"; tie margin reason: {' | '.join(reasons)}")
    load_after = os.getloadavg()
    print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))
    if args.json:
        args.json.write_text(json.dumps({"engines": labels, "date_utc": started, "rows": rows,
                                         "tally": {k: dict(v) for k, v in tallies.items()},
                                         "load_before": load_before, "load_after": load_after}, indent=2))
    if any(r.get("verdict") is None for r in rows):
        return 1
    return 1 if args.strict and any(r.get("verdict") != "tie" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
