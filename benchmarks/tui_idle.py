"""What the workbench costs while it sits idle over a results folder with many finished runs.

Builds results folders of ``--runs`` finished run folders each (default ``0,2000``), copied from
the recorded runs in ``examples/runs/`` (events.jsonl with shifted timestamps, config.yaml,
report, summary), then, for each results folder and each source tree in ``--trees`` (default:
this checkout), starts the real workbench app headless (``App.run_test``, the app's default
0.5 s poll, the config watcher off) in a fresh child process, waits until every run is listed
and titled and a few seconds more, and measures the process's CPU time (user + system, all
threads, ``resource.getrusage``) over ``--seconds`` of idle wall time. The trees are
interleaved (A B A B ...) ``--reps`` times, so a noisy neighbour hits both alike.

    python benchmarks/tui_idle.py [--runs 0,2000] [--seconds 20] [--reps 2] [--screen configs]
    python benchmarks/tui_idle.py --trees .,/tmp/tui_before     # this tree against another checkout

Prints one line per measurement, then the median % of one core per tree and run count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "runs"
SIZE = (160, 48)


# -- run folders (parent) ---------------------------------------------------------------------

def make_finished_runs(root: Path, n: int) -> None:
    """``n`` finished run folders under ``root``, in the shape the engine writes them."""
    templates = sorted(p for p in EXAMPLES.iterdir() if (p / "events.jsonl").is_file())
    rng = random.Random(0)
    base = time.time() - n * 120.0 - 3600
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        template = templates[i % len(templates)]
        mode, label = template.name.split("_")[0], template.name.split("_")[1]
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(base + i * 120))
        folder = root / f"{mode}_{label}-{i:04d}_{stamp}_{rng.getrandbits(24):06x}"
        shutil.copytree(template, folder, ignore=shutil.ignore_patterns(
            "events.jsonl", "tracelens", "gap_analysis", "requests", "server.log"))
        lines = (template / "events.jsonl").read_text(encoding="utf-8").splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        shift = base + i * 120 - events[0]["ts"]
        for event in events:
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += shift
        assert events[-1]["event"] == "run_finished"
        (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")


# -- one measurement (child) ------------------------------------------------------------------

def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the workbench did not settle")
        await asyncio.sleep(0.05)


async def measure(results: Path, n: int, seconds: float, settle: float, screen: str) -> dict:
    import magpie_tui
    from magpie_tui.app import WorkbenchApp
    from magpie_tui.settings import load_settings

    project = Path(tempfile.mkdtemp(prefix="magpie-idle-project-"))
    os.environ["MAGPIE_TUI_CONFIG"] = str(project / "settings" / "tui.yaml")
    app = WorkbenchApp(load_settings(project, [results]), watch_files=False)
    try:
        async with app.run_test(size=SIZE) as pilot:
            if screen == "runs":
                await pilot.press("2")
            await _until(lambda: len(app.runs_watcher.catalog.runs) == n and len(app.runs) == n
                         and len(app.runs_watcher.titles) == n, timeout=300)
            await asyncio.sleep(settle)
            cpu0, wall0 = _cpu(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu1, wall1 = _cpu(), time.monotonic()
    finally:
        shutil.rmtree(project, ignore_errors=True)
    return {"runs": n, "cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0,
            "pct": 100.0 * (cpu1 - cpu0) / (wall1 - wall0), "code": str(Path(magpie_tui.__file__).parents[1])}


def child(args) -> None:
    sys.path.insert(0, str(Path(args.repo).resolve()))
    out = asyncio.run(measure(Path(args.results), args.n, args.seconds, args.settle, args.screen))
    print(json.dumps(out))


# -- interleaving (parent) --------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="0,2000", help="comma-separated run counts (default 0,2000)")
    ap.add_argument("--seconds", type=float, default=20.0, help="idle wall time measured (default 20)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds waited after every run is listed")
    ap.add_argument("--reps", type=int, default=2, help="rounds of the interleaved trees (default 2)")
    ap.add_argument("--trees", default=str(REPO), help="comma-separated source trees to run (default: this one)")
    ap.add_argument("--screen", choices=("configs", "runs"), default="configs",
                    help="the screen shown while idle (default configs, the one the workbench opens on)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repo", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    counts = [int(c) for c in args.runs.split(",")]
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="magpie-idle-"))
    results: dict[tuple[str, int], list[float]] = {}
    try:
        for n in counts:
            make_finished_runs(tmp / f"results-{n}", n)
            (tmp / f"results-{n}").mkdir(exist_ok=True)
        for rep in range(args.reps):
            for n in counts:
                for tree in trees:
                    cmd = [sys.executable, __file__, "--child", "--repo", tree, "--results", str(tmp / f"results-{n}"),
                           "--n", str(n), "--seconds", str(args.seconds), "--settle", str(args.settle),
                           "--screen", args.screen]
                    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
                    if done.returncode != 0:
                        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
                    r = json.loads(done.stdout.strip().splitlines()[-1])
                    if Path(r["code"]).resolve() != Path(tree):
                        sys.exit(f"measured {r['code']}, not {tree}")
                    results.setdefault((tree, n), []).append(r["pct"])
                    print(f"rep {rep + 1}  {tree:<28} {n:>5} runs  {r['cpu_s']:6.2f} s CPU in {r['wall_s']:5.1f} s "
                          f"= {r['pct']:5.2f} % of a core", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nidle CPU, % of one core, median of {args.reps} ({args.seconds:.0f} s each, {args.screen} screen):")
    for tree in trees:
        print(f"  {tree:<28} " + "   ".join(f"{n} runs: {statistics.median(results[(tree, n)]):5.2f} %"
                                          for n in counts))


if __name__ == "__main__":
    main()
