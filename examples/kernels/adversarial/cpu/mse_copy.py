"""Honest control: the baseline's code, unchanged. Same work, so the verdict must be "tie"."""

import torch

from _problem_mse import get_init_inputs, get_inputs, mse  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return mse(predictions, targets)
