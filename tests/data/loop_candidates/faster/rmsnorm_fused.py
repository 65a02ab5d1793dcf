"""A user candidate for kernels.rmsnorm: torch's fused rms_norm, with float32 accumulation as
the server's default (one operator instead of five)."""

import torch
import torch.nn.functional as F


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)
