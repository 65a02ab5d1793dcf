"""How the workbench keeps up with a run that writes 10k log lines per second.

A writer process appends timestamped lines to a live run's ``server.log`` at a fixed rate
while the workbench (headless, the real app) shows that run's Run screen. Every 100 ms the
benchmark reads the newest line the log widget shows and computes how far behind the file
it is; every 0.5 s it presses a key (``l``: next log file, which changes the log selector)
and times how long until the app has handled it.

    python benchmarks/tui_live_log.py [--rate 10000] [--seconds 10]

Targets (the workbench issue): key press handled within 100 ms, tail never more than 0.5 s
behind. Prints a short table last.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WRITER = r"""
import sys, time
path, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
batch = max(1, int(rate / 100))          # write every 10 ms
with open(path, "a", buffering=1 << 16) as fh:
    start = time.time(); n = 0
    while time.time() - start < seconds:
        now = time.time()
        for _ in range(batch):
            fh.write(f"{now:.6f} line {n} INFO step done, tokens=128 lat_ms=12.5\n"); n += 1
        fh.flush()
        time.sleep(max(0.0, start + n / rate - time.time()))
print(n)
"""


async def measure(rate: float, seconds: float) -> dict:
    os.environ.setdefault("MAGPIE_TUI_CONFIG", str(Path(tempfile.mkdtemp()) / "tui.yaml"))
    from textual import events

    from engine.runs.workspace import Workspace
    from magpie_tui.app import WorkbenchApp
    from magpie_tui.screens.run import RunScreen
    from magpie_tui.settings import load_settings

    root = Path(tempfile.mkdtemp(prefix="magpie-tui-bench-"))
    ws = Workspace.create(root / "results", "benchmark", "live-log")
    ws.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(ws.root), label="live-log")
    log = ws.root / "server.log"
    log.write_text("")
    (ws.root / "logs").mkdir(exist_ok=True)
    (ws.root / "logs" / "client.log").write_text("second log file\n")
    app = WorkbenchApp(load_settings(root, [root / "results"]), watch_files=False)
    lags: list[float] = []
    keys: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("2")
        while not app.runs:
            await pilot.pause(0.05)
        app.open_run(app.runs[0])
        while not (isinstance(app.screen, RunScreen) and app.screen.query("#run-log")):
            await pilot.pause(0.05)
        screen = app.screen
        widget = screen.query_one("#run-log")
        choice = screen.query_one("#log-choice")
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(rate), str(seconds)],
                                  stdout=subprocess.PIPE, text=True)
        t_end = time.time() + seconds
        next_key = time.time() + 0.5
        while time.time() < t_end:
            await asyncio.sleep(0.1)
            last = widget.lines[-1] if widget.line_count else ""
            if last and last[0].isdigit():
                lags.append(time.time() - float(last.split(" ", 1)[0]))
            if time.time() >= next_key:
                # The key goes into the app's queue as the terminal driver would put it (Pilot's
                # press() also waits for the app to go idle, which a 10k lines/s stream delays).
                for _ in range(2):  # to the other log and back to the live one
                    before = choice.value
                    t0 = time.perf_counter()
                    app.post_message(events.Key("l", "l"))
                    while choice.value == before:
                        await asyncio.sleep(0.001)
                    keys.append(time.perf_counter() - t0)
                next_key = time.time() + 0.5
        written = int(writer.communicate(timeout=30)[0].strip())
        await pilot.pause(0.5)
        shown = widget.lines_shown
    return {"rate": rate, "seconds": seconds, "written": written, "shown_total": shown,
            "lag_p50_s": statistics.median(lags) if lags else None, "lag_max_s": max(lags) if lags else None,
            "key_p50_ms": statistics.median(keys) * 1e3 if keys else None,
            "key_max_ms": max(keys) * 1e3 if keys else None, "key_presses": len(keys), "lag_samples": len(lags)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=10_000, help="lines per second (default 10000)")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    r = asyncio.run(measure(args.rate, args.seconds))
    print(f"{'lines/s':>8} {'written':>8} {'lag p50 s':>10} {'lag max s':>10} {'key p50 ms':>11} "
          f"{'key max ms':>11} {'keys':>5}")
    print(f"{r['rate']:>8.0f} {r['written']:>8d} {r['lag_p50_s']:>10.3f} {r['lag_max_s']:>10.3f} "
          f"{r['key_p50_ms']:>11.1f} {r['key_max_ms']:>11.1f} {r['key_presses']:>5d}")


if __name__ == "__main__":
    main()
