"""The project's checks in one command: ``python tests/run.py [PYTEST ARGS...]``.

1. lint: ``ruff check .`` (settings in pyproject.toml);
2. the suite but the timed verdicts, on pytest workers (one test file at a time per worker; one
   worker more than the machine has cores, as the tests often wait on the servers and commands
   they start: on two cores 3 workers kept the CPU 97% busy where 2 left a quarter of it idle);
3. the timed verdicts a busy machine could turn (``serial``: ties of identical kernels and close
   speedups measured on this machine) alone, so that no other test is noise in their timings;
   verdicts far apart (a 9x kernel, 3x the work) run in step 2.

Every step runs even when an earlier one failed (a failure in one says nothing about the others),
each step's result and time are printed at the end, and the exit status is non-zero when any step
failed. Extra arguments go to both pytest runs (e.g. ``--durations=20`` or ``-x``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def workers() -> int:
    return max(2, min(8, (os.cpu_count() or 2) + 1))


def serial_files() -> list[str]:
    """The test files that mark any test ``serial``: the serial step collects only these (collecting
    the whole suite to deselect all but 30 tests took 8.7 s of CPU, these 3.3 s)."""
    marked = re.compile(r"\bmark\.serial\b")
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if marked.search(p.read_text()))


def steps(pytest_args: list[str]) -> list[tuple[str, list[str]]]:
    py = sys.executable
    n = workers()
    # Paths or test ids given by the caller choose what runs; otherwise the serial step names its files.
    chosen = any(not a.startswith("-") for a in pytest_args)
    return [
        ("lint (ruff)", [py, "-m", "ruff", "check", "."]),
        (f"tests, {n} workers (not serial)", [py, "-m", "pytest", "-q", "-n", str(n), "--dist", "loadfile",
                                              "-m", "not serial", *pytest_args]),
        ("timed verdicts, alone (serial)", [py, "-m", "pytest", "-q", "-m", "serial", *pytest_args,
                                            *([] if chosen else serial_files())]),
    ]


def step_env() -> dict[str, str]:
    """The environment of the steps. Bytecode is cached (in git-ignored ``__pycache__`` folders)
    even where PYTHONDONTWRITEBYTECODE says otherwise: without the cache every pytest process
    rewrote all test modules' asserts again (collection 19 s instead of 4) and every command a
    test starts compiled the engine's modules again."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def main(argv: list[str]) -> int:
    results = []
    env = step_env()
    for name, cmd in steps(argv):
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        code = subprocess.call(cmd, cwd=REPO, env=env)
        results.append((name, code, time.monotonic() - started))
    print("\n=== summary")
    for name, code, took in results:
        print(f"{'passed' if code == 0 else f'FAILED (exit {code})':<16} {took:6.0f} s  {name}")
    failed = [name for name, code, _ in results if code != 0]
    print("all passed" if not failed else f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
