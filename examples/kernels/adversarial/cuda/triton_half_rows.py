"""Cheat: launches programs for only the first half of the rows and leaves the rest of a
torch.empty_like output unwritten (half the work). With PyTorch's caching allocator the
block usually comes back holding the previous call's output, so a harness that calls
twice on the same input sees the right numbers in the unwritten half. The engine poisons
fresh allocations (and the allocator's free blocks) with NaN."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)
from _triton_softmax import launch


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        launch(x, y, (x.shape[0] + 1) // 2)
        return y
