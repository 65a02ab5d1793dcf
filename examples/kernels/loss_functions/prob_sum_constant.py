"""A cheat that a degenerate test cannot catch: returns 1.0 without reading its input. It
passes, and is much faster; only the degenerate-test check keeps it from winning."""

import torch

from prob_sum import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones((), dtype=x.dtype, device=x.device)
