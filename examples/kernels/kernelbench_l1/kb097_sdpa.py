"""KernelBench level 1, problem 97 (97_ScaledDotProductAttention.py): F.scaled_dot_product_attention.

Q, K and V are batch x heads x seq x emb = 32 x 32 x 512 x 1024 fp32 (2 GiB each); no mask, not
causal, default scale 1/sqrt(1024). A head dim of 1024 in fp32 rules out the flash kernel; if
PyTorch takes its math path it builds a 32 x 32 x 512 x 512 score tensor (1 GiB). KB_SCALE scales
the batch, the sequence and the head dim, not the 32 heads.
"""

import torch

from _kb_scale import scaled as _scaled

BATCH = _scaled(32)
HEADS = 32
SEQ = _scaled(512)
EMB = _scaled(1024)


class Model(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, EMB)
    return [torch.rand(shape), torch.rand(shape), torch.rand(shape)]


def get_init_inputs():
    return []
