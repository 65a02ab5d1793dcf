"""KernelBench level 1, problem 63 (63_conv_standard_2D__square_input__square_kernel.py): nn.Conv2d.

x is 16 x 16 x 1024 x 1024 fp32 (1 GiB); constructor args (in_channels, out_channels, kernel_size)
= (16, 128, 3), stride 1, no padding, no bias; the output is 16 x 128 x 1022 x 1022 (8 GiB). The
weight comes from Conv2d's own initialisation under the harness's seed. KB_SCALE scales the batch
and the image side (at least 8), not the channels.
"""

import torch

from _kb_scale import scaled as _scaled

BATCH = _scaled(16)
IN_CHANNELS = 16
OUT_CHANNELS = 128
KERNEL_SIZE = 3
SIDE = _scaled(1024, minimum=8)


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, dilation: int = 1, groups: int = 1, bias: bool = False):
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                    dilation=dilation, groups=groups, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.rand(BATCH, IN_CHANNELS, SIDE, SIDE)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
