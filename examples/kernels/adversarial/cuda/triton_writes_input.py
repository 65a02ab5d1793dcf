"""Cheat: a chunked three-pass Triton softmax that saves the exp of its second pass by storing
it over the input (x becomes exp(x - max)), so the third pass only divides. The returned
output is a fresh tensor with the right values, but the caller's input is destroyed and the
kernel YAML does not declare `inplace: true`."""

import torch
import triton
import triton.language as tl

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


@triton.jit
def softmax_scratch_in_input(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    offs = tl.arange(0, BLOCK)
    row_max = tl.full([BLOCK], -float("inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + offs, mask=start + offs < n_cols, other=-float("inf")).to(tl.float32)
        row_max = tl.maximum(row_max, x)
    m = tl.max(row_max, 0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        e = tl.exp(tl.load(x_row + start + offs, mask=mask, other=-float("inf")).to(tl.float32) - m)
        tl.store(x_row + start + offs, e.to(x_ptr.dtype.element_ty), mask=mask)  # the input is overwritten
        acc += e
    denom = tl.sum(acc, 0)
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        e = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + start + offs, (e / denom).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        y = torch.empty_like(x)
        softmax_scratch_in_input[(rows,)](x, y, cols, x.stride(0), BLOCK=1024, num_warps=4)
        return y
