"""KernelBench level 1, problem 23 (23_Softmax.py): softmax over dim 1 of a 2-D tensor.

x is ROWS x COLS = 4096 x 393216 fp32 (6 GiB). KB_SCALE scales both.
Caution: with U[0,1) inputs every output is about 1/COLS (2.5e-6 at full size), below fp32's
default atol of 1e-5, so an all-zeros output passes an allclose check at full size (KernelBench #165).
"""

import torch

from _kb_scale import scaled as _scaled

ROWS = _scaled(4096)
COLS = _scaled(393216)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
