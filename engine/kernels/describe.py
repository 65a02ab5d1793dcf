"""An evaluation plan as plain data and as lines: what ``magpie analyze|compare --dry-run`` shows.

``describe_plan`` says, for every kernel, where it runs (the resolved working_dir and why), what
runs (its files and commands, and whether each command's program is there), with which
environment variables, how its correctness is judged and how it is timed, and the run's
baseline and environment. Everything is JSON-ready, so a front end other than the command line
(an MCP tool, the workbench) can return or show it as it is.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Any, Optional

from engine.runs.process import command_text

_SHELL_WORDS = {"cd", "export", "source", ".", "set", "true", "false", "echo", "exit", "test", "[", "if", "for",
                "while", "env", "exec", "time", "sh", "bash"}


def _program(cmd: Any) -> Optional[str]:
    """The program a command starts (the first word that is not an assignment), or None for a
    shell builtin."""
    if isinstance(cmd, str):
        try:
            words = shlex.split(cmd)
        except ValueError:
            words = cmd.split()
    else:
        words = [str(a) for a in cmd]
    for w in words:
        if "=" in w and not w.startswith(("/", ".")) and w.split("=", 1)[0].isidentifier():
            continue  # VAR=value prefix
        return None if w in _SHELL_WORDS else w
    return None


def _tool_check(cmd: Any, k: Any) -> Optional[dict]:
    prog = _program(cmd)
    if not prog:
        return None
    if "/" in prog:
        path = Path(prog).expanduser()
        path = path if path.is_absolute() else Path(k.working_dir) / path
        return {"program": prog, "found": str(path) if path.exists() else None,
                "missing": None if path.exists() else f"{prog}: not in {k.working_dir} (yet: a compile_command "
                                                      "or the config's prerequisite step must build it)"}
    found = shutil.which(prog, path=(k.env.get("PATH") or os.environ.get("PATH")))
    return {"program": prog, "found": found,
            "missing": None if found else f"{prog}: not found on PATH (install it or add its folder to PATH)"}


def _commands(k: Any, local: bool) -> dict:
    out = {}
    for name, cmds in (("compile_command", k.compile), ("testcase_command", k.testcase), ("prof_command", k.prof)):
        out[name] = [{"command": command_text(c), "shell": isinstance(c, str),
                      "tool": _tool_check(c, k) if local else None} for c in cmds]
    return out


def _tolerances(s: Any) -> str:
    rtol = "by dtype" if s.rtol is None else f"{s.rtol:g}"
    atol = "by dtype" if s.atol is None else f"{s.atol:g}"
    return f"rtol {rtol}, atol {atol}"


def _correctness(plan: Any, k: Any) -> dict:
    s = plan.settings
    backend = s.correctness_backend
    if backend == "accordo":
        from engine.kernels import accordo
        acc = s.accordo or {}
        program = accordo.find_accordo()
        timeout = accordo.accordo_timeout(acc, s.perf_timeout_s)
        cmd = accordo.accordo_command(program or accordo.ACCORDO_PROGRAM, acc, accordo.binaries_dir(acc, k.working_dir),
                                      timeout) if acc.get("kernel_name") else []
        return {"backend": "accordo", "checks": ["IntelliKit Accordo: the outputs of kernel "
                                                 f"{acc.get('kernel_name')!r} in {acc.get('optimized_binary')} vs "
                                                 f"{acc.get('reference_binary')}, atol {acc.get('atol')}, "
                                                 f"rtol {acc.get('rtol')}" + (", NaN == NaN" if acc.get('equal_nan') else "")],
                "accordo": {**acc, "command": command_text(cmd) if cmd else None, "program": program},
                "environment": None if program else accordo.not_installed_message()}
    checks = []
    if k.testcase and backend != "harness":
        times = f" ({s.iteration_count} times)" if s.iteration_count > 1 else ""
        checks.append(f"testcase: every testcase_command exits 0{times}")
    if k.harness and backend in ("auto", "harness"):
        seeds = (f"{s.n_seeds} input sets from seeds {s.seed}..{s.seed + s.n_seeds - 1}" if s.seed is not None
                 else f"{s.n_seeds} input sets from hidden seeds")
        if k.reference_file is not None:  # in a compare, every entry carries the one reference_file
            what = f"outputs vs reference_file {k.reference_file}'s Model"
        elif plan.mode == "compare":
            base = plan.kernels[plan.baseline_index] if plan.baseline_index is not None else None
            what = ("the reference the others are compared with (its own outputs self-checked)" if k.baseline else
                    f"outputs vs the baseline {base.id if base else '?'}")
        else:
            what = "self-check (finite, fully written, repeatable outputs)"
        from engine.kernels.distributions import DISTRIBUTIONS
        checks.append(f"harness: {what}, {_tolerances(s)}, {seeds}, plus the first set redrawn from "
                      f"{' and '.join(DISTRIBUTIONS)} distributions (correctness only; unless the inputs module sets "
                      "INPUT_DISTRIBUTIONS)")
    return {"backend": backend, "checks": checks, "rtol": s.rtol, "atol": s.atol, "seeds": s.n_seeds,
            "iteration_count": s.iteration_count, "environment": None}


def _timing(plan: Any, k: Any) -> dict:
    s = plan.settings
    if not s.perf_enabled:
        return {"backend": "none", "how": "not timed (--no-perf or performance.backend none)"}
    own = f"in {s.rounds} processes, interleaved round by round with the other kernels that time themselves"
    if s.perf_backend != "auto":
        how = f"performance.backend {s.perf_backend}"
        if s.perf_backend in ("timing_json", "prof_command"):
            how += f", {own}"
        return {"backend": s.perf_backend, "how": how}
    if k.prof:
        return {"backend": "prof_command", "how": f"the entry's prof_command (its MAGPIE_TIMING_JSON line), {own}"}
    if k.harness and s.correctness_backend in ("auto", "harness"):
        timer = {"auto": "trace", "trace": "trace"}.get(s.timer, s.timer)
        return {"backend": "harness", "how": f"the Python harness, {s.rounds} interleaved rounds; on a GPU timer "
                                             f"{timer}, on the CPU perf_counter"}
    if not k.testcase:
        return {"backend": "unavailable", "how": "nothing to time: no testcase_command, prof_command or harness module"}
    ncu, rocprof = shutil.which("ncu"), shutil.which("rocprofv3")
    found = ", ".join(f"{n} {'found' if p else 'not on PATH'}" for n, p in (("ncu", ncu), ("rocprofv3", rocprof)))
    return {"backend": "auto", "how": f"the testcase's MAGPIE_TIMING_JSON line if it prints one ({own}), else ncu "
                                      f"(NVIDIA) or rocprofv3 (AMD) around the first testcase command ({found})"}


def describe_plan(plan: Any) -> dict:
    """The plan as plain data."""
    local = plan.environment == "local"
    kernels = []
    for k in plan.kernels:
        harness = None
        if k.harness:
            harness = {"module": str(k.module_file), "get_inputs": k.get_inputs_func,
                       ("function" if k.call_function else "class"): k.model_class or "ModelNew, else Model"}
        kernels.append({
            "index": k.index, "id": k.id, "type": k.type, "baseline": bool(k.baseline), "origin": k.origin,
            "working_dir": str(k.working_dir), "working_dir_from": k.working_dir_from,
            "source_files": [str(f) for f in k.source_files],
            "reference_file": str(k.reference_file) if k.reference_file else None,
            **_commands(k, local), "env": dict(k.env), "pythonpath": [str(p) for p in k.pythonpath],
            "harness": harness, "correctness": _correctness(plan, k), "timing": _timing(plan, k),
        })
    checks = []
    for kd in kernels:
        for name in ("compile_command", "testcase_command", "prof_command"):
            for i, c in enumerate(kd[name], 1):
                missing = (c["tool"] or {}).get("missing")
                if missing:
                    checks.append(f"{kd['id']}.{name} {i}: {missing}")
        if kd["correctness"].get("environment"):
            checks.append(f"{kd['id']}.correctness: {kd['correctness']['environment']}")
    b = plan.baseline_index
    s = plan.settings
    return {
        "mode": plan.mode,
        "config_file": str(plan.config_file) if plan.config_file else None,
        "cwd": str(plan.cwd) if plan.cwd else None,
        "environment": plan.environment,
        "scheduler": plan.scheduler.model_dump() if plan.scheduler is not None else None,
        "baseline": None if b is None else {"index": b, "id": plan.kernels[b].id, "chosen_by": plan.baseline_source},
        "settings": {"correctness_backend": s.correctness_backend, "performance_backend": s.perf_backend,
                     "perf_enabled": s.perf_enabled, "timer": s.timer, "repeats": s.repeats, "warmup": s.warmup,
                     "rounds": s.rounds, "seed": s.seed, "seeds": s.n_seeds, "rtol": s.rtol, "atol": s.atol,
                     "compile_timeout_s": s.compile_timeout_s, "correctness_timeout_s": s.correctness_timeout_s,
                     "perf_timeout_s": s.perf_timeout_s, "workers": s.workers, "tie_margin": s.tie_margin},
        "kernels": kernels,
        "environment_checks": checks,
        "notes": list(plan.notes),
        "warnings": list(plan.warnings),
        "overrides": list(plan.overrides),
    }


def plan_lines(d: dict) -> list[str]:
    """``describe_plan``'s data as the lines ``--dry-run`` prints."""
    lines = [f"magpie {d['mode']} --dry-run: checked; nothing was started and no run folder was created"]
    if d["config_file"]:
        lines.append(f"config: {d['config_file']}")
    if d["cwd"]:
        lines.append(f"current directory: {d['cwd']} (relative working_dir and latency.pythonpath resolve here)")
    env = d["environment"]
    if d["scheduler"]:
        keys = {k: v for k, v in d["scheduler"].items() if v not in (None, {}, [], "")}
        env += " (" + ", ".join(f"{k}={v}" for k, v in keys.items()) + ")"
    lines.append(f"environment: {env}")
    if d["baseline"]:
        bl = d["baseline"]
        lines.append(f"baseline: {bl['id']} (index {bl['index']}, chosen by {bl['chosen_by']})")
    s = d["settings"]
    lines.append(f"settings: correctness.backend {s['correctness_backend']}, performance.backend "
                 f"{s['performance_backend'] if s['perf_enabled'] else 'none'}, timer {s['timer']}, "
                 f"repeats {s['repeats'] or 'auto'}, warmup {s['warmup'] if s['warmup'] is not None else 'default'}, "
                 f"rounds {s['rounds']}, seed {s['seed'] if s['seed'] is not None else 'hidden'}, "
                 f"timeouts compile/correctness/performance {s['compile_timeout_s']:g}/"
                 f"{s['correctness_timeout_s']:g}/{s['perf_timeout_s']:g} s, workers {s['workers']}")
    for k in d["kernels"]:
        lines.append(f"kernel {k['index']}: {k['id']} ({k['type']})" + (" [baseline]" if k["baseline"] else ""))
        lines.append(f"  defined at: {k['origin']}")
        lines.append(f"  working_dir: {k['working_dir']}  <- {k['working_dir_from']}")
        lines.append(f"  source_files: {', '.join(k['source_files']) or '(none)'}")
        if k["reference_file"]:
            lines.append(f"  reference_file: {k['reference_file']}")
        for name in ("compile_command", "testcase_command", "prof_command"):
            cmds = k[name]
            if not cmds:
                lines.append(f"  {name}: (none)")
            for i, c in enumerate(cmds, 1):
                tool = c["tool"]
                mark = f"   [{tool['missing']}]" if tool and tool["missing"] else ""
                num = f" {i}/{len(cmds)}" if len(cmds) > 1 else ""
                lines.append(f"  {name}{num}: {c['command']}{'' if c['shell'] else '   (argv, no shell)'}{mark}")
        lines.append("  env: " + (", ".join(f"{n}={v}" for n, v in k["env"].items()) or "(none)"))
        if k["pythonpath"]:
            lines.append(f"  pythonpath: {os.pathsep.join(k['pythonpath'])}")
        if k["harness"]:
            h = k["harness"]
            what = f"function {h['function']}" if "function" in h else f"class {h['class']}"
            lines.append(f"  harness module: {h['module']} ({what}, inputs {h['get_inputs']}())")
        c = k["correctness"]
        checks = "; ".join(c["checks"]) or "(none)"
        lines.append(f"  correctness ({c['backend']}): {checks}")
        if c.get("accordo") and c["accordo"].get("command"):
            lines.append(f"  accordo command: {c['accordo']['command']}")
        if c.get("environment"):
            lines.append(f"  correctness: {c['environment']}")
        t = k["timing"]
        lines.append(f"  timing ({t['backend']}): {t['how']}")
    for title, key in (("environment checks (the run would start; these would fail or not be judged)",
                        "environment_checks"), ("notes (Magpie fields mapped onto this tool's settings)", "notes"),
                       ("warnings", "warnings")):
        if d[key]:
            lines.append(f"{title}:")
            lines += [f"  - {x}" for x in d[key]]
    if d["overrides"]:
        lines.append("overrides (command line over the YAML):")
        lines += [f"  - {o['field']}: {o['yaml']!r} -> {o['cli']!r} ({o['flag']})" for o in d["overrides"]]
    return lines
