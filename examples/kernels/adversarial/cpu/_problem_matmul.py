"""Matmul problem for matmul_compare.yaml: float32 (256 x 256) @ (256 x 256)."""

import torch

M = N = K = 256


def get_inputs():
    return [torch.randn(M, K, dtype=torch.float32), torch.randn(K, N, dtype=torch.float32)]


def get_init_inputs():
    return []
