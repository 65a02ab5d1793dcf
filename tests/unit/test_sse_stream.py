"""The load generator's batched reading of a streamed completion (`feed_many`, what a response's
kept reads go through) against its one-read-at-a-time path (`feed`): every stream below, the
common shape and the awkward ones, must come out the same request either way."""

from __future__ import annotations

import dataclasses

import pytest

from engine.bench.loadgen import _DATA_LINE, _CompletionStream
from engine.bench.metrics import RequestOutput


def _tok(text: str = " t") -> bytes:
    return b'data: {"object":"text_completion","choices":[{"index":0,"text":"%s","finish_reason":null}]}\n\n' % text.encode()


def _delta(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":12}}\n\n'
DONE = b"data: [DONE]\n\n"

STREAMS = {
    "tokens": [_tok()] * 12 + [USAGE + DONE],
    "tokens, [DONE] alone": [_tok()] * 12 + [USAGE, DONE],
    "no space after data:": [b'data:{"choices":[{"text":"a"}]}\n\n'] * 5 + [DONE],
    "chat deltas, an empty one": [_delta("a"), _delta(""), _delta("b"), _delta("c"), USAGE + DONE],
    "two events in one read": [_tok(), _tok() + _tok(), _tok(), _tok(), DONE],
    "a comment among them": [_tok(), _tok(), b": ping\n\n", _tok(), _tok(), DONE],
    "an event: line": [_tok(), _tok(), b"event: message\n" + _tok(), _tok(), DONE],
    "CRLF lines": [_tok().replace(b"\n", b"\r\n")] * 4 + [DONE],
    "an error event": [_tok(), _tok(), b'data: {"error":{"message":"boom"}}\n\n', _tok(), DONE],
    "malformed JSON": [_tok(), _tok(), b"data: {nope\n\n", _tok(), DONE],
    "[DONE] in the middle": [_tok(), _tok(), DONE, _tok(), _tok()],
    "usage on every token": [b'data: {"choices":[{"text":"x"}],"usage":{"completion_tokens":%d}}\n\n' % i
                             for i in range(1, 6)] + [DONE],
    "a message split over reads": [_tok(), _tok(), _tok()[:20], _tok()[20:], _tok(), DONE],
    "no [DONE]": [_tok()] * 6,
    "an empty data line": [_tok(), _tok(), b"data:\n\n", _tok(), _tok(), DONE],
    "two messages on one data line": [_tok(), b'data: {"choices":[{"text":"a"}]},{"choices":[{"text":"b"}]}\n\n',
                                      _tok(), _tok(), DONE],
    "an empty payload after data: ": [_tok(), _tok(), b"data: \n\n", _tok(), _tok(), DONE],
    "a message that is not an object": [_tok(), _tok(), b"data: 17\n\n", _tok(), _tok(), DONE],
    "an event of two data lines": [_tok(), b'data: {"choices":\ndata: [{"text":"a"}]}\n\n', _tok(), _tok(), DONE],
    "a payload ending in CR": [_tok(), _tok().replace(b"}\n\n", b"}\r\n\n"), _tok(), _tok(), DONE],
    "[DONE] among data lines": [_tok(), _tok(), DONE, _tok(), USAGE + DONE],
    # vLLM's way: usage and [DONE] each a read (a chunk) of their own, the body's end one more
    "[DONE] in a read of its own, then the end": [_tok()] * 6 + [USAGE, DONE, b""],
    "only [DONE], then the end": [DONE, b""],
    "[DONE] twice": [_tok(), _tok(), DONE, DONE, b""],
    # JSON across two lines, the second no data line: SSE drops it (the message is cut short)
    "a line break inside a message": [_tok(), b'data: {"choices":[{"text":"a"}],\n"usage":null}\n\n', _tok(), DONE],
    "a CR inside a message": [_tok(), b'data: {"choices":[{"text":"a"}],\r"usage":null}\n\n', _tok(), DONE],
}


def _framed(pieces: list[bytes]) -> list[bytes] | None:
    """The payloads of every piece but the last when each is `data: <payload>\n\n` (what the HTTP
    client hands `feed_data_lines`), else None."""
    prefix, suffix = _DATA_LINE
    head = pieces[:-1]
    if all(p.startswith(prefix) and p.endswith(suffix) and len(p) >= len(prefix) + len(suffix) for p in head):
        return [p[len(prefix):len(p) - len(suffix)] for p in head]
    return None


def _run(pieces: list[bytes], batched: bool | str) -> RequestOutput:
    out = RequestOutput(request_id="r")
    stream = _CompletionStream(out, 0.0)
    stamps = [0.1 * (i + 1) for i in range(len(pieces))]
    if batched == "data lines":
        payloads = _framed(pieces)
        assert payloads is not None
        if not stream.feed_data_lines(payloads, stamps[:-1]):
            stream.feed_many(pieces[-1:], stamps[-1:])
    elif batched:
        stream.feed_many(pieces, stamps)
    else:
        for piece, at in zip(pieces, stamps):
            if stream.feed(piece, at):
                break
    stream.finish()
    return out


@pytest.mark.parametrize("name", STREAMS)
def test_batched_reads_give_the_request_that_read_by_read_gives(name):
    pieces = STREAMS[name]
    one_by_one, batched = _run(pieces, batched=False), _run(pieces, batched=True)
    assert dataclasses.asdict(batched) == dataclasses.asdict(one_by_one)


@pytest.mark.parametrize("name", [n for n in STREAMS if _framed(STREAMS[n]) is not None])
def test_data_line_payloads_give_the_request_that_read_by_read_gives(name):
    pieces = STREAMS[name]
    one_by_one, framed = _run(pieces, batched=False), _run(pieces, batched="data lines")
    assert dataclasses.asdict(framed) == dataclasses.asdict(one_by_one)


def test_the_common_stream_is_read_right():
    out = _run(STREAMS["tokens"], batched=True)
    assert out.success and out.output_tokens == 12 and out.counted_tokens == 12
    assert out.ttft == pytest.approx(0.1) and len(out.itl) == 11 and out.itl[-1] == pytest.approx(0.1)
    bad = _run(STREAMS["an error event"], batched=True)
    assert not bad.success and "boom" in bad.error


def test_a_stream_as_vllm_writes_it_is_decoded_at_once(monkeypatch):
    """Tokens, the usage message and [DONE] each in a chunk of its own: one array decode, not the
    general way (which gives the same request, more slowly)."""
    payloads = _framed(STREAMS["[DONE] in a read of its own, then the end"])
    assert payloads is not None and payloads[-1] == b"[DONE]"
    monkeypatch.setattr(_CompletionStream, "feed_many", lambda *a: pytest.fail("took the general way"))
    out = RequestOutput(request_id="r")
    stream = _CompletionStream(out, 0.0)
    assert stream.feed_data_lines(payloads, [0.1 * (i + 1) for i in range(len(payloads))]) is False
    stream.finish()
    assert out.success and out.output_tokens == 12 and out.counted_tokens == 6 and len(out.itl) == 5
