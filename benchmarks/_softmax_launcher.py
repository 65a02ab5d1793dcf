"""A float32 row softmax in Triton: the one kernel that benchmarks/gpu_timing_vs_ncu.py times.

This file has two roles.

* The kernel module for ``magpie analyze`` (the Model / get_inputs / get_init_inputs
  convention; the size comes from the env vars ROWS and COLS). gpu_timing_vs_ncu.py copies
  it next to its YAML files as ``softmax_kernel.py``.
* A standalone launcher, ``python3 _softmax_launcher.py MODE ROWSxCOLS``:

  - ``ncu``: ``--warmup`` (5) launches, then ``--launches`` (30) more, for ncu to time
    (``--launch-skip 5 --launch-count 30``);
  - ``do_bench``: ``triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")``;
  - ``do_bench_cudagraph``: ``triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")``.

  ``fn`` is ``Model()(x)``, which is the call that magpie's harness times. After timing, one
  more launch writes into a NaN-filled output, and that output is checked against softmax
  built from torch primitives in float64. None of those kernels has "softmax" in its name,
  so ncu's ``-k regex:softmax`` sees only this kernel. The launcher prints one line,
  ``RESULT {json}``, and exits 1 if the check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(y_ptr + row * y_row_stride + cols, num / tl.sum(num, axis=0), mask=mask)


def softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D float32 tensor whose rows are contiguous: one program per row."""
    assert x.dim() == 2 and x.stride(1) == 1, "a 2-D tensor with contiguous rows"
    y = torch.empty_like(x) if out is None else out
    rows, cols = x.shape
    softmax_kernel[(rows,)](x, y, cols, x.stride(0), y.stride(0), BLOCK=triton.next_power_of_2(cols), num_warps=8)
    return y


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x)


def get_inputs():
    return [torch.randn(int(os.environ.get("ROWS", "3750")), int(os.environ.get("COLS", "4000")))]


def get_init_inputs():
    return []


def check(x: torch.Tensor) -> float:
    """‖y − ref‖ / ‖ref‖ against a float64 softmax, for a y that starts as NaN (so unwritten elements fail)."""
    y = softmax(x, out=torch.full_like(x, float("nan")))
    xd = x.double()
    e = torch.exp(xd - xd.amax(dim=-1, keepdim=True))
    ref = e / e.sum(dim=-1, keepdim=True)
    return float(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["ncu", "do_bench", "do_bench_cudagraph"])
    p.add_argument("size", help="ROWSxCOLS, e.g. 3750x4000")
    p.add_argument("--warmup", type=int, default=5, help="ncu mode: launches before the timed ones (default 5)")
    p.add_argument("--launches", type=int, default=30, help="ncu mode: launches for ncu to time (default 30)")
    args = p.parse_args(argv)
    rows, cols = (int(v) for v in args.size.lower().split("x"))
    torch.manual_seed(0)
    x = torch.randn(rows, cols).cuda()  # drawn on the CPU and copied, as magpie's harness does
    model = Model().cuda().eval()
    result: dict = {"mode": args.mode, "rows": rows, "cols": cols, "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__, "triton": triton.__version__}
    with torch.no_grad():
        fn = lambda: model(x)  # noqa: E731
        if args.mode == "ncu":
            for _ in range(args.warmup + args.launches):
                fn()
            result["launches"] = args.warmup + args.launches
        elif args.mode == "do_bench":
            result["median_ms"] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        else:
            result["median_ms"] = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        torch.cuda.synchronize()
        err = check(x)
    result["rel_l2_err"] = err
    result["check_passed"] = math.isfinite(err) and err < 1e-5
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if result["check_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
