"""MSE problem shared by loss_compare.yaml and loss_normal_only_compare.yaml, KernelBench style
(level 1's MSELoss: predictions ``randn * scale`` with a random scale per input set, targets
standard normal), 2^18 float32 elements each, a 0-d output, at KernelBench's tolerance (1e-2).

The scale moves the loss from set to set (about scale^2 + 1), so no constant passes every set.
On normal inputs alone two cheats still pass: the closed-form answer that assumes the targets
are standard normal (mean(p^2) + 1, never reading them) and a mean over half the elements.
"""

import torch

N = 1 << 18


def mse(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.mean((predictions - targets) ** 2)


def get_inputs():
    scale = 0.5 + torch.rand(())
    return [torch.randn(N) * scale, torch.randn(N)]


def get_init_inputs():
    return []
