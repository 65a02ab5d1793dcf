"""The benchmark report's two-run view (mark two benchmark runs, ``v``; or ``b`` on a report) shows
the engine's decision (engine.bench.report_compare): runs that measured different workloads are
refused with every difference listed and no deltas, ``a`` compares them anyway; a kernel override
is compared at once, the kernel listed above the deltas.

Run B is a real copy of a recorded run folder, its config.yaml and report edited as a profiled run
or a kernel override would record them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from tui.conftest import open_runs, wait_for, wait_screen

from magpie_tui.screens.reports import BenchmarkReportScreen, comparison_rows
from magpie_tui.widgets.data_grid import DataGrid

SIZE = (140, 45)
SINGLE = "benchmark_builtin-tiny_20261129_192724"  # one point, three repeats
WINNER = "engine.library.rmsnorm:rmsnorm_torch_fused"


def text_of(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def later_copy(project: Path, tag: str, config, report) -> Path:
    """A copy of the single-point run, started 10 minutes after it, edited by ``config(benchmark)``
    and ``report(report)``."""
    source = next(p for p in (project / "runs").iterdir() if p.name.startswith(SINGLE))
    target = project / "runs" / source.name.replace("_2026", f"_{tag}_2026")
    shutil.copytree(source, target)
    events = [json.loads(line) for line in (target / "events.jsonl").read_text().splitlines() if line.strip()]
    for event in events:
        event["ts"] += 600.0
    (target / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    doc = yaml.safe_load((target / "config.yaml").read_text())
    config(doc["benchmark"])
    (target / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    rep = json.loads((target / "benchmark_report.json").read_text())
    report(rep)
    (target / "benchmark_report.json").write_text(json.dumps(rep))
    return target


def _profiled(cfg):
    cfg["profiler"]["torch_profiler"]["enabled"] = True
    cfg["gap_analysis"]["enabled"] = True


def _kernel(cfg):
    cfg["server"]["kernels"] = {"rmsnorm": WINNER}


async def _pair(pilot, app, b_path: Path) -> BenchmarkReportScreen:
    await open_runs(pilot, app)
    await wait_for(pilot, lambda: any(r.path == b_path for r in app.runs))
    a = next(r for r in app.runs if r.name.startswith(SINGLE))
    b = next(r for r in app.runs if r.path == b_path)
    app.open_report(a, compare_with=b)
    await wait_screen(pilot, app, BenchmarkReportScreen, "#delta-grid")
    return app.screen


async def test_a_profiled_run_is_refused_until_asked(app, project):
    b_path = later_copy(project, "profiled", _profiled,
                        lambda r: r.update(run_kind="diagnostic", profiling_enabled=True))
    async with app.run_test(size=SIZE) as pilot:
        screen = await _pair(pilot, app, b_path)
        await wait_for(pilot, lambda: "NOT COMPARED" in text_of(screen, "#compare-note"))
        note = text_of(screen, "#compare-note")
        for field in ("run_kind: A measurement  ->  B diagnostic", "profiling_enabled: A false  ->  B true",
                      "benchmark.profiler.torch_profiler.enabled", "benchmark.gap_analysis.enabled"):
            assert field in note, field
        assert "a: compare anyway" in note
        grid = screen.query_one("#delta-grid", DataGrid)
        assert grid.row_count == 0 and not grid.display  # no verdict column that reads as valid
        assert screen.comparison is not None and screen.comparison.refused
        await pilot.press("a")
        await wait_for(pilot, lambda: grid.row_count > 0)
        note = text_of(screen, "#compare-note")
        assert grid.display and "compared although A and B measure different workloads" in note
        assert "run_kind: A measurement  ->  B diagnostic" in note  # the differences stay above the deltas
        assert {r["metric"] for r in grid.visible_rows()} >= {"Output tok/s"}


async def test_a_kernel_override_is_compared_with_the_kernel_listed(app, project):
    def argv(r):
        r["server"]["argv"][5:5] = ["--kernel", f"rmsnorm={WINNER}"]
    b_path = later_copy(project, "kernel", _kernel, argv)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _pair(pilot, app, b_path)
        grid = screen.query_one("#delta-grid", DataGrid)
        await wait_for(pilot, lambda: grid.row_count > 0)
        note = text_of(screen, "#compare-note")
        assert "same workload (the server's kernels differ)" in note and "NOT COMPARED" not in note
        assert f"benchmark.server.kernels.rmsnorm: A (unset)  ->  B {WINNER}" in note
        rows = {r["metric"]: r for r in grid.visible_rows()}
        assert rows["Output tok/s"]["verdict"] in ("better", "worse", "tie")
        assert len(rows) == len(comparison_rows(screen.comparison))  # the engine's deltas, all of them
