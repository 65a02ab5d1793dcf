"""Every option of the command line (engine.cli.build_parser) reaches an MCP tool argument, so a new
flag cannot be forgotten: a flag missing here fails until it is mapped or excluded with a reason."""

import argparse

import anyio
import pytest

from engine.cli import build_parser
from engine.mcp.server import ServerOptions, build_server

# (subcommand, argparse dest) -> (tool, argument), where the names differ or a Magpie name is used.
MAPPED = {
    ("analyze", "kernels"): [("analyze", "kernel_path")],
    ("analyze", "testcase"): [("analyze", "testcase_command")],
    ("analyze", "type"): [("analyze", "kernel_type")],
    ("analyze", "compile_cmd"): [("analyze", "compile_command")],
    ("analyze", "no_perf"): [("analyze", "check_performance")],
    ("compare", "kernels"): [("compare", "kernel_paths")],
    ("compare", "testcase"): [("compare", "testcase_commands")],
    ("compare", "type"): [("compare", "kernel_type")],
    ("compare", "compile_cmd"): [("compare", "compile_commands")],
    ("compare", "no_perf"): [("compare", "check_performance")],
    ("compare", "baseline"): [("compare", "baseline"), ("compare", "baseline_index")],
    ("benchmark", "gap_analysis"): [("benchmark", "gap_analysis_enabled")],
    ("benchmark", "bench_docker_image"): [("benchmark", "docker_image")],
    ("benchmark", "timeout"): [("benchmark", "timeout_seconds")],
    ("benchmark", "compare_reports"): [("compare_benchmark_reports", "workspace_dirs")],
    ("benchmark", "allow_different_workloads"): [("compare_benchmark_reports", "allow_different_workloads")],
    ("benchmark", "trace_dir"): [("gap_analysis", "trace_dir")],
    ("benchmark", "top_k"): [("gap_analysis", "top_k")],
    ("benchmark", "start_pct"): [("gap_analysis", "start_pct")],
    ("benchmark", "end_pct"): [("gap_analysis", "end_pct")],
    ("benchmark", "min_duration_us"): [("gap_analysis", "min_duration_us")],
    ("benchmark", "categories"): [("gap_analysis", "categories")],
    ("benchmark", "ignore_categories"): [("gap_analysis", "ignore_categories")],
    ("benchmark", "no_rank_csv"): [("gap_analysis", "rank_csv")],
    ("benchmark", "find_kernel_sources"): [("gap_analysis", "find_kernel_sources")],
    ("benchmark", "kernel_source_repos"): [("gap_analysis", "kernel_source_repos")],
    ("benchmark", "stages"): [("gap_analysis", "stages")],
    ("benchmark", "trace_diff"): [("trace_diff", "a"), ("trace_diff", "b")],
    ("benchmark", "gpu_arch"): [("benchmark", "gpu_arch"), ("gap_analysis", "gpu_arch")],
    ("benchmark", "output_dir"): [("benchmark", "output_dir"), ("gap_analysis", "output_dir")],
    # A dry run is validate_config: the same checks, the plan returned, nothing started.
    ("analyze", "dry_run"): [("validate_config", "config_path")],
    ("compare", "dry_run"): [("validate_config", "config_path")],
    ("benchmark", "dry_run"): [("validate_config", "config_path")],
    ("optimize", "dry_run"): [("validate_config", "config_path")],
    ("optimize", "resume"): [("optimize_resume", "loop_dir")],
    ("optimize", "status"): [("optimize_status", "loop_dir")],
    ("optimize", "until"): [("optimize", "until"), ("optimize_resume", "until")],
    # Global options, given to the kernel tools.
    ("", "config"): [("analyze", "framework_config"), ("compare", "framework_config")],
    ("", "workers"): [("analyze", "workers"), ("compare", "workers")],
    ("", "docker_image"): [("analyze", "docker_image"), ("compare", "docker_image")],
    ("", "gpu_info"): [("hardware_spec", None)],
    ("", "ray_address"): [("analyze", "ray_address"), ("compare", "ray_address"), ("benchmark", "ray_address"),
                          ("benchmark_batch", "ray_cluster_address")],
    ("", "environment"): [("analyze", "environment"), ("compare", "environment"), ("benchmark", "environment")],
}
# Options with no tool argument, and why.
EXCLUDED = {
    ("", "help"): "argparse's own",
    ("", "version"): "the server reports its version in the MCP handshake",
    ("", "verbose"): "debug logging of one command line; the server logs warnings to stderr",
    ("", "command"): "the subcommand is the tool",
    ("benchmark", "timings"): "prints the report's stage_times_s, which the gap_analysis tool returns in the report",
}
TOOL_OF_SUBCOMMAND = {"analyze": "analyze", "compare": "compare", "benchmark": "benchmark", "optimize": "optimize"}


def _options(parser: argparse.ArgumentParser, prefix: str) -> dict[tuple[str, str], argparse.Action]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_options(sub, name))
            out[(prefix, action.dest)] = action
            continue
        if action.dest in ("help",) and prefix:
            continue
        out[(prefix, action.dest)] = action
    return out


@pytest.fixture(scope="module")
def schemas(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    app = build_server(ServerOptions(roots=[root]))
    tools = anyio.run(app.list_tools)
    return {t.name: set(t.input_schema["properties"]) for t in tools}


def _missing(parser: argparse.ArgumentParser, schemas: dict) -> list[str]:
    missing = []
    for (sub, dest), _action in sorted(_options(parser, "").items()):
        if (sub, dest) in EXCLUDED:
            continue
        targets = MAPPED.get((sub, dest)) or [(TOOL_OF_SUBCOMMAND.get(sub), dest)]
        for tool, arg in targets:
            if tool not in schemas or (arg is not None and arg not in schemas[tool]):
                missing.append(f"{sub or '(global)'} --{dest.replace('_', '-')} -> {tool}.{arg}")
    return missing


def test_every_cli_option_reaches_a_tool_argument(schemas):
    missing = _missing(build_parser(), schemas)
    assert not missing, "CLI options with no MCP tool argument:\n" + "\n".join(missing)


def test_a_new_flag_is_caught(schemas):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices["compare"].add_argument("--brand-new-flag")
    assert _missing(parser, schemas) == ["compare --brand-new-flag -> compare.brand_new_flag"]


def test_the_mapping_names_only_real_options(schemas):
    real = set(_options(build_parser(), ""))
    assert not (set(MAPPED) | set(EXCLUDED)) - real, "stale entries: remove options the CLI no longer has"


def test_magpie_tool_names_and_arguments_are_kept(schemas):
    # Magpie's 18 tools (configure_gpu is there to refuse with its reason: docs/mcp.md).
    magpie = {
        "configure_gpu": {"device_ids", "power_limit_watts", "gpu_clock_mhz", "mem_clock_mhz", "reset"},
        "list_benchmark_images": {"framework"},
        "hardware_spec": {"device_id", "include_all"},
        "analyze": {"kernel_path", "testcase_command", "kernel_type", "working_dir", "compile_command",
                    "check_performance", "environment", "performance_backend", "correctness_backend"},
        "compare": {"kernel_paths", "testcase_commands", "kernel_type", "baseline_index", "check_performance",
                    "environment", "performance_backend", "correctness_backend"},
        "discover_kernels": {"project_path", "kernel_type", "include_tests", "include_examples"},
        "suggest_optimizations": {"analysis_result"},
        "create_kernel_config": {"kernel_id", "kernel_path", "testcase_command", "kernel_type", "working_dir",
                                 "compile_command", "output_path"},
        "benchmark": {"framework", "model", "precision", "run_mode", "tp", "concurrency", "input_len", "output_len",
                      "torch_profiler", "tracelens", "gap_analysis_enabled", "docker_image", "gpu_arch",
                      "timeout_seconds", "output_dir"},
        "gap_analysis": {"trace_dir", "start_pct", "end_pct", "top_k", "min_duration_us", "categories",
                         "ignore_categories", "output_dir", "generate_clamped_traces"},
        "list_benchmark_results": {"output_dir", "limit"},
        "get_benchmark_result": {"workspace_dir", "include_kernel_summary", "include_raw_result",
                                 "include_tracelens_files"},
        "compare_benchmark_reports": {"workspace_dirs", "labels", "output_dir", "export_format"},
        "ray_task_status": {"task_id", "ray_cluster_address", "ray_shared_storage_path"},
        "ray_task_result": {"task_id", "ray_cluster_address", "ray_shared_storage_path"},
        "ray_task_cancel": {"task_id", "ray_cluster_address", "ray_shared_storage_path"},
        "ray_task_list": {"ray_cluster_address", "ray_shared_storage_path"},
        "benchmark_batch": {"configs", "ray_cluster_address", "ray_shared_storage_path", "parallel"},
    }
    for tool, args in magpie.items():
        assert tool in schemas, tool
        assert args <= schemas[tool], f"{tool}: missing {sorted(args - schemas[tool])}"
    for ours in ("job_status", "job_result", "job_cancel", "job_list", "optimize", "optimize_status",
                 "optimize_resume", "validate_config", "roofline_table", "batch_status", "trace_diff"):
        assert ours in schemas, ours
