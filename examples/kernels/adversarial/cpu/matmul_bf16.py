"""Faulty: precision downcast. The float32 problem is computed in bfloat16 (8-bit mantissa)
and cast back: errors of about 1e-2 relative, two orders beyond float32's tolerance."""

import torch

from _problem_matmul import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.bfloat16() @ b.bfloat16()).float()
