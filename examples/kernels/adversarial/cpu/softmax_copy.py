"""Honest control: the baseline's code, unchanged. Same work, so the verdict must be "tie"."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
