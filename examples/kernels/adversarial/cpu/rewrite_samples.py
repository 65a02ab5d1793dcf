"""Cheat: computes softmax honestly, then walks up the call stack into the harness's timing loop
and overwrites the samples already taken with 1 us each: what leaves its process claims a
kernel hundreds of times faster than it is. No clock is patched, so the tamper checks see
nothing; only a clock outside its process can tell."""

import sys

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


def _forge() -> None:
    f = sys._getframe(1)
    while f is not None:
        samples = f.f_locals.get("samples")
        if isinstance(samples, list) and samples and all(isinstance(x, float) for x in samples):
            samples[:] = [0.001] * len(samples)  # in place: the harness's own list
            return
        f = f.f_back


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x, dim=-1)
        _forge()
        return y
