"""How a pool of client processes splits one load, and the config checks of client.client_procs."""

import pytest

from engine.bench.client_procs import assign_requests, split_evenly
from engine.config.benchmark import load_benchmark_config
from engine.config.yamlfile import ConfigError


def test_split_evenly_gives_shares_that_differ_by_at_most_one():
    assert split_evenly(5, 2) == [3, 2]
    assert split_evenly(128, 3) == [43, 43, 42]
    assert split_evenly(0, 3) == [0, 0, 0]  # no warm-ups to share
    assert sum(split_evenly(513, 4)) == 513


def test_requests_are_handed_out_in_proportion_to_the_shares_and_in_order():
    parts = assign_requests(10, [3, 2])
    assert sorted(i for p in parts for i in p) == list(range(10))
    assert [len(p) for p in parts] == [6, 4]
    assert all(p == sorted(p) for p in parts)
    # spread through the list, not the first six to one process
    assert parts[1][0] < 3 and parts[1][-1] >= 8
    assert assign_requests(6, [1, 1, 1]) == [[0, 3], [1, 4], [2, 5]]


def _write(tmp_path, text):
    p = tmp_path / "bench.yaml"
    p.write_text(text)
    return p


def test_yaml_client_procs_above_the_concurrency_is_an_error_before_anything_starts(tmp_path):
    p = _write(tmp_path, "benchmark:\n  framework: builtin\n  envs: {CONC: 4}\n  client:\n    client_procs: 8\n")
    with pytest.raises(ConfigError) as info:
        load_benchmark_config(p)
    text = str(info.value)
    assert str(p) in text and "client.client_procs 8" in text and "give at most 4 processes" in text
    p = _write(tmp_path, "benchmark:\n  framework: builtin\n  client:\n    client_procs: 0\n")
    with pytest.raises(ConfigError, match=r"bench.yaml:\d+: .*client_procs.*greater than or equal to 1"):
        load_benchmark_config(p)


def test_yaml_client_procs_within_the_concurrency_and_capacity_search(tmp_path):
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n  envs: {CONC: 4}\n"
                                                    "  client:\n    client_procs: 4\n"))
    assert cfg.client.client_procs == 4
    # The capacity search picks the concurrency itself: a level below the processes runs on fewer.
    cfg, _ = load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n  envs: {CONC: 1}\n"
                                                    "  client:\n    client_procs: 4\n    find_capacity: {ttft: 100}\n"))
    assert cfg.client.client_procs == 4
    assert load_benchmark_config(_write(tmp_path, "benchmark:\n  framework: builtin\n"))[0].client.client_procs == 1
