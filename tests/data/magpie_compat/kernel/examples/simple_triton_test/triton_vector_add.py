"""A vector add in the shape of Magpie's simple_triton_test: ``get_inputs()`` and functions called
with its inputs (``bench_target.callable``). Written with torch so it also runs without Triton."""

import sys

import torch


def get_inputs():
    return [torch.randn(1 << 12), torch.randn(1 << 12)]


def triton_vector_add(x, y):
    return x + y


def triton_vector_add_block256(x, y):
    return torch.add(x, y)


def triton_vector_add_block1024(x, y):
    out = torch.empty_like(x)
    torch.add(x, y, out=out)
    return out


if __name__ == "__main__" and "--check" in sys.argv:
    x, y = get_inputs()
    ok = all(torch.equal(f(x, y), x + y) for f in (triton_vector_add, triton_vector_add_block256,
                                                   triton_vector_add_block1024))
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)
