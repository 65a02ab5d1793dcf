"""Honest baseline: a @ b in float32."""

import torch

from _problem_matmul import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b
