"""A wrong baseline: GELU's tanh approximation, off the exact GELU by up to about 5e-4 on these
inputs. Judged against its own outputs it would look right; judged against the reference
(gelu_reference.py) it is incorrect."""

import torch

from _gelu_inputs import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")
