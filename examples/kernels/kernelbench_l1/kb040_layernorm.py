"""KernelBench level 1, problem 40 (40_LayerNorm.py): nn.LayerNorm over the last three dims.

x is 16 x 64 x 256 x 256 fp32 (256 MiB); constructor args (normalized_shape,) = ((64, 256, 256),),
so the layer has a 64 x 256 x 256 weight and bias (ones and zeros at construction). KB_SCALE
scales the batch and both spatial dims, not the 64 features.
"""

import torch

from _kb_scale import scaled as _scaled

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
