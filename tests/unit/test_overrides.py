"""The benchmark overrides are one typed model (engine.config.overrides.BenchmarkOverrides): the
command line's flags, the MCP benchmark tool's arguments and the launch form's fields are checked
against it here, so a field one of them has and the model lacks (or the other way round) fails;
a misspelt key is an error naming the nearest override; a launch prepares its request once."""

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from engine.cli import build_parser
from engine.config.overrides import OVERRIDES, BenchmarkOverrides, cli_dest, from_cli_args, mcp_names
from engine.config.yamlfile import ConfigError
from engine.jobs import BenchmarkRequest, parse_request
from engine.jobs.requests import load_prepared, read_request

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml"

# The benchmark subcommand's options that are not overrides of the YAML, and the tool arguments.
CLI_NOT_OVERRIDES = {"help", "framework", "benchmark_config", "batch", "dry_run", "compare_reports",
                     "allow_different_workloads", "trace_dir", "trace_diff", "top_k", "start_pct", "end_pct",
                     "min_duration_us",
                     "categories", "ignore_categories", "no_rank_csv", "find_kernel_sources", "kernel_source_repos",
                     "stages", "output_dir", "timings"}
MCP_NOT_OVERRIDES = {"framework", "benchmark_config", "output_dir", "batch", "environment", "ray_address"}


def _benchmark_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["benchmark"]


def test_a_misspelt_override_names_the_nearest_one():
    with pytest.raises(ConfigError) as info:
        BenchmarkRequest(framework="builtin", flags={"concurency": 64}).prepare()
    assert info.value.problems == ["flags: concurency: unknown override; did you mean concurrency?"]
    with pytest.raises(ConfigError, match="request: flags: num_prompt: unknown override; did you mean num_prompts?"):
        parse_request({"mode": "benchmark", "framework": "builtin", "flags": {"num_prompt": 3}})
    with pytest.raises(ConfigError, match="zzz: unknown override; the overrides are model, precision, tp"):
        BenchmarkOverrides.build({"zzz": 1})


def test_a_misspelt_override_in_a_batch_file_names_its_line(tmp_path):
    batch = tmp_path / "batch.yaml"
    batch.write_text(f"batch:\n  - config: {TINY}\n    flags:\n      concurrency: 2\n      concurency: 4\n")
    with pytest.raises(ConfigError) as info:
        BenchmarkRequest(batch=str(batch)).prepare()
    assert info.value.problems == [f"{batch}:5: batch[0].flags: concurency: unknown override; "
                                   "did you mean concurrency?"]
    batch.write_text(f"sweep:\n  config: {TINY}\n  over: {{concurency: [2, 4]}}\n")
    with pytest.raises(ConfigError, match=r"batch.yaml:3: sweep.over: concurency: unknown override; did you mean "
                                          r"concurrency\?"):
        BenchmarkRequest(batch=str(batch)).prepare()


def test_every_cli_benchmark_flag_is_an_override_and_every_override_a_flag():
    dests = {a.dest for a in _benchmark_parser()._actions}
    overrides = {cli_dest(name) for name in OVERRIDES}
    assert overrides - dests == set(), "overrides with no command-line flag"
    assert dests - overrides - CLI_NOT_OVERRIDES == set(), "benchmark flags the override model lacks"


def test_the_mcp_benchmark_tool_takes_every_override_and_nothing_else(tmp_path):
    from engine.mcp.server import ServerOptions, build_server
    app = build_server(ServerOptions(roots=[tmp_path]))
    tools = {t.name: set(t.input_schema["properties"]) for t in anyio.run(app.list_tools)}
    assert tools["benchmark"] - MCP_NOT_OVERRIDES == set(mcp_names())


def test_the_launch_form_offers_the_models_common_overrides():
    import inspect

    from engine.jobs.launch import BENCH_FORM_FIELDS, FORM_FIELDS, form_request
    from magpie_tui.screens import launch as screen
    assert set(BENCH_FORM_FIELDS.values()) == {name for name, meta in OVERRIDES.items() if meta.form}
    assert set(BENCH_FORM_FIELDS) <= set(FORM_FIELDS)
    assert set(FORM_FIELDS) == set(inspect.signature(form_request).parameters) - {"mode", "config"}
    # The form's inputs in benchmark mode: every one an override of the model.
    shown = set(screen._INT_FIELDS + screen._FLOAT_FIELDS + ("profiler",)) - set(screen._KERNEL_FIELDS)
    assert shown == set(BENCH_FORM_FIELDS)


def test_concurrency_is_an_int_from_the_command_line_to_the_run():
    args = build_parser().parse_args(["benchmark", "builtin", "--concurrency", "64", "--sweep", "input_len=8,16",
                                      "--goodput", "ttft:200"])
    flags = from_cli_args(args)
    assert flags.concurrency == 64 and type(flags.concurrency) is int
    assert flags.sweep == {"input_len": [8, 16]} and flags.goodput == {"ttft": 200.0}
    request = BenchmarkRequest(benchmark_config=str(TINY), flags=flags)
    back = parse_request(request.to_json())
    assert back == request and type(back.flags.concurrency) is int
    prepared = request.prepare()
    assert prepared.config.envs["CONC"] == "64"  # Magpie's envs keep their string form in the config
    assert {"field": "benchmark.envs.CONC", "yaml": "4", "cli": "64", "flag": "--concurrency"} in prepared.overrides
    with pytest.raises(ConfigError, match=r"command line: --concurrency 'lots': .*integer"):
        BenchmarkOverrides.build({"concurrency": "lots"}, where="command line")


def test_the_item_syntaxes_say_what_is_wrong():
    with pytest.raises(ConfigError, match="--sweep concurrency=a: expected KEY=V1,V2"):
        BenchmarkOverrides.build({"sweep": ["concurrency=a"]})
    with pytest.raises(ConfigError, match="find_capacity ttft=5: expected KEY:MS"):
        BenchmarkOverrides.build({"find_capacity": ["ttft=5"]})
    assert BenchmarkOverrides.build({"find_capacity": ["TTFT:5"]}).find_capacity == {"ttft": 5.0}


def test_the_mcp_server_does_not_import_the_command_line():
    # No module of engine/mcp names engine.cli; and loading the whole server does not load it.
    for path in (REPO / "engine" / "mcp").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "engine.cli" or n.startswith("engine.cli.") for n in names), path
    code = ("import sys; from engine.mcp.server import build_server; import engine.mcp.bench_tools, "
            "engine.mcp.kernel_tools; print('engine.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


class _NoStart:
    """An executor that starts nothing: what submit() leaves for the run's process is checked."""
    name = "none"

    def start(self, request, run_dir, request_file, prepared):
        return type("Started", (), {"pid": None})()


def test_a_launch_prepares_once(tmp_path, monkeypatch):
    from engine.jobs.api import submit
    calls = []
    real = BenchmarkRequest._prepare_one
    monkeypatch.setattr(BenchmarkRequest, "_prepare_one", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    request = BenchmarkRequest(benchmark_config=str(TINY), flags={"concurrency": 2})
    prepared = request.prepare()  # the front end's check (and what it shows)
    job = submit(request, tmp_path, executor=_NoStart(), prepared=prepared)
    # The run's process (engine.jobs.child) finds it beside the request file.
    kept = load_prepared(job.run_dir, "request.json", read_request(job.run_dir / "request.json"))
    assert kept is not None and kept.config == prepared.config and kept.overrides == prepared.overrides
    assert len(calls) == 1
    # Without one, submit() checks the request itself; a kept one of another request is not used.
    submit(request, tmp_path, executor=_NoStart())
    assert len(calls) == 2
    other = BenchmarkRequest(benchmark_config=str(TINY), flags={"concurrency": 3})
    assert load_prepared(job.run_dir, "request.json", other) is None


def test_a_kept_prepared_request_is_loaded_only_with_the_submitters_key(tmp_path, monkeypatch):
    # Unpickling runs code: a file planted in a run folder, or one kept by another process, is
    # never unpickled (the runner prepares the request again).
    import pickle

    from engine.jobs.api import submit
    from engine.jobs.requests import PREPARED_KEY_ENV, prepared_file
    request = BenchmarkRequest(benchmark_config=str(TINY), flags={"concurrency": 2})
    job = submit(request, tmp_path, executor=_NoStart(), prepared=request.prepare())
    on_disk = read_request(job.run_dir / "request.json")
    assert load_prepared(job.run_dir, "request.json", on_disk) is not None
    kept = job.run_dir / prepared_file("request.json")

    class Planted:
        def __reduce__(self):
            return (tmp_path.joinpath("ran").write_text, ("planted code ran",))
    kept.write_bytes(bytes(32) + pickle.dumps(Planted()))
    assert load_prepared(job.run_dir, "request.json", on_disk) is None
    kept.write_bytes(pickle.dumps(Planted()))  # unsigned, as before signatures
    assert load_prepared(job.run_dir, "request.json", on_disk) is None
    assert not tmp_path.joinpath("ran").exists()
    # A process without the key (a run folder resumed elsewhere) prepares again.
    job2 = submit(request, tmp_path, executor=_NoStart(), prepared=request.prepare())
    monkeypatch.delenv(PREPARED_KEY_ENV)
    assert load_prepared(job2.run_dir, "request.json", read_request(job2.run_dir / "request.json")) is None


def test_the_request_file_keeps_the_typed_overrides(tmp_path):
    request = BenchmarkRequest(framework="builtin", flags={"concurrency": 2, "torch_profiler": False})
    data = json.loads(request.to_json())
    assert data["flags"]["concurrency"] == 2 and data["flags"]["torch_profiler"] is False
    assert set(data["flags"]) == set(OVERRIDES)


# analyze / compare: their overrides are KernelRequest's own fields (a request built by the CLI,
# the MCP kernel tools and the launch form). The CLI's option -> the field, where they differ.
KERNEL_CLI_FIELDS = {"config": "framework_config"}
KERNEL_CLI_NOT_FIELDS = {"help", "output_dir", "dry_run", "command", "verbose", "gpu_info", "version"}
KERNEL_FIELDS_NOT_CLI = {"mode", "cwd"}  # the subcommand itself; the directory the command runs in


def test_every_kernel_flag_is_a_kernel_request_field_and_back():
    from engine.jobs import KernelRequest
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    fields = set(KernelRequest.model_fields)
    for mode in ("analyze", "compare"):
        dests = {a.dest for a in sub.choices[mode]._actions} | {a.dest for a in parser._actions}
        named = {KERNEL_CLI_FIELDS.get(d, d) for d in dests - KERNEL_CLI_NOT_FIELDS}
        assert named - fields == set(), f"{mode} flags KernelRequest lacks"
        compare_only = {"baseline", "tie_margin"} if mode == "analyze" else set()
        assert fields - named - KERNEL_FIELDS_NOT_CLI - compare_only == set(), f"KernelRequest fields {mode} lacks"


def test_the_launch_forms_kernel_fields_are_kernel_request_fields():
    from engine.jobs import KernelRequest
    from magpie_tui.screens import launch as screen
    shown = set(screen._INT_FIELDS + screen._FLOAT_FIELDS + ("no_perf",)) - set(screen._BENCH_FIELDS)
    assert shown <= set(KernelRequest.model_fields)


def test_a_misspelt_request_field_names_the_nearest_one():
    from engine.jobs import KernelRequest
    with pytest.raises(ConfigError, match="kernel_conifg: unknown field of a KernelRequest; did you mean kernel_config"):
        KernelRequest(mode="compare", kernel_conifg="k.yaml")
    with pytest.raises(ConfigError, match="request: repeat: unknown field of a KernelRequest; did you mean repeats"):
        parse_request({"mode": "compare", "repeat": 5})


def test_a_misspelt_flag_names_the_nearest_one(capsys):
    from engine.cli import main
    with pytest.raises(SystemExit) as info:
        main(["benchmark", "builtin", "--concurency", "64"])
    assert info.value.code == 2
    assert "--concurency: did you mean --concurrency?" in capsys.readouterr().err
