"""Honest control: the right answer, but softmax is computed three times and two of the
results are thrown away. Three times the work: the verdict must be "slower"."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.softmax(x, dim=-1)
        torch.softmax(x, dim=-1)
        return torch.softmax(x, dim=-1)
