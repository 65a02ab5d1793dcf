"""Multi-turn sessions: the dataset model of a session replay, and where sessions come from.

A ``Session`` is a list of ``Turn``s. Each turn has a new input (text, token ids, or a token
count with the shared-prefix block hashes it is built from), an output length, and when it is
sent: ``delay_s`` after the previous turn's answer (closed loop) or at ``timestamp_s`` from the
start of the trace (open loop). Turn k's prompt is the session's history (the system prompt, every
earlier input and every earlier answer) followed by turn k's input, so its prefix is the previous
turn's whole prompt: a server with prefix caching reuses it. A session may be the child of
another (a sub-agent): it starts after its parent's turn ``parent_turn`` is answered, with the
parent's history at that point as the start of its own.

Sources (``load_sessions``):

* ``mooncake``: AIPerf's mooncake trace JSONL, one request a line: ``input_length`` and
  ``output_length`` (tokens), ``timestamp`` (ms from the start) or ``delay`` (ms after the
  previous turn of its session), ``hash_ids`` (the input's blocks of ``block_size`` tokens,
  AIPerf's default 512: the same id is the same tokens wherever it appears, so ids shared between
  lines are shared prefixes), ``session_id`` where lines form multi-turn sessions (else each line
  is a session of one turn), optionally ``text_input`` (the input as text) and
  ``parent_session_id`` (a sub-agent of that session, started after its parent's turn before it);
* ``sharegpt``: multi-turn ShareGPT JSON, a list of ``{"conversations": [{"from": "human",
  "value": ...}, {"from": "gpt", "value": ...}, ...]}`` (an optional first ``system`` message is
  the session's system prompt): each human message is a turn, the reply after it sets its output
  length (through the tokenizer, else ``output_len``);
* ``synthetic``: ``num_sessions`` x ``turns`` with a system prompt of ``system_prompt_len`` tokens
  shared by every session, ``input_len`` new tokens and ``output_len`` answer tokens a turn (the
  context grows by both each turn), ``delay_s`` between turns and ``subagents`` children per
  session forked after its first turn.

Problems name the file, the line and the field (``DatasetError``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from engine.bench.dataset import Tokenizer
from engine.bench.datasets import DatasetError

SESSION_SOURCES = ("mooncake", "sharegpt", "synthetic")
MOONCAKE_BLOCK_SIZE = 512  # AIPerf's default prompt block size for mooncake hash_ids


@dataclass
class Turn:
    """One request of a session: its new input and output length, and when it goes."""

    input: str | list[int]  # the new input (text, or token ids)
    input_tokens: int  # its length in tokens (0 for text without a tokenizer: the server's usage counts it)
    output_len: int
    delay_s: float = 0.0  # closed loop: after the previous turn's answer (or the session's start)
    timestamp_s: float | None = None  # open loop: from the start of the replay
    hash_ids: list[int] = field(default_factory=list)  # the input's shared-prefix blocks (mooncake)


@dataclass
class Session:
    session_id: str
    turns: list[Turn]
    system: str | list[int] | None = None  # the history's start (a shared system prompt)
    parent_id: str | None = None  # a sub-agent: started by this session
    parent_turn: int | None = None  # ... after that turn (0-based) of the parent is answered
    children: list[str] = field(default_factory=list)

    @property
    def text(self) -> bool:
        return any(isinstance(t.input, str) for t in self.turns) or isinstance(self.system, str)


class BlockTokens:
    """Token ids of hash-id blocks: the same id is the same tokens everywhere (a deterministic
    draw from the allowed ids, seeded by the id), so inputs that share ids share prefixes."""

    def __init__(self, vocab_size: int, special_ids: Sequence[int] = (), seed: int = 0) -> None:
        special = set(int(s) for s in special_ids)
        self.allowed = np.array([i for i in range(vocab_size) if i not in special], dtype=np.int64)
        if not self.allowed.size:
            raise ValueError("every token id is special; nothing to build prompts from")
        self.seed = seed
        self._cache: dict[int, list[int]] = {}

    def block(self, hash_id: int, size: int) -> list[int]:
        key = hash_id * 1_000_003 + size
        got = self._cache.get(key)
        if got is None:
            rng = np.random.default_rng([self.seed, hash_id & 0xFFFFFFFF, hash_id >> 32 & 0xFFFFFFFF])
            got = self._cache[key] = self.allowed[rng.integers(0, len(self.allowed), size=size)].tolist()
        return got

    def unique(self, key: tuple[int, ...], size: int) -> list[int]:
        """Tokens no other input shares (by construction, with overwhelming probability)."""
        rng = np.random.default_rng([self.seed + 1, *key])
        return self.allowed[rng.integers(0, len(self.allowed), size=size)].tolist()

    def input(self, hash_ids: Sequence[int], length: int, block_size: int, key: tuple[int, ...]) -> list[int]:
        """An input of ``length`` tokens: the blocks of ``hash_ids`` in order (the last one cut to
        what is left), then unique tokens for any length beyond them."""
        out: list[int] = []
        for h in hash_ids:
            if len(out) >= length:
                break
            out += self.block(int(h), min(block_size, length - len(out)))
        if len(out) < length:
            out += self.unique(key, length - len(out))
        return out


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _mooncake_row(where: str, row: dict[str, Any], problems: list[str]) -> tuple | None:
    """A mooncake line's fields, checked: (text_input, input_length, output_length, hash_ids,
    timestamp, delay, session_id, parent_session_id), or None with its problems listed."""
    before = len(problems)
    text_input = row.get("text_input")
    if text_input is not None and (not isinstance(text_input, str) or not text_input):
        problems.append(f"{where}: text_input: expected non-empty text, got {text_input!r}")
    n_in = row.get("input_length")
    if text_input is None and (not _int(n_in) or n_in < 1):
        problems.append(f"{where}: input_length: expected an integer >= 1 (input tokens), got {n_in!r}")
    n_out = row.get("output_length")
    if not _int(n_out) or n_out < 1:
        problems.append(f"{where}: output_length: expected an integer >= 1 (output tokens), got {n_out!r}")
    hash_ids = row.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(_int(h) and h >= 0 for h in hash_ids):
        problems.append(f"{where}: hash_ids: expected a list of block ids (integers >= 0), got {hash_ids!r}")
    ts, delay = row.get("timestamp"), row.get("delay")
    for key, v in (("timestamp", ts), ("delay", delay)):
        if v is not None and (not _number(v) or v < 0):
            problems.append(f"{where}: {key}: expected milliseconds (a number >= 0), got {v!r}")
    sid, parent = row.get("session_id"), row.get("parent_session_id")
    for key, v in (("session_id", sid), ("parent_session_id", parent)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            problems.append(f"{where}: {key}: expected a string or an integer, got {v!r}")
    if len(problems) > before:
        return None
    return text_input, n_in, n_out, hash_ids, ts, delay, sid, parent


def load_mooncake(path: str | Path, *, blocks: BlockTokens | None, block_size: int = MOONCAKE_BLOCK_SIZE,
                  tokenizer: Tokenizer | None = None, max_sessions: int | None = None) -> list[Session]:
    """The sessions of an AIPerf mooncake trace (see the module docstring), in order of their
    first line. ``blocks`` builds token-id inputs (needed unless every line has ``text_input``)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError([f"{p}: cannot read the trace ({exc})"]) from None
    problems: list[str] = []
    sessions: dict[str, Session] = {}
    parents: dict[str, tuple[str, str]] = {}  # child id -> (parent id, where)
    example = '{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}'
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not JSON ({exc.msg} at column {exc.colno}); each line is one JSON object such "
                            f"as {example}")
            continue
        if not isinstance(row, dict):
            problems.append(f"{where}: expected a JSON object such as {example}, got {type(row).__name__}")
            continue
        checked = _mooncake_row(where, row, problems)
        if checked is None:
            continue
        text_input, n_in, n_out, hash_ids, ts, delay, sid, parent = checked
        sid = str(sid) if sid is not None else f"line{lineno}"
        if text_input is not None:
            inp: str | list[int] = text_input
            n_tokens = len(tokenizer.encode(text_input, add_special_tokens=False)) if tokenizer is not None else 0
        else:
            if blocks is None:
                problems.append(f"{where}: input_length without text_input needs the model's vocabulary for token-id "
                                "prompts (--vocab-size, or a model folder with config.json)")
                continue
            inp = blocks.input(hash_ids, n_in, block_size, (lineno,))
            n_tokens = n_in
        session = sessions.get(sid)
        if session is None:
            session = sessions[sid] = Session(sid, [])
            if parent is not None:
                parents[sid] = (str(parent), where)
        session.turns.append(Turn(inp, n_tokens, n_out, delay_s=float(delay or 0) / 1000,
                                  timestamp_s=float(ts) / 1000 if ts is not None else None, hash_ids=list(hash_ids)))
    for child, (parent, where) in parents.items():
        if parent not in sessions:
            problems.append(f"{where}: parent_session_id: no session {parent!r} in the trace")
            continue
        sessions[child].parent_id = parent
        sessions[child].parent_turn = 0  # after the parent's first turn: the earliest it can fork
        sessions[parent].children.append(child)
    if not problems and not sessions:
        problems.append(f"{p}: no requests in the trace (one JSON object a line, such as {example})")
    if problems:
        raise DatasetError(problems)
    out = list(sessions.values())
    return out[:max_sessions] if max_sessions is not None else out


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "system": "system"}


def load_sharegpt_sessions(path: str | Path, *, max_sessions: int | None = None, seed: int = 0,
                           tokenizer: Tokenizer | None = None, output_len: int | None = None,
                           default_output_len: int = 128, min_turns: int = 1) -> list[Session]:
    """Multi-turn sessions of a ShareGPT JSON file (see the module docstring): conversations
    shuffled with ``seed`` as vLLM's ShareGPT sampling does, those with fewer than ``min_turns``
    human turns skipped."""
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
    problems: list[str] = []
    indexed = list(enumerate(data))
    random.Random(seed).shuffle(indexed)
    out: list[Session] = []
    for index, conv in indexed:
        if max_sessions is not None and len(out) >= max_sessions:
            break
        where = f"{p}: conversation {index}"
        msgs = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(msgs, list):
            problems.append(f"{where}: expected an object with a 'conversations' list")
            continue
        system: str | None = None
        turns: list[Turn] = []
        for j, m in enumerate(msgs):
            role = _ROLES.get(str(m.get("from", m.get("role", "")))) if isinstance(m, dict) else None
            value = m.get("value", m.get("content")) if isinstance(m, dict) else None
            if role is None or not isinstance(value, str):
                problems.append(f"{where}, message {j}: expected {{\"from\": \"human\"|\"gpt\"|\"system\", "
                                "\"value\": text}")
                turns = []
                break
            if role == "system":
                if j == 0:
                    system = value
                continue
            if role == "user":
                n_in = len(tokenizer.encode(value, add_special_tokens=False)) if tokenizer is not None else 0
                turns.append(Turn(value, n_in, output_len or default_output_len))
            elif turns and output_len is None and tokenizer is not None:
                turns[-1].output_len = max(1, len(tokenizer.encode(value, add_special_tokens=False)))
        if len(turns) >= max(min_turns, 1):
            out.append(Session(f"conv{index}", turns, system=system))
    if problems:
        raise DatasetError(problems)
    if not out:
        raise DatasetError([f"{p}: no usable conversation (each needs at least {max(min_turns, 1)} human turn(s))"])
    return out


def synthetic_sessions(num_sessions: int, turns: int, *, blocks: BlockTokens, system_prompt_len: int = 0,
                       input_len: int = 64, output_len: int = 32, delay_s: float = 0.0, subagents: int = 0,
                       subagent_turns: int = 1) -> list[Session]:
    """``num_sessions`` sessions of ``turns`` turns (see the module docstring); the system prompt
    is the same tokens in every session, each input is new tokens."""
    if num_sessions < 1 or turns < 1:
        raise ValueError(f"synthetic sessions: {num_sessions} sessions x {turns} turns: both must be at least 1")
    system = blocks.unique((0, 0, 0), system_prompt_len) if system_prompt_len > 0 else None
    out: list[Session] = []
    for s in range(num_sessions):
        sid = f"s{s}"
        parent = Session(sid, [Turn(blocks.unique((1, s, k), input_len), input_len, output_len,
                                    delay_s=delay_s if k else 0.0) for k in range(turns)], system=system)
        out.append(parent)
        for c in range(subagents):
            cid = f"s{s}.a{c}"
            parent.children.append(cid)
            out.append(Session(cid, [Turn(blocks.unique((2, s, c, k), input_len), input_len, output_len,
                                          delay_s=delay_s if k else 0.0) for k in range(subagent_turns)],
                               parent_id=sid, parent_turn=0))
    return out
