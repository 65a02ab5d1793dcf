"""Candidate with a bug: it drops the masks and walks only the full 128-wide chunks.
Right when the row length is a multiple of 128; otherwise the tail of each row is
left out of the max and the sum, and never written."""

import torch
import triton
import triton.language as tl

from _shapes import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


@triton.jit
def softmax_unmasked(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    offs = tl.arange(0, BLOCK)
    n_full = n_cols // BLOCK
    row_max = tl.full([BLOCK], -float("inf"), tl.float32)
    for c in range(0, n_full):
        row_max = tl.maximum(row_max, tl.load(x_row + c * BLOCK + offs))
    m = tl.max(row_max, 0)
    acc = tl.zeros([BLOCK], tl.float32)
    for c in range(0, n_full):
        acc += tl.exp(tl.load(x_row + c * BLOCK + offs) - m)
    denom = tl.sum(acc, 0)
    for c in range(0, n_full):
        x = tl.load(x_row + c * BLOCK + offs)
        tl.store(y_row + c * BLOCK + offs, tl.exp(x - m) / denom)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        y = torch.empty_like(x)
        softmax_unmasked[(rows,)](x, y, cols, x.stride(0), BLOCK=128)
        return y
