"""Compare and benchmark reports, read from the run folder's report JSON.

The row extraction is plain functions (``compare_rows``, ``benchmark_rows``, ...) so the
numbers on screen are tested without a terminal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane

from engine.runs.catalog import RunInfo
from magpie_tui.widgets.data_grid import Column, DataGrid

# -- compare ---------------------------------------------------------------------------------

VERDICT_CLASS = {"faster": "correct", "baseline": None, "tie": "tie", "slower": "incorrect",
                 "incorrect": "incorrect", "rejected": "incorrect", "not measured": "muted", "cancelled": "muted"}


def load_report(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the report ({exc})") from exc


def compare_rows(report: dict) -> list[dict[str, Any]]:
    """One row per kernel, ranked: correct ones by speedup, then the incorrect ones with why."""
    results = (report.get("results") or {}).get("kernel_results") or []
    ranking = [idx for idx, _score in (report.get("results") or {}).get("rankings") or []]
    baseline_id = (report.get("baseline") or {}).get("id")
    rows = []
    for index, kr in enumerate(results):
        timing = kr.get("timing") or {}
        correct = kr.get("correctness_state") == "SUCCESS"
        verdict = kr.get("verdict") or ("baseline" if kr.get("kernel_id") == baseline_id else None)
        if kr.get("kernel_id") == baseline_id:
            verdict = "baseline"
        ci = kr.get("speedup_ci") or [None, None]
        rows.append({
            "rank": ranking.index(index) + 1 if index in ranking else None,
            "kernel": kr.get("kernel_id", f"#{index}"),
            "correct": "yes" if correct else ("no" if kr.get("correctness_state") == "FAILED" else
                                              str(kr.get("correctness_state", "?")).lower()),
            "median_ms": timing.get("median"),
            "iqr_ms": timing.get("iqr"),
            "cv_pct": timing.get("cv") * 100 if isinstance(timing.get("cv"), (int, float)) else None,
            "n": timing.get("n"),
            "speedup": kr.get("speedup"),
            "ci_low": ci[0],
            "ci_high": ci[1],
            "verdict": verdict or ("incorrect" if not correct else "not measured"),
            "why": "; ".join(kr.get("errors") or []),
            "index": index,
        })
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["index"]))
    return rows


COMPARE_COLUMNS = [
    Column("rank", "#", "number", fmt=lambda v: f"{v:d}", min_width=2),
    Column("kernel", "Kernel", max_width=32),
    Column("correct", "Correct", min_width=7),
    Column("median_ms", "Median ms", "number", fmt=lambda v: f"{v:.4g}"),
    Column("iqr_ms", "IQR ms", "number", fmt=lambda v: f"{v:.3g}"),
    Column("cv_pct", "CV %", "number", fmt=lambda v: f"{v:.1f}"),
    Column("n", "n", "number", fmt=lambda v: f"{v:d}"),
    Column("speedup", "Speedup", "number", fmt=lambda v: f"{v:.3f}x"),
    Column("ci_low", "95% CI low", "number", fmt=lambda v: f"{v:.3f}"),
    Column("ci_high", "high", "number", fmt=lambda v: f"{v:.3f}"),
    Column("verdict", "Verdict"),
    Column("why", "Why not ranked", max_width=80),
]


class CompareReportScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="report.back"),
        Binding("d", "diff", "Diff vs baseline", id="report.diff"),
    ]

    def __init__(self, info: RunInfo, report: dict) -> None:
        super().__init__()
        self.info = info
        self.report = report
        self.rows = compare_rows(report)

    def compose(self):
        yield Header()
        r = self.report
        winner = r.get("winner_id")
        title = (f"{r.get('mode', 'compare')} · {r.get('state', '?')} · baseline "
                 f"{(r.get('baseline') or {}).get('id', '-')} · winner {winner or 'none'}"
                 + (f" ({r['winner_reason']})" if r.get("winner_reason") else ""))
        yield Static(title, classes="report-title")
        yield DataGrid(COMPARE_COLUMNS, row_class=lambda row: VERDICT_CLASS.get(row["verdict"]),
                       id="compare-grid", classes="report-table")
        wrong = [row for row in self.rows if row["correct"] != "yes"]
        for row in wrong:
            yield Static(f"{row['kernel']}: {row['correct']} — {row['why'] or 'no reason recorded'}",
                         classes="incorrect-why")
        yield Static("Speedup = baseline median / kernel median, with a 95% bootstrap interval; an interval "
                     "that contains 1.0 is a tie. Incorrect kernels are never ranked.", classes="report-note")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.info.name
        grid = self.query_one(DataGrid)
        grid.set_rows(self.rows, keys=[row["kernel"] for row in self.rows])
        grid.focus()

    def action_diff(self) -> None:
        from magpie_tui.screens.diff import DiffScreen
        config = _config_file_of(self.info)
        if config is None:
            self.notify("the run's config.yaml does not name its kernel config file", severity="warning")
            return
        grid = self.query_one(DataGrid)
        row = grid.cursor_row
        self.app.push_screen(DiffScreen.for_config(config, candidate=row["kernel"] if row else None))


def _config_file_of(info: RunInfo) -> Path | None:
    import yaml
    try:
        cfg = yaml.safe_load((info.path / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    path = cfg.get("config_file") if isinstance(cfg, dict) else None
    return resolve_config_file(info.path, path)


def resolve_config_file(run_dir: Path, recorded: str | None) -> Path | None:
    """The kernel config a run used: absolute as runs record it, or relative to the run folder
    (recorded demo runs that travel with their project)."""
    if not recorded:
        return None
    path = (run_dir / recorded).resolve()
    return path if path.exists() else None


# -- benchmark -------------------------------------------------------------------------------

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
THROUGHPUT_METRICS = (("request_throughput", "Requests/s"), ("output_throughput", "Output tok/s"),
                      ("total_token_throughput", "Total tok/s"))


def benchmark_rows(report: dict) -> list[dict[str, Any]]:
    """Throughput and latency rows: the first run's value and, with repeats, the mean and 95% interval."""
    result = report.get("result") or {}
    repeats = report.get("repeats") or {}
    rows = []

    def add(key: str, label: str, unit: str) -> None:
        value = result.get(key)
        rep = repeats.get(key) or {}
        ci = rep.get("ci95") or [None, None]
        rows.append({"metric": label, "unit": unit, "value": value, "mean": rep.get("mean"),
                     "ci_low": ci[0], "ci_high": ci[1], "n": rep.get("n"), "key": key})

    for key, label in THROUGHPUT_METRICS:
        add(key, label, "1/s" if key == "request_throughput" else "tok/s")
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median", "p90", "p99", "std"):
            add(f"{stat}_{metric}_ms", f"{metric.upper()} {stat}", "ms")
    return rows


BENCH_COLUMNS = [
    Column("metric", "Metric", min_width=16),
    Column("value", "Run 1", "number", fmt=lambda v: f"{v:.4g}"),
    Column("mean", "Mean of repeats", "number", fmt=lambda v: f"{v:.4g}"),
    Column("ci_low", "95% CI low", "number", fmt=lambda v: f"{v:.4g}"),
    Column("ci_high", "high", "number", fmt=lambda v: f"{v:.4g}"),
    Column("n", "n", "number", fmt=lambda v: f"{v:d}"),
    Column("unit", "Unit"),
]

DELTA_COLUMNS = [
    Column("metric", "Metric", min_width=16),
    Column("a", "A", "number", fmt=lambda v: f"{v:.4g}"),
    Column("b", "B", "number", fmt=lambda v: f"{v:.4g}"),
    Column("delta", "B - A", "number", fmt=lambda v: f"{v:+.4g}"),
    Column("rel", "Rel", "number", fmt=lambda v: f"{v * 100:+.1f}%"),
    Column("noise", "Noise"),
    Column("verdict", "Verdict"),
]


def request_latencies(run_dir: Path) -> dict[str, list[float]]:
    """Per-request TTFT, ITL and E2EL (ms) of the first measured run, when the run kept them."""
    path = run_dir / "requests" / "point0_repeat0.json"
    try:
        detail = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    ok = [e is None or e == "" for e in detail.get("errors", [])] or [True] * len(detail.get("ttfts", []))
    ttft = [t * 1e3 for t, good in zip(detail.get("ttfts", []), ok) if good and t]
    e2el = [t * 1e3 for t, good in zip(detail.get("latencies", []), ok) if good and t]
    itl = [x * 1e3 for gaps, good in zip(detail.get("itls", []), ok) if good for x in (gaps or [])]
    return {"TTFT": ttft, "ITL": itl, "E2EL": e2el}


def load_facts(report: dict) -> str:
    """How the load was made, when the report says (reports before these keys say nothing)."""
    facts = []
    dataset = report.get("dataset") or {}
    if dataset.get("prompts") == "text":
        facts.append(f"text prompts ({dataset.get('tokenizer')})")
    elif dataset.get("prompts"):
        facts.append("token-id prompts")
    if dataset.get("prefix_len"):
        facts.append(f"shared prefix {dataset['prefix_len']}")
    client = (report.get("environment") or {}).get("http_client")
    if client:
        facts.append(f"{client} HTTP client")
    return "".join(f" · {f}" for f in facts)


def sweep_points(report: dict) -> list[tuple[float, float, str]]:
    """(output tok/s, median TTFT ms... TPOT, label) per sweep point."""
    out = []
    for point in report.get("sweep") or []:
        runs = point.get("runs") or []
        if not runs:
            continue
        first = runs[0]
        label = ", ".join(f"{k}={v}" for k, v in (point.get("point") or {}).items()
                          if k in ("concurrency", "input_len", "output_len", "request_rate") and v is not None)
        out.append((first.get("output_throughput") or 0.0, first.get("median_tpot_ms") or 0.0, label))
    return out


def delta_rows(a: dict, b: dict) -> list[dict[str, Any]]:
    """B - A per metric, from the repeats (mean, with noise) or else the single result, as
    ``magpie benchmark --compare-reports`` computes it."""
    from engine.bench.metrics import compare_reports
    side_a = a.get("repeats") or a.get("result") or {}
    side_b = b.get("repeats") or b.get("result") or {}
    rows = []
    for key, d in compare_reports(side_a, side_b).items():
        rows.append({"metric": key, "a": d.get("a"), "b": d.get("b"), "delta": d.get("delta"),
                     "rel": d.get("rel_delta"), "noise": d.get("noise"), "verdict": d.get("verdict") or "-"})
    return rows


class BenchmarkReportScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="report.back"),
        Binding("b", "compare_with", "Compare with…", id="report.compare_with"),
        Binding("t", "roofline", "Roofline", id="report.roofline"),
    ]

    def __init__(self, info: RunInfo, report: dict) -> None:
        super().__init__()
        self.info = info
        self.report = report

    def compose(self):
        from magpie_tui.widgets.plots import Histogram, LinePlot
        r = self.report
        yield Header()
        yield Static(f"{r.get('framework', '?')} {r.get('model', '')} · {r.get('state', '?')} · "
                     f"{r.get('run_kind', '')} · envs {r.get('envs', {})}{load_facts(r)}", classes="report-title")
        with TabbedContent(id="bench-tabs"):
            with TabPane("Metrics", id="tab-metrics"):
                yield DataGrid(BENCH_COLUMNS, id="bench-grid", classes="report-table")
                for err in (r.get("errors") or [])[:5]:
                    yield Static(err, classes="incorrect-why")
            with TabPane("Distributions", id="tab-dist"):
                latencies = request_latencies(self.info.path)
                with Horizontal(classes="plots"):
                    for name in ("TTFT", "ITL", "E2EL"):
                        yield Histogram(latencies.get(name, []), title=f"{name} (ms)", id=f"hist-{name.lower()}")
            if r.get("sweep"):
                with TabPane("Sweep", id="tab-sweep"):
                    yield LinePlot(sweep_points(r), title="median TPOT vs output throughput",
                                   x_label="output tok/s", y_label="median TPOT (ms)", id="sweep-plot")
            with TabPane("Compare", id="tab-compare"):
                yield Static("b: pick another benchmark run to compare against (B - A, with noise)",
                             id="compare-note", classes="report-note")
                yield DataGrid(DELTA_COLUMNS, row_class=lambda row: {"better": "correct", "worse": "incorrect"}.get(
                    row["verdict"], "tie" if row["noise"] == "inside" else None), id="delta-grid")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.info.name
        rows = benchmark_rows(self.report)
        self.query_one("#bench-grid", DataGrid).set_rows(rows, keys=[row["key"] for row in rows])
        self.query_one("#bench-grid", DataGrid).focus()

    def compare_with(self, other: RunInfo) -> None:
        """Side by side: this run is A, ``other`` is B."""
        path = other.report_path
        if path is None:
            self.notify(f"{other.name} has no report", severity="error")
            return
        b = load_report(path)
        rows = delta_rows(self.report, b)
        self.query_one("#delta-grid", DataGrid).set_rows(rows, keys=[row["metric"] for row in rows])
        self.query_one("#compare-note", Static).update(f"A = {self.info.name}   B = {other.name}   "
                                                       "noise: inside = within run-to-run spread")
        self.query_one(TabbedContent).active = "tab-compare"

    def action_compare_with(self) -> None:
        from magpie_tui.screens.pick_run import PickRunScreen
        others = [r for r in self.app.runs if r.mode == "benchmark" and r.path != self.info.path and r.report_path]
        if not others:
            self.notify("no other finished benchmark run to compare with", severity="warning")
            return
        self.app.push_screen(PickRunScreen(others, "Compare with which benchmark run (B)?"),
                             lambda chosen: self.compare_with(chosen) if chosen else None)

    def action_roofline(self) -> None:
        from magpie_tui.screens.roofline import RooflineScreen
        if not (self.info.path / "tracelens").is_dir():
            self.notify("this run has no tracelens/ analysis (run it profiled with tracelens on)",
                        severity="warning")
            return
        self.app.push_screen(RooflineScreen(self.info))


def open_report_screen(app, info: RunInfo) -> Screen | None:
    """The screen for a run's report, or None (with a notice saying why)."""
    path = info.report_path
    if path is None:
        app.notify(f"{info.name}: no report yet ({info.state})", severity="warning")
        return None
    try:
        report = load_report(path)
    except ValueError as exc:
        app.notify(str(exc), severity="error")
        return None
    if path.name in ("compare_report.json", "analyze_report.json"):
        return CompareReportScreen(info, report)
    if path.name == "benchmark_report.json":
        return BenchmarkReportScreen(info, report)
    if path.name == "trace_analysis_report.json":
        from magpie_tui.screens.roofline import RooflineScreen
        return RooflineScreen(info)
    return None

