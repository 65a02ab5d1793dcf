"""The keys of k9s and lazygit habits: j/k/g/G in every table, u clears marks, marks a filter
hides are not acted on, s sorts by a column that tells runs apart; and keys that arrive in one
burst (fast typing, a paste) reach the field that had the focus when each was typed."""

from __future__ import annotations

from textual import events

from tui.conftest import open_launch, open_runs, wait_for, wait_screen

from magpie_tui.screens.configs import ConfigsScreen
from magpie_tui.widgets.data_grid import DataGrid

SIZE = (140, 45)


def _burst(app, *keys: str) -> None:
    """Post the keys back to back, without waiting between them, as the terminal driver does."""
    for key in keys:
        app.post_message(events.Key(key, key if len(key) == 1 else None))


async def test_digit_tab_digit_in_one_burst_fills_two_fields(app, project):
    async with app.run_test(size=SIZE) as pilot:
        dialog = await open_launch(pilot, app, project / "benchmarks" / "builtin_tiny_cpu.yaml")
        assert app.focused is dialog.query_one("#repeats")
        _burst(app, "1", "tab", "7", "shift+tab", "2")
        # shift+tab went back before the 2 was read: it replaces the 1 (a field selects its text on focus)
        await wait_for(pilot, lambda: dialog.query_one("#repeats").value == "2")
        await pilot.pause()
        assert dialog.query_one("#concurrency").value == "7"
        assert "--repeats 2 --concurrency 7" in str(dialog.query_one("#launch-preview-text").render())


async def test_j_k_g_G_move_the_runs_cursor(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        assert grid.cursor_position == 0
        await pilot.press("j", "j")
        assert grid.cursor_position == 2
        await pilot.press("k")
        assert grid.cursor_position == 1
        await pilot.press("G")
        assert grid.cursor_position == 3
        await pilot.press("g")
        assert grid.cursor_position == 0


async def test_s_sorts_by_state_first_and_marks_hidden_by_a_filter_are_left_out(app, project):
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        screen = app.screen
        grid = screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: grid.visible_count == 4)
        await pilot.press("s")
        assert grid.sort_column == "state"  # not the mark column the row starts with
        for _ in range(4):  # mark every run
            await pilot.press("space", "j")
        assert sum(r["mark"] == "✓" for r in grid.visible_rows()) == 4
        await pilot.press("slash", *"bench", "enter")
        await wait_for(pilot, lambda: grid.visible_count == 2)
        summary = str(screen.query_one("#runs-summary").render())
        assert "4 marked (2 hidden by the filter)" in summary
        assert screen._marked_shown() and len(screen._marked_shown()) == 2  # v acts on the two shown
        await pilot.press("u")
        assert not screen.marked and "marked" not in str(screen.query_one("#runs-summary").render())
        await pilot.press("space", "v")  # one marked: refused, and says how many
        await pilot.pause()
        assert any("1 marked and shown" in n.message for n in app._notifications)


async def test_q_goes_back_and_colon_opens_the_command_palette(app, project):
    from textual.command import CommandPalette

    from magpie_tui.screens.run import RunScreen
    from magpie_tui.screens.runs import RunsScreen
    from tui.conftest import find_run
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        app.open_run(find_run(app, "compare_"))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        from tui.test_usability import footer_keys_in_view
        assert {"question_mark", "ctrl+q"} <= footer_keys_in_view(app, 80)  # 80 columns: the screen's keys first
        await pilot.press("q")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        await pilot.press("q")  # the top: says how to quit, quits nothing
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen) and app.is_running
        assert any("ctrl+q quits" in n.message for n in app._notifications)
        await pilot.press("colon")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))


async def test_search_the_events_log_and_toggle_follow(app, project):
    from magpie_tui.screens.run import RunScreen
    from tui.conftest import find_run
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        app.open_run(find_run(app, "compare_"))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        await pilot.press("right_square_bracket", "right_square_bracket")  # the Events tab (after Kernels, Log)
        events_log = app.screen.query_one("#run-events")
        await wait_for(pilot, lambda: len(events_log.lines) > 3)
        await pilot.press("slash", *"finished", "enter")
        await pilot.pause()
        hits = [i for i, line in enumerate(events_log.lines) if "finished" in line.lower()]
        assert hits and app.screen._search_at == hits[0] and not events_log.auto_scroll
        assert "match 1 of" in str(app.screen.query_one("#log-search-where").render())
        assert not app.screen.query_one("#log-search").has_focus
        await pilot.press("f")
        assert events_log.auto_scroll
        await pilot.press("slash", "escape")  # esc in the search box closes it, the run stays open
        assert isinstance(app.screen, RunScreen) and not app.screen.query_one("#log-search-bar").display


async def test_the_config_tree_keeps_long_names_apart_at_80_columns(app, project):
    """Two configs whose names differ only at the end (the plain and the profiled one) are two
    different lines in the tree at 80 columns: a long name loses its middle."""
    from textual.widgets import DirectoryTree
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_screen(pilot, app, ConfigsScreen)
        tree = app.screen.query_one(DirectoryTree)
        await wait_for(pilot, lambda: any(str(n.label) == "benchmarks" for n in tree.root.children))
        next(n for n in tree.root.children if str(n.label) == "benchmarks").expand()
        await wait_for(pilot, lambda: any("cpu.yaml" in tree.render_line(y).text for y in range(tree.size.height)))
        lines = [tree.render_line(y).text.rstrip() for y in range(tree.size.height)]
        plain = [ln for ln in lines if ln.endswith("cpu.yaml") and "builtin_" in ln]
        profiled = [ln for ln in lines if ln.endswith("led.yaml") and "builtin_t" in ln]
        assert len(plain) == 1 and len(profiled) == 1, lines
        assert "…" in profiled[0] and plain[0] != profiled[0]


async def test_a_wide_footer_names_the_command_palette(app, project):
    from tui.test_usability import footer_keys_in_view
    async with app.run_test(size=(200, 50)) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: "colon" in footer_keys_in_view(app, 200))
