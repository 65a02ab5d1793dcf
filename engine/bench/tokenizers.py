"""Tokenizers for text prompts: what `vllm bench serve` sends, and what the chat endpoint needs.

`client.tokenizer` (`--tokenizer`) names one: `builtin` is the built-in server's byte tokenizer;
anything else is a Hugging Face tokenizer (a hub name or a local folder), loaded with
`transformers.AutoTokenizer` — transformers is not a dependency of this package, so it must be
installed where a benchmark wants one (vLLM and SGLang environments have it).
"""

from __future__ import annotations

from engine.bench.dataset import Tokenizer
from engine.errors import MagpieError
from engine.serve.tokenizer import BOS_ID, decode

BUILTIN = "builtin"


class BuiltinTokenizer:
    """The built-in server's tokenizer (one token per UTF-8 byte, a BOS in front), seen by the
    random dataset as a vocabulary of the printable ASCII bytes: ids 0-31 are marked special so
    that prompts are plain text whose byte length is its token length."""

    vocab_size = 127
    all_special_ids = list(range(32))

    def num_special_tokens_to_add(self) -> int:
        return 1  # the BOS the server puts in front

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return decode(ids)


class TokenizerError(MagpieError):
    """The tokenizer cannot be loaded; the message says why and what to do."""

    title = "tokenizer unavailable"


def load_tokenizer(name: str, *, trust_remote_code: bool = False) -> Tokenizer:
    if name == BUILTIN:
        return BuiltinTokenizer()
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise TokenizerError(f"client.tokenizer {name!r}: loading a Hugging Face tokenizer needs the transformers "
                             "package (pip install transformers), or leave client.tokenizer unset for token-id "
                             "prompts") from None
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a name it cannot resolve
        raise TokenizerError(f"client.tokenizer {name!r} could not be loaded: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''} (give a local folder with "
                             "tokenizer files, or a hub name reachable from here)") from None
