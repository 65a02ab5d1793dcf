"""The Magpie-compatible command line: ``magpie [global options] analyze|compare ...``."""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from rich.console import Console

from engine.errors import MagpieError, format_error
from engine.jobs.query import ConfigError, MissingExtra, __version__

EXIT_CONFIG = 2


def _add_kernel_flags(p: argparse.ArgumentParser, compare: bool) -> None:
    p.add_argument("kernels", nargs="*", help="kernel source files (or use -k)")
    p.add_argument("-k", "--kernel-config", help="kernel YAML (kernel: / kernels:)")
    p.add_argument("-t", "--testcase", help="testcase command line (run by the shell: quotes, pipes, && work)")
    p.add_argument("--type", choices=["hip", "cuda", "pytorch", "triton", "torch", "py"],
                   help="kernel type for positional files (default hip); overrides the YAML when given with -k")
    p.add_argument("--compile-cmd", help="compile command line (run by the shell)")
    if compare:
        p.add_argument("--baseline", help="baseline kernel: index (0-based) or id; default: the entry marked "
                                          "'baseline: true', else the first")
        p.add_argument("--tie-margin", type=float, help="practical-equivalence margin: 'faster' only when the whole "
                                                        "speedup interval lies above 1 + margin (default 0.02 with a "
                                                        "GPU timer, 0.10 with the CPU timer)")
    p.add_argument("--only", help="comma-separated kernel ids to run from -k (the baseline is always kept)")
    p.add_argument("--no-perf", action="store_true", help="check correctness only; no timing")
    p.add_argument("-o", "--output-dir", default="./results", help="results root (default ./results)")
    p.add_argument("--repeats", type=int, help="timed repeats per kernel (default: enough for a stable median)")
    p.add_argument("--warmup", type=int, help="untimed warm-up calls (harness; default 10)")
    p.add_argument("--timeout", type=float, help="seconds allowed for each command (compile, testcase, profiler)")
    p.add_argument("--seed", type=int, help="first random seed for harness inputs (default: hidden seeds drawn "
                                            "for each run and written to the report)")
    p.add_argument("--rtol", type=float, help="relative tolerance of the output comparison (default by dtype)")
    p.add_argument("--atol", type=float, help="absolute tolerance of the output comparison (default by dtype)")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything as for a run, print the plan (per kernel: working dir, files, commands, "
                        "env, correctness and timing), start nothing and create no run folder")


class _Parser(argparse.ArgumentParser):
    """argparse, plus the nearest flag for a misspelt one ("--concurency: did you mean --concurrency?")."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            known = _option_strings(self)
            for word in message.split(":", 1)[1].split():
                close = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.8) if word.startswith("--") else []
                if close:
                    message += f"; {word.split('=')[0]}: did you mean {close[0]}?"
        super().error(message)


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _option_strings(sub)
        out += [o for o in action.option_strings if o.startswith("--")]
    return sorted(set(out))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="magpie", description="Kernel evaluation and inference benchmarking: correctness first, honest timing.")
    parser.add_argument("--version", action="version", version=f"magpie-workbench {__version__}")
    parser.add_argument("-c", "--config", help="framework config YAML (defaults for scheduler and performance)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--gpu-info", action="store_true", help="print the detected GPU, compiler and profiler, then exit")
    parser.add_argument("-e", "--environment", choices=["local", "container", "ray"],
                        help="where kernels run: local (default), container (inside --docker-image) or ray "
                             "(stages and benchmark points as Ray tasks; see docs/scale-out.md)")
    parser.add_argument("--ray-address", help="Ray cluster for -e ray: auto, HOST:6379 or ray://HOST:10001 "
                                              "(default: $RAY_ADDRESS, else a Ray instance on this machine)")
    parser.add_argument("-w", "--workers", type=int, help="parallel compile/testcase workers (timing stays serial)")
    parser.add_argument("--docker-image", help="image for --environment container")
    sub = parser.add_subparsers(dest="command", description="also: 'magpie tui [DIR]' opens the workbench; "
                                                               "'magpie mcp' serves the tools to agents")
    _add_kernel_flags(sub.add_parser("analyze", help="evaluate kernels: compile, correctness, performance"), False)
    _add_kernel_flags(sub.add_parser("compare", help="rank kernels against a baseline, correctness-gated"), True)
    _add_benchmark_flags(sub.add_parser("benchmark", help="benchmark a serving framework (vllm, sglang, atom, builtin); "
                                                     "with --trace-dir, analyse torch-profiler traces"))
    _add_optimize_flags(sub.add_parser("optimize", help="the optimization loop: baseline, profiled run, bottlenecks, ..."))
    return parser


def _add_optimize_flags(p: argparse.ArgumentParser) -> None:
    from engine.jobs.query import STEP_NAMES
    p.add_argument("-b", "--benchmark-config", help="the clean benchmark YAML the loop measures and profiles")
    p.add_argument("-o", "--output-dir", default="./results", help="results root (default ./results)")
    p.add_argument("--resume", metavar="LOOP_DIR", help="continue a loop where it stopped (a killed step restarts)")
    p.add_argument("--until", metavar="STEP", help=f"stop after this step ({', '.join(STEP_NAMES)})")
    p.add_argument("--status", metavar="LOOP_DIR", help="print the chain of a loop and exit")
    p.add_argument("--kernel", metavar="OP", help="the registry op to optimise (rmsnorm, activation, rotary, attention; "
                                                  "default: the top replaceable row of the bottleneck table)")
    p.add_argument("--candidates", nargs="+", metavar="PATH", default=[],
                   help="candidate files or folders: modules defining a function named after the op (or kernel())")
    p.add_argument("--no-library", dest="library", action="store_false",
                   help="leave out the bundled library's candidates")
    p.add_argument("--dry-run", action="store_true",
                   help="check the loop's config as for a real run, print its plan and start nothing")


def _add_benchmark_flags(p: argparse.ArgumentParser) -> None:
    from engine.jobs.requests import add_cli_flags
    b = p.add_argument_group("serving benchmark")
    b.add_argument("framework", nargs="?", choices=["vllm", "sglang", "atom", "builtin"],
                   help="server to benchmark (or benchmark.framework in -b)")
    b.add_argument("-b", "--benchmark-config", help="benchmark YAML (Magpie's benchmark: format)")
    b.add_argument("--batch", metavar="FILE.yaml", help="a batch of benchmark points (a list of configs or a "
                                                         "sweep), each a run of its own, one batch report")
    # Every override of the YAML (-m, --concurrency, ..., --timeout), generated from the one model.
    add_cli_flags(b)
    b.add_argument("--dry-run", action="store_true",
                   help="check everything as for a real run, print the plan (server command and environment, image, "
                        "GPUs, load and length bounds, profiling, run folder) and start nothing")
    b.add_argument("--compare-reports", nargs=2, metavar=("A", "B"),
                   help="per-metric deltas B - A of two benchmark reports (files or workspaces), with noise; "
                        "refused when the runs differ in more than the server's kernels")
    b.add_argument("--allow-different-workloads", action="store_true",
                   help="with --compare-reports: compare runs whose workloads differ (a profiled side, other "
                        "load, model, framework, ...); every difference is printed above the verdict")
    g = p.add_argument_group("trace analysis (gap analysis, GPU idle, TraceLens-compatible reports)")
    g.add_argument("--trace-dir", help="a trace file, a folder of traces (ranks from names), or a benchmark workspace")
    g.add_argument("--trace-diff", nargs=2, metavar=("A", "B"),
                   help="compare two traces (files, folders of traces or benchmark workspaces), A the baseline: "
                        "per op and kernel by name and call site, time, calls, share and roofline, A/B/delta; "
                        "only-in-A and only-in-B; a new run folder with the JSON report and TraceLens-shaped CSVs")
    g.add_argument("--top-k", type=int, default=20, help="kernels kept in the gap-analysis tables (default 20)")
    g.add_argument("--start-pct", type=float, default=0.0, help="window start, %% of the trace span (default 0)")
    g.add_argument("--end-pct", type=float, default=100.0, help="window end, %% of the trace span (default 100)")
    g.add_argument("--min-duration-us", type=float, default=0.0, help="drop GPU events shorter than this")
    g.add_argument("--categories", nargs="*", help="event categories to count (substring; default kernel gpu)")
    g.add_argument("--ignore-categories", nargs="*",
                   help="categories to leave out, applied first (default gpu_user_annotation user_annotation)")
    g.add_argument("--no-rank-csv", action="store_true", help="skip the per-rank gap-analysis CSVs")
    g.add_argument("--timings", action="store_true",
                   help="print the analysis's wall-clock time by stage (load, tree, idle, split, reports, CSVs...); "
                        "the report keeps them as stage_times_s either way")
    g.add_argument("--find-kernel-sources", action="store_true", help="map kernel names to source files")
    g.add_argument("--kernel-source-repos", nargs="*", default=[],
                   help="local repositories to search (nothing is ever cloned)")
    g.add_argument("--gpu-arch", help="arch for the roofline: a name (H200, MI300X, ...) or a TraceLens-style "
                                      "JSON file; default: from the trace's deviceProperties")
    g.add_argument("--stages", default="all",
                   help="inference stages: all, or a comma list of prefilldecode, decode_only, prefill_only")
    g.add_argument("-o", "--output-dir", default=None,
                   help="results root for a new workspace (default: the benchmark workspace that holds the "
                        "trace, else ./results)")


def _print_prepared(prepared: Any) -> None:
    from engine.jobs.requests import notices
    # Plain prints: messages that name files and lines must not be re-wrapped.
    for line in notices(prepared):
        print(line, file=sys.stderr)


class _KernelProgress:
    """One line per stage transition on stderr, so a long run is never silent."""

    def __init__(self, mode: str, n_kernels: int, verbose: bool) -> None:
        self.mode, self.n_kernels, self.verbose = mode, n_kernels, verbose

    def __call__(self, event: dict) -> None:
        if event["event"] == "run_started":
            print(f"magpie {self.mode}: {self.n_kernels} kernel(s), workspace {event['workspace']}",
                  file=sys.stderr, flush=True)
        elif event["event"] == "stage":
            from engine.jobs.query import stage_line
            line = stage_line(event, verbose=self.verbose)
            if line is not None:
                print(line, file=sys.stderr, flush=True)


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class _RunProgress:
    """The run's state (engine.runs.state) as a progress line on stderr, the line the workbench's
    Runs list shows: when the phase or repeat changes, at most every ``every_s`` seconds between,
    and once at the end with the report's figures."""

    def __init__(self, mode: str, every_s: float = 10.0) -> None:
        from engine.jobs.query import RunInfo
        self.mode, self.every_s = mode, every_s
        self.info = RunInfo(path=Path("."))
        self._last, self._shown_at = "", 0.0

    def __call__(self, event: dict) -> None:
        try:
            self._show(event)
        except (ValueError, TypeError, OSError):  # a progress line never stops the run
            pass

    def _show(self, event: dict) -> None:
        from engine.jobs.query import status_text
        if not self.info.apply(dict(event)):
            return
        status = self.info.status
        step = (status.progress.phase, status.progress.repeat)
        now = time.monotonic()
        if event.get("event") == "run_finished":
            print(f"magpie {self.mode}: {status.state} · {status_text(status, detail=True)}", file=sys.stderr, flush=True)
        elif event.get("event") == "progress" and (step != self._last or now - self._shown_at >= self.every_s):
            self._last, self._shown_at = step, now
            print(f"  progress: {status_text(status)}", file=sys.stderr, flush=True)


def _run_kernels(args: argparse.Namespace, console: Console) -> int:
    from engine.jobs import KernelRequest, cancel_on_signals, run_request

    request = KernelRequest(
        mode=args.command, kernels=list(args.kernels), kernel_config=args.kernel_config,
        framework_config=args.config, testcase=args.testcase, type=args.type, compile_cmd=args.compile_cmd,
        baseline=getattr(args, "baseline", None), no_perf=args.no_perf, repeats=args.repeats, warmup=args.warmup,
        timeout=args.timeout, seed=args.seed, rtol=args.rtol, atol=args.atol, workers=args.workers,
        environment=args.environment, docker_image=args.docker_image, ray_address=args.ray_address,
        only=[i.strip() for i in args.only.split(",") if i.strip()] if args.only else None,
        tie_margin=getattr(args, "tie_margin", None), cwd=str(Path.cwd()))
    prepared = request.prepare()
    if args.dry_run:  # the plan, from the engine; nothing starts
        from engine.jobs.query import plan_lines
        for line in plan_lines(prepared):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        return 0
    _print_prepared(prepared)
    cancel = cancel_on_signals()
    outcome = run_request(request, args.output_dir, cancel=cancel, prepared=prepared,
                          sink=_KernelProgress(args.command, len(prepared.plan.kernels), args.verbose))
    for r in outcome.display:
        console.print(r, highlight=False)
    _where_next(outcome)
    return outcome.exit_code


def _where_next(outcome: Any) -> None:
    """After a run: where its report and logs are, and the command that opens it in the workbench."""
    report = Path(outcome.workspace) / outcome.report_name
    print(f"report: {report}" if report.is_file() else f"run folder: {outcome.workspace} (no report was written)",
          file=sys.stderr)
    print(f"logs: {Path(outcome.workspace) / 'logs'}; open the run in the workbench: "
          f"magpie-tui {Path(outcome.workspace).parent}", file=sys.stderr)


def _run_trace_analysis(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from engine.jobs import TraceRequest, cancel_on_signals, run_request

    request = TraceRequest(
        trace_dir=args.trace_dir, stages=args.stages, top_k=args.top_k, start_pct=args.start_pct,
        end_pct=args.end_pct, min_duration_us=args.min_duration_us, categories=args.categories,
        ignore_categories=args.ignore_categories, rank_csv=not args.no_rank_csv,
        find_kernel_sources=args.find_kernel_sources, kernel_source_repos=[str(r) for r in args.kernel_source_repos],
        gpu_arch=args.gpu_arch)
    prepared = request.prepare()
    opts = prepared.options
    cancel = cancel_on_signals()  # SIGTERM / Ctrl-C: a cancelled report, as in the other modes
    outcome = run_request(request, args.output_dir, prepared=prepared, log=_log, cancel=cancel)
    result = outcome.details
    if result is None:
        print(f"{'cancelled' if outcome.state == 'cancelled' else 'error'}: {outcome.report.get('error')}",
              file=sys.stderr)
        return outcome.exit_code
    table = Table(title=f"GPU kernel time, top {opts.top_k} ({opts.start_pct:g}-{opts.end_pct:g}% of the trace)")
    for col in ("Name", "Calls", "Self CUDA (us)", "Avg (us)", "% Total"):
        table.add_column(col, justify="left" if col == "Name" else "right", overflow="fold")
    for r in result.top_rows:
        table.add_row(r[0][:90], str(r[1]), f"{r[2]:.1f}", f"{r[3]:.2f}", f"{r[4]:.2f}")
    console.print(table)
    for rank, idle in result.idle.items():
        console.print(f"rank {rank}: GPU idle {idle['total_idle_us'] / 1e3:.3f} ms between busy periods, "
                      f"{idle['host_bound_idle_pct']:.1f}% of it waiting for a launch from the host", highlight=False)
    for line in result.report.get("summary_lines") or []:  # the self-checks and the idle gaps by cause
        console.print(line, highlight=False, markup=False, style="bold yellow" if line.startswith("WARNING") else None)
    tl = result.report.get("tracelens_analysis", {})
    for e in tl.get("errors", []) if isinstance(tl, dict) else []:
        console.print(f"tracelens: {e}", highlight=False, markup=False)
    if result.exit_code:
        print("error: no kernel events found in the trace window", file=sys.stderr)
    if args.timings:
        stages = result.report.get("stage_times_s") or {}
        console.print("time by stage: " + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items()), highlight=False)
    console.print(f"workspace: {outcome.workspace} ({result.report['elapsed_s']:.2f} s)", highlight=False)
    _where_next(outcome)
    return result.exit_code


def _run_trace_diff(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from engine.jobs import TraceDiffRequest, cancel_on_signals, run_request

    if args.trace_dir:
        raise ConfigError(["--trace-diff A B and --trace-dir: give one (--trace-diff analyses its own two traces)"])
    request = TraceDiffRequest(a=args.trace_diff[0], b=args.trace_diff[1], top_k=args.top_k, gpu_arch=args.gpu_arch)
    prepared = request.prepare()
    _print_prepared(prepared)
    outcome = run_request(request, args.output_dir or "./results", prepared=prepared, log=_log,
                          cancel=cancel_on_signals())
    report = outcome.report
    if outcome.state != "completed":
        print(f"{'cancelled' if outcome.state == 'cancelled' else 'error'}: {report.get('error')}", file=sys.stderr)
        _where_next(outcome)
        return outcome.exit_code
    t = report["totals"]
    unit = "GPU time" if report["basis"] == "gpu" else "CPU time (no GPU events in the traces)"
    console.print(f"A = {report['a']['path']}\nB = {report['b']['path']}", highlight=False, markup=False, soft_wrap=True)

    def num(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    tt = t["time_us"]
    console.print(f"total {unit}: {num(tt['a'], ',.1f')} us -> {num(tt['b'], ',.1f')} us "
                  f"({num(tt['delta'], '+,.1f')} us, {num(tt['pct'], '+.2f')}%)", highlight=False, markup=False)
    for what in ("ops", "kernels"):
        c = t[what]
        console.print(f"{what}: {c['both']} in both, {c['only_a']} only in A, {c['only_b']} only in B",
                      highlight=False, markup=False)
    roof = bool(report.get("roofline"))
    for what, label in (("ops", "op"), ("kernels", "kernel")):
        for key, title in (("movers", f"largest {label} movers (B - A, by time)"), ("only_a", f"{what} only in A"),
                           ("only_b", f"{what} only in B")):
            rows = report[what][key]
            if not rows:
                continue
            table = Table(title=title, title_justify="left")
            for col in ("name", "call site", "A us", "B us", "delta us", "delta %", "calls A->B", "share % A->B") + \
                    (("TFLOPS/s A->B", "% roofline A->B") if roof and what == "ops" else ()):
                table.add_column(col, justify="left" if col in ("name", "call site") else "right", overflow="fold")
            for r in rows:
                tm, calls, share = r.get("time_us", {}), r.get("calls", {}), r.get("share_pct", {})
                cells = [r["name"][:80], " > ".join(r["stack"])[-80:] or "-", num(tm.get("a"), ",.1f"),
                         num(tm.get("b"), ",.1f"), num(tm.get("delta"), "+,.1f"), num(tm.get("pct"), "+.1f"),
                         f"{num(calls.get('a'), 'd')} -> {num(calls.get('b'), 'd')}",
                         f"{num(share.get('a'), '.1f')} -> {num(share.get('b'), '.1f')}"]
                if roof and what == "ops":
                    tf, pr = r.get("tflops_s", {}), r.get("pct_roofline", {})
                    cells += [f"{num(tf.get('a'), '.2f')} -> {num(tf.get('b'), '.2f')}",
                              f"{num(pr.get('a'), '.1f')} -> {num(pr.get('b'), '.1f')}"]
                table.add_row(*cells)
            console.print(table)
    console.print(f"workspace: {outcome.workspace} ({report.get('elapsed_s', 0):.2f} s)", highlight=False)
    _where_next(outcome)
    return outcome.exit_code


_COMPARED = ("request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
             "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
             "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "failed")


def _compare_reports(paths: list[str], console: Console, allow_different_workloads: bool = False) -> int:
    from rich.table import Table

    from engine.jobs.query import ReportCompareError, compare_runs

    try:
        cmp = compare_runs(paths[0], paths[1], allow_different_workloads=allow_different_workloads)
    except ReportCompareError as exc:
        raise ConfigError([str(exc)]) from None
    lines = cmp.lines()
    if cmp.refused:
        print("\n".join([f"error: {lines[0]}", f"  A = {cmp.a.report_path}", f"  B = {cmp.b.report_path}",
                         *lines[1:]]), file=sys.stderr)
        return EXIT_CONFIG
    if cmp.differences or cmp.notes:
        print("\n".join(lines), flush=True)  # plain: field names and paths must not be re-wrapped
    deltas = cmp.deltas or {}
    table = Table(title=f"B - A   A={cmp.a.report_path}   B={cmp.b.report_path}"
                  + ("   (DIFFERENT WORKLOADS)" if cmp.workload else ""))
    for col in ("metric", "A", "B", "delta", "rel", "95% CI of delta", "noise", "verdict"):
        table.add_column(col, justify="left" if col in ("metric", "noise", "verdict") else "right")
    for key in _COMPARED:
        d = deltas.get(key)
        if d is None:
            continue
        ci = d["delta_ci95"]
        table.add_row(key, f"{d['a']:.4g}", f"{d['b']:.4g}", f"{d['delta']:+.4g}",
                      f"{d['rel_delta'] * 100:+.1f}%" if d["rel_delta"] is not None else "-",
                      f"{ci[0]:+.4g} .. {ci[1]:+.4g}" if ci else "-", d["noise"], d["verdict"] or "-")
    console.print(table)
    if any(d["noise"] == "unknown" for d in deltas.values()):
        console.print("noise unknown: a side without --repeats gives no run-to-run spread to compare against",
                      highlight=False)
    return 0


def _run_benchmark(args: argparse.Namespace, console: Console) -> int:
    from engine.jobs import BenchmarkRequest, cancel_on_signals, run_request
    from engine.jobs.requests import from_cli_args

    flags = from_cli_args(args)
    request = BenchmarkRequest(benchmark_config=args.benchmark_config, framework=args.framework, flags=flags,
                               batch=args.batch, environment=args.environment, ray_address=args.ray_address)
    prepared = request.prepare(plan_only=args.dry_run)
    if args.dry_run:
        from engine.jobs.query import plan_lines
        for line in plan_lines(prepared, args.output_dir or "./results"):
            print(line)
        print("dry run: nothing was started")
        return 0
    _print_prepared(prepared)
    cancel = cancel_on_signals()
    outcome = run_request(request, args.output_dir or "./results", cancel=cancel, prepared=prepared, log=_log,
                          sink=_RunProgress("benchmark"))
    for text in outcome.display:
        console.print(text, highlight=False, markup=False)
    _where_next(outcome)
    return outcome.exit_code


def _run_optimize(args: argparse.Namespace, console: Console) -> int:
    from engine.jobs import LoopRequest, cancel_on_signals, run_request
    from engine.jobs.query import loop_status
    from engine.jobs.requests import notices

    if args.status:
        console.print(loop_status(args.status), highlight=False, markup=False)
        return 0
    request = LoopRequest(benchmark_config=args.benchmark_config, resume=args.resume, until=args.until,
                          kernel=args.kernel, candidates=args.candidates, library=args.library)
    prepared = request.prepare()
    if args.dry_run:
        from engine.jobs.query import plan_lines
        for line in plan_lines(prepared, args.output_dir):
            print(line)
        print("dry run: nothing was started")
        return 0
    for line in notices(prepared):
        print(line, file=sys.stderr)
    cancel = cancel_on_signals()
    outcome = run_request(request, args.output_dir if not args.resume else None, cancel=cancel, prepared=prepared,
                          log=_log)
    console.print(loop_status(outcome.workspace), highlight=False, markup=False)
    return outcome.exit_code


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tui"]:
        # The workbench is a separate front end; the engine itself never imports textual.
        import importlib
        return importlib.import_module("magpie_tui.cli").main(argv[1:])
    if argv[:1] == ["mcp"]:
        # The MCP server for agents: a thin client of the job API, with its own options.
        import importlib
        return importlib.import_module("engine.mcp.cli").main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    # A pipe or a file gets a wide table instead of rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.gpu_info:
        from engine.jobs.query import gpu_info_text
        console.print(gpu_info_text(), highlight=False, markup=False)
        return 0
    if not args.command:
        parser.print_help()
        return EXIT_CONFIG
    try:
        if args.command == "benchmark":
            if args.compare_reports:
                return _compare_reports(args.compare_reports, console, args.allow_different_workloads)
            if args.allow_different_workloads:
                raise ConfigError(["--allow-different-workloads applies only to --compare-reports A B: add "
                                   "--compare-reports, or drop the flag"])
            if args.trace_diff:
                return _run_trace_diff(args, console)
            if args.trace_dir:
                return _run_trace_analysis(args, console)
            return _run_benchmark(args, console)
        if args.command == "optimize":
            return _run_optimize(args, console)
        return _run_kernels(args, console)
    except ConfigError as exc:
        print("error: configuration problem" + ("s" if len(exc.problems) > 1 else "") + "; nothing was run",
              file=sys.stderr)
        for p in exc.problems:
            print(f"  {p}", file=sys.stderr)
        return EXIT_CONFIG
    except MissingExtra as exc:  # this installation lacks a part: like a configuration error, nothing ran
        print(format_error(exc), file=sys.stderr)
        return EXIT_CONFIG
    except MagpieError as exc:
        print(format_error(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
