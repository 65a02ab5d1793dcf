"""Steps 7-8 of the loop: the clean benchmark again with the winner (and a short profiled run of
it), then the verdict: the kernel-level speedup with its interval, the end-to-end deltas with
their noise verdicts, and the checks that must all hold before the loop calls it a success.

Success needs every check (the walkthrough's rule): correctness proven (the winner won a
correctness-gated compare), the workload identical (only what the integrate step changed differs:
``server.kernels.<op>``, or the vLLM plugin's ``server_env`` entries), the
mapping from trace to op confident (the call-site annotation), no more failed requests, and the
end-to-end gain outside the run-to-run noise. A regression beyond the noise is reported as one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml

from engine.config.yamlfile import load_yaml_file
from engine.loop.bottlenecks import analyze_trace
from engine.loop.results import (
    BenchmarkStepResult,
    CandidatesResult,
    EndToEndRow,
    HarnessResult,
    IntegrateResult,
    InterleavedRound,
    KernelGain,
    ProfiledResult,
    RebenchmarkResult,
    VerdictCheck,
    VerdictResult,
)
from engine.runs.schema import BENCHMARK_REPORT

if TYPE_CHECKING:
    from engine.loop.context import LoopContext as Loop
    from engine.loop.schema import LoopStep

# The end-to-end metrics the verdict reports, and the one whose gain decides success.
E2E_METRICS = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms",
               "median_e2el_ms", "p99_e2el_ms", "failed")
PRIMARY_METRIC = "output_throughput"
PROFILED_AFTER = "profiled_after_config.yaml"
MIN_ROUNDS = 3  # interleaved re-benchmark rounds: the fewest that give the paired delta an interval


def step_rebenchmark(loop: "Loop", step: "LoopStep") -> RebenchmarkResult:
    """The clean config and the integrated one benchmarked in turn, one run each a round, in ABBA
    order (as many rounds as the baseline had repeats, at least 3): the verdict compares the
    pairs, so a machine that drifts over the step moves both sides of each pair alike. Then a
    short profiled run of the winner."""
    from engine.bench.metrics import aggregate_repeats
    from engine.loop.context import _metrics, profiled_twin
    integ = loop.result_of("integrate", IntegrateResult)
    if not integ.config:
        raise _error("the integrate step recorded no integrated config", hint="resume from the integrate step")
    config = loop.root / integ.config
    rounds = max(MIN_ROUNDS, loop.result_of("baseline", BenchmarkStepResult).repeats or 0)
    clean = str(loop.loop.config)
    done: list[InterleavedRound] = []
    winner_results: list[dict] = []
    for i in range(rounds):
        order = ("baseline", "winner") if i % 4 in (0, 3) else ("winner", "baseline")
        paths: dict[str, str] = {}
        for side in order:
            _, outcome = loop.benchmark(step, clean if side == "baseline" else str(config), {"repeats": 1},
                                        folder=f"rebenchmark/round_{i + 1}_{side}", record=i == 0 and side == "winner")
            paths[f"{side}_run"] = str(outcome.workspace.relative_to(loop.root))
            paths[f"{side}_report"] = str((outcome.workspace / BENCHMARK_REPORT).relative_to(loop.root))
            if side == "winner":
                winner_results.append(outcome.report.get("result") or {})
        done.append(InterleavedRound(index=i + 1, order=list(order), **paths))
        loop.log(f"magpie optimize: re-benchmark round {i + 1}/{rounds} ({' then '.join(order)}) done")
    result: dict[str, Any] = {"report": done[0].winner_report, "repeats": rounds,
                              "metrics": _metrics({"repeats": aggregate_repeats(winner_results)})}
    # A short profiled run with the winner: the op's new time and share, and what is on top now.
    raw = load_yaml_file(config)
    twin = loop.root / "integrate" / PROFILED_AFTER
    twin.write_text("# The profiled twin of the integrated config, derived by magpie optimize.\n"
                    + yaml.safe_dump(profiled_twin(raw), sort_keys=False), encoding="utf-8")
    _, prof = loop.benchmark(step, str(twin), {}, folder="rebenchmark_profiled", record=False)
    traces = sorted((prof.workspace / "torch_trace").glob("*.pt.trace.json*"))
    result["profiled_run"] = str(prof.workspace.relative_to(loop.root))
    if traces:
        table = analyze_trace(traces[0])
        (prof.workspace / "bottlenecks.json").write_text(json.dumps(table, indent=1), encoding="utf-8")
        result["kernel_after"] = _op_row(table, integ_op(loop))
        rows = table.get("stages", {}).get("all", {}).get("rows", [])
        result["top_after"] = {"name": rows[0]["name"], "registry_op": rows[0]["registry_op"],
                               "share_pct": rows[0]["share_pct"]} if rows else None
    else:
        result["kernel_after"] = None
        result["profiled_note"] = f"the profiled run wrote no trace into {prof.workspace / 'torch_trace'}"
    return RebenchmarkResult(**result, rounds=done)


def integ_op(loop: "Loop") -> str:
    kernels = loop.result_of("integrate", IntegrateResult).kernels
    if not kernels:
        raise _error("the integrate step recorded no kernel", hint="resume from the integrate step")
    return next(iter(kernels))


def _error(message: str, hint: str) -> Exception:
    from engine.loop.context import LoopError
    return LoopError(message, hint=hint)


def _op_row(table: dict, op: str) -> Optional[dict]:
    for r in table.get("stages", {}).get("all", {}).get("rows", []):
        if r.get("registry_op") == op and r.get("replaceable"):
            return {"share_pct": r["share_pct"], "avg_us": r["avg_us"], "calls": r["calls"], "time_us": r["time_us"]}
    return None


def step_verdict(loop: "Loop", step: "LoopStep") -> VerdictResult:
    """The loop's conclusion (also when the candidates step found no winner), kept in ``verdict/``."""
    result = _verdict(loop)
    loop.set_run_dir(step, write_verdict(loop.root, result))
    for line in verdict_lines(result):
        loop.log(line)
    return result


def _verdict(loop: "Loop") -> VerdictResult:
    cand = loop.result_of("candidates", CandidatesResult)
    if not cand.winner:
        why = cand.stopped or "the candidates step found no winner"
        return VerdictResult(success=False, message=f"stopped at the candidates step: {why}", kernel=None,
                             end_to_end=[], checks=[VerdictCheck(name="faster candidate", ok=False, detail=why)],
                             top_bottleneck_after=None)
    after = loop.result_of("rebenchmark", RebenchmarkResult)
    first = _report(loop, loop.result_of("baseline", BenchmarkStepResult).report)
    drift = None
    if after.rounds:  # the pairs of the interleaved rounds; the first baseline stays the reference
        pairs = [(_report(loop, r.baseline_report), _report(loop, r.winner_report)) for r in after.rounds]
        rows = end_to_end_paired([a.get("result") or {} for a, _ in pairs], [b.get("result") or {} for _, b in pairs])
        drift = baseline_drift(first, [a.get("result") or {} for a, _ in pairs])
        base, new = pairs[0]
    else:  # a loop.json of an earlier version: the winner's repeats against the first baseline
        base, new = first, _report(loop, after.report)
        rows = end_to_end(base, new)
    primary = next((r for r in rows if r.metric == PRIMARY_METRIC), None)
    kernel = KernelGain(op=cand.op, winner=cand.winner, speedup=cand.speedup, ci95=cand.ci95)
    harness = loop.result_of("harness", HarnessResult)
    share = harness.row.share_pct if harness.row is not None else None
    bound = gain_bound_pct(share, kernel.ci95[1] if kernel.ci95 else kernel.speedup)
    plausible = _plausibility(primary, bound, share, kernel)
    trace_diff, engaged = _trace_evidence(loop, cand)
    checks = _checks(loop, base, new, rows) + [plausible, VerdictCheck(name="winner engaged", ok=engaged.ok,
                                                                       detail=engaged.detail)]
    success = all(c.ok for c in checks)
    regression = primary is not None and primary.verdict == "worse"
    top = after.top_after
    if not engaged.ok:
        message = f"NOT ENGAGED: {engaged.detail}"
    elif success:
        message = (f"kernels.{kernel.op} = {kernel.winner}: {_fmt_x(kernel)} on the kernel, "
                   f"{_pct(primary, '+.1f')} output throughput end to end, outside the run-to-run noise")
    elif not plausible.ok:
        message = (f"NOT ATTRIBUTABLE to the kernel: output throughput {_pct(primary, '+.1f')} end to end, "
                   f"beyond the {bound:+.1f}% that kernels.{kernel.op} ({share:.1f}% of the profiled time, "
                   f"{_fmt_x(kernel)}) can give; the baseline likely drifted (the machine's load or the server's "
                   "state changed between the two benchmarks): run the loop again on a quiet machine")
    elif regression:
        message = (f"REGRESSION: output throughput {_pct(primary, '+.1f')} end to end (outside the noise) "
                   f"although the kernel is {_fmt_x(kernel)}")
    else:
        failed = [str(c.name) for c in checks if not c.ok]
        message = f"not proven: {', '.join(failed)} (kernel {_fmt_x(kernel)})"
    return VerdictResult(success=success, regression=regression, message=message, kernel=kernel, end_to_end=rows,
                         checks=checks, kernel_after=after.kernel_after,
                         top_bottleneck_after=f"{top.name} {top.share_pct or 0.0:.1f}%" if top else None,
                         top_changed=bool(top and top.registry_op != kernel.op), gain_bound_pct=bound,
                         **({"drift": drift} if drift is not None else {}), trace_diff=trace_diff, engagement=engaged)


def _trace_evidence(loop: "Loop", cand: CandidatesResult) -> tuple[Any, Any]:
    """The profiled baseline's trace against the profiled run's with the winner
    (``engine.loop.engagement``; the whole diff into ``verdict/trace_diff/``), and whether the
    winner ran there."""
    from engine.loop.engagement import DIFF_FOLDER, trace_evidence
    profiled = loop.result_of("profiled", ProfiledResult)
    before = loop.root / profiled.traces[0] if profiled.traces else None
    run = loop.result_of("rebenchmark", RebenchmarkResult).profiled_run
    after_traces = sorted((loop.root / run / "torch_trace").glob("*.pt.trace.json*")) if run else []
    return trace_evidence(loop.root, before, after_traces[0] if after_traces else None, str(cand.op), str(cand.winner),
                          str(cand.winner_path or cand.winner), loop.root / "verdict" / DIFF_FOLDER)


def gain_bound_pct(share_pct: Optional[float], speedup: Optional[float]) -> Optional[float]:
    """Amdahl's law: the end-to-end throughput gain (%) when work that took ``share_pct``% of the
    time runs ``speedup`` times faster and nothing else changes. An upper bound when ``share_pct`` is
    the op's share of the profiled time and ``speedup`` the upper end of its interval."""
    if share_pct is None or speedup is None or speedup <= 0 or not 0 <= share_pct <= 100:
        return None
    saved = share_pct / 100.0 * (1.0 - 1.0 / speedup)
    return 100.0 * (1.0 / (1.0 - saved) - 1.0)


def _plausibility(primary: Optional[EndToEndRow], bound: Optional[float], share: Optional[float],
                  kernel: KernelGain) -> VerdictCheck:
    """Whether the kernel can explain the measured gain: a gain whose interval lies wholly above the
    Amdahl bound came from somewhere else (a baseline that drifted, a change of load)."""
    name = "gain the kernel can explain"
    if bound is None:
        return VerdictCheck(name=name, ok=True, detail="no bound: the op's share of the profiled time or the kernel's "
                            "speedup is unknown")
    low = None
    if primary is not None and primary.delta_ci95 and primary.baseline_mean:
        low = 100.0 * primary.delta_ci95[0] / primary.baseline_mean
    elif primary is not None:
        low = primary.delta_pct
    detail = (f"Amdahl: {share:.1f}% of the profiled time at {_fmt_x(kernel)} allows at most {bound:+.2f}%; "
              f"measured {_pct(primary, '+.2f')}" + (f", its interval from {low:+.2f}%" if low is not None else ""))
    return VerdictCheck(name=name, ok=low is None or low <= bound, detail=detail)


def _pct(row: Optional[EndToEndRow], spec: str) -> str:
    return f"{row.delta_pct:{spec}}%" if row is not None and row.delta_pct is not None else "-"


def _fmt_x(kernel: KernelGain) -> str:
    if kernel.speedup is None:
        return "speedup unknown"
    if kernel.ci95 is None:
        return f"{kernel.speedup:.3f}x"
    return f"{kernel.speedup:.3f}x [{kernel.ci95[0]:.3f}, {kernel.ci95[1]:.3f}]"


def _report(loop: "Loop", rel: Optional[str]) -> dict:
    if not rel:
        raise _error("a benchmark step recorded no report", hint="resume the loop to run it again")
    return json.loads((loop.root / rel).read_text(encoding="utf-8"))


def end_to_end(base: dict, new: dict) -> list[EndToEndRow]:
    """Each E2E metric's change with its Welch interval and noise verdict (engine.bench.metrics)."""
    from engine.bench.metrics import compare_reports
    a = base.get("repeats") or base.get("result") or {}
    b = new.get("repeats") or new.get("result") or {}
    return _rows(compare_reports(a, b), a, b)


def _rows(deltas: dict, a: dict, b: dict) -> list[EndToEndRow]:
    """The E2E metrics' rows of a comparison (``deltas``), each side's interval from ``a`` / ``b``."""
    def ci(side: dict, k: str) -> Any:
        return side[k].get("ci95") if isinstance(side.get(k), dict) else None
    rows = []
    for k in E2E_METRICS:
        d = deltas.get(k)
        if d is None:
            continue
        rows.append(EndToEndRow(
            metric=k, baseline_mean=d["a"], baseline_ci95=ci(a, k), new_mean=d["b"], new_ci95=ci(b, k),
            delta=d["delta"], delta_pct=100.0 * d["rel_delta"] if d["rel_delta"] is not None else None,
            delta_ci95=d["delta_ci95"], noise=d["noise"],
            verdict={"tie": "within noise"}.get(d["verdict"] or "", d["verdict"])))
    return rows


def end_to_end_paired(base_runs: list[dict], new_runs: list[dict]) -> list[EndToEndRow]:
    """Each E2E metric's change over interleaved rounds: the mean of the per-round differences and
    its paired t-interval (engine.bench.metrics.compare_paired)."""
    from engine.bench.metrics import aggregate_repeats, compare_paired
    return _rows(compare_paired(base_runs, new_runs), aggregate_repeats(base_runs), aggregate_repeats(new_runs))


def baseline_drift(first: dict, rounds: list[dict]) -> Optional[EndToEndRow]:
    """The loop's first baseline (the reference the user started from) against the baseline runs of
    the interleaved rounds, on the primary metric: how far the machine moved meanwhile."""
    from engine.bench.metrics import aggregate_repeats, compare_reports
    later = aggregate_repeats(rounds) if rounds else {}
    d = compare_reports(first.get("repeats") or first.get("result") or {}, later).get(PRIMARY_METRIC)
    if d is None:
        return None
    return EndToEndRow(metric=PRIMARY_METRIC, baseline_mean=d["a"], new_mean=d["b"], delta=d["delta"],
                       delta_pct=100.0 * d["rel_delta"] if d["rel_delta"] is not None else None,
                       delta_ci95=d["delta_ci95"], noise=d["noise"], verdict=d["verdict"])


def _checks(loop: "Loop", base: dict, new: dict, rows: list[EndToEndRow]) -> list[VerdictCheck]:
    from engine.loop.kernel_steps import environment_differences, workload_differences
    cand = loop.result_of("candidates", CandidatesResult)
    harness = loop.result_of("harness", HarnessResult)
    op = cand.op
    rounds = loop.result_of("rebenchmark", RebenchmarkResult).rounds
    if rounds:  # the pair that was compared: the same repeats, the same moment
        clean_cfg, new_cfg = loop.run_config(rounds[0].baseline_run), loop.run_config(rounds[0].winner_run)
    else:
        clean_cfg = loop.run_config(loop.loop.step("baseline").run_dir)
        new_cfg = loop.run_config(loop.loop.step("rebenchmark").run_dir)
    allowed = [str(c.field) for c in loop.result_of("integrate", IntegrateResult).changed]
    diffs = workload_differences(clean_cfg, new_cfg, allowed)
    diffs += environment_differences(base, new)
    conf = harness.row.confidence if harness.row is not None else None
    method = harness.row.method if harness.row is not None else None
    by = {r.metric: r for r in rows}
    failed = by.get("failed")
    failed_base, failed_new = (failed.baseline_mean, failed.new_mean) if failed is not None else (None, None)
    primary = by.get(PRIMARY_METRIC)
    return [
        VerdictCheck(name="correctness proven", ok=True,
                     detail=f"{cand.winner} passed the compare's correctness gate at every recorded call shape"),
        VerdictCheck(name="workload identical", ok=not diffs,
                     detail=f"only {', '.join(allowed)} differ{'s' if len(allowed) == 1 else ''}" if not diffs else
                     "; ".join(f"{d['field']}: {d.get('clean')!r} -> {d.get('profiled', d.get('new'))!r}"
                               for d in diffs)),
        VerdictCheck(name="mapping confident", ok=conf == "high",
                     detail=f"trace rows mapped to kernels.{op} by {method} ({conf})"),
        VerdictCheck(name="no more failed requests", ok=(failed_new or 0) <= (failed_base or 0),
                     detail=f"failed {failed_base} -> {failed_new}"),
        VerdictCheck(name="end-to-end gain outside the noise", ok=bool(primary and primary.verdict == "better"),
                     detail=(f"{PRIMARY_METRIC} {_pct(primary, '+.2f')}, 95% CI of the delta "
                             f"{_fmt_ci(primary.delta_ci95)}: {primary.verdict}") if primary else
                     f"no {PRIMARY_METRIC} in both reports"),
    ]


def _fmt_ci(ci: Optional[list]) -> str:
    return f"[{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci else "unknown (one run per side)"


def _g(value: Optional[float], spec: str) -> str:
    return format(value, spec) if value is not None else format("-", spec.split(".")[0])


def _n(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def verdict_lines(result: VerdictResult) -> list[str]:
    """The verdict as the command line prints it."""
    lines = [("SUCCESS: " if result.success else "") + str(result.message)]
    for r in result.end_to_end:
        pct = _pct(r, "+.2f")
        lines.append(f"  {r.metric!s:<20} {_g(r.baseline_mean, '>12.4g')} -> {_g(r.new_mean, '<12.4g')} {pct:>9}  "
                     f"{r.verdict or '-'}")
    for c in result.checks:
        lines.append(f"  [{'ok' if c.ok else 'NO'}] {c.name}: {c.detail}")
    d = result.drift
    if d is not None:
        lines.append(f"  baseline drift since the first baseline: {d.metric} {_g(d.baseline_mean, '.4g')} -> "
                     f"{_g(d.new_mean, '.4g')} ({_pct(d, '+.2f')}, {d.noise or 'unknown'} the noise); the verdict "
                     "compares the interleaved rounds")
    if result.top_bottleneck_after:
        lines.append(f"  top of the profile now: {result.top_bottleneck_after}")
    td = result.trace_diff
    if td is not None and td.error:
        lines.append(f"  trace diff: {td.error}")
    elif td is not None:
        unit = "GPU time" if td.basis == "gpu" else "CPU time"
        lines.append(f"  trace diff, profiled before -> after ({unit}, {td.report}): total "
                     f"{_n(td.total_before_us, '.1f')} -> {_n(td.total_after_us, '.1f')} us "
                     f"({_n(td.total_delta_pct, '+.1f')}%); kernels only before {_n(td.kernels_only_before, 'd')}, "
                     f"only after {_n(td.kernels_only_after, 'd')}")
        for m in td.top_kernels[:5]:
            where = f" [{' > '.join(m.stack)}]" if m.stack else ""
            lines.append(f"    {_n(m.delta_us, '+.1f')} us  {_n(m.before_us, '.1f')} -> {_n(m.after_us, '.1f')} us, "
                         f"calls {_n(m.calls_before, 'd')} -> {_n(m.calls_after, 'd')}  {m.name}{where}")
    return lines


def write_verdict(root: Path, result: VerdictResult) -> str:
    """``verdict/verdict.json`` and ``verdict/summary.txt``; the folder, relative to the loop."""
    folder = root / "verdict"
    folder.mkdir(exist_ok=True)
    (folder / "verdict.json").write_text(json.dumps(result.written(), indent=1) + "\n", encoding="utf-8")
    (folder / "summary.txt").write_text("\n".join(verdict_lines(result)) + "\n", encoding="utf-8")
    return "verdict"
