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
from engine.runs.schema import BENCHMARK_REPORT

if TYPE_CHECKING:
    from engine.loop.run import Loop
    from engine.loop.schema import LoopStep

# The end-to-end metrics the verdict reports, and the one whose gain decides success.
E2E_METRICS = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms",
               "median_e2el_ms", "p99_e2el_ms", "failed")
PRIMARY_METRIC = "output_throughput"
PROFILED_AFTER = "profiled_after_config.yaml"


def step_rebenchmark(loop: "Loop", step: "LoopStep") -> dict:
    from engine.loop.run import _metrics, profiled_twin
    integ = loop.loop.step("integrate").result
    config = loop.root / integ["config"]
    repeats = loop.loop.step("baseline").result.get("repeats")
    flags = {"repeats": repeats} if repeats else {}
    prepared, outcome = loop.benchmark(step, str(config), flags, folder="rebenchmark")
    report_path = outcome.workspace / BENCHMARK_REPORT
    result: dict[str, Any] = {"report": str(report_path.relative_to(loop.root)), "repeats": prepared.config.client.repeats,
                              "metrics": _metrics(outcome.report)}
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
    return result


def integ_op(loop: "Loop") -> str:
    return next(iter(loop.loop.step("integrate").result["kernels"]))


def _op_row(table: dict, op: str) -> Optional[dict]:
    for r in table.get("stages", {}).get("all", {}).get("rows", []):
        if r.get("registry_op") == op and r.get("replaceable"):
            return {"share_pct": r["share_pct"], "avg_us": r["avg_us"], "calls": r["calls"], "time_us": r["time_us"]}
    return None


def step_verdict(loop: "Loop", step: "LoopStep") -> dict:
    """The loop's conclusion (also when the candidates step found no winner), kept in ``verdict/``."""
    result = _verdict(loop)
    loop.set_run_dir(step, write_verdict(loop.root, result))
    for line in verdict_lines(result):
        loop.log(line)
    return result


def _verdict(loop: "Loop") -> dict:
    cand = loop.loop.step("candidates")
    if not cand.result.get("winner"):
        why = cand.result.get("stopped") or "the candidates step found no winner"
        return {"success": False, "message": f"stopped at the candidates step: {why}", "kernel": None,
                "end_to_end": [], "checks": [{"name": "faster candidate", "ok": False, "detail": why}],
                "top_bottleneck_after": None}
    base = _report(loop, loop.loop.step("baseline").result["report"])
    new = _report(loop, loop.loop.step("rebenchmark").result["report"])
    rows = end_to_end(base, new)
    checks = _checks(loop, base, new, rows)
    primary = next((r for r in rows if r["metric"] == PRIMARY_METRIC), None)
    success = all(c["ok"] for c in checks)
    regression = primary is not None and primary["verdict"] == "worse"
    kernel = {"op": cand.result["op"], "winner": cand.result["winner"], "speedup": cand.result.get("speedup"),
              "ci95": cand.result.get("ci95")}
    after = loop.loop.step("rebenchmark").result
    top = after.get("top_after")
    if success:
        message = (f"kernels.{kernel['op']} = {kernel['winner']}: {_fmt_x(kernel)} on the kernel, "
                   f"{primary['delta_pct']:+.1f}% output throughput end to end, outside the run-to-run noise")
    elif regression:
        message = (f"REGRESSION: output throughput {primary['delta_pct']:+.1f}% end to end (outside the noise) "
                   f"although the kernel is {_fmt_x(kernel)}")
    else:
        failed = [c["name"] for c in checks if not c["ok"]]
        message = f"not proven: {', '.join(failed)} (kernel {_fmt_x(kernel)})"
    return {"success": success, "regression": regression, "message": message, "kernel": kernel, "end_to_end": rows,
            "checks": checks, "kernel_after": after.get("kernel_after"),
            "top_bottleneck_after": f"{top['name']} {top['share_pct']:.1f}%" if top else None,
            "top_changed": bool(top and top.get("registry_op") != kernel["op"])}


def _fmt_x(kernel: dict) -> str:
    ci = kernel.get("ci95") or [None, None]
    if kernel.get("speedup") is None:
        return "speedup unknown"
    if ci[0] is None:
        return f"{kernel['speedup']:.3f}x"
    return f"{kernel['speedup']:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"


def _report(loop: "Loop", rel: str) -> dict:
    return json.loads((loop.root / rel).read_text(encoding="utf-8"))


def end_to_end(base: dict, new: dict) -> list[dict]:
    """Each E2E metric's change with its Welch interval and noise verdict (engine.bench.metrics)."""
    from engine.bench.metrics import compare_reports
    a = base.get("repeats") or base.get("result") or {}
    b = new.get("repeats") or new.get("result") or {}
    deltas = compare_reports(a, b)
    rows = []
    for k in E2E_METRICS:
        d = deltas.get(k)
        if d is None:
            continue
        verdict = {"tie": "within noise"}.get(d["verdict"] or "", d["verdict"])
        rows.append({"metric": k, "baseline_mean": d["a"], "baseline_ci95": (a.get(k) or {}).get("ci95")
                     if isinstance(a.get(k), dict) else None, "new_mean": d["b"],
                     "new_ci95": (b.get(k) or {}).get("ci95") if isinstance(b.get(k), dict) else None,
                     "delta": d["delta"], "delta_pct": 100.0 * d["rel_delta"] if d["rel_delta"] is not None else None,
                     "delta_ci95": d["delta_ci95"], "noise": d["noise"], "verdict": verdict})
    return rows


def _checks(loop: "Loop", base: dict, new: dict, rows: list[dict]) -> list[dict]:
    from engine.loop.kernel_steps import environment_differences, workload_differences
    cand = loop.loop.step("candidates").result
    harness = loop.loop.step("harness").result
    op = cand["op"]
    clean_cfg = loop.run_config(loop.loop.step("baseline").run_dir)
    new_cfg = loop.run_config(loop.loop.step("rebenchmark").run_dir)
    allowed = [c["field"] for c in loop.loop.step("integrate").result["changed"]]
    diffs = workload_differences(clean_cfg, new_cfg, allowed)
    diffs += environment_differences(base, new)
    conf = (harness.get("row") or {}).get("confidence")
    by = {r["metric"]: r for r in rows}
    failed_base, failed_new = (by.get("failed") or {}).get("baseline_mean"), (by.get("failed") or {}).get("new_mean")
    primary = by.get(PRIMARY_METRIC)
    return [
        {"name": "correctness proven", "ok": True,
         "detail": f"{cand['winner']} passed the compare's correctness gate at every recorded call shape"},
        {"name": "workload identical", "ok": not diffs,
         "detail": f"only {', '.join(allowed)} differ{'s' if len(allowed) == 1 else ''}" if not diffs else
         "; ".join(f"{d['field']}: {d.get('clean')!r} -> {d.get('profiled', d.get('new'))!r}" for d in diffs)},
        {"name": "mapping confident", "ok": conf == "high",
         "detail": f"trace rows mapped to kernels.{op} by {(harness.get('row') or {}).get('method')} ({conf})"},
        {"name": "no more failed requests", "ok": (failed_new or 0) <= (failed_base or 0),
         "detail": f"failed {failed_base} -> {failed_new}"},
        {"name": "end-to-end gain outside the noise", "ok": bool(primary and primary["verdict"] == "better"),
         "detail": (f"{PRIMARY_METRIC} {primary['delta_pct']:+.2f}%, 95% CI of the delta "
                    f"{_fmt_ci(primary['delta_ci95'])}: {primary['verdict']}") if primary else
         f"no {PRIMARY_METRIC} in both reports"},
    ]


def _fmt_ci(ci: Optional[list]) -> str:
    return f"[{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci else "unknown (one run per side)"


def verdict_lines(result: dict) -> list[str]:
    """The verdict as the command line prints it."""
    lines = [("SUCCESS: " if result.get("success") else "") + str(result.get("message"))]
    for r in result.get("end_to_end", []):
        pct = f"{r['delta_pct']:+.2f}%" if r.get("delta_pct") is not None else "-"
        lines.append(f"  {r['metric']:<20} {r['baseline_mean']:>12.4g} -> {r['new_mean']:<12.4g} {pct:>9}  "
                     f"{r['verdict'] or '-'}")
    for c in result.get("checks", []):
        lines.append(f"  [{'ok' if c['ok'] else 'NO'}] {c['name']}: {c['detail']}")
    if result.get("top_bottleneck_after"):
        lines.append(f"  top of the profile now: {result['top_bottleneck_after']}")
    return lines


def write_verdict(root: Path, result: dict) -> str:
    """``verdict/verdict.json`` and ``verdict/summary.txt``; the folder, relative to the loop."""
    folder = root / "verdict"
    folder.mkdir(exist_ok=True)
    (folder / "verdict.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (folder / "summary.txt").write_text("\n".join(verdict_lines(result)) + "\n", encoding="utf-8")
    return "verdict"
