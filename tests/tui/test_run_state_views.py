"""Pilot tests: the workbench's headers, lists and notices show the run's one state, which agrees
with its report (issue 33).

The run folders in ``data/issue33`` were written by real runs on the CPU (trimmed to their events,
config, report and summary): a benchmark of the built-in server cancelled at about 150 of 600
requests; a three-repeat benchmark; a capacity search over concurrency (levels 1 and 2; the
config's CONC is 32); a benchmark profiled without TraceLens whose trace has no GPU kernels; and
``magpie optimize`` on examples/optimize/builtin_tiny_cpu.yaml, which settled its 8 steps and
ended with no proven gain (exit 3).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from tui.conftest import build_app, find_run, open_runs, wait_for, wait_screen

from engine.safeio import read_json
from magpie_tui.screens.confirm import ConfirmScreen
from magpie_tui.screens.loop import LoopScreen
from magpie_tui.screens.reports import BenchmarkReportScreen
from magpie_tui.screens.run import RunScreen

DATA = Path(__file__).resolve().parent / "data" / "issue33"
CANCELLED = "benchmark_builtin-tiny_20261206_114747_eff4e8"
CAPACITY = "benchmark_builtin-tiny_20261206_114922_85910e"
PROFILED_CPU = "benchmark_builtin-tiny_20261206_114932_354e89"
REPEATS = "benchmark_builtin-tiny_20261206_114959_2fd002"
LOOP = "loop_builtin-tiny_20261206_114807_a57b81"
SIZE = (200, 40)


@pytest.fixture
def app(project):
    results = project / "results"
    results.mkdir(exist_ok=True)
    for run in DATA.iterdir():
        shutil.copytree(run, results / run.name)
    return build_app(project)


def header(app) -> str:
    return str(app.screen.query_one("#run-status").render())


async def open_run_screen(pilot, app, name: str) -> str:
    await open_runs(pilot, app)
    await wait_for(pilot, lambda: any(r.name == name for r in app.runs))
    app.open_run(find_run(app, name))
    await wait_screen(pilot, app, RunScreen, "#run-status")
    await wait_for(pilot, lambda: bool(header(app)))
    return header(app)


async def test_a_cancelled_benchmarks_header_says_what_the_list_and_report_say(app):
    report = read_json(DATA / CANCELLED / "benchmark_report.json")
    failures = report["failures"]
    completed = failures["sent"] - failures["requests"]
    async with app.run_test(size=SIZE) as pilot:
        text = await open_run_screen(pilot, app, CANCELLED)
        assert "600/600" not in text, text
        reached = f"cancelled at {completed}/600 completed · {failures['never_sent']} never sent"
        assert reached in text, text
        from magpie_tui.screens.runs import progress_cell
        assert progress_cell(find_run(app, CANCELLED)).startswith(reached)


async def test_a_finished_repeated_benchmarks_header_shows_the_reports_mean(app):
    stat = read_json(DATA / REPEATS / "benchmark_report.json")["repeats"]["output_throughput"]
    async with app.run_test(size=SIZE) as pilot:
        text = await open_run_screen(pilot, app, REPEATS)
        lo, hi = stat["ci95"]
        assert f"{stat['mean']:.0f} tok/s (mean of 3, 95% CI {lo:.0f}–{hi:.0f})" in text, text
        assert text.count("tok/s") == 1, text  # no live number of the last repeat beside it


async def test_a_loop_that_settled_every_step_reads_8_of_8(app):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == LOOP for r in app.runs))
        from magpie_tui.screens.runs import progress_cell
        cell = progress_cell(find_run(app, LOOP))
        assert cell == "8/8 steps · no proven gain · exit 3", cell
        app.open_run(find_run(app, LOOP))  # the loop's own screen counts its steps the same way
        await wait_screen(pilot, app, LoopScreen, "#loop-chain")
        status = app.screen.query_one("#loop-status")
        await wait_for(pilot, lambda: "steps done" in str(status.render()))
        assert "8/8 steps done (2 skipped)  ·  no proven gain  ·  exit 3" in str(status.render()), str(status.render())


async def test_r_on_a_completed_loop_asks_first(app, monkeypatch):
    submitted: list = []

    def submit(request, output_dir=None, *, executor="local-process", **options):
        submitted.append(request)
        return SimpleNamespace(run_dir=Path(output_dir) / LOOP,
                               execution=SimpleNamespace(process=SimpleNamespace(pid=1, poll=lambda: 0),
                                                         console_log=Path(output_dir) / "console.log"))
    monkeypatch.setattr("engine.jobs.api.submit", submit)
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == LOOP for r in app.runs))
        started = find_run(app, LOOP).started
        app.open_run(find_run(app, LOOP))
        await wait_screen(pilot, app, LoopScreen, "#loop-chain")
        await wait_for(pilot, lambda: app.screen.view is not None and app.screen.view.loop is not None)
        await pilot.press("R")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert not submitted
        await pilot.press("n")
        await pilot.pause(0.2)
        assert not submitted and find_run(app, LOOP).started == started


async def test_a_capacity_runs_title_names_the_search_and_the_levels_tried(app):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        run_path = DATA / CAPACITY
        await wait_for(pilot, lambda: any(r.name == CAPACITY for r in app.runs))
        await wait_for(pilot, lambda: find_run(app, CAPACITY).path in app.runs_watcher.titles)
        title = app.runs_watcher.titles[find_run(app, CAPACITY).path]
        assert "c32" not in title and "capacity over concurrency" in title, title
        from magpie_tui.screens.runs import progress_cell
        cell = progress_cell(find_run(app, CAPACITY))
        assert "(tried c1, c2)" in cell, cell
        assert run_path.is_dir()


async def test_the_roofline_key_on_a_profiled_cpu_run_gives_the_reports_reason(app):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == PROFILED_CPU for r in app.runs))
        app.open_report(find_run(app, PROFILED_CPU))
        await wait_screen(pilot, app, BenchmarkReportScreen)
        await pilot.press("t")
        await wait_for(pilot, lambda: any("no tracelens/ analysis" in str(n.message) for n in app._notifications))
        note = next(str(n.message) for n in app._notifications if "no tracelens/ analysis" in str(n.message))
        assert "run it profiled" not in note and "no GPU kernels" in note, note
