"""KernelBench level 1, problem 19 (19_ReLU.py): element-wise ReLU.

x is ROWS x COLS = 4096 x 393216 fp32 (6 GiB; the output as much again). KB_SCALE scales both.
"""

import torch

from _kb_scale import scaled as _scaled

ROWS = _scaled(4096)
COLS = _scaled(393216)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
