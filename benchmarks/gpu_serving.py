"""The serving benchmark's GPU numbers: ``magpie benchmark`` on the built-in ~1B server, clean then
profiled, each as a subprocess of our CLI, then one short table.

Usage (repository root, on the GPU machine; engine/ needs pydantic and msgspec, not textual):

    PYTHONPATH=. python3 benchmarks/gpu_serving.py RESULTS_DIR [--out DIR]
        [--clean-config YAML] [--profiled-config YAML] [--args "FLAGS"] [--clean-args "FLAGS"]
        [--profiled-args "FLAGS"] [--run-timeout S] [--budget S] [--no-reanalysis]

* clean:    ``python -m engine.cli benchmark -b examples/benchmarks/builtin_1b_gpu.yaml -o RESULTS_DIR/clean``
* profiled: ``python -m engine.cli benchmark -b examples/benchmarks/builtin_1b_gpu_profiled.yaml --warmup 0
  -o RESULTS_DIR/profiled``. ``--warmup 0`` by default (``--profiled-args`` replaces it): the
  profiler starts before the load generator's warm-up requests and stops by itself after
  ``num_steps`` (64) engine steps, so with the config's 4 warm-up requests (4 x 256 output tokens,
  about 256 steps at batch 4) the whole trace would be warm-up, none of the measured load at
  concurrency 32. Without warm-up the 64 steps are the first prefills and then decode at full batch.
  The script reports which steps the trace holds (its ``execute_*`` step annotations).
* ``--args`` go to both runs (e.g. ``--num-prompts 160 --repeats 2`` to shorten them).
* each run is bounded by ``--run-timeout`` (shrunk to fit ``--budget`` when given): at the limit it
  gets SIGINT (the CLI cancels the current repeat's outstanding requests and writes its report; that
  partial repeat is still counted in the report's repeat statistics, so the table warns), then
  SIGKILL after a grace period.
* after the profiled run its trace is analysed again with ``magpie benchmark --trace-dir ... --gpu-arch
  H200`` on its own, to time the analysis alone (the in-run figure includes stopping the server).

Printed last: throughput, request rate, TTFT/TPOT/ITL/E2EL medians and p99 (mean across repeats with
the 95% interval), the server's ready time, the profiled run's trace size and analysis time, and
the top 5 GPU kernels of the profiled trace. With ``--out`` (default ``$OUT`` when set) the reports
(not the torch traces) are copied there: ``{clean,profiled}_benchmark_report.json``,
``{clean,profiled}_summary.txt``, ``gpu_serving.json`` (the table's numbers), ``gpu_serving.log``
(both runs' output) and ``reports.tar.gz`` (tracelens/*roofline_simple.csv, gap_analysis/*.csv,
server.log and events.jsonl of both workspaces).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLEAN = "examples/benchmarks/builtin_1b_gpu.yaml"
PROFILED = "examples/benchmarks/builtin_1b_gpu_profiled.yaml"
_LOG_LINES: list[str] = []


def say(line: str) -> None:
    _LOG_LINES.append(line)
    print(line, flush=True)


def run_cli(label: str, argv: list[str], timeout: float, grace: float = 40.0) -> tuple[int, float]:
    """Run our CLI, stream its output with seconds since start; SIGINT at ``timeout``."""
    cmd = [sys.executable, "-m", "engine.cli", *argv]
    say(f"[{label}] $ {shlex.join(cmd)}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            say(f"[{label} {time.monotonic() - t0:7.1f}s] {line.rstrip()}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        say(f"[{label}] run timeout ({timeout:.0f} s): SIGINT (the report keeps the repeats done)")
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(grace)
        except subprocess.TimeoutExpired:
            say(f"[{label}] still running after {grace:.0f} s: SIGKILL")
            proc.kill()
            rc = proc.wait()
    reader.join(5)
    wall = time.monotonic() - t0
    say(f"[{label}] exit code {rc} after {wall:.1f} s")
    return rc, wall


def workspace(results: Path) -> Path | None:
    found = sorted(results.glob("benchmark_*"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def load_report(ws: Path | None) -> dict:
    if ws is None or not (ws / "benchmark_report.json").exists():
        return {}
    return json.loads((ws / "benchmark_report.json").read_text())


def events(ws: Path | None) -> list[dict]:
    if ws is None or not (ws / "events.jsonl").exists():
        return []
    out = []
    for line in (ws / "events.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def in_run_analysis_s(ws: Path | None) -> float | None:
    """From the server's stop to the end of the run: stopping the server + the trace analysis."""
    ev = events(ws)
    stop = [e["ts"] for e in ev if e.get("stage") == "server" and e.get("state") == "stopping"]
    end = [e["ts"] for e in ev if e.get("event") == "run_finished"]
    return round(end[-1] - stop[-1], 2) if stop and end else None


_STEP = re.compile(r"^execute_(\d+)_context_(\d+)\(.*_generation_(\d+)\(")


def trace_facts(ws: Path | None) -> dict:
    """Size of the profiled run's traces and what steps they hold (the ``execute_*`` annotations)."""
    if ws is None:
        return {}
    traces = sorted((ws / "torch_trace").glob("*.pt.trace.json*"))
    if not traces:
        return {"traces": 0}
    facts: dict[str, Any] = {"traces": len(traces), "gz_mb": round(sum(p.stat().st_size for p in traces) / 1e6, 2)}
    largest = max(traces, key=lambda p: p.stat().st_size)
    opener = gzip.open if largest.suffix == ".gz" else open
    t = time.monotonic()
    with opener(largest, "rb") as f:
        raw = f.read()
    facts["json_mb"] = round(len(raw) / 1e6, 1)
    doc = json.loads(raw)
    evs = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    facts["events"] = len(evs)
    facts["gpu_kernels"] = sum(1 for e in evs if e.get("cat") == "kernel")
    steps = [e for e in evs if e.get("cat") == "user_annotation" and _STEP.match(str(e.get("name", "")))]
    steps.sort(key=lambda e: e.get("ts", 0))
    kinds = {"prefill_only": 0, "mixed": 0, "decode_only": 0}
    decode_batches: list[int] = []
    for e in steps:
        m = _STEP.match(e["name"])
        assert m is not None
        ctx, gen = int(m.group(2)), int(m.group(3))
        kinds["prefill_only" if gen == 0 else "decode_only" if ctx == 0 else "mixed"] += 1
        if ctx == 0:
            decode_batches.append(gen)
    facts["steps"] = len(steps)
    facts["step_kinds"] = kinds
    if decode_batches:
        facts["decode_batch_min_max"] = [min(decode_batches), max(decode_batches)]
    if steps:
        durs = sorted(float(e.get("dur", 0)) for e in steps)
        facts["step_ms_median"] = round(durs[len(durs) // 2] / 1e3, 3)
    facts["read_s"] = round(time.monotonic() - t, 2)
    return facts


def stat(report: dict, key: str) -> dict | None:
    """Mean and 95% interval across repeats; a single run's value when there is one repeat."""
    rep = report.get("repeats") or {}
    if key in rep:
        r = rep[key]
        return {"mean": r["mean"], "ci95": r["ci95"], "n": r["n"], "values": r.get("values")}
    res = report.get("result") or {}
    if res.get(key) is not None:
        return {"mean": res[key], "ci95": None, "n": 1, "values": [res[key]]}
    return None


METRICS = [("output tok/s", "output_throughput"), ("requests/s", "request_throughput")] + [
    (f"{m.upper()} {q} ms", f"{'median' if q == 'median' else 'p99'}_{m}_ms")
    for m in ("ttft", "tpot", "itl", "e2el") for q in ("median", "p99")]


def fmt(s: dict | None) -> str:
    if s is None:
        return "-"
    v = s["mean"]
    text = f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    if s["ci95"] is not None:
        lo, hi = s["ci95"]
        text += f" [{lo:.4g}, {hi:.4g}]"
    return text


def top_roofline_rows(wss: list[Path | None], stage: str, n: int = 5) -> list[dict]:
    import csv
    files = [f for ws in wss if ws is not None for f in sorted((ws / "tracelens").glob(f"{stage}_*roofline_simple.csv"))]
    if not files:
        return []
    with open(files[0], newline="") as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: -float(r.get("kernel_time_ms_sum") or 0))
    return [{k: r.get(k) for k in ("op_name", "kernel_time_ms_sum", "time_pct", "num_kernels", "roofline_bound",
                                   "pct_roofline_mean")} for r in rows[:n]]


def copy_out(out: Path, clean_ws: Path | None, prof_ws: Path | None, re_ws: Path | None, table: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, ws in (("clean", clean_ws), ("profiled", prof_ws)):
        if ws is None:
            continue
        for f in ("benchmark_report.json", "summary.txt"):
            if (ws / f).exists():
                shutil.copy(ws / f, out / f"{name}_{f}")
    with tarfile.open(out / "reports.tar.gz", "w:gz") as tar:
        for name, ws in (("clean", clean_ws), ("profiled", prof_ws), ("reanalysis", re_ws)):
            if ws is None:
                continue
            files = [ws / "server.log", ws / "events.jsonl", ws / "config.yaml", ws / "trace_analysis_report.json"]
            files += sorted((ws / "tracelens").glob("*roofline_simple.csv"))
            files += sorted((ws / "gap_analysis").glob("*.csv"))
            files += sorted((ws / "logs").glob("*"))
            for f in files:
                if f.is_file():
                    tar.add(f, arcname=f"{name}/{f.relative_to(ws)}")
    (out / "gpu_serving.json").write_text(json.dumps(table, indent=1, default=str))
    (out / "gpu_serving.log").write_text("\n".join(_LOG_LINES) + "\n")


def environment() -> dict:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        import torch
        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 - a header line, not a result
        env["torch"] = f"unavailable: {exc}"
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], check=False, capture_output=True, text=True, timeout=20)
        env["nvidia_smi"] = q.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="where the two runs' workspaces go")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                    help="copy the reports here (default $OUT)")
    ap.add_argument("--clean-config", default=CLEAN)
    ap.add_argument("--profiled-config", default=PROFILED)
    ap.add_argument("--args", default="", help="CLI flags for both runs")
    ap.add_argument("--clean-args", default="", help="CLI flags for the clean run only")
    ap.add_argument("--profiled-args", default="--warmup 0", help="CLI flags for the profiled run only")
    ap.add_argument("--run-timeout", type=float, default=270.0, help="seconds per run before SIGINT")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole script: a run's timeout shrinks so that what is left fits")
    ap.add_argument("--no-reanalysis", action="store_true", help="skip timing the trace analysis on its own")
    args = ap.parse_args(argv)
    results = args.results.resolve()
    env = environment()
    say(f"environment: {json.dumps(env)}")

    started = time.monotonic()

    def allowed(want: float, reserve: float) -> float:
        if args.budget is None:
            return want
        return max(30.0, min(want, args.budget - (time.monotonic() - started) - reserve))

    walls, codes, wss = {}, {}, {}
    for name, cfg, extra in (("clean", args.clean_config, args.clean_args),
                             ("profiled", args.profiled_config, args.profiled_args)):
        out_dir = results / name
        out_dir.mkdir(parents=True, exist_ok=True)
        codes[name], walls[name] = run_cli(name, ["benchmark", "-b", cfg, *shlex.split(args.args), *shlex.split(extra),
                                                  "-o", str(out_dir)],
                                               allowed(args.run_timeout, 250.0 if name == "clean" else 60.0))
        wss[name] = workspace(out_dir)
    reports = {k: load_report(ws) for k, ws in wss.items()}
    facts = trace_facts(wss["profiled"])
    reanalysis: dict[str, Any] | None = None
    re_ws: Path | None = None
    re_report: dict = {}
    if not args.no_reanalysis and wss["profiled"] is not None and facts.get("traces"):
        rc, wall = run_cli("reanalysis", ["benchmark", "--trace-dir", str(wss["profiled"] / "torch_trace"),
                                          "--gpu-arch", "H200", "-o", str(results / "reanalysis")],
                           allowed(240.0, 15.0), grace=5.0)
        reanalysis = {"exit_code": rc, "wall_s": round(wall, 2)}
        rws = sorted((results / "reanalysis").glob("trace_*"), key=lambda p: p.stat().st_mtime)
        if rws:
            re_ws = rws[-1]
            try:
                re_report = json.loads((re_ws / "trace_analysis_report.json").read_text())
                reanalysis["elapsed_s"] = re_report.get("elapsed_s")
            except (OSError, ValueError):
                pass

    table: dict[str, Any] = {"environment": env, "exit_codes": codes, "wall_s": {k: round(v, 1) for k, v in walls.items()},
                             "workspaces": {k: str(v) for k, v in wss.items()}, "metrics": {}, "trace": facts,
                             "reanalysis": reanalysis, "in_run_stop_plus_analysis_s": in_run_analysis_s(wss["profiled"])}
    for _label, key in [*METRICS, ("completed", "completed")]:
        table["metrics"][key] = {k: stat(r, key) for k, r in reports.items()}
    for k, r in reports.items():
        table[k] = {"state": r.get("state"), "ready_s": (r.get("server") or {}).get("ready_s"),
                    "execution_time_s": r.get("execution_time"), "errors": r.get("errors"),
                    "warnings": r.get("warnings"), "overrides": [o.get("flag") for o in r.get("overrides") or []],
                    "completed": (r.get("throughput") or {}).get("completed_requests"),
                    "gpu_monitor": r.get("gpu_monitor")}
    prof = reports.get("profiled") or {}
    # The profiled run's kernel_summary (its largest trace); the analysis on its own as a fallback
    # (a cancelled run writes no analysis).
    table["top_kernels"] = prof.get("kernel_summary", [])[:5]
    table["top_kernels_from"] = "profiled run's kernel_summary"
    if not table["top_kernels"] and re_report:
        gap = re_report.get("gap_analysis") or {}
        table["top_kernels"] = [{"name": k["Name"], "time_ms": k["Self CUDA total (us)"] / 1e3, "percent": k["% Total"],
                                 "calls": k["Calls"]} for k in gap.get("top_kernels", [])[:5]]
        table["top_kernels_from"] = "the trace analysis on its own (gap_analysis.top_kernels)"
    tl = prof.get("tracelens_analysis") or re_report.get("tracelens_analysis") or {}
    table["tracelens"] = {"gpu_arch": tl.get("gpu_arch"), "errors": tl.get("errors"), "phase_picks": tl.get("phase_picks"),
                          "top_ops": {s: top_roofline_rows([wss["profiled"], re_ws], s)
                                      for s in ("prefill_only", "prefilldecode", "decode_only")}}
    if args.out is not None:
        copy_out(args.out, wss["clean"], wss["profiled"], re_ws, table)

    # --- the table, last ---
    say("")
    say(f"== magpie benchmark {prof.get('framework') or ''} {prof.get('model') or ''}: clean vs profiled "
        "(mean across repeats [95% interval]) ==")
    say(f"GPU: {env.get('gpu') or env.get('nvidia_smi')}; torch {env.get('torch')}")
    say(f"{'metric':<16} | {'clean':<32} | {'profiled':<32} | prof/clean")
    for label, key in METRICS:
        c, p = table["metrics"][key].get("clean"), table["metrics"][key].get("profiled")
        ratio = f"{p['mean'] / c['mean']:.2f}" if c and p and c["mean"] else "-"
        say(f"{label:<16} | {fmt(c):<32} | {fmt(p):<32} | {ratio}")
    for k in ("clean", "profiled"):
        t = table.get(k) or {}
        vals = (table["metrics"]["output_throughput"].get(k) or {}).get("values") or []
        done = [int(v) for v in ((table["metrics"].get("completed") or {}).get(k) or {}).get("values") or []]
        if t.get("state") == "cancelled":
            say(f"WARNING: the {k} run was cancelled: its last repeat is partial ({done} completed per repeat) "
                "and the report's repeat statistics include it")
        say(f"{k}: state {t.get('state')}, {t.get('completed')} requests/repeat, server ready {t.get('ready_s') or 0:.1f} s, "
            f"run {t.get('execution_time_s') or 0:.1f} s, output tok/s per repeat "
            f"{', '.join(f'{v:,.0f}' for v in vals)}; overrides {t.get('overrides')}; errors {t.get('errors')}")
    say(f"trace: {facts}")
    say(f"analysis: in the run (server stop + analysis) {table['in_run_stop_plus_analysis_s']} s; "
        f"on its own {reanalysis}; tracelens arch {table['tracelens']['gpu_arch']}, errors {table['tracelens']['errors']}")
    say(f"top 5 GPU kernels (profiled trace; from {table['top_kernels_from']}):")
    for i, k in enumerate(table["top_kernels"], 1):
        say(f"  {i}. {k['percent']:5.1f}%  {k['time_ms']:9.2f} ms  {k['calls']:6d} calls  {k['name'][:110]}")
    for stage, rows in table["tracelens"]["top_ops"].items():
        if rows:
            say(f"tracelens {stage}: " + "; ".join(f"{r['op_name']} {r['time_pct']}% ({r['roofline_bound']}, "
                                                   f"{r['pct_roofline_mean']}% of roofline)" for r in rows))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
