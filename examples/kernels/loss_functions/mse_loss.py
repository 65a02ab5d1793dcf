"""Mean squared error, KernelBench style (level 1's MSELoss problem, written for this project
from its definition): a 0-d float32 output from two float32 tensors.

Each input set scales the predictions by its own random factor (``scale = torch.rand(())``),
so the loss differs from seed to seed: no single constant can pass every input set, and the
test tells kernels apart even though the output is one number.
"""

import torch

BATCH, FEATURES = 128, 4096


class Model(torch.nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(predictions, targets)


def get_inputs():
    scale = torch.rand(())
    return [torch.rand(BATCH, FEATURES) * scale, torch.rand(BATCH, FEATURES)]


def get_init_inputs():
    return []
