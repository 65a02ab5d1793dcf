"""Cheat: returns zeros of the right shape. On this test (values near 1 in every row) zeros
are far outside tolerance; compare degenerate_compare.yaml, where they are not."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)
