"""Finding the traces of a run: a trace file, a folder of traces, or a benchmark workspace.

Ranks come from the file name (``-rank-N.``, ``rank_N``, ``rankN``) or a parent folder
(``rank_N``, ``[ppN_]dpN_tpN``), as Magpie's gap analysis reads them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from engine.safeio import file_kind

_RANK_FILE = re.compile(r"(?:^|[-_.])rank[-_]?(\d+)(?:[-_.]|$)", re.IGNORECASE)
_RANK_DIR = re.compile(r"^rank[-_]?(\d+)$", re.IGNORECASE)
_PARALLEL_DIR = re.compile(r"^(?:pp(\d+)_)?dp(\d+)_tp(\d+)$", re.IGNORECASE)
# Folders holding derived traces, never the run's own: split steps and graph-capture traces.
_SKIP_DIRS = {"trace_split", "capture_traces", "tracelens", "gap_analysis"}


def workspace_of(path: Path) -> Path | None:
    """The benchmark workspace that holds ``path`` (it has a ``torch_trace`` folder or a report)."""
    for p in [path] + list(path.parents):
        if p.is_dir() and ((p / "torch_trace").is_dir() or (p / "benchmark_report.json").is_file()):
            return p
    return None


def rank_of(path: Path, root: Path) -> int | None:
    m = _RANK_FILE.search(path.name)
    if m:
        return int(m.group(1))
    for parent in path.parents:
        if parent == root.parent:
            break
        if (m := _RANK_DIR.match(parent.name)):
            return int(m.group(1))
        if (m := _PARALLEL_DIR.match(parent.name)):
            return int(m.group(3))
    return None


def discover_traces(target: Path) -> list[tuple[int, Path]]:
    """(rank, path) sorted by rank. Raises FileNotFoundError naming what was searched."""
    target = Path(target)
    if target.is_file():
        return [(rank_of(target, target.parent) or 0, target)]
    if not target.is_dir():
        if os.path.exists(target):  # a FIFO, a device: never opened
            raise FileNotFoundError(f"{target}: not a regular file ({file_kind(os.stat(target).st_mode)}); "
                                    "a trace must be a file or a folder of traces")
        raise FileNotFoundError(f"{target}: no such trace file or folder")
    root = target / "torch_trace" if (target / "torch_trace").is_dir() else target

    def walk(patterns: tuple[str, ...]) -> list[Path]:
        found = []
        for pat in patterns:
            for p in sorted(root.rglob(pat)):
                if p.is_file() and not (set(p.relative_to(root).parts[:-1]) & _SKIP_DIRS):
                    found.append(p)
            if found:
                return found
        return found

    files = walk(("*.pt.trace.json.gz", "*.pt.trace.json")) or walk(("*.json.gz", "*.json"))
    files = [f for f in files if not f.name.startswith(("execution_details", "config"))]
    if not files:
        raise FileNotFoundError(f"{root}: no torch-profiler traces (*.pt.trace.json[.gz], *.json[.gz]) found")
    ranked: dict[int, Path] = {}
    unranked = []
    for f in files:
        r = rank_of(f, root)
        if r is None:
            unranked.append(f)
        elif r not in ranked or f.stat().st_size > ranked[r].stat().st_size:
            ranked[r] = f  # several traces of one rank (warm-up + run): the largest is the run
    next_rank = max(ranked, default=-1) + 1
    for f in unranked:
        ranked[next_rank] = f
        next_rank += 1
    return sorted(ranked.items())
