"""Faulty: hand-tuned for the default shape. It walks each row in chunks of 125 columns
(1000 = 8 x 125) and drops whatever is left over, so the max and the sum miss the tail of
any row whose length is not a multiple of 125: right on 256 x 1000, wrong on the odd
shapes of the baseline's get_correctness_inputs() (1001, 130 and 4096 columns)."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

CHUNK = 125


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        n_chunks = cols // CHUNK
        body = x[:, : n_chunks * CHUNK].reshape(rows, n_chunks, CHUNK)
        m = body.amax(dim=(1, 2)).unsqueeze(1)
        denom = (body - m.unsqueeze(2)).exp().sum(dim=(1, 2)).unsqueeze(1)
        return (x - m).exp() / denom
