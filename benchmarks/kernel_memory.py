"""Peak memory of a compare, per request and both workers together, as a multiple of M.

For every ``*.compare.yaml`` in examples/kernels/kernelbench_l1/ (or the ``--only`` subset: each
problem against an identical copy) this runs ``python -m engine.cli compare`` as
benchmarks/gpu_kernelbench_ties.py does and reads the report's ``peak_memory`` of both kernels.
M is what one call's inputs and outputs take (``input_bytes + output_bytes``). Per problem it
prints M, each worker's peak by request (load, run_set, judge, degenerate, release, warm, time,
audit_prepare, audit_go, ...), the sum of the two workers' peaks (what they take if neither gives
memory back) and ``together``, the most both held at once (a request's peak plus what the other
kept meanwhile), all as multiples of M.

On a GPU the numbers are the device's (torch's allocator). On a CPU they are the host's: each
request's resident peak (the worker resets /proc/self/clear_refs before it) above the worker's
size before its first request. So that a freed tensor leaves the resident set at once, the
workers run with a small glibc mmap threshold (``--mmap-threshold``; the engine's default of 4 GB
keeps freed memory in the heap); and, so that the same code paths run as for KernelBench's own
sizes on a GPU, input sets are made again from their seeds (``--keep-sets-bytes``, default 1 on a
CPU). Scale the problems down with KB_SCALE:

    KB_SCALE=0.05 python benchmarks/kernel_memory.py --only kb023,kb036,kb063

The rows go to --json PATH (default $OUT/kernel_memory.json when $OUT is set). Exit status 0
when every run left a report (with --max-together X: and every problem stayed within X M).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernelbench_ties import PROBLEMS, find_problems, pick_ref_and_copy, read_run_report, run_compare  # noqa: E402

ORDER = ("load", "adopt", "run_set", "judge", "export", "degenerate", "release", "warm", "time", "audit_prepare",
         "audit_go")


def _has_gpu() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def by_request(peak: dict) -> tuple[str, dict[str, int]]:
    """('device' | 'host', {request: bytes}); host numbers are above the worker's own size."""
    dev = peak.get("device_bytes_by_request")
    if dev:
        return "device", dict(dev)
    return "host", dict(peak.get("host_bytes_by_request") or {})


def measure(report: dict) -> dict:
    ref, copy = pick_ref_and_copy(report)
    pr, pc = (ref or {}).get("peak_memory") or {}, (copy or {}).get("peak_memory") or {}
    where, ref_ops = by_request(pr)
    _, copy_ops = by_request(pc)
    m = int(pr.get("input_bytes") or 0) + int(pr.get("output_bytes") or pc.get("output_bytes") or 0)
    ref_peak, copy_peak = max(ref_ops.values(), default=0), max(copy_ops.values(), default=0)
    together = max(int(p.get(f"{where}_bytes_together") or 0) for p in (pr, pc))
    ops = [op for op in ORDER if op in ref_ops or op in copy_ops]
    ops += sorted((set(ref_ops) | set(copy_ops)) - set(ops))
    return {"where": where, "m_bytes": m, "input_bytes": pr.get("input_bytes"), "output_bytes": pr.get("output_bytes"),
            "ref_by_request": ref_ops, "copy_by_request": copy_ops, "ref_peak_bytes": ref_peak,
            "ref_held_by_request": pr.get("device_held_bytes_by_request"),
            "copy_held_by_request": pc.get("device_held_bytes_by_request"),
            "copy_peak_bytes": copy_peak, "sum_bytes": ref_peak + copy_peak, "together_bytes": together,
            "sum_m": (ref_peak + copy_peak) / m if m else None, "together_m": together / m if m else None,
            "ops": ops, "verdict": (copy or {}).get("verdict"), "speedup": (copy or {}).get("speedup"),
            "speedup_ci": (copy or {}).get("speedup_ci"),
            "errors": [str(e)[:300] for k in (ref, copy) for e in ((k or {}).get("errors") or [])][:4]}


def _size(v) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= div:
            return f"{v / div:.2f} {unit}"
    return f"{v} B"


def _m(v, m) -> str:
    return f"{v / m:.2f}" if isinstance(v, (int, float)) and m else "-"


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'problem':<22} {'where':<6} {'M':>10} {'ref/M':>6} {'copy/M':>6} {'sum/M':>6} {'together/M':>10} "
             f"{'verdict':<10}"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        if r.get("m_bytes") is None:
            lines.append(f"{r['problem'][:22]:<22} {r.get('status')}: {r.get('error', '')}")
            continue
        m = r["m_bytes"]
        lines.append(f"{r['problem'][:22]:<22} {r['where']:<6} {_size(m):>10} {_m(r['ref_peak_bytes'], m):>6} "
                     f"{_m(r['copy_peak_bytes'], m):>6} {_m(r['sum_bytes'], m):>6} {_m(r['together_bytes'], m):>10} "
                     f"{str(r.get('verdict'))[:10]:<10}")
        if r.get("errors"):
            lines.append(f"    errors: {r['errors'][0][:200]}")
        per = ", ".join(f"{op} {_m(r['ref_by_request'].get(op), m)}/{_m(r['copy_by_request'].get(op), m)}"
                        for op in r["ops"])
        lines.append(f"    by request (ref/copy, M): {per}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    out_env = os.environ.get("OUT")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", metavar="NAMES", help="comma-separated problems or prefixes (kb023)")
    ap.add_argument("--problems-dir", type=Path, default=PROBLEMS)
    ap.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds allowed for one compare")
    ap.add_argument("--keep-sets-bytes", type=int, metavar="N",
                    help="MAGPIE_KEEP_SETS_BYTES for the workers (default: 1 on a CPU, the engine's 1/16 of the GPU)")
    ap.add_argument("--mmap-threshold", type=int, default=128 << 10, metavar="N",
                    help="MALLOC_MMAP_THRESHOLD_ of the workers on a CPU (default 131072)")
    ap.add_argument("--max-together", type=float, metavar="X", help="exit 1 if a problem's together/M is above X")
    ap.add_argument("--json", type=Path, default=Path(out_env) / "kernel_memory.json" if out_env else None)
    ap.add_argument("--results", type=Path, metavar="DIR",
                    help="keep each compare's workspace and stdout/stderr here (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    only = [n.strip() for item in (args.only or []) for n in item.split(",") if n.strip()] or None
    problems = find_problems(args.problems_dir, only)
    gpu = _has_gpu()
    if not gpu:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    keep = args.keep_sets_bytes if args.keep_sets_bytes is not None else (None if gpu else 1)
    if keep is not None:
        os.environ["MAGPIE_KEEP_SETS_BYTES"] = str(keep)
    root = args.results or Path(tempfile.mkdtemp(prefix="kernel_memory_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"{len(problems)} problem(s); KB_SCALE={os.environ.get('KB_SCALE', '1.0')}; "
          f"{'GPU' if gpu else 'CPU'}; keep_sets_bytes={keep}", flush=True)
    rows: list[dict] = []
    try:
        for name, yaml_path in problems:
            out_dir = root / name
            code, wall_s, timed_out = run_compare(yaml_path, out_dir, root / f"{name}", args.timeout, [])
            report, _, why = read_run_report(out_dir)
            row: dict = {"problem": name, "exit_code": code, "wall_s": round(wall_s, 1),
                         "status": "timeout" if timed_out else ("ok" if report else "no report")}
            if report is None:
                row["error"] = why
            else:
                row.update(measure(report))
            rows.append(row)
            print(f"  {name}: {row['status']}, {wall_s:.1f} s, verdict {row.get('verdict')}", flush=True)
    finally:
        if args.results is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"kb_scale": os.environ.get("KB_SCALE", "1.0"), "gpu": gpu,
                                         "keep_sets_bytes": keep, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                       time.gmtime()),
                                         "rows": rows}, indent=1))
    print(format_rows(rows), flush=True)
    ok = all(r["status"] == "ok" for r in rows)
    if args.max_together is not None:
        ok = ok and all((r.get("together_m") or 0) <= args.max_together for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
