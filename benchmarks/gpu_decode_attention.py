"""The server's decode attention (``engine.library.attention.decode_attention_split``) at the 1B
(or 8B) shape, for a batch and context, with the number of splits forced to each of 1, 2, 4, 8,
16 and the one the kernel picks by itself: correctness against the PyTorch default, then GPU time
per call (CUDA events around a CUDA graph of 50 calls, the variants interleaved round by round,
median of the rounds) and the bandwidth it reaches on the K/V it must read.

    PYTHONPATH=. python3 benchmarks/gpu_decode_attention.py [--size 1b] [--batch 1,16,64] [--context 544]

16 splits at a cache of 1024 positions is what the kernel did before it chose splits by batch.
A batch's K/V below the GPU's L2 (a batch of 1: 18 MB) is read from L2 after the first call, so
small batches show more than DRAM bandwidth.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from engine.library import attention
from engine.serve import kernels as registry
from engine.serve.model import model_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1b")
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--context", type=int, default=544)
    ap.add_argument("--capacity", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    dev, dtype = torch.device("cuda", 0), torch.bfloat16
    cfg = model_config(args.size)
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    auto = attention.decode_programs
    rows = []
    for b in (int(x) for x in args.batch.split(",")):
        gen = torch.Generator(device=dev).manual_seed(b)
        k_cache = torch.randn(b, args.capacity, hkv, d, device=dev, dtype=dtype, generator=gen)
        v_cache = torch.randn(b, args.capacity, hkv, d, device=dev, dtype=dtype, generator=gen)
        q = torch.randn(b, hq, d, device=dev, dtype=dtype, generator=gen)
        slots = torch.arange(b, device=dev)
        lengths = torch.full((b,), args.context, dtype=torch.int32, device=dev)
        scale = d ** -0.5
        want = registry.decode_attention(q, k_cache, v_cache, slots, lengths, scale).float()
        picked = attention.decode_splits(args.capacity, 64, b * hkv, auto(dev))
        variants = {f"{s} splits": s for s in sorted({1, 2, 4, 8, 16, picked})}
        times: dict[str, list[float]] = {name: [] for name in variants}
        errors = {}
        for name, s in variants.items():
            attention.decode_programs = lambda device, s=s, pairs=b * hkv: s * pairs
            got = attention.decode_attention_split(q, k_cache, v_cache, slots, lengths, scale).float()
            errors[name] = (got - want).abs().max().item()
        # Each variant's 50 calls captured in one CUDA graph, as the server replays them: the
        # replay's time is the kernels', not the host's launches (~90 us per call, more than the
        # kernels take).
        graphs = {}
        for name, s in variants.items():
            attention.decode_programs = lambda device, s=s, pairs=b * hkv: s * pairs
            attention.decode_attention_split(q, k_cache, v_cache, slots, lengths, scale)  # compile outside the capture
            torch.cuda.synchronize()
            graphs[name] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[name]):
                for _ in range(50):
                    attention.decode_attention_split(q, k_cache, v_cache, slots, lengths, scale)
        for _ in range(args.rounds):
            for name in variants:
                graphs[name].replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graphs[name].replay()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / 50 * 1e3)
        attention.decode_programs = auto
        kv_bytes = 2 * b * args.context * hkv * d * 2
        for name, s in variants.items():
            us = statistics.median(times[name])
            rows.append((b, name + (" (picked)" if s == picked else ""), us, kv_bytes / us / 1e6, errors[name],
                         min(times[name]), max(times[name])))
    print(f"\n{args.size} decode attention, context {args.context}, cache {args.capacity}, bf16, H{hq}/{hkv} D{d}")
    print(f"{'batch':>5} {'variant':<20} {'us/call':>8} {'TB/s':>6} {'max|err|':>9}  rounds min..max")
    for b, name, us, tbs, err, lo, hi in rows:
        print(f"{b:5d} {name:<20} {us:8.1f} {tbs:6.2f} {err:9.2e}  {lo:.1f}..{hi:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
