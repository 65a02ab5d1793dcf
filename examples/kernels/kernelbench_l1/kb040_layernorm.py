"""KernelBench level 1, problem 40 (40_LayerNorm.py): nn.LayerNorm over the last three dims.

x is 16 x 64 x 256 x 256 fp32 (256 MiB); constructor args (normalized_shape,) = ((64, 256, 256),),
so the layer has a 64 x 256 x 256 weight and bias (ones and zeros at construction). KB_SCALE
scales the batch and both spatial dims, not the 64 features.
"""

import os

import torch


def _scaled(n: int, minimum: int = 1) -> int:
    """n times $KB_SCALE (default 1.0), at least `minimum`, with n's parity kept."""
    scale = float(os.environ.get("KB_SCALE", "1.0"))
    if scale <= 0:
        raise ValueError(f"KB_SCALE must be > 0, got {scale}")
    v = max(minimum, round(n * scale))
    return v + 1 if v % 2 != n % 2 else v


BATCH = _scaled(16)
FEATURES = 64
DIM1 = _scaled(256)
DIM2 = _scaled(256)


class Model(torch.nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = torch.nn.LayerNorm(normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.rand(BATCH, FEATURES, DIM1, DIM2)]


def get_init_inputs():
    return [(FEATURES, DIM1, DIM2)]
