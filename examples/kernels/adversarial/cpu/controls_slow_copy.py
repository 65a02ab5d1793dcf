"""Honest control: the baseline's code, unchanged. Verdict "tie"."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)
from _slow_softmax import blocked_softmax


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blocked_softmax(x, 16)
