"""The built-in server as a real subprocess on loopback: OpenAI streaming, continuous batching,
profiling into a trace the trace analysis splits, and a clean SIGTERM."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from conftest import REPO
from engine.serve.model import KERNEL_ANNOTATION
from engine.trace.load import load_trace
from engine.trace.steps import find_steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    profile_dir = tmp_path_factory.mktemp("torch_trace")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MAGPIE_SERVE_PROFILER_DIR": str(profile_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "engine.serve", "--model", "tiny", "--host", "127.0.0.1",
                             "--port", str(port), "--max-batch-size", "4", "--eager", "--cuda-graph-batch-sizes", "1,2,4",
                             "--stats-interval", "0.2"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if asyncio.run(_get_status(url + "/health")) == 200:
                break
        except aiohttp.ClientError:
            pass
        assert time.monotonic() < deadline, "the server did not become healthy"
        time.sleep(0.2)
    yield proc, url, profile_dir
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def _get_status(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> list:
    """The SSE payloads of one streamed request, parsed ([DONE] kept as the string)."""
    async with session.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), raw
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events]


def _completion(prompt: list[int], max_tokens: int) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}


def test_concurrent_streaming_completions_with_token_ids(server):
    _, url, _ = server
    prompts = [list(range(3 + i, 3 + i + 4 * (i + 1))) for i in range(6)]
    lengths = [3, 5, 4, 6, 2, 5]

    async def go():
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*(_stream(s, url + "/v1/completions", _completion(p, n))
                                          for p, n in zip(prompts, lengths)))

    for prompt, n, events in zip(prompts, lengths, asyncio.run(go())):
        assert events[-1] == "[DONE]"
        usage = events[-2]
        assert usage["choices"] == [] and usage["usage"] == {
            "prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n,
            "prompt_tokens_details": {"cached_tokens": 0}}  # prefix caching is on: no 16-token prefix is shared
        content = events[:-2]
        assert len(content) == n  # one token per chunk
        assert all(c["object"] == "text_completion" and c["model"] == "tiny" for c in content)
        assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (n - 1) + ["length"]
        assert len({c["id"] for c in content}) == 1


def test_metrics_endpoint_counts_what_the_server_did(server):
    _, url, _ = server

    async def metrics() -> dict[str, float]:
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await r.text()
        samples = [line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")]
        return {name: float(value) for name, value in samples}

    async def go():
        before = await metrics()
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(_stream(s, url + "/v1/completions", _completion([4] * (3 + i), 5)) for i in range(3)))
        return before, await metrics()

    before, after = asyncio.run(go())
    gen = "magpie_serve_generation_tokens_total"
    assert after[gen] - before[gen] == 15 and after["magpie_serve_kv_cache_slots"] == 4
    assert after['magpie_serve_requests_finished_total{reason="length"}'] - before['magpie_serve_requests_finished_total{reason="length"}'] == 3
    assert after["magpie_serve_requests_running"] == 0 and after["magpie_serve_decode_graph_replays_total"] == 0
    decode_steps = after['magpie_serve_steps_total{kind="decode"}'] + after['magpie_serve_steps_total{kind="mixed"}']
    assert after["magpie_serve_decode_eager_steps_total"] == decode_steps > 0  # the CPU: eager always


def test_usage_chunk_only_when_asked_and_non_streaming_response(server):
    _, url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            plain = await _stream(s, url + "/v1/completions", {"prompt": "hello", "max_tokens": 3, "stream": True,
                                                               "ignore_eos": True})
            async with s.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "ignore_eos": True}) as r:
                whole = await r.json()
            return plain, whole

    plain, whole = asyncio.run(go())
    assert plain[-1] == "[DONE]" and all(e["choices"] for e in plain[:-1]) and len(plain) == 4
    assert whole["usage"] == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9,  # BOS + 5 bytes
                              "prompt_tokens_details": {"cached_tokens": 0}}
    assert whole["choices"][0]["text"] == "".join(e["choices"][0]["text"] for e in plain[:-1])


def test_chat_completions_and_models(server):
    _, url, _ = server
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}

    async def go():
        async with aiohttp.ClientSession() as s:
            events = await _stream(s, url + "/v1/chat/completions", body)
            async with s.get(url + "/v1/models") as r:
                models = await r.json()
            async with s.post(url + "/v1/chat/completions", json={**body, "model": "other"}) as r:
                wrong = (r.status, await r.json())
            async with s.post(url + "/v1/completions", json={"prompt": [1, 2], "n": 2}) as r:
                n2 = (r.status, await r.json())
            async with s.post(url + "/v1/completions", json={"prompt": [1, 2], "temperature": 0.7}) as r:
                hot = (r.status, await r.json())
            async with s.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1,
                                                             "temperature": 0.0}) as r:
                cold = r.status
            async with s.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2047, "stream": True}) as r:
                long = (r.status, await r.json())
            return events, models, wrong, n2, hot, cold, long

    events, models, wrong, n2, hot, cold, long = asyncio.run(go())
    assert long[0] == 400 and "exceeds the model's max_seq_len 2048" in long[1]["error"]["message"]
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = events[1:-2]
    assert len(content) == 4 and content[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 4
    assert events[-2]["usage"]["prompt_tokens"] == len("user: hi\nassistant: ") + 1
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["object"] == "list"
    assert wrong[0] == 404 and "other" in wrong[1]["error"]["message"]
    assert n2[0] == 400 and "n=1" in n2[1]["error"]["message"]
    assert hot[0] == 400 and "greedily" in hot[1]["error"]["message"] and cold == 200


def test_profile_writes_a_trace_whose_steps_the_analysis_finds(server):
    _, url, profile_dir = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/start_profile") as r:
                assert r.status == 200, await r.text()
            await asyncio.gather(*(_stream(s, url + "/v1/completions", _completion([7] * (5 + i), 4)) for i in range(3)))
            async with s.post(url + "/stop_profile") as r:
                assert r.status == 200, await r.text()
                return (await r.json())["trace"]

    trace_path = Path(asyncio.run(go()))
    assert trace_path.parent == profile_dir and trace_path.name.endswith(".pt.trace.json.gz")
    steps = find_steps(load_trace(trace_path))
    assert steps and all(s.framework == "vllm" and s.detailed for s in steps)
    assert {"prefill", "decode"} <= {s.kind for s in steps}
    # Every request's prompt is prefilled exactly once and it gets 3 decode steps after its first token.
    assert sum(s.c_sq for s in steps) == 5 + 6 + 7
    assert sum(s.context_requests for s in steps) == 3 and sum(s.g_sq for s in steps) == 9
    assert all(s.c_sqsq >= s.c_sq and s.g_sqsq == s.g_sq for s in steps)


def test_profile_bounded_to_num_steps_stops_by_itself(server):
    _, url, profile_dir = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/start_profile", json={"num_steps": 2}) as r:
                assert r.status == 200 and (await r.json())["num_steps"] == 2
            await asyncio.gather(*(_stream(s, url + "/v1/completions", _completion([9] * 4, 6)) for _ in range(2)))
            async with s.post(url + "/stop_profile") as r:
                assert r.status == 200, await r.text()
                path = (await r.json())["trace"]
            async with s.post(url + "/start_profile", json={"num_steps": 0}) as r:
                bad = r.status
            return path, bad

    path, bad = asyncio.run(go())
    steps = find_steps(load_trace(Path(path)))
    assert len(steps) == 2 and bad == 400


def test_profile_without_kernel_sites_runs_the_steps_as_served(server):
    # kernel_sites: false keeps the served path (no per-call annotations, which only eager steps
    # carry); the default names every registry call. A non-boolean is refused.
    _, url, _ = server

    async def profile(body):
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/start_profile", json=body) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["kernel_sites"] == body.get("kernel_sites", True)
            await asyncio.gather(*(_stream(s, url + "/v1/completions", _completion([5] * 6, 4)) for _ in range(2)))
            async with s.post(url + "/stop_profile") as r:
                return Path((await r.json())["trace"])

    async def refused():
        async with aiohttp.ClientSession() as s, s.post(url + "/start_profile", json={"kernel_sites": "no"}) as r:
            return r.status, await r.text()

    def annotated(path: Path) -> int:
        trace = load_trace(path)
        return sum(1 for name in trace.names if name.startswith(KERNEL_ANNOTATION))

    served, named = asyncio.run(profile({"kernel_sites": False})), asyncio.run(profile({}))
    assert find_steps(load_trace(served)) and annotated(served) == 0 and annotated(named) > 0
    status, text = asyncio.run(refused())
    assert status == 400 and "kernel_sites" in text


def _metrics_now(url: str) -> dict[str, float]:
    async def go():
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            return await r.text()
    samples = [line.rsplit(" ", 1) for line in asyncio.run(go()).splitlines() if line and not line.startswith("#")]
    return {name: float(value) for name, value in samples}


def _raw_request(url: str, body: dict, version: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"POST /v1/completions HTTP/{version}\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_http10_client_gets_the_same_stream_unframed_until_close(server):
    """HTTP/1.0 has no chunked encoding: the tokens go out as the raw SSE body, ended by closing."""
    _, url, _ = server
    body = _completion([7, 8, 9, 10], 6)
    with _raw_request(url, body, "1.0") as sock:
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower(), head
    events = [e[6:] for e in payload.decode().split("\n\n") if e]

    async def framed():
        async with aiohttp.ClientSession() as s:
            return await _stream(s, url + "/v1/completions", body)

    expected = asyncio.run(framed())
    assert events[-1] == "[DONE]" and len(events) == len(expected) == 8
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:6]]
    assert texts == [c["choices"][0]["text"] for c in expected[:6]]
    assert json.loads(events[6])["usage"]["completion_tokens"] == 6


def test_a_client_that_goes_away_mid_stream_aborts_its_request(server):
    _, url, _ = server
    abort = 'magpie_serve_requests_finished_total{reason="abort"}'
    before = _metrics_now(url).get(abort, 0.0)
    with _raw_request(url, _completion([1, 2, 3], 1500), "1.1") as sock:
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in first.lower(), first
        while b"data: {" not in first:
            first += sock.recv(65536)
    deadline = time.monotonic() + 30
    while (now := _metrics_now(url)).get(abort, 0.0) == before:
        assert time.monotonic() < deadline, "the request ran on after its client left"
        time.sleep(0.1)
    assert now[abort] == before + 1 and now["magpie_serve_requests_running"] == 0

    async def after():  # and it still serves
        async with aiohttp.ClientSession() as s:
            return await _stream(s, url + "/v1/completions", _completion([5, 6], 3))

    assert asyncio.run(after())[-1] == "[DONE]"


def test_sigterm_stops_the_server_cleanly_mid_stream(server):
    proc, url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json=_completion([1, 2, 3], 1500)) as r:
                first = await r.content.readuntil(b"\n\n")
                proc.send_signal(signal.SIGTERM)
                return first, (await r.read()).decode()

    first, rest = asyncio.run(go())
    assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
    events = [e[6:] for e in rest.split("\n\n") if e]
    assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    ready = next((line for line in lines if line.startswith("magpie-serve ready: http://127.0.0.1:")), None)
    assert ready is not None and "cuda_graphs=off (eager)" in ready and "kv_cache=5x2048 tokens" in ready, out
    assert any(line.startswith("magpie-serve stats: ") for line in lines), out
    assert "magpie-serve: shutting down" in lines and "Traceback" not in out


def test_a_bad_kernel_override_stops_the_start_with_the_key_and_path(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("model: tiny\nkernels:\n  rmsnorm: no_such_package.rms:rmsnorm\n")
    proc = subprocess.run([sys.executable, "-m", "engine.serve", "--config", str(config), "--port", "0"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "kernels.rmsnorm: cannot import module 'no_such_package.rms'" in proc.stderr
    assert "ready" not in proc.stdout
