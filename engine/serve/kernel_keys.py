"""The built-in server's registry ops, in a module that imports nothing heavy: the launch form,
the job API and ``magpie optimize --kernel`` list and check them without importing torch (a
first import of ``engine.serve.kernels`` takes seconds)."""

KERNEL_KEYS: tuple[str, ...] = ("rmsnorm", "activation", "rotary", "attention", "decode_attention")
