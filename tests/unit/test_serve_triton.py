"""The built-in server's Triton kernels (its GPU defaults), run on the CPU in Triton's interpreter
against the PyTorch references: one by one, through the start-up check, and inside the engine.

Triton decorates its own library functions when it is first imported, so the interpreter must be
on before that: the checks run together, in this process where the interpreter is already on
(tests/conftest.py), else in one child process with ``TRITON_INTERPRET=1``, and each test reports
its own check's outcome."""

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

from engine.serve import kernels as registry
from engine.serve.engine import Engine
from engine.serve.model import LlamaModel, model_config

pytest.importorskip("triton")

MODULE = "engine.serve.triton_kernels"
CHECKS = ("start_up_check", "decode_attention_blocks", "write_kv", "engine_tokens")
HERE = Path(__file__).resolve().parent


def run_checks() -> dict:
    """In the child: each check's traceback, or None when it passed."""
    from engine.serve import triton_kernels
    if type(triton_kernels._rmsnorm_kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("TRITON_INTERPRET=1 was not set before triton was imported")
    out = {}
    for name in CHECKS:
        try:
            globals()[f"check_{name}"](triton_kernels)
            out[name] = None
        except Exception:
            out[name] = traceback.format_exc()
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    # Here, when this process's Triton already runs in the interpreter (tests/conftest.py turns it
    # on where there is no GPU): a child would import torch and triton once more.
    if os.environ.get("TRITON_INTERPRET") == "1":
        from engine.serve import triton_kernels
        if type(triton_kernels._rmsnorm_kernel).__name__ == "InterpretedFunction":
            return run_checks()
    code = f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import test_serve_triton as t; print(json.dumps(t.run_checks()))"
    root = str(HERE.parents[1])
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", CHECKS)
def test_triton_kernel_in_the_interpreter(results, name):
    assert results[name] is None, results[name]


def check_start_up_check(interpreted):
    shapes = model_config("tiny")
    kernels = registry.resolve_kernels({}, device="cuda")  # the GPU defaults: Triton where there is one
    from engine.library import attention as library
    assert kernels.rmsnorm is interpreted.rmsnorm and kernels.decode_attention is library.decode_attention_split
    assert kernels.attention is library.varlen_attention_triton
    checked = registry.check_triton_defaults(kernels, shapes, torch.device("cpu"), torch.float32)
    assert checked.notes == () and checked.sources == kernels.sources

    def off_by_a_bit(x, weight, eps):
        return interpreted.rmsnorm(x, weight, eps) * 1.01

    # Only rmsnorm claims to be the Triton default here, so only it is checked (and replaced).
    wrong = registry.resolve_kernels({}).replace("rmsnorm", off_by_a_bit, f"{MODULE}:rmsnorm")
    checked = registry.check_triton_defaults(wrong, shapes, torch.device("cpu"), torch.float32)
    assert checked.rmsnorm is registry.rmsnorm and checked.sources["rmsnorm"] == "engine.serve.kernels:rmsnorm"
    assert len(checked.notes) == 1 and "rmsnorm" in checked.notes[0] and "AssertionError" in checked.notes[0]


def check_decode_attention_blocks(interpreted):
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d = 8, 2, 128  # the 8B's head size: 32-token blocks
    k_cache, v_cache = torch.randn(5, 100, hkv, d, generator=gen), torch.randn(5, 100, hkv, d, generator=gen)
    q = torch.randn(3, hq + 2, d, generator=gen)[:, :hq]  # a strided view, as out of a projection
    slots, lengths = torch.tensor([4, 0, 2]), torch.tensor([1, 33, 100], dtype=torch.int32)
    got = interpreted.decode_attention(q, k_cache, v_cache, slots, lengths, d ** -0.5)
    want = registry.decode_attention(q, k_cache, v_cache, slots, lengths, d ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Keys past a sequence's length never count: garbage there changes nothing.
    k_cache[0, 33:], v_cache[2, :, 0] = 1e4, float("nan")
    again = interpreted.decode_attention(q[:2], k_cache, v_cache, slots[:2], lengths[:2], d ** -0.5)
    torch.testing.assert_close(again, got[:2], rtol=1e-5, atol=1e-5)


def check_write_kv(interpreted):
    gen = torch.Generator().manual_seed(5)
    k_flat, v_flat = torch.zeros(40, 2, 16), torch.zeros(40, 2, 16)
    qkv = torch.randn(3, 8 * 16, generator=gen)  # q (4 heads), k, v (2 heads each), as the projection packs them
    k, v = qkv[:, 64:96].view(3, 2, 16), qkv[:, 96:].view(3, 2, 16)
    rows = torch.tensor([7, 0, 39])
    want_k, want_v = k_flat.clone().index_copy_(0, rows, k), v_flat.clone().index_copy_(0, rows, v)
    interpreted.write_kv(k_flat, v_flat, rows, k, v)  # v and k strided rows: the one-launch path
    assert torch.equal(k_flat, want_k) and torch.equal(v_flat, want_v)
    launches = []
    real = interpreted._write_kv_kernel

    class Recorded:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    interpreted._write_kv_kernel = Recorded()
    try:
        interpreted.write_kv(k_flat, v_flat, rows, k.contiguous(), v)
        interpreted.write_kv(k_flat, v_flat, rows, qkv[:, :64].view(3, 2, 32)[:, :, :16], v)  # heads not packed
    finally:
        interpreted._write_kv_kernel = real
    assert launches == [(3,)] and torch.equal(k_flat[rows], qkv[:, :64].view(3, 2, 32)[:, :, :16])


def check_engine_tokens(interpreted):
    config = model_config("tiny", num_layers=1, tie_embeddings=False)
    triton_model = LlamaModel(config, kernels=registry.resolve_kernels({}, device="cuda"))
    assert not triton_model.fused_kv_writes  # a CPU model; set here so the engine below writes through write_kv
    triton_model.fused_kv_writes = True
    reference = LlamaModel(config)
    prompts, max_tokens = [[5, 9, 2], [3, 300]], [3, 2]
    outputs = []
    # The Triton engine also packs its prompts padded to token buckets (as on a GPU): padding
    # sequences and empty ones go through the varlen kernel too.
    for model, packed in ((triton_model, True), (triton_model, False), (reference, False)):
        engine = Engine(model, max_batch_size=2, max_prefill_tokens=32, max_model_len=16, packed_prompts=packed)
        engine.warm_up()
        events: list[list] = [[], []]
        for prompt, n, sink in zip(prompts, max_tokens, events):
            engine.submit(prompt, n, True, sink.append)
        while engine.step() is not None:
            pass
        outputs.append([[ev.token for ev in evs] for evs in events])
        assert not packed or (engine.prefiller.disabled is None and engine.prefiller.eager_steps >= 1)
    assert outputs[0] == outputs[1] == outputs[2] and [len(t) for t in outputs[0]] == max_tokens
