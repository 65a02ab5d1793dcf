"""How the workbench responds with many run folders under its results root.

Creates ``--runs`` (default 500) run folders under a temporary results root, copied from the
recorded runs in ``examples/runs/`` (events.jsonl with shifted timestamps, report, summary,
logs): most finished, a few with a large ``server.log`` (``--log-mb`` each), a few "running"
ones whose pid is this process, and a writer thread that appends a progress event to the
running ones every 0.2 s (as live runs do). Then it starts the real workbench app headless
(``App.run_test``, the app's default 0.5 s poll) on that root and measures:

* runs table: ``down`` pressed ``--presses`` times, each posted as the terminal driver would
  (``app.post_message(events.Key(...))``) at a random moment, timed from the post until the
  table's highlighted row changed;
* run screen: a run with a large log opened (time until its first log lines show), then ``l``
  (next log file, which re-reads the chosen file's last 4 MB) pressed ``--log-presses`` times,
  timed until the log selector changed;
* the event loop's longest stall in each phase: a task that sleeps 10 ms and records how late
  it woke up.

    python benchmarks/tui_many_runs.py [--runs 500] [--presses 200] [--log-mb 16]

Prints a short table last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXAMPLES = REPO / "examples" / "runs"
SIZE = (160, 48)


# -- run folders ------------------------------------------------------------------------------

def _events(template: Path, shift: float) -> list[dict]:
    out = []
    for line in (template / "events.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] += shift
        out.append(event)
    return out


def _write_events(path: Path, events: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")


def _log_text(mb: int) -> str:
    line = "INFO 12-02 10:00:00 engine.py:312 Avg prompt throughput: 812.4 tokens/s, running: 64 reqs\n"
    return line * max(1, (mb << 20) // len(line))


def make_runs(root: Path, n: int, log_mb: int, n_large: int = 4, n_running: int = 5) -> dict:
    """``n`` run folders under ``root``; returns which ones are large-log / running."""
    templates = sorted(p for p in EXAMPLES.iterdir() if (p / "events.jsonl").is_file())
    rng = random.Random(0)
    base = time.time() - n * 120.0
    large, running = [], []
    big_log = _log_text(log_mb) if n_large else ""
    for i in range(n):
        template = templates[i % len(templates)]
        mode, label = template.name.split("_")[0], template.name.split("_")[1]
        if mode == "trace":
            mode, label = "trace", "synthetic"
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(base + i * 120))
        folder = root / f"{mode}_{label}-{i:04d}_{stamp}_{rng.getrandbits(24):06x}"
        shutil.copytree(template, folder, ignore=shutil.ignore_patterns("events.jsonl", "tracelens",
                                                                         "gap_analysis"))
        events = _events(template, base + i * 120 - _events(template, 0)[0]["ts"])
        if i < n_running:
            # Running: started by "this process", no run_finished yet.
            events = [e for e in events if e.get("event") != "run_finished"][:4]
            events[0]["pid"] = os.getpid()
            for name in ("benchmark_report.json", "compare_report.json", "trace_analysis_report.json",
                         "summary.txt"):
                (folder / name).unlink(missing_ok=True)
            running.append(folder)
        _write_events(folder / "events.jsonl", events)
        if i >= n_running and len(large) < n_large and mode == "benchmark":
            (folder / "server.log").write_text(big_log, encoding="utf-8")
            (folder / "logs").mkdir(exist_ok=True)
            (folder / "logs" / "client.log").write_text("client started\n" * 100, encoding="utf-8")
            large.append(folder)
    return {"large": large, "running": running}


def _append_progress(running: list[Path], stop: threading.Event) -> None:
    done = 0
    while not stop.wait(0.2):
        done += 1
        for folder in running:
            with open(folder / "events.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"ts": time.time(), "event": "progress", "phase": "measure",
                                     "done": done % 1000, "total": 1000}) + "\n")


# -- measuring --------------------------------------------------------------------------------

class StallMeter:
    """A task that sleeps 10 ms at a time and records how late it woke up."""

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.period)
            self.worst = max(self.worst, time.perf_counter() - t0 - self.period)

    def start(self) -> None:
        self.worst = 0.0
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        return self.worst


async def _until(condition, timeout: float = 30.0, step: float = 0.001) -> float:
    t0 = time.perf_counter()
    while not condition():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("condition not met")
        await asyncio.sleep(step)
    return time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def measure(n: int, presses: int, log_presses: int, log_mb: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="magpie-many-runs-"))
    os.environ["MAGPIE_TUI_CONFIG"] = str(tmp / "settings" / "tui.yaml")
    from textual import events
    from magpie_tui.widgets.data_grid import DataGrid

    from magpie_tui.app import WorkbenchApp
    from magpie_tui.screens.run import RunScreen
    from magpie_tui.screens.runs import RunsScreen
    from magpie_tui.settings import load_settings

    results = tmp / "results"
    results.mkdir()
    t0 = time.perf_counter()
    made = make_runs(results, n, log_mb)
    build_s = time.perf_counter() - t0
    stop = threading.Event()
    writer = threading.Thread(target=_append_progress, args=(made["running"], stop), daemon=True)
    rng = random.Random(1)
    out: dict = {"runs": n, "build_s": build_s}
    app = WorkbenchApp(load_settings(tmp, [results]), watch_files=False)
    meter = StallMeter()
    try:
        async with app.run_test(size=SIZE) as pilot:
            meter.start()
            t0 = time.perf_counter()
            await pilot.press("2")
            await _until(lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.query("#runs-table")))
            table = app.screen.query_one("#runs-table", DataGrid)
            await _until(lambda: table.visible_count == n, timeout=120)
            out["first_list_s"] = time.perf_counter() - t0
            out["startup_stall_ms"] = meter.stop() * 1e3
            writer.start()
            await asyncio.sleep(1.0)  # the poller and the writer are both going

            meter.start()
            keys = []
            table.action_first_row()
            for _ in range(presses):
                await asyncio.sleep(rng.uniform(0.005, 0.045))
                if table.cursor_position >= n - 1:
                    table.action_first_row()
                    await asyncio.sleep(0.01)
                before = table.cursor_position
                t1 = time.perf_counter()
                app.post_message(events.Key("down", None))
                await _until(lambda before=before: table.cursor_position != before)
                keys.append(time.perf_counter() - t1)
            out["table_stall_ms"] = meter.stop() * 1e3
            out["table_keys_ms"] = [k * 1e3 for k in keys]

            # The run screen of a run with a large log.
            big = next(r for r in app.runs if made["large"] and r.path == made["large"][0])
            meter.start()
            t1 = time.perf_counter()
            app.open_run(big)
            await _until(lambda: isinstance(app.screen, RunScreen) and bool(app.screen.query("#run-log")))
            screen = app.screen
            log = screen.query_one("#run-log")
            await _until(lambda: log.lines_shown > 0, timeout=60)
            out["log_open_ms"] = (time.perf_counter() - t1) * 1e3
            choice = screen.query_one("#log-choice")
            await _until(lambda: len(screen.logs) >= 2, timeout=10)
            keys = []
            for _ in range(log_presses):
                await asyncio.sleep(rng.uniform(0.2, 0.4))
                before = choice.value
                t1 = time.perf_counter()
                app.post_message(events.Key("l", "l"))
                await _until(lambda before=before: choice.value != before)
                keys.append(time.perf_counter() - t1)
            await asyncio.sleep(0.5)
            out["log_stall_ms"] = meter.stop() * 1e3
            out["log_keys_ms"] = [k * 1e3 for k in keys]
    finally:
        stop.set()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--presses", type=int, default=200, help="down presses in the runs table")
    ap.add_argument("--log-presses", type=int, default=10, help="l presses on the run screen")
    ap.add_argument("--log-mb", type=int, default=3,
                    help="size of each large server.log (default 3: under the 4 MB a log view starts with)")
    args = ap.parse_args()
    r = asyncio.run(measure(args.runs, args.presses, args.log_presses, args.log_mb))
    print(f"{args.runs} run folders (built in {r['build_s']:.1f} s); runs listed {r['first_list_s']:.2f} s after "
          f"'2' (loop stall meanwhile {r['startup_stall_ms']:.0f} ms); {args.log_mb} MB log shown after "
          f"{r['log_open_ms']:.0f} ms")
    print(f"{'phase':<34} {'keys':>5} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'max stall ms':>13}")
    for name, keys, stall in (("runs table, down", r["table_keys_ms"], r["table_stall_ms"]),
                              ("run screen (large log), l", r["log_keys_ms"], r["log_stall_ms"])):
        print(f"{name:<34} {len(keys):>5d} {statistics.median(keys):>7.1f} {_pct(keys, 0.99):>7.1f} "
              f"{max(keys):>7.1f} {stall:>13.1f}")


if __name__ == "__main__":
    main()
