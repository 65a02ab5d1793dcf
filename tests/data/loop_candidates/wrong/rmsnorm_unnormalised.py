"""A user candidate for kernels.rmsnorm that forgets the normalisation: fast and wrong."""

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * weight
