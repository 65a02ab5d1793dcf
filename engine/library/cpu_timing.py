"""CPU timings of the library's torch candidates against the registry defaults, the numbers
quoted in docs/optimize.md ("The bundled kernel library"):

    python -m engine.library.cpu_timing [--rounds 15] [--threads 1]

float32, one intra-op thread. Each round times every function of a case back to back (interleaved,
so load on a shared machine hits them alike) for about ``--budget`` seconds of calls; the table
gives the median and the best round in microseconds per call and the default's median over the
candidate's. This is a quick look, not a verdict: ``magpie compare`` is the correctness-gated,
noise-aware measurement. Triton candidates are not timed here (the interpreter is not a timing).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Sequence

import torch

from engine.library.activation import silu_and_mul_torch_inplace
from engine.library.attention import decode_attention_grouped, varlen_attention_padded
from engine.library.rmsnorm import rmsnorm_torch_fused
from engine.serve import kernels as defaults


def _varlen_inputs(q_lens: Sequence[int], k_lens: Sequence[int], hq: int, hkv: int, d: int) -> tuple:
    gen = torch.Generator().manual_seed(0)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), hq, d, generator=gen)
    k, v = (torch.randn(sum(k_lens), hkv, d, generator=gen) for _ in range(2))
    return q, k, v, cu_q, cu_k, d ** -0.5


def cases() -> list[tuple[str, str, Callable, Callable, tuple]]:
    """(op, shape label, default, candidate, arguments) for each timed case."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for t, h in ((16, 256), (128, 256), (512, 2048), (1, 2048), (64, 2048)):
        args = (torch.randn(t, h, generator=gen), torch.randn(h, generator=gen), 1e-5)
        out.append(("rmsnorm", f"[{t}, {h}]", defaults.rmsnorm, rmsnorm_torch_fused, args))
    for t, i2 in ((16, 1024), (128, 1024), (512, 16384), (1, 16384)):
        out.append(("activation", f"[{t}, {i2}]", defaults.silu_and_mul, silu_and_mul_torch_inplace,
                    (torch.randn(t, i2, generator=gen),)))
    # tiny preset heads (4 q, 2 kv, 64); the 1b preset's (32, 8, 64)
    for label, q_lens, k_lens, hq, hkv in (
            ("tiny: 1 prefill of 128", [128], [128], 4, 2),
            ("tiny: 3 prefills of 64 + 8 decodes at 128", [64] * 3 + [1] * 8, [64] * 3 + [128] * 8, 4, 2),
            ("tiny: 8 decodes at 256", [1] * 8, [256] * 8, 4, 2),
            ("1b: 2 prefills of 256 + 16 decodes at 512", [256] * 2 + [1] * 16, [256] * 2 + [512] * 16, 32, 8)):
        out.append(("attention", label, defaults.varlen_attention, varlen_attention_padded,
                    _varlen_inputs(q_lens, k_lens, hq, hkv, 64)))
    for label, lengths, hq, hkv in (("tiny: 8 decodes, contexts 1..256", [1, 37, 64, 100, 128, 180, 200, 256], 4, 2),
                                    ("1b: 16 decodes, contexts up to 512", [512 - 29 * i for i in range(16)], 32, 8)):
        b = len(lengths)
        k_cache, v_cache = (torch.randn(b, 512, hkv, 64, generator=gen) for _ in range(2))
        args = (torch.randn(b, hq, 64, generator=gen), k_cache, v_cache, torch.arange(b).flip(0),
                torch.tensor(lengths, dtype=torch.int32), 0.125)
        out.append(("decode_attention", label, defaults.decode_attention, decode_attention_grouped, args))
    return out


def _time(fn: Callable, args: tuple, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def measure(rounds: int, budget: float) -> list[dict]:
    rows = []
    for op, label, default, candidate, args in cases():
        # A correctness check first: a fast wrong answer is not a timing.
        torch.testing.assert_close(candidate(*args), default(*args), rtol=1e-4, atol=1e-5)
        per_call = max(_time(default, args, 3), 1e-3) * 1e-6
        calls = max(3, int(budget / per_call))
        samples: dict[str, list[float]] = {"default": [], "candidate": []}
        for _ in range(rounds):
            samples["default"].append(_time(default, args, calls))
            samples["candidate"].append(_time(candidate, args, calls))
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.append({"op": op, "shape": label, "candidate": candidate.__name__,
                     "default_us": med["default"], "candidate_us": med["candidate"],
                     "default_best_us": min(samples["default"]), "candidate_best_us": min(samples["candidate"]),
                     "speedup": med["default"] / med["candidate"]})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.library.cpu_timing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per case (median and best reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the compare harness uses 1)")
    parser.add_argument("--budget", type=float, default=0.02, help="seconds of calls per function per round")
    ns = parser.parse_args(argv)
    torch.set_num_threads(ns.threads)
    print(f"torch {torch.__version__}, {ns.threads} thread(s), float32, {ns.rounds} interleaved rounds; "
          "µs per call: median (best)")
    print(f"{'op':<17}{'shape':<44}{'candidate':<28}{'default':>18}{'candidate':>18}{'speedup':>9}")
    for r in measure(ns.rounds, ns.budget):
        print(f"{r['op']:<17}{r['shape']:<44}{r['candidate']:<28}"
              f"{r['default_us']:>9.1f} ({r['default_best_us']:>6.1f})"
              f"{r['candidate_us']:>9.1f} ({r['candidate_best_us']:>6.1f}){r['speedup']:>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
