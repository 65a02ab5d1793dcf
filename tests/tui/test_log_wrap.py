"""The Run screen's logs wrap on ``w``: a long line of the log (or the events) is cut into rows of
the screen's width, so its end is read without scrolling sideways; ``w`` again shows lines whole.
Search (``/``, ``n``/``N``) finds a match wherever the wrap cut its line, and ``f`` follows the end
either way. The key is on the help screen and in the footer where there is room."""

from __future__ import annotations

import json
import os

from tui.conftest import open_runs, wait_for, wait_screen
from tui.test_live_view import on_screen, screen_lines
from tui.test_usability import footer_keys_in_view

from magpie_tui.screens.run import RunScreen
from magpie_tui.widgets.run_log import RunLog

NAME = "benchmark_wrapped_20270101_000000_abcdef"
LONG = "x" * 150


def run_with_long_lines(project):
    """A finished run whose server.log has 60 lines, two of them 170 characters long."""
    root = project / "results" / NAME
    root.mkdir(parents=True)
    events = [{"ts": 1_800_000_000.0, "event": "run_started", "mode": "benchmark", "label": "wrapped",
               "pid": os.getpid()},
              {"ts": 1_800_000_001.0, "event": "stage", "stage": "server", "state": "running", "detail": LONG},
              {"ts": 1_800_000_010.0, "event": "run_finished", "state": "completed", "exit_code": 0}]
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    lines = [f"line {i}" for i in range(60)]
    lines[30] = f"line 30 {LONG} NEEDLE-ONE"
    lines[45] = f"line 45 {LONG} NEEDLE-TWO"
    (root / "server.log").write_text("\n".join(lines) + "\n")
    return root


async def test_w_wraps_the_log_and_search_and_follow_still_work(app, project):
    root = run_with_long_lines(project)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == NAME for r in app.runs))
        app.open_run(next(r for r in app.runs if r.name == NAME))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        log = app.screen.query_one("#run-log", RunLog)
        await wait_for(pilot, lambda: log.lines_shown == 60)
        await pilot.pause()
        await pilot.press("slash", *"needle", "enter")
        await wait_for(pilot, lambda: on_screen(app, r"line 30 xxx") is not None)
        assert not on_screen(app, "NEEDLE-ONE")  # whole lines: the end is off to the right

        await pilot.press("w")
        await wait_for(pilot, lambda: on_screen(app, "NEEDLE-ONE") is not None)
        assert on_screen(app, r"line 30 xxx"), screen_lines(app)  # the line stays in view, its end below it
        assert max(len(row) for row in log.lines) <= 80
        # search: the next match, on the rows its line was cut into
        await pilot.press("n")
        await wait_for(pilot, lambda: on_screen(app, "NEEDLE-TWO") is not None)
        assert int(log.scroll_y) == log.row_of(45)
        await pilot.press("N")
        await wait_for(pilot, lambda: int(log.scroll_y) == log.row_of(30))
        assert on_screen(app, "NEEDLE-ONE")
        # follow: back to the end, and lines written now are shown as they come
        await pilot.press("f")
        assert log.auto_scroll
        with open(root / "server.log", "a") as fh:
            fh.write(f"line 60 {LONG} NEEDLE-NEW\n")
        await wait_for(pilot, lambda: on_screen(app, "NEEDLE-NEW") is not None)
        assert log.is_vertical_scroll_end
        # the events, in a tab hidden when w was pressed, are cut at the screen's width once shown
        await pilot.press("right_square_bracket")
        events = app.screen.query_one("#run-events", RunLog)
        await wait_for(pilot, lambda: events.wrap and len(events.lines) > len(events.raw_lines))
        assert 60 < max(len(row) for row in events.lines) <= 80
        await pilot.press("left_square_bracket")
        # w again: whole lines
        await pilot.press("w")
        await wait_for(pilot, lambda: not log.wrap and len(log.lines) == 61)
        assert max(len(row) for row in log.lines) > 80
        assert not on_screen(app, "NEEDLE-NEW")


async def test_the_wrap_key_is_listed_in_help_and_the_footer(app, project):
    run_with_long_lines(project)
    async with app.run_test(size=(120, 30)) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name == NAME for r in app.runs))
        app.open_run(next(r for r in app.runs if r.name == NAME))
        await wait_screen(pilot, app, RunScreen, "#run-log")
        assert "w" in footer_keys_in_view(app, 120)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: on_screen(app, r"run\.wrap") is not None)
        assert on_screen(app, r"\bw\b.*Wrap|Wrap.*\bw\b"), screen_lines(app)
