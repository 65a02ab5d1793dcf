"""How is TTFT/TPOT? At 80x24 the Runs list row of a running benchmark and the Run screen's Events
tab show TTFT, TPOT (p50) and output tok/s whole, beside the run's state and label; once the run
has finished the row shows the report's own figures. On a run folder whose events.jsonl is written
while the workbench watches (tests/tui/test_live_view.LiveFolder), plus snapshots at 80x24 and
160x48 of the Runs list and the Events tab with that run going."""

from __future__ import annotations

import re
import time

import pytest
from tui.conftest import SNAPSHOT_ROOT, build_app, make_project, open_runs, wait_for, wait_screen
from tui.test_live_view import LIVE_NAME, T0, LiveFolder, on_screen, screen_lines
from tui.test_usability import row_cells

from magpie_tui.screens.run import RunScreen
from magpie_tui.widgets.data_grid import DataGrid

SMALL = (80, 24)


def live_row(app) -> dict[str, str]:
    """The cells of the live run's row as drawn (no scrolling sideways)."""
    grid = app.screen.query_one("#runs-table", DataGrid)
    run = next(r for r in app.runs if r.name == LIVE_NAME)
    y = grid.visible_keys().index(str(run.path)) + 1
    return row_cells(grid, y)


async def test_a_running_benchmarks_ttft_tpot_and_tok_s_are_in_view_at_80x24(tmp_path):
    project = make_project(tmp_path / "p")
    live = LiveFolder(project / "results")
    for second in range(1, 75):  # repeat 1 of 2: 888/1200 done, TTFT 45.5 ms, TPOT 4.65 ms, 1494 tok/s
        live.progress(0, second)
    app = build_app(project)
    async with app.run_test(size=SMALL) as pilot:
        await open_runs(pilot, app)
        grid = app.screen.query_one("#runs-table", DataGrid)
        await wait_for(pilot, lambda: any(r.name == LIVE_NAME and r.live_metrics for r in app.runs))
        await wait_for(pilot, lambda: live_row(app).get("ttft") == "45.5ms")
        assert sum(grid.column_widths[k] + 2 for k in grid.shown_columns) <= SMALL[0]  # no scrolling sideways
        cells = live_row(app)
        assert (cells["state"], cells["label"]) == ("running", "live-c8")
        assert (cells["ttft"], cells["tpot"], cells["tok_s"]) == ("45.5ms", "4.65ms", "1494")
        assert cells["progress"].startswith("888/1200")  # the counts lead: the numbers have their columns
        # ... and the terminal shows them on one row, whole
        assert on_screen(app, r"running\s+live-c8\s+45\.5ms\s+4\.65ms\s+1494\s+888/1200"), screen_lines(app)

        # The Run screen's Events tab: each progress event leads with them.
        app.open_run(next(r for r in app.runs if r.name == LIVE_NAME))
        await wait_screen(pilot, app, RunScreen, "#run-events")
        await pilot.press("right_square_bracket")  # Log -> Events
        assert app.screen.query_one("#run-tabs").active == "tab-events"
        await wait_for(pilot, lambda: on_screen(app, r"888/1200 · TTFT 45\.5ms · TPOT 4\.65ms · 1494 tok/s") is not None)
        row = on_screen(app, r"888/1200 · TTFT 45\.5ms")
        assert re.match(r"\s*\d\d:\d\d:\d\d progress\s+888/1200", row), row
        assert len(row.rstrip()) <= SMALL[0]

        # Finished: the report's own figures (the mean over the repeats), not the last live numbers.
        await pilot.press("escape")
        live.finish()
        await wait_for(pilot, lambda: live_row(app).get("state") == "completed")
        await wait_for(pilot, lambda: live_row(app).get("ttft") == "43.9ms")
        cells = live_row(app)
        assert (cells["ttft"], cells["tpot"], cells["tok_s"]) == ("43.9ms", "4.41ms", "1502")
        assert cells["label"] == "live-c8"


def test_numbers_fit_their_columns():
    from magpie_tui.screens.runs import format_ms, format_rate
    assert [format_ms(v) for v in (0.42, 4.651, 45.5, 254.0, 1234.0, 12_345.0, 123_456.0)] == [
        "0.42ms", "4.65ms", "45.5ms", "254ms", "1.23s", "12.3s", "123s"]
    assert [format_rate(v) for v in (1494.2, 9999.0, 12_345.0)] == ["1494", "9999", "12.3k"]


# -- snapshots: the Runs list and the Events tab with the live run going ---------------------------

SIZES = [(80, 24), (160, 48)]


@pytest.fixture
def live_project(monkeypatch):
    import magpie_tui.screens.runs as runs_screen
    from types import SimpleNamespace
    project = make_project(SNAPSHOT_ROOT)
    live = LiveFolder(project / "results")
    for second in range(1, 75):
        live.progress(0, second)
    # Elapsed times as at T0 + 84 s.
    monkeypatch.setattr(runs_screen, "time", SimpleNamespace(time=lambda: T0 + 84, monotonic=time.monotonic))
    yield project
    live.fh.close()


async def _until_live(pilot) -> None:
    app = pilot.app
    await pilot.press("2")
    deadline = time.monotonic() + 10
    while not any(r.name == LIVE_NAME and r.live_metrics for r in app.runs) and time.monotonic() < deadline:
        await pilot.pause(0.05)
    while len(app.runs) < 5 and time.monotonic() < deadline:
        await pilot.pause(0.05)
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_runs_with_a_live_benchmark(snap_compare, live_project, size):
    async def run_before(pilot):
        await _until_live(pilot)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
    assert snap_compare(build_app(live_project), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_events_tab_of_a_live_benchmark(snap_compare, live_project, size, monkeypatch):
    import magpie_tui.screens.run as run_screen
    from types import SimpleNamespace
    monkeypatch.setattr(run_screen, "time", SimpleNamespace(time=lambda: T0 + 84, monotonic=time.monotonic))

    async def run_before(pilot):
        await _until_live(pilot)
        pilot.app.open_run(next(r for r in pilot.app.runs if r.name == LIVE_NAME))
        await pilot.pause(0.5)
        await pilot.press("right_square_bracket")
        await pilot.pause(0.5)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
    assert snap_compare(build_app(live_project), terminal_size=size, run_before=run_before)
