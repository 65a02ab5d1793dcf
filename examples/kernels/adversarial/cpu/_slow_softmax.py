"""A deliberately slow but correct softmax for controls_compare.yaml: a Python loop over
blocks of rows, five separate eager passes per block (max, subtract, exp, sum, divide)."""

import torch


def blocked_softmax(x: torch.Tensor, block_rows: int) -> torch.Tensor:
    out = torch.empty_like(x)
    for i in range(0, x.shape[0], block_rows):
        r = x[i:i + block_rows]
        e = (r - r.amax(dim=-1, keepdim=True)).exp()
        out[i:i + block_rows] = e / e.sum(dim=-1, keepdim=True)
    return out
