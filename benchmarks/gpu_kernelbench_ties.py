"""Tie calls on KernelBench level-1 problems: each problem compared with an identical copy of itself.

For every ``*.compare.yaml`` in examples/kernels/kernelbench_l1/ (or the ``--only`` subset) this runs
``python -m engine.cli compare -k YAML -o OUTDIR`` as a child process (PYTHONPATH = the repository
root), times it, and reads the run's compare_report.json (the one folder under OUTDIR). The copy is
the same file as the baseline, so the right answer is always "tie"; anything else is a false call.

Collected per run: the problem, the copy's verdict, speedup and its CI, both medians (ms), the timer
backend, both correctness states, the exit code and the wall seconds. ``--repeats-of-run N`` runs each
compare N times (do verdicts and medians hold across runs?). ``--timeout`` bounds one compare: on
expiry its whole process group is killed and the row says "timeout".

The full-size problems need an H200-class GPU (inputs of several GB). On a CPU, scale them down:

    KB_SCALE=0.001 python benchmarks/gpu_kernelbench_ties.py --only kb019_relu

The rows go to --json PATH (default $OUT/kernelbench_ties.json when $OUT is set); the workspaces
and each compare's stdout/stderr stay under --results (default $OUT/kernelbench_runs, else a
temporary folder). A short fixed-width table is printed last. Exit status: 0 when every run left a
report (with --strict: and every copy was called a tie), else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = REPO / "examples" / "kernels" / "kernelbench_l1"
SUFFIX = ".compare.yaml"


def find_problems(folder: Path, only: list[str] | None) -> list[tuple[str, Path]]:
    """(problem name, YAML) pairs, sorted; ``only`` entries match a name exactly or as a prefix (kb019)."""
    found = sorted((p.name[: -len(SUFFIX)], p) for p in folder.glob(f"*{SUFFIX}"))
    if not only:
        return found
    chosen = []
    for want in only:
        hits = [pair for pair in found if pair[0] == want] or [pair for pair in found if pair[0].startswith(want)]
        if not hits:
            names = ", ".join(n for n, _ in found) or "none"
            raise SystemExit(f"--only {want!r}: no such problem in {folder} (have: {names})")
        chosen.extend(h for h in hits if h not in chosen)
    return chosen


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + rest if rest else "")
    return env


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to the child's own process group (it was started in a new session)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_compare(yaml_path: Path, out_dir: Path, log_stem: Path, timeout_s: float,
                extra: list[str]) -> tuple[int | None, float, bool]:
    """Run one compare; returns (exit code or None on timeout, wall seconds, timed out)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "engine.cli", "compare", "-k", str(yaml_path), "-o", str(out_dir), *extra]
    with open(f"{log_stem}.stdout.log", "w") as out, open(f"{log_stem}.stderr.log", "w") as err:
        out.write("$ " + shlex.join(cmd) + "\n")
        out.flush()
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=out, stderr=err, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
            return code, time.monotonic() - t0, False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None, time.monotonic() - t0, True
        except BaseException:  # Ctrl-C: take the child's group down with us
            _kill_group(proc, grace_s=2.0)
            raise


def read_run_report(out_dir: Path) -> tuple[dict | None, Path | None, str | None]:
    """The report of the one workspace folder under out_dir, or (None, folder, why)."""
    dirs = [p for p in out_dir.iterdir() if p.is_dir()] if out_dir.is_dir() else []
    if len(dirs) != 1:
        return None, None, f"expected one workspace folder in {out_dir}, found {len(dirs)}"
    path = dirs[0] / "compare_report.json"
    try:
        return json.loads(path.read_text()), dirs[0], None
    except FileNotFoundError:
        return None, dirs[0], f"no {path.name} in {dirs[0]}"
    except (OSError, json.JSONDecodeError) as exc:
        return None, dirs[0], f"cannot read {path}: {exc}"


def kernel_results(report: dict) -> list[dict]:
    res = report.get("results") or {}
    rows = res.get("kernel_results") if isinstance(res, dict) else res
    return rows if isinstance(rows, list) else []


def pick_ref_and_copy(report: dict) -> tuple[dict | None, dict | None]:
    rows = kernel_results(report)
    by_id = {r.get("kernel_id"): r for r in rows}
    ref, copy = by_id.get("ref"), by_id.get("copy")
    if ref is None:
        idx = (report.get("baseline") or {}).get("index")
        ref = rows[idx] if isinstance(idx, int) and 0 <= idx < len(rows) else next(
            (r for r in rows if r.get("verdict") == "baseline"), rows[0] if rows else None)
    if copy is None:
        copy = next((r for r in rows if r is not ref), None)
    return ref, copy


def _median(k: dict | None) -> float | None:
    t = (k or {}).get("timing") or {}
    return t.get("median") if isinstance(t, dict) else None


def _floor(k: dict | None) -> float | None:
    p = (k or {}).get("performance_result") or {}
    method = p.get("method") if isinstance(p, dict) else None
    return method.get("hardware_floor_ms") if isinstance(method, dict) else None


def _backend(k: dict | None) -> str | None:
    p = (k or {}).get("performance_result") or {}
    return p.get("backend") if isinstance(p, dict) else None


def summarise(problem: str, run: int, code: int | None, wall_s: float, timed_out: bool,
              report: dict | None, workspace: Path | None, why: str | None) -> dict:
    row: dict = {"problem": problem, "run": run, "exit_code": code, "wall_s": round(wall_s, 2),
                 "status": "timeout" if timed_out else ("ok" if report is not None else "no report"),
                 "workspace": str(workspace) if workspace else None}
    if report is None:
        row["verdict"] = "timeout" if timed_out else None
        row["error"] = f"killed at the timeout, after {wall_s:.1f} s" if timed_out else why
        return row
    ref, copy = pick_ref_and_copy(report)
    row.update({
        "verdict": (copy or {}).get("verdict"),
        "speedup": (copy or {}).get("speedup"),
        "speedup_ci": (copy or {}).get("speedup_ci"),
        "ref_median_ms": _median(ref),
        "copy_median_ms": _median(copy),
        "floor_ms": _floor(ref),
        "ref_backend": _backend(ref),
        "copy_backend": _backend(copy),
        "ref_correctness": (ref or {}).get("correctness_state"),
        "copy_correctness": (copy or {}).get("correctness_state"),
        "errors": [str(e)[:300] for k in (ref, copy) for e in ((k or {}).get("errors") or [])][:4],
        "input_gib": _gib(((ref or {}).get("peak_memory") or {}).get("input_bytes")),
        "ref_peak_gib": _gib(((ref or {}).get("peak_memory") or {}).get("device_bytes")),
        "copy_peak_gib": _gib(((copy or {}).get("peak_memory") or {}).get("device_bytes")),
        "ref_peak_by_request": ((ref or {}).get("peak_memory") or {}).get("device_bytes_by_request"),
        "environment": [str(e)[:300] for k in (ref, copy) for e in ((k or {}).get("environment_problems") or [])][:2],
    })
    if report.get("error"):
        row["error"] = str(report["error"])[:300]
    if timed_out:  # a report written while being killed (a cancelled run) says nothing about ties
        row["report_verdict"], row["verdict"] = row["verdict"], "timeout"
        row["status"] = "timeout"
    return row


def _gib(v) -> float | None:
    return round(v / 2**30, 2) if isinstance(v, (int, float)) else None


def _num(v, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def _ratio(v) -> str:
    return "-" if not isinstance(v, (int, float)) else (f"{v:.3f}" if abs(v) < 10 else f"{v:.4g}")


def format_table(rows: list[dict]) -> str:
    header = f"{'problem':<22} {'run':>3} {'verdict':<12} {'speedup [95% CI]':<24} {'median ms ref/copy':<23} " \
             f"{'floor ms':>9} {'timer':<26} {'rc':>4} {'wall s':>7} {'in GiB':>7} {'peak GiB ref/copy':>17}"
    lines = [header, "-" * len(header)]
    for r in rows:
        ci = r.get("speedup_ci")
        sp = _ratio(r.get("speedup"))
        if isinstance(ci, (list, tuple)) and len(ci) == 2:
            sp += f" [{_ratio(ci[0])}, {_ratio(ci[1])}]"
        med = f"{_num(r.get('ref_median_ms'), '.4g')}/{_num(r.get('copy_median_ms'), '.4g')}"
        timer = r.get("copy_backend") or r.get("ref_backend") or "-"
        rc = "-" if r.get("exit_code") is None else str(r["exit_code"])
        lines.append(f"{r['problem'][:22]:<22} {r['run']:>3} {str(r.get('verdict') or r['status'])[:12]:<12} "
                     f"{sp[:24]:<24} {med[:23]:<23} {_num(r.get('floor_ms'), '.4g'):>9} {timer[:26]:<26} {rc:>4} "
                     f"{r['wall_s']:>7.1f} {_num(r.get('input_gib'), '.2f'):>7} "
                     f"{_num(r.get('ref_peak_gib'), '.2f') + '/' + _num(r.get('copy_peak_gib'), '.2f'):>17}")
    ties = sum(1 for r in rows if r.get("verdict") == "tie")
    lines.append(f"{ties}/{len(rows)} runs called the identical copy a tie")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    out_env = os.environ.get("OUT")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", metavar="NAMES",
                    help="comma-separated problems (kb019_relu, or a prefix like kb019); repeatable; default all")
    ap.add_argument("--problems-dir", type=Path, default=PROBLEMS,
                    help=f"folder of *{SUFFIX} files (default {PROBLEMS.relative_to(REPO)})")
    ap.add_argument("--repeats-of-run", type=int, default=1, metavar="N",
                    help="run each compare N times (default 1)")
    ap.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds allowed for one compare; its process group is killed after that (default 300)")
    ap.add_argument("--seed", type=int, help="passed to compare as --seed")
    ap.add_argument("--compare-args", default="", metavar="ARGS",
                    help="more arguments for every compare, one shell-quoted string (e.g. \"--repeats 50\")")
    ap.add_argument("--json", type=Path, default=Path(out_env) / "kernelbench_ties.json" if out_env else None,
                    help="write the rows here as JSON (default $OUT/kernelbench_ties.json when $OUT is set)")
    ap.add_argument("--results", type=Path, default=Path(out_env) / "kernelbench_runs" if out_env else None,
                    help="root for the workspaces and logs (default $OUT/kernelbench_runs, else a temp folder)")
    ap.add_argument("--strict", action="store_true", help="exit 1 unless every copy was called a tie")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats_of_run < 1:
        raise SystemExit("--repeats-of-run must be at least 1")
    if args.timeout <= 0:
        raise SystemExit("--timeout must be positive")
    only = [n.strip() for item in (args.only or []) for n in item.split(",") if n.strip()] or None
    problems = find_problems(args.problems_dir, only)
    if not problems:
        raise SystemExit(f"no *{SUFFIX} files in {args.problems_dir}")
    extra = (["--seed", str(args.seed)] if args.seed is not None else []) + shlex.split(args.compare_args)
    root = args.results or Path(tempfile.mkdtemp(prefix="kernelbench_ties_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"{len(problems)} problem(s) x {args.repeats_of_run} run(s); KB_SCALE={os.environ.get('KB_SCALE', '1.0')}; "
          f"results under {root}", flush=True)

    rows: list[dict] = []
    for name, yaml_path in problems:
        for run in range(1, args.repeats_of_run + 1):
            stem = f"run{run}_{time.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}"
            out_dir = root / name / stem
            code, wall_s, timed_out = run_compare(yaml_path, out_dir, root / name / stem, args.timeout, extra)
            report, ws, why = read_run_report(out_dir)
            row = summarise(name, run, code, wall_s, timed_out, report, ws, why)
            row["log"] = str(root / name / f"{stem}.stderr.log")
            rows.append(row)
            print(f"  {name} run {run}: {row['status']}, verdict {row.get('verdict')}, rc {code}, "
                  f"{wall_s:.1f} s" + (f" ({row['error']})" if row.get("error") else ""), flush=True)

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"kb_scale": os.environ.get("KB_SCALE", "1.0"), "timeout_s": args.timeout,
               "repeats_of_run": args.repeats_of_run, "compare_args": extra, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1, default=str))
        print(f"rows written to {args.json}", flush=True)
    print(format_table(rows), flush=True)

    complete = all(r["status"] == "ok" for r in rows)
    all_ties = all(r.get("verdict") == "tie" for r in rows)
    return 0 if complete and (all_ties or not args.strict) else 1


if __name__ == "__main__":
    sys.exit(main())
