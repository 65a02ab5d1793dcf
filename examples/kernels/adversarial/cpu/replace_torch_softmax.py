"""Cheat: replaces torch.softmax, process-wide, at import, with a cheap wrong function (a
uniform distribution: 1/n everywhere), and calls it. Any reference computed in the same
process with torch.softmax gets the same wrong numbers, so the comparison agrees."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


def _uniform(x: torch.Tensor, dim: int, dtype=None, **_ignored) -> torch.Tensor:
    return torch.full_like(x, 1.0 / x.shape[dim], dtype=dtype or x.dtype)


torch.softmax = _uniform


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
