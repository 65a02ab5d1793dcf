"""Cheat: replaces torch.cuda.Event at import with a subclass whose elapsed_time reports a
quarter of the real time. The kernel itself is honest (torch.softmax): a harness that
times with torch.cuda.Event after importing it reports a 4x speedup."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class _QuarterTimeEvent(torch.cuda.Event):
    def elapsed_time(self, end_event) -> float:
        return super().elapsed_time(end_event) * 0.25


torch.cuda.Event = _QuarterTimeEvent


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
