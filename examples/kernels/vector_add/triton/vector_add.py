"""vector_add in Triton, in the harness convention (Model / get_inputs / get_init_inputs)."""

import os

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, block: int = 1024):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        add_kernel[(triton.cdiv(n, self.block),)](x, y, out, n, BLOCK=self.block)
        return out


def get_inputs():
    # 2^26 floats (256 MB a tensor) on a GPU, well past any L2; small on the CPU interpreter.
    n = int(os.environ.get("VECTOR_ADD_N", (1 << 26) if torch.cuda.is_available() else 100_003))
    return [torch.randn(n), torch.randn(n)]


def get_init_inputs():
    block = int(os.environ.get("VECTOR_ADD_BLOCK", 1024))
    return [block]
