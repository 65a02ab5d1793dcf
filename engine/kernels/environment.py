"""Failures of the machine, not of the kernel: out of memory, no GPU or driver, a missing
package, a kernel file that shadows a standard module.

A kernel that could not run because of one of these was never judged: it is ``not judged`` with
the cause and the fix, never ``incorrect``, and a run in which nothing could be judged ends with
exit code 2 (as a configuration error does) instead of 1. What the harness reports (an
exception and its traceback, or the tail of a dead worker's log) is read for the known
signatures below; anything else stays a failure of the kernel.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class EnvironmentCause:
    kind: str  # out_of_memory, no_gpu, missing_package, shadowed_module
    cause: str
    fix: str

    def message(self) -> str:
        return f"environment: {self.cause}: {self.fix}"


_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|HIP out of memory|out of memory|can't allocate memory|"
                  r"Cannot allocate memory|std::bad_alloc|\bMemoryError\b|hipErrorOutOfMemory|cudaErrorMemoryAllocation")
_NO_GPU = re.compile(r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|CUDA driver version is insufficient|"
                     r"no CUDA-capable device|No CUDA GPUs are available|No HIP GPUs are available|hipErrorNoDevice|"
                     r"cudaErrorNoDevice|cudaErrorInsufficientDriver|\b0 active drivers\b|"
                     r"CUDA error: no kernel image is available|NVIDIA driver on your system is too old|"
                     r"libcuda\.so[.\d]*: cannot open shared object file|libamdhip64\.so[.\d]*: cannot open shared object")
_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_TRACE_FILE = re.compile(r'File "([^"]+\.py)", line \d+')
_PARTIAL = re.compile(r"partially initialized module '([\w.]+)'")


def _stdlib_names() -> frozenset[str]:
    names = getattr(sys, "stdlib_module_names", None)  # Python 3.10+
    return frozenset(names) if names else frozenset()


def shadowing_files(folder: Path) -> list[tuple[Path, str]]:
    """Python files (or packages) directly in ``folder`` named like a standard-library module:
    with the folder first on the import path they are imported instead of it."""
    stdlib = _stdlib_names()
    found = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return found
    for p in entries:
        name = p.stem if p.suffix == ".py" else (p.name if (p / "__init__.py").is_file() else None)
        if name and name in stdlib and not name.startswith("_"):
            found.append((p, name))
    return found


def _library_frame(path: str) -> bool:
    return (path.startswith("<frozen") or "site-packages" in path or "dist-packages" in path
            or path.startswith(sys.base_prefix) or path.startswith(sys.prefix))


def _shadow_in_trace(text: str) -> Optional[EnvironmentCause]:
    """A file named like a standard module, entered from a library's frame (torch or the standard
    library importing what it thought was its own module): the kernel folder shadows it."""
    stdlib = _stdlib_names()
    partial = _PARTIAL.search(text)
    frames = _TRACE_FILE.findall(text)
    for before, path_s in zip(frames, frames[1:]):
        if _library_frame(path_s) or not _library_frame(before):
            continue
        path = Path(path_s)
        name = path.stem if path.name != "__init__.py" else path.parent.name
        if name in stdlib:
            return EnvironmentCause(
                "shadowed_module", f"{path} has the name of Python's standard module '{name}' and was imported "
                                   "instead of it" + (f" (then: partially initialized module '{partial.group(1)}')"
                                                      if partial else ""),
                f"rename {path.name} (and the imports of it)")
    return None


def classify(text: str) -> Optional[EnvironmentCause]:
    """The environment failure a harness error or a dead worker's log shows, or None."""
    if not text:
        return None
    shadow = _shadow_in_trace(text)
    if shadow is not None:
        return shadow
    no_gpu = _NO_GPU.search(text)
    if no_gpu:
        return EnvironmentCause("no_gpu", f"no usable GPU or driver here ({no_gpu.group(0)})",
                                "run it on a machine with the GPU, driver and torch build the kernel needs "
                                "(a CUDA/ROCm build of torch), or give it a CPU path")
    m = _NO_MODULE.search(text)
    if m:
        pkg = m.group(1).split(".")[0]
        return EnvironmentCause("missing_package", f"the Python package '{pkg}' is not installed where the kernel "
                                f"runs (No module named '{m.group(1)}')",
                                f"install it into the environment that runs the kernels (pip install {pkg}, or the "
                                "extra that brings it)")
    oom = _OOM.search(text)
    if oom:
        return EnvironmentCause("out_of_memory", f"out of memory ({oom.group(0)})",
                                "run it on a device with more memory, give it smaller inputs, or stop what else "
                                "holds memory on the device")
    return None
