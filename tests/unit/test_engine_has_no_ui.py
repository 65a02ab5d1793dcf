"""The engine is one front end's back end, not the other way round: importing every engine
module must not load textual (the workbench lives in magpie_tui/)."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import engine

REPO = Path(__file__).resolve().parents[2]


def test_no_engine_module_imports_textual():
    modules = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine.")
                     if not m.name.startswith("engine.serve.__main__"))
    assert "engine.runs.catalog" in modules and "engine.cli" in modules
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith(('textual.', 'magpie_tui')))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"engine imports UI modules: {out.stdout}"


def test_magpie_tui_subcommand_reaches_the_workbench():
    out = subprocess.run([sys.executable, "-m", "engine.cli", "tui", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0 and "magpie-tui" in out.stdout and "project folder" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "engine.cli", "tui", "/no/such/folder"], capture_output=True,
                         text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "not a folder" in bad.stderr
