"""The built-in server's tokenizer: trivial, deterministic and byte-level, so that text prompts
work without a vocabulary file and lengths are predictable (one token per UTF-8 byte).

* ids 0-255 are the bytes 0x00-0xFF; ``BOS_ID`` = 256, ``EOS_ID`` = 257;
* ``encode(text)`` = [BOS] + the UTF-8 bytes of ``text`` (token-id prompts are used as given);
* ids of 258 and above (the random model's vocabulary is larger) decode to the byte ``id % 256``;
  BOS and EOS decode to nothing;
* chat messages become ``"<role>: <content>\\n"`` per message followed by ``"assistant: "``.

Decoding is incremental (``StreamDecoder``): a multi-byte character split across tokens is held
back until complete, which gives empty-text chunks exactly as vLLM's detokenizer does.
"""

from __future__ import annotations

import codecs
from typing import Iterable, Mapping

BOS_ID = 256
EOS_ID = 257


def encode(text: str) -> list[int]:
    return [BOS_ID, *text.encode("utf-8")]


def token_bytes(ids: Iterable[int]) -> bytes:
    return bytes(i % 256 for i in ids if i not in (BOS_ID, EOS_ID))


def decode(ids: Iterable[int]) -> str:
    return token_bytes(ids).decode("utf-8", errors="replace")


def chat_prompt(messages: Iterable[Mapping[str, object]]) -> str:
    """The chat template (see the module docstring). ``content`` may be a string or a list of
    OpenAI content parts, whose ``text`` parts are concatenated."""
    out = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        out.append(f"{m.get('role', 'user')}: {content}\n")
    out.append("assistant: ")
    return "".join(out)


class StreamDecoder:
    """Text of one token at a time; holds back incomplete UTF-8 sequences."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._dec.decode(token_bytes([token_id]))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
