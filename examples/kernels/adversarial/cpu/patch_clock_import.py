"""Cheat: replaces time.perf_counter at import with a clock that runs at a quarter of real
speed. The kernel itself is honest (torch.softmax, the baseline's cost), but a harness
that times with time.perf_counter after importing it measures every call 4x shorter."""

import time

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_real_perf_counter = time.perf_counter
_t0 = _real_perf_counter()


def _slow_clock() -> float:
    return _t0 + (_real_perf_counter() - _t0) * 0.25


time.perf_counter = _slow_clock


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
