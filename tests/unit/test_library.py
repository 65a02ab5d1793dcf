"""The bundled kernel library (engine.library): every catalog entry against the registry default
(engine.serve.kernels) on several shapes, through resolve_kernels, and inside the tiny model.

Triton kernels run in the interpreter on this CPU. Triton reads TRITON_INTERPRET when it is
imported, when each kernel is decorated and again in lazy imports at launch, so the variable must
be set before this process first imports triton and stay set while the kernels run: the
``library`` fixture sets it, imports the kernel modules (which import triton), and afterwards
forgets them and restores the environment (as tests/unit/test_serve_triton.py does for its
module). Nothing imports triton at collection. Where triton was already imported without the
interpreter (another plugin or test), the in-process Triton tests skip and one test runs them in
a fresh process instead.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from engine.library import CATALOG, OPS, LibraryInputError, LibraryKernel, candidates_for, kernel_named
from engine.serve import kernels as defaults
from engine.serve.kernels import KERNEL_KEYS, resolve_kernels
from engine.serve.model import PRESETS, LlamaModel

REPO = Path(__file__).resolve().parents[2]
MODULES = ("engine.library.rmsnorm", "engine.library.activation", "engine.library.rotary", "engine.library.attention")
DEFAULT = {"rmsnorm": defaults.rmsnorm, "activation": defaults.silu_and_mul, "rotary": defaults.rotary,
           "attention": defaults.varlen_attention, "decode_attention": defaults.decode_attention}
TOL = {"rtol": 2e-5, "atol": 2e-5}  # float32; the kernels reduce in another order than torch
ids = [k.name for k in CATALOG]


class Library:
    """What the kernel modules turned out to be in this process: ``triton_ok`` when the Triton
    candidates run here (in the interpreter), else ``why`` not and whether a fresh process can."""

    def __init__(self, triton_ok: bool, why: str, fresh_process_helps: bool) -> None:
        self.triton_ok, self.why, self.fresh_process_helps = triton_ok, why, fresh_process_helps

    def kernel(self, entry: LibraryKernel):
        if entry.backend == "triton" and not self.triton_ok:
            pytest.skip(self.why)
        return entry.load()


@pytest.fixture(scope="module")
def library():
    from engine.library._common import interpreted
    before = os.environ.get("TRITON_INTERPRET")
    standard = sys.modules.get("triton.language.standard")
    if standard is None or interpreted(standard.sum):  # triton not imported yet, or imported for the interpreter
        os.environ["TRITON_INTERPRET"] = "1"
    for m in MODULES:  # built by an earlier import without the interpreter, perhaps: build them again
        sys.modules.pop(m, None)
    from engine.library import _triton
    mods = [importlib.import_module(m) for m in MODULES]
    kernels = [v for m in mods for v in vars(m).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    if _triton.triton is None:
        lib = Library(False, "triton is not installed", False)
    elif kernels and all(interpreted(k) for k in kernels) and os.environ.get("TRITON_INTERPRET") == "1":
        lib = Library(True, "", False)
    else:
        lib = Library(False, "triton was imported in this process without TRITON_INTERPRET=1; "
                             "test_triton_candidates_in_a_fresh_process runs these instead", True)
    yield lib
    for m in MODULES:  # no later import in this session gets the interpreter's kernels
        sys.modules.pop(m, None)
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------ catalog
def test_catalog_covers_every_registry_op_with_unique_names_and_resolvable_paths():
    assert tuple(OPS) == tuple(KERNEL_KEYS)
    assert len({k.name for k in CATALOG}) == len(CATALOG)
    assert {"rmsnorm", "activation", "rotary", "attention"} <= {k.op for k in CATALOG} <= set(KERNEL_KEYS)
    assert {k.op for k in CATALOG if k.backend == "triton"} == set(KERNEL_KEYS)
    assert {k.backend for k in CATALOG} == {"torch", "triton"}
    for op in KERNEL_KEYS:
        assert [c[0] for c in candidates_for(op, "cpu")] == [k for k in CATALOG if k.op == op]
    assert kernel_named("rmsnorm_torch_fused").path == "engine.library.rmsnorm:rmsnorm_torch_fused"
    with pytest.raises(ValueError, match="unknown op 'softmax'"):
        candidates_for("softmax", "cpu")
    with pytest.raises(KeyError, match="rmsnorm_triton"):
        kernel_named("nope")
    with pytest.raises(ValueError, match="unknown backend"):
        LibraryKernel("rmsnorm", "x", "a.b:c", "cuda", "")


def test_availability_names_what_is_missing(monkeypatch):
    triton_entry, torch_entry = kernel_named("rmsnorm_triton"), kernel_named("rmsnorm_torch_fused")
    assert torch_entry.available("cpu") == (True, "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ok, why = triton_entry.available("cpu")
    assert not ok and "GPU" in why and "TRITON_INTERPRET=1" in why
    assert all(ok == (k.backend == "torch") for k, ok, _ in candidates_for("attention", torch.device("cpu")))
    ok, why = triton_entry.available("mps")
    assert not ok and "not supported" in why
    if not torch.cuda.is_available():
        for entry in (triton_entry, torch_entry):
            ok, why = entry.available("cuda:0")
            assert not ok and "no CUDA or ROCm GPU" in why


def test_a_module_built_before_the_interpreter_was_asked_for_is_not_available(monkeypatch):
    class JITFunction:  # the type triton.jit returns without the interpreter
        pass

    compiled = types.ModuleType("engine.library.rotary")
    compiled._rotary_triton_kernel = JITFunction()
    monkeypatch.setitem(sys.modules, "engine.library.rotary", compiled)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ok, why = kernel_named("rotary_triton").available("cpu")
    assert not ok and "was imported before TRITON_INTERPRET=1" in why  # rotary's module, or triton's own


def test_triton_is_available_on_the_cpu_in_the_interpreter(library):
    if not library.triton_ok:
        pytest.skip(library.why)
    ok, why = kernel_named("varlen_attention_triton").available("cpu")
    assert ok and "interpreter" in why


@pytest.mark.parametrize("entry", CATALOG, ids=ids)
def test_each_path_resolves_through_the_registry(library, entry):
    fn = library.kernel(entry)
    resolved = resolve_kernels({entry.op: entry.path})
    assert getattr(resolved, entry.op) is fn and resolved.sources[entry.op] == entry.path
    for other in set(KERNEL_KEYS) - {entry.op}:
        assert getattr(resolved, other) is DEFAULT[other]


# ------------------------------------------------------------------------ ops against defaults
def _rmsnorm_cases():
    g = _gen(1)
    big = torch.randn(6, 400, generator=g)
    yield "16x256", (torch.randn(16, 256, generator=g), torch.randn(256, generator=g), 1e-5)
    yield "7x100", (torch.randn(7, 100, generator=g), torch.randn(100, generator=g), 1e-6)
    yield "3x3000", (torch.randn(3, 3000, generator=g) * 40, torch.randn(3000, generator=g), 1e-5)
    yield "2x17000-two-pass", (torch.randn(2, 17000, generator=g), torch.randn(17000, generator=g), 1e-5)
    yield "strided-rows", (big[:, 50:350], torch.randn(300, generator=g), 1e-5)  # row stride 400
    yield "transposed", (torch.randn(64, 5, generator=g).t(), torch.randn(64, generator=g), 1e-5)
    yield "3-d", (torch.randn(2, 3, 64, generator=g), torch.randn(64, generator=g), 1e-5)
    yield "large-270x256", (torch.randn(270, 256, generator=g), torch.randn(256, generator=g), 1e-5)  # torch's 2nd path


def _activation_cases():
    g = _gen(2)
    yield "1x128", (torch.randn(1, 128, generator=g),)
    yield "6x600", (torch.randn(6, 600, generator=g),)
    yield "3x5000-multi-block", (torch.randn(3, 5000, generator=g) * 5,)
    yield "strided-rows", (torch.randn(4, 700, generator=g)[:, 50:650],)


def _rotary_cases():
    g = _gen(3)
    positions = 64
    for name, t, hq, hkv, d in (("mha-d64", 5, 4, 4, 64), ("gqa3-d48", 9, 6, 2, 48), ("mqa-d16", 3, 8, 1, 16)):
        angles = torch.rand(positions, d // 2, generator=g) * 20
        cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
        # q and k as the model has them: views into one fused QKV projection
        qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g)
        q, k, _ = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
        pos = torch.randint(0, positions, (t,), generator=g)
        yield name, (pos, q.view(t, hq, d), k.view(t, hkv, d), cache)


def varlen(q_lens, k_lens, hq, hkv, d, seed=4, dtype=torch.float32):
    g = _gen(seed)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(dtype)
    k, v = (torch.randn(sum(k_lens), hkv, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v, cu_q, cu_k, d ** -0.5


def _attention_cases():
    yield "one-prefill-gqa2", varlen([40], [40], 4, 2, 32)
    # mixed step: whole prompts, decodes whose context is longer, a chunked prefill (new < context)
    yield "mixed-gqa3-d40", varlen([7, 1, 33, 1, 5], [7, 70, 33, 9, 21], 6, 2, 40)
    yield "decode-only-mha", varlen([1, 1, 1], [1, 37, 12], 2, 2, 16)
    yield "prefills-only-mqa", varlen([3, 20, 9], [3, 20, 9], 4, 1, 32)
    yield "chunks-gqa4", varlen([2, 35], [50, 35], 8, 2, 16)
    yield "uniform-prefills", varlen([12, 12, 12], [12, 12, 12], 4, 2, 16)  # the padded one's no-gather view path


def _decode_cases():
    g = _gen(7)
    for name, b, hq, hkv, d, max_len, lengths in (("gqa2", 3, 4, 2, 32, 40, [1, 40, 17]),
                                                    ("mqa-d40", 2, 6, 1, 40, 24, [9, 3]),
                                                    ("mha", 1, 2, 2, 16, 8, [8])):
        k_cache, v_cache = (torch.randn(4, max_len, hkv, d, generator=g) for _ in range(2))
        slots = torch.randperm(4, generator=g)[:b]
        yield name, (torch.randn(b, hq, d, generator=g), k_cache, v_cache, slots,
                     torch.tensor(lengths, dtype=torch.int32), d ** -0.5)


CASES = {"rmsnorm": list(_rmsnorm_cases()), "activation": list(_activation_cases()),
         "rotary": list(_rotary_cases()), "attention": list(_attention_cases()),
         "decode_attention": list(_decode_cases())}
PAIRS = [pytest.param(entry, args, id=f"{entry.name}-{label}") for entry in CATALOG for label, args in CASES[entry.op]]


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("entry,args", PAIRS)
def test_candidate_matches_the_registry_default(library, entry, args):
    fn = library.kernel(entry)
    before = _clone(args)
    got, want = fn(*args), DEFAULT[entry.op](*args)
    torch.testing.assert_close(got, want, **TOL)
    for a, b in zip(args, before):  # never writes into its inputs
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_reduced_precision_matches_the_default(library):
    g = _gen(5)
    x, w = torch.randn(5, 300, generator=g), torch.randn(300, generator=g)
    for dtype in (torch.bfloat16, torch.float16):
        xd = x.to(dtype)
        names = ["rmsnorm_torch_fused", "silu_and_mul_torch_inplace"]
        names += ["rmsnorm_triton", "silu_and_mul_triton"] if library.triton_ok else []
        for name in names:
            entry = kernel_named(name)
            args = (xd, w.to(dtype), 1e-5) if entry.op == "rmsnorm" else (xd,)
            got = entry.load()(*args)
            assert got.dtype == dtype
            torch.testing.assert_close(got, DEFAULT[entry.op](*args), rtol=1.6e-2, atol=1e-2)
    # The interpreter's bf16 tl.dot is wrong (numpy has no bf16; checked against a bare dot on
    # Triton 3.9), so the Triton attention's reduced precision is checked in float16 only.
    args = varlen([6, 1], [6, 11], 4, 2, 32, dtype=torch.float16)
    attention = ["varlen_attention_padded"] + (["varlen_attention_triton"] if library.triton_ok else [])
    for name in attention:
        torch.testing.assert_close(kernel_named(name).load()(*args), defaults.varlen_attention(*args),
                                   rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------------------ in the model
PROMPTS = [[5, 9, 2, 7, 1, 44, 3], [3, 300, 11]]


def _run_model(kernels) -> list[torch.Tensor]:
    """Logits of the three kinds of step: whole prompts; a continued chunk (new tokens after a
    cached context) beside a new prompt; a decode step of three sequences of different lengths."""
    model = LlamaModel(PRESETS["tiny"], kernels=kernels)
    cache = model.new_cache(3, 32)
    out = [model.prefill(cache, [0, 1], [0, 0], PROMPTS)]
    out.append(model.prefill(cache, [0, 2], [len(PROMPTS[0]), 0], [[8, 1, 99], [4, 4, 2, 7]]))
    positions = torch.tensor([len(PROMPTS[0]) + 3, len(PROMPTS[1]), 4])
    out.append(model.decode(cache, torch.tensor([17, 23, 5]), positions, torch.tensor([0, 1, 2]),
                            (positions + 1).to(torch.int32)))
    return out


@pytest.fixture(scope="module")
def default_logits():
    return _run_model(resolve_kernels())


@pytest.mark.parametrize("entry", CATALOG, ids=ids)
def test_tiny_model_with_the_candidate_matches_the_default(library, default_logits, entry):
    library.kernel(entry)
    for got, want in zip(_run_model(resolve_kernels({entry.op: entry.path})), default_logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------ input checks
def _bad_calls():
    f32, g = torch.float32, _gen(6)
    x = torch.randn(4, 64, generator=g)
    q, k, v, cu_q, cu_k, scale = varlen([3, 1], [3, 5], 4, 2, 16)
    cache = torch.randn(32, 16, generator=g)
    pos = torch.tensor([0, 1, 2, 3])
    yield "rmsnorm", (x.long(), torch.ones(64), 1e-5), "x has dtype torch.int64"
    yield "rmsnorm", (x, torch.ones(63), 1e-5), "weight has 63 elements"
    yield "rmsnorm", (x, torch.ones(64, device="meta"), 1e-5), "weight is on meta"
    yield "activation", (torch.randn(4, 63, generator=g),), "must be even"
    yield "rotary", (pos, q, k, cache), "same number of tokens"
    yield "rotary", (pos, q, k[:4, :, :8], cache[:, :8]), "same even head size"
    yield "rotary", (pos.float(), q, k[:4], cache), "positions has dtype"
    yield "rotary", (torch.tensor([0, 1, 2, 40]), q, k[:4], cache), r"positions must lie in \[0, 32\)"
    yield "attention", (q, k, v[:, :1], cu_q, cu_k, scale), "k and v must have the same shape"
    yield "attention", (q[:, :3], k, v, cu_q, cu_k, scale), r"Hq \(3\) must be a multiple of Hkv \(2\)"
    yield "attention", (q, k, v, cu_q.to(f32), cu_k, scale), "cu_seqlens_q has dtype"
    yield "attention", (q, k, v, cu_q, torch.tensor([0, 2, 8], dtype=torch.int32), scale), "need 0 <= new <= keys"
    yield "attention", (q, k, v, cu_q, torch.tensor([0, 3, 6], dtype=torch.int32), scale), "S=8"
    caches = torch.randn(2, 8, 2, 16, generator=g)
    lengths = torch.tensor([3, 8], dtype=torch.int32)
    yield "decode_attention", (q[:2, :3], caches, caches, torch.tensor([0, 1]), lengths, scale), "Hq a multiple of Hkv"
    yield "decode_attention", (q[:2], caches, caches[:, :, :, :8], torch.tensor([0, 1]), lengths, scale), "does not fit"
    yield "decode_attention", (q[:2], caches, caches, torch.tensor([0]), lengths, scale), "2 queries but 1 slots"
    yield "decode_attention", (q[:2], caches, caches, torch.tensor([0., 1.]), lengths, scale), "slots has dtype"


# ------------------------------------------------------------------ split flash-decoding kernel
SPLIT_CASES = {  # name: (batch, Hq, Hkv, D, L, lengths): GQA 1, 4 and 8; 1, exactly L, not multiples of 64
    "mha-d32": (3, 4, 4, 32, 80, [1, 80, 33]),
    "gqa4-d64": (3, 8, 2, 64, 300, [300, 1, 129]),
    "gqa8-d40": (2, 8, 1, 40, 150, [65, 150]),
}


def _split_case(b, hq, hkv, d, capacity, lengths, dtype, seed=11, q_scale=1.0):
    """Inputs in five cache slots, used out of order (3, 0, 2): slots 1 and 4 never are. Returns
    the clean arguments and a copy whose caches hold NaN past each length and in the unused slots."""
    g = _gen(seed)
    k_cache, v_cache = (torch.randn(5, capacity, hkv, d, generator=g).to(dtype) for _ in range(2))
    q = (torch.randn(b, hq, d, generator=g) * q_scale).to(dtype)
    slots = torch.tensor([3, 0, 2][:b])
    lens = torch.tensor(lengths, dtype=torch.int32)
    poisoned_k, poisoned_v = k_cache.clone(), v_cache.clone()
    for cache in (poisoned_k, poisoned_v):
        cache[[1, 4]] = float("nan")
        for slot, n in zip(slots.tolist(), lengths):
            cache[slot, n:] = float("nan")
    return (q, k_cache, v_cache, slots, lens, d ** -0.5), (q, poisoned_k, poisoned_v, slots, lens, d ** -0.5)


class InterpretedFunction:
    """Stands in for an interpreted Triton kernel (``require_runnable`` checks that class name):
    records each launch grid in ``grids``, then launches the real kernel."""

    def __init__(self, kernel, grids: list) -> None:
        self.kernel, self.grids = kernel, grids

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("case", list(SPLIT_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_decode_attention_split_matches_the_default_and_ignores_the_cache_past_each_length(library, dtype, case):
    fn = library.kernel(kernel_named("decode_attention_split"))
    clean, poisoned = _split_case(*SPLIT_CASES[case], dtype)
    want = defaults.decode_attention(*clean)  # the default reads NaN through its mask: fed the clean caches
    got = fn(*poisoned)
    assert got.dtype == dtype and got.shape == want.shape and not got.isnan().any()
    tol = TOL if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-3}
    torch.testing.assert_close(got, want, **tol)


def test_decode_attention_split_walks_several_blocks_per_split_and_keeps_large_logits_safe(library, monkeypatch):
    from engine.library import attention
    fn = library.kernel(kernel_named("decode_attention_split"))
    # Two splits over five blocks of 64: each program walks blocks s, s + 2, s + 4. Scores of
    # tens of nats apart between splits stress the online softmax and the combine.
    monkeypatch.setattr(attention, "DECODE_MAX_SPLITS", 2)
    assert attention.decode_splits(300, 64) == 2
    clean, poisoned = _split_case(3, 8, 2, 64, 300, [300, 1, 257], torch.float32, seed=12, q_scale=8.0)
    torch.testing.assert_close(fn(*poisoned), defaults.decode_attention(*clean), **TOL)
    monkeypatch.undo()
    q, k_cache, v_cache, slots, lens, scale = clean
    past = fn(q, k_cache, v_cache, slots, torch.tensor([400, 1, 257], dtype=torch.int32), scale)
    torch.testing.assert_close(past, fn(*clean), rtol=0, atol=0)  # a length past L reads the L positions


def test_decode_attention_split_launch_grid_depends_on_shapes_only(library, monkeypatch):
    """What CUDA-graph capture needs: the same launches whatever the lengths' values."""
    from engine.library import attention
    fn = library.kernel(kernel_named("decode_attention_split"))
    grids: list = []
    for kernel in ("_decode_split_kernel", "_decode_combine_kernel"):
        monkeypatch.setattr(attention, kernel, InterpretedFunction(getattr(attention, kernel), grids))
    clean, _ = _split_case(2, 8, 1, 40, 150, [65, 150], torch.float32)
    q, k_cache, v_cache, slots, _, scale = clean
    for lengths in ([1, 1], [65, 150], [150, 150]):
        fn(q, k_cache, v_cache, slots, torch.tensor(lengths, dtype=torch.int32), scale)
    # float32 takes blocks of 32 positions: cdiv(L = 150, 32) = 5 splits, from L alone
    assert grids[:2] == [(2, 1, 5), (2, 8)] and grids == grids[:2] * 3


def test_decode_splits_are_the_fewest_that_fill_the_gpu():
    from engine.library.attention import decode_splits
    # H200: 132 SMs, 264 programs wanted; 1B shape (8 kv heads), cache of 1024, blocks of 64
    assert [decode_splits(1024, 64, b * 8, 264) for b in (64, 32, 16, 4, 1)] == [1, 2, 3, 9, 16]
    assert decode_splits(100, 64, 8, 264) == 2  # never more splits than blocks of the cache
    assert decode_splits(1024, 64, 8, 0) == 16  # the CPU: every split the capacity allows


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_decode_attention_with_one_split_writes_the_output_without_a_combine(library, monkeypatch, case):
    """A large batch on a GPU: one split per (sequence, kv head), the output written by the
    first launch; the same numbers as the default, NaN past each length never read."""
    from engine.library import attention
    fn = library.kernel(kernel_named("decode_attention_split"))
    monkeypatch.setattr(attention, "decode_programs", lambda device: 1)
    launched: list = []
    monkeypatch.setattr(attention, "_decode_combine_kernel", InterpretedFunction(attention._decode_combine_kernel, launched))
    clean, poisoned = _split_case(*SPLIT_CASES[case], torch.float32, seed=13, q_scale=4.0)
    got = fn(*poisoned)
    assert not launched and not got.isnan().any()
    torch.testing.assert_close(got, defaults.decode_attention(*clean), **TOL)


def test_decode_attention_split_refuses_what_it_cannot_compute(library):
    fn = library.kernel(kernel_named("decode_attention_split"))
    (q, k_cache, v_cache, slots, lens, scale), _ = _split_case(2, 4, 2, 32, 80, [3, 80], torch.float32)
    strided = torch.randn(5, 80, 2, 64).to(torch.float32)[..., ::2]  # head size 32 with stride 2
    wide = torch.randn(1, 4, 2, 264)
    for args, message in (
        ((q, strided, v_cache, slots, lens, scale), "contiguous head dimension"),
        ((q[:1, :, :8].repeat(1, 1, 33), wide, wide, slots[:1], lens[:1], scale), "head size 264 is over the 256"),
        ((q, k_cache, v_cache, torch.tensor([3, 5]), lens, scale), r"slots must lie in \[0, 5\)"),
        ((q, k_cache, v_cache, slots, torch.tensor([0, 4], dtype=torch.int32), scale), "lengths must be >= 1"),
        ((q, k_cache, v_cache, slots, lens, None), "scale must be a float"),
    ):
        with pytest.raises(LibraryInputError, match=message):
            fn(*args)


BAD = [pytest.param(entry, args, msg, id=f"{entry.name}-{i}") for entry in CATALOG
       for i, (op, args, msg) in enumerate(_bad_calls()) if op == entry.op
       # the torch RMSNorm leaves checks to torch's own errors (its hot path is dispatch-bound)
       and not (entry.name == "rmsnorm_torch_fused")
       and not (entry.name == "silu_and_mul_torch_inplace" and "even" not in msg)]


@pytest.mark.parametrize("entry,args,message", BAD)
def test_bad_inputs_raise_a_value_error_naming_the_problem(library, entry, args, message):
    fn = library.kernel(entry)
    with pytest.raises(ValueError, match=message) as info:
        fn(*args)
    assert isinstance(info.value, LibraryInputError) and entry.name in str(info.value)


def test_a_compiled_triton_kernel_refuses_cpu_tensors(library):
    from engine.library._triton import require_runnable
    if not library.triton_ok:
        pytest.skip(library.why)

    class CompiledKernel:  # what triton.jit returns without the interpreter
        pass

    with pytest.raises(LibraryInputError, match="needs a GPU .*TRITON_INTERPRET=1"):
        require_runnable("rmsnorm_triton", CompiledKernel(), (torch.ones(2),))
    require_runnable("rmsnorm_triton", CompiledKernel(), (torch.ones(2, device="meta"),))  # a device tensor passes


def test_triton_candidates_in_a_fresh_process(library):
    """The fallback for a session that imported triton without the interpreter."""
    if not library.fresh_process_helps:
        pytest.skip("the Triton candidates were tested in this process" if library.triton_ok else library.why)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "triton or decode_attention_split"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# ----------------------------------------------------------------------- GPU code generation
COMPILE_CHECK = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from engine.library import activation, attention, rmsnorm, rotary

    def compile_for(kernel, types, consts):
        sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in kernel.arg_names}
        for target in (GPUTarget("cuda", 90, 32), GPUTarget("hip", "gfx942", 64)):
            asm = triton.compile(ASTSource(kernel, sig, consts), target=target, options={"num_warps": 4}).asm
            assert ("cubin" if target.backend == "cuda" else "hsaco") in asm, (kernel, target)

    bf = "*bf16"
    compile_for(rmsnorm._rmsnorm_triton_kernel, dict(x_ptr=bf, w_ptr=bf, out_ptr=bf, eps="fp32"),
                dict(BLOCK=8192, ONE_PASS=True))
    compile_for(activation._silu_and_mul_triton_kernel, dict(x_ptr=bf, out_ptr=bf), dict(BLOCK=1024))
    compile_for(rotary._rotary_triton_kernel, dict(pos_ptr="*i64", cache_ptr="*fp32", q_ptr=bf, q_out_ptr=bf, k_ptr=bf,
                k_out_ptr=bf), dict(BLOCK_HQ=32, BLOCK_HK=8, BLOCK_HALF=32))
    for dt, block, ieee, direct in ((bf, 64, False, True), (bf, 64, False, False), ("*fp32", 32, True, False)):
        compile_for(attention._varlen_flash_kernel, dict(q_ptr=dt, k_ptr=dt, v_ptr=dt, o_ptr=dt, cu_q_ptr="*i32",
                    cu_k_ptr="*i32", scale="fp32"), dict(BLOCK_M=block, BLOCK_N=block, BLOCK_D=64, BLOCK_B=256, IEEE=ieee))
        compile_for(attention._decode_split_kernel, dict(q_ptr=dt, k_ptr=dt, v_ptr=dt, slots_ptr="*i64",
                    lens_ptr="*i32", acc_ptr="*fp32", max_ptr="*fp32", sum_ptr="*fp32", out_ptr=dt,
                    scale_log2="fp32"), dict(BLOCK_G=16, BLOCK_N=block, BLOCK_D=64, IEEE=ieee, DIRECT=direct))
        compile_for(attention._decode_combine_kernel, dict(acc_ptr="*fp32", max_ptr="*fp32", sum_ptr="*fp32",
                    lens_ptr="*i32", out_ptr=dt), dict(BLOCK_N=block, BLOCK_S=16, BLOCK_D=64))
    from engine.serve import triton_kernels
    compile_for(triton_kernels._write_kv_kernel, dict(K=bf, V=bf, KC=bf, VC=bf, Rows="*i64"), dict(N=512, BLOCK=512))
    print("compiled")
""")


def test_triton_kernels_compile_for_cuda_and_rocm_without_a_gpu():
    """No GPU here, so compile ahead of time for an H100 (sm_90) and an MI300 (gfx942): catches
    an intrinsic or construct that one vendor's backend lacks. A fresh process: in this one the
    kernels are interpreter objects."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", COMPILE_CHECK], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-4000:]
