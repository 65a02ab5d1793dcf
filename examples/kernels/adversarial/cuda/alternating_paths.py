"""Honest, but not the same kernels every call: odd calls run torch.softmax, even calls the
same softmax in three steps (max, exp, normalise) in float32. Right every time; the device
trace shows calls launching different kernels than the discovery call, which is flagged
(work moved between calls looks like this), not rejected."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_calls = [0]


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _calls[0] += 1
        if _calls[0] % 2:
            return torch.softmax(x, dim=-1)
        xf = x.float()
        e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
