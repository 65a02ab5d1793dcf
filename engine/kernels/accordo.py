"""Magpie's ``correctness.backend: accordo``: IntelliKit Accordo's ``accordo validate`` command.

Accordo intercepts one GPU kernel (``kernel_name``) in a reference binary and an optimized
binary at the HSA level and compares the output buffers they wrote (``atol``/``rtol``). The
command line and its JSON answer are Magpie's: the CLI runs with the run's own folder as its
current directory and the binaries' folder as ``--working-dir``; a kernel is correct when the
JSON says ``is_valid``. Without the ``accordo`` program the kernel is not judged: that is a
problem of the machine (``ENVIRONMENT``), never a verdict on the kernel.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

ACCORDO_PROGRAM = "accordo"
INSTALL_HINT = ("install IntelliKit Accordo (pip install \"git+https://github.com/AMDResearch/intellikit.git"
                "#subdirectory=accordo\") so that 'accordo' is on PATH, or use correctness.backend harness or testcase")
DEFAULT_TIMEOUT_S = 300


def find_accordo() -> Optional[str]:
    return shutil.which(ACCORDO_PROGRAM)


def not_installed_message() -> str:
    return f"environment: '{ACCORDO_PROGRAM}' is not on PATH, so Accordo could not judge this kernel: {INSTALL_HINT}"


def accordo_timeout(acc: dict, perf_timeout_s: Optional[float]) -> int:
    """Accordo's per-capture timeout: its own, else the performance timeout, else 300 s (Magpie's order)."""
    return int(acc.get("timeout_seconds") or perf_timeout_s or DEFAULT_TIMEOUT_S)


def accordo_command(program: str, acc: dict, binaries_dir: Path, timeout_s: int) -> list[str]:
    """``accordo validate ...`` with Magpie's arguments."""
    cmd = [program, "validate", "--kernel-name", str(acc["kernel_name"]),
           "--ref-binary", str(acc["reference_binary"]), "--opt-binary", str(acc["optimized_binary"]),
           "--atol", str(acc["atol"]), "--rtol", str(acc["rtol"]), "--timeout", str(timeout_s),
           "--working-dir", str(binaries_dir), "--log-level", "INFO"]
    if acc.get("equal_nan"):
        cmd.append("--equal-nan")
    if acc.get("kernel_args"):
        cmd += ["--kernel-args", ",".join(f"{name}:{typ}" for name, typ in acc["kernel_args"])]
    return cmd


def binaries_dir(acc: dict, kernel_working_dir: Path) -> Path:
    return Path(acc.get("working_directory") or kernel_working_dir).resolve()


def parse_accordo_output(returncode: Optional[int], stdout: str, stderr: str) -> dict:
    """``{"valid": bool | None, "error": str | None, ...}`` from the CLI's exit code and output:
    a non-zero exit is an Accordo error (its JSON ``error`` or its output), exit 0 carries the
    JSON verdict (the object between the first ``{`` and the last ``}``)."""
    text = stdout.strip()
    if returncode != 0:
        try:
            msg = json.loads(text).get("error") or text
        except (ValueError, AttributeError):
            msg = text or stderr.strip()
        return {"valid": None, "error": f"accordo exited with code {returncode}: {str(msg)[-1500:]}"}
    start, end = text.find("{"), text.rfind("}") + 1
    try:
        if start < 0 or end <= start:
            raise ValueError("no JSON object")
        data: Any = json.loads(text[start:end])
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        return {"valid": None, "error": f"accordo printed no JSON verdict: {text[:500]!r}"}
    valid = bool(data.get("is_valid", False))
    out = {"valid": valid, "error": None, "num_arrays_validated": data.get("num_arrays_validated"),
           "matched_arrays": list(data.get("matched_arrays") or {}),
           "num_mismatches": data.get("num_mismatches"), "mismatches": list(data.get("mismatches") or [])}
    if not valid:
        first = out["mismatches"][0] if out["mismatches"] else {}
        out["reason"] = (data.get("error_message") or
                         (f"output {first.get('arg_name', '?')} differs (max difference "
                          f"{first.get('max_difference')})" if first else "Accordo found mismatching outputs"))
    return out
