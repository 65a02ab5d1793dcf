"""Roofline: per inference stage, the compact roofline table (sortable by value, filterable by
op, category and bound), the roofline plot on log axes, and the GPU timeline with idle gaps."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Select, Static, TabbedContent, TabPane

from engine.runs.catalog import RunInfo
from magpie_tui.widgets.data_grid import Column, DataGrid

NUMERIC = {"operation_count", "num_kernels", "kernel_time_ms_sum", "time_pct", "kernel_time_us_mean", "gflops",
           "data_moved_mb", "arithmetic_intensity_flops_per_byte", "achieved_tflops_mean", "achieved_tbps_mean",
           "pct_roofline_mean", "roofline_time_us"}

ROOFLINE_COLUMNS = [
    Column("op_name", "Op", max_width=40),
    Column("source_category", "Category", max_width=22),
    Column("roofline_bound", "Bound", max_width=14),
    Column("kernel_time_ms_sum", "Time ms", "number", fmt=lambda v: f"{v:.4g}"),
    Column("time_pct", "Time %", "number", fmt=lambda v: f"{v:.1f}"),
    Column("operation_count", "Calls", "number", fmt=lambda v: f"{v:.0f}"),
    Column("kernel_time_us_mean", "Mean us", "number", fmt=lambda v: f"{v:.4g}"),
    Column("arithmetic_intensity_flops_per_byte", "FLOP/B", "number", fmt=lambda v: f"{v:.3g}"),
    Column("achieved_tflops_mean", "TFLOP/s", "number", fmt=lambda v: f"{v:.3g}"),
    Column("achieved_tbps_mean", "TB/s", "number", fmt=lambda v: f"{v:.3g}"),
    Column("pct_roofline_mean", "% roof", "number", fmt=lambda v: f"{v:.1f}"),
    Column("compute_spec", "Peak", max_width=14),
    Column("param_signature", "Shape", max_width=60),
]

BOUND_CLASS = {"MEMORY_BOUND": "memory-bound", "COMPUTE_BOUND": "compute-bound"}


def roofline_stages(run_dir: Path) -> dict[str, Path]:
    """{stage: simple roofline CSV} of a run's ``tracelens/`` folder, in file-name order."""
    folder = run_dir / "tracelens"
    out: dict[str, Path] = {}
    for path in sorted(folder.glob("*_kernel_roofline_simple.csv")) if folder.is_dir() else []:
        stage = path.name.split("_ISL", 1)[0] if "_ISL" in path.name else path.name.rsplit("_kernel_roofline", 1)[0]
        out[stage] = path
    return out


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def load_roofline_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = [row for row in csv.DictReader(line for line in fh if not line.startswith("#"))]
    for row in rows:
        for key in NUMERIC & row.keys():
            row[key] = _number(row[key])
    return rows


def load_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(line for line in fh if not line.startswith("#")))
    except OSError:
        return []


def arch_of(run_dir: Path) -> dict | None:
    """The roofline ceilings the analysis used (from the report's gpu_arch), or None."""
    from engine.trace.arch import resolve_arch
    for name in ("trace_analysis_report.json", "benchmark_report.json"):
        try:
            report = json.loads((run_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        arch = (report.get("tracelens_analysis") or {}).get("gpu_arch")
        if arch:
            try:
                return resolve_arch(arch)
            except (ValueError, OSError):
                return None
    return None


def roofline_points(rows: list[dict[str, Any]]) -> list[tuple[float, float, str, str]]:
    """(FLOP/byte, FLOP/s, label, bound) for rows with a perf model."""
    out = []
    for row in rows:
        ai, tflops = row.get("arithmetic_intensity_flops_per_byte"), row.get("achieved_tflops_mean")
        out.append((ai or 0.0, (tflops or 0.0) * 1e12, f"{row.get('op_name')} {row.get('param_signature', '')}"[:80],
                    row.get("roofline_bound") or ""))
    return out


TIMELINE_COLUMNS = [Column("type", "Type", max_width=30), Column("time ms", "ms", "number", fmt=lambda v: f"{v:.4g}"),
                    Column("percent", "%", "number", fmt=lambda v: f"{v:.1f}")]
GAP_COLUMNS = [Column("where", "Where", max_width=26), Column("start_us", "Start us", "number",
                                                              fmt=lambda v: f"{v:.0f}"),
               Column("duration_us", "Idle us", "number", fmt=lambda v: f"{v:.1f}"),
               Column("before", "Before", max_width=30), Column("after", "After", max_width=30),
               Column("gpu_waited_on_host", "Host-bound"), Column("cpu_ops_during_gap", "CPU ops", max_width=50)]


class RooflineScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="roofline.back"),
        Binding("slash", "focus_filter", "Filter", id="roofline.filter"),
        Binding("p", "show_plot", "Plot", id="roofline.plot"),
        Binding("g", "show_timeline", "Timeline", id="roofline.timeline"),
    ]

    def __init__(self, info: RunInfo) -> None:
        super().__init__()
        self.info = info
        self.stages = roofline_stages(info.path)
        self.rows: list[dict[str, Any]] = []
        self.stage: str | None = next(iter(self.stages), None)
        self.arch = arch_of(info.path)

    def compose(self):
        from magpie_tui.widgets.plots import RooflinePlot
        yield Header()
        yield Static("", id="roofline-title", classes="report-title")
        with TabbedContent(id="roofline-tabs"):
            with TabPane("Table", id="tab-table"):
                with Horizontal(id="roofline-controls"):
                    yield Select([(s, s) for s in self.stages], value=self.stage or Select.NULL,
                                 allow_blank=not self.stages, id="stage", prompt="no stages")
                    yield Input(placeholder="filter: op or shape (/)", id="roofline-filter")
                    yield Select([], prompt="any category", id="category")
                    yield Select([("memory-bound", "MEMORY_BOUND"), ("compute-bound", "COMPUTE_BOUND")],
                                 prompt="any bound", id="bound")
                yield DataGrid(ROOFLINE_COLUMNS, row_class=lambda r: BOUND_CLASS.get(r.get("roofline_bound") or ""),
                               fixed_columns=1, filter_columns=["op_name", "param_signature", "source_category"],
                               id="roofline-grid")
            with TabPane("Plot", id="tab-plot"):
                yield RooflinePlot(**self._plot_args(), id="roofline-plot")
            with TabPane("Timeline", id="tab-timeline"):
                yield DataGrid(TIMELINE_COLUMNS, id="timeline-grid", classes="report-table")
                yield Static("GPU idle gaps (largest first): was the GPU waiting on the host?", classes="report-note")
                yield DataGrid(GAP_COLUMNS, id="gaps-grid")
        yield Footer()

    def _plot_args(self) -> dict:
        if not self.arch:
            return {"title": "roofline",
                    "reason": "no GPU arch for this trace: rerun the analysis with --gpu-arch NAME"}
        peaks = {k: v * 1e12 for k, v in (self.arch.get("max_achievable_tflops") or {}).items()
                 if k.startswith("matrix_") and k in ("matrix_bf16", "matrix_fp8", "matrix_fp32")}
        return {"peak_compute": peaks, "peak_bandwidth": float(self.arch.get("mem_bw_gbps", 0)) * 1e9,
                "title": f"roofline · {self.arch.get('name', '')}"}

    def on_mount(self) -> None:
        self.sub_title = self.info.name
        if self.stage:
            self.load_stage(self.stage)
        else:
            self.query_one("#roofline-title", Static).update(
                f"{self.info.name}: no roofline CSVs under tracelens/ (no GPU kernels in the trace, or the "
                "analysis did not run)")
        self.query_one("#roofline-grid", DataGrid).focus()

    def load_stage(self, stage: str) -> None:
        self.stage = stage
        self.rows = load_roofline_rows(self.stages[stage])
        grid = self.query_one("#roofline-grid", DataGrid)
        grid.set_rows(self.rows, keys=[str(i) for i in range(len(self.rows))])
        grid.sort_by("kernel_time_ms_sum", reverse=True)
        categories = sorted({r.get("source_category") or "" for r in self.rows} - {""})
        self.query_one("#category", Select).set_options([(c, c) for c in categories])
        total = sum(r.get("kernel_time_ms_sum") or 0.0 for r in self.rows)
        arch = self.arch.get("name", "arch") if self.arch else "no arch"
        self.query_one("#roofline-title", Static).update(
            f"stage {stage}: {len(self.rows)} ops, {total:.3f} ms of kernel time · {arch} · enter: kernel details")
        from magpie_tui.widgets.plots import RooflinePlot
        plot = self.query_one(RooflinePlot)
        plot.set_points(roofline_points(self.rows))
        self._load_timeline(stage)

    def _load_timeline(self, stage: str) -> None:
        rows = load_csv(self.info.path / "tracelens" / stage / "gpu_timeline.csv")
        for row in rows:
            for key in ("time ms", "percent"):
                row[key] = _number(row.get(key, ""))
        self.query_one("#timeline-grid", DataGrid).set_rows(rows, keys=[str(i) for i in range(len(rows))])
        gaps: list[dict[str, Any]] = []
        for path in sorted((self.info.path / "gap_analysis").glob("gpu_idle_gaps_rank*.csv")):
            gaps += load_csv(path)
        for row in gaps:
            for key in ("start_us", "duration_us"):
                row[key] = _number(row.get(key, ""))
        grid = self.query_one("#gaps-grid", DataGrid)
        grid.set_rows(gaps, keys=[str(i) for i in range(len(gaps))])
        if gaps:
            grid.sort_by("duration_us", reverse=True)

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "stage" and not event.select.is_blank() and event.value != self.stage:
            self.load_stage(str(event.value))
        elif event.select.id in ("category", "bound"):
            self._apply_filter()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "roofline-filter":
            self._apply_filter()

    def _apply_filter(self) -> None:
        equals = {}
        for key, widget_id in (("source_category", "#category"), ("roofline_bound", "#bound")):
            select = self.query_one(widget_id, Select)
            if not select.is_blank():
                equals[key] = select.value
        self.query_one("#roofline-grid", DataGrid).set_filter(self.query_one("#roofline-filter", Input).value,
                                                              **equals)

    def on_data_grid_row_highlighted(self, event: DataGrid.RowHighlighted) -> None:
        if event.grid.id == "roofline-grid" and event.row_key is not None:
            from magpie_tui.widgets.plots import RooflinePlot
            self.query_one(RooflinePlot).select(int(event.row_key))

    def on_data_grid_row_selected(self, event: DataGrid.RowSelected) -> None:
        if event.grid.id == "roofline-grid" and event.row is not None:
            from magpie_tui.screens.kernel import KernelScreen
            self.app.push_screen(KernelScreen(self.info, self.stage or "", event.row))

    def action_focus_filter(self) -> None:
        self.query_one(TabbedContent).active = "tab-table"
        self.query_one("#roofline-filter", Input).focus()

    def action_show_plot(self) -> None:
        self.query_one(TabbedContent).active = "tab-plot"

    def action_show_timeline(self) -> None:
        self.query_one(TabbedContent).active = "tab-timeline"
