"""The SM clock during a real compare's timing rounds, on a GPU (engine.kernels.sm_clock).

1. Prices one clock read of every reader that works here (NVML, nvidia-smi, amd-smi, rocm-smi)
   on the GPU torch calls device 0: the median and 90th percentile over many reads.
2. Runs a small CUDA compare in this process (a bf16 matmul against itself: it must tie) and prints
   each kernel's clock readings during its rounds (source, readings, median, min, max, rated,
   slowdown reasons, per-round medians), the flags, and the verdict lines.

    python3 benchmarks/gpu_clock_check.py [--size 4096] [--simulate-drop-after N] [--json PATH]

``--simulate-drop-after N`` wraps the real reader: after N reads it reports the clock 12% lower
under a SW thermal slowdown, to see the short rounds and cool-downs on the real machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.kernels import sm_clock  # noqa: E402
from engine.kernels.sm_clock import (ClockReading, LibNvml, NvmlReader, ToolReader, load_nvml, nvidia_smi_argv,  # noqa: E402
                                     parse_amd_clocks, parse_nvidia_clocks, parse_rocm_smi_clocks)

KERNEL = """\
import torch

N = {size}


class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(N, N, dtype=torch.bfloat16), torch.randn(N, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
"""


def this_device() -> tuple[dict, dict]:
    """Device 0 as the worker describes it in its load reply."""
    import torch
    props = torch.cuda.get_device_properties(0)
    dev = {"type": "cuda", "index": 0, "name": props.name,
           "uuid": str(props.uuid) if getattr(props, "uuid", None) is not None else None}
    if getattr(props, "pci_bus_id", None) is not None:
        dev["pci_bus_id"] = (f"{int(getattr(props, 'pci_domain_id', 0) or 0):04x}:{int(props.pci_bus_id):02x}:"
                             f"{int(getattr(props, 'pci_device_id', 0) or 0):02x}.0")
    return dev, {"hip": torch.version.hip, "cuda": torch.version.cuda}


def price(reader, n: int) -> dict:
    costs, last = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        last = reader.read()
        costs.append(time.perf_counter() - t0)
    costs.sort()
    return {"source": reader.source, "gpu": reader.gpu, "reads": n, "median_ms": statistics.median(costs) * 1e3,
            "p90_ms": costs[int(0.9 * (n - 1))] * 1e3, "last": vars(last) if last else None}


def readers(dev: dict, versions: dict) -> list:
    """Every reader that opens here, NVML first."""
    vendor = "amd" if versions.get("hip") else "nvidia"
    ids = sm_clock.device_ids(dev, os.environ, vendor)
    out = []
    if vendor == "nvidia":
        for name, make in (("pynvml", load_nvml), ("libnvidia-ml (ctypes)", LibNvml)):
            try:
                nvml = make()
                if name == "pynvml" and isinstance(nvml, LibNvml):
                    continue  # no pynvml here: load_nvml fell back to the ctypes path
                h = nvml.nvmlDeviceGetHandleByUUID(ids[0]) if ids[0].startswith("GPU-") else \
                    nvml.nvmlDeviceGetHandleByIndex(0)
                r = NvmlReader(nvml, h, ids[0])
                r.source = f"NVML via {name}"
                out.append(r)
            except Exception as exc:
                print(f"  {name}: not available ({exc})")
        smi = sm_clock.find_tool("nvidia-smi")
        if smi:
            for field in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
                out.append(ToolReader(f"nvidia-smi ({field})", nvidia_smi_argv(smi, ids[0], field),
                                      parse_nvidia_clocks, ids[0]))
    else:
        amd = sm_clock.find_tool("amd-smi")
        if amd:
            out.append(ToolReader("amd-smi", [amd, "metric", "--temperature", "--clock", "--power", "--json", "-g",
                                              ids[0]], parse_amd_clocks, ids[0]))
        rocm = sm_clock.find_tool("rocm-smi")
        if rocm:
            out.append(ToolReader("rocm-smi", [rocm, "--showclocks", "--json", "-d", ids[-1]], parse_rocm_smi_clocks,
                                  ids[-1]))
    return out


class DropAfter:
    """The real reader, 12% lower under a SW thermal slowdown after ``n`` reads."""

    def __init__(self, inner, n: int) -> None:
        self.inner, self.n, self.i = inner, n, 0
        self.source, self.gpu = f"{inner.source} (simulated drop after {n} reads)", inner.gpu

    def read(self) -> ClockReading:
        r = self.inner.read()
        self.i += 1
        if self.i > self.n:
            return ClockReading(r.mhz * 0.88, r.max_mhz, tuple(r.reasons) + ("sw_thermal_slowdown",), r.temperature_c)
        return r


def compare(size: int, drop_after: int | None, keep: Path | None) -> dict:
    from engine.jobs.modes import run_compare
    from engine.jobs.requests import KernelRequest
    from engine.kernels.report import render_text
    work = keep or Path(tempfile.mkdtemp(prefix="gpu_clock_check_"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("a.py", "b.py"):
        (work / name).write_text(KERNEL.format(size=size))
    (work / "compare.yaml").write_text(textwrap.dedent("""\
        kernels:
          - id: matmul
            type: pytorch
            source_files: [a.py]
            baseline: true
          - id: matmul_again
            type: pytorch
            source_files: [b.py]
        """))
    if drop_after is not None:
        def factory(device, versions, env):
            reader, why = sm_clock.open_reader(device, versions, env)
            return (DropAfter(reader, drop_after) if reader else None), why
        sm_clock.READER_FACTORY = factory
    t0 = time.monotonic()
    out = run_compare(KernelRequest(mode="compare", kernel_config=str(work / "compare.yaml"), seed=1, cwd=str(work)),
                      work / "out")
    wall = time.monotonic() - t0
    print(render_text(out.display))
    rows = []
    for k in out.report["results"]["kernel_results"]:
        method = (k.get("performance_result") or {}).get("method") or {}
        rows.append({"kernel": k["kernel_id"], "verdict": k.get("verdict"), "speedup": k.get("speedup"),
                     "rounds": method.get("rounds"), "per_round": method.get("per_round"),
                     "sm_clock": method.get("sm_clock"),
                     "flags": [f for f in (k.get("guards") or {}).get("flags", []) if f["guard"].startswith("sm_clock")]})
    return {"wall_s": wall, "sm_clock_note": out.report.get("sm_clock_note"), "kernels": rows,
            "summary": out.report["results"]["summary"]}


def print_table(res: dict) -> None:
    print(f"\ncompare took {res['wall_s']:.1f} s; {res['sm_clock_note'] or 'SM clock read'}")
    head = f"{'kernel':<14} {'verdict':<9} {'rounds':>6} {'source':<22} {'reads':>5} {'median':>7} {'min':>6} " \
           f"{'max':>6} {'rated':>6} {'read ms':>8}  reasons"
    print(head)
    print("-" * len(head))
    for r in res["kernels"]:
        c = r["sm_clock"] or {}
        if not c.get("read"):
            print(f"{r['kernel']:<14} {str(r['verdict']):<9} {str(r['rounds']):>6} not read: {c.get('why')}")
            continue
        print(f"{r['kernel']:<14} {str(r['verdict']):<9} {r['rounds']:>6} {c['source'][:22]:<22} {c['readings']:>5} "
              f"{c['median_mhz']:>7.0f} {c['min_mhz']:>6.0f} {c['max_mhz']:>6.0f} {c.get('rated_max_mhz') or 0:>6.0f} "
              f"{c.get('read_cost_ms') or 0:>8.3f}  {c.get('reasons') or {}}")
    for r in res["kernels"]:
        c = r["sm_clock"] or {}
        if c.get("round_median_mhz"):
            print(f"  {r['kernel']} round medians (MHz): {', '.join(f'{x:.0f}' for x in c['round_median_mhz'])}")
        if c.get("short_rounds"):
            print(f"  {r['kernel']} short rounds: {c['short_rounds']}")
        for f in r["flags"]:
            print(f"  {r['kernel']} flag: {f['message']}")
    print(res["summary"])


def main(argv: list[str] | None = None) -> int:
    out_env = os.environ.get("OUT")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096, help="matmul size N (N x N bf16)")
    ap.add_argument("--reads", type=int, default=200, help="reads to price a fast reader (tools: a tenth)")
    ap.add_argument("--simulate-drop-after", type=int, metavar="N")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the compare's files here")
    ap.add_argument("--json", type=Path, default=Path(out_env) / "gpu_clock_check.json" if out_env else None)
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no GPU visible to torch: nothing to check")
        return 2
    dev, versions = this_device()
    print(f"device 0: {dev}")
    print("\ncost of one clock read:")
    prices = []
    for r in readers(dev, versions):
        try:
            p = price(r, args.reads if "NVML" in r.source else max(5, args.reads // 10))
        except Exception as exc:
            print(f"  {r.source}: failed ({exc})")
            continue
        prices.append(p)
        print(f"  {p['source']:<44} median {p['median_ms']:8.3f} ms  p90 {p['p90_ms']:8.3f} ms  last {p['last']}")
    chosen, why = sm_clock.open_reader(dev, versions, os.environ)
    print(f"the session would use: {chosen.source if chosen else 'none'} {why}")
    res = compare(args.size, args.simulate_drop_after, args.keep)
    print_table(res)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": dev, "read_cost": prices, "compare": res}, indent=1, default=str))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
