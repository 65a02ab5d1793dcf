"""GPU softmax problem shared by every CUDA case: bfloat16, 8192 x 4000 (64 MB in, 64 MB
out; about 27 us at the H200's 4.8 TB/s), values randn * 4. ADV_ROWS / ADV_COLS override
the shape (small shapes let the Triton files run in Triton's CPU interpreter).
get_inputs returns CPU tensors; the engine moves them to the GPU."""

import os

import torch


def shape() -> tuple[int, int]:
    return int(os.environ.get("ADV_ROWS", 8192)), int(os.environ.get("ADV_COLS", 4000))


def get_inputs():
    rows, cols = shape()
    return [(torch.randn(rows, cols) * 4).to(torch.bfloat16)]


def get_init_inputs():
    return []
