"""Roofline: per inference stage, the compact roofline table (sortable by value, filterable by
op, category and bound), the roofline plot on log axes, and the GPU timeline with idle gaps."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from textual import work
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Header, Input, Select, Static, TabbedContent, TabPane
from textual.widgets.select import InvalidSelectValueError

from engine.jobs.query import RunInfo, open_text, read_json
from magpie_tui.widgets.footer import KeysFooter
from magpie_tui.widgets.gpu_timeline import GpuTimeline
from magpie_tui.screens.tabs import cycle_tab, tab_bindings
from magpie_tui.widgets.data_grid import Column, DataGrid

NUMERIC = {"operation_count", "num_kernels", "kernel_time_ms_sum", "time_pct", "kernel_time_us_mean", "gflops",
           "data_moved_mb", "arithmetic_intensity_flops_per_byte", "achieved_tflops_mean", "achieved_tbps_mean",
           "pct_roofline_mean", "roofline_time_us"}

def _pct_roof(value: float) -> str:
    # Above 100% of the roofline is impossible for the kernel: the perf model (FLOPs, bytes) or
    # the timing is wrong. The mark shows even without colours.
    return f"{value:.1f}!" if value > 100.0 else f"{value:.1f}"


# What matters first, so that it fits in 80 columns: the op (frozen while scrolling sideways),
# its time, how close it is to the roof and why; the details follow.
ROOFLINE_COLUMNS = [
    Column("op_name", "Op", max_width=26),
    Column("kernel_time_ms_sum", "Time ms", "number", fmt=lambda v: f"{v:.4g}"),
    Column("time_pct", "Time %", "number", fmt=lambda v: f"{v:.1f}"),
    Column("pct_roofline_mean", "% roof", "number", fmt=_pct_roof),
    Column("achieved_tflops_mean", "TFLOP/s", "number", fmt=lambda v: f"{v:.3g}"),
    Column("achieved_tbps_mean", "TB/s", "number", fmt=lambda v: f"{v:.3g}"),
    Column("roofline_bound", "Bound", max_width=14),
    Column("source_category", "Category", max_width=22),
    Column("operation_count", "Calls", "number", fmt=lambda v: f"{v:.0f}"),
    Column("kernel_time_us_mean", "Mean us", "number", fmt=lambda v: f"{v:.4g}"),
    Column("arithmetic_intensity_flops_per_byte", "FLOP/B", "number", fmt=lambda v: f"{v:.3g}"),
    Column("compute_spec", "Peak", max_width=14),
    Column("param_signature", "Shape", max_width=60),
]


def roofline_row_class(row: dict[str, Any]) -> str | None:
    pct = row.get("pct_roofline_mean")
    if isinstance(pct, float) and pct > 100.0:
        return "suspect"
    return BOUND_CLASS.get(row.get("roofline_bound") or "")


BOUND_CLASS = {"MEMORY_BOUND": "memory-bound", "COMPUTE_BOUND": "compute-bound"}


def roofline_stages(run_dir: Path) -> dict[str, Path]:
    """{stage: simple roofline CSV} of a run's ``tracelens/`` folder, in file-name order."""
    folder = run_dir / "tracelens"
    out: dict[str, Path] = {}
    for path in sorted(folder.glob("*_kernel_roofline_simple.csv")) if folder.is_dir() else []:
        stage = path.name.split("_ISL", 1)[0] if "_ISL" in path.name else path.name.rsplit("_kernel_roofline", 1)[0]
        out[stage] = path
    return out


STAGE_NAMES = {"prefilldecode": "prefilldecode·mixed", "decode_only": "decode_only", "prefill_only": "prefill_only"}


def stage_options(stages) -> list[tuple[str, str]]:
    """(label, stage) for a stage dropdown: the analysis's names, the mixed one said so."""
    return [(STAGE_NAMES.get(s, s), s) for s in stages]


def analysed_step(run_dir: Path, stage: str) -> int | None:
    """Which step of the trace (its index in time order) TraceLens analysed for ``stage``: the
    ``iteration_<i>`` of the stage's split trace, as the report records it; None when unknown."""
    import re
    for name in ("trace_analysis_report.json", "benchmark_report.json"):
        try:
            report = read_json(run_dir / name)
        except (OSError, ValueError):
            continue
        result = ((report.get("tracelens_analysis") or {}).get("stage_results") or {}).get(stage) or {}
        path = str((result.get("phase_pick") or {}).get("output_path") or result.get("trace_path") or "")
        found = re.search(r"_iteration_(\d+)_", Path(path).name)
        return int(found.group(1)) if found else None
    return None


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def load_roofline_rows(path: Path) -> list[dict[str, Any]]:
    with open_text(path, newline="") as fh:  # a FIFO or a device under the name is refused
        rows = [row for row in csv.DictReader(line for line in fh if not line.startswith("#"))]
    for row in rows:
        for key in NUMERIC & row.keys():
            row[key] = _number(row[key])
    return rows


def load_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open_text(path, newline="") as fh:
            return list(csv.DictReader(line for line in fh if not line.startswith("#")))
    except OSError:
        return []


def arch_of(run_dir: Path) -> dict | None:
    """The roofline ceilings the analysis used (from the report's gpu_arch), or None."""
    from engine.jobs.query import arch_of_name
    for name in ("trace_analysis_report.json", "benchmark_report.json"):
        try:
            report = read_json(run_dir / name)
        except (OSError, ValueError):
            continue
        arch = (report.get("tracelens_analysis") or {}).get("gpu_arch")
        if arch:
            return arch_of_name(arch)
    return None


def trace_file_of(run_dir: Path) -> Path | None:
    """The profiler trace a trace-analysis run read (its config.yaml ``trace_dir``: a file, or a
    folder of ``*.json``/``*.json.gz``), when it is still on disk."""
    from engine.jobs.query import read_recorded_config
    recorded = read_recorded_config(run_dir).get("trace_dir")
    if not recorded:
        return None
    path = (run_dir / str(recorded)).resolve()
    if path.is_file():
        return path
    if path.is_dir():
        found = sorted(path.glob("*.json.gz")) + sorted(path.glob("*.json"))
        return found[0] if found else None
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
        Binding("escape", "back", "Back", id="roofline.back"),
        Binding("slash", "focus_filter", "Filter", id="roofline.filter"),
        Binding("t", "show_table", "Table", id="roofline.table"),
        Binding("p", "show_plot", "Plot", id="roofline.plot"),
        Binding("l", "show_timeline", "Timeline", id="roofline.timeline"),  # g/G: first/last row
    ] + tab_bindings("roofline")
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("roofline.back", "roofline.filter", "roofline.table", "roofline.plot",
                   "roofline.timeline", "grid.sort", "timeline.zoom_in", "timeline.zoom_out")

    def action_next_tab(self) -> None:
        cycle_tab(self, 1)

    def action_previous_tab(self) -> None:
        cycle_tab(self, -1)

    def __init__(self, info: RunInfo) -> None:
        super().__init__()
        self.info = info
        self.stages = roofline_stages(info.path)
        self.rows: list[dict[str, Any]] = []
        self.stage: str | None = next(iter(self.stages), None)
        self.arch = arch_of(info.path)
        self.gaps: list[dict[str, Any]] = []
        self.timeline_loaded = False  # the lanes are read once; a stage change only moves the view
        self.analysed_steps: dict[str, int | None] = {}  # stage -> the step TraceLens analysed

    def compose(self):
        from magpie_tui.widgets.plots import RooflinePlot
        saved = self.app.view_state.get(("roofline", self.info.path), {})
        if saved.get("stage") in self.stages:
            self.stage = saved["stage"]
        yield Header()
        yield Static("", id="roofline-title", classes="report-title")
        with TabbedContent(id="roofline-tabs", classes="-fill"):
            with TabPane("Table", id="tab-table"):
                with Horizontal(id="roofline-controls"):
                    # No type-to-search: the screen's letter keys (p, g, t) work with a dropdown focused.
                    yield Select(stage_options(self.stages), value=self.stage or Select.NULL,
                                 allow_blank=not self.stages, id="stage", prompt="no stages", type_to_search=False,
                                 compact=True)
                    yield Input(placeholder="/ filter: op or shape", id="roofline-filter", compact=True)
                    yield Select([], prompt="any category", id="category", type_to_search=False, compact=True)
                    yield Select([("memory-bound", "MEMORY_BOUND"), ("compute-bound", "COMPUTE_BOUND")],
                                 prompt="any bound", id="bound", type_to_search=False, compact=True)
                yield DataGrid(ROOFLINE_COLUMNS, row_class=roofline_row_class,
                               fixed_columns=1, filter_columns=["op_name", "param_signature", "source_category"],
                               id="roofline-grid")
            with TabPane("Plot", id="tab-plot"):
                yield RooflinePlot(**self._plot_args(), id="roofline-plot")
            with TabPane("Timeline", id="tab-timeline"):
                with Horizontal(id="timeline-controls"):
                    yield Static("stage", classes="report-note")
                    yield Select(stage_options(self.stages), value=self.stage or Select.NULL,
                                 allow_blank=not self.stages, id="timeline-stage", prompt="no stages",
                                 type_to_search=False, compact=True)
                    yield Static("n/N: next/previous step of the stage · +/-: zoom · 0: whole trace",
                                 classes="report-note")
                yield GpuTimeline(id="gpu-timeline")
                yield Static("", id="timeline-note", classes="report-note")
                yield DataGrid(TIMELINE_COLUMNS, id="timeline-grid", classes="report-table")
                yield Static("", id="gaps-note", classes="report-note")
                yield DataGrid(GAP_COLUMNS, id="gaps-grid")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

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
        saved = self.app.view_state.get(("roofline", self.info.path), {})
        if self.stage:
            self.load_stage(self.stage)
        else:
            self.query_one("#roofline-title", Static).update(
                f"{self.info.name}: no roofline CSVs under tracelens/ (no GPU kernels in the trace, or the "
                "analysis did not run)")
        if saved:
            self._restore(saved)
        self.query_one("#roofline-grid", DataGrid).focus()

    def _restore(self, saved: dict[str, Any]) -> None:
        """Filter, sort and tab as the user left them when this run's roofline was last open."""
        self.query_one("#roofline-filter", Input).value = saved.get("filter", "")
        for widget_id in ("category", "bound"):
            value = saved.get(widget_id)
            if value is not None:
                try:
                    self.query_one(f"#{widget_id}", Select).value = value
                except InvalidSelectValueError:  # the category is not in this stage
                    pass
        grid = self.query_one("#roofline-grid", DataGrid)
        if saved.get("sort") is not None:
            grid.sort_by(saved["sort"], reverse=saved.get("reverse", False))
        self._apply_filter()
        if saved.get("tab"):
            self.query_one(TabbedContent).active = saved["tab"]

    def on_data_grid_sorted(self, _event: DataGrid.Sorted) -> None:
        self._save_state()

    def on_tabbed_content_tab_activated(self, _event: TabbedContent.TabActivated) -> None:
        self._save_state()

    def _save_state(self) -> None:
        """Kept on the app, so reopening this run's roofline comes back to the same view."""
        if not self.query("#roofline-grid"):
            return
        grid = self.query_one("#roofline-grid", DataGrid)
        selects = {widget_id: None if self.query_one(f"#{widget_id}", Select).is_blank()
                   else self.query_one(f"#{widget_id}", Select).value for widget_id in ("category", "bound")}
        self.app.view_state[("roofline", self.info.path)] = {
            "stage": self.stage, "filter": self.query_one("#roofline-filter", Input).value,
            "sort": grid.sort_column, "reverse": grid.sort_reverse, "tab": self.query_one(TabbedContent).active,
            **selects}

    def load_stage(self, stage: str) -> None:
        self.stage = stage
        for widget_id in ("#stage", "#timeline-stage"):  # both dropdowns name the stage shown
            select = self.query_one(widget_id, Select)
            if select.is_blank() or select.value != stage:
                select.value = stage
        self.rows = load_roofline_rows(self.stages[stage])
        grid = self.query_one("#roofline-grid", DataGrid)
        grid.set_rows(self.rows, keys=[str(i) for i in range(len(self.rows))])
        if grid.sort_column is None:  # the first stage shown; another stage keeps the user's sort
            grid.sort_by("kernel_time_ms_sum", reverse=True)
        categories = sorted({r.get("source_category") or "" for r in self.rows} - {""})
        self.query_one("#category", Select).set_options([(c, c) for c in categories])
        total = sum(r.get("kernel_time_ms_sum") or 0.0 for r in self.rows)
        arch = self.arch.get("name", "arch") if self.arch else "no arch"
        above = [r.get("op_name") for r in self.rows if roofline_row_class(r) == "suspect"]
        warning = (f"\n! {len(above)} op(s) above 100% of the roofline ({', '.join(map(str, above[:3]))}): "
                   "the perf model's FLOPs/bytes or the timing is wrong") if above else ""
        self.query_one("#roofline-title", Static).update(
            f"{stage}: {len(self.rows)} ops, {total:.3f} ms of kernel time · {arch} · enter: kernel" + warning)
        from magpie_tui.widgets.plots import RooflinePlot
        plot = self.query_one(RooflinePlot)
        plot.set_points(roofline_points(self.rows))
        self._load_timeline(stage)
        self._save_state()

    def _load_timeline(self, stage: str) -> None:
        rows = load_csv(self.info.path / "tracelens" / stage / "gpu_timeline.csv")
        for row in rows:
            for key in ("time ms", "percent"):
                row[key] = _number(row.get(key, ""))
        self.query_one("#timeline-grid", DataGrid).set_rows(rows, keys=[str(i) for i in range(len(rows))])
        total = next((r["time ms"] for r in rows if r.get("type") == "total_time"), None)
        self.query_one("#timeline-note", Static).update(
            f"stage {stage}: where the GPU's time went in the profiled steps of this stage (TraceLens)"
            + (f", {total:.4g} ms in all" if isinstance(total, float) else "") if rows else
            f"stage {stage}: no gpu_timeline.csv")
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
        self.gaps = gaps
        if self.timeline_loaded:
            self.query_one(GpuTimeline).show_stage(stage, self.analysed_steps.get(stage))
        else:
            self._load_lanes(stage)
        idle_ms = sum(g.get("duration_us") or 0.0 for g in gaps) / 1e3
        # The gaps come from the whole trace (every stage and step), not from the stage above:
        # their sum is not part of the stage's total.
        self.query_one("#gaps-note", Static).update(
            f"GPU idle gaps of the whole trace, all stages (gap analysis): {len(gaps)} gaps, {idle_ms:.4g} ms idle, "
            "largest first — was the GPU waiting on the host?" if gaps else "no GPU idle gaps recorded (gap analysis)")

    @work(thread=True, exclusive=True, group="timeline-trace", exit_on_error=False,
          description="read the run's trace for the GPU timeline")
    def _load_lanes(self, stage: str) -> None:
        """The trace's kernels per stream, tagged by stage, when the trace is still on disk; else
        the gap analysis (its idle gaps and its step table)."""
        from magpie_tui.widgets.gpu_timeline import (
            lanes_from_gaps, mark_idle, steps_from_gap_rows, tag_stages, timeline_from_trace,
        )
        trace = trace_file_of(self.info.path)
        lanes, steps, source = [], [], ""
        if trace is not None:
            try:
                lanes, steps = timeline_from_trace(trace)
                lanes = mark_idle(lanes, self.gaps)
                source = f"trace {trace.name}: kernels per stream"
            except (OSError, ValueError) as exc:
                source = f"trace {trace.name} unreadable ({exc}); "
        if not lanes:
            lanes = lanes_from_gaps(self.gaps)
            step_files = sorted((self.info.path / "gap_analysis").glob("gpu_idle_steps_rank*.csv"))
            ends = [e for e in (_number(str(g.get("end_us", ""))) for g in self.gaps) if e is not None]
            steps = steps_from_gap_rows(load_csv(step_files[0]), max(ends, default=None)) if step_files else []
            lanes = tag_stages(lanes, steps)
            source += "gap analysis only (the trace is not on this machine): busy = between idle gaps"
        picked = {name: analysed_step(self.info.path, name) for name in self.stages}
        self.app.call_from_thread(self._show_lanes, lanes, source, steps, picked)

    def _show_lanes(self, lanes, source: str, steps, picked: dict[str, int | None]) -> None:
        timeline = self.query_one(GpuTimeline)
        timeline.set_lanes(lanes, source, steps)
        self.analysed_steps = picked
        self.timeline_loaded = True
        # The stage may have changed while the trace was read: show the one chosen now.
        timeline.show_stage(self.stage, picked.get(self.stage or ""))

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id in ("stage", "timeline-stage") and not event.select.is_blank() and event.value != self.stage:
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
        self._save_state()

    def on_data_grid_row_highlighted(self, event: DataGrid.RowHighlighted) -> None:
        if event.grid.id == "roofline-grid" and event.row_key is not None:
            from magpie_tui.widgets.plots import RooflinePlot
            self.query_one(RooflinePlot).select(int(event.row_key))

    def on_data_grid_row_selected(self, event: DataGrid.RowSelected) -> None:
        if event.grid.id == "roofline-grid" and event.row is not None:
            from magpie_tui.screens.kernel import KernelScreen
            self.app.push_screen(KernelScreen(self.info, self.stage or "", event.row))

    def action_focus_filter(self) -> None:
        self._show_tab("tab-table", "#roofline-filter")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "roofline-filter":  # keep the filter, back to the rows
            self.query_one("#roofline-grid", DataGrid).focus()

    def action_back(self) -> None:
        """Esc steps back one level: out of the filter box (clearing it) or a dropdown to the
        table, and only from the table closes the screen."""
        focused = self.focused
        if isinstance(focused, Input) and focused.id == "roofline-filter":
            focused.value = ""
            self.query_one("#roofline-grid", DataGrid).focus()
        elif isinstance(focused, Select) or self.query_one(TabbedContent).active != "tab-table":
            self.action_show_table()
        else:
            self.app.pop_screen()

    def action_show_table(self) -> None:
        self._show_tab("tab-table", "#roofline-grid")

    def _show_tab(self, tab: str, focus: str | None) -> None:
        # Let go of the focus first: a focused control left in a hidden tab hands its focus to
        # its neighbour there, and TabbedContent then switches back to that tab.
        self.set_focus(None)
        self.query_one(TabbedContent).active = tab
        if focus is not None:
            self.query_one(focus).focus()

    def action_show_plot(self) -> None:
        self._show_tab("tab-plot", None)

    def action_show_timeline(self) -> None:
        self._show_tab("tab-timeline", "#gpu-timeline")
