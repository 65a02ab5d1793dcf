"""Cheat: replaces torch.cuda.synchronize with a no-op from inside its call, so a harness
that brackets a call with synchronize() and a host clock stops its clock when the kernel
is launched, not when it finishes. The result is honest (torch.softmax); every other
synchronisation (events, stream waits, .cpu()) still works, so the answer checks out."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


def _no_wait(device=None) -> None:
    return None


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda.synchronize = _no_wait
        return torch.softmax(x, dim=-1)
