"""Issue 15, what remained: two compare runs side by side, re-running a run whose folder has no
recorded config, the GPU timeline per inference stage, and the capacity plot of a benchmark.

Run folders are real copies of the recorded runs in ``examples/runs`` (their reports edited where
a test needs another outcome); the capacity run is one that ``magpie benchmark --find-capacity``
wrote against the built-in server (tests/tui/data/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from tui.conftest import find_run, open_runs, wait_for, wait_screen

from magpie_tui.screens.compare_runs import CompareRunsScreen, pair_rows, pair_warnings
from magpie_tui.screens.confirm import ConfirmScreen
from magpie_tui.screens.runs import RunsScreen
from magpie_tui.widgets.data_grid import DataGrid

SIZE = (140, 45)
DATA = Path(__file__).resolve().parent / "data"


def text_of(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def second_compare(project: Path, edit, later_s: float = 600.0) -> Path:
    """A copy of the recorded compare run, started ``later_s`` after it, its report changed by
    ``edit(report)`` (so that it is run B of the pair)."""
    source = next(p for p in (project / "runs").iterdir() if p.name.startswith("compare_three_pass_2026"))
    target = project / "runs" / source.name.replace("_2026", f"_again{int(later_s)}_2026")
    shutil.copytree(source, target)
    events = [json.loads(line) for line in (target / "events.jsonl").read_text().splitlines() if line.strip()]
    for event in events:
        event["ts"] += later_s
    (target / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    report = json.loads((target / "compare_report.json").read_text())
    edit(report)
    (target / "compare_report.json").write_text(json.dumps(report))
    return target


def _kernel(report: dict, kernel_id: str) -> dict:
    return next(k for k in report["results"]["kernel_results"] if k["kernel_id"] == kernel_id)


def slower_one_pass_and_fixed_unmasked(report: dict) -> None:
    one = _kernel(report, "one_pass")
    one["speedup"], one["speedup_ci"] = 7.1, [6.8, 7.4]
    fixed = _kernel(report, "unmasked")
    fixed.update(correctness_state="SUCCESS", performance_state="SUCCESS", errors=[], speedup=10.2,
                 speedup_ci=[9.9, 10.5], verdict="faster", timing=dict(one["timing"], median=24.7))
    fixed["correctness_result"] = {"success": True, "errors": []}
    report["results"]["rankings"] = [[2, 10.2], [1, 7.1], [0, 1.0]]
    report["winner_id"] = "unmasked"
    report["environment"]["source_hashes"]["../../kernels/softmax_triton/softmax_unmasked.py"] = "sha256:new"


# -- 1. two compare runs side by side ---------------------------------------------------------------

def test_pair_rows_read_the_change_from_both_intervals(project):
    from engine.runs.schema import load_report
    a_dir = next(p for p in (project / "runs").iterdir() if p.name.startswith("compare_"))
    b_dir = second_compare(project, slower_one_pass_and_fixed_unmasked)
    a, b = load_report(a_dir / "compare_report.json"), load_report(b_dir / "compare_report.json")
    rows = {row["kernel"]: row for row in pair_rows(a, b)}
    assert rows["one_pass"]["change"] == "lower"  # [6.8, 7.4] lies wholly below [8.87, 9.58]
    assert rows["one_pass"]["delta"] == pytest.approx(7.1 - 9.268, abs=1e-3)
    assert rows["unmasked"]["change"] == "now correct" and rows["unmasked"]["a_correct"] == "no"
    assert rows["three_pass"]["change"] == "baseline"
    same = {row["kernel"]: row["change"] for row in pair_rows(a, a)}
    assert same == {"one_pass": "within noise", "three_pass": "baseline", "unmasked": "-"}
    assert pair_warnings(a, b) == ["sources changed between the runs: softmax_unmasked.py"]

    def other_baseline(report):
        report["baseline"]["id"] = "one_pass"
    c = load_report(second_compare(project, other_baseline, later_s=900) / "compare_report.json")
    assert pair_warnings(a, c)[0].startswith("baselines differ (A three_pass, B one_pass)")
    other = {row["kernel"]: row for row in pair_rows(a, c)}
    assert {k: (r["change"], r["delta"]) for k, r in other.items()} == {
        "one_pass": ("baselines differ", None), "three_pass": ("baseline", None), "unmasked": ("-", None)}


@pytest.mark.slow  # a few seconds: the Runs list, marks and a screen
async def test_mark_two_compare_runs_and_see_them_side_by_side(app, project):
    second_compare(project, slower_one_pass_and_fixed_unmasked)
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 5)
        await pilot.press("slash", *"compare", "enter")
        assert grid.visible_count == 2
        await pilot.press("home", "space", "down", "space", "v")
        await wait_screen(pilot, app, CompareRunsScreen, "#pair-grid")
        screen = app.screen
        pair = screen.query_one("#pair-grid", DataGrid)
        await wait_for(pilot, lambda: pair.row_count == 3)
        title = text_of(screen, "#pair-title")
        assert "A = compare_three_pass_2026" in title and "B = compare_three_pass_again600_2026" in title
        assert "winner one_pass" in title and "winner unmasked" in title
        assert "sources changed between the runs: softmax_unmasked.py" in text_of(screen, "#pair-warnings")
        one = pair.get_row("one_pass")
        assert (one["a_verdict"], one["b_verdict"], one["change"]) == ("faster", "faster", "lower")
        await pilot.press("w")  # swap: B is now the older run
        assert pair.get_row("one_pass")["change"] == "higher"
        await pilot.press("escape")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")


async def test_marking_a_benchmark_and_a_compare_says_what_compares(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        for prefix in ("compare_", "benchmark_builtin-tiny_20261129_192715"):
            assert grid.move_cursor_to_key(str(find_run(app, prefix).path))
            await pilot.press("space")
        messages = []
        app.notify = lambda message, **kw: messages.append(message)  # type: ignore[method-assign]
        await pilot.press("v")
        assert messages == ["side by side works for two benchmark runs or two compare runs; marked: compare and "
                            "benchmark"] or messages == ["side by side works for two benchmark runs or two compare "
                                                         "runs; marked: benchmark and compare"]
        assert isinstance(app.screen, RunsScreen)


# -- 2. re-run a run whose folder has no recorded config --------------------------------------------

def add_capacity_run(project: Path) -> Path:
    """The capacity-search run (a real one, see the module docstring) as one of the project's runs."""
    source = next((DATA / "runs").iterdir())
    target = project / "runs" / source.name
    shutil.copytree(source, target)
    return target


def test_a_benchmark_without_config_yaml_is_rebuilt_from_its_report(project, tmp_path):
    from engine.runs.catalog import RunCatalog
    from engine.jobs.query import check_config
    from magpie_tui.rerun import plan_rerun
    run = add_capacity_run(project)
    (run / "config.yaml").unlink()
    catalog = RunCatalog([project / "runs"])
    catalog.refresh()
    info = catalog.runs[run.resolve()]
    plan = plan_rerun(info, tmp_path / "results", project_dir=project)
    assert plan.source.startswith(f"no config.yaml in {run.name}: rebuilt from benchmark_report.json (framework")
    assert "every other field takes its default" in plan.source
    assert check_config(plan.config).ok, check_config(plan.config).problems
    bench = yaml.safe_load(plan.config.read_text())["benchmark"]
    assert bench["framework"] == "builtin" and bench["server"] == {"size": "tiny", "max_batch": 16}
    assert bench["envs"]["ISL"] == "32" and bench["client"]["repeats"] == 3
    assert bench["client"]["find_capacity"] == {"ttft": 60.0, "tpot": 15.0}
    assert bench["client"]["capacity_max"] == 32.0 and "sweep" not in bench["client"]
    assert bench["client"]["capacity_search"] == "bisect"  # the search that ran, before the margin search


@pytest.mark.slow  # a few seconds: the Runs list and a confirmation
async def test_rerun_of_a_compare_without_config_yaml_finds_its_kernel_config(app, project):
    run = next(p for p in (project / "runs").iterdir() if p.name.startswith("compare_"))
    (run / "config.yaml").unlink()
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        assert grid.move_cursor_to_key(str(find_run(app, "compare_").path))
        await pilot.press("R")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")
        question = text_of(app.screen, "#confirm-question").replace("\n", " ")
        assert "no config.yaml in compare_three_pass" in question and "found by the run's kernels" in question
        assert "softmax_triton/compare.yaml" in question and "--baseline three_pass" in question
        await pilot.press("n")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        assert not app.started


async def test_rerun_says_why_it_cannot_when_no_config_has_the_kernels(app, project):
    run = next(p for p in (project / "runs").iterdir() if p.name.startswith("compare_"))
    (run / "config.yaml").unlink()
    (project / "kernels" / "softmax_triton" / "compare.yaml").unlink()
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        assert grid.move_cursor_to_key(str(find_run(app, "compare_").path))
        messages = []
        app.screen.notify = lambda message, **kw: messages.append(message)  # type: ignore[method-assign]
        await pilot.press("R")
        await wait_for(pilot, lambda: bool(messages))
        await pilot.pause(0.1)
        assert len(messages) == 1 and isinstance(app.screen, RunsScreen)
        assert "no config.yaml, and the report does not name the kernel config" in messages[0]
        assert "no kernel config under" in messages[0] and "three_pass, one_pass, unmasked" in messages[0]
        assert "Configs screen (1)" in messages[0]


# -- 3. the GPU timeline per inference stage ------------------------------------------------------------

GOLDEN_TRACE = Path(__file__).resolve().parents[1] / "data/tracelens-golden/synthetic_vllm/synthetic_vllm.json.gz"


def test_each_kernel_gets_the_stage_of_the_step_that_launched_it():
    from magpie_tui.widgets.gpu_timeline import cells, timeline_from_trace
    lanes, steps = timeline_from_trace(GOLDEN_TRACE)
    assert [s.stage for s in steps].count("prefilldecode") == 3 and [s.stage for s in steps].count("decode_only") == 9
    assert [s.index for s in steps if s.stage == "prefilldecode"] == [0, 4, 8]
    stream7 = next(lane for lane in lanes if lane.name == "gpu0 s7")
    assert all(span.stage in ("prefilldecode", "decode_only") for span in stream7.spans)
    first = steps[0]  # a mixed step: its window is its kernels' span, inside its host range
    assert 0 <= first.start_us < first.end_us <= 9000 and first.end_us - first.start_us == pytest.approx(690)
    whole = cells(stream7, 0, 120_000, 120)
    decode_view = cells(stream7, 0, 120_000, 120, stage="decode_only")
    assert "other" not in whole and decode_view[1] == "other" and decode_view[11] == "kernel"  # 1 ms a cell


def _trace_run_with_its_trace(project: Path, keep_trace: bool = True) -> Path:
    run = next(p for p in (project / "runs").iterdir() if p.name.startswith("trace_"))
    if keep_trace:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfg["trace_dir"] = str(GOLDEN_TRACE)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


async def _open_timeline(pilot, app):
    """The trace run's Roofline screen, on its Timeline tab once the steps are read."""
    from magpie_tui.screens.roofline import RooflineScreen
    from magpie_tui.widgets.gpu_timeline import GpuTimeline
    await open_runs(pilot, app)
    app.open_report(find_run(app, "trace_"))
    await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
    await pilot.press("l")
    timeline = app.screen.query_one(GpuTimeline)
    await wait_for(pilot, lambda: bool(timeline.steps))
    return timeline


@pytest.mark.slow  # a few seconds: the roofline screen reads the trace in a worker
async def test_choose_the_stage_on_the_timeline_and_see_its_steps(app, project):
    _trace_run_with_its_trace(project)
    async with app.run_test(size=SIZE) as pilot:
        timeline = await _open_timeline(pilot, app)
        # The stage first shown, on the step TraceLens analysed for it (iteration 6 of the trace).
        assert timeline.title_text().startswith("decode_only: step 5 of 9 (execute_3_context_0")
        assert 60_000 < timeline.view[0] < timeline.view[1] < 70_000
        await pilot.press("n")
        assert timeline.title_text().startswith("decode_only: step 6 of 9") and timeline.view[0] > 70_000
        await pilot.press("N", "N")
        assert timeline.title_text().startswith("decode_only: step 4 of 9")
        app.screen.query_one("#timeline-stage").focus()
        await pilot.press("enter", "down", "enter")  # the dropdown: decode_only, then prefilldecode·mixed
        await wait_for(pilot, lambda: timeline.stage == "prefilldecode")
        assert timeline.title_text().startswith("prefilldecode: step 2 of 3")  # iteration 4: the middle one
        assert 40_000 < timeline.view[0] < timeline.view[1] < 50_000
        assert app.screen.query_one("#stage").value == "prefilldecode"  # the table follows the stage
        assert text_of(app.screen, "#roofline-title").startswith("prefilldecode:")
        timeline.focus()
        await pilot.press("0")  # the whole trace: the decode steps' kernels dimmed
        lane = timeline.render_line(3).text
        assert "░" in lane and "█" in lane and "another stage" in timeline.render_line(4).text


async def test_without_the_trace_the_steps_come_from_the_gap_analysis(app, project):
    _trace_run_with_its_trace(project, keep_trace=False)
    async with app.run_test(size=SIZE) as pilot:
        timeline = await _open_timeline(pilot, app)
        assert "gap analysis only" in timeline.source and [lane.name for lane in timeline.lanes] == ["device 0"]
        assert timeline.title_text().startswith("decode_only: step 5 of 9")
        assert timeline.view == (60_000.0 - 500.0, 70_000.0 + 500.0)  # until the next step starts, 5% either side


# -- 4. the capacity search in the Benchmark report --------------------------------------------------

def test_capacity_levels_in_level_order_with_the_knee_and_failures_in_words():
    from engine.runs.schema import load_report
    from magpie_tui.screens.reports import capacity_plot_args, capacity_rows, capacity_section, capacity_title
    report = load_report(next((DATA / "runs").iterdir()) / "benchmark_report.json")
    section = capacity_section(report)
    rows = capacity_rows(section)
    assert [r["name"] for r in rows] == ["c=1", "c=2", "c=4", "c=8", "c=9", "c=10", "c=12", "c=16"]
    results = {r["name"]: r["result"] for r in rows}
    assert results["c=8"] == "pass · knee" and results["c=9"] == "FAIL · above knee" and results["c=16"] == "FAIL"
    knee = rows[3]
    assert knee["goodput_pct"] == pytest.approx(96.25) and knee["goodput_ci"][1] == 100.0  # a share stays <= 100%
    assert capacity_title(section) == ("SLO capacity over concurrency: 90% of requests meeting TTFT <= 60 ms, "
                                       "TPOT <= 15 ms · capacity between 8 (meets the target) and 9 (misses it)")
    args = capacity_plot_args(section, "ttft")
    assert args["slo"] == 60.0 and args["knee"] == pytest.approx(knee["request_throughput"])
    assert [(p.label, p.passed) for p in args["points"]][3:5] == [("c=8", True), ("c=9", False)]
    assert args["points"][3].latency == pytest.approx(knee["p99_ttft_ms"])


@pytest.mark.slow  # a few seconds: two report screens
async def test_the_capacity_tab_plots_the_levels_and_marks_the_knee(app, project):
    from textual.widgets import TabbedContent
    from magpie_tui.screens.reports import BenchmarkReportScreen
    from magpie_tui.widgets.plots import CapacityPlot
    run = add_capacity_run(project)
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.path == run.resolve() for r in app.runs))
        app.open_report(find_run(app, run.name))
        await wait_screen(pilot, app, BenchmarkReportScreen, "#capacity-plot")
        screen = app.screen
        assert not screen.query("#tab-sweep")  # the levels, as tried, are the Capacity tab's
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
        assert screen.query_one(TabbedContent).active == "tab-capacity"
        plot = screen.query_one(CapacityPlot)
        text = plot.plot_text()
        assert "c=8✓" in text and "c=9✗" in text and "knee c=8" in text and "SLO TTFT 60 ms" in text
        assert "TTFT p99 (ms)" in text
        grid = screen.query_one("#capacity-grid", DataGrid)
        assert grid.get_row("c=8")["result"] == "pass · knee" and grid.row_count == 8
        await pilot.press("m")
        assert plot.y_label == "TPOT p99 (ms)" and "SLO TPOT 15 ms" in plot.plot_text()
        await pilot.press("escape")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        app.open_report(find_run(app, "benchmark_builtin-tiny_20261129_192715"))  # a sweep, no capacity search
        await wait_screen(pilot, app, BenchmarkReportScreen, "#sweep-plot")
        assert not app.screen.query("#tab-capacity")
