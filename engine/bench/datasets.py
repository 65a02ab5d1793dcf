"""Datasets from files, with `vllm bench serve`'s names: `custom` (JSONL) and `sharegpt` (JSON).

Custom JSONL, one request a line (a JSON object):

* the prompt: `prompt` (text, or a list of token ids) or `prompt_token_ids` (token ids);
* `output_len` (also `output_tokens` or `max_tokens`): tokens to generate; without it the run's
  output length (`--custom-output-len`, else `--output-len`);
* `timestamp` (seconds, any origin; optional): when the line has one, every line must, and the
  requests are released on that schedule (a trace replay: request i at timestamp_i - timestamp_0)
  instead of by the request rate. Lines are kept in file order (vLLM shuffles custom data unless
  `--disable-shuffle`; a trace has to keep its order).

ShareGPT JSON (a list of `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}`):
as vLLM samples it — shuffled with the seed, the first human turn is the prompt and the reply after
it sets the output length (through the tokenizer; `--sharegpt-output-len` fixes it instead),
conversations with fewer than two turns are skipped, and with a tokenizer pairs with a prompt or
reply under 4 tokens, a prompt over 1024 or a total over 2048 are skipped.

Text prompts are counted with the tokenizer when there is one; without one their length is left
to the server's usage report (input tokens in the report are the server's in any case).

Every problem names the file, the line, the field and what is allowed (`DatasetError`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from engine.bench.dataset import SampleRequest, Tokenizer
from engine.errors import MagpieError

DATASET_NAMES = ("random", "custom", "sharegpt")
_OUTPUT_KEYS = ("output_len", "output_tokens", "max_tokens")
_MAX_LISTED = 20


class DatasetError(MagpieError):
    """A dataset file that cannot be used: every problem with its file:line and field."""

    title = "bad dataset"

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        more = f"\n... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        super().__init__("\n".join(problems[:_MAX_LISTED]) + more)


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                           for t in value)


def _line_request(where: str, row: Any, index: int, default_output_len: int, tokenizer: Tokenizer | None,
                  problems: list[str]) -> SampleRequest | None:
    if not isinstance(row, dict):
        problems.append(f"{where}: expected a JSON object with a prompt, got {type(row).__name__}")
        return None
    fix = "give prompt (text or token ids) or prompt_token_ids"
    prompt: list[int] | str | None = None
    if "prompt_token_ids" in row:
        if not _token_ids(row["prompt_token_ids"]):
            problems.append(f"{where}: prompt_token_ids: expected a non-empty list of token ids (integers >= 0)")
            return None
        prompt = row["prompt_token_ids"]
    elif "prompt" in row:
        value = row["prompt"]
        if isinstance(value, str) and value:
            prompt = value
        elif _token_ids(value):
            prompt = value
        else:
            problems.append(f"{where}: prompt: expected non-empty text or a list of token ids (integers >= 0)")
            return None
    else:
        problems.append(f"{where}: no prompt: {fix}")
        return None
    output_len = default_output_len
    for key in _OUTPUT_KEYS:
        if key in row:
            v = row[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                problems.append(f"{where}: {key}: expected an integer >= 1, got {v!r}")
                return None
            output_len = v
            break
    timestamp = row.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool)
                                  or timestamp != timestamp or timestamp < 0):
        problems.append(f"{where}: timestamp: expected seconds (a number >= 0), got {timestamp!r}")
        return None
    if isinstance(prompt, list):
        prompt_len = len(prompt)
    else:
        prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False)) if tokenizer is not None else 0
    return SampleRequest(prompt=prompt, prompt_len=prompt_len, output_len=output_len, request_id=str(index),
                         timestamp=float(timestamp) if timestamp is not None else None)


def load_custom_jsonl(path: str | Path, *, num_requests: int | None, output_len: int,
                      tokenizer: Tokenizer | None = None) -> list[SampleRequest]:
    """The requests of a custom JSONL file (see the module docstring); the first `num_requests`
    (None: all). Raises DatasetError listing every bad line."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError([f"{p}: cannot read the dataset ({exc})"]) from None
    problems: list[str] = []
    out: list[SampleRequest] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not JSON ({exc.msg} at column {exc.colno}); each line is one JSON object "
                            'such as {"prompt": "...", "output_len": 128}')
            continue
        req = _line_request(where, row, len(out), output_len, tokenizer, problems)
        if req is not None:
            out.append(req)
    if not problems and not out:
        problems.append(f"{p}: no requests in the file (one JSON object a line)")
    stamped = [r.timestamp is not None for r in out]
    if any(stamped) and not all(stamped):
        first = stamped.index(False) if stamped[0] else stamped.index(True)
        problems.append(f"{p}: timestamp: some lines have one and some do not (request {first} differs from the "
                        "first): give every line a timestamp for a trace replay, or none")
    if problems:
        raise DatasetError(problems)
    return out[:num_requests] if num_requests is not None else out


def load_sharegpt(path: str | Path, *, num_requests: int, seed: int = 0, output_len: int | None = None,
                  tokenizer: Tokenizer | None = None, default_output_len: int = 128) -> list[SampleRequest]:
    """`num_requests` requests sampled from a ShareGPT JSON file as vLLM's ShareGPTDataset samples
    them (see the module docstring). `output_len` fixes the output length; without a tokenizer and
    without it, `default_output_len`."""
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError([f"{p}: cannot read the dataset ({exc})"]) from None
    except json.JSONDecodeError as exc:
        raise DatasetError([f"{p}:{exc.lineno}: not JSON ({exc.msg} at column {exc.colno}); ShareGPT is one JSON "
                            'list of {"conversations": [{"from": "human", "value": ...}, ...]}']) from None
    if not isinstance(data, list):
        raise DatasetError([f"{p}:1: expected a JSON list of conversations, got {type(data).__name__}"])
    convs = [d for d in data if isinstance(d, dict) and isinstance(d.get("conversations"), list)
             and len(d["conversations"]) >= 2]
    random.Random(seed).shuffle(convs)
    out: list[SampleRequest] = []
    for conv in convs:
        if len(out) >= num_requests:
            break
        turns = conv["conversations"]
        prompt, completion = turns[0].get("value") if isinstance(turns[0], dict) else None, \
            turns[1].get("value") if isinstance(turns[1], dict) else None
        if not isinstance(prompt, str) or not isinstance(completion, str) or not prompt:
            continue
        prompt_len = 0
        n_out = output_len or default_output_len
        if tokenizer is not None:
            prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False))
            reply_len = len(tokenizer.encode(completion, add_special_tokens=False))
            n_out = output_len or reply_len
            if prompt_len < 4 or (output_len is None and reply_len < 4) or prompt_len > 1024 \
                    or prompt_len + n_out > 2048:
                continue
        out.append(SampleRequest(prompt=prompt, prompt_len=prompt_len, output_len=n_out, request_id=str(len(out))))
    if not out:
        raise DatasetError([f"{p}: no usable conversation (each needs at least two turns whose first value is the "
                            "prompt)"])
    return out
