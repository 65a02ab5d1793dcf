"""Cheat: returns a fresh torch.empty buffer and never writes it. With a plain allocator the
buffer often holds the previous call's output for the same input (the memory just freed),
so a harness that calls twice on one input sees the right numbers. The engine fills every
torch.empty* it hands the kernel with NaN."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.empty(x.shape, dtype=x.dtype)
