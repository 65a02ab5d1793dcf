"""KernelBench level 1, problem 89 (89_cumsum.py): inclusive prefix sum (torch.cumsum) along dim 1.

x is 32768 x 32768 fp32 (4 GiB); constructor args (dim,) = (1,). The last column of the output is
about 16384, so fp32 rounding grows along the row. KB_SCALE scales both sizes.
"""

import torch

from _kb_scale import scaled as _scaled

BATCH = _scaled(32768)
LENGTH = _scaled(32768)
SCAN_DIM = 1


class Model(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.rand(BATCH, LENGTH)]


def get_init_inputs():
    return [SCAN_DIM]
