"""The walk at 80x24 by keyboard alone (launch a compare, watch it, read its verdict; launch a
benchmark, read TTFT/TPOT live, cancel it; open a loop): one test per thing that was cut off,
needed another key than a habit's, or covered what it reported on."""

from __future__ import annotations

import json
import sys

from tui.conftest import find_run, open_launch, open_runs, wait_for, wait_screen

from engine.runs.state import kernel_figures
from magpie_tui.screens.configs import ConfigsScreen
from magpie_tui.screens.help import HelpScreen
from magpie_tui.screens.run import RunScreen

SMALL = (80, 24)


def _with_figures(project) -> None:
    """The recorded compare's ``run_finished`` carries the report's figures (the winner), as a
    compare run now writes it."""
    run = next((project / "runs").glob("compare_*"))
    report = json.loads((run / "compare_report.json").read_text())
    figures = kernel_figures(report)
    lines = (run / "events.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["figures"] = figures.model_dump(exclude_none=True)
    (run / "events.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")


async def _compare_events(pilot, app):
    """The recorded compare's Run screen on its Events tab: the tab's log."""
    app.open_run(find_run(app, "compare_"))
    await wait_screen(pilot, app, RunScreen, "#run-log")
    await pilot.press("right_square_bracket", "right_square_bracket")  # Events
    return app.screen.query_one("#run-events")


async def test_a_finished_compares_winner_stays_in_the_run_header_at_80_columns(app, project):
    """The header ends with the winner line: at 80 columns it wraps instead of losing it (it read
    '… · base three_pass  ·' with the elapsed time and the winner cut off)."""
    _with_figures(project)
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        app.open_run(find_run(app, "compare_"))
        await wait_screen(pilot, app, RunScreen, "#run-kernels")
        status = app.screen.query_one("#run-status")
        await wait_for(pilot, lambda: "winner" in str(status.render()))
        await pilot.pause()
        shown = " ".join(status.render_line(y).text.strip() for y in range(status.size.height))
        assert "winner" in shown and "exit 0" in shown, shown


async def test_the_config_tree_tells_every_sibling_apart_at_80_columns(app, project):
    """Seven benchmark configs start with ``builtin_``: cut in the middle with an even split they
    read as two strings (``builtin_…pu.yaml`` three times, ``builtin_…ed.yaml`` four times)."""
    from textual.widgets import DirectoryTree
    async with app.run_test(size=SMALL) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        tree = app.screen.query_one(DirectoryTree)
        await wait_for(pilot, lambda: any(str(n.label) == "benchmarks" for n in tree.root.children))
        next(n for n in tree.root.children if str(n.label) == "benchmarks").expand()
        await wait_for(pilot, lambda: any("yaml" in tree.render_line(y).text for y in range(tree.size.height)))
        lines = [tree.render_line(y).text.rstrip(" ▁▂▃▄▅▆▇█▎") for y in range(tree.size.height)]
        names = [ln.split("📄")[-1].strip() for ln in lines if "📄" in ln]
        assert len(names) == len(list((project / "benchmarks").glob("*.yaml"))), lines
        assert len(set(names)) == len(names), names


async def test_j_and_k_move_the_config_tree(app, project):
    from textual.widgets import DirectoryTree
    async with app.run_test(size=SMALL) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        tree = app.screen.query_one(DirectoryTree)
        await wait_for(pilot, lambda: len(tree.root.children) > 2)
        assert tree.cursor_line == 0
        await pilot.press("j", "j")
        assert tree.cursor_line == 2
        await pilot.press("k")
        assert tree.cursor_line == 1


async def test_j_k_g_G_scroll_the_help(app, project):
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        await pilot.press("question_mark")
        await wait_screen(pilot, app, HelpScreen, "#help-table")
        table = app.screen.query_one("DataTable")
        await pilot.press("G")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("g")
        assert table.cursor_row == 0
        await pilot.press("j", "j", "k")
        assert table.cursor_row == 1


async def test_search_matches_are_reported_on_the_search_line_not_over_the_log(app, project):
    """Each n/N put a toast over the right half of the log at 80x24: three of them hid the lines
    the search had just scrolled to. The match stands on the search line, one at a time."""
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        events_log = await _compare_events(pilot, app)
        await wait_for(pilot, lambda: len(events_log.lines) > 3)
        await pilot.press("slash")
        app.screen.query_one("#log-search").value = "stage"
        await pilot.press("enter", "n", "n")
        await pilot.pause()
        where = str(app.screen.query_one("#log-search-where").render())
        assert "match 3 of" in where, where
        assert not any("match" in n.message for n in app._notifications)


async def test_the_launch_form_opens_without_importing_the_servers_kernels(app, project, monkeypatch):
    """The form lists optimize's registry ops: it imported engine.serve.kernels for them, and with
    it torch, on the event loop: the first ``l`` drew an empty frame for one to several seconds."""
    from textual.widgets import Select
    monkeypatch.setitem(sys.modules, "engine.serve.kernels", None)  # importing it fails
    async with app.run_test(size=SMALL) as pilot:
        dialog = await open_launch(pilot, app, project / "benchmarks" / "builtin_tiny_cpu.yaml")
        ops = [value for _label, value in dialog.query_one("#kernel", Select)._options if value != Select.BLANK]
        assert "decode_attention" in ops and "rmsnorm" in ops


async def test_a_compares_winner_reads_whole_in_the_runs_list_at_80_columns(app, project):
    """The Progress column keeps 18 cells at 80 columns: a compare's read 'winner one_pass 9.…'
    beside the TTFT, TPOT and tok/s cells it leaves empty. Its text runs over them."""
    from magpie_tui.widgets.data_grid import DataGrid
    _with_figures(project)
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        row = next(i for i, r in enumerate(grid.visible_rows()) if r["folder"].startswith("compare_"))
        await pilot.pause()
        line = grid.render_line(row + 1).text  # the header first
        winner = str(find_run(app, "compare_").progress_text)
        assert winner.startswith("winner") and winner[:36] in line, (line, winner)


async def test_the_runs_summary_keeps_its_help_hint_at_80_columns(app, project):
    """The line above the Runs list ended '· R: re-run · ?:' at 80 columns: the hints that do not
    fit step aside, and '?: every key' stays whole."""
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        summary = app.screen.query_one("#runs-summary")
        await wait_for(pilot, lambda: "runs" in str(summary.render()))
        await pilot.pause()
        line = summary.render_line(0).text.rstrip()
        assert line.endswith("?: every key") and "enter: open" in line, line


async def test_the_live_view_says_the_server_is_starting(tmp_path):
    """Before the load the live view read 'server running · ETA –' for as long as the server took
    to start (6 s on a busy machine): it reads as a server that runs, not one being waited for."""
    from tui.conftest import build_app, make_project
    from tui.test_live_view import LIVE_NAME, T0, LiveFolder, on_screen
    project = make_project(tmp_path / "p")
    live = LiveFolder(project / "results")
    live.write({"ts": T0 + 1, "event": "stage", "stage": "server", "state": "running"})
    app = build_app(project)
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == LIVE_NAME for r in app.runs))
        app.open_run(next(r for r in app.runs if r.name == LIVE_NAME))
        await wait_screen(pilot, app, RunScreen, "#run-live")
        await wait_for(pilot, lambda: on_screen(app, r"starting the server \(until it answers\) · ETA –") is not None)
    live.fh.close()


async def test_a_compares_events_lead_with_the_kernel_and_its_stage_at_80_columns(app, project):
    """A stage event read 'kernel=one_pass index=1 stage=performance state=runnin' at 80 columns,
    its step and detail past the edge; it leads with the console's words now."""
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        events_log = await _compare_events(pilot, app)
        await wait_for(pilot, lambda: any("stage" in line for line in events_log.lines))
        stages = [line for line in events_log.lines if " stage " in line]
        assert stages and all("kernel=" not in line for line in stages), stages
        assert any("[one_pass] performance (harness): SUCCESS" in line[:80] for line in stages), stages


async def test_the_search_match_is_marked_where_the_log_cannot_scroll_it_to_the_top(app, project):
    """A match near the end of a log stays where it is (the log cannot scroll past its end) and
    nothing told which line it was: the match's line is drawn marked until the search closes."""
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        log = await _compare_events(pilot, app)
        await wait_for(pilot, lambda: any("run_finished" in line for line in log.lines))
        await pilot.press("slash")
        app.screen.query_one("#log-search").value = "run_finished"
        await pilot.press("enter")
        await pilot.pause()
        match = next(i for i, line in enumerate(log.lines) if "run_finished" in line)
        y = match - int(log.scroll_y)
        assert 0 <= y < log.size.height
        marked = log.get_component_rich_style("run-log--match").bgcolor
        assert any(seg.style and seg.style.bgcolor == marked for seg in log.render_line(y)), "match not marked"
        other = 0 if y else 1
        assert not any(seg.style and seg.style.bgcolor == marked for seg in log.render_line(other))
        await pilot.press("slash", "escape")
        await pilot.pause()
        assert not any(seg.style and seg.style.bgcolor == marked for seg in log.render_line(y))


async def test_a_kernel_that_failed_keeps_where_once_the_compare_ends(tmp_path):
    """The Kernels tab read 'unmasked  correctness  failed  failed' while the compare ran and
    'unmasked  done  (blank)  incorrect' once it ended: where it failed was gone."""
    from tui.conftest import build_app, make_project
    from magpie_tui.widgets.data_grid import DataGrid
    project = make_project(tmp_path / "p")
    run = project / "results" / "compare_two_20270115_080000_0a1b2c"
    run.mkdir(parents=True)
    t0 = 1_800_000_000.0
    events = [{"event": "run_started", "mode": "compare", "kernels": ["base", "bad"], "label": "base"},
              {"event": "stage", "kernel": "bad", "index": 1, "stage": "harness", "state": "running"},
              {"event": "stage", "kernel": "bad", "index": 1, "stage": "harness", "state": "FAILED"},
              {"event": "stage", "kernel": "base", "index": 0, "stage": "done", "state": "SUCCESS", "verdict": "baseline"},
              {"event": "stage", "kernel": "bad", "index": 1, "stage": "done", "state": "SUCCESS", "verdict": "incorrect"},
              {"event": "run_finished", "state": "completed", "exit_code": 0}]
    (run / "events.jsonl").write_text("".join(json.dumps({"ts": t0 + i, **e}) + "\n" for i, e in enumerate(events)))
    app = build_app(project)
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == run.name for r in app.runs))
        app.open_run(next(r for r in app.runs if r.name == run.name))
        await wait_screen(pilot, app, RunScreen, "#run-kernels")
        grid = app.screen.query_one("#kernels-grid", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 2)
        bad = next(r for r in grid.visible_rows() if r["kernel"] == "bad")
        assert (bad["stage"], bad["detail"], bad["verdict"]) == ("done", "correctness failed", "incorrect"), bad
