"""The loop's candidates step on a GPU: every op of the bundled library against the built-in
server's default, at the 1B model's decode and prefill shapes, through the same harness and
compare the loop writes (engine.loop.harness, engine.loop.kernel_steps.compare_candidates).

    python3 benchmarks/gpu_loop_library.py [--ops rmsnorm,activation,rotary,attention] [--out DIR]

Each (op, shape) is one ``magpie compare`` of the default against every library candidate,
correctness-gated at the shape; a short table (verdict, speedup with its interval, medians) is
printed last. Needs a GPU (the Triton candidates are left out on a CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Llama-3.2-1B: hidden 2048, intermediate 8192, 32 query / 8 kv heads of 64.
H, I2, HQ, HKV, D, POS = 2048, 16384, 32, 8, 64, 8192


def _t(shape, dtype="bfloat16", values=None) -> dict:
    d = {"shape": list(shape), "dtype": dtype}
    if values is not None:
        d["values"] = list(values)
    return d


def _cu(lengths) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def cases() -> dict[str, list[tuple[str, list[dict]]]]:
    decode_b, ctx = 16, 576  # concurrency 16, 512 in + up to 64 out
    prefill = [512] * 4
    t_pre = sum(prefill)
    return {
        "rmsnorm": [("decode 16", [_t([decode_b, H]), _t([H]), {"scalar": 1e-5}]),
                    ("prefill 2048", [_t([t_pre, H]), _t([H]), {"scalar": 1e-5}])],
        "activation": [("decode 16", [_t([decode_b, I2])]), ("prefill 2048", [_t([t_pre, I2])])],
        "rotary": [("decode 16", [_t([decode_b], "int64"), _t([decode_b, HQ, D]), _t([decode_b, HKV, D]),
                                  _t([POS, D], "float32")]),
                   ("prefill 2048", [_t([t_pre], "int64"), _t([t_pre, HQ, D]), _t([t_pre, HKV, D]),
                                     _t([POS, D], "float32")])],
        "attention": [("decode 16 x 576", [_t([decode_b, HQ, D]), _t([decode_b * ctx, HKV, D]),
                                           _t([decode_b * ctx, HKV, D]),
                                           _t([decode_b + 1], "int32", _cu([1] * decode_b)),
                                           _t([decode_b + 1], "int32", _cu([ctx] * decode_b)), {"scalar": D ** -0.5}]),
                      ("prefill 4 x 512", [_t([t_pre, HQ, D]), _t([t_pre, HKV, D]), _t([t_pre, HKV, D]),
                                           _t([len(prefill) + 1], "int32", _cu(prefill)),
                                           _t([len(prefill) + 1], "int32", _cu(prefill)), {"scalar": D ** -0.5}])],
        # The decode step's own op: the cache as the server holds it (65 slots of 8192 tokens).
        "decode_attention": [("decode 16 x 544", [_t([decode_b, HQ, D]), _t([65, POS, HKV, D]), _t([65, POS, HKV, D]),
                                                  _t([decode_b], "int64", range(decode_b)),
                                                  _t([decode_b], "int32", [ctx - 32] * decode_b), {"scalar": D ** -0.5}])],
    }


def main(argv: list[str] | None = None) -> int:
    from engine.jobs.modes import run_request
    from engine.loop.harness import write_harness
    from engine.loop.kernel_steps import compare_candidates
    from engine.serve.kernels import default_kernel_path
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="rmsnorm,activation,rotary,attention,decode_attention")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or tempfile.mkdtemp()) / "loop_library")
    args = ap.parse_args(argv)
    import torch
    device = "cuda" if torch.cuda.is_available() else None  # the server's defaults there are Triton kernels
    rows = []
    for op in args.ops.split(","):
        for label, call in cases()[op]:
            folder = args.out / f"{op}_{label.split()[0]}"
            harness = write_harness(folder / "harness", op, default_kernel_path(op, device), [{"args": call,
                                                                                      "share_of_op_pct": 100.0}])
            started = time.monotonic()
            try:
                result = compare_candidates(folder / "candidates", folder / harness["file"], op, "gpu", [], True,
                                            run_request=run_request, log=lambda s: print(s, flush=True))
            except Exception as exc:  # one failed op must not hide the others
                rows.append((op, label, "-", f"error: {exc}"[:60], "-", "-", time.monotonic() - started))
                continue
            wall = time.monotonic() - started
            base = next((r for r in result["rows"] if r["id"] == "baseline"), {})
            for r in result["rows"]:
                if r["id"] == "baseline":
                    continue
                ci = r.get("ci95")
                sp = f"{r['speedup']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if r.get("speedup") and ci else "-"
                med = f"{base.get('median_ms') or 0:.4f}/{r.get('median_ms') or 0:.4f}"
                rows.append((op, label, r["id"], r["verdict"], sp, med, wall))
            for c in result.get("left_out", []):
                rows.append((op, label, c["id"], "left out", "-", "-", wall))
    print(f"\n{'op':<11} {'shape':<17} {'candidate':<28} {'verdict':<10} {'speedup [95% CI]':<24} "
          f"{'median ms base/cand':<20} {'wall s':>6}")
    for op, label, cid, verdict, sp, med, wall in rows:
        print(f"{op:<11} {label:<17} {cid:<28} {verdict[:10]:<10} {sp:<24} {med:<20} {wall:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
