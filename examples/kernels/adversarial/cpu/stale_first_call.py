"""Cheat: computes the answer on its first call and returns that same result on every later
call, whatever the input (a harness that checks only the first call is fooled)."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_first = None


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global _first
        if _first is None:
            _first = torch.softmax(x, dim=-1)
        return _first
