"""Transpose problem for transpose_compare.yaml: a contiguous copy of x.T, x float32 384 x 512
(not square, so returning x itself fails on its shape)."""

import torch


def get_inputs():
    return [torch.randn(384, 512, dtype=torch.float32)]


def get_init_inputs():
    return []
