"""The built-in server's /metrics text, stats line, the benchmark config's server settings and
the report's decode-step floor."""

import re

import pytest

from engine.bench.launch import server_command
from engine.config.benchmark import BenchmarkConfig
from engine.serve.engine import Engine
from engine.serve.floor import builtin_floor
from engine.serve.metrics import render
from engine.serve.model import PRESETS, LlamaModel
from engine.serve.shapes import decode_floor

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",?)*\})? (\S+)$')


def parse_exposition(text: str) -> dict[str, dict]:
    """A strict reader of the Prometheus text format 0.0.4: every family has HELP then TYPE
    before its samples, every sample belongs to the family declared last; returns
    {family: {"type", "samples": [(name, labels, value)]}}."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split()[2]
            assert current not in families, f"family {current} twice"
            families[current] = {"type": None, "samples": []}
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name == current and kind in ("counter", "gauge", "histogram", "summary")
            families[name]["type"] = kind
        else:
            m = _SAMPLE.match(line)
            assert m and current is not None, f"not a sample line: {line!r}"
            name, labels, value = m.group(1), m.group(2), float(m.group(3))
            assert name == current or name in (current + "_bucket", current + "_sum", current + "_count"), line
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels or ""))
            families[current]["samples"].append((name, pairs, value))
    return families


@pytest.fixture(scope="module")
def engine_after_load() -> Engine:
    engine = Engine(LlamaModel(PRESETS["tiny"]), max_batch_size=4, max_model_len=64, graph_batch_sizes=[1, 4])
    for i in range(5):  # one more than the slots: one request waits for a slot
        engine.submit([1, 2, 3 + i], 2 + i, True, lambda ev: None)
    engine.step()
    return engine


def test_metrics_text_is_valid_exposition_with_the_engine_state(engine_after_load):
    engine = engine_after_load
    mid = parse_exposition(render(engine.metrics()))
    value = {f: {tuple(sorted(s[1].items())): s[2] for s in d["samples"]} for f, d in mid.items()}
    assert value["magpie_serve_requests_running"][()] == 4 and value["magpie_serve_requests_waiting"][()] == 1
    assert value["magpie_serve_kv_cache_slots_used"][()] == 4 and value["magpie_serve_kv_cache_slots"][()] == 4
    while engine.step() is not None:
        pass
    families = parse_exposition(render(engine.metrics()))
    assert {f: d["type"] for f, d in families.items() if f.endswith("_total")} == {
        f"magpie_serve_{n}_total": "counter" for n in ("steps", "step_seconds", "decode_graph_replays",
                                                        "decode_eager_steps", "decode_steps_ahead", "prompt_tokens",
                                                        "generation_tokens", "requests_finished", "prompt_graph_replays",
                                                        "prompt_eager_steps", "mixed_forward_steps")}
    value = {f: {tuple(sorted(s[1].items())): s[2] for s in d["samples"]} for f, d in families.items()}
    steps = value["magpie_serve_steps_total"]
    assert steps[(("kind", "prefill"),)] >= 1 and steps[(("kind", "mixed"),)] == 1  # the 5th joined mid-way
    assert value["magpie_serve_generation_tokens_total"][()] == sum(range(2, 7))
    assert value["magpie_serve_prompt_tokens_total"][()] == 15
    assert value["magpie_serve_requests_finished_total"][(("reason", "length"),)] == 5
    assert value["magpie_serve_decode_eager_steps_total"][()] == steps[(("kind", "decode"),)] + steps[(("kind", "mixed"),)]
    assert value["magpie_serve_decode_graph_replays_total"][()] == 0 and not families["magpie_serve_cuda_graph_batch_sizes"]["samples"]
    assert value["magpie_serve_requests_running"][()] == 0
    assert value["magpie_serve_prompt_graph_replays_total"][()] == 0 and not families["magpie_serve_cuda_graph_token_buckets"]["samples"]
    assert value["magpie_serve_prompt_eager_steps_total"][()] == steps[(("kind", "prefill"),)] + steps[(("kind", "mixed"),)]
    hist = families["magpie_serve_decode_batch_size"]["samples"]
    buckets = [(s[1]["le"], s[2]) for s in hist if s[0].endswith("_bucket")]
    counts = [c for _, c in buckets]
    assert counts == sorted(counts) and buckets[-1][0] == "+Inf"  # cumulative
    count = next(s[2] for s in hist if s[0].endswith("_count"))
    total = next(s[2] for s in hist if s[0].endswith("_sum"))
    assert counts[-1] == count == engine.metrics()["steps"]["decode"] + 1
    assert dict(buckets)["4"] == count and dict(buckets)["2"] < count and total == engine.metrics()["batch_sum"]


def test_metrics_text_parses_with_prometheus_client_when_installed(engine_after_load):
    parser = pytest.importorskip("prometheus_client.parser")
    names = {f.name for f in parser.text_string_to_metric_families(render(engine_after_load.metrics()))}
    assert {"magpie_serve_steps", "magpie_serve_decode_batch_size", "magpie_serve_kv_cache_slots_used"} <= names


def test_the_benchmark_scrapes_every_counter_the_server_serves(engine_after_load):
    """A counter the built-in server adds must reach the benchmark report's server metrics."""
    from engine.bench.server_metrics import SELECTED
    families = parse_exposition(render(engine_after_load.metrics()))
    counters = {f for f, d in families.items() if d["type"] == "counter"}
    assert counters and counters <= set(SELECTED), sorted(counters - set(SELECTED))


def test_stats_line_says_what_happened_since_the_last(engine_after_load):
    while engine_after_load.step() is not None:
        pass
    line = engine_after_load.stats_line()
    assert line.startswith("magpie-serve stats: ") and "kv slots 0/4" in line and "eager decode steps" in line
    again = engine_after_load.stats_line()
    assert "(+0 in" in again and "generation 0.0 tok/s" in again


def test_builtin_server_settings_become_server_flags():
    cfg = BenchmarkConfig.model_validate({"framework": "builtin", "server": {
        "size": "8b", "max_batch": 32, "eager": True, "cuda_graph_batch_sizes": [16, 1, 4], "seed": 7,
        "max_model_len": 1024}})
    argv = server_command(cfg, 9000).argv
    assert argv[argv.index("--model") + 1] == "8b" and "--eager" in argv
    assert argv[argv.index("--cuda-graph-batch-sizes") + 1] == "1,4,16"
    assert argv[argv.index("--seed") + 1] == "7" and argv[argv.index("--max-model-len") + 1] == "1024"
    plain = server_command(BenchmarkConfig.model_validate({"framework": "builtin"}), 9000).argv
    assert not {"--eager", "--cuda-graph-batch-sizes", "--seed", "--max-model-len"} & set(plain)
    with pytest.raises(ValueError, match="cuda_graph_batch_sizes: 128 is above max_batch 64"):
        BenchmarkConfig.model_validate({"framework": "builtin", "server": {"cuda_graph_batch_sizes": [1, 128]}})


def test_the_decode_floor_is_the_weights_read_over_the_bandwidth():
    one_b = decode_floor(PRESETS["1b"], 4.3)
    assert one_b["weight_bytes_per_step"] == PRESETS["1b"].num_parameters() * 2  # tied: all weights are read
    assert one_b["ms_per_step"] == pytest.approx(2.4716e9 / 4.3e12 * 1e3, rel=1e-3)
    eight = PRESETS["8b"]  # untied: the input embedding is only gathered, its batch's rows
    assert decode_floor(eight, 4.3)["weight_bytes_per_step"] == (eight.num_parameters() - 128256 * 4096) * 2
    report = builtin_floor("1b", "H200", tpot_median_ms=1.15)
    assert (report["gpu"], report["bandwidth_tbs"], report["bandwidth_source"]) == ("H200", 4.3, "measured")
    assert report["tpot_over_floor"] == pytest.approx(1.15 / one_b["ms_per_step"], abs=0.01)
    assert builtin_floor("1b", "no-such-gpu")["ms_per_step"] is None


def test_a_request_is_counted_before_its_last_token_goes_out():
    """A client that has a request's last token and then reads /metrics finds the request's tokens
    and its finish counted, and it no longer running: the counters are updated before the step
    hands its tokens out."""
    engine = Engine(LlamaModel(PRESETS["tiny"]), max_batch_size=4, max_model_len=64, graph_batch_sizes=[1, 4])
    seen: list[tuple[int, float, int]] = []

    def sink(ev) -> None:
        if ev.finish_reason is not None:
            m = engine.metrics()
            seen.append((m["generation_tokens"], m["finished"].get("length", 0), m["running"]))

    for i in range(3):
        engine.submit([1, 2, 3 + i], 1 + i, True, sink)  # 1, 2 and 3 tokens: one finishes at its first token
    while engine.step() is not None:
        pass
    assert seen == [(3, 1, 2), (5, 2, 1), (6, 3, 0)], seen
