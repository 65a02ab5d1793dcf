"""The built-in server's model, static KV cache, decode runner, kernel registry, continuous
batching and step annotations, on the CPU against a reference decoder that has no cache."""

import dataclasses
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from engine.config.yamlfile import ConfigError
from engine.serve.engine import Engine, TokenEvent, step_annotation
from engine.serve.graphs import PAD_SEQ, DecodeRunner, PrefillRunner, batch_buckets, token_buckets
from engine.serve.kernels import KERNEL_KEYS, KernelError, resolve_kernels
from engine.serve.model import PRESETS, LlamaModel, model_config
from engine.serve.server import load_serve_config
from engine.serve.tokenizer import BOS_ID, EOS_ID, StreamDecoder, chat_prompt, decode, encode
from engine.trace.steps import parse_step_annotation

PROMPTS = [[5, 9, 2, 7, 1], [3, 300, 11], [BOS_ID, 42, 17, 99, 4, 8, 250, 33]]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    # Untied embeddings: the tied tiny model mostly repeats its last token, which would let a
    # wrong attention pass a token comparison.
    return LlamaModel(model_config("tiny", tie_embeddings=False))


def reference_logits(model: LlamaModel, tokens: list[int]) -> torch.Tensor:
    """Logits after the last of ``tokens``, recomputing the whole sequence with plain torch ops
    (no cache, no registry kernels, causal SDPA): what the static-cache path must reproduce."""
    cfg = model.config
    t, hq, hkv, d = len(tokens), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(t, dtype=torch.float64), inv)
    cos, sin = angles.cos().float()[:, None], angles.sin().float()[:, None]

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_eps) * w

    def rope(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    x = model.embed.weight[tokens]
    for layer in model.layers:
        q, k, v = (norm(x, layer.input_norm) @ layer.qkv.weight.T).split((hq * d, hkv * d, hkv * d), dim=-1)
        q, k, v = rope(q.view(t, hq, d)), rope(k.view(t, hkv, d)), v.view(t, hkv, d)
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        x = x + att.transpose(0, 1).reshape(t, hq * d) @ layer.o.weight.T
        gate, up = (norm(x, layer.post_norm) @ layer.gate_up.weight.T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ layer.down.weight.T
    head = model.embed.weight if model.lm_head is None else model.lm_head.weight
    return (norm(x[-1:], model.final_norm) @ head.T)[0]


def reference_tokens(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(reference_logits(model, prompt + out).argmax()))
    return out


def run_engine(engine: Engine, prompts: list[list[int]], max_tokens: list[int]) -> tuple[list[list[int]], list[str]]:
    events: list[list[TokenEvent]] = [[] for _ in prompts]
    for prompt, n, sink in zip(prompts, max_tokens, events):
        engine.submit(prompt, n, True, sink.append)
    names = []
    while (name := engine.step()) is not None:
        names.append(name)
    assert all(ev.error is None for evs in events for ev in evs)
    return [[ev.token for ev in evs] for evs in events], names


# -- the static KV cache ------------------------------------------------------------------------

def test_prefill_and_padded_decode_match_the_reference_and_touch_only_their_slots(model):
    cache = model.new_cache(num_slots=5, max_len=64)
    runner = DecodeRunner(model, cache, pad_slot=4, buckets=[1, 2, 4], rows=4)
    slots = [2, 0, 3]  # not in order; slot 1 stays unused
    logits = model.prefill(cache, slots, [0, 0, 0], PROMPTS)
    seqs = [list(p) for p in PROMPTS]
    for _ in range(4):
        for i, seq in enumerate(seqs):
            torch.testing.assert_close(logits[i], reference_logits(model, seq), rtol=1e-4, atol=1e-4)
        nxt = logits.argmax(dim=-1).tolist()
        positions = [len(s) for s in seqs]
        for seq, tok in zip(seqs, nxt):
            seq.append(tok)
        logits = runner.logits(nxt, positions, slots, graph=False)  # 3 rows padded to the bucket of 4
        assert logits.shape == (3, model.config.vocab_size)
    assert runner.eager_steps == 0 and not runner.graphs  # logits() is the check path, not counted as steps
    assert not cache.k[:, 1].any() and not cache.v[:, 1].any()
    for slot, seq in zip(slots, seqs):  # each slot holds exactly its sequence's positions, nothing after
        assert cache.k[:, slot, :len(seq)].abs().sum(dim=(2, 3)).all()
        assert not cache.k[:, slot, len(seq):].any()


def test_a_prompt_prefilled_in_chunks_equals_it_prefilled_whole(model):
    prompt = PROMPTS[2] + PROMPTS[0]
    whole, chunked = model.new_cache(2, 32), model.new_cache(2, 32)
    want = model.prefill(whole, [1], [0], [prompt])
    model.prefill(chunked, [1], [0], [prompt[:4]])
    model.prefill(chunked, [1, 0], [4, 0], [prompt[4:9], PROMPTS[1]])  # a continued chunk beside a new prompt
    got = model.prefill(chunked, [1], [9], [prompt[9:]])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunked.k[:, 1], whole.k[:, 1], rtol=1e-5, atol=1e-5)


def test_engine_tokens_equal_the_reference_with_chunked_prefill_padding_and_slot_reuse(model):
    prompts = PROMPTS + [list(range(20, 60))]
    max_tokens = [6, 2, 4, 5]
    engine = Engine(model, max_batch_size=3, max_prefill_tokens=16, max_model_len=64)
    tokens, names = run_engine(engine, prompts, max_tokens)
    assert tokens == [reference_tokens(model, p, n) for p, n in zip(prompts, max_tokens)]
    steps = [parse_step_annotation(n) for n in names]
    assert sum(s.c_sq for s in steps) == sum(map(len, prompts))
    assert max(s.c_sq for s in steps) <= 16  # the 40-token prompt went in chunks
    assert sum(s.context_requests for s in steps) > len(prompts)
    assert {s.generation_requests for s in steps} >= {1, 2, 3}  # buckets 1, 2 and 4 (3 padded) all ran
    m = engine.metrics()
    assert m["kv_slots_used"] == 0 and m["running"] == m["waiting"] == 0
    assert m["finished"]["length"] == 4 and m["generation_tokens"] == sum(max_tokens)
    assert m["eager_decode_steps"] == m["steps"]["decode"] + m["steps"]["mixed"] and m["graph_replays"] == 0


def test_packed_prompts_match_the_unpadded_prefill_and_touch_only_their_slots(model):
    packed_cache, plain_cache = model.new_cache(num_slots=5, max_len=64), model.new_cache(num_slots=5, max_len=64)
    runner = PrefillRunner(model, packed_cache, pad_slot=4, buckets=[8, 32, 100], max_seqs=3)
    slots = [2, 0, 3]
    assert runner.entries == 3 + -(-100 // PAD_SEQ)
    for prompts, bucket in ((PROMPTS, 32), (PROMPTS[:1], 8), (PROMPTS + [], 32)):
        got = runner.logits(slots[:len(prompts)], prompts, graph=False)
        want = model.prefill(plain_cache, slots[:len(prompts)], [0] * len(prompts), prompts)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert runner.bucket(sum(map(len, prompts))) == bucket
    # The cache holds what the unpadded prefill wrote, slot by slot; padding went to the pad slot only.
    torch.testing.assert_close(packed_cache.k[:, :4], plain_cache.k[:, :4], rtol=1e-5, atol=1e-5)
    assert not packed_cache.k[:, 1].any() and packed_cache.k[:, 4].any()
    assert runner.fits([0, 0], [[1] * 50, [2] * 50]) and not runner.fits([0, 0], [[1] * 50, [2] * 51])
    assert not runner.fits([0, 3], [[1], [2]])  # a continued chunk runs unpacked
    assert not runner.fits([0] * 4, [[1]] * 4)  # more prompts than sequence entries
    # A mixed step: a new prompt and two decode rows in one forward equal a prefill and a decode step.
    mixed_cache = model.new_cache(num_slots=5, max_len=64)
    decoder = DecodeRunner(model, mixed_cache, pad_slot=4, buckets=[1, 2, 4], rows=4)
    mixed = PrefillRunner(model, mixed_cache, pad_slot=4, buckets=[8, 32], max_seqs=3, decoder=decoder)
    first = mixed.logits([2, 0], PROMPTS[:2], graph=False).argmax(dim=-1).tolist()
    positions = [len(p) for p in PROMPTS[:2]]
    got = mixed.mixed_logits([3], [PROMPTS[2]], first, positions, [2, 0], graph=False)
    plain_cache = model.new_cache(num_slots=5, max_len=64)
    model.prefill(plain_cache, [2, 0], [0, 0], PROMPTS[:2])
    want = torch.cat((model.prefill(plain_cache, [3], [0], [PROMPTS[2]]),
                      DecodeRunner(model, plain_cache, 4, [1, 2, 4], 4).logits(first, positions, [2, 0], graph=False)))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mixed_cache.k[:, :4], plain_cache.k[:, :4], rtol=1e-5, atol=1e-5)
    assert token_buckets(8192) == [128, 256, 512, 1024, 2048, 4096, 8192] and token_buckets(100) == [100]
    assert token_buckets(300) == [128, 256, 300]


@pytest.mark.parametrize("lengths", [[5], [3, 7, 1], [16, 16], [1] * 3, [30]])
def test_a_staged_prompt_step_lays_out_ids_positions_rows_and_offsets(model, lengths):
    cache = model.new_cache(num_slots=5, max_len=64)
    runner = PrefillRunner(model, cache, pad_slot=4, buckets=[8, 32], max_seqs=3)
    chunks = [list(range(100 + 10 * i, 100 + 10 * i + n)) for i, n in enumerate(lengths)]
    slots = [2, 0, 3][:len(chunks)]
    b = runner._stage(slots, chunks)
    assert b == (8 if sum(lengths) <= 8 else 32)
    # What the buffer must hold, spelled out one token at a time.
    ids, positions, rows, cu = [], [], [], [0]
    for slot, chunk in zip(slots, chunks):
        ids += chunk
        positions += range(len(chunk))
        rows += [slot * 64 + p for p in range(len(chunk))]
        cu.append(cu[-1] + len(chunk))
    last = [o - 1 for o in cu[1:]] + [0] * (3 - len(chunks))
    while cu[-1] < b:  # padding sequences of at most PAD_SEQ tokens, on the pad slot
        n = min(PAD_SEQ, b - cu[-1])
        positions += range(n)
        rows += [4 * 64 + p for p in range(n)]
        cu.append(cu[-1] + n)
    ids += [0] * (b - len(ids))
    cu += [b] * (runner.entries + 1 - len(cu))
    host, t = runner._host.tolist(), runner.tokens
    assert host[:b] == ids and host[t:t + b] == positions and host[2 * t:2 * t + b] == rows
    assert host[runner._cu] == cu and host[runner._last] == last


def test_engine_with_packed_prompts_gives_the_reference_tokens(model):
    prompts = PROMPTS + [list(range(20, 60))]
    max_tokens = [6, 2, 4, 5]
    engine = Engine(model, max_batch_size=3, max_prefill_tokens=16, max_model_len=64, packed_prompts=True)
    engine.warm_up()
    tokens, names = run_engine(engine, prompts, max_tokens)
    assert tokens == [reference_tokens(model, p, n) for p, n in zip(prompts, max_tokens)]
    m = engine.metrics()
    # Whole prompts went packed; the 40-token prompt's continued chunks went through the model's prefill.
    assert engine.prefiller.eager_steps >= 2 and m["prompt_graph_replays"] == 0
    assert m["eager_prompt_steps"] == m["steps"]["prefill"] + m["steps"]["mixed"]
    # The 40-token prompt's first chunk came while the others decoded: their rows rode in its forward.
    assert m["mixed_forward_steps"] >= 1
    assert m["eager_decode_steps"] == m["steps"]["decode"] + m["steps"]["mixed"]


def test_prompt_step_counters_never_run_backwards_when_read_during_a_step(model):
    # /metrics is read from the HTTP thread while the engine thread runs a step; a replayed prompt
    # forward bumps the runner's count before the step is recorded. A stand-in counts each prompt
    # forward as a replay (graphs need a GPU) and reads the metrics there, mid-step.
    engine = Engine(model, max_batch_size=2, max_prefill_tokens=64, max_model_len=64, packed_prompts=True)
    engine.warm_up()
    runner, real_run, seen = engine.prefiller, engine.prefiller.run, []

    def replaying_run(*args, **kwargs):
        out = real_run(*args, **kwargs)
        runner.replays += 1
        seen.append(engine.metrics())
        return out

    runner.run = replaying_run
    run_engine(engine, PROMPTS[:2], [3, 3])
    assert seen and all(m["eager_prompt_steps"] >= 0 and m["prompt_graph_replays"] <= sum(m["steps"].values())
                        for m in seen)
    m = engine.metrics()
    assert m["prompt_graph_replays"] == len(seen) and m["eager_prompt_steps"] == 0


def test_batch_buckets():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert batch_buckets(1) == [1]
    assert batch_buckets(16, [8, 1, 4, 8]) == [1, 4, 8]
    with pytest.raises(ValueError, match="above max_batch_size 16"):
        batch_buckets(16, [1, 32])
    with pytest.raises(ValueError, match="positive batch sizes"):
        batch_buckets(16, [0, 2])
    tiny = LlamaModel(PRESETS["tiny"])
    runner = DecodeRunner(tiny, tiny.new_cache(9, 16), 8, [1, 4], rows=8)
    assert [runner.bucket(n) for n in (1, 2, 4, 5, 8)] == [1, 4, 4, 5, 8]  # above the largest: unpadded, eager


def test_weights_are_seeded_and_sizes_follow_the_config():
    a, b = LlamaModel(PRESETS["tiny"]), LlamaModel(PRESETS["tiny"])
    assert torch.equal(a.embed.weight, b.embed.weight)
    c = LlamaModel(model_config("tiny", seed=1, num_layers=3))
    assert len(c.layers) == 3 and not torch.equal(a.embed.weight, c.embed.weight)
    assert a.dtype == torch.float32
    assert sum(p.numel() for p in a.parameters()) == PRESETS["tiny"].num_parameters()
    assert 1.0e9 < PRESETS["1b"].num_parameters() < 1.5e9
    eight = PRESETS["8b"]  # Llama-3.1-8B's shapes
    assert (eight.hidden_size, eight.intermediate_size, eight.num_layers, eight.num_heads, eight.num_kv_heads,
            eight.head_dim, eight.vocab_size, eight.tie_embeddings) == (4096, 14336, 32, 32, 8, 128, 128256, False)
    assert 8.0e9 < eight.num_parameters() < 8.1e9
    with pytest.raises(ValueError, match="unknown model field 'layers'"):
        model_config("tiny", layers=3)
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        model_config("huge")


def test_cache_bounds_are_errors(model):
    cache = model.new_cache(2, 3)
    with pytest.raises(ValueError, match="exceed the cache length 3"):
        model.prefill(cache, [0], [0], [[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="slot 2 is outside"):
        model.prefill(cache, [2], [0], [[1]])
    with pytest.raises(ValueError, match="max_seq_len 2048"):
        model.new_cache(2, 4096)


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
    engine = Engine(model, max_batch_size=2, max_model_len=64)
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
    # b finished after 2 tokens, so c is admitted (into b's slot) beside a's last decode token (sk = 5 + 2).
    assert (third.c_sq, third.c_sk, third.c_sqsq, third.g_sq, third.g_sk, third.g_sqsk) == (8, 8, 64, 1, 7, 7)
    assert (fourth.g_sq, fourth.g_sk, fourth.kind) == (1, 9, "decode")
    for key, prompt, n in (("a", PROMPTS[0], 3), ("b", PROMPTS[1], 2), ("c", PROMPTS[2], 2)):
        assert [e.token for e in events[key]] == reference_tokens(model, prompt, n)
        assert [e.finish_reason for e in events[key]] == [None] * (n - 1) + ["length"]
    assert engine.num_unfinished == 0
    assert engine.metrics()["steps"] == {"prefill": 1, "decode": 2, "mixed": 1}


def test_decode_steps_queued_ahead_give_the_same_tokens_through_eos_abort_and_arrivals(model):
    prompts = PROMPTS + [list(range(20, 40))]
    want = [reference_tokens(model, p, 8) for p in prompts]
    stop_at = next(k for k in range(2, 8) if want[0][k] not in want[0][:k])
    eos = want[0][stop_at]  # request a ends by EOS mid-batch; the others ignore it
    seen = {}
    # Also with prompts joining the step queued ahead (whole prompts), packed as on a GPU or not;
    # "first_eos" ends by EOS on its first token, so its joined row is dropped.
    for overlap, packed in ((False, False), (True, False), (True, True)):
        engine = Engine(model, max_batch_size=5, max_model_len=64, eos_id=eos, overlap=overlap, packed_prompts=packed)
        events: dict[str, list[TokenEvent]] = {}
        engine.submit(prompts[0], 8, False, _collect(events, "a"))
        engine.submit(prompts[1], 8, True, _collect(events, "b"))
        engine.submit(prompts[2], 6, True, _collect(events, "c"))
        for _ in range(2):
            engine.step()
        engine.submit(prompts[3], 6, True, _collect(events, "late"))  # joins while the others decode
        engine.submit(prompts[0] + want[0][:stop_at], 4, False, _collect(events, "first_eos"))
        gone = engine.submit(prompts[1], 30, True, _collect(events, "gone"))
        steps = 0
        while engine.step() is not None:
            steps += 1
            if steps == 5:
                engine.abort(gone)  # its row is in the step queued ahead
        assert [e.token for e in events["a"]] == want[0][:stop_at + 1] and events["a"][-1].finish_reason == "stop"
        assert [e.token for e in events["b"]] == want[1] and [e.token for e in events["c"]] == want[2][:6]
        assert [e.token for e in events["late"]] == want[3][:6]
        assert [e.token for e in events["first_eos"]] == [eos] and events["first_eos"][0].finish_reason == "stop"
        assert [e.token for e in events["gone"]] == reference_tokens(model, prompts[1], len(events["gone"]))
        assert engine.num_unfinished == 0 and engine.metrics()["kv_slots_used"] == 0
        seen[overlap, packed] = (engine.ahead_steps, engine.joined_ahead, {k: [e.token for e in v] for k, v in events.items()})
    assert seen[False, False][:2] == (0, 0)
    for key in ((True, False), (True, True)):
        # The first prompt step and the one where late, first_eos and gone arrived were followed by
        # a step queued ahead (their rows joined it); and both ran.
        assert seen[key][0] >= 3 and seen[key][1] == 2
        assert seen[key][2] == seen[False, False][2]


def test_eos_stops_unless_ignore_eos(model):
    first = reference_tokens(model, PROMPTS[0], 1)[0]
    engine = Engine(model, eos_id=first, max_model_len=64)
    events: dict[str, list[TokenEvent]] = {}
    engine.submit(PROMPTS[0], 4, False, _collect(events, "stop"))
    engine.submit(PROMPTS[0], 4, True, _collect(events, "ignore"))
    while engine.step() is not None:
        pass
    assert [e.finish_reason for e in events["stop"]] == ["stop"]
    assert [e.finish_reason for e in events["ignore"]] == [None, None, None, "length"]
    assert engine.metrics()["finished"] == {"stop": 1, "length": 1, "error": 0, "abort": 0}


def test_an_aborted_request_frees_its_slot_for_a_waiting_one(model):
    engine = Engine(model, max_batch_size=1, max_model_len=64)
    events: dict[str, list[TokenEvent]] = {}
    rid = engine.submit(PROMPTS[0], 50, True, _collect(events, "gone"))
    engine.submit(PROMPTS[1], 2, True, _collect(events, "next"))
    engine.step()
    engine.abort(rid)
    while engine.step() is not None:
        pass
    assert len(events["gone"]) == 1 and [e.token for e in events["next"]] == reference_tokens(model, PROMPTS[1], 2)
    assert engine.metrics()["finished"]["abort"] == 1


def test_engine_rejects_requests_the_model_cannot_run(model):
    engine = Engine(model, max_model_len=100)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit([1, 512], 2, True, print)
    with pytest.raises(ValueError, match="exceeds the model's max_model_len 100"):
        engine.submit([1] * 90, 11, True, print)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        engine.submit([1], 0, True, print)


def test_a_failing_kernel_fails_the_steps_requests_not_the_engine():
    def broken(x):
        raise RuntimeError("kernel exploded")

    engine = Engine(LlamaModel(PRESETS["tiny"], kernels=dataclasses.replace(resolve_kernels(), activation=broken)),
                    max_model_len=32)
    events: dict[str, list[TokenEvent]] = {}
    engine.submit([1, 2], 2, True, _collect(events, "a"))
    engine.step()
    assert events["a"] == [TokenEvent(None, error="RuntimeError: kernel exploded")]
    assert engine.step() is None and engine.metrics()["kv_slots_used"] == 0
    with pytest.raises(KernelError, match=r"kernels\.activation: 'engine\.serve\.kernels:silu_and_mul' failed during the "
                                          r"warm-up step: RuntimeError: kernel exploded"):
        engine.warm_up()


# -- kernel registry -------------------------------------------------------------------------

CANDIDATE = textwrap.dedent("""
    import torch
    calls = {"rmsnorm": 0, "activation": 0, "rotary": 0, "attention": 0, "decode_attention": 0}

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

    def decode_attention(q, k_cache, v_cache, slots, lengths, scale):
        # Per sequence, a plain softmax over its slot's first lengths[b] positions.
        calls["decode_attention"] += 1
        groups = q.shape[1] // k_cache.shape[2]
        out = []
        for b in range(q.shape[0]):
            k = k_cache[slots[b], :lengths[b]].repeat_interleave(groups, 1)
            v = v_cache[slots[b], :lengths[b]].repeat_interleave(groups, 1)
            p = (torch.einsum("hd,khd->hk", q[b], k) * scale).softmax(-1)
            out.append(torch.einsum("hk,khd->hd", p, v))
        return torch.stack(out)

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
                 "rotary": "serve_candidate:rotary", "attention": "serve_candidate:attention",
                 "decode_attention": "serve_candidate:decode_attention"}
    kernels = resolve_kernels(overrides)
    assert dict(kernels.sources) == overrides
    swapped = LlamaModel(model.config, kernels=kernels)
    cache, ref_cache = swapped.new_cache(4, 32), model.new_cache(4, 32)
    torch.testing.assert_close(swapped.prefill(cache, [0, 1, 2], [0, 0, 0], PROMPTS),
                               model.prefill(ref_cache, [0, 1, 2], [0, 0, 0], PROMPTS), rtol=1e-4, atol=1e-4)
    args = [torch.tensor(v) for v in ([1, 2, 3], [len(p) for p in PROMPTS], [0, 1, 2])]
    lengths = args[1].to(torch.int32) + 1
    torch.testing.assert_close(swapped.decode(cache, *args, lengths), model.decode(ref_cache, *args, lengths),
                               rtol=1e-4, atol=1e-4)
    layers = model.config.num_layers
    assert candidate.calls == {"rmsnorm": 2 * (2 * layers + 1), "activation": 2 * layers, "rotary": 2 * layers,
                               "attention": layers, "decode_attention": layers}


def test_defaults_when_nothing_is_overridden():
    kernels = resolve_kernels({})
    assert set(kernels.sources) == set(KERNEL_KEYS)
    assert kernels.sources["attention"] == "engine.serve.kernels:varlen_attention"
    assert kernels.sources["decode_attention"] == "engine.serve.kernels:decode_attention"
    # On a GPU the Triton kernels are the defaults (imported only there); opting out keeps the references.
    gpu = resolve_kernels({"rmsnorm": "engine.serve.kernels:rmsnorm"}, device="cuda")
    assert gpu.sources["rmsnorm"] == "engine.serve.kernels:rmsnorm"
    assert gpu.sources["decode_attention"] == "engine.library.attention:decode_attention_split"
    assert gpu.sources["attention"] == "engine.library.attention:varlen_attention_triton"
    assert gpu.sources["activation"] == "engine.serve.triton_kernels:silu_and_mul"
    assert resolve_kernels({}, device="cuda", triton_defaults=False).sources == kernels.sources


@pytest.mark.parametrize("overrides, message", [
    ({"layernorm": "x:y"}, r"kernels\.layernorm: unknown kernel key"),
    ({"rmsnorm": "no_such_module_xyz:rmsnorm"}, r"kernels\.rmsnorm: cannot import module 'no_such_module_xyz'"),
    ({"activation": "serve_candidate:missing"}, r"kernels\.activation: module 'serve_candidate' has no attribute 'missing'"),
    ({"rotary": "serve_candidate:not_a_function"}, r"kernels\.rotary: 'serve_candidate:not_a_function' is a int"),
    ({"rmsnorm": "serve_candidate:two_args"}, r"kernels\.rmsnorm: 'serve_candidate:two_args' has signature \(x, weight\)"),
    ({"attention": "serve_candidate:rmsnorm"}, r"kernels\.attention: 'serve_candidate:rmsnorm'.*6 positional"),
    ({"decode_attention": "serve_candidate:silu_and_mul"}, r"kernels\.decode_attention: .*6 positional"),
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


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_token_chunks_are_the_json_of_the_chunk(chat):
    import json

    from engine.serve.server import ServeConfig, _Handlers
    handlers = _Handlers.__new__(_Handlers)  # only the chunk builders, no engine
    handlers.config = ServeConfig(model="tiny", served_model_name='my "model"')
    for text, finish in (("a\"é\n", None), ("", "length"), ("x", "stop")):
        chunk = handlers._chunk("cmpl-1", chat, text, finish)
        chunk["created"] = 1700000000
        fast = handlers._token_head("cmpl-1", chat, 1700000000) + json.dumps(text).encode() + handlers._token_tail(chat, finish)
        assert fast == b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
