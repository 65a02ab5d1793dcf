"""Trace-analysis speed and memory.

For each size, a synthetic torch-profiler trace shaped like an LLM forward on a GPU (cpu_op ->
cudaLaunchKernel -> kernel with ac2g flows, GEMMs / norms / elementwise / attention, Input Dims
recorded) is written to disk, then analysed in a FRESH process (so peak RSS is that run's):
load + event tree + gap analysis + GPU idle analysis + GPU timeline + the self-checks and the
idle gaps by cause + the pytorch-mode report with roofline (H200 arch). It prints events/s and
peak RSS per size; cost should grow linearly.
"base MB" is the process's RSS just before the load (Python, the modules: the same for every
trace), so "peak - base" is what the analysis itself held at its peak.

    python benchmarks/trace_analysis.py                       # 10k .. 2M events
    python benchmarks/trace_analysis.py --sizes 10000 150000
    python benchmarks/trace_analysis.py --trace path/to/real.pt.trace.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (cpu op chain, kernel name, Input Dims of the leaf op, Input type, kernel µs)
_LAYER = [
    (["aten::_fused_rms_norm"], "void at::native::(anonymous namespace)::rms_norm_kernel<c10::BFloat16>",
     [[16, 4096], [4096], [4096], []], ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar"], 6.0),
    (["aten::linear", "aten::mm"], "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
     [[16, 4096], [4096, 6144]], ["c10::BFloat16", "c10::BFloat16"], 21.0),
    (["vllm::unified_attention_with_output"], "kernel_unified_attention_2d",
     [[16, 32, 128], [16, 8, 128], [16, 8, 128], [16, 32, 128]], ["c10::BFloat16"] * 4, 14.0),
    (["aten::linear", "aten::mm"], "nvjet_sm90_tst_128x128_64x4_2x1_h_bz_NNT",
     [[16, 4096], [4096, 4096]], ["c10::BFloat16", "c10::BFloat16"], 15.0),
    (["aten::add"], "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
     [[16, 4096], [16, 4096], []], ["c10::BFloat16", "c10::BFloat16", "Scalar"], 2.5),
    (["aten::linear", "aten::mm"], "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
     [[16, 4096], [4096, 28672]], ["c10::BFloat16", "c10::BFloat16"], 70.0),
    (["aten::silu"], "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>",
     [[16, 14336]], ["c10::BFloat16"], 3.0),
    (["aten::mul"], "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16> >",
     [[16, 14336], [16, 14336]], ["c10::BFloat16", "c10::BFloat16"], 3.0),
    (["aten::linear", "aten::mm"], "nvjet_sm90_tst_128x128_64x4_2x1_h_bz_NNT",
     [[16, 14336], [14336, 4096]], ["c10::BFloat16", "c10::BFloat16"], 36.0),
]


def make_trace(n_events: int, path: Path) -> int:
    """Write a synthetic trace with about ``n_events`` events; returns the exact count."""
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1000, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 1000, "tid": 1000, "args": {"name": "thread 1000 (python3)"}},
    ]
    cpu_t, gpu_t = 1_000_000.0, 1_000_050.0
    corr = ext = 1
    while len(events) < n_events:
        for chain, kname, dims, types, kdur in _LAYER:
            start = cpu_t
            depth = len(chain)
            for i, op in enumerate(chain):
                leaf = i == depth - 1
                args = {"External id": ext, "Record function id": 0}
                if leaf or op != "aten::linear":
                    args.update({"Input Dims": dims, "Input type": types,
                                 "Input Strides": [[d[-1], 1] if len(d) == 2 else [1] * len(d) for d in dims],
                                 "Concrete Inputs": [""] * len(dims)})
                events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1000, "tid": 1000,
                               "ts": start + i * 1.0, "dur": 12.0 - i * 2.0, "args": args})
                ext += 1
            launch_ts = start + depth * 1.0 + 1.0
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1000, "tid": 1000,
                           "ts": launch_ts, "dur": 4.0, "args": {"External id": ext - 1, "cbid": 211,
                                                               "correlation": corr}})
            gpu_t = max(gpu_t, launch_ts + 5.0)
            events.append({"ph": "s", "id": corr, "pid": 1000, "tid": 1000, "ts": launch_ts, "cat": "ac2g",
                           "name": "ac2g"})
            events.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": gpu_t, "dur": kdur,
                           "args": {"External id": ext - 1, "device": 0, "stream": 7, "correlation": corr,
                                    "grid": [132, 1, 1], "block": [128, 1, 1]}})
            events.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": gpu_t, "cat": "ac2g", "name": "ac2g",
                           "bp": "e"})
            gpu_t += kdur + 1.5
            corr += 1
            cpu_t = start + 14.0
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": events}
    with gzip.open(path, "wt", compresslevel=1) as fh:
        json.dump(doc, fh)
    return len(events)


def analyse(path: Path) -> dict:
    """The full analysis of one trace, timed; run in a fresh process."""
    from engine.runs.workspace import Workspace
    from engine.trace.arch import resolve_arch
    from engine.trace.checks import run_checks
    from engine.trace.graphs import graph_replays
    from engine.trace.idle_causes import classify_idle_gaps
    from engine.trace.csvout import write_csvs
    from engine.trace.gaps import aggregate_kernels, gap_rows, idle_analysis, trace_window
    from engine.trace.load import load_trace, peak_rss_mb
    from engine.trace.report import pytorch_report
    from engine.trace.timeline import gpu_timeline
    from engine.trace.tree import build_tree
    import gc
    times = {}
    base_rss = _rss_mb()
    t = time.perf_counter()
    trace = load_trace(path)
    times["load"] = time.perf_counter() - t
    t = time.perf_counter()
    gc.disable()
    tree = build_tree(trace)
    gc.enable()
    times["tree"] = time.perf_counter() - t
    t = time.perf_counter()
    window = trace_window(trace)
    aggs = aggregate_kernels(trace, window)
    gap_rows(aggs, 20)
    idle = idle_analysis(tree, window)
    timeline = gpu_timeline(tree.linked_gpu_events)
    times["gap+idle+timeline"] = time.perf_counter() - t
    t = time.perf_counter()
    graphs = graph_replays(tree, window.lo, window.hi)
    with tempfile.TemporaryDirectory() as d, open(Path(d) / "causes.csv", "w", newline="") as fh:
        classify_idle_gaps(tree, idle, window.lo, window.hi, graphs, out=fh)
    run_checks(0, tree, window.lo, window.hi, aggs, idle, [], graphs, categories=("kernel", "gpu"),
               ignore=("gpu_user_annotation", "user_annotation"), min_duration_us=0.0, timeline_rows=timeline,
               whole=True)
    times["checks+idle causes"] = time.perf_counter() - t
    del aggs, idle, timeline, graphs  # as before the checks: the report below runs without them
    t = time.perf_counter()
    tables = pytorch_report(tree, resolve_arch("H200", trace))
    with tempfile.TemporaryDirectory() as d:
        write_csvs(tables, Path(d))
    times["pytorch report"] = time.perf_counter() - t
    n_kernels = sum(1 for k in trace.kind if trace.kinds[k][1] == "kernel")
    _ = Workspace  # imported for parity with the CLI's import cost
    return {"events": len(trace.events), "kernels": n_kernels, "times": times,
            "total_s": sum(times.values()), "peak_rss_mb": peak_rss_mb(), "base_rss_mb": base_rss}


def _rss_mb() -> float:
    """Current resident memory (VmRSS) in MiB; 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _uncompressed_mb(path: Path) -> float:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as fh:
        n = 0
        while chunk := fh.read(1 << 24):
            n += len(chunk)
    return n / (1 << 20)


def _run_child(path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 50_000, 150_000, 500_000, 2_000_000])
    ap.add_argument("--trace", type=Path, action="append", default=[], help="also analyse this real trace")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(analyse(args.child)))
        return 0
    results = []
    with tempfile.TemporaryDirectory() as d:
        for n in args.sizes:
            path = Path(d) / f"synthetic_{n}.pt.trace.json.gz"
            make_trace(n, path)
            r = _run_child(path)
            r.update(label=f"synthetic {n}", json_mb=_uncompressed_mb(path))
            results.append(r)
            path.unlink()
    for p in args.trace:
        r = _run_child(p)
        r.update(label=p.name, json_mb=_uncompressed_mb(p))
        results.append(r)
    print(f"\n{'trace':42} {'events':>9} {'kernels':>8} {'JSON MB':>8} {'total s':>8} {'events/s':>10} "
          f"{'peak RSS MB':>11} {'RSS/JSON':>8} {'base MB':>8}  breakdown (s)")
    for r in results:
        br = ", ".join(f"{k} {v:.2f}" for k, v in r["times"].items())
        print(f"{r['label'][:42]:42} {r['events']:>9} {r['kernels']:>8} {r['json_mb']:>8.1f} {r['total_s']:>8.2f} "
              f"{r['events'] / r['total_s']:>10.0f} {r['peak_rss_mb']:>11.0f} {r['peak_rss_mb'] / r['json_mb']:>8.2f} "
              f"{r['base_rss_mb']:>8.0f}  {br}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
