"""Honest baseline: torch.softmax over the last dimension (bf16 in, bf16 out)."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
