"""The Capacity tab of a capacity ramp run searched by SLO margins: the boundary, its 95% interval
and the binding SLO over the plot, the smoothed share and each level's verdict in the table; and
the Ramp tab: the ramp's windows in time order (a timeline and a table) with the hold. The report's capacity
section is the engine's own, from a ramp against a scheduled stand-in server on 127.0.0.1 (TTFT
15 ms per request in flight, TTFT <= 50 ms for 80% of requests)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from tui.conftest import find_run, open_runs, wait_for, wait_screen

from magpie_tui.widgets.data_grid import DataGrid

SIZE = (140, 45)
DATA = Path(__file__).resolve().parent / "data"
SLOS = {"ttft": 50.0}


@pytest.fixture(scope="module")
def ramp_section():
    from bench_server import BenchServer, Script

    from engine.bench.capacity import CapacitySearch
    from engine.bench.dataset import SampleRequest
    from engine.bench.loadgen import LoadGenConfig
    from engine.bench.ramp import RampGenerator, ramp_sections
    srv = BenchServer()
    srv.script_for = lambda _rid, _body: Script(ttft_s=0.015 * srv.in_flight, itl_s=0.001, tokens=2)
    with srv:
        search = CapacitySearch(target=0.8, ceiling=8, max_steps=8, search="margin")
        lg = RampGenerator(LoadGenConfig(base_url=srv.url, model="fake", request_timeout_s=10, event_loop="asyncio"),
                           [SampleRequest(prompt=[1, 2, 3], prompt_len=3, output_len=2, request_id="0")], search,
                           slos=SLOS, window_s=0.15, min_requests=3, hold_s=0.3)
        asyncio.run(lg.run())
    section, _points = ramp_sections(lg, search, SLOS, {"concurrency": 4})
    return section


def test_the_ramp_section_reads_as_rows_a_timeline_and_a_boundary_line(ramp_section):
    from magpie_tui.screens.reports import (capacity_boundary, capacity_columns, capacity_rows, ramp_hold,
                                            ramp_timeline, ramp_windows)
    section = ramp_section
    assert section["search"] == "margin" and section["binding_slo"] == "ttft"
    windows = ramp_windows(section)
    assert [w["kind"] for w in windows][-3:] == ["hold"] * 3 and windows[0]["name"] == "c=1"
    assert all(a["end"] <= b["start"] for a, b in zip(windows, windows[1:]))  # time order, back to back
    # A level the search ran again has a window each, and one row in the level table.
    ramp = [w["level"] for w in windows if w["kind"] == "ramp"]
    assert sorted(set(ramp)) == [r["level"] for r in capacity_rows(section)]
    assert sum(r["repeats"] for r in capacity_rows(section)) == len(ramp) == section["probes"]
    line = capacity_boundary(section)
    assert "95% interval [" in line and "binding SLO TTFT" in line and f"{len(ramp)} runs" in line
    assert line.startswith("boundary c=") and ("smooth" in line or "cliff" in line or "not known" in line)
    assert {c.key for c in capacity_columns(section)} >= {"smoothed_pct", "margin", "verdict"}
    timeline = ramp_timeline(section)
    assert [t[0] for t in timeline] == [w["start"] for w in windows] and timeline[-1][2].startswith("hold")
    assert ramp_hold(section).startswith(f"hold at c={section['knee']:g}: 3 windows")


@pytest.mark.slow  # a few seconds: one report screen
async def test_the_capacity_tab_shows_the_boundary_and_the_ramp_windows(app, project, ramp_section):
    from textual.widgets import Static, TabbedContent

    from magpie_tui.screens.reports import BenchmarkReportScreen
    source = next((DATA / "runs").iterdir())
    run = project / "runs" / source.name
    shutil.copytree(source, run)
    report = json.loads((run / "benchmark_report.json").read_text())
    report["capacity"] = ramp_section
    (run / "benchmark_report.json").write_text(json.dumps(report))
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.path == run.resolve() for r in app.runs))
        app.open_report(find_run(app, run.name))
        await wait_screen(pilot, app, BenchmarkReportScreen, "#ramp-windows")
        screen = app.screen
        screen.query_one(TabbedContent).active = "tab-capacity"
        await pilot.pause()
        boundary = str(screen.query_one("#capacity-boundary", Static).render())
        assert "95% interval" in boundary and "binding SLO TTFT" in boundary
        levels = screen.query_one("#capacity-grid", DataGrid)
        knee = levels.get_row(f"c={ramp_section['knee']:g}")
        assert knee["result"] == "pass · knee" and knee["smoothed_pct"] is not None
        await pilot.press("right_square_bracket")  # the next tab: the ramp's own
        assert screen.query_one(TabbedContent).active == "tab-ramp"
        windows = screen.query_one("#ramp-windows", DataGrid)
        assert windows.row_count == len(ramp_section["windows"])
        assert "hold at c=" in str(screen.query_one("#ramp-hold", Static).render())
        assert "hold✓" in screen.query_one("#ramp-timeline").plot_text()
