"""How far each GPU timer is from ncu, on one Triton row softmax (float32) at three sizes.

The per-launch kernel time is measured, in one run, by:

* ncu: ``gpu__time_duration.sum`` of 30 launches after 5 warm-ups (``--cache-control all``,
  so L2 is flushed before each launch; ``--clock-control none``, so the clocks stay as found);
  the median of the 30 is the reference;
* ``triton.testing.do_bench`` (warmup=25, rep=100, median) and ``do_bench_cudagraph``
  (rep=100, median; it does not flush L2);
* ``magpie analyze`` with each of its timers (``performance.timer``: trace, events, graph),
  one analyze run per (size, timer) read back from its ``analyze_report.json``.

Every method runs in its own subprocess (its own process group, killed as a group on
timeout). Each of ``--rounds`` rounds runs every (method, size) once, in a shuffled order,
so slow drift favours no method. The result is the median over rounds of each run's
median. Methods that fail show "n/a"; the JSON has the reason. A measurement that would
start after ``--budget`` seconds is skipped, and the JSON records that.

Kernel and launcher: benchmarks/_softmax_launcher.py. The analyze YAMLs use ``correctness.seeds: 1``
(one random input set, checked against ``torch.softmax``), so the CPU-side comparison
does not eat the time budget at the largest size.

Usage, from the repository root, on the GPU machine (about 5 minutes):
    python3 benchmarks/gpu_timing_vs_ncu.py
    python3 benchmarks/gpu_timing_vs_ncu.py --sizes 3750x4000 --methods ncu,do_bench --rounds 1
With no GPU:  python3 benchmarks/gpu_timing_vs_ncu.py --self-test   (ncu CSV parser, table)
The table is printed last; every number goes to $OUT/timing_vs_ncu.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = Path(__file__).resolve().with_name("_softmax_launcher.py")
# About 10, 30 and 250 us at ~4 TB/s: bytes moved = 2 * rows * cols * 4 (read x, write y).
DEFAULT_SIZES = "1250x4000,3750x4000,31250x4000"
MAGPIE_TIMERS = ("trace", "events", "graph")
METHODS = ("ncu", "do_bench", "do_bench_cudagraph") + tuple(f"magpie-{t}" for t in MAGPIE_TIMERS)
SHORT = {"do_bench_cudagraph": "do_bench_cg"}
NCU_METRIC = "gpu__time_duration.sum"
NCU_SKIP, NCU_COUNT = 5, 30

REFERENCE_PY = '''\
import os
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


def get_inputs():
    return [torch.randn(int(os.environ.get("ROWS", "3750")), int(os.environ.get("COLS", "4000")))]


def get_init_inputs():
    return []
'''

YAML = """\
kernel:
  id: softmax
  type: triton
  source_files: [softmax_kernel.py]
  reference_file: reference.py
  env: {{ROWS: "{rows}", COLS: "{cols}"}}
performance:
  timer: {timer}
correctness:
  seeds: 1
"""


class MethodError(Exception):
    """A measurement that gave no number; the message is the reason kept in the JSON."""


# ----------------------------------------------------------------------------- helpers

def parse_size(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected ROWSxCOLS, e.g. 3750x4000") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: rows and cols must be positive")
    return rows, cols


def size_label(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def mb_moved(size: tuple[int, int]) -> float:
    return 2 * size[0] * size[1] * 4 / 1e6


_TIME_NS = {"": 1.0, "ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
            "s": 1e9, "second": 1e9}


def parse_ncu_csv(text: str, metric: str = NCU_METRIC, kernel: str | None = None) -> list[dict]:
    """One {id, kernel, ns} per launch from ncu ``--csv`` output (details page: one row per
    launch and metric). ncu's own lines (==PROF==, ==WARNING==) and the program's output are
    skipped: every CSV record ncu writes starts with a quote. Thousands separators are dropped."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    header = next((r for r in rows if "Metric Name" in r and "Metric Value" in r), None)
    if header is None:
        return []
    col = {name: i for i, name in enumerate(header)}
    launches = []
    for r in rows[rows.index(header) + 1:]:
        if len(r) != len(header) or r[col["Metric Name"]] != metric:
            continue
        name = r[col["Kernel Name"]]
        if kernel and kernel not in name:
            continue
        unit = r[col["Metric Unit"]].strip() if "Metric Unit" in col else ""
        if unit not in _TIME_NS:
            raise ValueError(f"ncu printed {metric} in an unknown unit {unit!r}")
        value = float(r[col["Metric Value"]].replace(",", "").strip())
        launches.append({"id": int(r[col["ID"]]), "kernel": name, "ns": value * _TIME_NS[unit]})
    return sorted(launches, key=lambda la: la["id"])


def run_group(argv: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run argv in its own process group; on timeout kill the whole group."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        raise MethodError(f"cannot start {argv[0]}: {exc}") from None
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:  # Ctrl-C: take the group down with us
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return {"argv": argv, "rc": proc.returncode, "timed_out": timed_out, "wall_s": round(time.monotonic() - t0, 2),
            "stdout": out or "", "stderr": err or ""}


def tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def _failure(r: dict, what: str, timeout: float) -> MethodError:
    if r["timed_out"]:
        return MethodError(f"{what} timed out after {timeout:g} s (process group killed)")
    text = (r["stderr"] or r["stdout"]).strip()
    last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "no output")
    return MethodError(f"{what} exited {r['rc']}: {last.strip()}\n{tail(text, 800)}")


def _launcher_result(stdout: str) -> dict | None:
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("RESULT ")), None)
    return json.loads(line[len("RESULT "):]) if line else None


# ----------------------------------------------------------------------------- methods

def measure_ncu(size: tuple[int, int], ctx: argparse.Namespace) -> dict:
    if not ctx.ncu or not shutil.which(ctx.ncu):
        raise MethodError(f"ncu not found ({ctx.ncu or 'not on PATH'}; give --ncu PATH)")
    argv = [ctx.ncu, "--metrics", NCU_METRIC, "--cache-control", "all", "--clock-control", "none", "--csv",
            "--print-units", "base", "--launch-skip", str(NCU_SKIP), "--launch-count", str(NCU_COUNT),
            "-k", "regex:softmax", ctx.python, str(LAUNCHER), "ncu", size_label(size),
            "--warmup", str(NCU_SKIP), "--launches", str(NCU_COUNT)]
    r = run_group(argv, ctx.timeout, cwd=REPO)
    try:
        launches = parse_ncu_csv(r["stdout"], kernel="softmax")
    except ValueError as exc:
        raise MethodError(f"ncu output not understood: {exc}") from None
    if r["rc"] != 0 or not launches:
        errors = [ln for ln in (r["stdout"] + "\n" + r["stderr"]).splitlines() if ln.startswith("==ERROR==")]
        if errors and not r["timed_out"]:
            raise MethodError(f"ncu exited {r['rc']}: {errors[0]}\n{tail(r['stdout'] + r['stderr'], 800)}")
        if r["rc"] == 0 and not r["timed_out"]:
            raise MethodError(f"ncu reported no softmax launch\n{tail(r['stdout'] + r['stderr'], 800)}")
        raise _failure(r, "ncu", ctx.timeout)
    samples = [la["ns"] / 1e3 for la in launches]
    rec = {"median_us": statistics.median(samples), "samples_us": samples, "kernel": launches[0]["kernel"],
           "launches": len(samples), "wall_s": r["wall_s"], "launcher": _launcher_result(r["stdout"])}
    if len(samples) != NCU_COUNT:
        rec["note"] = f"ncu timed {len(samples)} launches, {NCU_COUNT} were asked for"
    return rec


def measure_do_bench(size: tuple[int, int], mode: str, ctx: argparse.Namespace) -> dict:
    r = run_group([ctx.python, str(LAUNCHER), mode, size_label(size)], ctx.timeout, cwd=REPO)
    res = _launcher_result(r["stdout"])
    if r["rc"] != 0 or res is None or res.get("median_ms") is None:
        raise _failure(r, mode, ctx.timeout)
    return {"median_us": res["median_ms"] * 1e3, "wall_s": r["wall_s"], "launcher": res}


def write_kernel_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(LAUNCHER, folder / "softmax_kernel.py")
    (folder / "reference.py").write_text(REFERENCE_PY)


def measure_magpie(size: tuple[int, int], timer: str, ctx: argparse.Namespace, tag: str) -> dict:
    name = f"{timer}_{size_label(size)}_{tag}"
    yaml_path = ctx.kernel_dir / f"{name}.yaml"
    yaml_path.write_text(YAML.format(rows=size[0], cols=size[1], timer=timer))
    out = ctx.workdir / "results" / name
    rest = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=str(REPO) + (os.pathsep + rest if rest else ""))
    r = run_group([ctx.python, "-m", "engine.cli", "analyze", "-k", str(yaml_path), "-o", str(out)],
                  ctx.timeout, env=env, cwd=REPO)
    reports = sorted(out.glob("*/analyze_report.json")) if out.is_dir() else []
    if len(reports) != 1:
        why = _failure(r, "magpie analyze", ctx.timeout) if r["rc"] or r["timed_out"] else "magpie analyze exited 0"
        raise MethodError(f"{why}\n({len(reports)} analyze_report.json under {out}; expected 1)")
    report = json.loads(reports[0].read_text())
    res = report["results"][0]
    timing = res.get("timing") or {}
    backend = (res.get("performance_result") or {}).get("backend")
    if timing.get("median") is None:
        errors = "; ".join(e.splitlines()[0] for e in res.get("errors") or []) or tail(r["stderr"], 800)
        raise MethodError(f"magpie analyze gave no timing (correctness {res.get('correctness_state')}, "
                          f"performance {res.get('performance_state')}, backend {backend}): {errors}")
    return {"median_us": timing["median"] * 1e3, "backend": backend, "n": timing.get("n"), "cv": timing.get("cv"),
            "rc": r["rc"], "wall_s": r["wall_s"], "report": str(reports[0])}


def measure(method: str, size: tuple[int, int], ctx: argparse.Namespace, tag: str) -> dict:
    if method == "ncu":
        return measure_ncu(size, ctx)
    if method in ("do_bench", "do_bench_cudagraph"):
        return measure_do_bench(size, method, ctx)
    return measure_magpie(size, method.removeprefix("magpie-"), ctx, tag)


def gpu_state(ctx: argparse.Namespace) -> str | None:
    """A read-only look at the GPU (name, clocks, temperature, power); changes nothing."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = run_group(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw",
                       "--format=csv,noheader"], 30)
    except MethodError:
        return None
    return r["stdout"].strip() or None


# ----------------------------------------------------------------------------- summary

def summarize(runs: list[dict], methods: list[str], sizes: list[tuple[int, int]]) -> dict:
    """{size: {method: {median_us, rounds_us, vs_ncu_pct} or {reason}}}: the median over rounds."""
    out: dict = {}
    for size in sizes:
        label = size_label(size)
        cell: dict = {}
        for m in methods:
            mine = [r for r in runs if r["method"] == m and r["size"] == label]
            ok = [r["median_us"] for r in mine if r.get("median_us") is not None]
            if ok:
                cell[m] = {"median_us": statistics.median(ok), "rounds_us": ok}
            else:
                cell[m] = {"median_us": None, "reason": next((r["error"] for r in mine if r.get("error")), "not run")}
        ncu = (cell.get("ncu") or {}).get("median_us")
        for m, c in cell.items():
            if m != "ncu" and ncu and c["median_us"] is not None:
                c["vs_ncu_pct"] = 100.0 * (c["median_us"] / ncu - 1.0)
        out[label] = {"mb_moved": mb_moved(size), "methods": cell}
    return out


def render_table(summary: dict, methods: list[str]) -> str:
    others = [m for m in methods if m != "ncu"]
    head = ["size (rows x cols, MB)", "ncu us"] + [f"{SHORT.get(m, m)} us (vs ncu)" for m in others]
    lines = []
    for label, s in summary.items():
        ncu = s["methods"].get("ncu", {}).get("median_us")
        row = [f"{label} ({s['mb_moved']:.0f} MB)", f"{ncu:.2f}" if ncu is not None else "n/a"]
        for m in others:
            c = s["methods"][m]
            if c["median_us"] is None:
                row.append("n/a")
            else:
                pct = c.get("vs_ncu_pct")
                row.append(f"{c['median_us']:.2f}" + (f" ({pct:+.1f}%)" if pct is not None else ""))
        lines.append(row)
    widths = [max(len(r[i]) for r in [head] + lines) for i in range(len(head))]
    fmt = lambda r: " | ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(head), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in lines])


# ----------------------------------------------------------------------------- self-test (no GPU)

SAMPLE_NCU_OUTPUT = """\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "softmax_kernel" - 0: 0%....50%....100% - 1 pass
==PROF== Profiling "softmax_kernel" - 1: 0%....50%....100% - 1 pass
RESULT {"mode": "ncu", "launches": 35, "check_passed": true}
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",\
"Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","softmax_kernel","1","7","(256, 1, 1)","(3750, 1, 1)","0","9.0",\
"Command line profiler metrics","gpu__time_duration.sum","ns","31,232"
"1","4242","python3.12","127.0.0.1","softmax_kernel","1","7","(256, 1, 1)","(3750, 1, 1)","0","9.0",\
"Command line profiler metrics","gpu__time_duration.sum","nsecond","30880.5"
"2","4242","python3.12","127.0.0.1","other_kernel","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0",\
"Command line profiler metrics","gpu__time_duration.sum","ns","1,000"
"3","4242","python3.12","127.0.0.1","softmax_kernel","1","7","(256, 1, 1)","(3750, 1, 1)","0","9.0",\
"Command line profiler metrics","gpu__time_duration.sum","us","31.5"
"""


def self_test() -> int:
    launches = parse_ncu_csv(SAMPLE_NCU_OUTPUT, kernel="softmax")
    assert [la["id"] for la in launches] == [0, 1, 3], launches
    assert [la["ns"] for la in launches] == [31232.0, 30880.5, 31500.0], launches
    assert len(parse_ncu_csv(SAMPLE_NCU_OUTPUT)) == 4
    assert parse_ncu_csv("==PROF== no kernels were profiled\n") == []
    assert _launcher_result(SAMPLE_NCU_OUTPUT)["launches"] == 35
    try:
        parse_ncu_csv(SAMPLE_NCU_OUTPUT.replace('"us","31.5"', '"furlong","31.5"'))
        raise AssertionError("an unknown unit must be an error")
    except ValueError:
        pass
    sizes = [(1250, 4000), (3750, 4000)]
    runs = [{"method": "ncu", "size": "1250x4000", "median_us": 10.0},
            {"method": "ncu", "size": "1250x4000", "median_us": 12.0},
            {"method": "do_bench", "size": "1250x4000", "median_us": 13.2},
            {"method": "ncu", "size": "3750x4000", "error": "ncu not found"},
            {"method": "do_bench", "size": "3750x4000", "median_us": 35.0}]
    s = summarize(runs, ["ncu", "do_bench"], sizes)
    assert s["1250x4000"]["methods"]["ncu"]["median_us"] == 11.0
    assert abs(s["1250x4000"]["methods"]["do_bench"]["vs_ncu_pct"] - 20.0) < 1e-9
    assert s["3750x4000"]["methods"]["ncu"]["reason"] == "ncu not found"
    assert "vs_ncu_pct" not in s["3750x4000"]["methods"]["do_bench"]
    print(render_table(s, ["ncu", "do_bench"]))
    print("self-test: 1 passed, 0 failed")
    return 0


# ----------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="methods: " + ", ".join(METHODS))
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"comma-separated ROWSxCOLS float32 inputs (default {DEFAULT_SIZES}: about 10, 30 "
                        "and 250 us on an H200)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every (method, size) (default 2)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods (default all)")
    p.add_argument("--json", help="where to write every number (default $OUT/timing_vs_ncu.json when $OUT is set)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that has torch and triton, for the launcher and magpie (default this one)")
    p.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu", help="ncu binary")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for each subprocess (default 300)")
    p.add_argument("--budget", type=float, default=330.0,
                   help="start no measurement after this many seconds (default 330); skipped ones are in the JSON")
    p.add_argument("--workdir", help="YAMLs, kernel copy and analyze workspaces (default $OUT/timing_vs_ncu_work "
                                      "when $OUT is set, else a temp dir removed at the end)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled order (default 0)")
    p.add_argument("--self-test", action="store_true", help="check the ncu CSV parser and the table, no GPU needed")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods or not sizes or args.rounds < 1:
        p.error(f"unknown methods {unknown} (known: {', '.join(METHODS)})" if unknown else
                "need at least one method, one size and one round")
    json_path = Path(args.json) if args.json else (Path(os.environ["OUT"]) / "timing_vs_ncu.json"
                                                   if os.environ.get("OUT") else None)
    keep = bool(args.workdir or os.environ.get("OUT"))
    args.workdir = Path(args.workdir or (Path(os.environ["OUT"]) / "timing_vs_ncu_work" if os.environ.get("OUT")
                                         else tempfile.mkdtemp(prefix="timing_vs_ncu_")))
    args.kernel_dir = args.workdir / "kernel"
    write_kernel_folder(args.kernel_dir)

    started = time.monotonic()
    doc: dict = {"sizes": [size_label(s) for s in sizes], "methods": methods, "rounds": args.rounds,
                 "python": args.python, "ncu": args.ncu, "timeout_s": args.timeout, "budget_s": args.budget,
                 "workdir": str(args.workdir), "gpu_before": gpu_state(args), "runs": []}
    tasks = [(m, s) for m in methods for s in sizes]
    for rnd in range(args.rounds):
        order = tasks[:]
        random.Random(args.seed + rnd).shuffle(order)
        for i, (m, s) in enumerate(order, 1):
            rec: dict = {"round": rnd, "method": m, "size": size_label(s), "t_start_s": round(time.monotonic() - started, 1)}
            if time.monotonic() - started > args.budget:
                rec["error"] = f"skipped: --budget {args.budget:g} s reached"
            else:
                try:
                    rec.update(measure(m, s, args, f"r{rnd}"))
                except MethodError as exc:
                    rec["error"] = str(exc)
            doc["runs"].append(rec)
            shown = (f"{rec['median_us']:.2f} us" if rec.get("median_us") is not None
                     else "n/a: " + rec["error"].splitlines()[0][:200])
            print(f"[round {rnd + 1}/{args.rounds} {i}/{len(order)} t={time.monotonic() - started:.0f}s] "
                  f"{m} {size_label(s)}: {shown}", file=sys.stderr, flush=True)
    doc["gpu_after"] = gpu_state(args)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["summary"] = summarize(doc["runs"], methods, sizes)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(doc, indent=1))
    if not keep:
        shutil.rmtree(args.workdir, ignore_errors=True)

    for label, s in doc["summary"].items():
        for m, c in s["methods"].items():
            if c["median_us"] is None:
                print(f"n/a {m} {label}: {c['reason'].splitlines()[0][:300]}")
    backends = {m: sorted({r.get("backend") for r in doc["runs"] if r["method"] == m and r.get("backend")})
                for m in methods if m.startswith("magpie-")}
    if backends:
        print("magpie backends: " + ", ".join(f"{m}={'/'.join(b) or 'n/a'}" for m, b in backends.items()))
    print(f"{doc['elapsed_s']:.0f} s; GPU before: {doc['gpu_before']}; after: {doc['gpu_after']}"
          + (f"; JSON: {json_path}" if json_path else ""))
    print(render_table(doc["summary"], methods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
