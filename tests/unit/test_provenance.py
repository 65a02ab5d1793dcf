"""engine.runs.provenance: every value found or null with its reason; the model folder's hash, a
hub id's revision, the serving framework's version asked of the server's own Python, the image's
ID from the docker SDK, the GPUs a benchmark chose, and this checkout's git commit."""

import hashlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_hw import FakeTools, nvidia_outputs

from engine.bench.launch import ServerCommand
from engine.config.benchmark import BenchmarkConfig
from engine.hw.detect import detect_devices
from engine.runs import provenance as prov

REPO = Path(__file__).resolve().parents[2]


def _nulls_have_reasons(out: dict) -> None:
    for key, value in out.items():
        if value is None and not key.endswith(("_why", "_source")):
            assert out.get(f"{key}_why"), key


def _cfg(**kw) -> BenchmarkConfig:
    kw.setdefault("framework", "vllm")
    kw.setdefault("run_mode", "local")
    return BenchmarkConfig(**kw)


def test_git_commit_is_this_checkouts_head():
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    commit, dirty, why = prov.git_state()
    assert commit == head and isinstance(dirty, bool) and why is None
    assert prov.tool_version_string().startswith(f"{prov.engine.__version__}+g{head[:12]}")
    out = prov.common(None)
    assert out["git_commit"] == head and out["config_file"] is None and "no run folder" in out["config_sha256_why"]
    _nulls_have_reasons(out)


def test_config_hash_is_of_the_run_folders_config(tmp_path):
    (tmp_path / "config.yaml").write_text("benchmark:\n  framework: builtin\n")
    out = prov.kernel_provenance(tmp_path, None)
    assert out["config_sha256"] == hashlib.sha256(b"benchmark:\n  framework: builtin\n").hexdigest()
    assert out["gpu_name"] is None and "no GPU found" in out["gpu_name_why"]
    # a trace analysis inside a benchmark's folder hashes its own config, not the benchmark's
    (tmp_path / "trace_analysis_config.yaml").write_text("mode: trace_analysis\n")
    assert prov.trace_provenance(tmp_path)["config_file"] == "trace_analysis_config.yaml"


def test_gpu_from_the_detected_info():
    info = {"name": "NVIDIA H200", "driver": "570.1", "devices": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]}
    out = prov.kernel_provenance(None, info)
    assert (out["gpu_name"], out["gpu_count"], out["gpu_driver"]) == ("NVIDIA H200", 2, "570.1")


def test_detect_devices_runs_only_the_vendor_tool(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    fake = FakeTools(nvidia_outputs("nvidia_smi_2gpu.csv"))
    vendor, devices, driver = detect_devices(runner=fake.run, which=fake.which)
    assert vendor == "nvidia" and [d.name for d in devices] == ["NVIDIA H100 80GB HBM3"] * 2
    assert driver == "570.172.08" and {c[0] for c in fake.calls} == {"nvidia-smi"}  # no nvcc, ncu, ...


def test_a_benchmark_records_the_gpus_it_chose(monkeypatch):
    fake = FakeTools(nvidia_outputs("nvidia_smi_2gpu.csv"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(prov, "_host_gpus", lambda: (lambda f: (f[0], tuple(f[1]), f[2]))(
        detect_devices(runner=fake.run, which=fake.which)))
    chosen = [SimpleNamespace(uuid="GPU-a39d7e02-64b1-1f8c-5e2a-c8d0b7f61e42", bus_id="00000000:2A:00.0")]
    out: dict = {}
    prov._gpu_of_host(out, chosen)
    assert (out["gpu_name"], out["gpu_count"], out["gpu_driver"]) == ("NVIDIA H100 80GB HBM3", 1, "570.172.08")
    prov._gpu_of_host(out)
    assert out["gpu_count"] == 2 and "gpu_name_why" not in out


def test_model_revision_of_a_local_folder_is_its_config_hash(tmp_path):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    out = prov.benchmark_provenance(_cfg(model=str(model)), tmp_path)
    assert out["model_revision"] == "sha256:" + hashlib.sha256(b'{"hidden_size": 64}').hexdigest()
    assert out["model_revision_source"] == f"SHA-256 of {model / 'config.json'}"
    (model / "config.json").unlink()
    out = prov.benchmark_provenance(_cfg(model=str(model)), tmp_path)
    assert out["model_revision"] is None and "has no config.json" in out["model_revision_why"]


def test_model_revision_of_a_hub_id(tmp_path):
    out = prov.benchmark_provenance(_cfg(model="org/m", server_args=["--revision", "abc123"]), tmp_path)
    assert (out["model_revision"], out["model_revision_source"]) == ("abc123", "server argument --revision")
    out = prov.benchmark_provenance(_cfg(model="org/m", envs={"MODEL_REVISION": "v2"}), tmp_path)
    assert out["model_revision"] == "v2" and out["model_revision_source"].startswith("envs.MODEL_REVISION")
    out = prov.benchmark_provenance(_cfg(model="org/m"), tmp_path)
    assert out["model_revision"] is None and "without a revision" in out["model_revision_why"]
    assert out["framework_version"] is None and out["image"] is None and "run_mode local" in out["image_why"]
    _nulls_have_reasons(out)
    remote = prov.benchmark_provenance(_cfg(model="org/m", client={"base_url": "http://h:1"}), tmp_path)
    assert "not started by this run" in remote["framework_version_why"] and remote["gpu_name"] is None


def test_framework_version_is_asked_of_the_servers_python(tmp_path):
    """A ``vllm`` console script whose Python sees a vllm distribution only through the server's
    PYTHONPATH: the version comes from there, not from this process."""
    site = tmp_path / "site"
    dist = site / "vllm-9.9.9.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    script.write_text(f"#!{sys.executable}\nraise SystemExit(0)\n")
    script.chmod(0o755)
    cmd = ServerCommand(["vllm", "serve", "org/m", "--port", "1"], {"PYTHONPATH": str(site), "PATH": str(bin_dir)})
    cfg = _cfg(model="org/m")
    out = prov.with_server(prov.benchmark_provenance(cfg, tmp_path), cfg,
                           SimpleNamespace(server=object(), command=cmd, extra={}))
    assert out["framework_version"] == "9.9.9" and "framework_version_why" not in out
    assert out["framework_version_source"].startswith(f"importlib.metadata.version('vllm') in {sys.executable}")
    # No such distribution for that Python: null, and why
    cmd = ServerCommand([sys.executable, "-m", "sglang.launch_server"], {})
    cfg = _cfg(framework="sglang", model="org/m")
    out = prov.with_server(prov.benchmark_provenance(cfg, tmp_path), cfg,
                           SimpleNamespace(server=object(), command=cmd, extra={}))
    assert out["framework_version"] is None and "none of sglang is installed" in out["framework_version_why"]


def test_docker_image_id_from_the_running_container(tmp_path):
    image = SimpleNamespace(id="sha256:feed", attrs={"RepoDigests": ["vllm/vllm-openai@sha256:beef"]})
    server = SimpleNamespace(container=SimpleNamespace(image=image))
    cfg = _cfg(model="org/m", run_mode="docker", docker_image="vllm/vllm-openai:v0.19.1")
    out = prov.benchmark_provenance(cfg, tmp_path)
    assert out["image"] == "vllm/vllm-openai:v0.19.1" and out["image_id"] is None
    out = prov.with_server(out, cfg, SimpleNamespace(server=server, command=ServerCommand(["vllm"]),
                                                     extra={"image": "vllm/vllm-openai:v0.19.1"}))
    assert (out["image_id"], out["image_digest"]) == ("sha256:feed", "vllm/vllm-openai@sha256:beef")
    assert "image_id_why" not in out and out["framework_version"] is None
    assert "pip show" in out["framework_version_why"]


@pytest.mark.parametrize("broken", ["container", "image"])
def test_server_provenance_never_raises(tmp_path, broken):
    class Boom:
        @property
        def image(self):
            raise RuntimeError("daemon gone")
    cfg = _cfg(model="org/m", run_mode="docker", docker_image="x")
    server = SimpleNamespace(container=Boom()) if broken == "image" else SimpleNamespace()
    out = prov.with_server({}, cfg, SimpleNamespace(server=server, command=ServerCommand(["vllm"]), extra={}))
    assert out["image_id"] is None and out["image_id_why"]
