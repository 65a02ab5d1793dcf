"""Starting runs from the workbench: a typed request of the job API (``engine.jobs.requests``),
submitted to its detached local-process executor, so the run outlives the workbench.

``StartedRun`` is what the workbench keeps of a run it started: the process (to tell whether it
still runs), the equivalent command line it showed, and the console log of the process.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass
class StartedRun:
    process: Any  # subprocess.Popen of the job's process
    argv: list[str]  # the equivalent command line
    console_log: Path
    started: float
    run_dir: Optional[Path] = None

    @property
    def pid(self) -> int:
        return self.process.pid


def start_run(request: Any, output_dir: Optional[Path] = None, prepared: Any = None) -> StartedRun:
    """Submit ``request`` to the job API's detached local-process executor (run folder under
    ``output_dir``; a loop resume goes beside its loop folder); the console output goes to
    ``<output>/.console/<stamp>_<pid>.log``. ``prepared``: the preview's own ``request.prepare()``,
    run as it was shown (not checked again)."""
    from engine.jobs import api  # looked up when called: tests replace api.submit
    from engine.jobs.launch import command_line, launch_cwd, launch_output_dir
    output = launch_output_dir(request, output_dir)
    job = api.submit(request, output, executor="local-process", cwd=launch_cwd(request), prepared=prepared)
    ex = job.execution
    return StartedRun(process=ex.process, argv=command_line(request, output, python=sys.executable),
                      console_log=ex.console_log, started=time.time(), run_dir=job.run_dir)
