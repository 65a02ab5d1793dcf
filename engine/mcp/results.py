"""Reading what runs wrote, for the result tools: run folders, their files, roofline rows and the
suggestions those rows support. Nothing here measures; every number comes from a report or a CSV
a run wrote, and says which."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Callable, Optional

from engine.errors import MagpieError
from engine.jobs import query as safeio  # the safe reads: a FIFO or a device is refused, never waited on
from engine.runs.schema import BENCHMARK_REPORT, REPORT_FILES

ROOFLINE_SUFFIX = "_kernel_roofline_simple.csv"
# Files a run folder offers as resources: reports, summaries, CSVs and configs, never logs of
# unbounded size or traces (large, binary).
RESOURCE_SUFFIXES = (".json", ".csv", ".txt", ".yaml", ".md")
MAX_RESOURCE_BYTES = 8 * 1024 * 1024


class ResultError(MagpieError):
    title = "result"


def read_json(path: Path) -> dict:
    try:
        data = safeio.read_json(path)  # a regular file under the report size cap: never a FIFO's wait
    except OSError as exc:
        raise ResultError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise ResultError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ResultError(f"{path}: expected a JSON object")
    return data


def report_in(run_dir: Path) -> Optional[Path]:
    for name in REPORT_FILES:
        if (run_dir / name).is_file():
            return run_dir / name
    return None


def run_files(run_dir: Path, limit: int = 500, inside: Optional[Callable[[Path], bool]] = None) -> list[str]:
    """The folder's files a client may read as resources, relative to the folder; with ``inside``,
    only those whose target (after links) it accepts."""
    out: list[str] = []
    for p in sorted(run_dir.rglob("*")):
        if p.is_file() and p.suffix in RESOURCE_SUFFIXES and not any(part.startswith(".") for part in
                                                                    p.relative_to(run_dir).parts):
            if inside is not None and not inside(p.resolve()):
                continue
            out.append(p.relative_to(run_dir).as_posix())
            if len(out) >= limit:
                break
    return out


def tracelens_files(run_dir: Path) -> dict[str, list[str]]:
    """Every TraceLens output of a run: the inference-mode stage folders under ``tracelens/`` and
    their compact roofline CSVs, and Magpie's legacy pytorch-mode folders."""
    def rel(paths: Any) -> list[str]:
        return sorted(p.relative_to(run_dir).as_posix() for p in paths if p.is_file())
    base = run_dir / "tracelens"
    stages = {}
    if base.is_dir():
        for d in sorted(p for p in base.iterdir() if p.is_dir()):
            stages[d.name] = rel(d.rglob("*.csv")) + rel(d.rglob("*.xlsx"))
    return {
        "roofline_simple_csvs": rel(base.glob(f"*{ROOFLINE_SUFFIX}")) if base.is_dir() else [],
        "stages": stages,  # type: ignore[dict-item]
        "rank0_csvs": rel((run_dir / "tracelens_rank0_csvs").glob("*.csv")),
        "collective_csvs": rel((run_dir / "tracelens_collective_csvs").glob("*.csv")),
    }


def benchmark_summary(run_dir: Path, read: Callable[[Path], dict] = read_json) -> dict:
    """One row of list_benchmark_results (Magpie's keys); ``read`` reads the report (the server's
    confined reader)."""
    path = run_dir / BENCHMARK_REPORT
    report = read(path) if path.is_file() else {}
    tl = tracelens_files(run_dir)
    return {
        "workspace": str(run_dir), "job_id": run_dir.name, "framework": report.get("framework"),
        "model": report.get("model"), "timestamp": report.get("execution_time", {}).get("start")
        if isinstance(report.get("execution_time"), dict) else None,
        "state": report.get("state"), "success": report.get("success"), "run_kind": report.get("run_kind"),
        "throughput": report.get("throughput"), "latency": report.get("latency"),
        "top_bottlenecks": (report.get("top_bottlenecks") or [])[:5], "errors": report.get("errors") or [],
        "has_torch_trace": (run_dir / "torch_trace").is_dir(),
        "has_tracelens": bool(tl["roofline_simple_csvs"] or tl["stages"] or tl["rank0_csvs"]),
        "has_report": path.is_file(),
    }


def _num(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def roofline_rows(run_dir: Path, stage: Optional[str] = None,
                  check: Optional[Callable[[Path, str], Path]] = None) -> list[dict]:
    """The rows of the run's compact roofline CSVs (TraceLens ``*_kernel_roofline_simple.csv``),
    each with its stage and file, largest kernel time first. ``check(path, what)`` vets each file
    before it is read (the server's confinement)."""
    base = run_dir / "tracelens"
    files = sorted(base.glob(f"*{ROOFLINE_SUFFIX}")) if base.is_dir() else []
    rows: list[dict] = []
    for f in files:
        file_stage = f.name.split("_ISL")[0]
        if stage and file_stage != stage:
            continue
        if check is not None:
            check(f, f"tracelens/{f.name}")
        if not safeio.is_regular_file(f):
            continue  # a FIFO or a device under a CSV's name: never opened
        with open(f, newline="") as fh:
            for row in csv.DictReader(fh):
                rows.append({"stage": file_stage, "file": f.relative_to(run_dir).as_posix(), **row})
    rows.sort(key=lambda r: _num(r.get("kernel_time_ms_sum")) or 0.0, reverse=True)
    return rows


HEADROOM_NOTE = ("potential_gain_pct = time_pct x (1 - pct_roofline/100): the stage time saved if this op "
                  "reached its roofline; an upper bound, not a prediction")


def suggest_from_roofline(rows: list[dict], top: int) -> list[dict]:
    """One suggestion per op, from its measured roofline bound and % of roofline and its time share."""
    out = []
    for row in rows[:top]:
        share = _num(row.get("time_pct"))
        pct = _num(row.get("pct_roofline_mean"))
        bound = (row.get("roofline_bound") or "").upper()
        evidence = {k: row.get(k) for k in ("stage", "file", "op_name", "param_signature", "kernel_time_ms_sum",
                                             "time_pct", "roofline_bound", "pct_roofline_mean",
                                             "arithmetic_intensity_flops_per_byte", "achieved_tflops_mean",
                                             "achieved_tbps_mean", "has_perf_model")}
        item: dict[str, Any] = {"op": row.get("op_name"), "stage": row.get("stage"), "evidence": evidence}
        if str(row.get("has_perf_model")).lower() != "true" or pct is None:
            item.update(category="measure", suggestion="no roofline model for this op: measure it in isolation "
                        "(analyze with a harness built from the trace shapes) before choosing a change")
        elif bound.startswith("MEMORY"):
            if pct < 50:
                item.update(category="memory", suggestion=f"memory-bound at {pct:.1f}% of the bandwidth roofline: "
                            "the bytes it moves are not streaming at full bandwidth; look at coalescing, vector "
                            "widths and occupancy, or fuse it with neighbours so fewer bytes move")
            else:
                item.update(category="memory", suggestion=f"memory-bound at {pct:.1f}% of the bandwidth roofline: "
                            "close to the roof, only moving fewer bytes helps (fusion, narrower storage dtypes)")
        elif bound.startswith("COMPUTE"):
            if pct < 50:
                item.update(category="compute", suggestion=f"compute-bound at {pct:.1f}% of the compute roofline: "
                            "the matrix units are under-used; look at tile shapes, the dtype path onto "
                            "tensor/matrix cores and the library's tuned configs for this shape")
            else:
                item.update(category="compute", suggestion=f"compute-bound at {pct:.1f}% of the compute roofline: "
                            "close to the roof, only fewer FLOPs (algorithm) or a faster dtype helps")
        else:
            item.update(category="measure", suggestion=f"roofline bound {bound or 'unknown'}: no rule applies")
        if share is not None and pct is not None:
            item["potential_gain_pct"] = round(share * max(0.0, 1.0 - pct / 100.0), 2)
        item["time_pct"] = share
        out.append(item)
    out.sort(key=lambda s: (s.get("potential_gain_pct") is None, -(s.get("potential_gain_pct") or 0.0)))
    return out


def suggest_from_gaps(report: dict) -> list[dict]:
    """From the gap analysis: the largest kernels by share, and GPU idle that waits on the host."""
    gap = report.get("gap_analysis") if isinstance(report.get("gap_analysis"), dict) else {}
    out: list[dict] = []
    for rank, idle in (gap.get("idle") or {}).items():
        pct = _num(idle.get("host_bound_idle_pct"))
        if pct is not None and pct >= 30 and (_num(idle.get("total_idle_us")) or 0) > 0:
            out.append({"category": "launch", "rank": rank, "evidence": idle,
                        "suggestion": f"rank {rank}: {pct:.1f}% of GPU idle time waits for a launch from the host: "
                                      "fewer, larger launches (CUDA/HIP graphs, fusion) or less host work per step"})
    for k in (gap.get("top_kernels") or [])[:3]:
        share = _num(k.get("% Total"))
        if share is not None and share >= 10:
            out.append({"category": "hotspot", "kernel": k.get("Name"), "evidence": k,
                        "suggestion": f"{share:.1f}% of GPU kernel time in the window: map it to source "
                                      "(gap_analysis with find_kernel_sources) and analyze it"})
    return out


def suggest_from_kernel_result(result: dict) -> dict:
    """For one analyze result object: only what its measured fields support."""
    perf = result.get("performance_result") or {}
    if result.get("performance_state") != "SUCCESS":
        raise ResultError(f"performance_state is {result.get('performance_state')!r}: there is no measurement "
                          "to base a suggestion on", hint="run analyze with check_performance=true first")
    notes = []
    floor = perf.get("hardware_floor") if isinstance(perf, dict) else None
    if isinstance(floor, dict) and floor:
        notes.append({"category": "floor", "evidence": floor,
                      "suggestion": "compare the median with the hardware floor: the gap is the headroom"})
    return {"kernel_id": result.get("kernel_id"), "suggestions": notes,
            "note": None if notes else "this result carries no roofline figures (bound, % of roofline); "
                                       "profile the workload (benchmark with tracelens, or gap_analysis on a trace) "
                                       "and call suggest_optimizations with that workspace"}

