"""Failures of the machine are their own state: a kernel that ran out of memory, needed a GPU
this machine lacks, or whose folder shadows a standard module is `not judged` with the cause
and the fix, never `incorrect`; a compare whose baseline could not run exits 2."""

import pytest
import torch

from conftest import read_report, run_magpie
from engine.kernels.environment import classify

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU case needs a machine without a GPU")

PROBLEM = '''import torch
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
'''
HONEST = '''import torch
from problem import get_inputs, get_init_inputs  # noqa: F401
class {cls}(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)
'''
OOM = '''import torch
from problem import get_inputs, get_init_inputs  # noqa: F401
class ModelNew(torch.nn.Module):
    def forward(self, x):
        torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte: more than any machine holds
        return torch.softmax(x, -1)
'''
NEEDS_GPU = '''import torch
from problem import get_inputs, get_init_inputs  # noqa: F401
class {cls}(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x.cuda(), -1).cpu()
'''


def _kernels(tmp_path, files: dict, entries: str):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cfg = tmp_path / "compare.yaml"
    cfg.write_text("kernels:\n" + entries)
    return cfg


def _entry(kid, src, baseline=False):
    return f"  - id: {kid}\n    type: pytorch\n    source_files: [{src}]\n" + ("    baseline: true\n" if baseline else "")


def test_out_of_memory_and_no_gpu_are_not_judged_and_a_shadowing_file_is_harmless(tmp_path):
    cfg = _kernels(tmp_path, {
        "problem.py": PROBLEM, "base.py": HONEST.format(cls="Model"), "oom.py": OOM,
        "gpu.py": NEEDS_GPU.format(cls="ModelNew"),
        # Named like the standard module torch imports at start-up, in the working directory.
        "copy.py": HONEST.format(cls="ModelNew")},
        _entry("base", "base.py", True) + _entry("oom", "oom.py") + _entry("gpu", "gpu.py")
        + _entry("shadow", "copy.py"))
    proc = run_magpie("compare", "--no-perf", "-k", cfg, "-o", tmp_path / "out")
    report = read_report(tmp_path / "out")
    by_id = {r["kernel_id"]: r for r in report["results"]["kernel_results"]}
    assert by_id["shadow"]["correctness_state"] == "SUCCESS", by_id["shadow"]
    for kid, cause in (("oom", "out of memory"), ("gpu", "no usable GPU or driver here")):
        r = by_id[kid]
        assert r["verdict"] == "not judged", (kid, r["verdict"], r.get("errors"))
        assert not r.get("errors") and r["correctness_state"] != "FAILED", r
        assert any(cause in e for e in r["environment_problems"]), r["environment_problems"]
        assert cause in proc.stdout and f"{kid}: not judged: environment: {cause}" in proc.stdout
    assert "run it on a device with more memory" in proc.stdout and "a CUDA/ROCm build of torch" in proc.stdout
    assert proc.returncode == 0, proc.stderr  # the baseline was judged


def test_a_baseline_that_cannot_run_here_judges_nothing_and_exits_2(tmp_path):
    cfg = _kernels(tmp_path, {"problem.py": PROBLEM, "gpu_base.py": NEEDS_GPU.format(cls="Model"),
                              "honest.py": HONEST.format(cls="ModelNew")},
                   _entry("gpu_base", "gpu_base.py", True) + _entry("honest", "honest.py"))
    proc = run_magpie("compare", "--no-perf", "-k", cfg, "-o", tmp_path / "out")
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:])
    report = read_report(tmp_path / "out")
    verdicts = {r["kernel_id"]: r["verdict"] for r in report["results"]["kernel_results"]}
    assert verdicts == {"gpu_base": "not judged", "honest": "not judged"}
    assert report["winner_id"] is None and report["winner_reason"].startswith("the baseline was not judged")
    assert "incorrect" not in proc.stdout


def test_environment_signatures():
    shadow = ('Traceback (most recent call last):\n'
              '  File "/usr/lib/python3.12/site-packages/torch/__init__.py", line 10, in <module>\n'
              '    from copy import deepcopy\n'
              '  File "/home/u/kernels/copy.py", line 8, in <module>\n'
              "AttributeError: partially initialized module 'torch' has no attribute 'nn'")
    assert classify(shadow).kind == "shadowed_module" and "rename copy.py" in classify(shadow).fix
    assert classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.5 GiB").kind == "out_of_memory"
    assert classify("RuntimeError: Found no NVIDIA driver on your system").kind == "no_gpu"
    assert classify("RuntimeError: 0 active drivers ([]). There should only be one.").kind == "no_gpu"
    assert classify("ModuleNotFoundError: No module named 'flash_attn.ops'").kind == "missing_package"
    # A kernel's own error in its own file named like a standard module is the kernel's.
    assert classify('  File "/home/u/kernels/test.py", line 3, in forward\nValueError: wrong shape') is None
    assert classify("AssertionError: outputs differ") is None
