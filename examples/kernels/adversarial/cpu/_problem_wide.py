"""A test that is degenerate on its own inputs, for degenerate_compare.yaml: softmax over 262144
columns of small values (``randn * 0.1``), so every output element is about 4e-6, below
float32's default atol (1e-5): an all-zeros output passes these inputs. The engine's input set
redrawn from a heavy-tailed distribution has outputs near 1, where zeros fail."""

import torch


def get_inputs():
    return [torch.randn(4, 262144, dtype=torch.float32) * 0.1]


def get_init_inputs():
    return []
