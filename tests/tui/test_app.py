"""Pilot tests: each screen driven by keys on recorded run folders, plus live runs that the test
writes (or really starts) while the app watches."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from tui.conftest import build_app, find_run, open_launch, open_runs, wait_for, wait_screen

from engine.runs.workspace import Workspace
from magpie_tui.screens.configs import ConfigsScreen
from magpie_tui.screens.confirm import ConfirmScreen
from magpie_tui.screens.diff import DiffScreen
from magpie_tui.screens.help import HelpScreen
from magpie_tui.screens.kernel import KernelScreen, candidate_kernels, kernels_of_op
from magpie_tui.screens.launch import LaunchScreen
from magpie_tui.screens.reports import BenchmarkReportScreen, CompareReportScreen, compare_rows, load_facts
from magpie_tui.screens.roofline import RooflineScreen
from magpie_tui.screens.run import RunScreen
from magpie_tui.screens.runs import RunsScreen
from magpie_tui.widgets.data_grid import DataGrid
from magpie_tui.widgets.diff_view import DiffView
from magpie_tui.widgets.run_log import RunLog

SIZE = (140, 45)


# -- configs and launch -----------------------------------------------------------------------------

async def test_configs_validates_the_selected_file_with_line_numbers(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        screen = app.screen
        screen.select(project / "kernels" / "softmax_triton" / "compare.yaml")
        await pilot.pause()
        status = str(screen.query_one("#config-status").render())
        assert "kernel config, valid" in status and "three_pass, one_pass, unmasked" in status
        bad = project / "benchmarks" / "broken.yaml"
        bad.write_text("benchmark:\n  framework: builtin\n  envs:\n    CONC: 2\n  clinet:\n    warmup: 1\n")
        screen.select(bad)
        await pilot.pause()
        problems = str(screen.query_one("#config-problems-text").render())
        # shown relative to the project: absolute paths wrap at 80 columns
        assert "error: benchmarks/broken.yaml:5" in problems and "clinet" in problems
        assert screen.query_one("#config-status").has_class("-invalid")


async def test_config_changed_on_disk_is_revalidated(project):
    app = build_app(project, watch_files=True)
    target = project / "benchmarks" / "builtin_tiny_cpu.yaml"
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(target)
        await pilot.pause()
        assert app.screen.query_one("#config-status").has_class("-valid")
        await pilot.pause(0.5)  # the watcher is running
        target.write_text(target.read_text() + "  bogus_key: 1\n")
        await wait_for(pilot, lambda: app.screen.query_one("#config-status").has_class("-invalid"), timeout=15)
        assert "bogus_key" in str(app.screen.query_one("#config-problems-text").render())


async def test_launch_form_previews_overrides_and_refuses_bad_values(app, project):
    async with app.run_test(size=SIZE) as pilot:
        dialog = await open_launch(pilot, app, project / "benchmarks" / "builtin_tiny_cpu_profiled.yaml")
        dialog.query_one("#concurrency").value = "3"
        await pilot.pause()
        preview = str(dialog.query_one("#launch-preview-text").render())
        assert "benchmark.envs.CONC: '4' -> '3' (--concurrency)" in preview
        assert "--concurrency 3" in preview
        dialog.query_one("#profiler").value = "off"
        await pilot.pause()
        preview = str(dialog.query_one("#launch-preview-text").render())
        assert "--no-torch-profiler" in preview and "profiler.torch_profiler.enabled: True -> False" in preview
        await pilot.press("escape")
        await open_launch(pilot, app, project / "kernels" / "softmax_triton" / "compare.yaml")
        app.screen.query_one("#repeats").value = "2"
        await pilot.pause()
        assert "at least 3 repeats" in str(app.screen.query_one("#launch-preview-text").render())
        assert app.screen.query_one("#start").disabled
        await pilot.press("ctrl+s")  # refused: nothing starts
        assert isinstance(app.screen, LaunchScreen) and not app.started


async def test_a_config_broken_after_its_preview_is_refused_at_start(app, project):
    config = project / "kernels" / "softmax_triton" / "compare.yaml"
    async with app.run_test(size=SIZE) as pilot:
        await open_launch(pilot, app, config)
        assert not app.screen.query_one("#start").disabled
        config.write_text("kernels: [oops\n")  # edited in another window after the preview
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, LaunchScreen) and not app.started  # nothing started, the app lives
        assert "configuration problem" in str(app.screen.query_one("#launch-preview-text").render())


@pytest.mark.slow
async def test_launch_a_compare_watch_it_and_open_its_report(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_launch(pilot, app, project / "kernels" / "softmax_triton" / "compare.yaml")
        app.screen.query_one("#repeats").value = "5"
        app.screen.query_one("#baseline").value = "three_pass"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_screen(pilot, app, RunsScreen)
        pid = next(iter(app.started))
        await wait_for(pilot, lambda: any(r.pid == pid for r in app.runs), timeout=30)
        run = next(r for r in app.runs if r.pid == pid)
        assert run.mode == "compare"
        app.open_run(run)
        await wait_screen(pilot, app, RunScreen, "#run-log")
        await wait_for(pilot, lambda: run.is_finished, timeout=240)
        assert run.state == "completed", run.error
        log = app.screen.query_one("#run-log", RunLog)
        await wait_for(pilot, lambda: log.lines_shown > 0)
        assert log.tail.path.parent.name == ".console"  # the console of the run we started
        await pilot.press("r")
        await wait_screen(pilot, app, CompareReportScreen)
        rows = app.screen.query_one(DataGrid).visible_rows()
        verdicts = {r["kernel"]: r["verdict"] for r in rows}
        assert verdicts["three_pass"] == "baseline" and verdicts["unmasked"] == "incorrect"
        assert rows[0]["kernel"] == "one_pass" and rows[0]["rank"] == 1


# -- runs -------------------------------------------------------------------------------------------

async def test_runs_lists_recorded_runs_and_follows_a_live_one(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        names = {r.name.split("_2026")[0] for r in app.runs}
        assert names == {"benchmark_builtin-tiny", "compare_three_pass", "trace_synthetic_vllm"}
        assert {r.state for r in app.runs} == {"completed"}
        # A run written by someone else (the CLI, another session) while the app watches.
        ws = Workspace.create(project / "results", "benchmark", "live")
        ws.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(ws.root), label="live")
        await wait_for(pilot, lambda: any(r.label == "live" for r in app.runs))
        table = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: str(ws.root) in table.visible_keys())
        assert table.get_row(str(ws.root))["state"] == "running"
        ws.events.emit("progress", phase="measure", done=30, total=40)
        await wait_for(pilot, lambda: table.get_row(str(ws.root))["progress"] == "30/40")
        ws.events.emit("run_finished", state="failed", exit_code=1)
        await wait_for(pilot, lambda: table.get_row(str(ws.root))["state"] == "failed")
        assert table.get_row(str(ws.root))["progress"] == "failed at 30/40 · exit 1"


@pytest.mark.slow
async def test_cancel_a_real_run_from_the_runs_screen(app, project):
    from engine.jobs.launch import form_request
    from magpie_tui.launching import start_run
    started = start_run(form_request("benchmark", project / "benchmarks" / "builtin_tiny_cpu.yaml", num_prompts=4000),
                        project / "results")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await open_runs(pilot, app)
            await wait_for(pilot, lambda: any(r.pid == started.pid and r.state == "running" for r in app.runs),
                           timeout=120)
            run = next(r for r in app.runs if r.pid == started.pid)
            table = app.screen.query_one("#runs-table", DataGrid)
            await wait_for(pilot, lambda: table.move_cursor_to_key(str(run.path)))
            await pilot.press("c")
            await wait_screen(pilot, app, ConfirmScreen, "#yes")
            await pilot.press("y")
            await wait_for(pilot, lambda: run.state == "cancelled", timeout=120)
        assert started.process.wait(timeout=30) == 130
        report = json.loads((run.path / "benchmark_report.json").read_text())
        assert report["state"] == "cancelled"
    finally:
        if started.process.poll() is None:
            os.killpg(started.pid, signal.SIGKILL)
            started.process.wait()


# -- run screen --------------------------------------------------------------------------------------

async def test_run_screen_tails_the_log_and_formats_events(app, project):
    ws = Workspace.create(project / "results", "benchmark", "tail")
    ws.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(ws.root), label="tail")
    log_file = ws.root / "server.log"
    log_file.write_text("\x1b[32mserver ready\x1b[0m\n")
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.label == "tail" for r in app.runs))
        app.open_run(next(r for r in app.runs if r.label == "tail"))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        log = app.screen.query_one("#run-log", RunLog)
        await wait_for(pilot, lambda: log.lines_shown == 1)
        assert log.lines[0] == "server ready"  # ANSI stripped for display, kept in the file
        with open(log_file, "a") as fh:
            for i in range(5000):
                fh.write(f"line {i}\n")
        await wait_for(pilot, lambda: log.lines_shown == 5001)
        assert log.lines[-1] == "line 4999"
        ws.events.emit("stage", stage="server", state="SUCCESS", ready_s=1.5)
        events = app.screen.query_one("#run-events", RunLog)
        await wait_for(pilot, lambda: any("stage" in line and "ready_s=1.5" in line for line in events.lines))
        ws.write_text("summary.txt", "all good\n")
        ws.events.emit("run_finished", state="completed", exit_code=0)
        await wait_for(pilot, lambda: "all good" in str(app.screen.query_one("#run-summary").render()))


# -- reports -----------------------------------------------------------------------------------------

async def test_compare_report_ranks_correct_kernels_and_says_why_others_are_not(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "compare_"))
        await wait_screen(pilot, app, CompareReportScreen)
        rows = app.screen.query_one(DataGrid).visible_rows()
        assert [r["kernel"] for r in rows] == ["one_pass", "three_pass", "unmasked"]
        assert rows[0]["verdict"] == "faster" and rows[0]["ci_low"] > 1.0
        whys = [str(w.render()) for w in app.screen.query(".incorrect-why")]
        assert len(whys) == 1 and "unmasked" in whys[0] and "NaN/Inf where the reference is finite" in whys[0]
        await pilot.press("d")
        await wait_screen(pilot, app, DiffScreen)
        assert app.screen.baseline == "three_pass"


async def test_benchmark_report_metrics_distributions_sweep_and_side_by_side(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        sweep = next(r for r in app.runs if r.mode == "benchmark" and
                     json.loads(r.report_path.read_text()).get("sweep"))
        app.open_report(sweep)
        await wait_screen(pilot, app, BenchmarkReportScreen)
        grid = app.screen.query_one("#bench-grid", DataGrid)
        row = next(r for r in grid.visible_rows() if r["key"] == "output_throughput")
        report = json.loads(sweep.report_path.read_text())
        assert row["value"] == pytest.approx(report["result"]["output_throughput"])
        # Two repeats: no interval is printed, the report view says why.
        assert row["n"] == 2 and row["ci_low"] is None and row["ci_high"] is None
        assert "not meaningful with fewer than 3 repeats (this run has 2)" in str(
            app.screen.query_one("#interval-note").render())
        detail = json.loads((sweep.path / "requests" / "point0_repeat0.json").read_text())
        assert len(app.screen.query_one("#hist-ttft").values) == len(detail["ttfts"]) == 10
        assert app.screen.query_one("#sweep-plot") is not None
        await pilot.press("b")
        await pilot.pause()
        await pilot.press("enter")  # the only other benchmark run
        # A sweep against a single point: another workload, refused until asked for (a).
        await wait_for(pilot, lambda: "NOT COMPARED" in str(app.screen.query_one("#compare-note").render()))
        assert app.screen.query_one("#delta-grid", DataGrid).row_count == 0
        assert not app.screen.query_one("#delta-grid", DataGrid).display
        await pilot.press("a")
        await wait_for(pilot, lambda: app.screen.query_one("#delta-grid", DataGrid).row_count > 0)
        deltas = {r["metric"]: r for r in app.screen.query_one("#delta-grid", DataGrid).visible_rows()}
        assert deltas["Output tok/s"]["noise"] in ("inside", "outside")  # names with units, not snake_case


def test_benchmark_title_says_how_the_load_was_made():
    assert load_facts({"dataset": {"prompts": "text", "tokenizer": "builtin", "prefix_len": 8},
                       "environment": {"http_client": "lean"}}) == \
        " · text prompts (builtin) · shared prefix 8 · lean HTTP client"
    assert load_facts({"dataset": {"prompts": "token ids", "prefix_len": 0}}) == " · token-id prompts"
    assert load_facts({}) == ""  # a report from before these keys


async def test_roofline_sort_filter_and_drill_down_to_the_kernel(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen)
        screen = app.screen
        assert list(screen.stages) == ["decode_only", "prefilldecode"]
        grid = screen.query_one("#roofline-grid", DataGrid)
        times = [r["kernel_time_ms_sum"] for r in grid.visible_rows()]
        assert times == sorted(times, reverse=True) and len(times) == 9
        grid.sort_by("arithmetic_intensity_flops_per_byte", reverse=False)
        ais = [r["arithmetic_intensity_flops_per_byte"] for r in grid.visible_rows()
               if r["arithmetic_intensity_flops_per_byte"] is not None]
        assert ais == sorted(ais)
        screen.query_one("#bound").value = "MEMORY_BOUND"
        await pilot.pause()
        assert {r["roofline_bound"] for r in grid.visible_rows()} == {"MEMORY_BOUND"}
        screen.query_one("#bound").clear()
        await pilot.press("slash")
        await pilot.press(*"mm")
        await pilot.pause()
        assert {r["op_name"] for r in grid.visible_rows()} == {"aten::mm", "aten::addmm"}
        grid.focus()
        grid.sort_by("kernel_time_ms_sum", reverse=True)
        grid.move_cursor_to_key(next(k for k, r in zip(grid.visible_keys(), grid.visible_rows())
                                     if r["op_name"] == "aten::mm"))
        await pilot.press("enter")
        await wait_screen(pilot, app, KernelScreen)
        kernel = app.screen
        assert kernel.kernel_names == ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize256x128x64_kernel"]
        info = str(kernel.query_one("#kernel-info").render())
        assert "calls 12, total 1200.0 us" in info
        await wait_for(pilot, lambda: "searching" not in str(kernel.query_one("#kernel-info").render()), 30)
        assert "vendor" in str(kernel.query_one("#kernel-info").render()).lower() or \
            "not resolved" in str(kernel.query_one("#kernel-info").render())


def test_kernel_candidates_come_from_project_configs_with_their_latest_results(project, tmp_path):
    from engine.runs.catalog import RunCatalog
    catalog = RunCatalog([project / "runs"])
    catalog.refresh()
    found = candidate_kernels(project, "aten::_softmax", ["triton_softmax_kernel_0d1d"], None, catalog.sorted_runs())
    by_id = {c["kernel"]: c for c in found}
    assert {"three_pass", "one_pass", "unmasked"} <= set(by_id)
    assert by_id["one_pass"]["verdict"] == "faster" and by_id["unmasked"]["correct"] == "FAILED"
    assert by_id["one_pass"]["source"].name == "softmax_onepass.py"
    assert candidate_kernels(project, "aten::mm", ["nvjet_gemm"], None, []) == []
    # the op -> kernel mapping of the recorded trace analysis
    trace = next(p for p in (project / "runs").iterdir() if p.name.startswith("trace_"))
    assert kernels_of_op(trace, "decode_only", {"op_name": "aten::mm"}) == \
        ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize256x128x64_kernel"]


def test_compare_rows_from_a_recorded_report(project):
    report = json.loads(next((project / "runs").glob("compare_*/compare_report.json")).read_text())
    rows = compare_rows(report)
    assert [r["rank"] for r in rows] == [1, 2, None]
    assert rows[2]["correct"] == "no" and "NaN" in rows[2]["why"]


# -- diff, help, keymap, theme --------------------------------------------------------------------------

async def test_diff_switches_candidates_and_launches_a_compare_of_the_marked_ones(app, project):
    config = project / "kernels" / "softmax_triton" / "compare.yaml"
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        app.screen.select(config)
        await pilot.press("d")
        await wait_screen(pilot, app, DiffScreen)
        view = app.screen.query_one(DiffView)
        assert view.path_a.endswith("softmax_baseline.py") and view.path_b.endswith("softmax_onepass.py")
        await wait_for(pilot, lambda: view.hunk_count > 0)
        candidates = app.screen.query_one("#candidate-list")
        candidates.focus()
        await pilot.press("down")
        await wait_for(pilot, lambda: view.path_b.endswith("softmax_unmasked.py"))
        await pilot.press("space")
        await pilot.press("c")
        await wait_screen(pilot, app, ConfirmScreen, "#yes")  # a compare is expensive: asked first
        assert "unmasked against three_pass" in str(app.screen.query_one("#confirm-question").render())
        await pilot.press("y")
        await wait_for(pilot, lambda: bool(app.started))
        started = next(iter(app.started.values()))
        try:
            assert started.argv[3:5] == ["compare", "-k"] and "--only" in started.argv
            assert started.argv[started.argv.index("--only") + 1] == "unmasked"
        finally:
            os.killpg(started.pid, signal.SIGTERM)
            started.process.wait(timeout=30)


async def test_help_lists_binding_ids_and_keymap_remaps_keys(project, tmp_path):
    settings_file = Path(os.environ["MAGPIE_TUI_CONFIG"])
    settings_file.parent.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(yaml.safe_dump({"keymap": {"app.runs": "f2"}}))
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        await pilot.press("f2")
        await wait_screen(pilot, app, RunsScreen)
        await pilot.press("f1")
        await wait_screen(pilot, app, HelpScreen, "#help-table")
        table = app.screen.query_one("#help-table")

        def ids():
            return {row[3]: row[1] for row in (table.get_row_at(i) for i in range(table.row_count))}
        # the Runs screen's keys, its table's and the app's: not the other screens'
        assert ids()["app.runs"] == "f2" and ids()["runs.cancel"] == "c" and ids()["grid.sort"] == "s"
        assert ids()["runs.filter"] == "/" and "diff.toggle_split" not in ids() and "roofline.filter" not in ids()
        await pilot.press("a")  # every screen's
        await wait_for(pilot, lambda: "diff.toggle_split" in ids())
        assert ids()["diff.toggle_split"] == "s" and "roofline.filter" in ids() and "launch.start" in ids()
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert len({row[3] for row in rows}) == len(rows)  # each binding once


async def test_theme_choice_persists(project):
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        assert app.theme == "magpie-dark"
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.theme == "magpie-high-contrast"
    saved = yaml.safe_load(Path(os.environ["MAGPIE_TUI_CONFIG"]).read_text())
    assert saved == {"theme": "magpie-high-contrast"}
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "magpie-high-contrast"


async def test_works_at_80x24_in_256_colours(project, monkeypatch):
    import textual.constants
    monkeypatch.setattr(textual.constants, "COLOR_SYSTEM", "256")  # what TEXTUAL_COLOR_SYSTEM=256 sets
    app = build_app(project)
    assert app.console.color_system == "256"
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, "trace_"))
        await wait_screen(pilot, app, RooflineScreen)
        await pilot.press("p")
        await pilot.pause()
        assert app.screen.query_one("#roofline-tabs").active == "tab-plot"
        svg = app.export_screenshot()
        assert "roofline" in svg.lower()


def test_sighup_ends_the_app_without_spinning(project, tmp_path):
    """A dropped SSH session sends SIGHUP: the app must exit, not spin at 100% CPU."""
    import pty
    import subprocess
    import sys
    main, child = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "magpie_tui", str(project)], stdin=child, stdout=child,
                            stderr=child, env=env, start_new_session=True)
    os.close(child)
    try:
        deadline = time.monotonic() + 30
        seen = b""
        while b"Configs" not in seen and time.monotonic() < deadline:  # the footer is drawn
            try:
                seen += os.read(main, 65536)
            except OSError:
                break
        assert b"Configs" in seen, seen[-500:]
        proc.send_signal(signal.SIGHUP)
        os.close(main)  # the terminal is gone
        assert proc.wait(timeout=15) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_command_palette_offers_the_screens_actions(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Configs", "Runs", "Help", "Open", "Report", "Cancel", "Re-run", "Archive"} <= set(titles)
        assert any(t.startswith("Open run compare_three_pass") for t in titles)
        report = next(c for c in app.get_system_commands(app.screen) if c.title == "Report")
        report.callback()
        await wait_screen(pilot, app, RooflineScreen)  # the newest run is the trace analysis
