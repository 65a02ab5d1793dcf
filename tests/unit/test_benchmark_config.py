import pytest

from engine.config.benchmark import apply_cli_overrides, load_benchmark_config
from engine.config.yamlfile import ConfigError


def _write(tmp_path, text):
    p = tmp_path / "bench.yaml"
    p.write_text(text)
    return p


def test_defaults_and_envs(tmp_path):
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n  envs: {conc: 4, isl: 64}\n"))
    assert cfg.framework == "builtin" and cfg.run_mode == "local"
    assert cfg.profiler.torch_profiler.enabled is False  # off unless asked (Magpie: on)
    envs = cfg.effective_envs()
    assert envs["CONC"] == "4" and envs["ISL"] == "64" and envs["OSL"] == "512" and envs["NUM_PROMPTS"] == "40"
    assert cfg.effective_run_kind() == "measurement"


def test_missing_framework_is_sglang_as_in_magpie_and_said_with_its_line(tmp_path):
    p = _write(tmp_path, "benchmark:\n  model: meta-llama/Llama-3.1-8B\n")
    warnings: list[str] = []
    cfg, _ = load_benchmark_config(p, warnings)
    assert cfg.framework == "sglang"
    assert f"{p}:1: benchmark.framework: not given: sglang, as Magpie defaults it; name the framework to " \
           "silence this" in warnings


def test_errors_name_file_line_and_field(tmp_path):
    p = _write(tmp_path, """benchmark:
  framework: vllm
  model: m
  profiler:
    tracelens: {enabled: true, analysis_stages: [pd, warmup]}
  gap_analysis:
    trace_start_pct: 80
    trace_end_pct: 20
    auto_clone_repos: true
  client:
    sweep: {tp: [1, 2]}
  run_mode: slurm
  lm_eval_runtime: {path: x}
  typo_key: 1
""")
    with pytest.raises(ConfigError) as info:
        load_benchmark_config(p)
    text = str(info.value)
    assert f"{p}:5: benchmark.profiler.tracelens.analysis_stages: unknown stage 'warmup'" in text
    assert f"{p}:6: benchmark.gap_analysis: trace_start_pct (80.0) must be below trace_end_pct (20.0)" in text
    assert f"{p}:11: benchmark.client.sweep: cannot sweep tp" in text
    assert f"{p}:12: benchmark.run_mode: Input should be 'docker', 'local' or 'ray'" in text
    assert f"{p}:14: benchmark.typo_key: unknown field" in text


def test_tracelens_needs_traces_and_stage_aliases(tmp_path):
    with pytest.raises(ConfigError, match="needs torch traces"):
        load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n  profiler:\n    tracelens: {enabled: true}\n"))
    cfg, _ = load_benchmark_config(_write(tmp_path, """benchmark:
  framework: builtin
  profiler:
    torch_profiler: {enabled: true}
    tracelens: {enabled: true, analysis_stages: "pd,decode", auto_patch_runtime: true}
"""))
    assert cfg.profiler.tracelens.analysis_stages == ["prefilldecode", "decode_only"]
    assert cfg.effective_run_kind() == "diagnostic"
    warnings = []
    load_benchmark_config(_write(tmp_path, """benchmark:
  framework: builtin
  inferencex_path: /x
  profiler:
    torch_profiler: {enabled: true}
    tracelens: {enabled: true, auto_patch_runtime: true}
"""), warnings)
    assert any("benchmark.profiler.tracelens.auto_patch_runtime: Magpie's TraceLens runtime setting" in w
               for w in warnings)
    assert any("benchmark.inferencex_path: this tool starts the server itself" in w for w in warnings)


def test_measurement_rejects_profiling(tmp_path):
    with pytest.raises(ConfigError, match="run_kind measurement excludes"):
        load_benchmark_config(_write(tmp_path, """benchmark:
  framework: builtin
  run_kind: measurement
  profiler:
    torch_profiler: {enabled: true}
"""))


def test_cli_flags_override_and_are_listed(tmp_path):
    cfg, _ = load_benchmark_config(_write(tmp_path, """benchmark:
  framework: vllm
  model: a/b
  envs: {TP: 2, CONC: 8}
"""))
    new, overrides = apply_cli_overrides(cfg, {"concurrency": 16, "model": "c/d", "tp": None, "tracelens": True,
                                              "repeats": 3, "sweep": {"concurrency": [1, 4]}, "vocab_size": 1000})
    assert new.model == "c/d" and new.envs["CONC"] == "16" and new.envs["TP"] == "2"
    assert new.effective_envs()["NUM_PROMPTS"] == "160"
    assert new.profiler.tracelens.enabled and new.profiler.torch_profiler.enabled
    assert new.client.repeats == 3 and new.client.sweep == {"concurrency": [1, 4]}
    fields = {o["field"]: o for o in overrides}
    assert fields["benchmark.envs.CONC"] == {"field": "benchmark.envs.CONC", "yaml": "8", "cli": "16",
                                             "flag": "--concurrency"}
    assert fields["benchmark.model"]["yaml"] == "a/b"
    assert fields["benchmark.profiler.torch_profiler.enabled"]["flag"] == "--tracelens"
    assert "benchmark.envs.TP" not in fields
    with pytest.raises(ConfigError, match="command line"):
        apply_cli_overrides(cfg, {"run_mode": "slurm"})


def test_shipped_benchmark_examples_load_and_pair_up():
    from pathlib import Path
    folder = Path(__file__).resolve().parents[2] / "examples" / "benchmarks"
    clean = sorted(p for p in folder.glob("*.yaml") if "_profiled" not in p.stem)
    assert len(clean) >= 5
    profiled = set(folder.glob("*_profiled*.yaml"))
    for p in clean:
        cfg, _ = load_benchmark_config(p)
        twins = sorted(folder.glob(p.stem + "_profiled*.yaml"))
        assert p.with_name(p.stem + "_profiled.yaml") in twins
        for twin in twins:  # <name>_profiled.yaml, and variants of it such as _profiled_served.yaml
            profiled.discard(twin)
            prof, _ = load_benchmark_config(twin)
            assert cfg.effective_run_kind() == "measurement" and prof.effective_run_kind() == "diagnostic"
            # A profiled twin differs only in the profiler block.
            a, b = cfg.model_dump(), prof.model_dump()
            a.pop("profiler"), b.pop("profiler")
            assert a == b and prof.profiler.tracelens.enabled and prof.profiler.torch_profiler.enabled
    assert not profiled, f"profiled configs without their clean twin: {sorted(profiled)}"


def test_chat_needs_text_prompts(tmp_path, monkeypatch):
    monkeypatch.setattr("engine.bench.tokenizers.transformers_available", lambda: False)
    with pytest.raises(ConfigError, match="client.endpoint chat sends text messages: set client.tokenizer"):
        load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: vllm\n  model: a/b\n"
                                               "  client: {endpoint: chat, tokenizer: none}\n"))
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: vllm\n  model: a/b\n"
                                                    "  client: {endpoint: chat}\n"))
    with pytest.raises(ConfigError, match="chat sends text messages, but the model's tokenizer .a/b. cannot be loaded"):
        apply_cli_overrides(cfg, {})  # the model's tokenizer is the default, but transformers is missing
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: vllm\n  model: a/b\n"
                                                    "  client: {endpoint: chat, tokenizer: a/b}\n"))
    assert cfg.effective_tokenizer() == "a/b"
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n  client: {endpoint: chat}\n"))
    assert cfg.effective_tokenizer() == "builtin"  # the built-in server's own tokenizer
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n"))
    assert cfg.effective_tokenizer() is None  # token ids unless asked
    new, overrides = apply_cli_overrides(cfg, {"endpoint": "chat", "tokenizer": "builtin"})
    assert new.client.endpoint == "chat" and {o["flag"] for o in overrides} == {"--endpoint", "--tokenizer"}


def test_server_env_reaches_the_server_process_env(tmp_path):
    """`server_env` (ours): names keep their case, values become strings; server_command puts them in
    the server's env (the local server runs with os.environ + that env, the container gets it as its
    environment), and a framework's own profiler variables still win."""
    from engine.bench.docker_launch import container_spec
    from engine.bench.launch import server_command
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: vllm\n  model: m\n  server_env:\n"
                                                    "    PYTHONPATH: /site\n    VLLM_PLUGINS: magpie_oot_rmsnorm\n"
                                                    "    lower_case: 1\n"))
    assert cfg.server_env == {"PYTHONPATH": "/site", "VLLM_PLUGINS": "magpie_oot_rmsnorm", "lower_case": "1"}
    cmd = server_command(cfg, 8123)
    assert {k: cmd.env[k] for k in cfg.server_env} == cfg.server_env
    spec = container_spec(cfg, cmd, arch="sm_90", workspace=tmp_path, host_port=8123)
    assert spec["environment"]["PYTHONPATH"] == "/site" and spec["environment"]["VLLM_PLUGINS"] == "magpie_oot_rmsnorm"
    sg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: sglang\n  model: m\n  server_env:\n"
                                                   "    SGLANG_TORCH_PROFILER_DIR: /mine\n    A: b\n"))
    assert {k: server_command(sg, 8123).env[k] for k in ("SGLANG_TORCH_PROFILER_DIR", "A")} == \
        {"SGLANG_TORCH_PROFILER_DIR": "/mine", "A": "b"}
    assert server_command(sg, 8123, profile_dir=tmp_path).env["SGLANG_TORCH_PROFILER_DIR"] == str(tmp_path)
    default, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n"))
    # Magpie's scripts export `envs` to the server: its defaults too, nothing of server_env
    assert default.server_env == {} and server_command(default, 8123).env == default.effective_envs()
    with pytest.raises(ConfigError, match="not an environment variable name: 'A=B'"):
        load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n  server_env: {A=B: 1}\n"))


def test_env_values_are_checked_on_load_with_lines_all_at_once(tmp_path):
    p = _write(tmp_path, """benchmark:
  framework: vllm
  model: m
  envs:
    conc: -4
    ISL: lots
    OSL: 0
    NUM_PROMPTS: 2.5
    TP: 1
    RANDOM_RANGE_RATIO: 1.5
    MAX_MODEL_LEN: 4096
    GPU_MEMORY_UTILIZATION: 0
    SOME_OTHER_VAR: anything
  client: {warmup: -1}
""")
    with pytest.raises(ConfigError) as info:
        load_benchmark_config(p)
    problems = info.value.problems
    assert problems == [
        f"{p}:5: benchmark.envs.CONC: the client's max concurrency: expected an integer >= 1, got '-4'",
        f"{p}:6: benchmark.envs.ISL: input tokens per request: expected an integer >= 1, got 'lots'",
        f"{p}:7: benchmark.envs.OSL: output tokens per request: expected an integer >= 1, got '0'",
        f"{p}:8: benchmark.envs.NUM_PROMPTS: requests per run: expected an integer >= 1, got '2.5'",
        f"{p}:10: benchmark.envs.RANDOM_RANGE_RATIO: Magpie's length ratio (lengths drawn from [L*r, L]; 1 = fixed): "
        "expected a number in [0, 1], got '1.5'",
        f"{p}:12: benchmark.envs.GPU_MEMORY_UTILIZATION: the share of GPU memory the server may take: expected a "
        "number in (0, 1], got '0'",
        f"{p}:14: benchmark.client.warmup: Input should be greater than or equal to 0 (got -1)",
    ]
    ok, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n  envs:\n"
                                                   "    RANDOM_RANGE_RATIO: 0\n    GPU_MEMORY_UTILIZATION: 1\n"))
    assert ok.envs["GPU_MEMORY_UTILIZATION"] == "1"


def test_env_flags_and_direct_configs_are_checked_too(tmp_path):
    from engine.config.benchmark import BenchmarkConfig
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n"))
    with pytest.raises(ConfigError) as info:
        apply_cli_overrides(cfg, {"concurrency": -4, "range_ratio": 1.5})
    assert info.value.problems == [
        "command line: --concurrency -4: the client's max concurrency: expected an integer >= 1, got '-4'",
        "command line: --range-ratio 1.5: Magpie's length ratio (lengths drawn from [L*r, L]; 1 = fixed): expected a "
        "number in [0, 1], got '1.5'"]
    with pytest.raises(ValueError, match="envs.CONC: the client's max concurrency: expected an integer >= 1"):
        BenchmarkConfig.model_validate({"framework": "builtin", "envs": {"CONC": "lots"}})


def test_tokenizer_defaults_to_the_model_and_token_ids_need_a_known_vocabulary(tmp_path, monkeypatch):
    import json
    from engine.bench.tokenizers import known_vocab
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 358}))
    vllm, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: vllm\n  model: org/m\n"))
    assert vllm.effective_tokenizer() == "org/m" and vllm.tokenizer_is_default()  # as vllm bench serve
    monkeypatch.setattr("engine.bench.tokenizers.transformers_available", lambda: True)
    apply_cli_overrides(vllm, {})  # the model's tokenizer will be loaded before the server starts
    monkeypatch.setattr("engine.bench.tokenizers.transformers_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        apply_cli_overrides(vllm, {})
    text = str(info.value)
    assert "benchmark.client.vocab_size: random token-id prompts for vllm 'org/m' need the model's vocabulary size" \
        in text and "--vocab-size N" in text and "--tokenizer NAME_OR_FOLDER" in text
    new, overrides = apply_cli_overrides(vllm, {"vocab_size": 1000})
    assert known_vocab(new) == (1000, (), "client.vocab_size") and overrides[0]["flag"] == "--vocab-size"
    new, _ = apply_cli_overrides(vllm, {"model": str(folder)})
    assert known_vocab(new) == (358, (), f"{folder}/config.json")
    new, _ = apply_cli_overrides(vllm, {"tokenizer": "none", "model": str(folder)})
    assert new.effective_tokenizer() is None
    with pytest.raises(ConfigError, match="client.tokenizer 'a/tok': loading a Hugging Face tokenizer needs the "
                                          "transformers package"):
        apply_cli_overrides(vllm, {"tokenizer": "a/tok", "vocab_size": 1000})
    builtin, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n"))
    assert builtin.effective_tokenizer() is None and known_vocab(builtin) == (512, (256, 257), "the built-in tiny preset")
    with pytest.raises(ConfigError, match="vocab_size must be|greater than or equal to 1"):
        apply_cli_overrides(vllm, {"vocab_size": 0})
