"""The graph-versus-eager token check the GPU benchmark runs (engine.serve.check), on the CPU:
there are no graphs here, so two engines that batch and chunk differently are compared instead."""

import json

import pytest

from engine.serve import check
from engine.serve.model import LlamaModel, model_config


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel(model_config("tiny", tie_embeddings=False))


def test_engines_that_batch_differently_give_the_same_tokens(model):
    prompts, max_tokens = check.check_prompts(3)
    assert [len(p) for p in prompts] == [6, 18, 65] and max_tokens == [24, 40, 8]
    out = check.compare_engines(model, prompts, [4, 6, 3], {"max_batch_size": 4, "max_model_len": 128},
                                {"max_batch_size": 2, "max_prefill_tokens": 16, "max_model_len": 128})
    assert out["equal"] and out["mismatches"] == [] and out["tokens"] == 13 and out["distinct_tokens"] > 3
    assert out["first"]["cuda_graphs"] == [] and out["first"]["eager_steps"] > 0
    assert out["second"]["steps"] > out["first"]["steps"]  # the 65-token prompt went in chunks of 16


def test_a_difference_is_reported_where_it_starts(model, monkeypatch):
    outputs = iter([[[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]]])
    monkeypatch.setattr(check, "generate_all", lambda engine, prompts, max_tokens: next(outputs))
    out = check.compare_engines(model, [[1], [2]], [4, 2], {"max_model_len": 32}, {"max_model_len": 32})
    assert not out["equal"] and out["mismatches"] == [{"prompt": 0, "position": 2, "first": [3, 4], "second": [9, 4]}]


def test_the_command_line_on_the_cpu_writes_its_json(tmp_path, capsys):
    path = tmp_path / "check.json"
    code = check.main(["--model", "tiny", "--device", "cpu", "--prompts", "1", "--max-batch", "1", "--max-len", "64",
                       "--context", "32", "--json", str(path)])
    result = json.loads(path.read_text())
    assert code == 0 and result["equal"] and result["engines"]["tokens"] == 24 and "step_logits" not in result
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert check.main(["--model", "tiny", "--device", "cpu", "--prompts", "3", "--max-batch", "2"]) == 2
