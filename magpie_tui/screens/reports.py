"""Compare and benchmark reports, read from the run folder's report JSON.

The row extraction is plain functions (``compare_rows``, ``benchmark_rows``, ...) so the
numbers on screen are tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from textual import work
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Header, Static, TabbedContent, TabPane

from engine.errors import MagpieError
from engine.jobs.query import (
    CI_NOT_MEANINGFUL, MIN_REPEATS_FOR_CI, ReportComparison, RunInfo, format_interval, no_roofline_reason, read_json,
)
from engine.runs import schema
from engine.runs.schema import Report, StageState, Verdict
from magpie_tui.screens.tabs import cycle_tab, tab_bindings
from magpie_tui.widgets.data_grid import Column, DataGrid
from magpie_tui.widgets.footer import KeysFooter

_M = TypeVar("_M", bound=BaseModel)

# -- compare ---------------------------------------------------------------------------------

VERDICT_CLASS = {"faster": "correct", "baseline": None, "tie": "tie", "slower": "incorrect",
                 "incorrect": "incorrect", "rejected": "incorrect", "not measured": "muted", "cancelled": "muted"}


def load_report(path: Path) -> Report:
    """The report's model (engine.runs.schema), picked by file name; ValueError (a
    RunFileError) naming the file and the failing field when it cannot be read or validated."""
    return schema.load_report(path)


def _section(report: Any, name: str, model: type[_M]) -> _M | None:
    """One section of a report, typed: the model's attribute, or, for a raw dict (a partial
    report, a test's), that section alone validated through its model."""
    if isinstance(report, schema.RunFile):
        return getattr(report, name, None)
    raw = report.get(name) if isinstance(report, dict) else None
    return model.model_validate(raw) if raw else None


def _kernel_view(report: Any) -> tuple[list[schema.KernelResult], list[tuple[int, float]], str | None]:
    """(kernel results, rankings, baseline id) of a compare or analyze report, model or dict."""
    if isinstance(report, dict) and isinstance(report.get("results"), list):  # analyze, as a dict
        return [schema.KernelResult.model_validate(k) for k in report["results"]], [], None
    if isinstance(report, schema.AnalyzeReport):
        return report.kernel_results, [], None
    results = _section(report, "results", schema.CompareResults)
    baseline = _section(report, "baseline", schema.Baseline)
    return (results.kernel_results if results else [], results.rankings if results else [],
            baseline.id if baseline else None)


def _was_cut_by_cancel(kr: schema.KernelResult) -> bool:
    """True when a kernel's correctness never ran to an answer because the run was cancelled:
    not started (skipped, no state) or its harness stopped by the cancel."""
    state = kr.correctness_state
    if state in (None, StageState.SKIPPED, StageState.CANCELLED, StageState.RUNNING, StageState.STOPPING):
        return True
    harness_run = (kr.correctness_result or {}).get("harness_run") or {}
    return state == StageState.FAILED and bool(harness_run.get("cancelled"))


def _correct_cell(kr: schema.KernelResult, cancelled: bool) -> str:
    if kr.correct:
        return "yes"
    if cancelled and _was_cut_by_cancel(kr):
        return "not reached" if kr.correctness_state in (None, StageState.SKIPPED) else "cancelled"
    return "no" if kr.correctness_state == StageState.FAILED else str(kr.correctness_state or "?").lower()


def compare_rows(report: schema.CompareReport | schema.AnalyzeReport | dict) -> list[dict[str, Any]]:
    """One row per kernel, ranked: correct ones by speedup, then the incorrect ones with why.
    In a cancelled run a kernel the cancel cut short reads "cancelled" / "not reached", never "no"."""
    results, rankings, baseline_id = _kernel_view(report)
    state = report.get("state") if isinstance(report, dict) else getattr(report, "state", None)
    cancelled = state == "cancelled"
    ranking = [idx for idx, _score in rankings]
    rows = []
    for index, kr in enumerate(results):
        timing = kr.timing or schema.Timing()
        correct = kr.correct
        cut = cancelled and not correct and _was_cut_by_cancel(kr)
        verdict = kr.verdict or (Verdict.BASELINE if kr.kernel_id == baseline_id else None)
        if kr.kernel_id == baseline_id:
            verdict = Verdict.BASELINE
        if cut and kr.kernel_id != baseline_id:
            verdict = Verdict.CANCELLED
        ci = kr.speedup_ci or [None, None]
        why = "; ".join(kr.errors)
        if cut:
            why = "the run was cancelled before this kernel " + (
                "was checked" if kr.correctness_state in (None, StageState.SKIPPED) else "finished its check")
        rows.append({
            "rank": ranking.index(index) + 1 if index in ranking else None,
            "kernel": kr.kernel_id,
            "correct": _correct_cell(kr, cancelled),
            "median_ms": timing.median,
            "iqr_ms": timing.iqr,
            "cv_pct": timing.cv * 100 if timing.cv is not None else None,
            "n": timing.n,
            "speedup": kr.speedup,
            "ci_low": ci[0],
            "ci_high": ci[1],
            "verdict": verdict or (Verdict.INCORRECT if not correct else Verdict.NOT_MEASURED),
            "ci": (ci[0], ci[1]) if ci[0] is not None and ci[1] is not None else None,
            "why": why,
            "index": index,
        })
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["index"]))
    return rows


# What decides a compare first (verdict, speedup and its interval), so it fits in 80 columns;
# the timing details follow, and the rank and kernel stay put while scrolling sideways.
COMPARE_COLUMNS = [
    Column("rank", "#", "number", fmt=lambda v: f"{v:d}", min_width=2),
    Column("kernel", "Kernel", max_width=20),
    Column("verdict", "Verdict", max_width=12),
    Column("speedup", "Speedup", "number", fmt=lambda v: f"{v:.3f}x"),
    Column("ci", "95% CI", fmt=lambda v: f"[{v[0]:.3f}, {v[1]:.3f}]", max_width=16),
    Column("correct", "Correct", min_width=7, max_width=11),
    Column("median_ms", "Median ms", "number", fmt=lambda v: f"{v:.4g}"),
    Column("iqr_ms", "IQR ms", "number", fmt=lambda v: f"{v:.3g}"),
    Column("cv_pct", "CV %", "number", fmt=lambda v: f"{v:.1f}"),
    Column("n", "n", "number", fmt=lambda v: f"{v:d}"),
    Column("why", "Why not ranked", max_width=80),
]


def compare_title(mode: str, state: str, baseline_id: str, winner: str | None, reason: str | None,
                  rows: list[dict[str, Any]]) -> str:
    """The report's one-line verdict. A cancelled run says so first, with how far it got; it
    never names a winner or blames the baseline for what the cancel stopped."""
    if state == "cancelled":
        checked = sum(1 for row in rows if row["correct"] not in ("not reached", "cancelled"))
        timed = sum(1 for row in rows if row["median_ms"] is not None)
        return (f"{mode} · CANCELLED after {checked} of {len(rows)} kernels checked, {timed} timed · "
                f"baseline {baseline_id} · no winner (the run was cancelled)")
    return (f"{mode} · {state} · baseline {baseline_id} · winner {winner or 'none'}"
            + (f" ({reason})" if reason else ""))


class CompareReportScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="report.back"),
        Binding("d", "diff", "Diff vs baseline", id="report.diff"),
    ]
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("report.back", "report.diff", "grid.sort")

    def __init__(self, info: RunInfo, report: schema.CompareReport | schema.AnalyzeReport | dict) -> None:
        super().__init__()
        self.info = info
        if isinstance(report, dict):
            name = schema.ANALYZE_REPORT if report.get("mode") == "analyze" else schema.COMPARE_REPORT
            report = schema.parse_report(name, report)
        self.report = report
        self.rows = compare_rows(report)

    def compose(self):
        yield Header()
        r = self.report
        # An analyze report has no baseline and no winner.
        winner = getattr(r, "winner_id", None)
        baseline = getattr(r, "baseline", None)
        reason = getattr(r, "winner_reason", None)
        baseline_id = baseline.id if baseline is not None and baseline.id is not None else "-"
        yield Static(compare_title(r.mode, r.state, baseline_id, winner, reason, self.rows), classes="report-title")
        yield DataGrid(COMPARE_COLUMNS, row_class=lambda row: VERDICT_CLASS.get(row["verdict"]), fixed_columns=2,
                       id="compare-grid", classes="report-table")
        wrong = [row for row in self.rows if row["correct"] != "yes"]
        for row in wrong:
            yield Static(f"{row['kernel']}: {row['correct']} — {row['why'] or 'no reason recorded'}",
                         classes="incorrect-why")
        yield Static("Speedup = baseline median / kernel median, with a 95% bootstrap interval; an interval "
                     "that contains 1.0 is a tie. Incorrect kernels are never ranked.", classes="report-note")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

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
        # The baseline this run compared against (its --baseline), not the config's default.
        baseline = getattr(self.report, "baseline", None)
        self.app.push_screen(DiffScreen.for_config(config, candidate=row["kernel"] if row else None,
                                                   baseline=baseline.id if baseline is not None else None))


def _config_file_of(info: RunInfo) -> Path | None:
    from engine.jobs.query import ConfigError, read_yaml
    try:
        cfg = read_yaml(info.path / "config.yaml") or {}
    except ConfigError:
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
HISTOGRAMS = ("TTFT", "TPOT", "ITL", "E2EL")
THROUGHPUT_METRICS = (("request_throughput", "Requests/s"), ("output_throughput", "Output tok/s"),
                      ("total_token_throughput", "Total tok/s"))


def _shown(value: Any, absent: str) -> Any:
    """A title field: ``absent`` when the report does not carry it."""
    return absent if value is None else value


def _bench(report: schema.BenchmarkReport | dict) -> schema.BenchmarkReport:
    return report if isinstance(report, schema.BenchmarkReport) else \
        schema.parse_report(schema.BENCHMARK_REPORT, report)  # type: ignore[return-value]


def benchmark_rows(report: schema.BenchmarkReport | dict) -> list[dict[str, Any]]:
    """Throughput and latency rows: the first run's value and, with repeats, the mean and 95% interval."""
    r = _bench(report)
    result = r.result or schema.BenchResult()
    repeats = r.repeats or {}
    rows = []

    def add(key: str, label: str, unit: str) -> None:
        value = result.value(key)
        rep = repeats.get(key) or schema.RepeatStat()
        ci: list[Any] = [None, None]
        note = ""
        if rep.n and rep.n > 1:  # the interval as the report gives it, or the report's reason for none
            text = format_interval(rep.model_dump(), ".4g")
            if text.startswith("[") and rep.ci95:
                # A throughput or latency is never negative: the t-interval's low end is clipped at 0.
                ci = [max(0.0, rep.ci95[0]), rep.ci95[1]]
            # else no interval: the note above the table says why (fewer than 3 repeats)
        if key.endswith("_itl_ms") and value == 0 and not key.startswith(("mean", "std")):
            note = "0: most tokens came several to a streamed chunk (no gap between them)"
        rows.append({"metric": label, "unit": unit, "value": value, "mean": rep.mean,
                     "ci_low": ci[0], "ci_high": ci[1], "n": rep.n, "key": key, "note": note})

    for key, label in THROUGHPUT_METRICS:
        add(key, label, "1/s" if key == "request_throughput" else "tok/s")
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median", "p90", "p99", "std"):
            add(f"{stat}_{metric}_ms", f"{metric.upper()} {stat}", "ms")
    return rows


def metric_label(key: str) -> str:
    """``median_ttft_ms`` -> ``TTFT median (ms)``, ``output_throughput`` -> ``Output tok/s``: the
    names the Metrics tab uses, with units, for the engine's snake_case keys."""
    for name, label in THROUGHPUT_METRICS:
        if key == name:
            return label
    parts = key.split("_")
    if len(parts) == 3 and parts[1] in LATENCY_METRICS and parts[2] == "ms":
        return f"{parts[1].upper()} {parts[0]} (ms)"
    return key.replace("_", " ")


SERVER_COLUMNS = [
    Column("name", "Series", max_width=44),
    Column("kind", "Kind", max_width=8),
    Column("min", "Min", "number", fmt=lambda v: f"{v:.4g}"),
    Column("mean", "Mean", "number", fmt=lambda v: f"{v:.4g}"),
    Column("max", "Max", "number", fmt=lambda v: f"{v:.4g}"),
    Column("last", "Last", "number", fmt=lambda v: f"{v:.4g}"),
    Column("delta", "Delta", "number", fmt=lambda v: f"{v:.4g}"),
    Column("rate_per_s", "Rate /s", "number", fmt=lambda v: f"{v:.4g}"),
]


def server_metrics_view(report: schema.BenchmarkReport | dict) -> tuple[str, list[dict[str, Any]]]:
    """(summary line, one row per series then one per derived ratio) of the report's
    ``server_metrics`` (engine.bench.server_metrics): what the server itself saw during the run."""
    raw = _bench(report).model_dump().get("server_metrics")
    if not isinstance(raw, dict):
        return "no server metrics in this report (the run predates them, or the server was not scraped)", []
    if not raw.get("available"):
        return f"the server exposed no usable /metrics: {raw.get('reason') or 'no reason recorded'}", []
    rows = [{"name": name, **{k: s.get(k) for k in ("kind", "min", "mean", "max", "last", "delta", "rate_per_s")}}
            for name, s in sorted((raw.get("series") or {}).items()) if isinstance(s, dict)]
    rows += [{"name": name, "kind": "ratio", "mean": value} for name, value in sorted((raw.get("derived") or {}).items())]
    span = raw.get("span_s")
    line = (f"{raw.get('url', '/metrics')}: {raw.get('scrapes', '?')} scrapes every {raw.get('interval_s', '?')} s"
            + (f" over {span:.1f} s" if isinstance(span, (int, float)) else "")
            + (f", {raw['scrape_errors']} failed" if raw.get("scrape_errors") else "")
            + (f" · {raw['note']}" if raw.get("note") else "") + (f" ({raw['file']})" if raw.get("file") else ""))
    return line, rows


BENCH_COLUMNS = [
    Column("metric", "Metric", min_width=16),
    Column("value", "Run 1", "number", fmt=lambda v: f"{v:.4g}"),
    Column("mean", "Mean", "number", fmt=lambda v: f"{v:.4g}"),
    Column("ci_low", "95% CI low", "number", fmt=lambda v: f"{v:.4g}"),
    Column("ci_high", "high", "number", fmt=lambda v: f"{v:.4g}"),
    Column("n", "n", "number", fmt=lambda v: f"{v:d}"),
    Column("unit", "Unit"),
    Column("note", "Note", max_width=70),
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
        detail = read_json(path)
    except (OSError, ValueError):
        return {}
    ok = [e is None or e == "" for e in detail.get("errors", [])] or [True] * len(detail.get("ttfts", []))
    ttft = [t * 1e3 for t, good in zip(detail.get("ttfts", []), ok) if good and t]
    e2el = [t * 1e3 for t, good in zip(detail.get("latencies", []), ok) if good and t]
    itl = [x * 1e3 for gaps, good in zip(detail.get("itls", []), ok) if good for x in (gaps or [])]
    # TPOT per request: the time after the first token over the tokens after it (as vLLM's).
    tpot = [(lat - first) * 1e3 / (n - 1) for lat, first, n, good in
            zip(detail.get("latencies", []), detail.get("ttfts", []), detail.get("output_lens", []), ok)
            if good and lat and first is not None and isinstance(n, int) and n > 1]
    return {"TTFT": ttft, "TPOT": tpot, "ITL": itl, "E2EL": e2el}


def load_facts(report: schema.BenchmarkReport | dict) -> str:
    """How the load was made, when the report says (reports before these keys say nothing)."""
    facts = []
    dataset = _section(report, "dataset", schema.BenchDataset) or schema.BenchDataset()
    if dataset.prompts == "text":
        facts.append(f"text prompts ({dataset.tokenizer})")
    elif dataset.prompts:
        facts.append("token-id prompts")
    if dataset.prefix_len:
        facts.append(f"shared prefix {dataset.prefix_len}")
    client = (_section(report, "environment", schema.BenchEnvironment) or schema.BenchEnvironment()).http_client
    if client:
        facts.append(f"{client} HTTP client")
    return "".join(f" · {f}" for f in facts)


def sweep_points(report: schema.BenchmarkReport | dict) -> list[tuple[float, float, str]]:
    """(output tok/s, median TTFT ms... TPOT, label) per sweep point."""
    out = []
    for point in _bench(report).sweep or []:
        if not point.runs:
            continue
        first = point.runs[0]
        label = ", ".join(f"{k}={v}" for k, v in point.point.items()
                          if k in ("concurrency", "input_len", "output_len", "request_rate") and v is not None)
        out.append((first.output_throughput or 0.0, first.median_tpot_ms or 0.0, label))
    return out


def _delta_side(report: schema.BenchmarkReport) -> dict[str, Any]:
    """What ``compare_reports`` takes: the repeats (mean, values) or else the single result."""
    if report.repeats:
        return {k: v.model_dump(exclude_unset=True) for k, v in report.repeats.items()}
    return report.result.model_dump(exclude_unset=True) if report.result else {}


def comparison_rows(comparison: ReportComparison) -> list[dict[str, Any]]:
    """The delta grid's rows of an engine comparison (none when it was refused)."""
    return [{"metric": metric_label(key), "a": d.get("a"), "b": d.get("b"), "delta": d.get("delta"),
             "rel": d.get("rel_delta"), "noise": d.get("noise"), "verdict": d.get("verdict") or "-"}
            for key, d in (comparison.deltas or {}).items()]


def delta_rows(a: schema.BenchmarkReport | dict, b: schema.BenchmarkReport | dict) -> list[dict[str, Any]]:
    """B - A per metric, from the repeats (mean, with noise) or else the single result, as
    ``magpie benchmark --compare-reports`` computes it."""
    from engine.jobs.query import compare_reports
    side_a = _delta_side(_bench(a))
    side_b = _delta_side(_bench(b))
    rows = []
    for key, d in compare_reports(side_a, side_b).items():
        rows.append({"metric": metric_label(key), "a": d.get("a"), "b": d.get("b"), "delta": d.get("delta"),
                     "rel": d.get("rel_delta"), "noise": d.get("noise"), "verdict": d.get("verdict") or "-"})
    return rows


def bench_state(r: schema.BenchmarkReport) -> str:
    """The run's state; a run that did not complete says how far it got, in requests that were
    served (the ones a cancel stopped in flight are not)."""
    if r.state == "completed":
        return r.state
    result = r.result or schema.BenchResult()
    prompts = r.envs.get("NUM_PROMPTS")
    if result.completed is None:
        return f"{r.state.upper()} before any request completed"
    text = f"{r.state.upper()} at {result.completed}" + (f" of {prompts}" if prompts else "") + " requests completed"
    cut = (r.repeats_cut or [None])[0]
    if isinstance(cut, dict) and cut.get("repeat"):  # the numbers are the repeats before it
        text += (f"; repeat {cut['repeat']} of {cut.get('repeats')} cut short after {cut.get('completed')} "
                 "completed, left out")
    return text


def comparability_warning(a: schema.BenchmarkReport, b: schema.BenchmarkReport) -> str | None:
    """What the deltas of a pair compared anyway leave out: with a sweep against a single point,
    only the first point of each is compared. (Whether two runs measure the same workload at all is
    the engine's decision: ``engine.bench.report_compare``.)"""
    points_a, points_b = len(a.sweep or []) or 1, len(b.sweep or []) or 1
    if points_a != points_b:
        return (f"A has {points_a} sweep point(s), B has {points_b}: only the first point of each is compared")
    return None


CAPACITY_METRICS = ("ttft", "tpot", "e2el")


def capacity_section(report: schema.BenchmarkReport | dict) -> dict[str, Any] | None:
    """The report's ``capacity`` section (``magpie benchmark --find-capacity``), or None."""
    raw = _bench(report).model_dump().get("capacity")
    return raw if isinstance(raw, dict) and isinstance(raw.get("levels"), list) else None


def _level_name(over: str, level: Any) -> str:
    return f"c={level:g}" if over == "concurrency" else f"{level:g}/s"


def capacity_rows(section: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per level tried, in level order: the outcome in words (``pass`` / ``FAIL``; the
    knee and the lowest failing level above it say so), goodput with its interval, throughput and
    the p99 latencies."""
    over = section.get("over", "concurrency")
    knee = section.get("knee")
    upper = (list(section.get("knee_interval") or []) + [None, None])[1]  # the lowest failing level above it
    rows = []
    for lv in sorted((lv for lv in section["levels"] if isinstance(lv, dict)), key=lambda lv: lv.get("level") or 0):
        level = lv.get("level")
        result = "pass" if lv.get("passed") else "FAIL"
        if level is not None and level == knee:
            result += " · knee"
        elif level is not None and level == upper:
            result += " · above knee"
        ci = lv.get("goodput_share_ci95")
        latency = lv.get("latency_ms") or {}
        rows.append({
            "level": level, "name": _level_name(over, level) if level is not None else "?", "result": result,
            "passed": bool(lv.get("passed")),
            "goodput_pct": (lv.get("goodput_share") or 0.0) * 100,
            # A share lies in [0, 1]: the t-interval is clipped there, as the throughputs are at 0.
            "goodput_ci": (max(0.0, ci[0]) * 100, min(1.0, ci[1]) * 100) if isinstance(ci, list) and len(ci) == 2
            and None not in ci else None,
            "repeats": lv.get("repeats"), "request_throughput": lv.get("request_throughput"),
            "output_throughput": lv.get("output_throughput"),
            **{f"p99_{m}_ms": (latency.get(m) or {}).get("p99") for m in CAPACITY_METRICS},
            "completed": lv.get("completed"), "failed": lv.get("failed"),
            "smoothed_pct": lv["smoothed_share"] * 100 if isinstance(lv.get("smoothed_share"), (int, float)) else None,
            "margin": lv.get("slo_margin"), "verdict": lv.get("verdict"),
        })
    return rows


def capacity_boundary(section: dict[str, Any]) -> str | None:
    """The boundary in one line: where the smoothed goodput crosses the target, its 95% interval,
    the binding SLO and smooth or cliff (``engine.bench.capacity``); None for a report written
    before the search reported them."""
    if "boundary_ci95" not in section:
        return None
    over = section.get("over", "concurrency")
    lo, hi = (list(section.get("boundary_ci95") or []) + [None, None])[:2]
    b = section.get("boundary")
    parts = [f"boundary {_level_name(over, b)}" if isinstance(b, (int, float)) else "no boundary crossed",
             "95% interval [" + (_level_name(over, lo) if lo is not None else "below the lowest tried") + ", "
             + (_level_name(over, hi) if hi is not None else "above the highest tried") + "]"]
    binding = section.get("binding_slo")
    if binding:
        parts.append("bound by failed requests" if binding == "errors" else f"binding SLO {binding.upper()}")
    parts.append(section.get("boundary_shape") or "smooth or cliff not known")
    if section.get("search"):
        parts.append(f"{section['search']} search, {section.get('probes', '?')} runs")
    return " · ".join(parts)


def capacity_columns(section: dict[str, Any]) -> list[Column]:
    """The level table's columns: with the smoothed share, the SLO margin and the verdict where
    the report carries them."""
    if not any(isinstance(lv, dict) and "smoothed_share" in lv for lv in section.get("levels") or []):
        return CAPACITY_COLUMNS
    extra = [Column("smoothed_pct", "Smoothed %", "number", fmt=lambda v: f"{v:.1f}"),
             Column("margin", "Margin", "number", fmt=lambda v: f"{v:.2f}"),
             Column("verdict", "Decided", max_width=10)]
    return CAPACITY_COLUMNS[:4] + extra + CAPACITY_COLUMNS[4:]


def ramp_windows(section: dict[str, Any]) -> list[dict[str, Any]]:
    """A ramp run's windows in time order (``engine.bench.ramp``): the levels, then the hold."""
    over = section.get("over", "concurrency")
    rows = []
    for w in section.get("windows") or []:
        if not isinstance(w, dict) or not isinstance(w.get("window_s"), list):
            continue
        p99 = w.get("p99_ms") or {}
        rows.append({"key": str(w.get("index")), "kind": w.get("kind"), "level": w.get("level"),
                     "name": _level_name(over, w["level"]) if isinstance(w.get("level"), (int, float)) else "?",
                     "start": w["window_s"][0], "end": w["window_s"][1], "requests": w.get("requests"),
                     "goodput_pct": (w.get("goodput_share") or 0.0) * 100, "passed": bool(w.get("passed")),
                     "result": "pass" if w.get("passed") else "FAIL", "request_throughput": w.get("request_throughput"),
                     "p99_ttft_ms": p99.get("ttft")})
    return rows


def ramp_hold(section: dict[str, Any]) -> str:
    """The hold at the knee in one line: its windows, goodput and throughput with their intervals."""
    hold = section.get("hold")
    over = section.get("over", "concurrency")
    if not isinstance(hold, dict):
        return "no hold (ramp_hold 0, or nothing passed)"
    share = hold.get("summary") or {}
    ci = share.get("goodput_share_ci95")
    out = (hold.get("interval") or {}).get("output_throughput") or {}
    text = (f"hold at {_level_name(over, hold.get('level') or 0)}: {hold.get('windows')} windows, "
            f"{hold.get('seconds', 0):g} s, {hold.get('passed_windows')} passed · goodput "
            f"{(share.get('goodput_share') or 0.0):.1%}")
    if isinstance(ci, list) and None not in ci:
        text += f" [{max(0.0, ci[0]):.1%}, {min(1.0, ci[1]):.1%}]"
    if out.get("mean") is not None:
        text += f" · out tok/s {out['mean']:.1f}"
        if isinstance(out.get("ci95"), list):
            text += f" [{out['ci95'][0]:.1f}, {out['ci95'][1]:.1f}]"
    return text


def ramp_timeline(section: dict[str, Any]) -> list[tuple[float, float, str]]:
    """(window start s, level, label) per window: the ramp's path to the knee and the hold."""
    return [(r["start"], r["level"], ("hold" if r["kind"] == "hold" else r["name"]) + ("✓" if r["passed"] else "✗"))
            for r in ramp_windows(section) if isinstance(r["level"], (int, float))]


def capacity_title(section: dict[str, Any]) -> str:
    slos = ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in (section.get("slos_ms") or {}).items())
    target = section.get("goodput_target")
    return (f"SLO capacity over {section.get('over', 'concurrency')}: "
            + (f"{target:.0%} of requests" if isinstance(target, (int, float)) else "the target share")
            + f" meeting {slos or 'no SLO recorded'} · {section.get('verdict') or 'no verdict recorded'}")


def capacity_metrics(section: dict[str, Any]) -> list[str]:
    """The latencies the plot can show: the SLO's own first, then the others the levels carry."""
    slos = [m for m in (section.get("slos_ms") or {}) if m in CAPACITY_METRICS]
    return slos + [m for m in CAPACITY_METRICS if m not in slos]


def capacity_plot_args(section: dict[str, Any], metric: str) -> dict[str, Any]:
    """What ``CapacityPlot`` draws for ``metric``: p99 latency against request throughput per level."""
    from magpie_tui.widgets.plots import CapacityPoint
    rows = capacity_rows(section)
    points = [CapacityPoint(r["request_throughput"], r[f"p99_{metric}_ms"], r["name"], r["passed"])
              for r in rows if isinstance(r["request_throughput"], (int, float))
              and isinstance(r[f"p99_{metric}_ms"], (int, float))]
    knee_row = next((r for r in rows if r["result"].endswith("knee") and r["passed"]), None)
    slo = (section.get("slos_ms") or {}).get(metric)
    others = [m for m in capacity_metrics(section) if m != metric]
    return {"points": points, "slo": slo, "slo_label": f"SLO {metric.upper()} {slo:g} ms" if slo else "SLO",
            "knee": knee_row["request_throughput"] if knee_row else None,
            "knee_label": f"knee {knee_row['name']}" if knee_row else "knee",
            "title": f"{metric.upper()} p99 vs requests/s per level tried" + (
                f" · m: {', '.join(o.upper() for o in others)}" if others else ""),
            "x_label": "requests/s", "y_label": f"{metric.upper()} p99 (ms)",
            "reason": None if points else "no level carries a throughput and this latency"}


CAPACITY_COLUMNS = [
    Column("name", "Level", max_width=12),
    Column("result", "Result", max_width=18),
    Column("goodput_pct", "Goodput %", "number", fmt=lambda v: f"{v:.1f}"),
    Column("goodput_ci", "95% CI %", fmt=lambda v: f"[{v[0]:.0f}, {v[1]:.0f}]", max_width=12),
    Column("request_throughput", "Req/s", "number", fmt=lambda v: f"{v:.4g}"),
    Column("output_throughput", "Out tok/s", "number", fmt=lambda v: f"{v:.4g}"),
    Column("p99_ttft_ms", "TTFT p99", "number", fmt=lambda v: f"{v:.4g}"),
    Column("p99_tpot_ms", "TPOT p99", "number", fmt=lambda v: f"{v:.4g}"),
    Column("p99_e2el_ms", "E2EL p99", "number", fmt=lambda v: f"{v:.4g}"),
    Column("repeats", "n", "number", fmt=lambda v: f"{v:d}"),
    Column("completed", "Done", "number", fmt=lambda v: f"{v:d}"),
    Column("failed", "Failed", "number", fmt=lambda v: f"{v:d}"),
]

RAMP_COLUMNS = [
    Column("start", "From s", "number", fmt=lambda v: f"{v:.1f}"),
    Column("end", "To s", "number", fmt=lambda v: f"{v:.1f}"),
    Column("kind", "Window", max_width=6),
    Column("name", "Level", max_width=12),
    Column("result", "Result", max_width=6),
    Column("goodput_pct", "Goodput %", "number", fmt=lambda v: f"{v:.1f}"),
    Column("requests", "Requests", "number", fmt=lambda v: f"{v:d}"),
    Column("request_throughput", "Req/s", "number", fmt=lambda v: f"{v:.4g}"),
    Column("p99_ttft_ms", "TTFT p99", "number", fmt=lambda v: f"{v:.4g}"),
]


class BenchmarkReportScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="report.back"),
        Binding("b", "compare_with", "Compare with…", id="report.compare_with"),
        Binding("t", "roofline", "Roofline", id="report.roofline"),
        Binding("m", "capacity_metric", "Next latency", show=False, id="report.capacity_metric"),
        Binding("a", "allow_different", "Compare anyway", show=False, id="report.allow_different"),
    ] + tab_bindings("report")
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("report.back", "report.compare_with", "report.roofline", "report.next_tab", "grid.sort")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "capacity_metric":  # only a capacity search has levels to plot
            return self.capacity is not None
        if action == "allow_different":  # only a comparison refused for different workloads
            return self.comparison is not None and self.comparison.refused
        return True

    def action_next_tab(self) -> None:
        cycle_tab(self, 1)

    def action_previous_tab(self) -> None:
        cycle_tab(self, -1)

    def __init__(self, info: RunInfo, report: schema.BenchmarkReport | dict,
                 latencies: dict[str, list[float]] | None = None) -> None:
        super().__init__()
        self.info = info
        self.report = _bench(report)
        # Read with the report, off the event loop (``read_report_files``); None: read on mount.
        self.latencies = latencies
        self.capacity = capacity_section(self.report)
        self.capacity_metric = capacity_metrics(self.capacity)[0] if self.capacity else None
        # The run compared against (B) and the engine's comparison (engine.bench.report_compare).
        self.other: RunInfo | None = None
        self.comparison: ReportComparison | None = None

    def compose(self):
        from magpie_tui.widgets.plots import CapacityPlot, Histogram, LinePlot
        r = self.report
        yield Header()
        envs = " ".join(f"{k}={v}" for k, v in r.envs.items())
        yield Static(f"{_shown(r.framework, '?')} {_shown(r.model, '')} · {bench_state(r)} · "
                     f"{_shown(r.run_kind, '')} · {envs}{load_facts(r)}", classes="report-title")
        with TabbedContent(id="bench-tabs", classes="-fill"):
            with TabPane("Metrics", id="tab-metrics"):
                for err in r.errors[:5]:
                    yield Static(err, classes="incorrect-why")
                counts = {row["n"] for row in benchmark_rows(r) if row["n"]}
                if counts and max(counts) < MIN_REPEATS_FOR_CI:
                    yield Static(f"95% intervals: {CI_NOT_MEANINGFUL} (this run has {max(counts)}); the mean is "
                                 "shown, no interval", id="interval-note", classes="report-note")
                yield DataGrid(BENCH_COLUMNS, id="bench-grid")
            with TabPane("Distributions", id="tab-dist"):
                latencies = self.latencies or {}
                with Horizontal(classes="plots"):
                    for name in HISTOGRAMS:
                        yield Histogram(latencies.get(name, []), title=f"{name} (ms)", id=f"hist-{name.lower()}",
                                        classes="histogram")
            with TabPane("Server", id="tab-server"):
                summary, _rows = server_metrics_view(r)
                yield Static(summary, id="server-summary", classes="report-note")
                yield DataGrid(SERVER_COLUMNS, id="server-grid")
            if self.capacity is not None:
                # The capacity levels are the report's sweep points, in the order tried: this tab
                # shows them in level order instead of a Sweep tab that would join them as tried.
                with TabPane("Capacity", id="tab-capacity"):
                    yield Static(capacity_title(self.capacity), id="capacity-title", classes="report-note")
                    boundary = capacity_boundary(self.capacity)
                    if boundary is not None:
                        yield Static(boundary, id="capacity-boundary", classes="report-note", markup=False)
                    yield CapacityPlot(**capacity_plot_args(self.capacity, self.capacity_metric or "ttft"),
                                       id="capacity-plot")
                    yield DataGrid(capacity_columns(self.capacity),
                                   row_class=lambda row: "correct" if row["passed"] else "incorrect",
                                   id="capacity-grid", classes="report-table")
                if ramp_windows(self.capacity):  # a ramp run: its windows in time order, then the hold
                    with TabPane("Ramp", id="tab-ramp"):
                        yield Static(ramp_hold(self.capacity), id="ramp-hold", classes="report-note", markup=False)
                        yield LinePlot(ramp_timeline(self.capacity), series_name="windows",
                                       title=f"ramp: {self.capacity.get('over', 'level')} per window, then the hold",
                                       x_label="s into the run", y_label=self.capacity.get("over", "level"),
                                       id="ramp-timeline")
                        yield DataGrid(RAMP_COLUMNS, row_class=lambda row: "correct" if row["passed"] else "incorrect",
                                       id="ramp-windows", classes="report-table")
            elif r.sweep:
                with TabPane("Sweep", id="tab-sweep"):
                    yield LinePlot(sweep_points(r), title="median TPOT vs output throughput",
                                   x_label="output tok/s", y_label="median TPOT (ms)", id="sweep-plot")
            with TabPane("Compare", id="tab-compare"):
                yield Static("b: pick another benchmark run to compare against (B - A, with noise)",
                             id="compare-note", classes="report-note")
                yield DataGrid(DELTA_COLUMNS, row_class=lambda row: {"better": "correct", "worse": "incorrect"}.get(
                    row["verdict"], "tie" if row["noise"] == "inside" else None), id="delta-grid")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

    def on_mount(self) -> None:
        self.sub_title = self.info.name
        rows = benchmark_rows(self.report)
        self.query_one("#bench-grid", DataGrid).set_rows(rows, keys=[row["key"] for row in rows])
        _summary, server_rows = server_metrics_view(self.report)
        self.query_one("#server-grid", DataGrid).set_rows(server_rows, keys=[row["name"] for row in server_rows])
        if self.capacity is not None:
            levels = capacity_rows(self.capacity)
            self.query_one("#capacity-grid", DataGrid).set_rows(levels, keys=[row["name"] for row in levels])
            windows = ramp_windows(self.capacity)
            if windows:
                self.query_one("#ramp-windows", DataGrid).set_rows(windows, keys=[row["key"] for row in windows])
        self.query_one("#bench-grid", DataGrid).focus()
        if self.latencies is None:
            self._read_latencies()

    @work(thread=True, exclusive=True, group="report-files", exit_on_error=False)
    def _read_latencies(self) -> None:
        latencies = request_latencies(self.info.path)
        self.app.call_from_thread(self._show_latencies, latencies)

    def _show_latencies(self, latencies: dict[str, list[float]]) -> None:
        from magpie_tui.widgets.plots import Histogram
        self.latencies = latencies
        for name in HISTOGRAMS:
            self.query_one(f"#hist-{name.lower()}", Histogram).set_values(latencies.get(name, []))

    def action_capacity_metric(self) -> None:
        """``m``: the next latency (TTFT, TPOT, E2EL) on the capacity plot, the SLO's first."""
        from magpie_tui.widgets.plots import CapacityPlot
        if self.capacity is None:
            return
        metrics = capacity_metrics(self.capacity)
        self.capacity_metric = metrics[(metrics.index(self.capacity_metric) + 1) % len(metrics)]
        args = capacity_plot_args(self.capacity, self.capacity_metric)
        plot = self.query_one("#capacity-plot", CapacityPlot)
        plot.title, plot.x_label, plot.y_label = args.pop("title"), args.pop("x_label"), args.pop("y_label")
        plot.set_levels(args.pop("points"), **args)
        self.query_one(TabbedContent).active = "tab-capacity"

    def compare_with(self, other: RunInfo, allow_different_workloads: bool = False) -> None:
        """Side by side: this run is A, ``other`` is B (its report is read in a thread worker). Runs that
        measured different workloads are refused, as ``magpie benchmark --compare-reports`` refuses them,
        unless ``allow_different_workloads`` (the ``a`` key)."""
        self._read_other(other, allow_different_workloads)

    @work(thread=True, exclusive=True, group="report-files", exit_on_error=False)
    def _read_other(self, other: RunInfo, allow_different_workloads: bool = False) -> None:
        from engine.jobs.query import compare_runs
        path = other.report_path
        if path is None:
            self.app.call_from_thread(self.notify, f"{other.name} has no report", severity="error")
            return
        try:
            b = load_report(path)
            comparison = compare_runs(self.info.report_path or self.info.path, path,
                                      allow_different_workloads=allow_different_workloads)
        except (ValueError, MagpieError) as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.app.call_from_thread(self._show_compare, other, b, comparison)

    def _show_compare(self, other: RunInfo, b: schema.BenchmarkReport,
                      comparison: ReportComparison | None = None) -> None:
        from rich.text import Text
        from engine.jobs.query import compare_runs
        if comparison is None:  # a caller with the report only: the engine decides from the run folders
            comparison = compare_runs(self.info.report_path or self.info.path, other.report_path or other.path)
        self.other, self.comparison = other, comparison
        grid = self.query_one("#delta-grid", DataGrid)
        note = f"A = {self.info.name}   B = {other.name}"
        lines = comparison.lines()
        if comparison.refused:
            # No deltas and no verdicts: the numbers would read as a valid comparison.
            grid.set_rows([], keys=[])
            grid.display = False
            note += "\nNOT COMPARED: " + "\n".join(lines[:-1])
            note += "\na: compare anyway (as --allow-different-workloads; the differences stay listed above)"
        else:
            rows = comparison_rows(comparison)
            grid.set_rows(rows, keys=[row["metric"] for row in rows])
            grid.display = True
            note += "   noise: inside = within run-to-run spread"
            if comparison.differences or comparison.notes:
                note += "\n" + "\n".join(lines)
            warning = comparability_warning(self.report, b)
            if warning:
                note += f"\nwarning: {warning}"
        self.query_one("#compare-note", Static).update(Text(note))
        self.query_one(TabbedContent).active = "tab-compare"
        self.refresh_bindings()

    def action_allow_different(self) -> None:
        """``a``: compare a refused pair anyway, every difference listed above the deltas."""
        if self.other is not None and self.comparison is not None and self.comparison.refused:
            self.compare_with(self.other, allow_different_workloads=True)

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
            self.notify(f"this run has no tracelens/ analysis: {_no_roofline_reason(self.info.report_path)}",
                        severity="warning")
            return
        self.app.push_screen(RooflineScreen(self.info))


def _no_roofline_reason(report_path: Path | None) -> str:
    """Why a run has no roofline, from its own report (engine.runs.state.no_roofline_reason)."""
    report: dict[str, Any] = {}
    if report_path is not None:
        try:
            report = read_json(report_path)
        except (OSError, ValueError):
            report = {}
    return no_roofline_reason(report)


@dataclass
class ReportFiles:
    """What a report screen needs from disk, read before the screen is built."""

    path: Path | None = None
    report: Report | None = None
    latencies: dict[str, list[float]] = field(default_factory=dict)
    problem: str | None = None
    severity: str = "warning"


def read_report_files(info: RunInfo) -> ReportFiles:
    """Blocking (stats and JSON reads): call it from a thread worker, as ``WorkbenchApp.open_report``
    does, so that a large report never stalls the event loop."""
    path = info.report_path
    if path is None:
        return ReportFiles(problem=f"{info.name}: no report yet ({info.state})")
    try:
        report = load_report(path)
    except ValueError as exc:
        return ReportFiles(path=path, problem=str(exc), severity="error")
    latencies = request_latencies(info.path) if path.name == schema.BENCHMARK_REPORT else {}
    return ReportFiles(path=path, report=report, latencies=latencies)


def open_report_screen(app, info: RunInfo, files: ReportFiles | None = None) -> Screen | None:
    """The screen for a run's report, or None (with a notice saying why). Pass ``files`` read
    off the event loop (``read_report_files``); without them they are read here, blocking."""
    files = files if files is not None else read_report_files(info)
    path, report = files.path, files.report
    if path is None or report is None:
        app.notify(files.problem or f"{info.name}: no report", severity=files.severity)
        return None
    if isinstance(report, (schema.CompareReport, schema.AnalyzeReport)):
        return CompareReportScreen(info, report)
    if isinstance(report, schema.BenchmarkReport):
        return BenchmarkReportScreen(info, report, files.latencies)
    if isinstance(report, schema.TraceAnalysisReport):
        from magpie_tui.screens.roofline import RooflineScreen
        return RooflineScreen(info)
    if isinstance(report, schema.TraceDiffReport):
        from magpie_tui.screens.trace_diff import TraceDiffScreen
        return TraceDiffScreen(info, report)
    return None

