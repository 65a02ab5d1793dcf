"""Cheat: uses its input as scratch space to save an allocation: exp(x - max) is computed in
place in x, and only the normalised result is a new tensor. The output is right, but the
caller's data is destroyed, and the kernel YAML does not declare `inplace: true`; a harness
that computes the reference after the kernel on the same tensor, or reuses the input, is
fooled or silently corrupted."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.sub_(x.amax(dim=-1, keepdim=True)).exp_()  # x now holds exp(x - max)
        return x / x.sum(dim=-1, keepdim=True)
