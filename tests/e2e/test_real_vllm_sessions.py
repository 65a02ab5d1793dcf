"""Opt-in: `magpie benchmark` replays multi-turn sessions against a real vLLM-cpu it launches, and
the report shows the prefix reuse as vLLM itself counts it.

    python -m pytest -q -m vllm tests/e2e/test_real_vllm_sessions.py -s

One server (the tiny 2-layer Llama of `tests/vllm_cpu.py`, `--enforce-eager`, prefix caching on,
as vLLM-cpu 0.32 has it by default for a non-MLA model). Two facts of that vLLM shape the test:

* per-request cached tokens (`usage.prompt_tokens_details.cached_tokens`) are sent only when the
  server is started with `--enable-prompt-tokens-details`; our launcher adds that flag for a
  session replay (`engine.bench.launch.server_command`);
* the CPU backend's KV-cache blocks are 128 tokens unless `--block-size` says otherwise
  (vllm/platforms/cpu.py), and only full blocks are reused: the test sets 32-token blocks so that
  short turns share whole blocks.

The synthetic sessions (4 sessions of 3 turns, a 64-token system prompt shared by all, 32 new
tokens and 4 answer tokens a turn, 2 sessions at once) are token ids; an answer enters the history
as tokens of its own (engine.bench.session_replay), so turn k reuses exactly the full blocks of
turn k-1's prompt, and a session's first turn at most the system prompt's two blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vllm_cpu
from conftest import only_workspace, run_magpie

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOCK = 32
SESSIONS, TURNS, SYSTEM, ISL, OSL = 4, 3, 64, 32, 4


def _yaml(path: Path, model: Path, vocab: int) -> Path:
    path.write_text(f"""benchmark:
  framework: vllm
  model: {model}
  precision: fp32
  run_mode: local
  timeout_seconds: 1200
  server_args: [--enforce-eager, --dtype, float32, --block-size, "{BLOCK}"]
  envs:
    MAX_MODEL_LEN: 1024
    VOCAB_SIZE: {vocab}
  client:
    warmup: 1
    seed: 0
""")
    return path


def test_a_session_replay_reports_vllms_own_prefix_reuse(tiny_model, tmp_path):
    model, info = tiny_model
    cfg = _yaml(tmp_path / "vllm.yaml", model, info["vocab_size"])
    proc = run_magpie("benchmark", "-b", cfg, "--run-mode", "local", "--dataset-name", "sessions",
                      "--num-sessions", SESSIONS, "--session-turns", TURNS, "--system-prompt-len", SYSTEM,
                      "--input-len", ISL, "--output-len", OSL, "--concurrency", 2, "-o", tmp_path / "out",
                      env=vllm_cpu.vllm_vars(), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ws = only_workspace(tmp_path / "out")
    r = json.loads((ws / "benchmark_report.json").read_text())
    assert r["success"] is True and r["state"] == "completed"
    argv = r["server"]["argv"]
    assert "--enable-prompt-tokens-details" in argv and argv[argv.index("--block-size") + 1] == str(BLOCK)
    log = (ws / "server.log").read_text(errors="replace")
    assert "'enable_prompt_tokens_details': True" in log and "enable_prefix_caching=True" in log

    d = json.loads((ws / "requests" / "point0_repeat0.json").read_text())
    turns = {(sid, k): (p, c, t0) for sid, k, p, c, t0, ok in
             zip(d["session_id"], d["turn"], d["prompt_len"], d["cached_tokens"], d["start_time"], d["success"])
             if ok}
    assert len(turns) == SESSIONS * TURNS
    table = "\n".join(f"  {sid} turn {k}: prompt {p:4d} tokens, cached {c:4d}"
                      for (sid, k), (p, c, _) in sorted(turns.items()))
    print(f"\nper request, from vLLM's usage.prompt_tokens_details.cached_tokens:\n{table}")
    # the server's own prompt counts: the system prompt, then each turn adds the answer and new input
    for (sid, k), (p, _, _) in turns.items():
        assert p == SYSTEM + ISL + k * (OSL + ISL), (sid, k, p)
    # turn 2+: exactly the full blocks of the previous turn's prompt come from the cache
    for (sid, k), (_, c, _) in turns.items():
        if k:
            assert c == turns[sid, k - 1][0] // BLOCK * BLOCK > 0, (sid, k, c)
    # turn 1: the first session sent finds a cold cache (the warm-up shares no block with it); a
    # session started once another's first turn was answered reuses the shared system prompt
    firsts = sorted((t0, sid, c) for (sid, k), (_, c, t0) in turns.items() if k == 0)
    assert firsts[0][2] == 0
    assert all(c in (0, SYSTEM) for _, _, c in firsts) and firsts[-1][2] == SYSTEM

    s = r["sessions"]
    assert s["sessions_completed"] == SESSIONS and s["turns_completed"] == SESSIONS * TURNS and s["turns_failed"] == 0
    cached = sum(c for _, c, _ in turns.values())
    prompts = sum(p for p, _, _ in turns.values())
    assert s["cached_prompt_tokens"] == cached and s["prompt_tokens"] == prompts
    assert s["cached_share"] == pytest.approx(cached / prompts)
    by_turn = {k: v["mean_cached_tokens"] for k, v in s["ttft_by_turn"].items()}
    assert by_turn["1"] > 0 and by_turn["2"] > by_turn["1"]
    # vLLM's /metrics (vllm:prefix_cache_queries_total / _hits_total, in tokens), read before and
    # after the replay: the same tokens as the answers' usage, over every prompt token of the replay
    pc = s["server_prefix_cache"]
    print(f"server /metrics: {pc['hits']:.0f} of {pc['queries']:.0f} queried tokens hit, hit rate {pc['hit_rate']:.1%}; "
          f"mean cached tokens by turn {by_turn}")
    assert pc["hits"] == cached and pc["queries"] == prompts and pc["hit_rate"] == pytest.approx(cached / prompts)
    assert not any("cached_tokens" in w for w in r["warnings"])
    summary = (ws / "summary.txt").read_text()
    assert f"prefix reuse: {cached} of {prompts} prompt tokens cached" in summary
    assert f"server prefix cache: hit rate {pc['hit_rate']:.1%}" in summary
