"""Cheat on a degenerate test: returns zeros. Every reference value is below float32's
default atol (1e-5), so zeros pass the comparison and are much faster. The engine cannot
fail it on numbers; it must flag the TEST as degenerate and declare no winner."""

import torch

from _problem_wide import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)
