"""KernelBench level 1, problem 47 (47_Sum_reduction_over_a_dimension.py): sum over dim 1, keepdim.

x is 128 x 4096 x 4095 fp32 (8 GiB; note the odd last dim); constructor args (dim,) = (1,); the
output is 128 x 1 x 4095. KB_SCALE scales all three sizes (4095 stays odd).
"""

import torch

from _kb_scale import scaled as _scaled

BATCH = _scaled(128)
DIM1 = _scaled(4096)
DIM2 = _scaled(4095)
REDUCE_DIM = 1


class Model(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.rand(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [REDUCE_DIM]
