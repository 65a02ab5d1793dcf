"""The front ends reach the engine through one door: the job API (``engine.jobs`` and its
submodules: requests, submit, Job, launch helpers, and ``engine.jobs.query`` for read-only
questions), the error family (``engine.errors``) and the run-folder schema (``engine.runs.schema``).

Every module of the workbench (``magpie_tui/``), the command line (``engine/cli.py``) and the MCP
server (``engine/mcp/``) is parsed with ``ast``; every import in it (at module level, inside a
function or a class, relative or absolute, and ``importlib.import_module("...")`` with a literal
name) must name an allowed module. A front end may also import the front ends themselves
(``magpie_tui``, ``engine.cli``, ``engine.mcp``): they are not the engine.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]

FRONT_ENDS = [REPO / "magpie_tui", REPO / "engine" / "cli.py", REPO / "engine" / "mcp"]
ALLOWED = ("engine.jobs", "engine.errors", "engine.runs.schema")
FRONT_END_PACKAGES = ("magpie_tui", "engine.cli", "engine.mcp")

# (file relative to the repository, engine module or "*" for any) -> why it is still imported
# directly. Each entry is a debt, named; the test fails when one is no longer needed, so the list
# only shrinks.
ALLOW_LIST: dict[tuple[str, str], str] = {}


def _allow_listed(rel: str, module: str) -> bool:
    return (rel, module) in ALLOW_LIST or (rel, "*") in ALLOW_LIST


def _front_end_files() -> list[Path]:
    out: list[Path] = []
    for root in FRONT_ENDS:
        out += [root] if root.is_file() else sorted(root.rglob("*.py"))
    return out


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    """``engine.x.y`` is a module or package of this repository."""
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in the file, wherever it stands (``package``: the file's
    package, for relative imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                # ``from engine.runs import schema`` imports engine.runs.schema; ``from engine
                # import __version__`` imports from the package engine itself.
                sub = f"{module}.{alias.name}"
                yield node.lineno, sub if _is_module(sub) else module
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def _allowed(module: str) -> bool:
    return any(module == ok or module.startswith(ok + ".") for ok in ALLOWED + FRONT_END_PACKAGES)


def _file_violations(path: Path, package: str) -> list[tuple[int, str]]:
    return [(line, module) for line, module in _imports(path, package)
            if (module == "engine" or module.startswith("engine.")) and not _allowed(module)]


def _violations() -> list[tuple[str, int, str]]:
    return sorted({(str(path.relative_to(REPO)), line, module) for path in _front_end_files()
                   for line, module in _file_violations(path, _package_of(path))})


def test_front_ends_import_only_the_job_api_the_errors_and_the_run_schema():
    files = _front_end_files()
    assert REPO / "engine" / "cli.py" in files and REPO / "magpie_tui" / "app.py" in files
    assert REPO / "engine" / "mcp" / "server.py" in files
    bad = [f"{rel}:{line}: imports {module}" for rel, line, module in _violations()
           if not _allow_listed(rel, module)]
    assert not bad, ("front ends may import only engine.jobs (and its submodules, engine.jobs.query for "
                     "reads), engine.errors and engine.runs.schema:\n" + "\n".join(bad))


def test_the_allow_list_holds_only_imports_that_are_still_there():
    found = {(rel, module) for rel, _line, module in _violations()}
    found |= {(rel, "*") for rel, _module in found}
    stale = sorted(set(ALLOW_LIST) - found)
    assert not stale, f"allow-list entries no longer needed (remove them): {stale}"
    assert all(reason.strip() for reason in ALLOW_LIST.values())


def test_the_rule_sees_every_kind_of_import(tmp_path):
    """Module-level, function-level, class-level, relative and importlib imports are all seen."""
    probe = tmp_path / "probe.py"
    probe.write_text("import engine.safeio\n"
                     "def f():\n    from engine.runs.catalog import RunInfo\n    from engine.runs import schema\n"
                     "    from engine import __version__\n"
                     "    import importlib\n    importlib.import_module('engine.loop.schema')\n"
                     "class C:\n    from engine.jobs.query import RunInfo\n    from ..runs import state\n"
                     "    from . import security\n")
    found = set(_file_violations(probe, "engine.mcp"))
    assert found == {(1, "engine.safeio"), (3, "engine.runs.catalog"), (5, "engine"), (7, "engine.loop.schema"),
                     (10, "engine.runs.state")}


def test_every_name_the_query_module_offers_resolves():
    query = importlib.import_module("engine.jobs.query")
    for name in query.LAZY:
        assert getattr(query, name) is not None, name
    jobs = importlib.import_module("engine.jobs")
    for name in jobs.__all__:
        assert getattr(jobs, name) is not None, name
