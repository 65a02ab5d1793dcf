"""KernelBench level 1, problem 26 (26_GELU_.py): element-wise GELU (exact erf form, approximate="none").

x is ROWS x COLS = 4096 x 393216 fp32 (6 GiB; the output as much again). KB_SCALE scales both.
"""

import torch

from _kb_scale import scaled as _scaled

ROWS = _scaled(4096)
COLS = _scaled(393216)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


def get_inputs():
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
