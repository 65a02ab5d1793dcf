"""A degenerate test on purpose: the mean over rows of the sum of a row softmax. A softmax row
sums to 1, so the output is 1.0 (within float32 rounding) for every input: a kernel that returns
the constant 1.0 without reading its inputs passes. The engine must call the test degenerate
and declare no winner."""

import torch

ROWS, COLS = 256, 1024


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1).sum(dim=-1).mean()


def get_inputs():
    return [torch.randn(ROWS, COLS) * 4.0]


def get_init_inputs():
    return []
