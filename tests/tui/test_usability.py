"""What a first hour in the workbench showed (issue 15), one test per defect, plus the k9s /
lazygit habits: filter, sort, marks, re-run, delete/archive, edit, copy, per-screen help, export.

Runs that "are running" here belong to a real child process (``sleep``) in its own session, so
that nothing is ever signalled by accident and every cancel path is exercised for real."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tui.conftest import build_app, find_run, open_runs, wait_for, wait_screen

from engine.jobs.query import check_config
from magpie_tui.launching import StartedRun
from engine.runs.workspace import Workspace
from magpie_tui.screens.configs import ConfigsScreen
from magpie_tui.screens.confirm import ConfirmScreen
from magpie_tui.screens.diff import DiffScreen
from magpie_tui.screens.help import HelpScreen
from magpie_tui.screens.kernel import KernelScreen, candidate_kernels
from magpie_tui.screens.reports import (
    BenchmarkReportScreen, CompareReportScreen, benchmark_rows, compare_rows, server_metrics_view,
)
from magpie_tui.screens.roofline import RooflineScreen
from magpie_tui.screens.run import RunScreen
from magpie_tui.screens.runs import RunsScreen
from magpie_tui.widgets.data_grid import DataGrid

SIZE = (140, 45)


def text_of(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


@pytest.fixture
def sleeper():
    """A real process standing in for a run's process: its own session, killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def live_run(project: Path, pid: int, label: str) -> Workspace:
    ws = Workspace.create(project / "results", "benchmark", label)
    ws.events.emit("run_started", mode="benchmark", pid=pid, workspace=str(ws.root), label=label)
    return ws


def copy_run(project: Path, prefix: str, edit) -> Path:
    """A copy of a recorded run with its report changed by ``edit(report)``."""
    source = next(p for p in (project / "runs").iterdir() if p.name.startswith(prefix))
    target = project / "runs" / source.name.replace("_2026", "_edited_2026")
    shutil.copytree(source, target)
    name = next(n for n in ("compare_report.json", "benchmark_report.json") if (target / n).exists())
    report = json.loads((target / name).read_text())
    edit(report)
    (target / name).write_text(json.dumps(report))
    return target


# -- 1. the Metrics tab shows every row --------------------------------------------------------------

@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_benchmark_metrics_tab_uses_the_whole_screen(app, project, size):
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "benchmark_builtin-tiny_20261129_192724"))
        await wait_screen(pilot, app, BenchmarkReportScreen, "#bench-grid")
        grid = app.screen.query_one("#bench-grid", DataGrid)
        tab = app.screen.query_one("#tab-metrics")
        assert grid.region.height >= tab.region.height - 1  # not a 3-row box above empty lines
        if size == (160, 48):
            assert grid.region.height >= grid.row_count + 1  # every row and the header at once
        else:
            assert grid.region.height >= 14  # what 24 lines leave under the header, title, tabs, footer
        await pilot.press("end")
        assert grid.cursor_row_key == "std_e2el_ms"  # the last latency row is reachable


def test_server_metrics_and_intervals_as_the_report_gives_them():
    report = {"state": "completed", "repeats": {
        "request_throughput": {"mean": 28.3, "std": 17.4, "n": 2, "ci95": [-128.3, 184.9], "values": [40.6, 16.0]},
        "output_throughput": {"mean": 100.0, "std": 30.0, "n": 3, "ci95": [-20.0, 220.0], "values": [70, 100, 130]}},
        "result": {"request_throughput": 40.6, "output_throughput": 70.0, "median_itl_ms": 0.0},
        "server_metrics": {"available": True, "url": "http://127.0.0.1:1/metrics", "file": "server_metrics.jsonl",
                           "interval_s": 1.0, "scrapes": 12, "scrape_errors": 1, "span_s": 11.0,
                           "series": {"vllm:num_requests_running": {"kind": "gauge", "min": 0, "max": 8, "mean": 5.5,
                                                                    "last": 0, "samples": 12},
                                      "vllm:generation_tokens_total": {"kind": "counter", "min": 0, "max": 960,
                                                                       "mean": 480, "last": 960, "first": 0,
                                                                       "delta": 960, "rate_per_s": 87.3,
                                                                       "samples": 12}},
                           "derived": {"prefix_cache_hit_rate": 0.25}}}
    rows = {r["key"]: r for r in benchmark_rows(report)}
    assert rows["request_throughput"]["ci_low"] is None  # n=2: no interval printed (a note above says why)
    assert rows["output_throughput"]["ci_low"] == 0.0 and rows["output_throughput"]["ci_high"] == 220.0  # no < 0
    assert "several to a streamed chunk" in rows["median_itl_ms"]["note"]  # a 0 ms ITL is explained
    line, series = server_metrics_view(report)
    assert "12 scrapes every 1.0 s over 11.0 s, 1 failed" in line
    by_name = {r["name"]: r for r in series}
    assert by_name["vllm:generation_tokens_total"]["rate_per_s"] == 87.3
    assert by_name["prefix_cache_hit_rate"]["kind"] == "ratio" and by_name["prefix_cache_hit_rate"]["mean"] == 0.25
    line, series = server_metrics_view({"state": "completed", "server_metrics": {
        "available": False, "reason": "GET http://127.0.0.1:1/metrics: HTTP 404 Not Found"}})
    assert series == [] and "HTTP 404" in line


async def test_benchmark_report_shows_the_server_tab_and_a_tpot_histogram(app, project):
    def add_metrics(report):
        report["server_metrics"] = {"available": True, "url": "http://127.0.0.1:9/metrics", "scrapes": 3,
                                    "interval_s": 1.0, "span_s": 2.0, "series": {
                                        "magpie_serve_requests_running": {"kind": "gauge", "min": 0, "max": 2,
                                                                          "mean": 1.0, "last": 0}}, "derived": {}}
    run = copy_run(project, "benchmark_builtin-tiny_20261129_192724", add_metrics)
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(next(r for r in app.runs if r.path == run))
        await wait_screen(pilot, app, BenchmarkReportScreen, "#server-grid")
        await pilot.press("right_square_bracket")  # ] steps through the tabs
        assert app.screen.query_one("#bench-tabs").active == "tab-dist"
        tpot = app.screen.query_one("#hist-tpot")
        await wait_for(pilot, lambda: len(tpot.values) > 0)
        await pilot.press("right_square_bracket")
        assert app.screen.query_one("#bench-tabs").active == "tab-server"
        grid = app.screen.query_one("#server-grid", DataGrid)
        assert grid.visible_keys() == ["magpie_serve_requests_running"]
        assert "3 scrapes" in text_of(app.screen, "#server-summary")


# -- 2. destructive or expensive actions ask first, everywhere ----------------------------------------

async def test_cancel_on_the_run_screen_asks_first(app, project, sleeper):
    ws = live_run(project, sleeper.pid, "asks")
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.label == "asks" for r in app.runs))
        app.open_run(next(r for r in app.runs if r.label == "asks"))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        await pilot.press("c")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")
        await pilot.press("enter")  # No has the focus: an enter by habit cancels nothing
        await wait_screen(pilot, app, RunScreen, "#run-log")
        assert sleeper.poll() is None and next(r for r in app.runs if r.path == ws.root).state == "running"


async def test_compare_from_the_diff_screen_asks_first(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(project / "kernels" / "softmax_triton" / "compare.yaml")
        await pilot.press("d")
        await wait_screen(pilot, app, DiffScreen)
        await pilot.press("c")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")
        assert "$ magpie compare -k" in text_of(app.screen, "#confirm-question")
        await pilot.press("n")
        await wait_screen(pilot, app, DiffScreen)
        assert not app.started


# -- 3. after a launch or `2`: the Runs list, with the new run selected -------------------------------

@pytest.mark.slow  # a few seconds: several screens and workers
async def test_launch_and_2_show_the_runs_list_with_the_new_run_selected(app, project, sleeper):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "compare_"))
        await wait_screen(pilot, app, CompareReportScreen)
        await pilot.press("1")
        await wait_screen(pilot, app, ConfigsScreen)
        await pilot.press("2")  # the list, not the report left open on that side
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        app.open_report(find_run(app, "compare_"))
        await wait_screen(pilot, app, CompareReportScreen)
        await pilot.press("1")
        await wait_screen(pilot, app, ConfigsScreen)
        # What the launch form hands back: the run's process, and its folder appears a moment later.
        started = StartedRun(process=sleeper, argv=["python", "-m", "engine.cli", "benchmark", "-b", "x.yaml"],
                             console_log=project / "results" / "console.log", started=time.time())
        app.screen._launched(started)
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        ws = live_run(project, sleeper.pid, "just-launched")
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.cursor_row_key == str(ws.root))
        await pilot.press("enter")
        await wait_screen(pilot, app, RunScreen, "#run-log")
        assert app.screen.info.path == ws.root


# -- 4. cancelled runs read as cancelled, with what was reached ---------------------------------------

def _cancelled_compare(report):
    report["state"], report["winner_id"], report["winner_reason"] = "cancelled", None, "the baseline is incorrect"
    base, one, unmasked = report["results"]["kernel_results"]
    base["correctness_state"] = "FAILED"
    base["correctness_result"]["harness_run"]["cancelled"] = True
    base.pop("timing", None)
    for kr in (one, unmasked):
        kr.update(correctness_state="SKIPPED", performance_state="SKIPPED", errors=[], verdict=None, speedup=None,
                  speedup_ci=None, timing=None)
    report["results"]["rankings"] = []


async def test_a_cancelled_compare_reads_cancelled(app, project):
    run = copy_run(project, "compare_", _cancelled_compare)
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(next(r for r in app.runs if r.path == run))
        await wait_screen(pilot, app, CompareReportScreen)
        title = str(app.screen.query_one(".report-title").render())
        assert "CANCELLED after 0 of 3 kernels checked" in title and "baseline is incorrect" not in title
        rows = {r["kernel"]: r for r in app.screen.query_one(DataGrid).visible_rows()}
        assert rows["three_pass"]["correct"] == "cancelled" and rows["one_pass"]["correct"] == "not reached"
        assert rows["one_pass"]["verdict"] == "cancelled"
        whys = " ".join(str(w.render()) for w in app.screen.query(".incorrect-why"))
        assert "no reason recorded" not in whys and "cancelled before this kernel was checked" in whys


async def test_a_cancelled_benchmark_says_how_far_it_got(app, project, sleeper):
    ws = live_run(project, sleeper.pid, "cut")
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        ws.events.emit("progress", phase="measure", done=400, total=2000, completed=400, failed=0)
        # The cancel ends the requests in flight: the generator counts them done (failed).
        ws.events.emit("progress", phase="measure", done=2000, total=2000, completed=400, failed=1600)
        ws.events.emit("run_finished", state="cancelled", exit_code=130)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: str(ws.root) in grid.visible_keys()
                       and grid.get_row(str(ws.root))["state"] == "cancelled")
        progress = grid.get_row(str(ws.root))["progress"]
        assert progress == "cancelled at 400/2000 completed · exit 130" and "2000/2000" not in progress


# -- 5. statistics shown with sense -------------------------------------------------------------------

async def test_an_op_above_its_roofline_is_flagged(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        grid = app.screen.query_one("#roofline-grid", DataGrid)
        add = next(k for k, r in zip(grid.visible_keys(), grid.visible_rows()) if r["op_name"] == "aten::add")
        assert grid._cells(grid._index_of_key[add])[1] == "suspect"  # coloured as a warning
        assert "104.9!" in grid.to_markdown()
        assert "above 100% of the roofline (aten::add)" in text_of(app.screen, "#roofline-title")


# -- 6. the columns that matter fit in 80 columns -----------------------------------------------------

async def test_roofline_and_compare_columns_fit_in_80_columns(app, project):
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        grid = app.screen.query_one("#roofline-grid", DataGrid)
        header = grid.render_line(0).text
        for label in ("Op", "Time ms", "% roof", "TFLOP/s", "TB/s"):
            assert label in header, header
        for _ in range(8):
            await pilot.press("right")  # scroll sideways: Op stays
        assert grid.render_line(0).text.strip().startswith("Op") and grid.scroll_offset.x > 0
        await pilot.press("escape")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        app.open_report(find_run(app, "compare_"))
        await wait_screen(pilot, app, CompareReportScreen)
        header = app.screen.query_one(DataGrid).render_line(0).text
        for label in ("Kernel", "Verdict", "Speedup", "95% CI"):
            assert label in header, header


# -- 7. focus: esc steps back one level, enter returns to the table, letters work on dropdowns --------

@pytest.mark.slow  # a few seconds: several screens and workers
async def test_roofline_focus_keys_and_remembered_view(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        trace = find_run(app, "trace_")
        app.open_report(trace)
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        screen = app.screen
        grid = screen.query_one("#roofline-grid", DataGrid)
        await pilot.press("slash", "m", "m", "enter")
        assert screen.focused is grid and {r["op_name"] for r in grid.visible_rows()} == {"aten::mm", "aten::addmm"}
        await pilot.press("slash", "escape")
        assert app.screen is screen and screen.focused is grid and grid.visible_count == 9  # cleared, not closed
        screen.query_one("#stage").focus()
        await pilot.press("p")
        assert screen.query_one("#roofline-tabs").active == "tab-plot"
        await pilot.press("t")
        assert screen.query_one("#roofline-tabs").active == "tab-table" and screen.focused is grid
        screen.query_one("#stage").value = "prefilldecode"
        await pilot.press("slash", "a", "d", "d", "enter")
        grid.sort_by("achieved_tflops_mean", reverse=True)
        await pilot.press("l")
        await pilot.press("escape")  # from another tab: back to the table
        assert screen.query_one("#roofline-tabs").active == "tab-table"
        await pilot.press("escape")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        app.open_report(trace)
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        again = app.screen.query_one("#roofline-grid", DataGrid)
        await wait_for(pilot, lambda: again.filter_text == "add")
        assert app.screen.stage == "prefilldecode" and again.sort_column == "achieved_tflops_mean"


async def test_run_screen_tabs_switch_with_brackets(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_run(find_run(app, "compare_"))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        tabs = app.screen.query_one("#run-tabs")
        assert tabs.active == "tab-kernels"  # a compare opens on its kernels' stages
        await pilot.press("right_square_bracket")
        assert tabs.active == "tab-log"
        await pilot.press("right_square_bracket")
        assert tabs.active == "tab-events"
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert tabs.active == "tab-kernels"
        await pilot.press("left_square_bracket")
        assert tabs.active == "tab-summary"
        assert "]" in app.export_screenshot()  # the footer says how


# -- 8. config errors say what is wrong and where --------------------------------------------------

async def test_config_errors_name_the_problem_and_nothing_else(app, project):
    compare = project / "kernels" / "softmax_triton" / "compare.yaml"
    compare.write_text(compare.read_text().replace("softmax_onepass.py", "softmax_onepas.py"))
    broken = project / "kernels" / "softmax_triton" / "broken.yaml"
    broken.write_text("kernels:\n  - id: a\n    source_files: [x.py\n")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        screen = app.screen
        screen.select(compare)
        await pilot.pause()
        problems = text_of(screen, "#config-problems-text")
        assert problems.count("error:") == 1 and "softmax_onepas.py does not exist" in problems
        assert "three_pass" not in problems and str(project) not in problems  # relative, nothing false
        screen.select(broken)
        await pilot.pause()
        assert "not valid YAML" in text_of(screen, "#config-status")
        assert "error: kernels/softmax_triton/broken.yaml:4: not valid YAML" in text_of(screen, "#config-problems-text")
        await pilot.press("l")
        await pilot.pause()
        assert any("not valid YAML" in str(n.message) for n in app._notifications)
    many = project / "benchmarks" / "many.yaml"
    many.write_text("benchmark:\n  framework: builtin\n" + "".join(f"  bogus_{i}: 1\n" for i in range(14)))
    app = build_app(project)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(many)
        await pilot.pause()
        box = app.screen.query_one("#config-problems")
        assert text_of(app.screen, "#config-problems-text").count("bogus_") == 14  # all of them, scrollable
        assert box.max_scroll_y > 0


# -- 9. run folders are runs, not configs --------------------------------------------------------------

def test_a_run_folders_config_is_a_record_not_a_config(project):
    run_config = next((project / "runs").glob("benchmark_*/config.yaml"))
    check = check_config(run_config)
    assert check.kind == "run record" and check.ok and check.modes == []


async def test_the_config_tree_leaves_run_folders_out(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        tree = app.screen.query_one("#config-tree")
        await wait_for(pilot, lambda: any(str(n.label) == "runs" for n in tree.root.children))
        runs_node = next(n for n in tree.root.children if str(n.label) == "runs")
        kernels_node = next(n for n in tree.root.children if str(n.label) == "kernels")
        runs_node.expand()
        kernels_node.expand()
        await wait_for(pilot, lambda: len(kernels_node.children) > 0)  # the tree has loaded a folder
        await pilot.pause(0.3)
        assert [str(c.label) for c in runs_node.children] == []  # every folder in runs/ is a run


# -- 10. the diff's baseline is the run's; candidates are about the kernel ----------------------------

async def test_diff_from_a_report_uses_the_runs_baseline(app, project):
    def baseline_one_pass(report):
        report["baseline"] = {"index": 1, "id": "one_pass", "chosen_by": "--baseline"}
    run = copy_run(project, "compare_", baseline_one_pass)
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(next(r for r in app.runs if r.path == run))
        await wait_screen(pilot, app, CompareReportScreen)
        await pilot.press("d")
        await wait_screen(pilot, app, DiffScreen)
        assert app.screen.baseline == "one_pass"
        assert "baseline one_pass" in text_of(app.screen, "#diff-title")


def test_kernel_candidates_share_a_real_topic_not_a_library_name(project):
    flash = ["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4> >(Flash_fwd_params)"]
    assert candidate_kernels(project, "aten::_scaled_dot_product_flash_attention", flash, None, []) == []
    assert candidate_kernels(project, "vllm::unified_attention_with_output", ["kernel_unified_attention_2d"],
                             None, []) == []
    gelu = {c["kernel"] for c in candidate_kernels(project, "aten::gelu", [], None, [])}
    assert gelu  # a shared distinctive word still finds candidates


# -- also seen ----------------------------------------------------------------------------------------

async def test_runs_labels_tell_runs_apart_and_home_end_move(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        labels = {r["folder"]: r["label"] for r in grid.visible_rows()}
        assert labels[find_run(app, "compare_").name] == "softmax_triton/compare.yaml · base three_pass"
        # two benchmarks of one config read apart: a sweep of 3 points, 2 repeats vs a single point, 3 repeats
        assert labels[find_run(app, "benchmark_builtin-tiny_20261129_192715").name] == \
            "builtin-tiny c2 i32 o8 sweep c1,2,4 x2"
        assert labels[find_run(app, "benchmark_builtin-tiny_20261129_192724").name] == "builtin-tiny c2 i32 o8 x3"
        await pilot.press("end")
        assert grid.cursor_position == 3
        await pilot.press("home")
        assert grid.cursor_position == 0


async def test_help_shows_this_screens_keys(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        await pilot.press("question_mark")
        await wait_screen(pilot, app, HelpScreen, "#help-table")
        table = app.screen.query_one("#help-table")
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        ids = [row[3] for row in rows]
        assert ids[0].startswith("roofline.") and "grid.sort" in ids and "app.quit" in ids
        assert "runs.cancel" not in ids and len(ids) == len(set(ids))
        assert ["roofline", "/", "Filter", "roofline.filter"] in [list(row) for row in rows]


# -- beyond fixing: the habits of k9s and lazygit -----------------------------------------------------

@pytest.mark.slow  # a few seconds: several screens and workers
async def test_runs_filter_sort_and_mark_two_to_compare(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        screen = app.screen
        grid = screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        await pilot.press("slash", *"bench", "enter")
        assert screen.focused is grid and {r["mode"] for r in grid.visible_rows()} == {"benchmark"}
        # Started steps aside at 140 columns; the folder names carry the start time and sort by it
        grid.move_cursor_to_column("folder")
        await pilot.press("s")
        older, newer = grid.visible_rows()
        assert older["started"] < newer["started"]
        await pilot.press("home", "space", "down", "space")
        assert grid.visible_rows()[0]["mark"] == "✓" and grid.visible_rows()[1]["mark"] == "✓"
        await pilot.press("v")
        await wait_screen(pilot, app, BenchmarkReportScreen, "#delta-grid")
        report = app.screen
        await wait_for(pilot, lambda: "NOT COMPARED" in text_of(report, "#compare-note"))
        assert "benchmark.client.sweep.concurrency" in text_of(report, "#compare-note")
        await pilot.press("a")  # compare anyway: the differences stay listed above the deltas
        await wait_for(pilot, lambda: report.query_one("#delta-grid", DataGrid).row_count > 0)
        note = text_of(report, "#compare-note")
        assert "compared although A and B measure different workloads" in note
        assert f"A = {older['folder']}" in note and f"B = {newer['folder']}" in note
        assert "warning: A has 3 sweep point(s), B has 1" in note  # a sweep against a single point
        await pilot.press("escape")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        await pilot.press("escape")  # esc clears the filter
        assert grid.visible_count == 4 and grid.filter_text == ""


async def test_delete_and_archive_ask_first(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        trace = find_run(app, "trace_")
        compare = find_run(app, "compare_")
        assert grid.move_cursor_to_key(str(trace.path))
        await pilot.press("D")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")
        await pilot.press("n")
        assert trace.path.exists()
        await pilot.press("D")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")
        await pilot.press("y")
        await wait_for(pilot, lambda: not trace.path.exists() and str(trace.path) not in grid.visible_keys())
        assert grid.move_cursor_to_key(str(compare.path))
        await pilot.press("A")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")
        await pilot.press("y")
        archived = compare.path.parent / ".archive" / compare.name
        await wait_for(pilot, lambda: archived.is_dir() and str(compare.path) not in grid.visible_keys())


async def test_rerun_asks_then_starts_the_recorded_config(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        run = find_run(app, "compare_")
        assert grid.move_cursor_to_key(str(run.path))
        await pilot.press("R")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")
        question = text_of(app.screen, "#confirm-question")
        assert "compare -k" in question and "softmax_triton/compare.yaml" in question
        assert "--baseline three_pass" in question and "--only one_pass,unmasked" in question
        await pilot.press("n")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        assert not app.started
        await pilot.press("Y")  # worked out in a thread worker (it may search the project's configs)
        await wait_for(pilot, lambda: app.clipboard.startswith("magpie compare -k "))
        assert "--baseline three_pass" in app.clipboard
        await pilot.press("y")
        assert app.clipboard == str(run.path)


def test_rerun_of_a_benchmark_starts_from_its_recorded_config_without_the_record_keys(project, tmp_path):
    from engine.runs.catalog import RunCatalog
    from magpie_tui.rerun import rerun_request
    catalog = RunCatalog([project / "runs"])
    catalog.refresh()
    bench = next(r for r in catalog.sorted_runs() if r.mode == "benchmark")
    request = rerun_request(bench, tmp_path / "results")
    assert request.mode == "benchmark" and Path(request.benchmark_config).exists()
    check = check_config(request.benchmark_config)
    assert check.ok, check.problems  # no 'overrides' key


async def test_edit_opens_the_editor_and_revalidates(app, project, monkeypatch, tmp_path):
    editor = tmp_path / "fake-editor.sh"  # a real editor process that appends a bad key
    editor.write_text("#!/bin/sh\nprintf '  bogus_from_editor: 1\\n' >> \"$1\"\n")
    editor.chmod(0o755)
    monkeypatch.setenv("VISUAL", str(editor))
    target = project / "benchmarks" / "builtin_tiny_cpu.yaml"
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(target)
        await pilot.pause()
        assert app.screen.query_one("#config-status").has_class("-valid")
        await pilot.press("e")
        await wait_for(pilot, lambda: app.screen.query_one("#config-status").has_class("-invalid"))
        assert "bogus_from_editor" in text_of(app.screen, "#config-problems-text")


async def test_export_a_table_as_csv_and_markdown(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        await pilot.press("slash", "m", "m", "enter", "x")
        folder = app.settings.launch_results_dir / "exports"
        await wait_for(pilot, lambda: len(list(folder.glob("*.md"))) == 1 and len(list(folder.glob("*.csv"))) == 1)
        csv_text = next(folder.glob("*.csv")).read_text()
        md_text = next(folder.glob("*.md")).read_text()
        assert csv_text.splitlines()[0].startswith("Op,Time ms,Time %,% roof")
        assert len(csv_text.splitlines()) == 3 and "aten::mm" in csv_text  # the filtered rows only
        assert md_text.startswith("| Op | Time ms |") and md_text.count("\n") == 4


# -- one full path by mouse: open a run, sort, open a kernel ------------------------------------------

def _column_x(grid: DataGrid, key: str) -> int:
    index = [c.key for c in grid.columns].index(key)
    return next(x for x in range(grid.size.width) if grid._column_at(x) == index)


async def test_open_a_run_sort_and_open_a_kernel_by_mouse(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        row = 1 + grid.visible_keys().index(str(find_run(app, "trace_").path))
        await pilot.click(grid, offset=(4, row))  # highlight
        await pilot.click(grid, offset=(4, row))  # and open
        await wait_screen(pilot, app, RunScreen, "#run-log")
        report_key = next(k for k in app.screen.query("FooterKey") if k.action == "open_report")
        await pilot.click(report_key)
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        roof = app.screen.query_one("#roofline-grid", DataGrid)
        x = _column_x(roof, "kernel_time_ms_sum")
        await pilot.click(roof, offset=(x, 0))  # ascending
        assert roof.sort_column == "kernel_time_ms_sum" and not roof.sort_reverse
        times = [r["kernel_time_ms_sum"] for r in roof.visible_rows() if r["kernel_time_ms_sum"] is not None]
        assert times == sorted(times)
        mm = 1 + [r["op_name"] for r in roof.visible_rows()].index("aten::mm")
        await pilot.click(roof, offset=(2, mm))
        await pilot.click(roof, offset=(2, mm))
        await wait_screen(pilot, app, KernelScreen, "#kernel-info")
        assert app.screen.row["op_name"] == "aten::mm"


def test_compare_rows_of_a_cancelled_report_as_a_dict(project):
    report = json.loads(next((project / "runs").glob("compare_*/compare_report.json")).read_text())
    _cancelled_compare(report)
    rows = {r["kernel"]: r for r in compare_rows(report)}
    assert rows["three_pass"]["verdict"] == "baseline" and rows["unmasked"]["verdict"] == "cancelled"


@pytest.mark.slow  # a few seconds: several screens and workers
async def test_launch_form_starts_in_a_field_shows_the_configs_values_and_warns_of_a_running_timing(
        app, project, sleeper):
    from magpie_tui.screens.launch import LaunchScreen
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        live_run(project, sleeper.pid, "busy")
        await wait_for(pilot, lambda: any(r.label == "busy" for r in app.runs))
        await pilot.press("1")
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(project / "benchmarks" / "builtin_tiny_cpu.yaml")
        await pilot.press("l")
        await wait_screen(pilot, app, LaunchScreen, "#start")
        dialog = app.screen
        assert dialog.focused is dialog.query_one("#repeats")  # typing goes into a field, not onto Start
        assert dialog.query_one("#concurrency").placeholder == "config: 4"
        assert dialog.query_one("#warmup").placeholder == "config: 2"
        await pilot.press("3")
        dialog.query_one("#seed").value = "7"
        dialog.query_one("#timeout").value = "90"
        await pilot.pause()
        preview = text_of(dialog, "#launch-preview-text")
        assert "--repeats 3" in preview and "--timeout 90.0 --seed 7" in preview
        assert "1 timing run(s) already running" in preview
        await pilot.press("escape")
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(project / "kernels" / "softmax_triton" / "compare.yaml")
        await pilot.press("l")
        await wait_screen(pilot, app, LaunchScreen, "#start")
        dialog = app.screen
        dialog.query_one("#rtol").value = "0.001"
        dialog.query_one("#no_perf").value = True
        await pilot.pause()
        preview = text_of(dialog, "#launch-preview-text")
        assert "--rtol 0.001" in preview and "--no-perf" in preview


async def test_a_running_compare_says_where_its_kernels_are(app, project, sleeper):
    ws = Workspace.create(project / "results", "compare", "steps")
    ws.events.emit("run_started", mode="compare", pid=sleeper.pid, workspace=str(ws.root), label="steps",
                   kernels=["three_pass", "one_pass", "unmasked"])
    ws.events.emit("stage", kernel="one_pass", index=1, stage="harness", state="running")
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: str(ws.root) in grid.visible_keys())
        # kernels go in parallel: the stage the furthest one is in, and how many are in it
        assert grid.get_row(str(ws.root))["progress"] == "loading · 1 of 3 kernels"


# -- a GPU timeline: streams as lanes, kernels as bars, idle gaps marked, zoom -------------------------

def test_timeline_lanes_from_the_gap_analysis_and_their_cells():
    from magpie_tui.widgets.gpu_timeline import cells, lanes_from_gaps
    lanes = lanes_from_gaps([
        {"where": "device 0 (all streams)", "start_us": "100", "end_us": "200", "gpu_waited_on_host": "True"},
        {"where": "device 0 (all streams)", "start_us": "300", "end_us": "400", "gpu_waited_on_host": "False"}])
    assert [lane.name for lane in lanes] == ["device 0"]
    assert [(s.start_us, s.end_us, s.kind) for s in lanes[0].spans] == [
        (100.0, 200.0, "host"), (200.0, 300.0, "kernel"), (300.0, 400.0, "idle")]
    assert cells(lanes[0], 100, 400, 3) == ["host", "kernel", "idle"]
    assert cells(lanes[0], 100, 400, 6) == ["host", "host", "kernel", "kernel", "idle", "idle"]


async def test_timeline_tab_draws_the_traces_streams_and_zooms(app, project):
    import yaml
    trace = next(p for p in (project / "runs").iterdir() if p.name.startswith("trace_"))
    cfg = yaml.safe_load((trace / "config.yaml").read_text())
    cfg["trace_dir"] = str(Path(__file__).resolve().parents[1] / "data/tracelens-golden/synthetic_vllm/"
                           "synthetic_vllm.json.gz")
    (trace / "config.yaml").write_text(yaml.safe_dump(cfg))
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        await pilot.press("l")
        timeline = app.screen.query_one("#gpu-timeline")
        await wait_for(pilot, lambda: len(timeline.lanes) == 2)
        assert [lane.name for lane in timeline.lanes] == ["gpu0 s20", "gpu0 s7"] and app.screen.focused is timeline
        assert "kernels per stream" in timeline.source
        row = timeline.render_line(3).text  # the lane of stream 7: kernels and the gaps it waited
        assert "█" in row and "!" in row
        await pilot.press("0")  # it opens on a step of the stage shown; 0: the whole trace
        whole = timeline.view
        assert whole == timeline.extent
        await pilot.press("plus", "plus")
        assert timeline.view[1] - timeline.view[0] == pytest.approx((whole[1] - whole[0]) / 4)
        await pilot.press("right")
        assert timeline.view[0] > whole[0]
        await pilot.press("0")
        assert timeline.view == whole


# -- audit of issue 15: the items above that had no Pilot test of their own ---------------------------

async def _open_kernel_of(pilot, app, op: str) -> KernelScreen:
    app.open_report(find_run(app, "trace_"))
    await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
    grid = app.screen.query_one("#roofline-grid", DataGrid)
    assert grid.move_cursor_to_key(next(k for k, r in zip(grid.visible_keys(), grid.visible_rows())
                                        if r["op_name"] == op))
    grid.focus()
    await pilot.press("enter")
    await wait_screen(pilot, app, KernelScreen, "#kernel-info")
    kernel = app.screen
    await wait_for(pilot, lambda: "searching" not in text_of(kernel, "#kernel-info"), 30)
    return kernel


async def test_edit_the_kernels_source_in_the_editor_and_copy_its_path(app, project, monkeypatch, tmp_path):
    from magpie_tui.widgets.code_view import CodeView
    editor = tmp_path / "fake-editor.sh"  # a real editor process that appends a line to the file
    editor.write_text("#!/bin/sh\nprintf '# added_by_the_editor\\n' >> \"$1\"\n")
    editor.chmod(0o755)
    monkeypatch.setenv("VISUAL", str(editor))
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        kernel = await _open_kernel_of(pilot, app, "aten::gelu")
        view = kernel.query_one(CodeView)
        source = project / "kernels" / "kernelbench_l1" / "kb026_gelu.py"
        assert view.path == source and "added_by_the_editor" not in view.text
        await pilot.press("e")
        await wait_for(pilot, lambda: "added_by_the_editor" in view.text)  # read again on return
        assert source.read_text().endswith("# added_by_the_editor\n")
        await pilot.press("y")
        assert app.clipboard == str(source)


async def test_kernel_and_timeline_say_which_counts_are_the_stages_and_which_the_whole_traces(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        await pilot.press("t")  # the Timeline tab: the stage's total beside the whole trace's gaps
        note = text_of(app.screen, "#gaps-note")
        assert note.startswith("GPU idle gaps of the whole trace, all stages")
        assert text_of(app.screen, "#timeline-note").startswith("stage decode_only: ")
        await pilot.press("escape")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        info = text_of(await _open_kernel_of(pilot, app, "aten::mm"), "#kernel-info")
        # "1 call" and "calls 12" read as two counts of two things, each named
        assert "1 call(s) in the stage" in info and "whole trace: calls 12" in info


async def test_a_running_benchmark_shows_its_live_numbers_in_the_runs_list(app, project, sleeper):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        ws = live_run(project, sleeper.pid, "live")
        ws.events.emit("progress", phase="measure", done=30, total=40, completed=30, failed=2,
                       output_tok_s=232.3, ttft_p50_ms=9.148, tpot_p50_ms=3.871)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: str(ws.root) in grid.visible_keys())
        # the counts in Progress; tok/s, TTFT and TPOT in columns of their own
        await wait_for(pilot, lambda: grid.get_row(str(ws.root))["progress"] == "30/40 · 2 failed")
        row = grid.get_row(str(ws.root))
        assert (row["tok_s"], row["ttft"], row["tpot"]) == (232.3, 9.148, 3.871)


async def test_histograms_stand_apart_with_their_titles_at_80_columns(app, project):
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "benchmark_builtin-tiny_20261129_192724"))
        await wait_screen(pilot, app, BenchmarkReportScreen, "#bench-grid")
        await pilot.press("right_square_bracket")
        await pilot.pause()
        hists = [app.screen.query_one(f"#hist-{n}") for n in ("ttft", "tpot", "itl", "e2el")]
        for left, right in zip(hists, hists[1:]):
            assert right.region.x > left.region.right  # a column between: the titles do not run together
        for hist, name in zip(hists, ("TTFT", "TPOT", "ITL", "E2EL")):
            assert hist.render_line(0).text.strip().startswith(name)


async def test_the_footer_keeps_every_roofline_key_at_100_columns(app, project):
    # The command palette's key is not in the footer (ctrl+p still opens it; Help says so): at
    # 100 columns it used to sit over the footer's last key, Help's `?`.
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey
    async with app.run_test(size=(100, 30)) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        await pilot.pause()
        footer = app.screen.query_one(Footer)
        keys = list(footer.query(FooterKey))
        covers = [k.region for k in keys if k.has_class("-command-palette")]
        shown = {k.key for k in keys if not k.has_class("-command-palette") and k.region.width
                 and k.region.right <= 100 and not any(k.region.overlaps(c) for c in covers)}
        assert {"question_mark", "ctrl+q", "slash"} <= shown


# -- issue 15, the last two: the run folder and the app's keys at 80 and 100 columns -----------------------

def footer_keys_in_view(app, width: int) -> set[str]:
    """The keys the footer shows whole within ``width`` columns."""
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey
    keys = app.screen.query_one(Footer).query(FooterKey)
    return {k.key for k in keys if k.region.width and k.region.right <= width}


def row_cells(grid: DataGrid, y: int) -> dict[str, str]:
    """The cells of grid line ``y`` as drawn (no scrolling), by column key: the text a user reads."""
    line, cells, x = grid.render_line(y).text, {}, 0
    for key in grid.shown_columns:
        width = grid.column_widths[key] + 2
        cells[key] = line[x:x + width].strip()
        x += width
    return cells


@pytest.mark.parametrize("size", [(80, 24), (104, 30)])
async def test_the_runs_list_shows_state_folder_label_and_progress_without_scrolling(app, project, size):
    """At 104 columns: state, folder, label, TTFT, TPOT, tok/s and progress; at 80 the folder steps
    aside too (the label tells runs apart; ``y`` copies the folder)."""
    from magpie_tui.screens.runs import progress_cell
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        await pilot.pause()
        header = row_cells(grid, 0)
        shown = ("state", "label", "ttft", "tpot", "tok_s", "progress") + (("folder",) if size[0] >= 100 else ())
        assert [header[k] for k in shown] == ["State", "Label", "TTFT", "TPOT", "tok/s", "Progress", "Folder"][:len(shown)]
        assert ("folder" in grid.shown_columns) == (size[0] >= 100)
        assert sum(grid.column_widths[k] + 2 for k in grid.shown_columns) <= size[0]  # all in view
        for y, key in enumerate(grid.visible_keys(), start=1):
            run, cells = next(r for r in app.runs if str(r.path) == key), row_cells(grid, y)
            assert cells["state"] == run.state
            if cells["progress"] != progress_cell(run):
                # a progress text longer than its column runs over the empty TTFT, TPOT and tok/s
                # cells on its left (a compare's winner): read from where it starts
                assert cells["ttft"] == "" or not cells["ttft"][0].isdigit(), cells
                start = sum(grid.column_widths[k] + 2 for k in grid.shown_columns[:grid.shown_columns.index("ttft")])
                drawn = grid.render_line(y).text[start:].strip().rstrip("…").rstrip()
                assert drawn and progress_cell(run).startswith(drawn), (drawn, progress_cell(run))
            # a folder too long keeps its mode prefix and its time stamp and id (the part that tells runs apart)
            assert "folder" not in cells or cells["folder"] == run.name or (
                cells["folder"].startswith(run.name[:12]) and cells["folder"].endswith(run.name[-13:]))
            label = run.label
            assert cells["label"].rstrip("…") == label[:len(cells["label"].rstrip("…"))]
            assert len(cells["label"]) >= min(len(label), 16)
        # the columns the folder name already tells step aside; they come back with room, uncut
        assert "mode" not in grid.shown_columns and "started" not in grid.shown_columns
        await pilot.resize_terminal(240, 30)  # every column, the numbers' too
        await wait_for(pilot, lambda: "started" in grid.shown_columns)
        assert grid.shown_columns == [c.key for c in grid.columns]
        assert {y: row_cells(grid, y)["folder"] for y in range(1, 5)} == {
            y: Path(k).name for y, k in enumerate(grid.visible_keys(), start=1)}
        # sorting still works by a column that stepped aside, and the folder stays put when scrolling sideways
        await pilot.resize_terminal(*size)
        await wait_for(pilot, lambda: "started" not in grid.shown_columns)
        grid.sort_by("started")
        await pilot.press("right", "right", "right", "right")
        assert grid.cursor_column_key in grid.shown_columns
        await pilot.pause()
        first = next(r for r in app.runs if str(r.path) == grid.visible_keys()[0])
        if size[0] >= 100:
            assert row_cells(grid, 1)["folder"].endswith(first.name[-13:])
        assert first.started == min(r.started for r in app.runs)


async def test_a_sort_by_a_column_hidden_at_this_width_is_told(app, project):
    async with app.run_test(size=(240, 30)) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4 and "started" in grid.shown_columns)
        grid.move_cursor_to_column("started")
        await pilot.press("s", "s")  # newest first
        assert grid.sort_column == "started" and grid.sort_reverse
        summary = lambda: text_of(app.screen, "#runs-summary")  # noqa: E731
        assert "sorted by" not in summary()  # the header shows it: Started ▼
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: "started" not in grid.shown_columns)
        await pilot.pause()
        assert "Started" not in grid.render_line(0).text
        assert "sorted by Started ▼ (hidden at this width)" in summary()
        lines = app.screen.query_one("#runs-summary").render_line(0).text
        assert "sorted by Started ▼ (hidden at this width)" in lines  # within the 80 columns, not cut
        await pilot.resize_terminal(240, 30)
        await wait_for(pilot, lambda: "started" in grid.shown_columns)
        await pilot.pause()
        assert "sorted by" not in summary() and "Started ▼" in grid.render_line(0).text


# -- the footer keeps each screen's main keys at 80 columns, plus ? and quit ---------------------------------
HELP_AND_QUIT = {"question_mark", "ctrl+q"}


async def test_the_footer_keeps_the_main_keys_of_the_configs_diff_and_launch_screens_at_80_columns(app, project):
    from magpie_tui.screens.launch import LaunchScreen
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert HELP_AND_QUIT | {"l", "d", "e"} <= footer_keys_in_view(app, 80)
        app.screen.select(project / "kernels" / "softmax_triton" / "compare.yaml")
        await pilot.press("d")
        await wait_screen(pilot, app, DiffScreen, "KeysFooter FooterKey")
        await pilot.pause()
        # the diff view's own keys come first in the footer; compare, the screen's main key, stays
        assert HELP_AND_QUIT | {"escape", "c", "s", "n"} <= footer_keys_in_view(app, 80)
        await pilot.press("escape")
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(project / "benchmarks" / "builtin_tiny_cpu.yaml")
        await pilot.press("l")
        await wait_screen(pilot, app, LaunchScreen, "#start")
        screen_region = app.screen.region
        for button in ("#start", "#cancel"):  # a dialog: its keys are on its buttons, both in view
            region = app.screen.query_one(button).region
            assert region.width and screen_region.contains_region(region)
        assert "ctrl+s" in str(app.screen.query_one("#start").label)


async def test_the_footer_keeps_the_main_keys_of_the_runs_run_and_report_screens_at_80_columns(app, project):
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        await pilot.pause()
        assert HELP_AND_QUIT | {"enter", "r", "slash", "c", "s"} <= footer_keys_in_view(app, 80)
        app.open_run(find_run(app, "compare_"))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        await pilot.pause()
        assert HELP_AND_QUIT | {"escape", "r", "c", "l", "right_square_bracket"} <= footer_keys_in_view(app, 80)
        await pilot.press("escape")
        app.open_report(find_run(app, "compare_"))
        await wait_screen(pilot, app, CompareReportScreen)
        await pilot.pause()
        assert HELP_AND_QUIT | {"escape", "d", "s"} <= footer_keys_in_view(app, 80)
        await pilot.press("escape")
        app.open_report(find_run(app, "benchmark_builtin-tiny_20261129_192724"))
        await wait_screen(pilot, app, BenchmarkReportScreen, "#bench-grid")
        await pilot.pause()
        assert HELP_AND_QUIT | {"escape", "b", "t", "right_square_bracket", "s"} <= footer_keys_in_view(app, 80)
        await pilot.resize_terminal(100, 30)  # with room, the side keys come back
        await wait_for(pilot, lambda: {"1", "2"} | HELP_AND_QUIT <= footer_keys_in_view(app, 100))


async def test_the_footer_keeps_the_main_keys_of_the_roofline_and_kernel_screens_at_80_columns(app, project):
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen, "#roofline-grid")
        await pilot.pause()
        tabs = {"escape", "slash", "t", "p", "l"}
        assert HELP_AND_QUIT | tabs | {"s"} <= footer_keys_in_view(app, 80)
        await pilot.press("l")  # the timeline's zoom keys come first; the screen's tab keys stay
        await wait_for(pilot, lambda: HELP_AND_QUIT | tabs | {"plus", "minus"} <= footer_keys_in_view(app, 80))
        await pilot.press("t")
        await pilot.pause()
        await pilot.press("escape")
        await _open_kernel_of(pilot, app, "aten::mm")
        await pilot.pause()
        assert HELP_AND_QUIT | {"escape", "d", "n", "s"} <= footer_keys_in_view(app, 80)


async def test_the_footer_keeps_the_main_keys_of_the_loop_screen_at_80_columns(project):
    from tui.test_loop_screen import dead_pid, finished_steps, make_loop, open_loop
    make_loop(project, finished_steps(dead_pid()), dead_pid(), finished=True)
    app = build_app(project)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_loop(pilot, app)
        await pilot.pause()
        assert HELP_AND_QUIT | {"escape", "o", "r", "c", "R", "right_square_bracket"} <= footer_keys_in_view(app, 80)
        tabs = screen.query_one("#loop-tabs")
        await pilot.press("right_square_bracket")  # the next tab, the chain keeps the focus
        assert tabs.active == "tab-bottlenecks" and screen.focused is screen.query_one("#loop-chain")
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert tabs.active == "tab-verdict"
