"""Hostile input to the MCP server: every path a caller can hand it, directly or inside a config, outside
the root and through a symlink that leads out of it; files a tool reads back that link out of the root;
kernel overrides that are code; a loopback bind that is not 127.0.0.1; and run folders whose events name
processes the run never started (a decoy, the MCP server itself, a reused pid). Driven as
tests/unit/test_mcp_tools.py and tests/e2e/test_mcp_server.py drive the server: in process through the
SDK's client, and as a real subprocess over HTTP on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from conftest import REPO, mcp_http_url, stop_server

from engine.jobs.requests import LoopRequest
from engine.mcp.confine import Confinement, is_bundled_kernel
from engine.mcp.security import AccessRefused, Roots, check_bind, is_loopback
from engine.mcp.server import ServerOptions, build_server
from engine.runs.catalog import RunCatalog
from engine.runs.process import process_start_time

RUNS = REPO / "examples" / "runs"
BENCH_RUN = RUNS / "benchmark_builtin-tiny_20261129_192715_db9427"
TRACE_RUN = RUNS / "trace_synthetic_vllm_20261129_192730_d15ae4"
RMSNORM = REPO / "examples" / "kernels" / "rmsnorm_pytorch"
SYNTHETIC = REPO / "tests" / "data" / "tracelens-golden" / "synthetic_vllm" / "synthetic_vllm.json.gz"
SECRET = "TOP-SECRET-0xC0FFEE"
TOKEN = "hostile-test-token-0123456789"
RUN_NAME = "benchmark_builtin-tiny_20261206_120000_abc123"


# --------------------------------------------------------------------------- the playground
class Playground:
    """A root with links out of it, and an outside folder with a secret in every kind of file."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "root"
        self.out = tmp / "outside"
        self.results = self.root / "results"
        self.results.mkdir(parents=True)
        self.out.mkdir()
        o = self.out
        (o / "secret.txt").write_text(f"{SECRET}\n" * 7)
        (o / "data.jsonl").write_text(json.dumps({"prompt": SECRET, "output_len": 4}) + "\n")
        self.marker = o / "imported.marker"
        (o / "evil_kernel.py").write_text(f"open({str(self.marker)!r}, 'w').write('ran')\n"
                                          "def rmsnorm(x, w, eps):\n    return x\n")
        (o / "tok").mkdir()
        (o / "tok" / "tokenizer.json").write_text(json.dumps({"secret": SECRET}))
        (o / "arch.json").write_text(json.dumps({"name": SECRET, "mem_bw_gbps": 1, "max_achievable_tflops": {}}))
        (o / "clean.yaml").write_text("benchmark:\n  framework: builtin\n  server: {size: tiny}\n")
        shutil.copytree(RMSNORM, o / "kernels")
        (o / "kernels" / "SECRET.txt").write_text(SECRET)
        shutil.copytree(BENCH_RUN, o / "run")
        (o / "run" / "summary.txt").write_text(SECRET)
        report = json.loads((o / "run" / "benchmark_report.json").read_text())
        report["model"] = SECRET
        (o / "run" / "benchmark_report.json").write_text(json.dumps(report))
        shutil.copytree(TRACE_RUN, o / "trace_run")
        (o / "traces").mkdir()
        shutil.copy(SYNTHETIC, o / "traces" / "rank0.json.gz")
        (o / "batch.yaml").write_text(f"batch:\n  - {o / 'clean.yaml'}\n")
        (o / "loop").mkdir()
        (o / "loop" / "loop.json").write_text(json.dumps({"schema_version": 1, "kind": "optimize_loop",
                                                          "config": str(o / "clean.yaml"), "label": SECRET,
                                                          "steps": [{"name": "baseline"}]}))
        (o / "loop" / "events.jsonl").write_text("")
        # Inside the root: the same things as links that lead out of it.
        self.link = self.root / "links"
        self.link.mkdir()
        for name in ("secret.txt", "data.jsonl", "evil_kernel.py", "tok", "arch.json", "clean.yaml", "kernels",
                     "run", "trace_run", "traces", "batch.yaml", "loop"):
            (self.link / name).symlink_to(o / name)
        # And honest files inside the root.
        shutil.copytree(RMSNORM, self.root / "kernels")
        self.inside_kernel = self.root / "my_kernel.py"
        self.inside_kernel.write_text(f"open({str(self.marker)!r}, 'w').write('ran')\n"
                                      "def rmsnorm(x, w, eps):\n    return x\n")

    def outside(self, name: str) -> str:
        return str(self.out / name)

    def linked(self, name: str) -> str:
        return str(self.link / name)

    def config(self, name: str, body: dict) -> str:
        """A benchmark config under the root whose body names what the test wants."""
        path = self.root / name
        path.write_text(json.dumps({"benchmark": body}))  # JSON is YAML
        return str(path)


@pytest.fixture
def pg(tmp_path):
    return Playground(tmp_path)


def _server(pg: Playground, allow_commands: bool = False):
    return build_server(ServerOptions(roots=[pg.root], output_dir=pg.results, allow_commands=allow_commands))


def call(app, tool: str, args: dict) -> tuple[bool, str]:
    async def go():
        async with Client(app) as client:
            return await client.call_tool(tool, args)
    result = anyio.run(go)
    return result.is_error, result.content[0].text


def refused(app, tool: str, args: dict, argument: str) -> str:
    is_error, text = call(app, tool, args)
    assert is_error, f"{tool} {args}: not refused: {text[:400]}"
    assert "outside the allowed roots" in text and argument in text, text
    assert SECRET not in text, text
    return text


# --------------------------------------------------------------------------- every path argument
# (tool, argument named in the refusal, arguments given the hostile path P)
def _cases(pg: Playground, P) -> list[tuple[str, str, dict]]:
    k = str(pg.root / "kernels")
    return [
        ("analyze", "kernel_path", {"kernel_path": P("kernels/rmsnorm_eager.py"), "kernel_type": "pytorch"}),
        ("analyze", "working_dir", {"kernel_path": f"{k}/rmsnorm_eager.py", "working_dir": P("kernels"),
                                    "kernel_type": "pytorch"}),
        ("analyze", "kernel_config", {"kernel_config": P("kernels/analyze.yaml")}),
        ("analyze", "framework_config", {"kernel_config": f"{k}/analyze.yaml", "framework_config": P("clean.yaml")}),
        ("analyze", "output_dir", {"kernel_config": f"{k}/analyze.yaml", "output_dir": P("run")}),
        ("compare", "kernel_paths", {"kernel_paths": [f"{k}/rmsnorm_eager.py", P("kernels/rmsnorm_fused.py")],
                                     "kernel_type": "pytorch"}),
        ("compare", "working_dirs", {"kernel_paths": [f"{k}/rmsnorm_eager.py"], "working_dirs": [P("kernels")],
                                     "kernel_type": "pytorch"}),
        ("compare", "kernel_config", {"kernel_config": P("kernels/compare.yaml")}),
        ("create_kernel_config", "kernel_path", {"kernel_id": "x", "kernel_path": P("kernels/rmsnorm_eager.py")}),
        ("create_kernel_config", "working_dir", {"kernel_id": "x", "kernel_path": f"{k}/rmsnorm_eager.py",
                                                 "working_dir": P("kernels")}),
        ("create_kernel_config", "output_path", {"kernel_id": "x", "kernel_path": f"{k}/rmsnorm_eager.py",
                                                 "output_path": P("kernels/new.yaml")}),
        ("discover_kernels", "project_path", {"project_path": P("kernels")}),
        ("validate_config", "config_path", {"config_path": P("clean.yaml")}),
        ("benchmark", "benchmark_config", {"benchmark_config": P("clean.yaml")}),
        ("benchmark", "batch", {"batch": P("batch.yaml")}),
        ("benchmark", "dataset_path", {"framework": "builtin", "dataset_name": "custom",
                                       "dataset_path": P("data.jsonl")}),
        ("benchmark", "tokenizer", {"framework": "builtin", "tokenizer": P("tok")}),
        ("benchmark", "gpu_arch", {"framework": "builtin", "gpu_arch": P("arch.json")}),
        ("benchmark", "output_dir", {"framework": "builtin", "output_dir": P("run")}),
        ("benchmark_batch", "configs[0].benchmark_config", {"configs": [{"benchmark_config": P("clean.yaml")}]}),
        ("benchmark_batch", "configs[0].tokenizer", {"configs": [{"benchmark_config": str(pg.root / "ok.yaml"),
                                                                  "tokenizer": P("tok")}]}),
        ("benchmark_batch", "configs[0].client.dataset_path",
         {"configs": [{"framework": "builtin", "client": {"dataset_name": "custom", "dataset_path": P("secret.txt")}}]}),
        ("benchmark_batch", "configs[0].client.tokenizer",
         {"configs": [{"framework": "builtin", "client": {"tokenizer": P("tok")}}]}),
        ("benchmark_batch", "configs[0].server.kernels.rmsnorm",
         {"configs": [{"framework": "builtin", "server": {"kernels": {"rmsnorm": P("evil_kernel.py") + ":rmsnorm"}}}]}),
        ("gap_analysis", "trace_dir", {"trace_dir": P("traces")}),
        ("gap_analysis", "kernel_source_repos", {"trace_dir": str(SYNTHETIC_IN(pg)), "find_kernel_sources": True,
                                                 "kernel_source_repos": [P("kernels")]}),
        ("gap_analysis", "gpu_arch", {"trace_dir": str(SYNTHETIC_IN(pg)), "gpu_arch": P("arch.json")}),
        ("gap_analysis", "output_dir", {"trace_dir": str(SYNTHETIC_IN(pg)), "output_dir": P("run")}),
        ("trace_diff", "a", {"a": P("traces"), "b": str(SYNTHETIC_IN(pg))}),
        ("trace_diff", "b", {"a": str(SYNTHETIC_IN(pg)), "b": P("traces")}),
        ("trace_diff", "gpu_arch", {"a": str(SYNTHETIC_IN(pg)), "b": str(SYNTHETIC_IN(pg)), "gpu_arch": P("arch.json")}),
        ("trace_diff", "output_dir", {"a": str(SYNTHETIC_IN(pg)), "b": str(SYNTHETIC_IN(pg)), "output_dir": P("run")}),
        ("list_benchmark_results", "output_dir", {"output_dir": P("run")}),
        ("get_benchmark_result", "workspace_dir", {"workspace_dir": P("run")}),
        ("compare_benchmark_reports", "workspace_dirs", {"workspace_dirs": [P("run"), P("run")]}),
        ("compare_benchmark_reports", "workspace_dirs[0]", {"workspace_dirs": [P("run/benchmark_report.json"),
                                                                               P("run")]}),
        ("suggest_optimizations", "workspace_dir", {"workspace_dir": P("trace_run")}),
        ("roofline_table", "workspace_dir", {"workspace_dir": P("trace_run")}),
        ("optimize", "benchmark_config", {"benchmark_config": P("clean.yaml")}),
        ("optimize", "candidates", {"benchmark_config": str(pg.root / "ok.yaml"), "candidates": [P("evil_kernel.py")]}),
        ("optimize_resume", "loop_dir", {"loop_dir": P("loop")}),
        ("optimize_status", "loop_dir", {"loop_dir": P("loop")}),
    ]


def SYNTHETIC_IN(pg: Playground) -> Path:  # noqa: N802 - a trace under the root, for the cases that need one
    target = pg.root / "trace.json.gz"
    if not target.exists():
        shutil.copy(SYNTHETIC, target)
    return target


@pytest.mark.parametrize("how", ["outside", "symlink"])
def test_every_path_argument_outside_the_root_is_refused_by_name(pg, how):
    (pg.root / "ok.yaml").write_text("benchmark:\n  framework: builtin\n  server: {size: tiny}\n")
    app = _server(pg)
    P = pg.outside if how == "outside" else pg.linked
    for tool, argument, args in _cases(pg, P):
        refused(app, tool, args, argument)
    assert not pg.marker.exists()  # no outside code was imported
    assert [p.name for p in pg.results.iterdir() if not p.name.startswith(".")] == []  # no run started


@pytest.mark.parametrize("how", ["outside", "symlink"])
def test_paths_inside_a_config_under_the_root_are_confined_too(pg, how):
    app = _server(pg)
    P = pg.outside if how == "outside" else pg.linked
    kernel = pg.config("kernel.yaml", {"framework": "builtin", "server": {"kernels": {"rmsnorm": P("evil_kernel.py") +
                                                                                       ":rmsnorm"}}})
    data = pg.config("data.yaml", {"framework": "builtin",
                                   "client": {"dataset_name": "custom", "dataset_path": P("secret.txt")}})
    tok = pg.config("tok.yaml", {"framework": "builtin", "client": {"tokenizer": P("tok")}})
    cache = pg.config("cache.yaml", {"framework": "vllm", "model": "org/m", "hf_cache_path": P("tok")})
    piddir = pg.config("pid.yaml", {"framework": "builtin", "server_lifecycle": {"enabled": True,
                                                                                "pid_dir": P("tok")}})
    batch = pg.root / "batch.yaml"
    batch.write_text(f"batch:\n  - {P('clean.yaml')}\n")
    for config, argument in ((kernel, "server.kernels.rmsnorm"), (data, "client.dataset_path"),
                             (tok, "client.tokenizer"), (cache, "hf_cache_path"), (piddir, "server_lifecycle.pid_dir")):
        refused(app, "benchmark", {"benchmark_config": config}, argument)
        refused(app, "benchmark_batch", {"configs": [{"benchmark_config": config}]}, argument)
        refused(app, "validate_config", {"config_path": config}, argument)
        refused(app, "optimize", {"benchmark_config": config}, argument)
    refused(app, "benchmark", {"batch": str(batch)}, "batch[0]")
    # The data set is never opened: the refusal comes before the loader would count its lines.
    assert "line" not in refused(app, "validate_config", {"config_path": data}, "client.dataset_path")
    assert not pg.marker.exists()


def test_an_inline_kernel_override_is_code_and_needs_allow_commands(pg):
    app = _server(pg)
    inside = {"framework": "builtin", "server": {"kernels": {"rmsnorm": f"{pg.inside_kernel}:rmsnorm"}}}
    is_error, text = call(app, "benchmark_batch", {"configs": [inside]})
    assert is_error and "configs[0].server.kernels.rmsnorm" in text and "--allow-commands" in text
    dotted = {"framework": "builtin", "server": {"kernels": {"rmsnorm": "my_kernel:rmsnorm"}}}
    is_error, text = call(app, "benchmark_batch", {"configs": [dotted]})
    assert is_error and "--allow-commands" in text  # a module of the working folder is code as well
    # Outside the root it is refused even on a server that runs commands, and never imported.
    outside = {"framework": "builtin", "server": {"kernels": {"rmsnorm": f"{pg.outside('evil_kernel.py')}:rmsnorm"}}}
    refused(_server(pg, allow_commands=True), "benchmark_batch", {"configs": [outside]},
            "configs[0].server.kernels.rmsnorm")
    assert not pg.marker.exists()
    # The bundled kernels are not the caller's code.
    confine = Confinement(Roots([pg.root]), allow_commands=False)
    for path in ("engine.library.rmsnorm:rmsnorm_triton", "engine.library.attention.decode_attention_split",
                 "engine.serve.kernels:rmsnorm"):
        assert is_bundled_kernel(path)
        confine.benchmark_body({"framework": "builtin", "server": {"kernels": {"rmsnorm": path}}}, "c", inline=True)
    assert not is_bundled_kernel(f"{pg.inside_kernel}:rmsnorm") and not is_bundled_kernel("os:system")


def test_a_docker_image_the_caller_names_is_code_and_needs_allow_commands(pg, monkeypatch):
    from engine.bench.docker_launch import IMAGES
    from engine.jobs import BenchmarkRequest
    app = _server(pg)
    vllm = {"framework": "vllm", "model": "facebook/opt-125m", "vocab_size": 1000}
    on_disk = pg.config("vllm.yaml", {"framework": "vllm", "model": "facebook/opt-125m", "client": {"vocab_size": 1000},
                                      "docker_image": "someone/else:1"})
    monkeypatch.setenv("MAGPIE_TEST_IMAGE", "someone/else:2")
    cases = [  # (tool, arguments, the argument or config field the refusal names)
        ("benchmark", {**vllm, "docker_image": "someone/else:1"}, "docker_image"),
        # The engine's image for another framework is not this framework's.
        ("benchmark", {**vllm, "docker_image": IMAGES["sglang"]["nvidia"]}, "docker_image"),
        # A flag replaces the image of a config on disk: the caller's again.
        ("benchmark", {"benchmark_config": on_disk, "docker_image": "someone/else:3"}, "docker_image"),
        ("benchmark_batch", {"configs": [{"benchmark_config": on_disk, "docker_image": "someone/else:3"}]},
         "configs[0].docker_image"),
        ("benchmark_batch", {"configs": [{"framework": "vllm", "model": "m", "client": {"vocab_size": 1000},
                                          "docker_image": "$MAGPIE_TEST_IMAGE"}]}, "configs[0].docker_image"),
        ("benchmark_batch", {"configs": [{"benchmark": {"framework": "builtin", "run_mode": "docker",
                                                        "docker_image": "someone/else:4"}}]}, "configs[0].docker_image"),
        # Kernel containers have no engine image: any image named is the caller's.
        ("analyze", {"kernel_config": str(pg.root / "kernels" / "analyze.yaml"), "environment": "container",
                     "docker_image": "python:3.11"}, "docker_image"),
        ("compare", {"kernel_config": str(pg.root / "kernels" / "compare.yaml"), "docker_image": "python:3.11"},
         "docker_image"),
    ]
    for tool, args, argument in cases:
        is_error, text = call(app, tool, args)
        assert is_error, f"{tool} {args}: not refused: {text[:400]}"
        assert f"refused: {argument}: " in text and "runs code given by the caller" in text, text
        assert "--allow-commands" in text, text
    assert "someone/else:2" in call(app, *cases[4][:2])[1]  # named after $VAR expansion
    assert "vllm/vllm-openai:v0.19.1" in call(app, *cases[0][:2])[1]  # the hint names the engine's own
    assert not [p for p in pg.results.iterdir() if not p.name.startswith(".")]  # nothing was started
    # The engine's own images for the framework pass, a config on disk keeps its image, and a server
    # started with --allow-commands runs any image.
    confine = Confinement(Roots([pg.root]), allow_commands=False)
    for image in IMAGES["vllm"].values():
        prepared = BenchmarkRequest(framework="vllm", flags={"model": "m", "vocab_size": 1000,
                                                             "docker_image": image}).prepare()
        confine.prepared(prepared, "benchmark", image_from="docker_image")
    confine.prepared(BenchmarkRequest(benchmark_config=on_disk).prepare(), "benchmark")
    Confinement(Roots([pg.root]), allow_commands=True).docker_image("someone/else:1", "vllm", "docker_image")
    Confinement(Roots([pg.root]), allow_commands=True).docker_image("python:3.11", None, "docker_image")
    with pytest.raises(AccessRefused, match="docker_image"):
        confine.docker_image("docker.io/vllm/vllm-openai:v0.19.1", "vllm", "docker_image")  # names match exactly


# --------------------------------------------------------------------------- files read back
def _run_with_links(pg: Playground, name: str = RUN_NAME) -> Path:
    """A run folder in the results whose summary.txt and report lead out of the root."""
    run = pg.results / name
    shutil.copytree(BENCH_RUN, run)
    for f in ("summary.txt", "benchmark_report.json"):
        (run / f).unlink()
    (run / "summary.txt").symlink_to(pg.out / "secret.txt")
    (run / "benchmark_report.json").symlink_to(pg.out / "run" / "benchmark_report.json")
    return run


def test_files_a_tool_reads_back_never_lead_out_of_the_root(pg):
    app = _server(pg)
    run = _run_with_links(pg)
    for tool, args, argument in (("job_result", {"job_id": run.name}, "benchmark_report.json"),
                                 ("get_benchmark_result", {"workspace_dir": str(run)}, "benchmark_report.json"),
                                 ("compare_benchmark_reports", {"workspace_dirs": [str(run), str(run)]},
                                  "workspace_dirs[0]")):
        refused(app, tool, args, argument)
    # Only summary.txt links out: job_result refuses it by name rather than return it.
    (run / "benchmark_report.json").unlink()
    shutil.copy(BENCH_RUN / "benchmark_report.json", run / "benchmark_report.json")
    refused(app, "job_result", {"job_id": run.name}, "summary.txt")
    refused(app, "get_benchmark_result", {"workspace_dir": str(run)}, "summary.txt")
    # A roofline CSV that links out.
    trace = pg.root / "trace_run"
    shutil.copytree(TRACE_RUN, trace)
    csv = next((trace / "tracelens").glob("*_kernel_roofline_simple.csv"))
    shutil.copy(csv, pg.out / "roofline.csv")
    (pg.out / "roofline.csv").write_text((pg.out / "roofline.csv").read_text().replace("aten::", SECRET))
    csv.unlink()
    csv.symlink_to(pg.out / "roofline.csv")
    refused(app, "roofline_table", {"workspace_dir": str(trace)}, csv.name)
    refused(app, "suggest_optimizations", {"workspace_dir": str(trace)}, csv.name)
    # loop.json that links out.
    loop = pg.root / "loop_x"
    loop.mkdir()
    (loop / "loop.json").symlink_to(pg.out / "loop" / "loop.json")
    refused(app, "optimize_status", {"loop_dir": str(loop)}, "loop.json")
    refused(app, "optimize_resume", {"loop_dir": str(loop)}, "loop.json")


def test_a_job_id_that_links_out_of_the_root_is_not_followed(pg):
    app = _server(pg)
    (pg.results / RUN_NAME).symlink_to(pg.out / "run")
    for tool in ("job_status", "job_result", "job_cancel"):
        refused(app, tool, {"job_id": RUN_NAME}, RUN_NAME)
    for tool, key in (("job_list", "jobs"), ("list_benchmark_results", "runs")):
        is_error, text = call(app, tool, {})
        assert not is_error and json.loads(text)[key] == [] and SECRET not in text

    async def resource():
        async with Client(app) as client:
            return await client.list_resources()
    assert all(RUN_NAME not in str(r.uri) for r in anyio.run(resource).resources)


def test_a_batch_whose_folders_link_out_of_the_root_is_not_read(pg):
    """batch_status reads a batch's run folder: a point folder, a config.yaml or a whole batch that links
    out of the root is refused by name; an id that is a path, or the id of a run that is no batch, is
    no batch id."""
    app = _server(pg)
    batch = pg.results / "benchmark_batch-mcp_20261206_120000_abc123"
    (batch / "points").mkdir(parents=True)
    (pg.root / "b.yaml").write_text(f"batch:\n  - {pg.root / 'ok.yaml'}\n")
    (batch / "request.json").write_text(json.dumps({"mode": "benchmark", "batch": str(pg.root / "b.yaml")}))
    (batch / "events.jsonl").write_text("")
    (batch / "config.yaml").write_text(json.dumps({"points": [{"index": 0, "label": "00_builtin-tiny_tp1_c4"}]}))
    (batch / "points" / "00_builtin-tiny_tp1_c4").symlink_to(pg.out / "run")
    refused(app, "batch_status", {"batch_id": batch.name}, "point 0")
    (batch / "points" / "00_builtin-tiny_tp1_c4").unlink()
    is_error, text = call(app, "batch_status", {"batch_id": batch.name})
    assert not is_error and [p["state"] for p in json.loads(text)["jobs"]] == ["queued"], text
    (pg.out / "config.yaml").write_text(json.dumps({"points": [{"index": 0, "label": SECRET}]}))
    (batch / "config.yaml").unlink()
    (batch / "config.yaml").symlink_to(pg.out / "config.yaml")
    refused(app, "batch_status", {"batch_id": batch.name}, "config.yaml")
    shutil.move(batch, pg.out / batch.name)
    batch.symlink_to(pg.out / batch.name)
    refused(app, "batch_status", {"batch_id": batch.name}, batch.name)
    shutil.copytree(BENCH_RUN, pg.results / RUN_NAME)
    for batch_id, message in (("../outside", "not a batch id"), (".mcp", "not a batch id"),
                              (RUN_NAME, "not a benchmark batch"), ("benchmark_batch-none", "no batch")):
        is_error, text = call(app, "batch_status", {"batch_id": batch_id})
        assert is_error and message in text and SECRET not in text, (batch_id, text)


# --------------------------------------------------------------------------- loopback
def test_loopback_is_an_address_not_a_prefix():
    for host in ("127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost", "::ffff:127.0.0.2"):
        assert is_loopback(host), host
        assert check_bind(host, False) is None
    for host in ("0.0.0.0", "10.0.0.1", "::", "128.0.0.1"):
        assert not is_loopback(host), host
        assert "--allow-remote" in check_bind(host, False)
    # A name that looks like a loopback address but is none, and does not resolve: refused.
    text = check_bind("127.0.0.1.nip.invalid", False)
    assert text is not None and "does not resolve" in text
    with pytest.raises(AccessRefused):
        is_loopback("127.0.0.1.nip.invalid")


def _http_server(tmp_path: Path, host: str, out_name: str = "results"):
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MAGPIE_MCP_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "engine.mcp", "--transport", "http", "--host", host, "--port", "0",
                             "--root", str(root), "-o", str(root / out_name)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, lines = mcp_http_url(proc)
    if url is None:
        proc.kill()
        proc.wait()
    assert url, "".join(lines)
    return proc, url, root


def _post(url: str, body: dict, **headers: str) -> httpx2.Response:
    return httpx2.post(url, json=body, timeout=30, headers={"Accept": "application/json, text/event-stream",
                                                            "Authorization": f"Bearer {TOKEN}", **headers})


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def test_a_bind_on_127_0_0_2_keeps_the_host_and_origin_checks(tmp_path):
    proc, url, _root = _http_server(tmp_path, "127.0.0.2")
    try:
        assert url.startswith("http://127.0.0.2:")
        port = url.split(":")[2].split("/")[0]
        assert _post(url, INIT).status_code == 200  # its own address in Host: served
        r = _post(url, INIT, Host=f"evil.example:{port}")
        assert r.status_code == 421, (r.status_code, r.text)  # DNS rebinding: a foreign Host is refused
        r = _post(url, INIT, Origin="http://evil.example")
        assert r.status_code == 403, (r.status_code, r.text)  # a page of another site is refused
        assert _post(url, INIT, Origin=f"http://127.0.0.2:{port}").status_code == 200
    finally:
        stop_server(proc)


# --------------------------------------------------------------------------- processes: identity, not names
def _write_run(results: Path, pid: int, start_time=None, name: str = RUN_NAME) -> Path:
    run = results / name
    run.mkdir(parents=True)
    event = {"ts": time.time(), "event": "run_started", "mode": "benchmark", "pid": pid,
             "workspace": str(run), "label": "builtin-tiny", "schema_version": 1}
    if start_time is not None:
        event["start_time"] = start_time
    (run / "events.jsonl").write_text(json.dumps(event) + "\n")
    return run


@pytest.fixture
def decoy():
    """An unrelated live process whose command line says magpie: what a name test would signal."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "magpie", "engine.jobs"],
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while process_start_time(proc.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_run_naming_an_unrelated_process_is_lost_and_never_signalled(pg, decoy):
    app = _server(pg)
    wrong = process_start_time(decoy.pid) + 12345  # the pid of a live process, another process's start time
    run = _write_run(pg.results, decoy.pid, wrong)
    _, text = call(app, "job_status", {"job_id": run.name})
    assert json.loads(text)["state"] == "lost"
    is_error, text = call(app, "job_cancel", {"job_id": run.name})
    assert not is_error and json.loads(text)["cancelled"] is False
    time.sleep(0.3)
    assert decoy.poll() is None  # still alive: no signal reached it
    assert json.loads(call(app, "job_list", {})[1])["jobs"][0]["state"] == "lost"


def test_a_forged_start_time_still_gets_no_signal(pg, decoy):
    """The events name the decoy with its true start time (anyone can read it from /proc): the identity
    holds, but the decoy is not writing the run's events, so it is not the run's process."""
    app = _server(pg)
    run = _write_run(pg.results, decoy.pid, process_start_time(decoy.pid))
    is_error, text = call(app, "job_cancel", {"job_id": run.name})
    assert not is_error and json.loads(text)["cancelled"] is False
    assert "not signalled" in json.loads(text)["message"]
    time.sleep(0.3)
    assert decoy.poll() is None
    # A run folder from before start times were recorded, naming it: never signalled either.
    old = _write_run(pg.results, decoy.pid, name=RUN_NAME.replace("abc123", "abc124"))
    _, text = call(app, "job_cancel", {"job_id": old.name})
    assert json.loads(text)["cancelled"] is False
    assert json.loads(call(app, "job_status", {"job_id": old.name})[1])["state"] == "lost"
    time.sleep(0.3)
    assert decoy.poll() is None


def test_job_cancel_never_signals_the_mcp_server_itself(tmp_path):
    proc, url, root = _http_server(tmp_path, "127.0.0.1", out_name="magpie-results")
    try:
        run = _write_run(root / "magpie-results", proc.pid, process_start_time(proc.pid))

        async def go():
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
                from mcp.client.streamable_http import streamable_http_client
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    cancel = await client.call_tool("job_cancel", {"job_id": run.name})
                    await anyio.sleep(0.5)
                    listed = await client.call_tool("job_list", {})
                    return json.loads(cancel.content[0].text), json.loads(listed.content[0].text)
        cancel, listed = anyio.run(go)
        assert cancel["cancelled"] is False and "not signalled" in cancel["message"]
        assert proc.poll() is None and listed["jobs"][0]["job_id"] == run.name  # it still serves
    finally:
        stop_server(proc)


def test_pid_reuse_makes_no_run_look_running(tmp_path):
    results = tmp_path / "results"
    # pid 1 and this process are alive, but neither is the process these runs recorded.
    _write_run(results, 1, 4242, name=RUN_NAME)
    _write_run(results, os.getpid(), process_start_time(os.getpid()) + 1, name=RUN_NAME.replace("abc123", "abc125"))
    _write_run(results, 1, None, name=RUN_NAME.replace("abc123", "abc126"))  # written before start times
    catalog = RunCatalog([results])
    catalog.refresh()
    assert {r.state for r in catalog.runs.values()} == {"lost"}
    assert all("run_finished" in r.error for r in catalog.runs.values())
    # optimize --resume: a step left running by a process whose pid was reused (after a reboot, pid 1) is
    # not busy; the loop resumes instead of pointing at pid 1.
    loop = tmp_path / "loop_x"
    loop.mkdir()
    clean = tmp_path / "clean.yaml"
    clean.write_text("benchmark:\n  framework: builtin\n")
    for start in (None, 4242):
        (loop / "loop.json").write_text(json.dumps({
            "schema_version": 1, "kind": "optimize_loop", "config": str(clean), "label": "x",
            "steps": [{"name": "baseline", "state": "running", "pid": 1, "start_time": start, "started": 1.0}]}))
        prepared = LoopRequest(resume=str(loop)).prepare()
        assert prepared.resume_dir == loop.resolve()


def test_a_live_run_still_records_its_identity_and_is_running(tmp_path):
    from engine.runs.workspace import Workspace
    ws = Workspace.create(tmp_path, "benchmark", "me")
    ws.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(ws.root))
    event = json.loads((ws.root / "events.jsonl").read_text().splitlines()[0])
    assert event["start_time"] == process_start_time(os.getpid()) and event["pgid"] == os.getpgrp()
    catalog = RunCatalog([tmp_path])
    catalog.refresh()
    assert catalog.runs[ws.root].state == "running"
    ws.events.close()
