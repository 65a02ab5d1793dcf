"""Where a decode step of the built-in server spends its GPU time: one eager decode step of the
1B (or 8B) shape at a batch and context, profiled with torch.profiler (CUDA activity), kernels
grouped by name, against the step's floor (weights + the KV cache it reads, at 4.3 TB/s).

    PYTHONPATH=. python3 benchmarks/gpu_decode_breakdown.py [--size 1b] [--batch 64] [--context 544]

Eager, so each kernel shows as itself (the CUDA graph replays the same kernels back to back).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from engine.serve.kernels import check_triton_defaults, resolve_kernels
from engine.serve.model import LlamaModel, model_config

H200_TBS = 4.3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=544)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    dev, dtype = torch.device("cuda", 0), torch.bfloat16
    torch.cuda.set_device(dev)
    shapes = model_config(args.size)
    kernels = check_triton_defaults(resolve_kernels(None, dev, True), shapes, dev, dtype)
    model = LlamaModel(shapes, device=dev, dtype=dtype, kernels=kernels)
    b = args.batch
    cache = model.new_cache(b, max(1024, args.context + 16))
    ids = torch.randint(0, shapes.vocab_size, (b,), device=dev)
    positions = torch.full((b,), args.context - 1, dtype=torch.long, device=dev)
    slots = torch.arange(b, dtype=torch.long, device=dev)
    lengths = (positions + 1).to(torch.int32)
    for _ in range(3):
        model.decode(cache, ids, positions, slots, lengths)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            model.decode(cache, ids, positions, slots, lengths)
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    total = sum(sum(v) for v in per_kernel.values()) / args.steps
    cfg = shapes
    weight_bytes = cfg.num_parameters() * 2
    kv_bytes = b * args.context * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2
    floor_ms = (weight_bytes + kv_bytes) / (H200_TBS * 1e12) * 1e3
    print(f"{args.size} decode batch {b} context {args.context}: GPU {total / 1e3:.3f} ms per step "
          f"(floor {floor_ms:.3f} ms: weights {weight_bytes / 1e9:.2f} GB + KV {kv_bytes / 1e9:.2f} GB at {H200_TBS} TB/s)")
    print(f"{'ms/step':>8} {'share':>6} {'calls':>6}  kernel")
    for name, times in sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))[:18]:
        ms = sum(times) / args.steps / 1e3
        print(f"{ms:8.3f} {100 * sum(times) / args.steps / total:5.1f}% {len(times) // args.steps:6d}  {name[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
