"""A correct candidate: exact GELU written out, 0.5 * x * (1 + erf(x / sqrt(2)))."""

import math

import torch

from _gelu_inputs import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
