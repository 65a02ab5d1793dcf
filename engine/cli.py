"""The Magpie-compatible command line: ``magpie [global options] analyze|compare ...``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from rich.console import Console

from engine import __version__
from engine.config.yamlfile import ConfigError, load_located_yaml

EXIT_CONFIG = 2

# Framework-config keys this tool reads; the rest of Magpie's framework config is reported, not dropped.
_FRAMEWORK_KEYS_USED = {
    "scheduler": {"max_workers", "environment"},
    "performance": {"backend", "timeout_seconds", "ncu"},
}


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
    p.add_argument("--no-perf", action="store_true", help="check correctness only; no timing")
    p.add_argument("-o", "--output-dir", default="./results", help="results root (default ./results)")
    p.add_argument("--repeats", type=int, help="timed repeats per kernel (default: enough for a stable median)")
    p.add_argument("--warmup", type=int, help="untimed warm-up calls (harness; default 10)")
    p.add_argument("--timeout", type=float, help="seconds allowed for each command (compile, testcase, profiler)")
    p.add_argument("--seed", type=int, help="first random seed for harness inputs (default 0)")
    p.add_argument("--rtol", type=float, help="relative tolerance of the output comparison (default by dtype)")
    p.add_argument("--atol", type=float, help="absolute tolerance of the output comparison (default by dtype)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="magpie", description="Kernel evaluation and inference benchmarking: correctness first, honest timing.")
    parser.add_argument("--version", action="version", version=f"magpie-workbench {__version__}")
    parser.add_argument("-c", "--config", help="framework config YAML (defaults for scheduler and performance)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--gpu-info", action="store_true", help="print the detected GPU, compiler and profiler, then exit")
    parser.add_argument("-e", "--environment", choices=["local", "container", "ray"],
                        help="where kernels run (only 'local' is supported by this version)")
    parser.add_argument("-w", "--workers", type=int, help="parallel compile/testcase workers (timing stays serial)")
    parser.add_argument("--docker-image", help="image for --environment container")
    sub = parser.add_subparsers(dest="command")
    _add_kernel_flags(sub.add_parser("analyze", help="evaluate kernels: compile, correctness, performance"), False)
    _add_kernel_flags(sub.add_parser("compare", help="rank kernels against a baseline, correctness-gated"), True)
    return parser


def _load_framework_config(path: Optional[str], warnings: list[str]) -> dict:
    if not path:
        return {}
    doc = load_located_yaml(path)
    data = doc.data or {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}:1: expected a mapping at the top level"])
    for section, value in data.items():
        used = _FRAMEWORK_KEYS_USED.get(section)
        keys = set(value) if isinstance(value, dict) else set()
        unused = sorted(keys - used) if used is not None else sorted(keys) or [section]
        if unused:
            warnings.append(f"{doc.where((section,))}: framework config {section}: "
                            f"{', '.join(unused)} not used by this tool")
    return data


def _install_signal_handlers(cancel) -> None:
    def handler(signum, _frame):
        if cancel.cancelled and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now (the report is still written)
        cancel.cancel("cancelled by SIGINT" if signum == signal.SIGINT else f"cancelled by signal {signum}")
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, handler)


def _run_kernels(args: argparse.Namespace, console: Console) -> int:
    from engine.kernels.plan import CliOptions, build_plan
    from engine.kernels.runner import run_plan
    from engine.runs.process import CancelToken

    fw_warnings: list[str] = []
    framework = _load_framework_config(args.config, fw_warnings)
    opts = CliOptions(
        kernels=args.kernels, kernel_config=args.kernel_config, testcase=args.testcase, type=args.type,
        compile_cmd=args.compile_cmd, baseline=getattr(args, "baseline", None), no_perf=args.no_perf,
        repeats=args.repeats, warmup=args.warmup, timeout=args.timeout, seed=args.seed, rtol=args.rtol,
        atol=args.atol, workers=args.workers, environment=args.environment)
    if args.repeats is not None and args.repeats < 3:
        raise ConfigError([f"--repeats {args.repeats}: at least 3 repeats are needed for a median and its spread"])
    plan = build_plan(args.command, opts, framework)
    if args.docker_image and plan.environment != "container":
        fw_warnings.append(f"--docker-image {args.docker_image} is not used: kernels run in the "
                           f"{plan.environment!r} environment")
    plan.warnings = fw_warnings + plan.warnings
    # Plain prints: messages that name files and lines must not be re-wrapped.
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for o in plan.overrides:
        print(f"override: {o['field']}: {o['yaml']!r} -> {o['cli']!r} ({o['flag']})", file=sys.stderr)
    cancel = CancelToken()
    _install_signal_handlers(cancel)

    def show(renderables: list[Any]) -> None:
        for r in renderables:
            console.print(r, highlight=False)

    def progress(event: dict) -> None:
        # One line per stage transition on stderr, so a long run is never silent.
        if event["event"] == "run_started":
            print(f"magpie {plan.mode}: {len(plan.kernels)} kernel(s), workspace {event['workspace']}",
                  file=sys.stderr, flush=True)
        elif event["event"] == "stage" and (args.verbose or event["state"] != "running"):
            extra = f" ({event['backend']})" if event.get("backend") else ""
            print(f"  [{event['kernel']}] {event['stage']}{extra}: {event['state']}", file=sys.stderr, flush=True)

    code, _ws, _report = run_plan(plan, args.output_dir, cancel, show=show, on_event=progress)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    # A pipe or a file gets a wide table instead of rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.gpu_info:
        from engine.hw.detect import detect_gpu, format_gpu_info
        console.print(format_gpu_info(detect_gpu()), highlight=False, markup=False)
        return 0
    if not args.command:
        parser.print_help()
        return EXIT_CONFIG
    try:
        return _run_kernels(args, console)
    except ConfigError as exc:
        print("error: configuration problem" + ("s" if len(exc.problems) > 1 else "") + "; nothing was run",
              file=sys.stderr)
        for p in exc.problems:
            print(f"  {p}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
