"""KernelBench level 1, problem 95 (95_CrossEntropyLoss.py): mean cross-entropy of logits vs class ids.

Inputs: logits 32768 x 4096 fp32 (512 MiB) from U[0,1), and targets, 32768 int64 class indices in
[0, 4096). The output is a 0-d fp32 tensor (the mean loss, about log(4096) = 8.32). The targets
must reach the model unchanged: they are integers (no float cast) and indices (any value outside
[0, 4096) raises). KB_SCALE scales the batch and the class count.
"""

import torch

from _kb_scale import scaled as _scaled

BATCH = _scaled(32768)
NUM_CLASSES = _scaled(4096)


class Model(torch.nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, targets)


def get_inputs():
    return [torch.rand(BATCH, NUM_CLASSES), torch.randint(0, NUM_CLASSES, (BATCH,))]


def get_init_inputs():
    return []
