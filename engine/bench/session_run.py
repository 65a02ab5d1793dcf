"""``magpie benchmark`` with a session dataset: where the run's sessions come from and how one
sweep point's repeats replay them (``engine.bench.session_replay``).

A run replays sessions when ``client.dataset_name`` is ``mooncake`` (``--dataset-path`` a trace
JSONL) or ``sessions`` (synthetic), or ``sharegpt`` with ``client.multi_turn``. The point's
concurrency caps the sessions running at once (closed loop) and is the default session count;
ISL and OSL are the synthetic turns' new input and answer tokens. Each repeat's result is the
per-request metrics every run reports plus a ``sessions`` section (``session_metrics``); the
per-request lists, with the session and turn of each, go to ``requests/point<i>_repeat<r>.json``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from engine.bench.session_replay import (SessionReplay, SessionReplayConfig, detailed_turns, replay_report)
from engine.bench.sessions import BlockTokens, Session, load_mooncake, load_sharegpt_sessions, synthetic_sessions
from engine.eventloop import run_coroutine

if TYPE_CHECKING:
    from engine.bench.run import BenchRun, LoadTarget, _Shape

TOKEN_ID_SESSIONS = ("mooncake", "sessions")


def is_session_run(client: Any) -> bool:
    return client.dataset_name in TOKEN_ID_SESSIONS or (client.dataset_name == "sharegpt" and client.multi_turn)


def _blocks(target: "LoadTarget", seed: int) -> BlockTokens:
    tok = target.tokenizer
    if tok is not None:
        return BlockTokens(int(tok.vocab_size), list(tok.all_special_ids), seed)
    if target.vocab is None:
        raise ValueError("token-id sessions need the model's vocabulary size (--vocab-size)")
    return BlockTokens(target.vocab, target.special, seed)


def load_run_sessions(run: "BenchRun", target: "LoadTarget", shape: "_Shape",
                      rep: int) -> tuple[list[Session], BlockTokens | None]:
    """The sessions of one repeat, and the token maker for token-id histories."""
    cl = run.cfg.client
    seed = cl.seed + rep
    if cl.dataset_name == "sharegpt":
        assert cl.dataset_path is not None
        return load_sharegpt_sessions(cl.dataset_path, max_sessions=cl.num_sessions or shape.conc, seed=seed,
                                      tokenizer=target.tokenizer, output_len=cl.sharegpt_output_len,
                                      default_output_len=shape.osl), None
    blocks = _blocks(target, seed)
    if cl.dataset_name == "mooncake":
        assert cl.dataset_path is not None
        sessions = load_mooncake(cl.dataset_path, blocks=blocks, block_size=cl.session_block_size,
                                 tokenizer=target.tokenizer, max_sessions=cl.num_sessions)
    else:
        sessions = synthetic_sessions(cl.num_sessions or shape.conc, cl.session_turns, blocks=blocks,
                                      system_prompt_len=cl.system_prompt_len, input_len=shape.isl,
                                      output_len=shape.osl, delay_s=cl.session_delay, subagents=cl.subagents)
    if cl.endpoint == "chat":
        return as_text(sessions, target.tokenizer, cl.dataset_name), blocks
    return sessions, blocks


def as_text(sessions: list[Session], tokenizer: Any, dataset: str) -> list[Session]:
    """Token-id sessions as text, for the chat endpoint: each input (and the shared system prompt)
    decoded by the tokenizer, once per distinct input, so a prefix two sessions share is the same
    text in both (as vLLM's random dataset decodes its token ids). The answers are then the server's
    own text, appended to the conversation as chat clients do."""
    if tokenizer is None:
        raise ValueError(f"{dataset} sessions on the chat endpoint need a tokenizer (--tokenizer): their inputs are "
                         "token ids, which chat messages cannot carry; or use --endpoint completions")
    decoded: dict[tuple[int, ...], str] = {}

    def text(ids: Any) -> Any:
        if not isinstance(ids, list):
            return ids
        key = tuple(ids)
        if key not in decoded:
            decoded[key] = tokenizer.decode(ids, skip_special_tokens=True)
        return decoded[key]
    for session in sessions:
        session.system = text(session.system)
        for turn in session.turns:
            turn.input = text(turn.input)
    return sessions


def no_cached_tokens_note(section: dict) -> str | None:
    """The warning for a replay whose answers carried no ``usage.prompt_tokens_details.cached_tokens``
    (``section``: ``session_metrics``), None when some did or no turn was answered. vLLM sends the
    field only when started with ``--enable-prompt-tokens-details``: a vLLM this tool launches for a
    session replay gets that flag (``engine.bench.launch.server_command``), a server given by
    ``--base-url`` may lack it."""
    if not section.get("turns_completed") or section.get("cached_prompt_tokens") is not None:
        return None
    metrics = ("; the prefix-cache hit rate from the server's /metrics is still reported"
               if (section.get("server_prefix_cache") or {}).get("hit_rate") is not None else "")
    return ("the server's answers carried no usage.prompt_tokens_details.cached_tokens, so the sessions report no "
            "cached prompt tokens per turn (vLLM sends them only when started with --enable-prompt-tokens-details)"
            + metrics)


def run_session_repeats(run: "BenchRun", target: "LoadTarget", point: dict, index: int, shape: "_Shape") -> list[dict]:
    """One sweep point's repeats of the session replay: their results (as ``_run_repeats``)."""
    cancel, cl = run.cancel, run.cfg.client
    runs: list[dict] = []
    for rep in range(cl.repeats):
        if cancel.cancelled or run.server_gone:
            break
        runs.append(_one_repeat(run, target, point, index, shape, rep))
        if cancel.cancelled:
            break
    return runs


def _one_repeat(run: "BenchRun", target: "LoadTarget", point: dict, index: int, shape: "_Shape", rep: int) -> dict:
    from engine.bench.run import ProgressTimer, _save, failures_by_cause

    cfg, cancel = run.cfg, run.cancel
    cl = cfg.client
    sessions, blocks = load_run_sessions(run, target, shape, rep)
    mode = cl.session_mode
    if mode == "auto":
        mode = "open" if any(t.timestamp_s is not None for s in sessions for t in s.turns) else "closed"
    config = SessionReplayConfig(base_url=target.base_url, model=target.model,
                                 endpoint="/v1/chat/completions" if cl.endpoint == "chat" else "/v1/completions",
                                 mode=mode, session_header=cl.session_header, max_concurrency=shape.conc,
                                 request_timeout_s=cfg.timeout_seconds, num_warmups=cl.warmup,
                                 http_client=cl.http_client)
    total = sum(len(s.turns) for s in sessions)
    replay = SessionReplay(config, sessions, filler=blocks)
    progress = ProgressTimer(replay, lambda **f: run.ws.events.emit("progress", **f),  # type: ignore[arg-type]
                             {"repeat": rep, "repeats": cl.repeats, "point": point, "point_index": index},
                             scraper=run.scraper).start()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            if cancel.cancelled or run.server_gone:
                replay.cancel()
                return

    threading.Thread(target=watch, daemon=True).start()
    run.log(f"point {point or 'default'}: replaying {len(sessions)} sessions ({total} turns), {mode} loop, "
            f"at most {shape.conc} at once")
    try:
        result_obj = run_coroutine(replay.run(), cl.event_loop, reads_streams=cl.http_client == "lean")
    finally:
        stop.set()
        progress.stop()
    result = replay_report(result_obj, goodput_slos=cl.goodput or None)
    outputs = [t.out for t in result_obj.turns]
    result["errors"] = sorted({o.error for o in outputs if not o.success and o.error})[:10]
    result["failed_by_cause"] = failures_by_cause(outputs)
    result["cut_short"] = bool(cancel.cancelled or run.server_gone)
    result["session_mode"] = mode
    result["halved_acks"] = result_obj.halved_acks  # how the client ACKed the tokens (docs/benchmark.md)
    _save(run, f"requests/point{index}_repeat{rep}.json", detailed_turns(result_obj))
    s = result["sessions"]
    note = None if cfg.framework == "builtin" and not cfg.server.prefix_caching else no_cached_tokens_note(s)
    if note and note not in run.warnings:  # said once, not at every point and repeat
        run.warnings.append(note)
        run.log(f"warning: {note}")
    pc = s.get("server_prefix_cache") or {}
    hit = f", server prefix-cache hit rate {pc['hit_rate']:.1%}" if pc.get("hit_rate") is not None else ""
    run.log(f"point {point or 'default'} repeat {rep + 1}/{cl.repeats}: {s['sessions_completed']}/{s['sessions']} "
            f"sessions, {result['completed']} turns ok, {result['failed']} failed, cached prompt tokens "
            f"{s['cached_prompt_tokens']}{hit}")
    return result
