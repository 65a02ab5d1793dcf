"""Kernel: for a roofline row, the GPU kernels behind the op, their gap-analysis lines, where
their source is (with the finder's confidence), the source opened at the definition, and the
candidate kernels in the project with their latest analyze/compare results."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from textual import work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static

from engine.jobs.query import ConfigError, RunInfo, check_config, classify, read_json, read_yaml
from magpie_tui.screens.reports import resolve_config_file
from magpie_tui.screens.roofline import load_csv
from magpie_tui.widgets.code_view import CodeView
from magpie_tui.widgets.data_grid import Column, DataGrid
from magpie_tui.widgets.footer import KeysFooter

_NAME = re.compile(r"'name': '((?:[^'\\]|\\.)*)'")
_WORD = re.compile(r"[a-z][a-z0-9]+")
# Words too common in kernel names to say anything about which candidate belongs to a kernel.
_COMMON = {"kernel", "void", "aten", "native", "impl", "cuda", "triton", "float", "half", "bf16", "fp16", "fp32",
           "int", "const", "unsigned", "long", "char", "at", "std", "detail", "the", "and", "fwd", "bwd", "auto",
           "vectorized", "elementwise", "launch", "config", "default", "func", "functor", "true", "false",
           # library and plumbing words: a flash-attention kernel in ``pytorch_flash::`` is not
           # about a ``rmsnorm_pytorch`` folder, ``..._with_output`` not about an ``zeros_output``
           "pytorch", "torch", "vllm", "sglang", "output", "input", "with", "params", "traits", "kernels",
           "anonymous", "namespace", "tensor", "iterator", "base", "array", "unified", "memcpy", "copy",
           "pinned", "device", "host", "ref", "reference", "candidate", "eager", "fused", "naive", "kernelbench"}


def kernels_of_op(run_dir: Path, stage: str, row: dict[str, Any]) -> list[str]:
    """The GPU kernel names that ran for this op (from the stage's unified perf summary)."""
    names: list[str] = []
    for perf in load_csv(run_dir / "tracelens" / stage / "unified_perf_summary.csv"):
        if perf.get("name") != row.get("op_name"):
            continue
        if row.get("input_dims") and perf.get("Input Dims") and perf["Input Dims"] != row["input_dims"]:
            continue
        for name in _NAME.findall(perf.get("kernel_details_summary") or ""):
            if name not in names:
                names.append(name)
    return names


def gap_lines(run_dir: Path, kernel_names: list[str]) -> list[dict[str, str]]:
    wanted = set(kernel_names)
    return [row for row in load_csv(run_dir / "gap_analysis" / "gap_analysis.csv") if row.get("Name") in wanted]


def bundled_kernel_dirs() -> list[Path]:
    """The folders of the kernels that ship with the engine (engine.jobs.query.bundled_kernel_dirs)."""
    from engine.jobs.query import bundled_kernel_dirs as dirs
    return dirs()


def source_repos(info: RunInfo, project: Path) -> list[Path]:
    """Folders to search for kernel sources: the run's --kernel-source-repos, the project, then
    the engine's own kernels (``bundled_kernel_dirs``)."""
    repos: list[Path] = []
    try:
        cfg = read_yaml(info.path / "config.yaml") or {}
    except ConfigError:
        cfg = {}
    for repo in ((cfg.get("options") or {}).get("kernel_source_repos") or []) if isinstance(cfg, dict) else []:
        if Path(repo).is_dir():
            repos.append(Path(repo))
    if project not in repos:
        repos.append(project)
    repos += [d for d in bundled_kernel_dirs() if d.is_dir() and d not in repos]
    return repos


def locate_sources(names: list[str], repos: list[Path]) -> list[dict[str, Any]]:
    """Finder results with the ``$REPO_DIR`` path resolved to a file on disk."""
    from engine.jobs.query import locate_kernel_sources
    return locate_kernel_sources(names, repos)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _COMMON and len(w) > 2}


def candidate_kernels(project: Path, op_name: str, kernel_names: list[str], source: Path | None,
                      runs: list[RunInfo]) -> list[dict[str, Any]]:
    """Kernel-config entries in the project that are about this kernel: the same source file, or
    a shared distinctive word (``softmax``, ``rmsnorm``) between their id/source and the op or
    kernel names. Each comes with its latest result from a finished run of that config."""
    topic = _words(op_name.replace("aten::", "")) | set().union(*(_words(n) for n in kernel_names))
    found = []
    for config in sorted(project.rglob("*.y*ml")):
        if any(part.startswith(".") or part == "results" for part in config.relative_to(project).parts):
            continue
        if classify(config) != "kernel":  # a cheap look first: only kernel configs get validated
            continue
        check = check_config(config)
        if check.kind != "kernel" or not check.kernel_ids:
            continue
        entries = _kernel_sources(config)
        for kid in check.kernel_ids:
            src = entries.get(kid)
            same_file = source is not None and src is not None and src.resolve() == source.resolve()
            shared = topic & (_words(kid) | _words(src.stem if src else "") | _words(config.parent.name))
            if same_file or shared:
                found.append({"config": config, "kernel": kid, "source": src,
                              "match": "same source" if same_file else "shares " + ", ".join(sorted(shared)),
                              **latest_result(config, kid, runs)})
    return found


def _kernel_sources(config: Path) -> dict[str, Path]:
    try:
        data = read_yaml(config) or {}
    except ConfigError:
        return {}
    entries = data.get("kernels") or ([data["kernel"]] if data.get("kernel") else [])
    out = {}
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, dict):
            kid = str(entry.get("id") or entry.get("name") or i)
            files = entry.get("source_files") or []
            files = [files] if isinstance(files, str) else files
            base = config.parent / str(entry.get("working_dir") or ".")
            if files:
                out[kid] = (base / str(files[0])).resolve()
    return out


def latest_result(config: Path, kernel_id: str, runs: list[RunInfo]) -> dict[str, Any]:
    """The newest finished analyze/compare run of ``config``: this kernel's correctness, median, verdict."""
    for info in runs:  # newest first
        if info.mode not in ("compare", "analyze") or not info.is_finished or info.report_path is None:
            continue
        try:
            cfg = read_yaml(info.path / "config.yaml") or {}
            if resolve_config_file(info.path, cfg.get("config_file")) != config.resolve():
                continue
            report = read_json(info.report_path)
        except (OSError, ValueError, ConfigError):
            continue
        for kr in (report.get("results") or {}).get("kernel_results") or []:
            if kr.get("kernel_id") == kernel_id:
                timing = kr.get("timing") or {}
                return {"run": info.name, "correct": kr.get("correctness_state"), "median_ms": timing.get("median"),
                        "speedup": kr.get("speedup"), "verdict": kr.get("verdict")}
    return {"run": None, "correct": None, "median_ms": None, "speedup": None, "verdict": None}


CANDIDATE_COLUMNS = [
    Column("kernel", "Candidate", max_width=24), Column("config_name", "Config", max_width=36),
    Column("match", "Why listed", max_width=24), Column("correct", "Correct"),
    Column("median_ms", "Median ms", "number", fmt=lambda v: f"{v:.4g}"),
    Column("speedup", "Speedup", "number", fmt=lambda v: f"{v:.3f}x"), Column("verdict", "Verdict"),
    Column("run", "Latest run", max_width=48),
]


class KernelScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="kernel.back"),
        Binding("d", "diff", "Diff candidate", id="kernel.diff"),
        Binding("n", "next_source", "Next kernel source", id="kernel.next_source"),
        Binding("e", "edit_source", "Edit source", show=False, id="kernel.edit_source"),
        Binding("y", "copy_source_path", "Copy path", show=False, id="kernel.copy_path"),
    ]
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("kernel.back", "kernel.diff", "kernel.next_source", "grid.sort")

    def __init__(self, info: RunInfo, stage: str, row: dict[str, Any]) -> None:
        super().__init__()
        self.info = info
        self.stage = stage
        self.row = row
        self.kernel_names = kernels_of_op(info.path, stage, row)
        self.sources: list[dict[str, Any]] = []
        self.source_index = 0
        self.candidates: list[dict[str, Any]] = []

    def compose(self):
        yield Header()
        yield Static(self._header_text(), id="kernel-info")
        yield DataGrid(CANDIDATE_COLUMNS, row_class=lambda r: {"faster": "correct", "incorrect": "incorrect",
                                                                "tie": "tie"}.get(r.get("verdict") or ""),
                       id="kernel-candidates")
        yield CodeView(id="kernel-source")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

    def _header_text(self) -> str:
        r = self.row
        calls = r.get("operation_count")
        calls_text = f", {calls:.0f} call(s) in the stage" if isinstance(calls, float) else ""
        lines = [f"{r.get('op_name')}  [{r.get('source_category')}]  {r.get('roofline_bound') or ''}  "
                 f"{(r.get('kernel_time_ms_sum') or 0):.4g} ms ({(r.get('time_pct') or 0):.1f}% of stage {self.stage})"
                 + calls_text,
                 f"shape: {r.get('param_signature') or '-'}"]
        gaps = gap_lines(self.info.path, self.kernel_names)
        for name in self.kernel_names or ["(no kernel names recorded for this op)"]:
            gap = next((g for g in gaps if g.get("Name") == name), None)
            # The gap analysis counts the whole trace; the row above counts this stage's steps.
            gap_text = (f"whole trace: calls {gap.get('Calls')}, total {gap.get('Self CUDA total (us)')} us, mean "
                        f"{gap.get('Avg time (us)')} us, {gap.get('% Total')}% of kernel time") if gap else \
                "not in the gap-analysis top kernels"
            lines.append(f"kernel: {name[:120]}\n  gap analysis ({gap_text})")
        lines.append("source: searching…")
        return "\n".join(lines)

    def on_mount(self) -> None:
        self.sub_title = f"{self.info.name} · {self.stage}"
        self.find_sources()

    @work(thread=True, exclusive=True, group="kernel-sources", exit_on_error=False)
    def find_sources(self) -> None:
        project = self.app.settings.project_dir
        try:
            sources = locate_sources(self.kernel_names, source_repos(self.info, project)) if self.kernel_names \
                else []
        except (OSError, ValueError) as exc:
            sources = [{"kernel": "", "status": "error", "reason": str(exc), "path": None, "line": None,
                        "confidence": 0.0, "file": "", "candidates": []}]
        best = next((s["path"] for s in sources if s.get("path")), None)
        candidates = candidate_kernels(project, str(self.row.get("op_name") or ""), self.kernel_names, best,
                                       self.app.runs)
        self.app.call_from_thread(self._show_sources, sources, candidates)

    def _show_sources(self, sources: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> None:
        self.sources, self.candidates = sources, candidates
        text = self._header_text().rsplit("source: searching…", 1)[0]
        for s in sources:
            if s.get("path"):
                where = f"{s['file']}:{s['line']}" if s.get("line") else s["file"]
            elif s.get("file"):
                where = f"{s['file']} (not on this machine)"
            elif "vendor" in str(s.get("status") or ""):
                where = "none to open (a vendor library kernel)"
            else:
                where = "not found in the project or the run's source repos"
            text += (f"source: {where}  confidence {s.get('confidence', 0):.2f} ({s.get('status')}) — "
                     f"{s.get('reason', '')}\n")
            if not s.get("path") and s.get("candidates"):
                text += f"  candidates: {'; '.join(s['candidates'][:4])}\n"
        if not sources:
            text += "source: no kernel names to look up\n"
        if not candidates:
            text += ("candidates: none in the project (kernel configs whose kernel ids or sources share a "
                     "distinctive word with this op or its kernels, or the same source file)\n")
        self.query_one("#kernel-info", Static).update(text.rstrip())
        rows = [{**c, "config_name": str(c["config"].relative_to(self.app.settings.project_dir))
                 if c["config"].is_relative_to(self.app.settings.project_dir) else str(c["config"])}
                for c in candidates]
        self.query_one(DataGrid).set_rows(rows, keys=[f"{r['config']}::{r['kernel']}" for r in rows])
        self._open_source(0)

    def _open_source(self, index: int) -> None:
        with_path = [s for s in self.sources if s.get("path")]
        if not with_path:
            reasons = "; ".join(f"{s.get('status')}: {s.get('reason')}" for s in self.sources if s.get("reason"))
            self.query_one(CodeView).show_message("no source file to open" + (f" — {reasons}" if reasons else ""))
            return
        self.source_index = index % len(with_path)
        chosen = with_path[self.source_index]
        self.query_one(CodeView).show(Path(chosen["path"]), chosen.get("line"))

    def action_next_source(self) -> None:
        self._open_source(self.source_index + 1)

    def action_edit_source(self) -> None:
        """The source shown below (the op's kernel or the highlighted candidate's) in
        ``$VISUAL``/``$EDITOR`` at its line, then read again: what the editor saved is shown."""
        from magpie_tui.editor import edit_file
        view = self.query_one(CodeView)
        if view.path is None:
            self.notify("no source file shown to edit (see the source line above)", severity="warning")
            return
        path, line = view.path, view.line
        problem = edit_file(self.app, path, line)
        if problem:
            self.notify(problem, severity="error")
        view.show(path, line)

    def action_copy_source_path(self) -> None:
        path = self.query_one(CodeView).path
        if path is None:
            self.notify("no source file shown to copy the path of", severity="warning")
            return
        self.app.copy_to_clipboard(str(path))
        self.notify(f"copied {path}")

    def on_data_grid_row_highlighted(self, event: DataGrid.RowHighlighted) -> None:
        # Only when the user moves in the candidates: filling the table must not replace the
        # op's own source (or the reason there is none) with a candidate's file.
        if not event.grid.has_focus:
            return
        if event.row and event.row.get("source") is not None and Path(event.row["source"]).exists():
            self.query_one(CodeView).show(Path(event.row["source"]), _definition_line(Path(event.row["source"])))

    def action_diff(self) -> None:
        from magpie_tui.screens.diff import DiffScreen
        row = self.query_one(DataGrid).cursor_row
        if not row:
            self.notify("no candidate kernel selected (the table above the source)", severity="warning")
            return
        self.app.push_screen(DiffScreen.for_config(row["config"], candidate=row["kernel"]))


def _definition_line(path: Path) -> int | None:
    """First kernel definition in a Python/Triton file (``@triton.jit`` or ``def``), else None."""
    if path.suffix != ".py":
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.decorator_list:
            return node.decorator_list[0].lineno
    return None
