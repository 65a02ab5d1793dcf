"""Steps 4-6 of the loop: the harness of the chosen op, the candidates' compare, and the
integration of the winner into the server config.

Each function takes the running ``Loop`` (engine.loop.run) and its step, does its work in the
step's folder, and returns the step's short result (``loop.json``); a ``LoopError`` says why it
could not. The compare is an ordinary ``magpie compare`` run (engine.jobs), so its verdicts are
the correctness-gated, noise-aware ones of that mode.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml

from engine.loop.bottlenecks import BOTTLENECKS_FILE
from engine.loop.context import LoopError, RunRequest, config_diff
from engine.loop.harness import HARNESS_DIR, HARNESS_FILE, chosen_calls, harness_tolerances, write_candidate, write_harness
from engine.loop.results import CandidatesResult, HarnessResult, IntegrateResult
from engine.runs.schema import COMPARE_REPORT

if TYPE_CHECKING:
    from engine.loop.context import LoopContext as Loop
    from engine.loop.schema import LoopStep

CANDIDATES_DIR = "candidates"
INTEGRATE_DIR = "integrate"
INTEGRATED_CONFIG = "integrated_config.yaml"
BASELINE_ID = "baseline"


def _error(message: str, hint: str = "") -> Exception:
    return LoopError(message, hint=hint) if hint else LoopError(message)


# ---------------------------------------------------------------------------- 4. harness
def step_harness(loop: "Loop", step: "LoopStep") -> HarnessResult:
    table = json.loads((loop.root / "bottlenecks" / BOTTLENECKS_FILE).read_text(encoding="utf-8"))
    op = loop.loop.kernel
    rows = table.get("stages", {}).get("all", {}).get("rows", [])
    replaceable = [r for r in rows if r.get("replaceable")]
    if op is None:
        if not replaceable:
            raise _error("no row of the bottleneck table is a replaceable registry op")
        row = replaceable[0]
        op = row["registry_op"]
    else:
        row = next((r for r in replaceable if r["registry_op"] == op), None)
        if row is None:
            raise _error(f"--kernel {op}: the profiled run recorded no call of kernels.{op}",
                         hint=f"replaceable ops in the table: {', '.join(r['registry_op'] for r in replaceable) or 'none'}")
    calls = chosen_calls(row)
    if not calls:
        raise _error(f"the trace recorded no arguments for kernels.{op} (a trace of a server without "
                     "magpie_args:: annotations?)", hint="profile again with this version's built-in server")
    implementation = _implementation_in_use(loop, op, table.get("device"))
    folder = loop.root / HARNESS_DIR
    written = write_harness(folder, op, implementation, calls)
    loop.set_run_dir(step, HARNESS_DIR)
    loop.log(f"magpie optimize: harness {folder / HARNESS_FILE} for kernels.{op} "
             f"({row['share_pct']:.1f}% of the profiled time, {len(calls)} call shape(s))")
    return HarnessResult(**written, row={"rank": row["rank"], "share_pct": row["share_pct"], "calls": row["calls"],
                                         "confidence": row["mapping"]["confidence"], "method": row["mapping"]["method"]},
                         device=table.get("device"))


def _implementation_in_use(loop: "Loop", op: str, device: Optional[str]) -> str:
    """The clean config's kernels: entry for ``op``, else the server's default on the profiled device."""
    raw = loop.clean_yaml()
    server = (raw.get("benchmark") or {}).get("server") or {}
    kernels = server.get("kernels") or {}
    if kernels.get(op):
        return kernels[op]
    on_gpu = device == "gpu" and server.get("triton_kernels", True) is not False
    if not on_gpu:  # the reference, named without importing torch (seconds) into the loop's process
        from engine.serve.kernel_keys import REFERENCE_PATHS
        return REFERENCE_PATHS[op]
    from engine.serve.kernels import default_kernel_path
    return default_kernel_path(op, "cuda")


# ---------------------------------------------------------------------------- 5. candidates
def gather_candidates(op: str, device: str, user_paths: list[str], library: bool,
                      folder: Path) -> tuple[list[dict], list[dict]]:
    """(usable candidates, left out with why): the library's for ``op`` on ``device`` and the
    user's files. A user file is a module defining a function named after the op (or ``kernel``)
    with the registry signature; it is copied into ``folder/user`` (the compare and the server
    import the copy, so a later edit of the original cannot change what was measured)."""
    usable: list[dict] = []
    left_out: list[dict] = []
    if library:
        from engine.library import candidates_for
        for entry, ok, why in candidates_for(op, "cuda" if device == "gpu" else "cpu"):
            item = {"id": entry.name, "path": entry.path, "origin": "library", "description": entry.description}
            (usable if ok else left_out).append(item if ok else {**item, "reason": why})
    for src in _user_files(user_paths):
        fn = _user_function(src, op)
        cid = _unique(f"user_{src.stem}", usable + left_out)
        if fn is None:
            left_out.append({"id": cid, "path": str(src), "origin": "user",
                             "reason": f"defines no function {op}() or kernel()"})
            continue
        copy = folder / "user" / f"{cid}.py"
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, copy)
        usable.append({"id": cid, "path": f"{copy}:{fn}", "origin": "user", "description": f"{src}:{fn}"})
    return usable, left_out


def _user_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p).expanduser().resolve()
        out.extend(sorted(path.glob("*.py")) if path.is_dir() else [path])
    return [p for p in out if p.name != "__init__.py"]


def _user_function(path: Path, op: str) -> Optional[str]:
    import ast
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return op if op in names else ("kernel" if "kernel" in names else None)


def _unique(cid: str, taken: list[dict]) -> str:
    ids = {t["id"] for t in taken}
    out, i = cid, 2
    while out in ids:
        out, i = f"{cid}_{i}", i + 1
    return out


def step_candidates(loop: "Loop", step: "LoopStep") -> CandidatesResult:
    harness = loop.result_of("harness", HarnessResult)
    if not harness.file or not harness.op:
        raise _error("the harness step recorded no harness file and op", hint="resume from the harness step")
    harness_file = loop.root / harness.file
    if not harness_file.is_file():
        raise _error(f"the harness {harness_file} is gone", hint="resume from the harness step or restore the file")
    result = compare_candidates(loop.root / CANDIDATES_DIR, harness_file, harness.op, harness.device or "cpu",
                                loop.loop.candidates, loop.loop.library, run_request=loop.run_request,
                                cancel=loop.cancel, log=loop.log,
                                on_run_dir=lambda d: loop.set_run_dir(step, str(d.relative_to(loop.root))),
                                timer=_timer_for(loop, harness.op, harness.device))
    if not result.compare_run:
        return result
    compare_run = str(Path(result.compare_run).relative_to(loop.root))  # relative to the loop, as the others
    return CandidatesResult(**{**result.written(), "compare_run": compare_run,
                               "report": f"{compare_run}/{COMPARE_REPORT}"})


def _timer_for(loop: "Loop", op: str, device: Optional[str]) -> Optional[str]:
    """The GPU timer that measures what the server will see: its decode step is replayed from a
    CUDA graph, so decode_attention is timed by graph replay (a call of several kernels has no
    host gaps between them there, which the default device-trace span would count)."""
    if device != "gpu" or op != "decode_attention":
        return None
    raw = loop.clean_yaml()
    server = (raw.get("benchmark") or {}).get("server") or {}
    return None if server.get("eager") else "graph"


def compare_candidates(folder: Path, harness_file: Path, op: str, device: str, user_paths: list[str], library: bool,
                       cancel: Any = None, log: Any = lambda s: None, on_run_dir: Any = lambda d: None, *,
                       run_request: RunRequest,
                       timer: Optional[str] = None) -> CandidatesResult:
    """Write a ModelNew module per candidate into ``folder``, compare them all against the
    harness's Model in one ``magpie compare`` run (``timer``: the GPU timer, default the
    compare's own), and summarize the verdicts."""
    from engine.jobs.requests import KernelRequest
    from engine.runs.workspace import Workspace
    usable, left_out = gather_candidates(op, device, user_paths, library, folder)
    if not usable:
        return CandidatesResult(op=op, winner=None, rows=[], left_out=left_out,
                                stopped=f"no candidate for kernels.{op} can run here"
                                + (f" ({'; '.join(c['id'] + ': ' + c['reason'] for c in left_out)})" if left_out else ""))
    entries = [{"id": BASELINE_ID, "type": "pytorch", "source_files": [str(harness_file)], "baseline": True}]
    for c in usable:
        src = write_candidate(folder, c["id"], c["path"], c["description"], harness_file)
        entries.append({"id": c["id"], "type": "pytorch", "source_files": [str(src)]})
    compare_yaml = folder / "compare.yaml"
    doc: dict[str, Any] = {"kernels": entries}
    if timer:
        doc["performance"] = {"timer": timer}
    compare_yaml.write_text("# The candidates' compare, written by magpie optimize.\n"
                            + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    rtol, atol = harness_tolerances(harness_file)
    request = KernelRequest(mode="compare", kernel_config=str(compare_yaml), rtol=rtol, atol=atol)
    prepared = request.prepare()
    ws = Workspace.create(folder, "compare", f"{op}_candidates")
    on_run_dir(ws.root)
    outcome = run_request(request, cancel=cancel, workspace=ws, prepared=prepared)
    if outcome.state == "cancelled":
        raise _error("the candidates' compare was cancelled")
    result = summarize_compare(outcome.report, op, usable, left_out, str(ws.root))
    for row in result.rows:
        speed = f" {row.speedup:.3f}x" if row.speedup is not None else ""
        log(f"  [{row.id}] {row.verdict}{speed}" + (f": {row.reason}" if row.reason else ""))
    for c in left_out:
        log(f"  [{c['id']}] left out: {c['reason']}")
    return result


def summarize_compare(report: dict, op: str, usable: list[dict], left_out: list[dict], run_dir: str) -> CandidatesResult:
    by_id = {c["id"]: c for c in usable}
    rows = []
    for k in (report.get("results") or {}).get("kernel_results", []):
        cid = k.get("kernel_id")
        verdict = k.get("verdict")
        correct = k.get("correctness_state") == "SUCCESS"
        rejected = bool((k.get("guards") or {}).get("rejected"))
        if not correct:
            verdict = "incorrect"
        elif rejected:
            verdict = "rejected"
        reason = "; ".join(str(e) for e in (k.get("errors") or [])[:2]) or None
        rows.append({"id": cid, "source": by_id.get(cid, {}).get("path", "baseline"),
                     "origin": by_id.get(cid, {}).get("origin", "baseline"), "correct": correct, "verdict": verdict,
                     "speedup": k.get("speedup"), "ci95": k.get("speedup_ci"),
                     "median_ms": (k.get("timing") or {}).get("median"), "reason": reason})
    winner = report.get("winner_id")
    winner_row = next((r for r in rows if r["id"] == winner), None)
    if winner is None or winner == BASELINE_ID or winner_row is None or winner_row["verdict"] != "faster":
        why = report.get("winner_reason") or f"the compare ended {report.get('state')}"
        return CandidatesResult(op=op, compare_run=run_dir, winner=None, rows=rows, left_out=left_out, stopped=why)
    return CandidatesResult(op=op, compare_run=run_dir, winner=winner, winner_path=by_id[winner]["path"],
                            speedup=winner_row["speedup"], ci95=winner_row["ci95"], rows=rows, left_out=left_out,
                            stopped=None)


# ---------------------------------------------------------------------------- 6. integrate
def step_integrate(loop: "Loop", step: "LoopStep") -> IntegrateResult:
    """The clean YAML with the winner in it: for the built-in server, ``server.kernels.<op>``; for
    vLLM, an out-of-tree plugin (engine.loop.vllm_plugin) installed into ``integrate/site`` and
    named by ``server_env`` (PYTHONPATH, and VLLM_PLUGINS where the clean run restricted it)."""
    cand = loop.result_of("candidates", CandidatesResult)
    op, path = cand.op, cand.winner_path
    if not op or not path:
        raise _error("the candidates step recorded no winner to integrate", hint="resume from the candidates step")
    raw = loop.clean_yaml()
    framework = str((raw.get("benchmark") or {}).get("framework") or "").strip().lower()
    if framework not in ("builtin", "vllm"):
        raise _error(f"integrating into framework {framework!r}: this version integrates winners into the built-in "
                     "server and vLLM only", hint="benchmark the built-in server or vLLM in the loop")
    folder = loop.root / INTEGRATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {}
    if framework == "vllm":
        from engine.loop.vllm_plugin import VllmPluginError, integrate_vllm
        try:
            integrated, changed, extra = integrate_vllm(raw, op, path, folder, log=loop.log)
        except VllmPluginError as exc:
            raise _error(str(exc), hint=exc.hint or "") from None
        extra["site"] = str(Path(extra["site"]).relative_to(loop.root))  # folders relative to the loop, as the others
        extra["plugin"]["dir"] = str(Path(extra["plugin"]["dir"]).relative_to(loop.root))
        how = f"loaded into vLLM by the out-of-tree plugin {extra['plugin']['name']} (server_env)"
    else:
        integrated = json.loads(json.dumps(raw))  # a deep copy of plain YAML data
        server = integrated["benchmark"].setdefault("server", {}) or {}
        integrated["benchmark"]["server"] = server
        kernels = dict(server.get("kernels") or {})
        before = kernels.get(op)
        kernels[op] = path
        server["kernels"] = kernels
        changed = [{"field": f"benchmark.server.kernels.{op}", "clean": before, "integrated": path}]
        how = f"as kernels.{op}"
    out = folder / INTEGRATED_CONFIG
    out.write_text(f"# {loop.loop.config} with the winner of the candidates' compare {how},\n"
                   "# written by magpie optimize. Nothing else differs.\n"
                   + yaml.safe_dump(integrated, sort_keys=False), encoding="utf-8")
    if framework == "builtin":
        for key, kpath in integrated["benchmark"]["server"]["kernels"].items():
            check_kernel_path(key, kpath)  # the server would refuse it at start: fail here, naming it
    loop.set_run_dir(step, INTEGRATE_DIR)
    return IntegrateResult(config=f"{INTEGRATE_DIR}/{INTEGRATED_CONFIG}", framework=framework, kernels={op: path},
                           changed=changed, **extra)


def check_kernel_path(key: str, path: str) -> None:
    """That ``path`` names a function the server can import, without importing it here (a Triton
    module would load triton into the loop's process): the module is found and defines it."""
    import ast
    import importlib.util
    module, sep, attr = path.rpartition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    try:
        source = Path(module) if module.endswith(".py") else Path(str((importlib.util.find_spec(module) or object).origin))
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (ImportError, AttributeError, ValueError, OSError, SyntaxError) as exc:
        raise _error(f"kernels.{key}: cannot find the module of {path!r} ({type(exc).__name__}: {exc})") from None
    names: set[str] = set()
    for n in tree.body:  # what the module defines at its top level: functions, classes, names, imports
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
    if attr.split(".")[0] not in names:
        raise _error(f"kernels.{key}: {source} defines no {attr!r} ({path!r})")


def workload_differences(clean: dict, new: dict, allowed: list[str]) -> list[dict]:
    """Effective-config fields that differ between two runs, other than the ``allowed`` ones (a
    field is allowed when it is one of them or lies under one: ``benchmark.server_env.PYTHONPATH``,
    not ``benchmark.server_env.PYTHONPATHX``)."""
    return [d for d in config_diff(clean, new)
            if not any(d["field"] == a or d["field"].startswith(a + ".") for a in allowed)]


def environment_differences(a: dict, b: dict) -> list[dict]:
    keys = ("python", "platform", "host", "http_client")
    ea, eb = a.get("environment") or {}, b.get("environment") or {}
    out: list[dict[str, Any]] = [{"field": f"environment.{k}", "clean": ea.get(k), "new": eb.get(k)}
                                 for k in keys if ea.get(k) != eb.get(k)]
    if a.get("model") != b.get("model"):
        out.append({"field": "model", "clean": a.get("model"), "new": b.get("model")})
    return out
