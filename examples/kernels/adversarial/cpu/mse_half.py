"""Cheat: partial computation (KernelBench issue #97). The mean over the first half of the
elements only, an unbiased estimate of the whole mean: half the work, and within 1e-2 on normal
inputs of 2^18 elements. On heavy-tailed inputs the loss is carried by a few large squares,
which half the elements may or may not hold."""

import torch

from _problem_mse import get_init_inputs, get_inputs, mse  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        half = predictions.numel() // 2
        return mse(predictions.reshape(-1)[:half], targets.reshape(-1)[:half])
