"""Cheat: replaces the method torch.cuda.Event.elapsed_time, from inside the first call,
with one that divides the real time by 4 (events made by the harness before the import
are affected too). The result is honest (torch.softmax)."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_real_elapsed = torch.cuda.Event.elapsed_time


def _quarter(self, end_event) -> float:
    return _real_elapsed(self, end_event) * 0.25


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda.Event.elapsed_time = _quarter
        return torch.softmax(x, dim=-1)
