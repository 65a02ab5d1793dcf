"""A run's label is fixed at launch: a benchmark launched from the workbench is called the same
(its framework and load, e.g. ``builtin-tiny c2 i32 o8``) from the moment its folder is listed,
while it runs, after it ends and after the workbench restarts. The engine derives it once
(engine.runs.labels.run_label) and records it in the run's first events; folders written before
that get it from their config.yaml through the same function."""

from __future__ import annotations

import pytest
from tui.conftest import build_app, open_launch, open_runs, wait_for, wait_screen

from engine.runs.catalog import parse_run_name
from engine.runs.labels import recorded_run_label, run_label
from magpie_tui.screens.runs import RunsScreen
from magpie_tui.widgets.data_grid import DataGrid

SIZE = (160, 40)


def label_rows(app) -> dict[str, str]:
    """Folder name -> the Label cell of the Runs list (the raw row, whatever the width)."""
    if not isinstance(app.screen, RunsScreen):
        return {}
    grid = app.screen.query_one("#runs-table", DataGrid)
    return {row["folder"]: row["label"] for row in grid.visible_rows()}


@pytest.mark.slow  # a real benchmark of the built-in server on the CPU: about 10 s
async def test_a_benchmark_launched_from_the_workbench_keeps_its_label(app, project):
    seen: dict[str, list[str]] = {}  # the new run's labels, in the order the list showed them
    async with app.run_test(size=SIZE) as pilot:
        form = await open_launch(pilot, app, project / "benchmarks" / "builtin_tiny_cpu.yaml")
        for field, value in (("repeats", "1"), ("concurrency", "2"), ("input_len", "32"), ("output_len", "8"),
                             ("num_prompts", "8"), ("warmup", "1")):
            form.query_one(f"#{field}").value = value
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        pid = next(iter(app.started))

        def watch() -> bool:
            for folder, label in label_rows(app).items():
                if folder.startswith("benchmark_") and (project / "results" / folder).is_dir():
                    labels = seen.setdefault(folder, [])
                    if not labels or labels[-1] != label:
                        labels.append(label)
            run = next((r for r in app.runs if r.pid == pid), None)
            return run is not None and run.is_finished
        await wait_for(pilot, watch, timeout=240, step=0.02)
        run = next(r for r in app.runs if r.pid == pid)
        assert run.state == "completed", run.error
        await pilot.pause(0.3)
        watch()
    assert list(seen) == [run.name]
    # One label from the first time the folder was listed to the end: the load it ran with.
    assert seen[run.name] == ["builtin-tiny c2 i32 o8"], seen
    # The engine's own derivation from the config the run recorded says the same.
    assert recorded_run_label(run.path, "builtin-tiny") == "builtin-tiny c2 i32 o8"

    # After a restart: the same label, in the list and on the Run screen's header.
    again = build_app(project)
    async with again.run_test(size=SIZE) as pilot:
        await open_runs(pilot, again)
        await wait_for(pilot, lambda: run.name in label_rows(again))
        await pilot.pause(0.5)
        assert label_rows(again)[run.name] == "builtin-tiny c2 i32 o8"
        again.open_run(next(r for r in again.runs if r.name == run.name))
        from magpie_tui.screens.run import RunScreen
        await wait_screen(pilot, again, RunScreen, "#run-status")
        await wait_for(pilot, lambda: "builtin-tiny c2 i32 o8" in str(again.screen.query_one("#run-status").render()))


async def test_recorded_runs_are_called_as_their_config_says(app, project):
    """Run folders written before runs recorded their label: the label from their config.yaml,
    by the same function the engine labels new runs with."""
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: len(app.runs) == 4 and all(r.titled for r in app.runs))
        await pilot.pause(0.3)
        labels = label_rows(app)
        for run in app.runs:
            assert labels[run.name] == run.label == recorded_run_label(run.path, parse_run_name(run.name)[1])
        assert labels["benchmark_builtin-tiny_20261129_192715_db9427"] == "builtin-tiny c2 i32 o8 sweep c1,2,4 x2"
        assert labels["compare_three_pass_20261129_191525_aa7d27"] == "softmax_triton/compare.yaml · base three_pass"


def test_run_label_of_configs():
    bench = {"benchmark": {"envs": {"CONC": 8, "ISL": 1024, "OSL": 128}, "client": {"repeats": 3}}}
    assert run_label(bench, "vllm") == "vllm c8 i1024 o128 x3"
    capacity = {"benchmark": {"envs": {"CONC": 8, "ISL": 64}, "client": {"find_capacity": True}}}
    assert run_label(capacity, "builtin-tiny") == "builtin-tiny capacity over concurrency i64"
    ramp = {"benchmark": {"envs": {"CONC": 8}, "client": {"find_capacity": True, "capacity_mode": "ramp"}}}
    assert run_label(ramp, "builtin-tiny") == "builtin-tiny capacity ramp concurrency"
    compare = {"config_file": "/p/kernels/softmax_triton/compare.yaml", "baseline": {"id": "three_pass"}}
    assert run_label(compare, "three_pass") == "softmax_triton/compare.yaml · base three_pass"
    assert run_label({"mode": "trace_analysis"}, "synthetic_vllm") == "synthetic_vllm"
    assert run_label(None, "x") == "x"
