"""KernelBench level 1, problem 1 (1_Square_matrix_multiplication_.py): C = A @ B.

A and B are N x N fp32 with N = 4096 (64 MiB each). KB_SCALE scales N.
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


N = _scaled(4096)


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs():
    return [torch.rand(N, N), torch.rand(N, N)]


def get_init_inputs():
    return []
