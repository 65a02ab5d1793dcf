"""GPU validation of analyze/compare, run on an NVIDIA GPU (the lent H200):

1. ``magpie --gpu-info``;
2. the CUDA vector_add examples analysed and compared (ncu backend);
3. the Triton examples (vector_add, softmax) and the PyTorch RMSNorm analysed/compared (harness, CUDA events);
4. harness vs ncu: the harness's median for the Triton vector_add (2^26 floats) against the
   median ``gpu__time_duration`` that ncu reports for the same kernel's launches, run by the
   same harness spec under ncu;
5. the softmax compare run three times: same verdicts? CV of each median?

Usage (from the repository root):  python benchmarks/gpu_validation.py OUT_DIR [--graph]
(--graph: only the CUDA-graph replay checks)
Prints a short table last and writes OUT_DIR/validation.json; the workspaces stay in OUT_DIR/results.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
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


def harness_vs_ncu(work: Path, cuda_graph: bool = False) -> dict:
    """Same spec, two runs: plain (CUDA events) and under ncu (gpu__time_duration per launch)."""
    from engine.kernels.profilers.ncu import build_ncu_command, parse_ncu_csv
    work.mkdir(parents=True, exist_ok=True)
    folder = EX / "vector_add" / "triton"
    spec = {"module": str(folder / "vector_add.py"), "model_class": None, "get_inputs_func": "get_inputs",
            "get_init_inputs_func": "get_init_inputs", "seeds": [0], "rtol": None, "atol": None,
            "reference": {"module": str(folder / "reference.py"), "model_class": "Model",
                          "get_inputs_func": "get_inputs", "get_init_inputs_func": "get_init_inputs"},
            "timing": {"enabled": True, "repeats": 200, "warmup": 20, "l2_flush": True, "cuda_graph": cuda_graph}}
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{folder}:{os.environ.get('PYTHONPATH', '')}")
    results = {}
    for name in ("plain", "ncu"):
        s = dict(spec, result=str(work / f"{name}.result.json"))
        sp = work / f"{name}.spec.json"
        sp.write_text(json.dumps(s))
        argv = [sys.executable, "-m", "engine.kernels.harness", str(sp)]
        if name == "ncu":
            ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
            argv = build_ncu_command(ncu, argv, work / "ncu.csv", kernel_name="regex:add_kernel")
        p = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=540)
        print(f"harness {name}: rc={p.returncode}", p.stderr[-1500:], flush=True)
        results[name] = json.loads(Path(s["result"]).read_text()) if Path(s["result"]).exists() else {}
    t = results["plain"].get("timing") or {}
    harness_median = statistics.median(t["samples_ms"]) if t.get("samples_ms") else None
    launches = parse_ncu_csv((work / "ncu.csv").read_text()) if (work / "ncu.csv").exists() else []
    durations = [x.duration_ns / 1e6 for x in launches if "add_kernel" in x.name]
    ncu_median = statistics.median(durations) if durations else None
    diff = (harness_median / ncu_median - 1.0) if harness_median and ncu_median else None
    return {"kernel": "triton add_kernel, 2^26 fp32", "harness_median_ms": harness_median,
            "harness_backend": t.get("backend"), "harness_n": len(t.get("samples_ms") or []),
            "ncu_median_ms": ncu_median, "ncu_launches": len(durations), "relative_difference": diff}


def graph_checks(out: Path) -> int:
    """CUDA-graph replay: the softmax compare with performance.cuda_graph, and harness vs ncu."""
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
    h = harness_vs_ncu(out / "harness_vs_ncu_graph", cuda_graph=True)
    print(json.dumps(h))
    (out / "graph.json").write_text(json.dumps({"compare": brief(report), "harness_vs_ncu": h}, indent=1))
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
    try:
        summary["harness_vs_ncu"] = harness_vs_ncu(out / "harness_vs_ncu")
    except Exception as exc:  # keep the rest of the results
        summary["harness_vs_ncu"] = {"kernel": "triton add_kernel", "error": repr(exc), "harness_median_ms": None,
                                     "harness_backend": None, "harness_n": 0, "ncu_median_ms": None,
                                     "ncu_launches": 0, "relative_difference": None}
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
    h = summary["harness_vs_ncu"]
    print(f"harness vs ncu ({h['kernel']}): harness {h['harness_median_ms']} ms ({h['harness_backend']}, "
          f"n={h['harness_n']}), ncu {h['ncu_median_ms']} ms over {h['ncu_launches']} launches, "
          f"difference {h['relative_difference']}")
    verdicts = [[k["verdict"] for k in r["kernels"]] for r in repeats]
    print("softmax verdicts x3:", verdicts, "same:", all(v == verdicts[0] for v in verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
