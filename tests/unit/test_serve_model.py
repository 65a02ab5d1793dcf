"""The built-in server's model, kernel registry, continuous batching and step annotations."""

import dataclasses
import sys
import textwrap

import pytest
import torch

from engine.config.yamlfile import ConfigError
from engine.serve.engine import Engine, TokenEvent, step_annotation
from engine.serve.kernels import KERNEL_KEYS, KernelError, resolve_kernels
from engine.serve.model import PRESETS, LlamaModel, greedy, model_config
from engine.serve.server import load_serve_config
from engine.serve.tokenizer import BOS_ID, EOS_ID, StreamDecoder, chat_prompt, decode, encode
from engine.trace.steps import parse_step_annotation

PROMPTS = [[5, 9, 2, 7, 1], [3, 300, 11], [BOS_ID, 42, 17, 99, 4, 8, 250, 33]]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel(PRESETS["tiny"])


def _generate_alone(model: LlamaModel, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    cache = model.new_cache(len(prompt) + steps)
    logits = [model.prefill([prompt], [cache])[0]]
    tokens = [greedy(logits[-1][None])[0]]
    for _ in range(steps - 1):
        logits.append(model.decode([tokens[-1]], [cache])[0])
        tokens.append(greedy(logits[-1][None])[0])
    return tokens, logits


def test_batched_prefill_and_decode_match_one_sequence_at_a_time(model):
    steps = 4
    alone = [_generate_alone(model, p, steps) for p in PROMPTS]
    caches = [model.new_cache(len(p) + steps) for p in PROMPTS]
    logits = model.prefill(PROMPTS, caches)
    for step in range(steps):
        for i, (_, ref) in enumerate(alone):
            torch.testing.assert_close(logits[i], ref[step], rtol=1e-4, atol=1e-4)
        if step < steps - 1:
            logits = model.decode([tokens[step] for tokens, _ in alone], caches)
    assert [c.length for c in caches] == [len(p) + steps - 1 for p in PROMPTS]


def test_kv_cache_decode_equals_recomputing_the_whole_sequence(model):
    prompt = PROMPTS[2]
    tokens, logits = _generate_alone(model, prompt, 3)
    full = prompt + tokens[:2]
    recomputed = model.forward([full], [model.new_cache(len(full))])[0]
    torch.testing.assert_close(logits[2], recomputed, rtol=1e-4, atol=1e-4)


def test_mixed_step_equals_separate_prefill_and_decode(model):
    tokens, logits = _generate_alone(model, PROMPTS[0], 2)
    a, b = model.new_cache(len(PROMPTS[0]) + 2), model.new_cache(len(PROMPTS[1]) + 1)
    model.prefill([PROMPTS[0]], [a])
    mixed = model.forward([[tokens[0]], PROMPTS[1]], [a, b])  # one decode and one prefill together
    torch.testing.assert_close(mixed[0], logits[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mixed[1], _generate_alone(model, PROMPTS[1], 1)[1][0], rtol=1e-4, atol=1e-4)


def test_weights_are_seeded_and_sizes_follow_the_config():
    a, b = LlamaModel(PRESETS["tiny"]), LlamaModel(PRESETS["tiny"])
    assert torch.equal(a.embed.weight, b.embed.weight)
    c = LlamaModel(model_config("tiny", seed=1, num_layers=3))
    assert len(c.layers) == 3 and not torch.equal(a.embed.weight, c.embed.weight)
    assert a.dtype == torch.float32
    assert sum(p.numel() for p in a.parameters()) == PRESETS["tiny"].num_parameters()
    assert 1.0e9 < PRESETS["1b"].num_parameters() < 1.5e9
    with pytest.raises(ValueError, match="unknown model field 'layers'"):
        model_config("tiny", layers=3)
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        model_config("huge")


def test_cache_overflow_is_an_error(model):
    cache = model.new_cache(3)
    with pytest.raises(ValueError, match="exceed the cache capacity 3"):
        model.prefill([[1, 2, 3, 4]], [cache])


# -- step annotations ------------------------------------------------------------------------

def test_step_annotation_parses_with_the_trace_analysis_aggregates():
    name = step_annotation([(5, 5), (3, 3)], [(1, 10), (1, 20), (1, 7)])
    assert name == "execute_11_context_2(sq8sk8sqsq34sqsk34)_generation_3(sq3sk37sqsq3sqsk37)"
    info = parse_step_annotation(name)
    assert info is not None and info.detailed and info.framework == "vllm"
    assert (info.kind, info.context_requests, info.generation_requests) == ("prefilldecode", 2, 3)
    assert (info.c_sq, info.c_sk, info.c_sqsq, info.c_sqsk) == (8, 8, 34, 34)
    assert (info.g_sq, info.g_sk, info.g_sqsq, info.g_sqsk) == (3, 37, 3, 37)
    assert info.batch_size == 11 and info.num_requests == 5
    assert parse_step_annotation(step_annotation([(4, 4)], [])).kind == "prefill"
    assert parse_step_annotation(step_annotation([], [(1, 9)])).kind == "decode"


def _collect(events: dict[str, list[TokenEvent]], key: str):
    events[key] = []
    return events[key].append


def test_engine_batches_continuously_and_annotates_each_step(model):
    engine = Engine(model, max_batch_size=2)
    events: dict[str, list[TokenEvent]] = {}
    engine.submit(PROMPTS[0], 3, True, _collect(events, "a"))
    engine.submit(PROMPTS[1], 2, True, _collect(events, "b"))
    engine.submit(PROMPTS[2], 2, True, _collect(events, "c"))  # waits: the batch is full
    names = []
    while (name := engine.step()) is not None:
        names.append(name)
    steps = [parse_step_annotation(n) for n in names]
    assert [(s.context_requests, s.generation_requests) for s in steps] == [(2, 0), (0, 2), (1, 1), (0, 1)]
    first, second, third, fourth = steps
    assert (first.c_sq, first.c_sk, first.c_sqsq, first.c_sqsk) == (8, 8, 25 + 9, 25 + 9)
    assert (second.g_sq, second.g_sk, second.g_sqsq, second.g_sqsk) == (2, 6 + 4, 2, 10)
    # b finished after 2 tokens, so c is admitted beside a's last decode token (sk = 5 + 2).
    assert (third.c_sq, third.c_sk, third.c_sqsq, third.g_sq, third.g_sk, third.g_sqsk) == (8, 8, 64, 1, 7, 7)
    assert (fourth.g_sq, fourth.g_sk, fourth.kind) == (1, 9, "decode")
    for key, prompt, n in (("a", PROMPTS[0], 3), ("b", PROMPTS[1], 2), ("c", PROMPTS[2], 2)):
        assert [e.token for e in events[key]] == _generate_alone(model, prompt, n)[0]
        assert [e.finish_reason for e in events[key]] == [None] * (n - 1) + ["length"]
    assert engine.num_unfinished == 0


def test_eos_stops_unless_ignore_eos(model):
    first = _generate_alone(model, PROMPTS[0], 1)[0][0]
    engine = Engine(model, eos_id=first)
    events: dict[str, list[TokenEvent]] = {}
    engine.submit(PROMPTS[0], 4, False, _collect(events, "stop"))
    engine.submit(PROMPTS[0], 4, True, _collect(events, "ignore"))
    while engine.step() is not None:
        pass
    assert [e.finish_reason for e in events["stop"]] == ["stop"]
    assert [e.finish_reason for e in events["ignore"]] == [None, None, None, "length"]


def test_engine_rejects_requests_the_model_cannot_run(model):
    engine = Engine(model)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit([1, 512], 2, True, print)
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 2048"):
        engine.submit([1] * 2000, 100, True, print)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        engine.submit([1], 0, True, print)


def test_a_failing_kernel_fails_the_steps_requests_not_the_engine():
    def broken(x):
        raise RuntimeError("kernel exploded")

    engine = Engine(LlamaModel(PRESETS["tiny"], kernels=dataclasses.replace(resolve_kernels(), activation=broken)))
    events: dict[str, list[TokenEvent]] = {}
    engine.submit([1, 2], 2, True, _collect(events, "a"))
    engine.step()
    assert events["a"] == [TokenEvent(None, error="RuntimeError: kernel exploded")]
    assert engine.step() is None


# -- kernel registry -------------------------------------------------------------------------

CANDIDATE = textwrap.dedent("""
    import torch
    calls = {"rmsnorm": 0, "activation": 0, "rotary": 0, "attention": 0}

    def rmsnorm(x, weight, eps):
        calls["rmsnorm"] += 1
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def silu_and_mul(x):
        calls["activation"] += 1
        d = x.shape[-1] // 2
        return x[:, :d] * torch.sigmoid(x[:, :d]) * x[:, d:]

    def rotary(positions, q, k, cos_sin_cache):
        from engine.serve.kernels import rotary as default
        calls["rotary"] += 1
        return default(positions, q, k, cos_sin_cache)

    def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale):
        # Dense masked attention over the packed tokens: one matmul, no per-sequence loop.
        calls["attention"] += 1
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        seq_q = torch.repeat_interleave(torch.arange(len(cu_seqlens_q) - 1), (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long())
        seq_k = torch.repeat_interleave(torch.arange(len(cu_seqlens_k) - 1), (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).long())
        pos_q = torch.arange(len(seq_q)) - cu_seqlens_q[seq_q] + (cu_seqlens_k[seq_q + 1] - cu_seqlens_k[seq_q]) - (cu_seqlens_q[seq_q + 1] - cu_seqlens_q[seq_q])
        pos_k = torch.arange(len(seq_k)) - cu_seqlens_k[seq_k]
        mask = (seq_q[:, None] == seq_k[None, :]) & (pos_k[None, :] <= pos_q[:, None])
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        scores = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", scores, v)

    def two_args(x, weight):
        return x

    not_a_function = 3
""")


@pytest.fixture
def candidate(tmp_path, monkeypatch):
    (tmp_path / "serve_candidate.py").write_text(CANDIDATE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("serve_candidate", None)
    import serve_candidate
    yield serve_candidate
    sys.modules.pop("serve_candidate", None)


def test_swapped_in_kernels_are_called_and_match_the_defaults(model, candidate):
    overrides = {"rmsnorm": "serve_candidate:rmsnorm", "activation": "serve_candidate.silu_and_mul",
                 "rotary": "serve_candidate:rotary", "attention": "serve_candidate:attention"}
    kernels = resolve_kernels(overrides)
    assert dict(kernels.sources) == overrides
    swapped = LlamaModel(PRESETS["tiny"], kernels=kernels)
    caches = [swapped.new_cache(len(p) + 1) for p in PROMPTS]
    ref_caches = [model.new_cache(len(p) + 1) for p in PROMPTS]
    torch.testing.assert_close(swapped.prefill(PROMPTS, caches), model.prefill(PROMPTS, ref_caches), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(swapped.decode([1, 2, 3], caches), model.decode([1, 2, 3], ref_caches), rtol=1e-4, atol=1e-4)
    layers = PRESETS["tiny"].num_layers
    assert candidate.calls == {"rmsnorm": 2 * (2 * layers + 1), "activation": 2 * layers, "rotary": 2 * layers,
                               "attention": 2 * layers}


def test_defaults_when_nothing_is_overridden():
    kernels = resolve_kernels({})
    assert set(kernels.sources) == set(KERNEL_KEYS)
    assert kernels.sources["attention"] == "engine.serve.kernels:varlen_attention"


@pytest.mark.parametrize("overrides, message", [
    ({"layernorm": "x:y"}, r"kernels\.layernorm: unknown kernel key"),
    ({"rmsnorm": "no_such_module_xyz:rmsnorm"}, r"kernels\.rmsnorm: cannot import module 'no_such_module_xyz'"),
    ({"activation": "serve_candidate:missing"}, r"kernels\.activation: module 'serve_candidate' has no attribute 'missing'"),
    ({"rotary": "serve_candidate:not_a_function"}, r"kernels\.rotary: 'serve_candidate:not_a_function' is a int"),
    ({"rmsnorm": "serve_candidate:two_args"}, r"kernels\.rmsnorm: 'serve_candidate:two_args' has signature \(x, weight\)"),
    ({"attention": "serve_candidate:rmsnorm"}, r"kernels\.attention: 'serve_candidate:rmsnorm'.*6 positional"),
    ({"rmsnorm": "justaname"}, r"kernels\.rmsnorm: 'justaname' is not a dotted path"),
])
def test_bad_overrides_name_the_key_and_the_path(candidate, overrides, message):
    with pytest.raises(KernelError, match=message):
        resolve_kernels(overrides)


# -- tokenizer and config --------------------------------------------------------------------

def test_byte_tokenizer_round_trips_and_streams_split_characters():
    ids = encode("héllo")
    assert ids == [BOS_ID, 104, 195, 169, 108, 108, 111]
    assert decode(ids + [EOS_ID]) == "héllo"
    assert decode([104 + 256 * 3]) == "h"  # ids past the bytes wrap around
    stream = StreamDecoder()
    assert [stream.feed(t) for t in ids] == ["", "h", "", "é", "l", "l", "o"]
    assert chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]) \
        == "system: be brief\nuser: hi\nassistant: "


def test_example_configs_load_and_bad_keys_name_file_and_line(tmp_path):
    from conftest import REPO
    tiny = load_serve_config(REPO / "examples" / "serve" / "tiny_cpu.yaml")
    assert (tiny.model, tiny.device, tiny.max_batch_size) == ("tiny", "cpu", 16)
    gpu = load_serve_config(REPO / "examples" / "serve" / "llama1b_gpu.yaml")
    assert (gpu.model, gpu.dtype, gpu.name) == ("1b", "bfloat16", "llama-1b-random")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny\nmax_batch_size: 0\nmax_batch: 4\nprofiler_dir: traces\n")
    with pytest.raises(ConfigError) as err:
        load_serve_config(bad)
    assert f"{bad}:2: max_batch_size:" in str(err.value) and f"{bad}:3: max_batch:" in str(err.value)
    bad.write_text("profiler_dir: traces\n")
    assert load_serve_config(bad).profiler_dir == str(tmp_path / "traces")
