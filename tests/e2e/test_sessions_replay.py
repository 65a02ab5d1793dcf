"""Multi-turn session replays against the real built-in server on the CPU: prefix-cache hits in
the report (cached tokens on turn 2+, the server's hit rate), the reset route, the same greedy
answers with the cache on and off, an open-loop mooncake replay at its timestamps with the
session-affinity header, and a bad trace named by file and line before anything starts."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp import web

from conftest import REPO, only_workspace, run_magpie
from engine.bench.session_replay import SessionReplayConfig, run_sessions, session_metrics
from engine.bench.sessions import BlockTokens, load_mooncake


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(*flags):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "engine.serve", "--model", "tiny", "--host", "127.0.0.1",
                             "--port", str(port), "--max-batch-size", "4", "--stats-interval", "0",
                             "--prefix-cache-block-size", "8", *flags], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


def _wait(proc, url):
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if asyncio.run(_get(url + "/health"))[0] == 200:
                return
        except aiohttp.ClientError:
            pass
        assert time.monotonic() < deadline, "the server did not become healthy"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def servers():
    on, off = _start(), _start("--no-enable-prefix-caching")
    try:
        _wait(*on)
        _wait(*off)
        yield on[1], off[1]
    finally:
        for proc, _ in (on, off):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def _complete(session, url, prompt, n=6):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_the_same_answers_with_the_cache_on_and_off(servers):
    on, off = servers

    async def conversation(url):
        out = []
        async with aiohttp.ClientSession() as s:
            history = list(range(300, 341))
            for k in range(4):
                history = history + list(range(400 + 11 * k, 411 + 11 * k))
                got = await _complete(s, url, history, 8)
                out.append((got["choices"][0]["text"], got["usage"]))
                history = history + [(b % 256) for b in got["choices"][0]["text"].encode()][:8]
        return out

    with_cache, without = asyncio.run(conversation(on)), asyncio.run(conversation(off))
    assert [t for t, _ in with_cache] == [t for t, _ in without]  # greedy, token for token (byte-level text)
    cached = [u["prompt_tokens_details"]["cached_tokens"] for _, u in with_cache]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert all("prompt_tokens_details" not in u for _, u in without)
    assert [u["prompt_tokens"] for _, u in with_cache] == [u["prompt_tokens"] for _, u in without]


def test_reset_prefix_cache_empties_the_cache(servers):
    on, off = servers
    prompt = list(range(300, 341))

    async def go():
        async with aiohttp.ClientSession() as s:
            await _complete(s, on, prompt, 1)
            again = (await _complete(s, on, prompt, 1))["usage"]["prompt_tokens_details"]["cached_tokens"]
            _, before = await _get(on + "/metrics")
            async with s.post(on + "/reset_prefix_cache") as r:
                status = r.status
            _, after = await _get(on + "/metrics")
            fresh = (await _complete(s, on, prompt, 1))["usage"]["prompt_tokens_details"]["cached_tokens"]
            _, last = await _get(on + "/metrics")
            async with s.post(off + "/reset_prefix_cache") as r:
                off_status, off_text = r.status, await r.text()
            return again, before, status, after, fresh, last, off_status, off_text

    again, before, status, after, fresh, last, off_status, off_text = asyncio.run(go())
    assert again == 40  # 5 blocks of 8 (the 41st token is computed)
    assert _metric(before, "magpie_serve_prefix_cache_blocks_used") > 0
    assert status == 200 and _metric(after, "magpie_serve_prefix_cache_blocks_used") == 0
    assert fresh == 0
    # the counters are not reset: vLLM's names, counting prompt tokens (read after this test's third
    # request: the server is shared with the file's other tests, which may or may not have run first)
    assert _metric(after, "vllm:prefix_cache_hits_total") >= 40
    assert _metric(last, "vllm:prefix_cache_queries_total") >= 3 * 41
    assert off_status == 400 and "prefix caching is off" in off_text


def test_a_sweep_resets_the_builtin_servers_prefix_cache_before_each_point(tmp_path, servers):
    on, off = servers
    flags = ("--sweep", "input_len=8,12", "--num-prompts", "2", "--concurrency", "2", "--output-len", "2",
             "--warmup", "0")
    runs = {}
    for name, url in (("on", on), ("off", off)):
        proc = run_magpie("benchmark", "builtin", "--base-url", url, *flags, "-o", tmp_path / name, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads((only_workspace(tmp_path / name) / "benchmark_report.json").read_text())
        runs[name] = (proc, report)
    reset = runs["on"][1]["control_hooks"]["prefix_cache_reset"]
    assert reset["why"].startswith("on: a sweep of 2 points") and reset["route"] == "/reset_prefix_cache"
    assert [(p["point_index"], p["status"], p["ok"]) for p in reset["points"]] == [(0, 200, True), (1, 200, True)]
    # A server that refuses: each point still runs, the report and the terminal say why, once.
    proc, report = runs["off"]
    points = report["control_hooks"]["prefix_cache_reset"]["points"]
    assert [(p["status"], p["ok"]) for p in points] == [(400, False), (400, False)]
    warning = next(w for w in report["warnings"] if w.startswith("prefix-cache reset"))
    assert "prefix caching is off" in warning and proc.stderr.count("warning: prefix-cache reset") == 1
    assert report["success"] is True and len(report["sweep"]) == 2


@pytest.mark.slow
def test_a_synthetic_session_run_reports_the_reuse(tmp_path):
    proc = run_magpie("benchmark", "builtin", "--dataset-name", "sessions", "--num-sessions", "4", "--session-turns",
                      "3", "--system-prompt-len", "48", "--concurrency", "2", "--input-len", "24", "--output-len", "6",
                      "--subagents", "1", "-o", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = only_workspace(tmp_path)
    r = json.loads((ws / "benchmark_report.json").read_text())
    s = r["sessions"]
    assert r["success"] is True and r["throughput"]["completed_requests"] == 4 * 3 + 4
    assert s["sessions"] == 8 and s["sessions_completed"] == 8 and s["turns_failed"] == 0
    assert s["turns_per_session"] == {"mean": 2.0, "min": 1, "max": 3}
    assert all(s["ttft_by_turn"][k]["mean_cached_tokens"] > 0 for k in ("1", "2"))
    assert s["cached_prompt_tokens"] > 0 and 0 < s["cached_share"] < 1
    assert s["server_prefix_cache"]["hit_rate"] > 0
    # the client's sum of usage.cached_tokens is what the server's counters moved by
    assert s["server_prefix_cache"]["hits"] == s["cached_prompt_tokens"]
    assert s["reused_prompt_throughput"] > 0 and s["fresh_prompt_throughput"] > 0
    detail = json.loads((ws / "requests" / "point0_repeat0.json").read_text())
    later = [c for c, t in zip(detail["cached_tokens"], detail["turn"]) if t > 0]
    assert later and all(c > 0 for c in later)
    per = detail["sessions"]
    assert sorted(per["turns"]) == [1, 1, 1, 1, 3, 3, 3, 3] and sum(per["cached_tokens"]) == s["cached_prompt_tokens"]
    assert all(d > 0 for d in per["duration_s"]) and len(per["ids"]) == 8
    summary = (ws / "summary.txt").read_text()
    assert "prefix reuse:" in summary and "server prefix cache: hit rate" in summary and "TTFT median by turn" in summary


def test_an_open_loop_mooncake_replay_keeps_the_timestamps_and_the_session_header(tmp_path, servers):
    on, _ = servers
    trace = tmp_path / "trace.jsonl"
    rows = [{"session_id": "a", "timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5]},
            {"session_id": "b", "timestamp": 300, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3, 9, 9]},
            {"session_id": "a", "timestamp": 600, "input_length": 16, "output_length": 4, "hash_ids": [7, 8]}]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    blocks = BlockTokens(512, special_ids=[256, 257])
    sessions = load_mooncake(trace, blocks=blocks, block_size=8)
    result = run_sessions(SessionReplayConfig(on, "tiny", mode="open"), sessions, filler=blocks)
    turns = {(t.session_id, t.turn): t for t in result.turns}
    assert all(t.out.success for t in result.turns), [t.out.error for t in result.turns]
    t0 = min(t.out.start_time for t in result.turns)
    for (sid, k), due in ((("a", 0), 0.0), (("b", 0), 0.3), (("a", 1), 0.6)):
        assert turns[sid, k].release == pytest.approx(due, abs=1e-6)
        assert due <= turns[sid, k].out.start_time - t0 + 0.02 < due + 0.25
    assert turns["b", 0].cached_tokens == 24  # hash ids 1, 2, 3: a's first three blocks
    assert turns["a", 1].cached_tokens >= 40  # its whole first prompt
    assert session_metrics(result)["server_prefix_cache"]["hit_rate"] > 0

    # the session-affinity header, named as configured, carries the session id
    seen = []

    async def fake(request):
        seen.append((request.headers.get("X-Affinity"), (await request.json())["prompt"][:2]))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"text":"x","finish_reason":"length"}]}\n\n')
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", fake)
        runner = web.AppRunner(app)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            from engine.bench.session_replay import SessionReplay
            cfg = SessionReplayConfig(f"http://127.0.0.1:{port}", "m", mode="closed", session_header="X-Affinity")
            return await SessionReplay(cfg, sessions, filler=blocks).run()
        finally:
            await runner.cleanup()

    res = asyncio.run(go())
    assert all(t.out.success for t in res.turns) and sorted(h for h, _ in seen) == ["a", "a", "b"]
    assert session_metrics(res)["cached_prompt_tokens"] is None  # that server reported no cached tokens


def test_a_bad_trace_is_named_by_file_and_line_before_anything_starts(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 5, "output_length": 2}\n')
    proc = run_magpie("benchmark", "builtin", "--dataset-name", "mooncake", "--dataset-path", trace, "-o", tmp_path,
                      timeout=120)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"{trace}:2: input_length: expected an integer >= 1" in out
    assert "starting builtin server" not in out


def test_closed_loop_waits_for_the_answer_and_the_delay_and_children_start_from_the_parents_context(servers):
    on, _ = servers
    from engine.bench.sessions import synthetic_sessions
    blocks = BlockTokens(256)
    sessions = synthetic_sessions(2, 3, blocks=blocks, system_prompt_len=24, input_len=16, output_len=4, delay_s=0.2,
                                  subagents=1)
    result = run_sessions(SessionReplayConfig(on, "tiny", mode="closed", max_concurrency=4), sessions, filler=blocks)
    assert all(t.out.success for t in result.turns), [t.out.error for t in result.turns]
    turns = {(t.session_id, t.turn): t for t in result.turns}
    for sid in ("s0", "s1"):
        for k in (1, 2):
            prev, cur = turns[sid, k - 1].out, turns[sid, k].out
            assert cur.start_time >= prev.start_time + prev.latency + 0.2
            # the prompt is the previous prompt, its answer (4 tokens) and the new input (16)
            assert cur.prompt_len == prev.prompt_len + 4 + 16
        child, parent = turns[f"{sid}.a0", 0], turns[sid, 0]
        assert child.out.start_time >= parent.out.start_time + parent.out.latency
        assert child.out.prompt_len == parent.out.prompt_len + 4 + 16
        assert child.cached_tokens >= parent.out.prompt_len // 8 * 8 - 8  # the parent's prompt blocks
    m = session_metrics(result)
    assert m["sessions_completed"] == 4 and m["turns_per_session"]["max"] == 3


def test_sharegpt_sessions_on_the_chat_endpoint_reuse_the_conversation(tmp_path, servers):
    on, _ = servers
    from engine.bench.sessions import load_sharegpt_sessions
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": [
        {"from": "system", "value": "You answer questions about the weather in great detail."},
        {"from": "human", "value": "What is the weather like in Paris in spring?"}, {"from": "gpt", "value": "Mild."},
        {"from": "human", "value": "And in the summer, when the tourists arrive?"}, {"from": "gpt", "value": "Hot."},
        {"from": "human", "value": "Thanks!"}, {"from": "gpt", "value": "You're welcome."}]}]))
    sessions = load_sharegpt_sessions(path, default_output_len=6)
    result = run_sessions(SessionReplayConfig(on, "tiny", endpoint="/v1/chat/completions"), sessions)
    assert [t.out.success for t in result.turns] == [True] * 3, [t.out.error for t in result.turns]
    cached = [t.cached_tokens for t in sorted(result.turns, key=lambda t: t.turn)]
    prompts = [t.out.prompt_len for t in sorted(result.turns, key=lambda t: t.turn)]
    assert cached[1] >= prompts[0] // 8 * 8 - 8 and cached[2] >= prompts[1] // 8 * 8 - 8 and cached[1] > 0
    assert prompts == sorted(prompts)


class _WordTokenizer:
    """A stand-in tokenizer's decode: token id i is the word w<i>."""

    vocab_size = 1000
    all_special_ids: list = []

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids)


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_synthetic_sessions_on_the_chat_endpoint_are_text_with_the_servers_answers(servers, client):
    """Token-id sessions (synthetic, mooncake) on the chat endpoint: each input decoded to text once
    (a shared system prompt is the same text in every session), the conversation the server's own
    answers; the server's prefix cache then hits on every later turn."""
    from engine.bench.session_run import as_text
    from engine.bench.sessions import synthetic_sessions
    on, _ = servers
    sessions = synthetic_sessions(2, 3, blocks=BlockTokens(1000, [], 0), system_prompt_len=24, input_len=12, output_len=5)
    sessions = as_text(sessions, _WordTokenizer(), "sessions")
    assert isinstance(sessions[0].system, str) and sessions[0].system == sessions[1].system
    assert all(isinstance(t.input, str) and len(t.input.split()) == 12 for s in sessions for t in s.turns)
    result = run_sessions(SessionReplayConfig(on, "tiny", endpoint="/v1/chat/completions", http_client=client), sessions)
    assert [t.out.success for t in result.turns] == [True] * 6, [t.out.error for t in result.turns]
    by_turn = sorted(result.turns, key=lambda t: (t.session_id, t.turn))
    for s in ("s0", "s1"):
        turns = [t for t in by_turn if t.session_id == s]
        prompts = [t.out.prompt_len for t in turns]
        assert prompts == sorted(prompts) and prompts[2] > prompts[1] > prompts[0]
        assert all(t.cached_tokens and t.cached_tokens >= 8 for t in turns[1:])
    with pytest.raises(ValueError, match="need a tokenizer"):
        as_text(synthetic_sessions(1, 1, blocks=BlockTokens(1000, [], 0)), None, "sessions")


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_a_turn_the_server_refuses_fails_with_its_status_and_ends_its_session(servers, client):
    on, _ = servers
    sessions = synthetic_sessions_for_refusal()
    result = run_sessions(SessionReplayConfig(on, "no-such-model", http_client=client), sessions)
    assert len(result.turns) == 1 and not result.turns[0].out.success  # the session stops at its failed turn
    assert result.turns[0].out.error.startswith("HTTP 404"), result.turns[0].out.error


def synthetic_sessions_for_refusal():
    from engine.bench.sessions import synthetic_sessions
    return synthetic_sessions(1, 2, blocks=BlockTokens(1000, [], 0), input_len=8, output_len=2)
