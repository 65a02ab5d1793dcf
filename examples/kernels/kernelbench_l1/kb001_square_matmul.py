"""KernelBench level 1, problem 1 (1_Square_matrix_multiplication_.py): C = A @ B.

A and B are N x N fp32 with N = 4096 (64 MiB each). KB_SCALE scales N.
"""

import torch

from _kb_scale import scaled as _scaled

N = _scaled(4096)


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs():
    return [torch.rand(N, N), torch.rand(N, N)]


def get_init_inputs():
    return []
