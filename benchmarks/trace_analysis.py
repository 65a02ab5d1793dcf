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
    python benchmarks/trace_analysis.py --shape serving --sizes 1400000 --write /tmp/serving.json.gz
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


# A serving step as the built-in server records it (torch.profiler with record_shapes and
# with_stack): per op a Python stack, the site's record_function span, the aten call chain, the
# launch, the kernel and its flow pair; the GPU waits on the host between kernels (host-bound).
_SRC, _SITE = "/home/user/magpie/engine/serve/", "/home/user/.venv/lib/python3.12/site-packages/torch/"
_PY_STACK = [f"{_SRC}engine.py(402): step", f"{_SRC}engine.py(611): _run_batch", f"{_SRC}model.py(323): decode",
             f"{_SITE}utils/_contextlib.py(120): decorate_context", f"{_SRC}model.py(311): _finish_layer",
             f"{_SRC}model.py(85): __call__", f"{_SITE}nn/modules/module.py(1773): _wrapped_call_impl",
             f"{_SITE}nn/modules/module.py(1784): _call_impl", f"{_SITE}nn/functional.py(2929): rms_norm",
             "<built-in method rms_norm of type object at 0x7f3a2c1b9e40>"]


def _step_annotation(n_gen: int, ctx: int) -> str:
    return (f"execute_{n_gen}_context_0(sq0sk0sqsq0sqsk0)_generation_{n_gen}"
            f"(sq{n_gen}sk{n_gen * ctx}sqsq{n_gen}sqsk{n_gen * ctx})")


def make_serving_trace(n_events: int, path: Path, layers: int = 120) -> int:
    """Write a synthetic LLM serving trace of about ``n_events`` events, shaped like the built-in
    server's profiled run: vLLM step annotations (so the analysis splits it into stages), Python
    stacks (``python_function`` events, each with its own ids), ``record_function`` spans, aten
    ops with shapes, launches, kernels with correlation ids and ac2g flows, a sampled-token copy
    and a synchronize per step. About 17 events a kernel and 1,080 kernels a step, as in the real
    trace of the built-in server (1.4 M events, 64 steps)."""
    pid, tid = 4242, 4242
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "thread 4242 (python3)"}},
    ]
    t = 6_712_345_678_901.0
    gpu_free = t
    corr = ext = py_id = 1
    step = 0

    def x(cat: str, name: str, ts: float, dur: float, args: dict, p: int = pid, th: int = tid) -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": p, "tid": th, "ts": round(ts, 3),
                       "dur": round(dur, 3), "args": args})

    while len(events) < n_events:
        batch = 1 + step % 32 if step else 8
        ctx = 512 + step
        step_start = t
        step_events_at = len(events)
        events.append({})  # the step annotation, filled in at the step's end
        ext += 1
        for layer in range(layers):
            for chain, kname, dims, types, kdur in _LAYER:
                op_start = t
                n_ops = len(chain)
                op_us = 22.0 + 3.0 * n_ops
                parent = 0
                for depth, frame in enumerate(_PY_STACK):  # nested Python frames around the op
                    x("python_function", frame, op_start + depth * 0.1, op_us + 4.0 - depth * 0.2,
                      {"Python parent id": parent, "Python id": py_id, "Python thread": 0})
                    parent, py_id = py_id, py_id + 1
                x("user_annotation", f"magpie_site::engine/serve/model.py:{300 + layer % 7} {chain[0]} in decode",
                  op_start + 1.2, op_us, {"External id": ext, "Record function id": 0, "Ev Idx": ext})
                ext += 1
                for i, op in enumerate(chain):
                    d = [[batch, *dd[1:]] if dd and j == 0 else dd for j, dd in enumerate(dims)]
                    x("cpu_op", op, op_start + 1.5 + i, op_us - 2.0 - 2.0 * i,
                      {"External id": ext, "Record function id": 0, "Ev Idx": ext, "Input Dims": d,
                       "Input type": types, "Input Strides": [[dd[-1], 1] if len(dd) == 2 else [1] * len(dd) for dd in d],
                       "Concrete Inputs": [""] * len(d)})
                    ext += 1
                launch = op_start + 1.5 + n_ops + 2.0
                x("cuda_runtime", "cudaLaunchKernel", launch, 5.5,
                  {"External id": ext - 1, "cbid": 211, "correlation": corr})
                gpu_ts = max(gpu_free, launch + 4.0)
                events.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": round(launch, 3), "cat": "ac2g",
                               "name": "ac2g"})
                x("kernel", kname, gpu_ts, kdur * (0.5 + batch / 32),
                  {"External id": ext - 1, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": corr,
                   "registers per thread": 32, "shared memory": 0, "blocks per SM": 1.0, "warps per SM": 4.0,
                   "grid": [132, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 0}, p=0, th=7)
                events.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": round(gpu_ts, 3), "cat": "ac2g",
                               "name": "ac2g", "bp": "e"})
                gpu_free = gpu_ts + kdur * (0.5 + batch / 32) + 1.0
                corr += 1
                t = op_start + op_us + 6.0
        # the sampled tokens back to the host: a copy and a synchronize
        x("cpu_op", "aten::copy_", t, 30.0, {"External id": ext, "Record function id": 0, "Ev Idx": ext,
                                             "Input Dims": [[batch], [batch], []], "Input type": ["long int"] * 2 + ["Scalar"],
                                             "Input Strides": [[1], [1], []], "Concrete Inputs": ["", "", "False"]})
        x("cuda_runtime", "cudaMemcpyAsync", t + 1.0, 6.0, {"External id": ext, "cbid": 41, "correlation": corr})
        gpu_ts = max(gpu_free, t + 5.0)
        events.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": round(t + 1.0, 3), "cat": "ac2g", "name": "ac2g"})
        x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", gpu_ts, 2.0,
          {"External id": ext, "device": 0, "context": 1, "stream": 7, "correlation": corr, "bytes": 8 * batch,
           "memory bandwidth (GB/s)": 1.0}, p=0, th=7)
        events.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": round(gpu_ts, 3), "cat": "ac2g", "name": "ac2g",
                       "bp": "e"})
        corr += 1
        ext += 1
        sync_end = max(gpu_ts + 2.0, t + 8.0) + 1.0
        x("cuda_runtime", "cudaStreamSynchronize", t + 8.0, sync_end - t - 8.0,
          {"External id": ext, "cbid": 131, "correlation": corr})
        corr += 1
        t = sync_end + 200.0  # the scheduler between steps
        events[step_events_at] = {"ph": "X", "cat": "user_annotation", "name": _step_annotation(batch, ctx), "pid": pid,
                                  "tid": tid, "ts": round(step_start - 1.0, 3), "dur": round(t - 150.0 - step_start, 3),
                                  "args": {"External id": ext, "Record function id": 0, "Ev Idx": ext}}
        step += 1
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": events}
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
    ap.add_argument("--shape", choices=("forward", "serving"), default="forward",
                    help="synthetic traces: a forward's ops and kernels (default), or a serving run's steps with "
                         "Python stacks and step annotations (make_serving_trace)")
    ap.add_argument("--write", type=Path, metavar="PATH",
                    help="only write one synthetic trace of --sizes' first size to PATH (.json.gz), and stop")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    make = make_serving_trace if args.shape == "serving" else make_trace
    if args.write:
        print(f"{make(args.sizes[0], args.write)} events -> {args.write}")
        return 0
    if args.child:
        print(json.dumps(analyse(args.child)))
        return 0
    results = []
    with tempfile.TemporaryDirectory() as d:
        for n in args.sizes:
            path = Path(d) / f"synthetic_{n}.pt.trace.json.gz"
            make(n, path)
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
