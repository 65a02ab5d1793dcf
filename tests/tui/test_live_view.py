"""The Run screen's live view of a benchmark (magpie_tui/widgets/live_panel.py): at 80x24 every
number a performance engineer watches is on screen, whole — phase and repeat i of n, requests
done / failed / in flight / total, output tok/s, TTFT and TPOT p50 and p99, the ETA and the
server's own running / waiting / KV-cache use — on a real benchmark against the test server, and
on a run folder whose events.jsonl is written while the workbench watches. Once finished it shows
the report's figures. Snapshots at 80x24 and 200x50."""

from __future__ import annotations

import io
import json
import re
import threading
import time

import pytest
from bench_server import BenchServer, Script
from rich.console import Console
from tui.conftest import SNAPSHOT_ROOT, build_app, make_project, open_runs, wait_for, wait_screen

from engine.jobs import BenchmarkRequest, run_request
from engine.runs.process import process_identity
from magpie_tui.screens.run import RunScreen
from magpie_tui.widgets.live_panel import LivePanel

SMALL = (80, 24)


def screen_lines(app) -> list[str]:
    """The screen as the terminal shows it, one string a row (no styles)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text(styles=False).splitlines()[:height]


def on_screen(app, pattern: str) -> str | None:
    """The first row that holds ``pattern`` (a regex) whole, else None."""
    rx = re.compile(pattern)
    return next((line for line in screen_lines(app) if rx.search(line)), None)


async def wait_rows(pilot, app, patterns, timeout: float = 10.0) -> None:
    """Until every pattern is on screen (the rows repaint one after another), else which are not."""
    try:
        await wait_for(pilot, lambda: all(on_screen(app, p) for p in patterns), timeout)
    except AssertionError:
        raise AssertionError([p for p in patterns if not on_screen(app, p)], screen_lines(app)) from None


# What must be readable at 80x24 while a benchmark runs, each whole on one row.
LIVE_PATTERNS = {
    "repeat": r"repeat \d of \d",
    "requests": r"requests \d+/\d+ done( \(\d+%\))? · \d+ failed( \([\d.]+%\))? · \d+ in flight",
    "eta": r"ETA \d+:\d\d",
    "tok/s": r"output tok/s \d+(\.\dk)?",
    "ttft": r"TTFT p50 [\d.]+ ms · p99 [\d.]+ ms",
    "tpot": r"TPOT p50 [\d.]+ ms · p99 [\d.]+ ms",
    "server": r"server \d+ running · \d+ waiting · KV cache \d+%",
}


@pytest.mark.slow
async def test_a_real_benchmark_is_readable_at_80x24_while_it_runs_and_after(tmp_path):
    """Two repeats of 240 requests of ~60 ms at concurrency 4 (about 4 s each) against the test
    server with vLLM's /metrics (3 slots: one request waits)."""
    project = make_project(tmp_path / "p")
    app = build_app(project)
    outcome: list = []
    with BenchServer(Script(ttft_s=0.02, itl_s=0.005, tokens=8), metrics_slots=3) as srv:
        request = BenchmarkRequest(framework="vllm", flags={
            "model": "m", "base_url": srv.url, "tokenizer": "none", "vocab_size": 1000, "concurrency": 4,
            "input_len": 8, "output_len": 8, "num_prompts": 240, "warmup": 1, "range_ratio": 1.0, "repeats": 2})
        worker = threading.Thread(target=lambda: outcome.append(run_request(request, str(project / "results"))))
        worker.start()
        try:
            async with app.run_test(size=SMALL) as pilot:
                await open_runs(pilot, app)
                await wait_for(pilot, lambda: any(r.mode == "benchmark" and not r.is_finished
                                                  and r.path.parent == project / "results" for r in app.runs), 60)
                run = next(r for r in app.runs if r.path.parent == project / "results")
                app.open_run(run)
                await wait_screen(pilot, app, RunScreen, "#run-live")
                # Mid-load: every number whole on one row of the 80x24 screen.
                await wait_rows(pilot, app, list(LIVE_PATTERNS.values()), 60)
                rows = {k: on_screen(app, p) for k, p in LIVE_PATTERNS.items()}
                assert re.search(r"measure · repeat [12] of 2", rows["repeat"]), rows
                assert re.search(r"requests \d+/240 done", rows["requests"]), rows
                panel = app.screen.query_one("#run-live", LivePanel)
                assert panel.region.y <= 3  # the first thing under the header
                # Finished: the report's own figures, not the last repeat's live numbers.
                await wait_for(pilot, lambda: app.screen.info.is_finished, 60)
                await wait_for(pilot, lambda: bool(outcome), 60)
                tok = outcome[0].report["repeats"]["output_throughput"]
                await wait_rows(pilot, app, [r"the report's figures", rf"output tok/s {tok['mean']:.0f}  mean of 2",
                                             r"requests 480/480 completed · 0 failed", r"TTFT p50 [\d.]+ ms  mean of 2"])
                assert not on_screen(app, r"in flight|ETA")
        finally:
            worker.join(120)


# -- a run folder written while the workbench watches ---------------------------------------------

T0 = 1_800_000_000.0
LIVE_NAME = "benchmark_live-c8_20270115_080000_0a1b2c"


class LiveFolder:
    """A benchmark run folder whose events.jsonl this test writes as a run would (this process
    is the run's: its pid with its start time)."""

    def __init__(self, results) -> None:
        self.root = results / LIVE_NAME
        self.root.mkdir(parents=True)
        self.fh = open(self.root / "events.jsonl", "a")
        self.write({"ts": T0, "event": "run_started", "mode": "benchmark", "label": "live-c8", "schema_version": 1,
                    "workspace": str(self.root), **process_identity()})

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()

    def progress(self, repeat: int, second: int, *, old: bool = False, server: bool = True) -> None:
        """Second ``second`` of repeat ``repeat`` (0-based) of 2, 1200 requests at about 12 a second."""
        done = min(1200, 12 * second)
        ev = {"ts": T0 + 5 + repeat * 105 + second, "event": "progress", "phase": "measure", "done": done,
              "total": 1200, "repeat": repeat, "repeats": 2, "point": {"concurrency": 8}, "point_index": 0,
              "completed": done - (second // 20), "failed": second // 20, "never_sent": 0,
              "elapsed_s": float(second), "output_tok_s": 1480.0 + 7 * (second % 9),
              "ttft_p50_ms": 41.5 + (second % 7), "tpot_p50_ms": 4.25 + 0.1 * (second % 5)}
        if not old:
            ev.update(ttft_p99_ms=180.0 + second, tpot_p99_ms=9.75, in_flight=8 if done < 1200 else 0,
                      output_tokens=(done - second // 20) * 128, eta_s=max(0.0, (1200 - done) / 12.0))
            if server:
                ev.update(server_running=8, server_waiting=3, server_kv_cache=0.374)
        self.write(ev)

    def finish(self) -> None:
        self.write({"ts": T0 + 300, "event": "run_finished", "state": "completed", "exit_code": 0,
                    "report": "benchmark_report.json",
                    "figures": {"requests": 2400, "sent": 2400, "completed": 2394, "failed": 6, "never_sent": 0,
                                "output_tok_s": {"mean": 1502.3, "n": 2, "ci95": None},
                                "ttft_p50_ms": {"mean": 43.9, "n": 2, "ci95": None},
                                "tpot_p50_ms": {"mean": 4.41, "n": 2, "ci95": None}}})
        self.fh.close()


async def test_a_run_folder_fed_while_watched(tmp_path):
    project = make_project(tmp_path / "p")
    live = LiveFolder(project / "results")
    app = build_app(project)
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == LIVE_NAME for r in app.runs))
        app.open_run(next(r for r in app.runs if r.name == LIVE_NAME))
        await wait_screen(pilot, app, RunScreen, "#run-live")
        assert on_screen(app, "requests: waiting for the load to start")
        # A line as run folders wrote it before the new fields: what it has, dashes for the rest.
        live.progress(0, 10, old=True)
        await wait_for(pilot, lambda: on_screen(app, r"requests 120/1200 done \(10%\) · 0 failed · in flight – · 12\.0 req/s") is not None)
        assert on_screen(app, r"TTFT p50 44\.5 ms · p99 –") and on_screen(app, r"ETA –")
        assert not on_screen(app, r"server \d")
        for second in range(11, 75):
            live.progress(0, second)
        expected = [r"requests 888/1200 done \(74%\) · 3 failed \(0\.3%\) · 8 in flight · 12\.0 req/s",
                    # repeat 1: 26 s left, plus repeat 2 as long as this one (74 + 26 s)
                    r"measure · repeat 1 of 2 · concurrency=8 · elapsed 1:14 · ETA 2:06",
                    r"TTFT p50 45\.5 ms · p99 254 ms", r"TPOT p50 4\.65 ms · p99 9\.75 ms",
                    r"output tok/s 1494", r"server 8 running · 3 waiting · KV cache 37%"]
        await wait_rows(pilot, app, expected)
        spark = app.screen.query_one("#live-spark-tok")
        assert len(spark.data) == 61  # the last minute, one point a second
        for pattern in LIVE_PATTERNS.values():
            assert on_screen(app, pattern), (pattern, screen_lines(app))
        live.progress(1, 30)
        await wait_for(pilot, lambda: on_screen(app, r"repeat 2 of 2") is not None)
        live.finish()
        await wait_rows(pilot, app, [r"completed · exit 0 · the report's figures",
                                     r"requests 2394/2400 completed · 6 failed",
                                     r"output tok/s 1502  mean of 2", r"TPOT p50 4\.41 ms  mean of 2"])
        assert not app.screen.query_one("#live-spark-tok").display


async def test_the_live_view_is_only_for_benchmarks(tmp_path):
    project = make_project(tmp_path / "p")
    app = build_app(project)
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        app.open_run(next(r for r in app.runs if r.name.startswith("compare_")))
        await wait_screen(pilot, app, RunScreen, "#run-live")
        assert not app.screen.query_one("#run-live").display


# -- snapshots ------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_view_snapshot(snap_compare, size, monkeypatch):
    import magpie_tui.screens.run as run_screen
    from types import SimpleNamespace
    project = make_project(SNAPSHOT_ROOT)
    live = LiveFolder(project / "results")
    for second in range(1, 75):
        live.progress(0, second)
    # The header's elapsed time, as at T0 + 84 s.
    monkeypatch.setattr(run_screen, "time", SimpleNamespace(time=lambda: T0 + 84, monotonic=time.monotonic))

    async def run_before(pilot):
        app = pilot.app
        await pilot.press("2")
        deadline = time.monotonic() + 10
        while not any(r.name == LIVE_NAME for r in app.runs) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        app.open_run(next(r for r in app.runs if r.name == LIVE_NAME))
        await pilot.pause(0.5)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
    try:
        assert snap_compare(build_app(project), terminal_size=size, run_before=run_before)
    finally:
        live.fh.close()
