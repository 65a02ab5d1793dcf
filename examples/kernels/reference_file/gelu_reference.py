"""The reference: exact GELU, x * Phi(x) (torch's default, the erf form). Named by
``reference_file:``; its outputs are the ones every kernel of the compare must match."""

import torch

from _gelu_inputs import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)
