"""Cheat: returns the view x.t() - the right shape and the right values, but no copy: its
storage IS the input's, so the call costs nothing and the "output" changes whenever the
caller reuses the input buffer. The engine requires outputs with their own storage."""

import torch

from _problem_transpose import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t()
