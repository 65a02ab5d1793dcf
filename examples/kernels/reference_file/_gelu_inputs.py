"""The inputs every GELU module here is called on: float32 256 x 1024, values randn * 3 (wide
enough that the tanh approximation's error, up to about 5e-4, is far outside float32's
tolerance)."""

import torch

ROWS, COLS = 256, 1024


def get_inputs():
    return [torch.randn(ROWS, COLS) * 3.0]


def get_init_inputs():
    return []
