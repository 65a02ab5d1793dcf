"""SVG snapshots of the main screens at 80x24 and 160x48 (pytest-textual-snapshot).

Review changes with the HTML report pytest writes on a mismatch; accept them with
``python -m pytest tests/tui/test_snapshots.py --snapshot-update``. The project is built at a
fixed path and the time zone is pinned, so the pictures only change when the UI does.
"""

from __future__ import annotations

import time

import pytest
from tui.conftest import SNAPSHOT_ROOT, build_app, make_project

SIZES = [(80, 24), (160, 48)]


async def _settle(pilot, seconds: float = 0.3) -> None:
    # Not workers.wait_for_complete(): the directory tree keeps a loader worker alive.
    await pilot.pause(seconds)
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


def _open_runs():
    async def run_before(pilot):
        await pilot.press("2")
        await _settle(pilot)
    return run_before


def _open_report(prefix: str, then: tuple[str, ...] = ()):
    async def run_before(pilot):
        app = pilot.app
        await pilot.press("2")
        deadline = time.monotonic() + 10
        while not app.runs and time.monotonic() < deadline:
            await pilot.pause(0.05)
        app.open_report(next(r for r in app.runs if r.name.startswith(prefix)))
        await _settle(pilot)
        if then:
            await pilot.press(*then)
            await _settle(pilot)
    return run_before


def _configs_with(relative: str):
    async def run_before(pilot):
        await _settle(pilot)
        pilot.app.screen.select(pilot.app.settings.project_dir / relative)
        await _settle(pilot)
    return run_before


@pytest.fixture
def snapshot_app():
    project = make_project(SNAPSHOT_ROOT)
    return build_app(project)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_configs(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size,
                        run_before=_configs_with("kernels/softmax_triton/compare.yaml"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_runs(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_runs())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_compare_report(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_report("compare_"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_benchmark_report(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_report("benchmark_builtin-tiny_20261129_1927"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_roofline_table(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_report("trace_"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_roofline_plot(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_report("trace_", ("p",)))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_diff(snap_compare, snapshot_app, size):
    async def run_before(pilot):
        await _configs_with("kernels/softmax_triton/compare.yaml")(pilot)
        await pilot.press("d")
        await _settle(pilot, 0.5)
    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


def test_light_theme_compare_report(snap_compare, snapshot_app):
    async def run_before(pilot):
        pilot.app.theme = "magpie-light"
        await _open_report("compare_")(pilot)
    assert snap_compare(snapshot_app, terminal_size=(120, 32), run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel(snap_compare, snapshot_app, size):
    async def run_before(pilot):
        await _open_report("trace_")(pilot)
        grid = pilot.app.screen.query_one("#roofline-grid")
        grid.move_cursor_to_key(next(k for k, r in zip(grid.visible_keys(), grid.visible_rows())
                                     if r["op_name"] == "aten::mm"))
        await pilot.press("enter")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = pilot.app.screen.query("#kernel-info")
            if info and "searching" not in str(info.first().render()):
                break
            await pilot.pause(0.1)
        await _settle(pilot)
    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


# -- screens changed for issue 15 (usability) --------------------------------------------------------
# The wide variant of these is marked slow (it still runs in CI): the fast run stays short.
NEW_SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48", marks=pytest.mark.slow)]

@pytest.mark.parametrize("size", NEW_SIZES)
def test_benchmark_report_single_point(snap_compare, snapshot_app, size):
    """Three repeats: intervals shown (never below 0); every metric row in view at 160x48."""
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_report("benchmark_builtin-tiny_20261129_192724"))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_benchmark_distributions(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_report(
        "benchmark_builtin-tiny_20261129_192724", ("right_square_bracket",)))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_roofline_timeline(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_report("trace_", ("l",)))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_run_screen(snap_compare, snapshot_app, size):
    async def run_before(pilot):
        app = pilot.app
        await pilot.press("2")
        deadline = time.monotonic() + 10
        while not app.runs and time.monotonic() < deadline:
            await pilot.pause(0.05)
        app.open_run(next(r for r in app.runs if r.name.startswith("compare_")))
        await _settle(pilot)
        await pilot.press("left_square_bracket")  # the summary tab: a finished run's summary.txt
        await _settle(pilot)
    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", NEW_SIZES)
def test_help_for_the_runs_screen(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size, run_before=_open_runs_then(("question_mark",)))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_runs_filtered_and_marked(snap_compare, snapshot_app, size):
    assert snap_compare(snapshot_app, terminal_size=size,
                        run_before=_open_runs_then(("slash", "b", "e", "n", "c", "h", "enter", "space")))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_launch_form(snap_compare, snapshot_app, size):
    async def run_before(pilot):
        await _configs_with("benchmarks/builtin_tiny_cpu.yaml")(pilot)
        await pilot.press("l")
        await _settle(pilot, 0.5)
    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", NEW_SIZES)
def test_configs_with_a_problem(snap_compare, snapshot_app, size):
    async def run_before(pilot):
        config = pilot.app.settings.project_dir / "kernels" / "softmax_triton" / "compare.yaml"
        config.write_text(config.read_text().replace("softmax_onepass.py", "softmax_onepas.py"))
        await _configs_with("kernels/softmax_triton/compare.yaml")(pilot)
    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


def _open_runs_then(keys: tuple[str, ...]):
    async def run_before(pilot):
        await _open_runs()(pilot)
        deadline = time.monotonic() + 10
        while len(pilot.app.runs) < 4 and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await pilot.press(*keys)
        await _settle(pilot)
    return run_before


# -- issue 15, what remained: compare runs side by side, re-run without a config, the timeline per stage,
# the capacity plot ------------------------------------------------------------------------------------------

@pytest.fixture
def snapshot_app_more_runs():
    """The snapshot project with two more runs: a second compare (its one_pass slower, its unmasked
    fixed) and a capacity search."""
    from tui.test_workbench_views import add_capacity_run, second_compare, slower_one_pass_and_fixed_unmasked
    project = make_project(SNAPSHOT_ROOT)
    second_compare(project, slower_one_pass_and_fixed_unmasked)
    add_capacity_run(project)
    return build_app(project)


def _open_runs_and(action):
    async def run_before(pilot):
        await _open_runs()(pilot)
        deadline = time.monotonic() + 10
        while len(pilot.app.runs) < 6 and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await action(pilot)
        await _settle(pilot, 0.5)
    return run_before


@pytest.mark.parametrize("size", NEW_SIZES)
def test_compare_runs_side_by_side(snap_compare, snapshot_app_more_runs, size):
    async def mark_both(pilot):
        grid = pilot.app.screen.query_one("#runs-table")
        for run in pilot.app.runs:
            if run.mode == "compare":
                grid.move_cursor_to_key(str(run.path))
                await pilot.press("space")
        await pilot.press("v")
    assert snap_compare(snapshot_app_more_runs, terminal_size=size, run_before=_open_runs_and(mark_both))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_benchmark_capacity(snap_compare, snapshot_app_more_runs, size):
    async def open_capacity(pilot):
        pilot.app.open_report(next(r for r in pilot.app.runs if r.name.startswith("benchmark_builtin-tiny_20261202")))
        await _settle(pilot, 0.5)
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
    assert snap_compare(snapshot_app_more_runs, terminal_size=size, run_before=_open_runs_and(open_capacity))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_rerun_without_a_recorded_config(snap_compare, snapshot_app_more_runs, size):
    async def rerun(pilot):
        run = next(r for r in pilot.app.runs if r.name.startswith("compare_three_pass_2026"))
        (run.path / "config.yaml").unlink()
        pilot.app.screen.query_one("#runs-table").move_cursor_to_key(str(run.path))
        await pilot.press("R")
    assert snap_compare(snapshot_app_more_runs, terminal_size=size, run_before=_open_runs_and(rerun))


@pytest.mark.parametrize("size", NEW_SIZES)
def test_roofline_timeline_of_the_mixed_stage(snap_compare, snapshot_app, size):
    async def run_before(pilot):
        await _open_report("trace_", ("l",))(pilot)
        pilot.app.screen.query_one("#timeline-stage").value = "prefilldecode"
        await _settle(pilot)
    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


# -- issue 15, the last 80-column points: each screen's main keys in the footer, the Runs list's columns,
# a sort by a column hidden at this width ------------------------------------------------------------------

def test_runs_sorted_by_a_hidden_column(snap_compare, snapshot_app):
    """Sorted by Started (newest first) at 170 columns, then seen at 80: the line above the list says so."""
    async def run_before(pilot):
        await pilot.resize_terminal(170, 30)
        await _open_runs_then(())(pilot)
        grid = pilot.app.screen.query_one("#runs-table")
        grid.sort_by("started", reverse=True)
        await pilot.resize_terminal(80, 24)
        await _settle(pilot)
    assert snap_compare(snapshot_app, terminal_size=(80, 24), run_before=run_before)


NO_PID = 4_194_400
"""Above Linux's largest pid (2**22): the same in every picture, and never a live process."""


@pytest.mark.parametrize("size", SIZES + [(200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_loop_screen(snap_compare, size):
    """A finished loop; at 80x24 the footer keeps Back, Open step, Report, Cancel, Resume and ] Next tab,
    the status is one line and the chain's Detail takes the width Tries and Elapsed leave."""
    from tui.test_loop_screen import finished_steps, make_loop
    project = make_project(SNAPSHOT_ROOT)
    make_loop(project, finished_steps(NO_PID), NO_PID, finished=True)

    async def run_before(pilot):
        app = pilot.app
        await pilot.press("2")
        deadline = time.monotonic() + 10
        while not any(r.mode == "loop" for r in app.runs) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        app.open_run(next(r for r in app.runs if r.mode == "loop"))
        await _settle(pilot, 0.5)
    assert snap_compare(build_app(project), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("tab", ["b", "v"])
def test_loop_screen_bottlenecks_and_verdict(snap_compare, size, tab):
    """The recorded bottleneck table (b) and a verdict of full size (v: eight end-to-end rows, six
    checks); at 80x24 the chain folds to its highlighted step and the notes to one line."""
    import json
    import shutil
    from tui.test_loop_screen import RECORDED_LOOP, RECORDED_VERDICT, finished_steps, make_loop
    project = make_project(SNAPSHOT_ROOT)
    steps = finished_steps(NO_PID)
    steps[-1]["result"] = json.loads(RECORDED_VERDICT.read_text())
    root = make_loop(project, steps, NO_PID, finished=True)
    shutil.copy(RECORDED_LOOP / "bottlenecks" / "bottlenecks.json", root / "bottlenecks" / "bottlenecks.json")

    async def run_before(pilot):
        app = pilot.app
        await pilot.press("2")
        deadline = time.monotonic() + 10
        while not any(r.mode == "loop" for r in app.runs) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        app.open_run(next(r for r in app.runs if r.mode == "loop"))
        await _settle(pilot, 0.5)
        await pilot.press(tab)
        await _settle(pilot)
    assert snap_compare(build_app(project), terminal_size=size, run_before=run_before)
