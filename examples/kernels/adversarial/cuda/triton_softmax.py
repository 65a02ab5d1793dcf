"""Honest Triton softmax (see _triton_softmax.py): one pass per row, one program per row."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)
from _triton_softmax import softmax


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x)
