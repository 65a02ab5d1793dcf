"""Cheat: honest for its first 20 calls (the correctness checks), then it stops computing and
returns the last result again: every warm-up and timed call costs nothing. Only a check of
the timed calls' own outputs, on inputs that differ from call to call, catches it."""

import torch

from _problem_matmul import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

HONEST_CALLS = 20


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.last = None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls <= HONEST_CALLS or self.last is None or self.last.shape != (a.shape[0], b.shape[1]):
            self.last = a @ b
        return self.last
