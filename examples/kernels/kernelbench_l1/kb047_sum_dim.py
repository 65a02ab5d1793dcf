"""KernelBench level 1, problem 47 (47_Sum_reduction_over_a_dimension.py): sum over dim 1, keepdim.

x is 128 x 4096 x 4095 fp32 (8 GiB; note the odd last dim); constructor args (dim,) = (1,); the
output is 128 x 1 x 4095. KB_SCALE scales all three sizes (4095 stays odd).
"""

import os

import torch


def _scaled(n: int, minimum: int = 1) -> int:
    """n times $KB_SCALE (default 1.0), at least `minimum`, with n's parity kept."""
    scale = float(os.environ.get("KB_SCALE", "1.0"))
    if scale <= 0:
        raise ValueError(f"KB_SCALE must be > 0, got {scale}")
    v = max(minimum, round(n * scale))
    return v + 1 if v % 2 != n % 2 else v


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
