"""Input shape shared by the softmax variants; SOFTMAX_ROWS / SOFTMAX_COLS override it.

The default row length, 1000, is not a multiple of 128: that is what exposes the
unmasked candidate. The CPU default is small because Triton's interpreter runs
each program in Python.
"""

import os

import torch


def shape() -> tuple[int, int]:
    on_gpu = torch.cuda.is_available()
    rows = int(os.environ.get("SOFTMAX_ROWS", 32768 if on_gpu else 8))
    cols = int(os.environ.get("SOFTMAX_COLS", 1000))
    return rows, cols


def get_inputs():
    rows, cols = shape()
    return [torch.randn(rows, cols, dtype=torch.float32) * 4]


def get_init_inputs():
    return []
