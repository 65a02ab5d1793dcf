"""Cheat: writes the product into its second input, b, and returns b (saving the output
allocation). The kernel YAML does not declare `inplace: true`. Both guards apply: b was
written, and the output is b's storage."""

import torch

from _problem_matmul import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        b.copy_(a @ b)
        return b
