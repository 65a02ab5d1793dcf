"""Whether two benchmark runs measured the same workload, decided before their metrics are compared.

``magpie benchmark --compare-reports A B``, the MCP tool ``compare_benchmark_reports`` and the
workbench's two-run view all go through ``compare_runs``, so they cannot disagree.

The two runs' effective configs (each run folder's ``config.yaml``, the ``benchmark:`` mapping
after overrides, with ``envs`` replaced by the effective envs the report records) and the report
keys that say how the run was made (run kind, resolved dataset and tokenizer, host, server
executable and image, provenance) are diffed into a flat list of ``Difference`` (field, A, B,
kind). Each difference is one of:

``kernel``
    the server's kernels, which are what a comparison is for: ``benchmark.server.kernels.*`` (the
    built-in server's overrides, what the optimization loop's integrate step changes), and the
    ``server_env`` entries that only load a kernel plugin: ``VLLM_PLUGINS``, and ``PYTHONPATH``
    when one side only adds folders to the other's and none of the added folders holds a serving
    framework or torch (the loop's vLLM plugin: its site folder and the winner's import root).
``noted``
    shown, but the workload is the same: ``client.repeats`` (how many times the same load was
    measured; the Welch interval takes unequal counts), ``client.goodput`` (SLO thresholds of the
    goodput metric only), the GPU monitor's sampling, and this tool's own version, git commit,
    torch and Triton versions (the client's code, not the server's; the built-in server's code is
    compared as its ``framework_version``).
``workload``
    everything else: a diagnostic (profiled) side, the load (CONC, ISL, OSL, NUM_PROMPTS, range
    ratio, request rate, sweep, dataset, endpoint, tokenizer, seeds, warm-up), model, framework and
    its version, precision, TP, run mode, image, server args and env beyond kernel selection,
    client settings, host, GPU and driver. These stop the comparison unless the caller allows
    different workloads; then every difference is shown above the verdict.

Ignored, never shown: where things are written or found (workspace, output dir, logs, HF cache
path, pid dir), timeouts, ports and base URLs of servers the run started, which GPUs of the same
model were picked (``gpu_selection``, ``CUDA_VISIBLE_DEVICES``; the GPU model is compared through
provenance), trace post-processing (``gap_analysis.*`` and ``profiler.tracelens.*`` other than
``enabled``; the profiler's settings when neither side profiles), keys this tool accepts for
Magpie and does not act on, and ``run_kind: auto`` against the kind it resolves to (the effective
kind is compared). Seeds are not ignored: ``client.seed`` picks the prompts and their lengths and
``server.seed`` the built-in model's weights.

A report without ``config.yaml`` beside it (older runs, a copied report file) is compared on its
own keys (framework, model, envs, dataset, server argv/env, sweep points), and the comparison says
that the config was not available.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from engine.config.yamlfile import ConfigError, load_yaml_file
from engine.errors import MagpieError
from engine.runs.schema import BENCHMARK_REPORT

WORKLOAD, KERNEL, NOTED = "workload", "kernel", "noted"
ALLOW_FLAG = "--allow-different-workloads"

# Top-level folders an added PYTHONPATH entry must not hold for it to count as kernel selection:
# a folder with one of these would replace the server itself, not add a kernel plugin.
_SERVER_PACKAGES = ("vllm", "sglang", "atom", "torch", "triton", "transformers")
_VISIBILITY = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
# Config fields (under ``benchmark.``) that never change what is measured.
_IGNORED_EXACT = {
    "timeout_seconds", "hf_cache_path", "gpu_arch", "runner_type", "benchmark_script", "inferencemax_path",
    "inferencex_path", "ray_config", "lm_eval_runtime", "run_cmd", "run_kind", "server_lifecycle.pid_dir",
    "server_lifecycle.server_ready_timeout_s", "server_lifecycle.cleanup", "gpu_selection.auto",
    "gpu_selection.min_free_memory_gb", "gpu_selection.candidates", "profiler.gpu_monitor.device_id",
}
_NOTED = {
    "client.repeats": "how many times the same load was measured",
    "client.goodput": "SLO thresholds of the goodput metric only",
    "profiler.gpu_monitor.enabled": "nvidia-smi / amd-smi sampling beside the run",
    "profiler.gpu_monitor.interval_sec": "nvidia-smi / amd-smi sampling beside the run",
}
# Provenance keys: (kind, why). Others are not compared (the config hash differs with every config).
_PROVENANCE = {
    "framework_version": (WORKLOAD, "the serving framework's version"),
    "model_revision": (WORKLOAD, "the model's revision"),
    "gpu_name": (WORKLOAD, "the GPU model"),
    "gpu_driver": (WORKLOAD, "the GPU driver"),
    "image": (WORKLOAD, "the server's image"),
    "image_id": (WORKLOAD, "the server's image"),
    "tool_version": (NOTED, "this tool's version (the load generator's code)"),
    "git_commit": (NOTED, "this tool's commit (the load generator's code)"),
    "git_dirty": (NOTED, "this tool's working tree"),
    "torch": (NOTED, "the client's torch"),
    "triton": (NOTED, "the client's Triton"),
}
# Report keys that say how the run was made, compared besides the config.
_REPORT_WORKLOAD = ("run_kind", "profiling_enabled", "dataset.prompts", "dataset.tokenizer", "dataset.vocab_size",
                    "environment.python", "environment.platform", "environment.host", "environment.event_loop",
                    "server.image", "server.executable")
# Without config.yaml: the report's own keys that carry the config.
_REPORT_FALLBACK = ("framework", "model", "envs", "dataset.name", "dataset.path", "dataset.prefix_len",
                    "environment.http_client", "environment.client_procs", "server.run_mode", "server.launched",
                    "server.argv", "server.env", "sweep_points")
# Server flags whose values are per-run paths or ports.
_PER_RUN_FLAGS = ("--port", "--server-port", "--host", "--profiler-dir", "--torch-profiler-dir", "--profiler-config")
_PER_RUN_ENV = ("SGLANG_TORCH_PROFILER_DIR", "VLLM_TORCH_PROFILER_DIR", "MAGPIE_PARENT_PID")


class ReportCompareError(MagpieError):
    """A report that cannot be read or has no measured result."""

    title = "compare reports"


@dataclass
class Difference:
    field: str
    a: Any
    b: Any
    kind: str  # WORKLOAD | KERNEL | NOTED
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "a": self.a, "b": self.b, "kind": self.kind, "why": self.why}

    def line(self) -> str:
        return f"{self.kind:<8}  {self.field}: A {show(self.a)}  ->  B {show(self.b)}" + (
            f"  ({self.why})" if self.why else "")


@dataclass
class RunSide:
    """One side of a comparison: its report, and its effective config when the folder has one."""
    report_path: Path
    report: dict[str, Any]
    config: Optional[dict[str, Any]]  # the ``benchmark:`` mapping of config.yaml
    config_note: Optional[str] = None

    @property
    def name(self) -> str:
        return self.report_path.parent.name if self.report_path.name == BENCHMARK_REPORT else self.report_path.name

    @property
    def measured(self) -> dict[str, Any]:
        """What ``compare_reports`` takes: the repeats, or else the single result."""
        return self.report.get("repeats") or self.report.get("result") or {}


@dataclass
class ReportComparison:
    a: RunSide
    b: RunSide
    differences: list[Difference]
    notes: list[str]
    allowed: bool  # the caller allowed different workloads
    deltas: Optional[dict[str, dict[str, Any]]] = None  # None when refused
    workload: list[Difference] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return bool(self.workload) and not self.allowed

    def message(self) -> str:
        if self.refused:
            return (f"A and B measure different workloads ({len(self.workload)} difference"
                    f"{'s' if len(self.workload) != 1 else ''} beyond the server's kernels): their metrics are not "
                    "compared")
        if self.workload:
            return (f"compared although A and B measure different workloads ({len(self.workload)} difference"
                    f"{'s' if len(self.workload) != 1 else ''}): the deltas include what those differences do")
        return "same workload" + (" (the server's kernels differ)" if any(d.kind == KERNEL for d in
                                                                          self.differences) else "")

    def lines(self) -> list[str]:
        """The differences and notes as the command line and the workbench print them, workload first."""
        out = [self.message()]
        out += [f"  {d.line()}" for d in self.differences]
        out += [f"  note: {n}" for n in self.notes]
        if self.refused:
            out.append(f"pass {ALLOW_FLAG} to compare them anyway (every difference is then shown above the verdict)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"a": str(self.a.report_path), "b": str(self.b.report_path), "refused": self.refused,
                "allowed_different_workloads": self.allowed, "message": self.message(),
                "differences": [d.to_dict() for d in self.differences], "notes": self.notes,
                "deltas": self.deltas}


def show(value: Any, limit: int = 160) -> str:
    """A value as the differences print it."""
    if value is None:
        return "(unset)"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --------------------------------------------------------------------------- loading


def load_side(path: Path | str) -> RunSide:
    """A run folder or a benchmark report file, with the folder's config.yaml when there is one."""
    path = Path(path)
    report_path = path / BENCHMARK_REPORT if path.is_dir() else path
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportCompareError(f"{report_path}: cannot read a benchmark report ({exc})") from None
    if not isinstance(report, dict):
        raise ReportCompareError(f"{report_path}: not a benchmark report (a JSON object)")
    if not (report.get("repeats") or report.get("result")):
        raise ReportCompareError(f"{report_path}: no measured result in this report (state: {report.get('state')})")
    config, note = None, None
    cfg_path = report_path.parent / "config.yaml"
    if not cfg_path.is_file():
        note = f"{cfg_path} not available: compared on the report's own keys"
    else:
        try:
            doc = load_yaml_file(cfg_path)
        except ConfigError as exc:  # also a FIFO, a huge file or an alias bomb under the name
            doc, note = None, f"{cfg_path} could not be read ({type(exc).__name__}): compared on the report's own keys"
        if isinstance(doc, dict) and isinstance(doc.get("benchmark"), dict):
            config = doc["benchmark"]
        elif note is None:
            note = f"{cfg_path} has no benchmark mapping: compared on the report's own keys"
    return RunSide(report_path, report, config, note)


# --------------------------------------------------------------------------- the comparison


def compare_runs(a: Path | str | RunSide, b: Path | str | RunSide, *,
                 allow_different_workloads: bool = False) -> ReportComparison:
    """The differences of B against A and, unless refused, the per-metric deltas B - A."""
    from engine.bench.metrics import compare_reports
    side_a = a if isinstance(a, RunSide) else load_side(a)
    side_b = b if isinstance(b, RunSide) else load_side(b)
    diffs, notes = differences(side_a, side_b)
    out = ReportComparison(side_a, side_b, diffs, notes, allow_different_workloads,
                           workload=[d for d in diffs if d.kind == WORKLOAD])
    if not out.refused:
        out.deltas = compare_reports(side_a.measured, side_b.measured)
    return out


def differences(a: RunSide, b: RunSide) -> tuple[list[Difference], list[str]]:
    """Every difference that matters (workload, kernel, noted), workload first, and the notes."""
    notes = [f"{name}: {side.config_note}" for name, side in (("A", a), ("B", b)) if side.config_note]
    both_config = a.config is not None and b.config is not None
    diffs: list[Difference] = []
    if both_config:
        diffs += _config_differences(a, b)
    fa, fb = _report_facts(a, both_config), _report_facts(b, both_config)
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va == vb:
            continue
        if (va is None or vb is None) and not key.startswith(("server.kernels.", "server.env.", "envs.")):
            # a key an older report does not have: not known to differ (a kernel or variable absent is unset)
            diffs.append(Difference(key, va, vb, NOTED, f"not recorded in {'A' if va is None else 'B'}'s report"))
            continue
        kind, why = _classify_report(key, va, vb)
        if kind is not None:
            diffs.append(Difference(key, va, vb, kind, why))
    pa, pb = a.report.get("provenance"), b.report.get("provenance")
    if isinstance(pa, dict) and isinstance(pb, dict):
        for key, (kind, why) in _PROVENANCE.items():
            va, vb = pa.get(key), pb.get(key)
            if va == vb:
                continue
            if va is None or vb is None:  # unknown on one side: it may not differ
                diffs.append(Difference(f"provenance.{key}", va, vb, NOTED, f"{why}: not known on one side"))
            else:
                diffs.append(Difference(f"provenance.{key}", va, vb, kind, why))
    else:
        missing = [n for n, p in (("A", pa), ("B", pb)) if not isinstance(p, dict)]
        notes.append(f"{' and '.join(missing)}: no provenance in the report (written before it was recorded): "
                     "framework version, model revision and GPU are not compared")
    order = {WORKLOAD: 0, KERNEL: 1, NOTED: 2}
    # Stable: the run kind first (a profiled side is the commonest mistake), then each kind in field order.
    headline = {"run_kind": 0, "profiling_enabled": 1}
    diffs.sort(key=lambda d: (order[d.kind], headline.get(d.field, 2)))
    return diffs, notes


def _flatten(d: Any, prefix: str) -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}"))
        return out
    return {prefix: d if d != {} else None}


def effective_envs(side: RunSide) -> dict[str, str]:
    """The envs the run used: the report's (effective) ones, else the config's with Magpie's defaults."""
    envs = side.report.get("envs")
    if isinstance(envs, dict) and envs:
        return {str(k): str(v) for k, v in envs.items()}
    from engine.config.benchmark import DEFAULT_ENVS
    raw = {str(k).upper(): str(v) for k, v in ((side.config or {}).get("envs") or {}).items()}
    out = dict(DEFAULT_ENVS) if not raw else dict(raw)
    for k, v in DEFAULT_ENVS.items():
        out.setdefault(k, v)
    out.setdefault("NUM_PROMPTS", str(int(out["CONC"]) * 10) if out["CONC"].isdigit() else "320")
    return out


def _profiles(config: dict) -> bool:
    return bool(((config.get("profiler") or {}).get("torch_profiler") or {}).get("enabled"))


def _config_differences(a: RunSide, b: RunSide) -> list[Difference]:
    ca = {k: v for k, v in (a.config or {}).items() if k != "envs"}
    cb = {k: v for k, v in (b.config or {}).items() if k != "envs"}
    fa = _flatten(ca, "benchmark")
    fb = _flatten(cb, "benchmark")
    fa.update(_flatten(effective_envs(a), "benchmark.envs"))
    fb.update(_flatten(effective_envs(b), "benchmark.envs"))
    defaults = _config_defaults()
    for flat in (fa, fb):  # a key an older config lacks counts as its default (new keys keep the old behaviour)
        for key, value in defaults.items():
            if key not in flat and not any(k.startswith(key + ".") for k in flat):
                flat[key] = value
    profiling = _profiles(a.config or {}) or _profiles(b.config or {})
    framework = str((a.config or {}).get("framework") or "")
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va == vb:
            continue
        kind, why = classify_config_field(key[len("benchmark."):], va, vb, profiling=profiling, framework=framework)
        if kind is not None:
            out.append(Difference(key, va, vb, kind, why))
    return out


def _config_defaults() -> dict[str, Any]:
    """Every config field's default, flattened (``benchmark.client.repeats``: 1, ...)."""
    from engine.config.benchmark import BenchmarkConfig
    try:
        data = BenchmarkConfig.model_construct(framework="builtin").model_dump(by_alias=True, warnings=False)
    except Exception:  # a model that cannot be built without its fields: no defaults, keys compare as given
        return {}
    data.pop("framework", None)
    data.pop("envs", None)
    return _flatten(data, "benchmark")


def classify_config_field(name: str, a: Any, b: Any, *, profiling: bool = False,
                          framework: str = "") -> tuple[Optional[str], str]:
    """(kind, why) of a differing config field (``name`` without ``benchmark.``); kind None: ignored."""
    head = name.split(".")[0]
    if name in _IGNORED_EXACT:
        return None, ""
    if name.startswith("server.kernels.") or name == "server.kernels":
        return KERNEL, "the server's kernels"
    if head == "server_env":
        return _classify_env(name.split(".", 1)[1] if "." in name else "", a, b, framework)
    if name.startswith("gap_analysis.") and name != "gap_analysis.enabled":
        return None, ""
    if name.startswith("profiler.tracelens.") and name != "profiler.tracelens.enabled":
        return None, ""
    if name.startswith("profiler.torch_profiler.") and name != "profiler.torch_profiler.enabled":
        return (WORKLOAD, "how the profiled side is profiled") if profiling else (None, "")
    if name in ("profiler.torch_profiler.enabled", "profiler.tracelens.enabled", "gap_analysis.enabled"):
        return WORKLOAD, "a diagnostic (profiled) run: profiling perturbs latency"
    for prefix, why in _NOTED.items():
        if name == prefix or name.startswith(prefix + "."):
            return NOTED, why
    return WORKLOAD, ""


def _classify_env(var: str, a: Any, b: Any, framework: str = "") -> tuple[Optional[str], str]:
    if var in _VISIBILITY:
        return None, ""
    if var == "VLLM_PLUGINS":
        return KERNEL, "selects the vLLM plugins (the loop's kernel plugin)"
    if var == "PYTHONPATH":
        return _classify_pythonpath(a, b)
    return WORKLOAD, "the server's environment"


def _classify_pythonpath(a: Any, b: Any) -> tuple[str, str]:
    pa = [p for p in str(a or "").split(os.pathsep) if p]
    pb = [p for p in str(b or "").split(os.pathsep) if p]
    small, large = (pa, pb) if len(pa) <= len(pb) else (pb, pa)
    if not set(small) <= set(large):
        return WORKLOAD, "PYTHONPATH does not only add folders: the server's code may differ"
    added = [p for p in large if p not in small]
    holding = [f"{p}/{pkg}" for p in added for pkg in _SERVER_PACKAGES if (Path(p) / pkg).exists()]
    if holding:
        return WORKLOAD, f"an added PYTHONPATH folder holds the server's own code ({', '.join(holding)})"
    return KERNEL, "PYTHONPATH only adds folders (a kernel plugin)"


def _report_facts(side: RunSide, with_config: bool) -> dict[str, Any]:
    """The report keys compared besides the config (and in place of it without one)."""
    r = side.report
    server = r.get("server") if isinstance(r.get("server"), dict) else {}
    argv = server.get("argv") if isinstance(server.get("argv"), list) else None
    facts: dict[str, Any] = {
        "run_kind": r.get("run_kind"), "profiling_enabled": r.get("profiling_enabled"),
        "server.image": server.get("image"),
        "server.executable": argv[0] if argv else None,
    }
    for sect in ("dataset", "environment"):
        part = r.get(sect) if isinstance(r.get(sect), dict) else {}
        for key in _REPORT_WORKLOAD + _REPORT_FALLBACK:
            if key.startswith(sect + "."):
                facts[key] = part.get(key.split(".", 1)[1])
    if with_config:
        return {k: v for k, v in facts.items() if k in _REPORT_WORKLOAD}
    facts.update({"framework": r.get("framework"), "model": r.get("model"),
                  "server.run_mode": server.get("run_mode"), "server.launched": server.get("launched")})
    envs = r.get("envs") if isinstance(r.get("envs"), dict) else {}
    facts.update({f"envs.{k}": str(v) for k, v in envs.items()})
    if argv:
        kernels, rest = _split_argv(argv[1:])
        facts["server.args"] = rest
        facts.update({f"server.kernels.{k}": v for k, v in kernels.items()})
    env = server.get("env") if isinstance(server.get("env"), dict) else {}
    facts.update({f"server.env.{k}": str(v) for k, v in env.items() if k not in _PER_RUN_ENV})
    points = [p.get("point") for p in (r.get("sweep") or []) if isinstance(p, dict)]
    facts["sweep_points"] = points or None
    return facts


def _split_argv(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the built-in server's --kernel OP=PATH pairs, the other args with per-run values blanked)."""
    kernels: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = str(args[i])
        if arg == "--kernel" and i + 1 < len(args):
            op, _, path = str(args[i + 1]).partition("=")
            kernels[op] = path
            i += 2
            continue
        rest.append(arg)
        if arg in _PER_RUN_FLAGS and i + 1 < len(args):
            rest.append("<per run>")
            i += 1
        i += 1
    return kernels, rest


def _classify_report(key: str, a: Any, b: Any) -> tuple[Optional[str], str]:
    if key in ("run_kind", "profiling_enabled"):
        return WORKLOAD, "a diagnostic (profiled) run: profiling perturbs latency"
    if key.startswith("server.kernels."):
        return KERNEL, "the server's kernels (--kernel)"
    if key.startswith("server.env."):
        return _classify_env(key[len("server.env."):], a, b)
    if key == "server.launched":
        return WORKLOAD, "one side measured a server it did not start (--base-url)"
    if key.startswith("environment.") and key.split(".", 1)[1] in ("python", "platform", "host"):
        return WORKLOAD, "another machine or Python"
    return WORKLOAD, ""
