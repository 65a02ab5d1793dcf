"""GPU validation of analyze/compare, run on an NVIDIA GPU (the lent H200):

1. ``magpie --gpu-info``;
2. the CUDA vector_add examples analysed and compared (ncu backend);
3. the Triton examples (vector_add, softmax) and the PyTorch RMSNorm analysed/compared (harness, CUDA events);
4. the softmax compare run three times: same verdicts? CV of each median?

The harness against ncu is ``benchmarks/gpu_timing_vs_ncu.py``; verdicts on identical and cheating
kernels ``benchmarks/gpu_verdicts.py``; KernelBench ties ``benchmarks/gpu_kernelbench_ties.py``.

Usage (from the repository root):  python benchmarks/gpu_validation.py OUT_DIR [--graph]
(--graph: only the softmax compare with CUDA-graph replay)
Prints a short table last and writes OUT_DIR/validation.json; the workspaces stay in OUT_DIR/results.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
EX = REPO / "examples" / "kernels"


def magpie(*args: str, out: Path, timeout: int = 600) -> tuple[int, dict | None, str]:
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "engine.cli", *args, "-o", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    new = sorted(set(out.iterdir()) - before)
    report = None
    for ws in new:
        for name in ("compare_report.json", "analyze_report.json"):
            if (ws / name).exists():
                report = json.loads((ws / name).read_text())
    print(f"$ magpie {' '.join(args)}  -> rc={p.returncode} in {time.monotonic() - t:.1f}s", flush=True)
    print(p.stdout[-3000:], p.stderr[-2000:], flush=True)
    return p.returncode, report, p.stdout


def rows_of(report: dict | None) -> list[dict]:
    if report is None:
        return []
    res = report["results"]
    return res["kernel_results"] if isinstance(res, dict) else res


def brief(report: dict | None) -> list[dict]:
    out = []
    for k in rows_of(report):
        t = k.get("timing") or {}
        out.append({"id": k["kernel_id"], "correct": k["correctness_state"], "perf": k["performance_state"],
                    "backend": (k.get("performance_result") or {}).get("backend"),
                    "median_ms": t.get("median"), "cv": t.get("cv"), "n": t.get("n"),
                    "speedup": k.get("speedup"), "ci": k.get("speedup_ci"), "verdict": k.get("verdict"),
                    "errors": [e.splitlines()[0] for e in k.get("errors", [])][:2]})
    return out


def graph_checks(out: Path) -> int:
    """CUDA-graph replay: the softmax compare with performance.cuda_graph."""
    cfg = out / "softmax_compare_graph.yaml"
    out.mkdir(parents=True, exist_ok=True)
    folder = EX / "softmax_triton"
    cfg.write_text((folder / "compare.yaml").read_text().replace("source_files: [", f"source_files: [{folder}/")
                   + "performance:\n  cuda_graph: true\n")
    rc, report, _ = magpie("compare", "-k", str(cfg), out=out / "results" / "softmax_compare_graph")
    print("\n=== table ===")
    for k in brief(report):
        ci = k["ci"] or [None, None]
        print(f"graph compare rc={rc} {k['id']:12} {k['correct']:8} {k['backend']:28} "
              f"median={k['median_ms']} cv={k['cv']} n={k['n']} speedup={k['speedup']} ci={ci} {k['verdict']}")
    (out / "graph.json").write_text(json.dumps({"compare": brief(report)}, indent=1))
    return 0


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_validation_out").resolve()
    if len(sys.argv) > 2 and sys.argv[2] == "--graph":
        return graph_checks(out)
    res_dir = out / "results"
    summary: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": {}}
    p = subprocess.run([sys.executable, "-m", "engine.cli", "--gpu-info"], cwd=REPO, capture_output=True, text=True)
    print(p.stdout, flush=True)
    summary["gpu_info"] = p.stdout

    steps = {
        "cuda_analyze": ["analyze", "-k", str(EX / "vector_add/cuda/analyze.yaml")],
        "cuda_compare": ["compare", "-k", str(EX / "vector_add/cuda/compare.yaml")],
        "triton_vecadd_analyze": ["analyze", "-k", str(EX / "vector_add/triton/analyze.yaml")],
        "triton_vecadd_compare": ["compare", "-k", str(EX / "vector_add/triton/compare.yaml")],
        "softmax_analyze": ["analyze", "-k", str(EX / "softmax_triton/analyze.yaml")],
        "rmsnorm_compare": ["compare", "-k", str(EX / "rmsnorm_pytorch/compare.yaml")],
    }
    for name, args in steps.items():
        rc, report, _ = magpie(*args, out=res_dir / name)
        summary["steps"][name] = {"rc": rc, "kernels": brief(report)}

    repeats = []
    for i in range(3):
        rc, report, _ = magpie("compare", "-k", str(EX / "softmax_triton/compare.yaml"), out=res_dir / f"softmax_compare_{i}")
        repeats.append({"rc": rc, "kernels": brief(report)})
    summary["softmax_compare_x3"] = repeats
    (out / "validation.json").write_text(json.dumps(summary, indent=1, default=str))

    print("\n=== table ===")
    print(f"{'step':24} {'rc':>3} {'kernel':18} {'correct':8} {'backend':22} {'median':>10} {'CV':>6} {'n':>5} "
          f"{'speedup [CI]':>22} verdict")
    def line(step, rc, k):
        ci = k["ci"]
        sp = f"{k['speedup']:.4g} [{ci[0]:.4g},{ci[1]:.4g}]" if k.get("speedup") is not None and ci else "-"
        med = f"{k['median_ms'] * 1e3:.1f}us" if k.get("median_ms") is not None else "-"
        cv = f"{k['cv'] * 100:.2f}%" if k.get("cv") is not None else "-"
        print(f"{step:24} {rc:>3} {k['id'][:18]:18} {k['correct']:8} {str(k['backend'])[:22]:22} {med:>10} {cv:>6} "
              f"{str(k['n']):>5} {sp:>22} {k['verdict'] or ''}")
    for name, st in summary["steps"].items():
        for k in st["kernels"]:
            line(name, st["rc"], k)
    for i, st in enumerate(repeats):
        for k in st["kernels"]:
            line(f"softmax_compare_{i}", st["rc"], k)
    verdicts = [[k["verdict"] for k in r["kernels"]] for r in repeats]
    print("softmax verdicts x3:", verdicts, "same:", all(v == verdicts[0] for v in verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
