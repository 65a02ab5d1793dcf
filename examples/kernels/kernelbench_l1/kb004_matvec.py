"""KernelBench level 1, problem 4 (4_Matrix_vector_multiplication_.py): y = A @ x.

A is M x K = 2048 x 1048576 fp32 (8 GiB), x is K x 1, y is M x 1. KB_SCALE scales M and K.
"""

import torch

from _kb_scale import scaled as _scaled

M = _scaled(2048)
K = _scaled(1048576)


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, x)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, 1)]


def get_init_inputs():
    return []
