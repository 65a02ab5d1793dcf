"""Faulty: takes exp in float16 to halve the traffic and skips the max subtraction. exp(x)
overflows float16 for x > 11.09 (about 0.3% of these inputs, in most rows), giving inf,
then inf/inf = NaN where the reference is finite."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = x.half().exp().float()
        return e / e.sum(dim=-1, keepdim=True)
