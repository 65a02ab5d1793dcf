"""Session datasets (engine.bench.sessions) and the prefix cache of the built-in engine
(engine.serve.prefix_cache), without a server: loaders on small files in the peers' formats, bad
lines named by file and line, the synthetic generator, and the engine's prefix reuse."""

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from engine.bench.datasets import DatasetError
from engine.bench.sessions import (BlockTokens, load_mooncake, load_sharegpt_sessions, synthetic_sessions)
from engine.serve.engine import Engine
from engine.serve.model import LlamaModel, model_config
from engine.serve.prefix_cache import block_hashes


class _ByteTokenizer:
    vocab_size = 258
    all_special_ids = [256, 257]

    def encode(self, text, add_special_tokens=False):
        return list(text.encode())

    def num_special_tokens_to_add(self):
        return 0

    def decode(self, ids):
        return bytes(i % 256 for i in ids).decode(errors="replace")


def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_mooncake_trace_groups_sessions_and_shares_hash_id_blocks(tmp_path):
    trace = _write_jsonl(tmp_path / "trace.jsonl", [
        {"session_id": "a", "timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [7, 8, 9]},
        {"session_id": "b", "timestamp": 50, "input_length": 6, "output_length": 3, "hash_ids": [7, 5]},
        {"session_id": "a", "delay": 200, "input_length": 5, "output_length": 2, "hash_ids": [11, 12]},
        {"timestamp": 300, "input_length": 3, "output_length": 1},
        {"session_id": "c", "parent_session_id": "a", "input_length": 4, "output_length": 2, "hash_ids": [7]},
    ])
    blocks = BlockTokens(1000, special_ids=[0], seed=3)
    sessions = load_mooncake(trace, blocks=blocks, block_size=4)
    by_id = {s.session_id: s for s in sessions}
    assert list(by_id) == ["a", "b", "line4", "c"]
    a, b = by_id["a"], by_id["b"]
    assert [len(t.input) for t in a.turns] == [10, 5] and [t.output_len for t in a.turns] == [4, 2]
    assert a.turns[0].timestamp_s == 0 and a.turns[1].timestamp_s is None and a.turns[1].delay_s == pytest.approx(0.2)
    assert b.turns[0].timestamp_s == pytest.approx(0.05)
    # hash id 7 is the same 4 tokens in both sessions; 8 and 5 differ
    assert a.turns[0].input[:4] == b.turns[0].input[:4] and a.turns[0].input[4:6] != b.turns[0].input[4:6]
    assert 0 not in a.turns[0].input  # a special id is never used
    assert by_id["c"].parent_id == "a" and by_id["a"].children == ["c"] and by_id["c"].parent_turn == 0
    assert by_id["c"].turns[0].input == a.turns[0].input[:4]
    # the same trace gives the same tokens again
    assert load_mooncake(trace, blocks=BlockTokens(1000, special_ids=[0], seed=3), block_size=4)[0].turns[0].input \
        == a.turns[0].input


def test_mooncake_bad_lines_name_the_file_line_and_field(tmp_path):
    trace = _write_jsonl(tmp_path / "bad.jsonl", [
        {"timestamp": 0, "input_length": 10, "output_length": 4},
        "{not json",
        {"timestamp": 0, "input_length": 0, "output_length": 4},
        {"timestamp": -5, "input_length": 3, "output_length": 4, "hash_ids": [1, "x"]},
        {"session_id": "z", "parent_session_id": "nobody", "input_length": 3, "output_length": 1},
    ])
    with pytest.raises(DatasetError) as err:
        load_mooncake(trace, blocks=BlockTokens(100), block_size=4)
    text = str(err.value)
    assert f"{trace}:2: not JSON" in text
    assert f"{trace}:3: input_length: expected an integer >= 1" in text
    assert f"{trace}:4: hash_ids:" in text and f"{trace}:4: timestamp:" in text
    assert f"{trace}:5: parent_session_id: no session 'nobody'" in text
    assert f"{trace}:1" not in text


def test_sharegpt_conversations_become_sessions(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "x", "conversations": [{"from": "system", "value": "be brief"},
                                      {"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi!"},
                                      {"from": "human", "value": "and now?"}, {"from": "gpt", "value": "bye now"}]},
        {"id": "y", "conversations": [{"from": "human", "value": "one"}, {"from": "gpt", "value": "two words"}]},
    ]))
    sessions = load_sharegpt_sessions(path, tokenizer=_ByteTokenizer(), seed=0)
    by_len = sorted(sessions, key=lambda s: len(s.turns))
    one, two = by_len
    assert [t.input for t in two.turns] == ["hello there", "and now?"] and two.system == "be brief"
    assert [t.output_len for t in two.turns] == [3, 7] and [t.input_tokens for t in two.turns] == [11, 8]
    assert one.turns[0].output_len == 9
    # without a tokenizer the output length is the given default
    assert {t.output_len for s in load_sharegpt_sessions(path, default_output_len=5) for t in s.turns} == {5}
    bad = tmp_path / "bad.json"
    bad.write_text('[{"conversations": [{"from": "human", "value": 3}]}]')
    with pytest.raises(DatasetError, match=r"bad.json: conversation 0, message 0"):
        load_sharegpt_sessions(bad)
    broken = tmp_path / "broken.json"
    broken.write_text('[\n{"conversations": \n')
    with pytest.raises(DatasetError, match=r"broken.json:3: not JSON"):
        load_sharegpt_sessions(broken)


def test_synthetic_sessions_share_the_system_prompt_and_fork_subagents():
    blocks = BlockTokens(500)
    sessions = synthetic_sessions(3, 4, blocks=blocks, system_prompt_len=32, input_len=8, output_len=5, delay_s=0.5,
                                  subagents=2)
    roots = [s for s in sessions if s.parent_id is None]
    kids = [s for s in sessions if s.parent_id is not None]
    assert len(roots) == 3 and len(kids) == 6
    assert all(s.system == roots[0].system and len(s.system) == 32 for s in roots)
    assert all(len(s.turns) == 4 and [t.delay_s for t in s.turns] == [0, 0.5, 0.5, 0.5] for s in roots)
    assert roots[0].children == ["s0.a0", "s0.a1"] and kids[0].parent_turn == 0
    inputs = [tuple(t.input) for s in sessions for t in s.turns]
    assert len(set(inputs)) == len(inputs)  # every input is new tokens


def test_block_hashes_are_chained():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a[1] != b[1]  # the same second block after a different first one is another key


def _generate(engine, prompt, n):
    done = concurrent.futures.Future()
    tokens, cached = [], []

    def sink(ev):
        if ev.cached_tokens is not None:
            cached.append(ev.cached_tokens)
        if ev.token is not None:
            tokens.append(ev.token)
        if ev.finish_reason or ev.error:
            done.set_result(ev.error)

    engine.submit(prompt, n, True, sink)
    assert done.result(60) is None
    return tokens, cached[0]


def _conversation(engine, turns=4):
    """A multi-turn token-id conversation: each prompt is the previous prompt, its answer and new input."""
    history = list(range(300, 341))  # a 41-token system prompt
    outs, cached = [], []
    for k in range(turns):
        history = history + list(range(400 + 13 * k, 413 + 13 * k))
        tokens, c = _generate(engine, history, 9)
        outs.append(tokens)
        cached.append(c)
        history = history + tokens
    return outs, cached


def _engine(caching, blocks=256, block_size=8, prefill=64):
    torch.manual_seed(0)
    model = LlamaModel(model_config("tiny"), device="cpu", dtype=torch.float32)
    engine = Engine(model, max_batch_size=4, max_prefill_tokens=prefill, prefix_caching=caching,
                    prefix_block_size=block_size, prefix_cache_blocks=blocks)
    engine.warm_up()
    engine.start()
    return engine


def test_engine_reuses_cached_prefixes_and_generates_the_same_tokens():
    on, off = _engine(True), _engine(False)
    try:
        outs_on, cached_on = _conversation(on)
        outs_off, cached_off = _conversation(off)
        m_on, m_off = on.metrics(), off.metrics()
    finally:
        on.stop()
        off.stop()
    assert outs_on == outs_off  # greedy decoding, token for token
    assert cached_off == [0, 0, 0, 0] and m_off["prefix_cache"] is None
    assert cached_on[0] == 0 and all(c > 0 for c in cached_on[1:]) and cached_on == sorted(cached_on)
    # every cached block is a multiple of the block size, and covers at least the previous prompt's full blocks
    assert all(c % 8 == 0 for c in cached_on) and cached_on[1] >= (41 + 13) // 8 * 8
    pc = m_on["prefix_cache"]
    assert pc["hits"] == sum(cached_on) and pc["queries"] == m_off["prompt_tokens"]
    # the skipped tokens were never prefilled: the engine computed only the rest
    assert m_on["prompt_tokens"] == m_off["prompt_tokens"] - sum(cached_on)


def test_a_full_pool_evicts_the_least_recently_used_blocks_and_a_reset_empties_it():
    engine = _engine(True, blocks=4, block_size=8)
    try:
        a, b = list(range(300, 333)), list(range(400, 433))  # 4 full blocks each (the answer adds none)
        _generate(engine, a, 1)
        assert _generate(engine, a, 1)[1] == 32  # a's 4 blocks (its prompt is 33 tokens: the last is computed)
        _generate(engine, b, 1)  # b's 4 blocks evict all of a's
        assert _generate(engine, a, 1)[1] == 0
        pc = engine.metrics()["prefix_cache"]
        assert pc["blocks_used"] == 4 and pc["evictions"] >= 4
        assert engine.reset_prefix_cache().result(10) is True
        assert engine.metrics()["prefix_cache"]["blocks_used"] == 0
        assert _generate(engine, a, 1)[1] == 0
    finally:
        engine.stop()


def test_a_long_cached_prefix_with_a_chunked_rest_matches_the_uncached_answer():
    # The rest of the prompt after the cached blocks is longer than a step's prefill budget.
    on, off = _engine(True, prefill=16), _engine(False, prefill=16)
    try:
        base = list(range(300, 380))
        _generate(on, base + [1, 2, 3], 2)
        prompt = base + list(range(420, 470))
        got_on, cached = _generate(on, prompt, 6)
        got_off, _ = _generate(off, prompt, 6)
    finally:
        on.stop()
        off.stop()
    assert cached == 80 and got_on == got_off


def test_the_answers_stand_in_tokens_are_the_same_in_every_process():
    """Token-id sessions fill an answer's place in the context with ids seeded by the session and
    turn: two processes with different string-hash salts must seed them alike."""
    code = "from engine.bench.session_replay import answer_key; print(answer_key('session-7', 2))"
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(seen) == 1, seen
