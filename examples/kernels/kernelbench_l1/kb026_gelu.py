"""KernelBench level 1, problem 26 (26_GELU_.py): element-wise GELU (exact erf form, approximate="none").

x is ROWS x COLS = 4096 x 393216 fp32 (6 GiB; the output as much again). KB_SCALE scales both.
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
        return torch.nn.functional.gelu(x)


def get_inputs():
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
