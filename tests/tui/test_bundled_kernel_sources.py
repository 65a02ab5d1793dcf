"""A trace of the built-in server names the engine's own Triton kernels (engine/serve/triton_kernels.py,
engine/library/): the Kernel screen finds their source on any machine, beside the project's and the
run's repositories; the recorded GPU run in examples/runs takes the roofline to that source."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Select
from tui.conftest import GPU_RUN, build_app, find_run, make_project, open_runs, wait_for, wait_screen

from magpie_tui.screens.kernel import KernelScreen, locate_sources, source_repos
from magpie_tui.screens.reports import BenchmarkReportScreen
from magpie_tui.screens.roofline import RooflineScreen
from magpie_tui.widgets.code_view import CodeView
from magpie_tui.widgets.data_grid import DataGrid

ENGINE = Path(__file__).resolve().parents[2] / "engine"


async def test_the_built_in_servers_triton_kernels_resolve_to_their_source(app, project):
    async with app.run_test(size=(120, 30)) as pilot:
        await open_runs(pilot, app)
        repos = source_repos(find_run(app, "trace_"), project)
    assert repos[0] == project and ENGINE / "serve" in repos
    found = {s["kernel"]: s for s in locate_sources(["_rmsnorm_kernel", "_silu_and_mul_kernel"], repos)}
    for name in ("_rmsnorm_kernel", "_silu_and_mul_kernel"):
        assert found[name]["status"] == "resolved", found[name]
        assert found[name]["path"] == ENGINE / "serve" / "triton_kernels.py"
        assert found[name]["confidence"] >= 0.9


async def test_the_recorded_gpu_runs_roofline_opens_the_servers_own_kernel_source(tmp_path):
    # The server's decode attention is the library's split kernel, made a Triton kernel by its own
    # wrapper decorator (@triton_jit).
    app = build_app(make_project(tmp_path / "work", gpu_run=True))
    async with app.run_test(size=(120, 30)) as pilot:
        await open_runs(pilot, app)
        app.open_report(find_run(app, GPU_RUN))
        await wait_screen(pilot, app, BenchmarkReportScreen)
        await pilot.press("t")  # its roofline, from the run's TraceLens reports
        await wait_screen(pilot, app, RooflineScreen)
        screen = app.screen
        assert set(screen.stages) == {"decode_only", "prefill_only", "prefilldecode"}
        screen.query_one("#stage", Select).value = "decode_only"
        grid = screen.query_one("#roofline-grid", DataGrid)
        await wait_for(pilot, lambda: any("_decode_split_kernel" in str(r["op_name"]) for r in grid.visible_rows()))
        grid.focus()
        grid.move_cursor_to_key(next(k for k, r in zip(grid.visible_keys(), grid.visible_rows())
                                     if "_decode_split_kernel" in str(r["op_name"])))
        await pilot.press("enter")
        await wait_screen(pilot, app, KernelScreen)
        kernel = app.screen
        assert kernel.kernel_names == ["_decode_split_kernel"]
        await wait_for(pilot, lambda: "searching" not in str(kernel.query_one("#kernel-info").render()), 30)
        info = str(kernel.query_one("#kernel-info").render())
        assert "source: $LIBRARY_DIR/attention.py:" in info and "(resolved)" in info, info
        assert kernel.sources[0]["path"] == ENGINE / "library" / "attention.py"
        code = kernel.query_one("#kernel-source", CodeView)
        await wait_for(pilot, lambda: "def _decode_split_kernel" in code.text, 10)
