"""The built-in server's registry ops, in a module that imports nothing heavy: the launch form,
the job API and ``magpie optimize --kernel`` list and check them without importing torch (a
first import of ``engine.serve.kernels`` takes seconds)."""

KERNEL_KEYS: tuple[str, ...] = ("rmsnorm", "activation", "rotary", "attention", "decode_attention")
# The server's own PyTorch implementation of each key, its default on the CPU (and on a GPU
# without Triton): ``engine.serve.kernels`` checks at its import that these name its defaults.
REFERENCE_PATHS: dict[str, str] = {
    "rmsnorm": "engine.serve.kernels:rmsnorm",
    "activation": "engine.serve.kernels:silu_and_mul",
    "rotary": "engine.serve.kernels:rotary",
    "attention": "engine.serve.kernels:varlen_attention",
    "decode_attention": "engine.serve.kernels:decode_attention",
}
