"""A correct baseline: torch's exact GELU."""

import torch

from _gelu_inputs import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)
