"""Record a real torch-profiler trace of a Llama-shaped decoder on a GPU (random weights, plain torch):
a prefill of the prompts, then decode steps, each step inside a ``record_function`` named in vLLM's
detailed step-annotation format, so the trace analysis splits it into inference stages.

    python benchmarks/record_llm_trace.py OUT.pt.trace.json.gz [--layers 16] [--decode-steps 96]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, inter: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, hidden // heads
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * self.d, bias=False)
        self.o = torch.nn.Linear(heads * self.d, hidden, bias=False)
        self.gate_up = torch.nn.Linear(hidden, 2 * inter, bias=False)
        self.down = torch.nn.Linear(inter, hidden, bias=False)
        self.n1 = torch.nn.Parameter(torch.ones(hidden))
        self.n2 = torch.nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, cache: list, pos: int) -> torch.Tensor:
        b, t, _ = x.shape
        h = F.rms_norm(x, (x.shape[-1],), self.n1, 1e-6)
        q, k, v = self.qkv(h).split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], -1)
        q = q.view(b, t, self.heads, self.d).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.d).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.d).transpose(1, 2)
        if cache[0] is None:
            cache[0], cache[1] = k, v
        else:
            cache[0], cache[1] = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        a = F.scaled_dot_product_attention(q, cache[0], cache[1], is_causal=(pos == 0), enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        g, u = self.gate_up(F.rms_norm(x, (x.shape[-1],), self.n2, 1e-6)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


def annotation(n_ctx: int, ctx_len: int, n_gen: int, gen_ctx: int) -> str:
    """vLLM's detailed execute_* annotation for a step with n_ctx prefills and n_gen decodes."""
    c_sq = n_ctx * ctx_len
    c = f"sq{c_sq}sk{c_sq}sqsq{n_ctx * ctx_len * ctx_len}sqsk{n_ctx * ctx_len * ctx_len}"
    g = f"sq{n_gen}sk{n_gen * gen_ctx}sqsq{n_gen}sqsk{n_gen * gen_ctx}"
    return f"execute_{c_sq + n_gen}_context_{n_ctx}({c})_generation_{n_gen}({g})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode-steps", type=int, default=96)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device(args.device)
    blocks = torch.nn.ModuleList(Block(args.hidden, args.heads, args.kv_heads, args.inter)
                                 for _ in range(args.layers)).to(dev, torch.bfloat16).eval()
    emb = torch.randn(32000, args.hidden, device=dev, dtype=torch.bfloat16)

    def step(tokens: torch.Tensor, caches: list, pos: int) -> torch.Tensor:
        x = emb[tokens]
        for blk, cache in zip(blocks, caches):
            x = blk(x, cache, pos)
        return (x[:, -1] @ emb.T).argmax(-1, keepdim=True)

    with torch.no_grad():  # warm-up outside the profile: cuBLAS handles, kernels loaded
        c = [[None, None] for _ in blocks]
        step(torch.randint(0, 32000, (args.batch, 16), device=dev), c, 0)
        (torch.cuda.synchronize() if dev.type == 'cuda' else None)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == 'cuda' else [])
    prof = torch.profiler.profile(activities=activities,
                                  record_shapes=True)
    t0 = time.time()
    with torch.no_grad(), prof:
        caches = [[None, None] for _ in blocks]
        tok = torch.randint(0, 32000, (args.batch, args.prompt), device=dev)
        with torch.profiler.record_function(annotation(args.batch, args.prompt, 0, 0)):
            tok = step(tok, caches, 0)
        for i in range(args.decode_steps):
            ctx = args.prompt + i + 1
            with torch.profiler.record_function(annotation(0, 0, args.batch, ctx)):
                tok = step(tok, caches, ctx)
        (torch.cuda.synchronize() if dev.type == 'cuda' else None)
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(args.out, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        size = os.path.getsize(raw)
    with gzip.open(args.out) as fh:
        doc = json.load(fh)
    ev = doc["traceEvents"]
    kernels = sum(1 for e in ev if e.get("cat") == "kernel")
    print(json.dumps({"out": args.out, "json_mb": size / 2**20, "events": len(ev), "kernels": kernels,
                      "record_s": time.time() - t0, "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
