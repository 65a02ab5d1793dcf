"""Honest control: one fused torch.softmax call instead of the baseline's loop. Genuinely
faster (about 5x): the verdict must be "faster", and it is the winner."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
