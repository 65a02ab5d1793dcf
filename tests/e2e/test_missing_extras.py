"""An optional part that is not installed (the ``ray`` and ``mcp`` extras): the command stops
before anything runs, with one line naming the extra and the install command, and exit code 2.

The missing package is simulated in the child process: a finder first in ``sys.meta_path``
refuses the module (as Python does for one that is not installed) before engine.cli runs.
"""

import os
import shutil
import subprocess
import sys

import yaml

from conftest import EXAMPLES, REPO

BLOCK = """
import runpy, sys
blocked = sys.argv[1]
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
for name in [m for m in sys.modules if m.split(".")[0] == blocked]:
    del sys.modules[name]
sys.argv = ["magpie"] + sys.argv[2:]
runpy.run_module("engine.cli", run_name="__main__")
"""


def _without(module: str, *args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-c", BLOCK, module, *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=120, env=env)


def _one_line(stderr: str, extra: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    line = lines[0]
    assert line.startswith("error: missing extra: ") and f"'{extra}' extra" in line, line
    assert f"pip install 'magpie-workbench[{extra}]'" in line and f"pip install -e '.[{extra}]'" in line, line
    return line


def test_ray_environment_without_ray_stops_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    r = _without("ray", "-e", "ray", "compare", "-k", EXAMPLES / "softmax_triton" / "compare.yaml", "-o", out)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "-e ray" in _one_line(r.stderr, "ray") and r.stdout == ""
    assert not out.exists()  # no run folder: nothing was run
    # The kernel YAML can ask for Ray too (Magpie's ray_config); a benchmark on Ray likewise.
    src = tmp_path / "src"
    shutil.copytree(EXAMPLES / "softmax_triton", src)
    cfg = yaml.safe_load((src / "compare.yaml").read_text())
    cfg["ray_config"] = {"cluster_address": "127.0.0.1:1"}
    (src / "compare.yaml").write_text(yaml.safe_dump(cfg))
    r = _without("ray", "compare", "-k", src / "compare.yaml", "-o", out)
    assert r.returncode == 2 and not out.exists(), r.stdout + r.stderr
    _one_line(r.stderr, "ray")
    r = _without("ray", "-e", "ray", "benchmark", "-b", REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml",
                 "-o", out)
    assert r.returncode == 2 and not out.exists(), r.stdout + r.stderr
    _one_line(r.stderr, "ray")


def test_mcp_without_the_mcp_extra_is_one_line(tmp_path):
    r = _without("mcp", "mcp", "--root", tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "magpie mcp" in _one_line(r.stderr, "mcp") and r.stdout == ""
