"""KernelBench level 1, problem 42 (42_Max_Pooling_2D.py): nn.MaxPool2d.

x is 32 x 64 x 512 x 512 fp32 (2 GiB); constructor args (kernel_size, stride, padding, dilation)
= (4, 1, 1, 1), so the output is 32 x 64 x 511 x 511. KB_SCALE scales the batch and the spatial
dims (at least 8), not the 64 channels.
"""

import torch

from _kb_scale import scaled as _scaled

BATCH = _scaled(32)
CHANNELS = 64
HEIGHT = _scaled(512, minimum=8)
WIDTH = _scaled(512, minimum=8)
KERNEL_SIZE = 4
STRIDE = 1
PADDING = 1
DILATION = 1


class Model(torch.nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super().__init__()
        self.pool = torch.nn.MaxPool2d(kernel_size, stride=stride, padding=padding, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.rand(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [KERNEL_SIZE, STRIDE, PADDING, DILATION]
