"""KernelBench level 1, problem 95 (95_CrossEntropyLoss.py): mean cross-entropy of logits vs class ids.

Inputs: logits 32768 x 4096 fp32 (512 MiB) from U[0,1), and targets, 32768 int64 class indices in
[0, 4096). The output is a 0-d fp32 tensor (the mean loss, about log(4096) = 8.32). The targets
must reach the model unchanged: they are integers (no float cast) and indices (any value outside
[0, 4096) raises). KB_SCALE scales the batch and the class count.
"""

import os

import torch


def _scaled(n: int, minimum: int = 1) -> int:
    """n times $KB_SCALE (default 1.0), at least `minimum`, with n's parity kept."""
    scale = float(os.environ.get("KB_SCALE", "1.0"))
    if scale <= 0:
        raise ValueError(f"KB_SCALE must be > 0, got {scale}")
    v = max(minimum, round(n * scale))
    return v + 1 if v % 2 != n % 2 else v


BATCH = _scaled(32768)
NUM_CLASSES = _scaled(4096)


class Model(torch.nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, targets)


def get_inputs():
    return [torch.rand(BATCH, NUM_CLASSES), torch.randint(0, NUM_CLASSES, (BATCH,))]


def get_init_inputs():
    return []
