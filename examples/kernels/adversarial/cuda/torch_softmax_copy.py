"""Honest control: the baseline's code, unchanged. Verdict "tie"."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
