"""RMSNorm written out in eager PyTorch: square, mean, rsqrt, two multiplies (several passes)."""

import os

import torch

EPS = 1e-6


class Model(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


def _sizes() -> tuple[int, int]:
    on_gpu = torch.cuda.is_available()
    tokens = int(os.environ.get("RMSNORM_TOKENS", 16384 if on_gpu else 2048))
    hidden = int(os.environ.get("RMSNORM_HIDDEN", 4096 if on_gpu else 1024))
    return tokens, hidden


def get_inputs():
    tokens, hidden = _sizes()
    return [torch.randn(tokens, hidden)]


def get_init_inputs():
    return [_sizes()[1]]
