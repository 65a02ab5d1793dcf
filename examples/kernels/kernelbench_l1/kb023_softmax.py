"""KernelBench level 1, problem 23 (23_Softmax.py): softmax over dim 1 of a 2-D tensor.

x is ROWS x COLS = 4096 x 393216 fp32 (6 GiB). KB_SCALE scales both.
Caution: with U[0,1) inputs every output is about 1/COLS (2.5e-6 at full size), below fp32's
default atol of 1e-5, so an all-zeros output passes an allclose check at full size (KernelBench #165).
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


ROWS = _scaled(4096)
COLS = _scaled(393216)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
