"""KernelBench level 1, problem 36 (36_RMSNorm_.py): RMS normalisation over dim 1 (the feature dim).

y = x / sqrt(mean(x**2 over dim 1) + eps), no weight; eps = 1e-5. x is 112 x 64 x 512 x 512 fp32
(7 GiB); constructor args (features,) = (64,). KB_SCALE scales the batch and both spatial dims,
not the 64 features.
"""

import torch

from _kb_scale import scaled as _scaled

BATCH = _scaled(112)
FEATURES = 64
DIM1 = _scaled(512)
DIM2 = _scaled(512)


class Model(torch.nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean_sq = x.pow(2).mean(dim=1, keepdim=True)
        return x / torch.sqrt(mean_sq + self.eps)


def get_inputs():
    return [torch.rand(BATCH, FEATURES, DIM1, DIM2)]


def get_init_inputs():
    return [FEATURES]
