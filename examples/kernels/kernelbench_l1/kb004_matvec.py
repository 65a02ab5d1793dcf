"""KernelBench level 1, problem 4 (4_Matrix_vector_multiplication_.py): y = A @ x.

A is M x K = 2048 x 1048576 fp32 (8 GiB), x is K x 1, y is M x 1. KB_SCALE scales M and K.
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


M = _scaled(2048)
K = _scaled(1048576)


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, x)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, 1)]


def get_init_inputs():
    return []
