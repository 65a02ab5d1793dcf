"""Custom JSONL and ShareGPT datasets (engine/bench/datasets.py) and the SLO capacity search's logic
(engine/bench/capacity.py)."""

import json

import pytest

from engine.bench.capacity import CapacitySearch, capacity_table, goodput_share
from engine.bench.datasets import DatasetError, load_custom_jsonl, load_sharegpt


def _write(tmp_path, lines, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_custom_jsonl_text_ids_output_len_and_timestamps(tmp_path):
    p = _write(tmp_path, [json.dumps({"prompt": "hello there", "output_len": 5, "timestamp": 10.0}),
                          "",
                          json.dumps({"prompt_token_ids": [1, 2, 3], "timestamp": 10.5}),
                          json.dumps({"prompt": [7, 8], "max_tokens": 2, "timestamp": 12})])
    reqs = load_custom_jsonl(p, num_requests=None, output_len=9)
    assert [r.output_len for r in reqs] == [5, 9, 2]
    assert [r.prompt for r in reqs] == ["hello there", [1, 2, 3], [7, 8]]
    assert [r.prompt_len for r in reqs] == [0, 3, 2]  # text without a tokenizer: the server counts it
    assert [r.timestamp for r in reqs] == [10.0, 10.5, 12.0]
    assert len(load_custom_jsonl(p, num_requests=2, output_len=9)) == 2


def test_custom_jsonl_lists_every_bad_line_with_file_line_and_field(tmp_path):
    p = _write(tmp_path, [json.dumps({"prompt": "ok"}),
                          '{"prompt": "unterminated',
                          json.dumps({"text": "no prompt key"}),
                          json.dumps({"prompt": "x", "output_len": 0}),
                          json.dumps({"prompt_token_ids": [1, -2]}),
                          json.dumps({"prompt": "x", "timestamp": "soon"})])
    with pytest.raises(DatasetError) as err:
        load_custom_jsonl(p, num_requests=1, output_len=4)
    problems = err.value.problems
    assert problems[0].startswith(f"{p}:2: not JSON")
    assert problems[1] == f"{p}:3: no prompt: give prompt (text or token ids) or prompt_token_ids"
    assert problems[2] == f"{p}:4: output_len: expected an integer >= 1, got 0"
    assert problems[3].startswith(f"{p}:5: prompt_token_ids: expected a non-empty list of token ids")
    assert problems[4] == f"{p}:6: timestamp: expected seconds (a number >= 0), got 'soon'"


def test_custom_jsonl_timestamps_all_or_none(tmp_path):
    p = _write(tmp_path, [json.dumps({"prompt": "a", "timestamp": 1}), json.dumps({"prompt": "b"})])
    with pytest.raises(DatasetError, match="timestamp: some lines have one"):
        load_custom_jsonl(p, num_requests=None, output_len=4)


def test_sharegpt_samples_first_turns_with_the_seed(tmp_path):
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"question {i}"},
                                             {"from": "gpt", "value": f"answer {i}"}]} for i in range(10)]
    convs.append({"id": "short", "conversations": [{"from": "human", "value": "alone"}]})
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(convs))
    a = load_sharegpt(p, num_requests=4, seed=1, output_len=7)
    b = load_sharegpt(p, num_requests=4, seed=1, output_len=7)
    assert [r.prompt for r in a] == [r.prompt for r in b] and len(a) == 4
    assert all(r.prompt.startswith("question ") and r.output_len == 7 for r in a)
    assert [r.prompt for r in load_sharegpt(p, num_requests=10, seed=2)] != [r.prompt for r in a] + []
    (tmp_path / "bad.json").write_text('[{"conversations": ')
    with pytest.raises(DatasetError, match=r"bad.json:1: not JSON"):
        load_sharegpt(tmp_path / "bad.json", num_requests=1)


def _result(good, completed, failed=0, duration=2.0):
    return {"completed": completed, "failed": failed, "duration": duration, "request_goodput": good / duration,
            "request_throughput": completed / duration, "output_throughput": 10.0 * completed}


def test_goodput_share_counts_failed_requests_as_misses():
    assert goodput_share(_result(8, 9, failed=1)) == pytest.approx(0.8)
    assert goodput_share({"completed": 0, "failed": 0}) == 0.0


def test_capacity_search_doubles_then_bisects_to_adjacent_levels():
    capacity = 13  # levels up to 13 meet the target, above it they do not
    search = CapacitySearch(over="concurrency", target=0.9, ceiling=1024, max_steps=20)
    order = []
    while (level := search.next_level()) is not None:
        order.append(level)
        search.record(level, [_result(10 if level <= capacity else 5, 10)] * 3)
    assert order[:5] == [1, 2, 4, 8, 16]
    summary = search.summary({"ttft": 100.0})
    assert summary["knee"] == 13 and summary["knee_interval"] == [13, 14]
    assert {lv["level"] for lv in summary["levels"]} >= {12, 13, 14}
    assert summary["levels"][0]["goodput_share_ci95"] == [1.0, 1.0]
    text = "\n".join(capacity_table(summary))
    assert "capacity between 13 (meets the target) and 14 (misses it)" in text and "FAIL" in text


def test_capacity_search_stops_at_the_ceiling_and_when_nothing_passes():
    up = CapacitySearch(ceiling=8)
    while (level := up.next_level()) is not None:
        up.record(level, [_result(10, 10)])
    assert [t.level for t in up.tried] == [1, 2, 4, 8] and up.summary({})["knee_interval"] == [8, None]
    down = CapacitySearch()
    down.record(down.next_level(), [_result(0, 10)])
    assert down.next_level() is None and down.summary({})["knee"] is None
