"""Honest but slow baseline: softmax in blocks of 16 rows from a Python loop (about 5x the
cost of torch.softmax on 256 x 1000)."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)
from _slow_softmax import blocked_softmax


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blocked_softmax(x, 16)
