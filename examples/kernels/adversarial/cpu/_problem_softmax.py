"""Softmax problem shared by softmax_compare.yaml and tamper_compare.yaml.

Row softmax over a float32 input of 256 x 1000, values ``randn * 4`` (rows with a clear
maximum, so an output of zeros, a constant or the input itself fails). The engine calls the
BASELINE module's ``get_inputs`` for every kernel, so a candidate cannot pick its own inputs.
``get_correctness_inputs`` (imported by the baseline only) adds odd shapes for the
correctness stage: a kernel specialised to 1000 columns fails there.
"""

import torch

ROWS, COLS = 256, 1000


def get_inputs():
    return [torch.randn(ROWS, COLS, dtype=torch.float32) * 4]


def get_correctness_inputs():
    return [[torch.randn(rows, cols, dtype=torch.float32) * 4] for rows, cols in ((7, 1001), (33, 130), (1, 4096))]


def get_init_inputs():
    return []
