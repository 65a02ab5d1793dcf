"""Magpie's own configs through this tool's ``--dry-run``: do they load unchanged, and what stops the
ones that do not?

    python benchmarks/magpie_configs.py MAGPIE_CHECKOUT [--extra DIR ...] [--json OUT.json]

MAGPIE_CHECKOUT is a clone of Magpie (github.com/AMD-AGI/Magpie or a fork). Every kernel YAML
(``kernel:`` / ``kernels:``) and benchmark YAML (``benchmark:``) under ``examples/`` and ``Magpie/``
(``*.yaml``, ``*.yaml.example``), and every ```yaml block of ``docs/*.md`` that is a whole config,
is run as a Magpie user would run it, from the checkout's root (Magpie's working directories are
relative to it): ``magpie analyze|compare -k FILE --dry-run`` or ``magpie benchmark -b FILE --dry-run``.
``--extra DIR`` adds the YAML files of another folder (e.g. configs of a newer Magpie tree).

The table says, per config, the exit code and the first problem; a benchmark plan's "this machine"
lines (no GPU, no Docker engine, no transformers here) are counted apart: the config itself loaded.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _kind(data: object) -> str | None:
    """benchmark / kernel config; "framework" for Magpie's framework config (``-c``, whose
    ``benchmark:`` block holds defaults); "fragment" for a docs snippet that is no whole config."""
    if not isinstance(data, dict):
        return None
    if "benchmark" in data and ({"gpu", "scheduler", "performance", "compare"} & set(data)):
        return "framework"
    if "benchmark" in data:
        bench = data["benchmark"] if isinstance(data["benchmark"], dict) else {}
        return "benchmark" if bench.get("model") or bench.get("framework") else "fragment"
    if "kernel" in data or "kernels" in data:
        return "kernel"
    return None


def _doc_blocks(md: Path, scratch: Path) -> list[Path]:
    """The ```yaml blocks of a Markdown file that are whole configs, each written to a file."""
    out = []
    text = md.read_text(errors="replace")
    for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", text, flags=re.S)):
        try:
            data = yaml.safe_load(block)
        except yaml.YAMLError:
            continue
        if _kind(data) is None:
            continue
        path = scratch / f"{md.stem}_block{i}.yaml"
        path.write_text(block)
        out.append(path)
    return out


def collect(root: Path, extra: list[Path], scratch: Path) -> list[tuple[str, Path]]:
    files: list[Path] = []
    for base in (root / "examples", root / "Magpie"):
        files += sorted(p for p in base.rglob("*") if p.is_file() and (p.suffix in (".yaml", ".yml")
                                                                         or p.name.endswith(".yaml.example")))
    for folder in extra:
        files += sorted(p for p in folder.rglob("*.yaml") if p.is_file())
    for md in sorted((root / "docs").glob("*.md")) if (root / "docs").is_dir() else []:
        files += _doc_blocks(md, scratch)
    out = []
    for p in files:
        try:
            kind = _kind(yaml.safe_load(p.read_text(errors="replace")))
        except yaml.YAMLError:
            kind = None
        if kind is not None:
            out.append((kind, p))
    return out


def dry_run(kind: str, path: Path, cwd: Path) -> dict:
    if kind == "fragment":
        return {"kind": kind, "config": str(path), "command": "-", "rc": None, "problems": [], "machine": [],
                "warnings": [], "extra_args_shown": False, "tail": []}
    if kind == "framework":  # Magpie's -c: checked beside a kernel config of the same checkout
        kernel = next(iter(sorted(cwd.glob("examples/simple_hip_test/*.yaml"))), None)
        args = ["-c", str(path), "analyze", "-k", str(kernel), "--dry-run"]
    elif kind == "benchmark":
        args = ["benchmark", "-b", str(path), "--dry-run"]
    else:
        data = yaml.safe_load(path.read_text())
        n = (1 if data.get("kernel") else 0) + len(data.get("kernels") or [])
        args = ["compare" if n > 1 else "analyze", "-k", str(path), "--dry-run"]
    proc = subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    text = proc.stdout + proc.stderr
    problems = [ln.strip() for ln in proc.stderr.splitlines() if ln.startswith("  ")] if proc.returncode == 2 else []
    machine = [ln.strip() for ln in text.splitlines() if "this machine:" in ln]
    warnings = [ln.strip() for ln in text.splitlines() if ln.lstrip().startswith("warning:")]
    return {"kind": kind, "config": str(path), "command": " ".join(args[:1]), "rc": proc.returncode,
            "problems": problems, "machine": machine, "warnings": warnings,
            "extra_args_shown": "of which EXTRA_*_ARGS" in text, "tail": text.strip().splitlines()[-3:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("magpie", type=Path, help="a Magpie checkout")
    ap.add_argument("--extra", type=Path, action="append", default=[], help="another folder of Magpie YAML files")
    ap.add_argument("--json", type=Path, help="write every result here")
    args = ap.parse_args(argv)
    root = args.magpie.resolve()
    with tempfile.TemporaryDirectory(prefix="magpie_docs_") as tmp:
        configs = collect(root, [e.resolve() for e in args.extra], Path(tmp))
        results = [dry_run(kind, path, root) for kind, path in configs]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"{'kind':9} {'rc':>3} {'warn':>4} {'machine':>7}  config / first problem")
    for r in results:
        if r["rc"] is None:
            continue
        name = r["config"].replace(str(root) + "/", "")
        first = r["problems"][0][:110] if r["problems"] else ""
        print(f"{r['kind']:9} {r['rc']:>3} {len(r['warnings']):>4} {len(r['machine']):>7}  {name}"
              + (f"\n{'':28}{first}" if first else ""))
    for kind in ("kernel", "benchmark", "framework"):
        mine = [r for r in results if r["kind"] == kind]
        ok = [r for r in mine if r["rc"] == 0]
        print(f"{kind}: {len(ok)} of {len(mine)} load unchanged (dry run exit 0)")
    fragments = [r for r in results if r["kind"] == "fragment"]
    if fragments:
        print(f"fragments (docs snippets that are no whole config, not run): {len(fragments)}")
    return 0 if all(r["rc"] in (0, None) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
