"""Tokenizers for text prompts: what `vllm bench serve` sends, and what the chat endpoint needs.

`client.tokenizer` (`--tokenizer`) names one: `builtin` is the built-in server's byte tokenizer;
anything else is a Hugging Face tokenizer (a hub name or a local folder), loaded with
`transformers.AutoTokenizer` — transformers is not a dependency of this package, so it must be
installed where a benchmark wants one (vLLM and SGLang environments have it).

Unset, the tokenizer is the model's (`--model`), as `vllm bench serve` defaults it; `none` asks for
token-id prompts. Token-id prompts (no tokenizer, or the model's cannot load) stay below a
vocabulary size known for certain (`known_vocab`).
"""

from __future__ import annotations

from typing import Any

from engine.bench.dataset import Tokenizer
from engine.errors import MagpieError
from engine.serve.tokenizer import BOS_ID, EOS_ID, decode

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
    plain = not trust_remote_code and _plain_fast_class(name)
    try:
        # The generic fast class, where the folder names it, loaded directly: AutoTokenizer first
        # imports transformers' configuration classes, which import torch (2-3 s of start-up where
        # torch is installed, as on every GPU server), for nothing a tokenizer needs.
        if plain:
            from transformers import PreTrainedTokenizerFast as AutoTokenizer
        else:
            from transformers import AutoTokenizer
    except ImportError:
        raise TokenizerError(f"client.tokenizer {name!r}: loading a Hugging Face tokenizer needs the transformers "
                             "package (pip install transformers), or set client.tokenizer none (--tokenizer none) for token-id "
                             "prompts") from None
    try:
        if plain:
            return AutoTokenizer.from_pretrained(name)
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a name it cannot resolve
        raise TokenizerError(f"client.tokenizer {name!r} could not be loaded: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''} (give a local folder with "
                             "tokenizer files, or a hub name reachable from here)") from None


_PLAIN_FAST = ("PreTrainedTokenizerFast", "TokenizersBackend")  # (the second: transformers 5's name of the first)


def _plain_fast_class(name: str) -> bool:
    """A local folder whose tokenizer_config.json names the generic fast tokenizer class (Llama 3's
    and many others' do) and that has the tokenizer.json it reads."""
    import json
    from pathlib import Path
    folder = Path(name).expanduser()
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict) and config.get("tokenizer_class") in _PLAIN_FAST
            and (folder / "tokenizer.json").is_file())


def transformers_available() -> bool:
    """Whether `transformers` can be imported here (checked without importing it: that takes seconds)."""
    import importlib.util
    return importlib.util.find_spec("transformers") is not None


def folder_vocab_size(model: str) -> int | None:
    """`vocab_size` from a local model folder's `config.json` (or its `text_config`), else None."""
    import json
    from pathlib import Path
    if not model:
        return None
    path = Path(model).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for node in (data, data.get("text_config") if isinstance(data, dict) else None):
        if isinstance(node, dict) and isinstance(node.get("vocab_size"), int) and node["vocab_size"] > 0:
            return int(node["vocab_size"])
    return None


def known_vocab(cfg: Any) -> tuple[int, tuple[int, ...], str] | None:
    """A vocabulary size known for certain for token-id prompts: (size, special ids, where from).

    In order: `client.vocab_size` (--vocab-size), `envs.VOCAB_SIZE`, the built-in server's preset
    (its byte tokenizer's BOS/EOS are special), a local model folder's `config.json`."""
    if cfg.client.vocab_size:
        return int(cfg.client.vocab_size), (), "client.vocab_size"
    env = cfg.envs.get("VOCAB_SIZE", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env), (), "envs.VOCAB_SIZE"
    if cfg.framework == "builtin":
        from engine.serve.shapes import PRESETS
        preset = PRESETS.get(cfg.server.size)
        if preset is not None:
            return preset.vocab_size, (BOS_ID, EOS_ID), f"the built-in {cfg.server.size} preset"
    size = folder_vocab_size(cfg.model)
    if size is not None:
        return size, (), f"{cfg.model}/config.json"
    return None


NO_VOCAB_FIX = ("set --tokenizer NAME_OR_FOLDER (client.tokenizer; needs transformers: pip install transformers), "
                "or --vocab-size N (client.vocab_size) with the model's vocabulary size, or give --model as a local "
                "folder holding its config.json")
