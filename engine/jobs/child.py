"""``python -m engine.jobs.child RUN_DIR [REQUEST_FILE]``: run the request recorded in a run folder.

The local-process executor starts this detached; a container or a Ray worker can run the same
line where the run folder is visible. SIGTERM, SIGINT and SIGHUP cancel (the report is still
written). A request that no longer checks out (its config changed since it was submitted) ends
the run as failed, with the problems in its events, never as a folder left pending.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from engine.errors import MagpieError, format_error
from engine.jobs.executors import release_cancel_signals
from engine.jobs.modes import EXIT_FAIL, run_request
from engine.jobs.requests import REQUEST_FILE, load_prepared, notices, read_request
from engine.runs.process import CancelToken, install_signal_handlers
from engine.runs.workspace import Workspace


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m engine.jobs.child RUN_DIR [REQUEST_FILE]", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    request_file = args[1] if len(args) > 1 else REQUEST_FILE
    cancel = CancelToken()
    install_signal_handlers(cancel)
    release_cancel_signals()  # a cancel sent while this process started is handled now
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    ws = Workspace(run_dir)
    try:
        request = read_request(run_dir / request_file)
        # What submit() checked, when it kept it; else (a request written by hand, an older
        # folder) checked here.
        prepared = load_prepared(run_dir, request_file, request) or request.prepare()
    except MagpieError as exc:
        log(format_error(exc))
        ws.events.emit("run_started", pid=os.getpid(), workspace=str(run_dir), mode="?")
        ws.events.emit("run_finished", state="failed", exit_code=EXIT_FAIL, error=format_error(exc))
        ws.events.close()
        return EXIT_FAIL
    for line in notices(prepared):
        log(line)
    kw: dict = {"log": log} if request.mode in ("benchmark", "trace", "trace_diff", "optimize") else {}
    if request.mode in ("analyze", "compare"):  # the console says each kernel's stage as it happens
        kw["sink"] = _stage_lines(log)
    outcome = run_request(request, cancel=cancel, workspace=ws, prepared=prepared, **kw)
    summary = run_dir / "summary.txt"
    if summary.is_file():
        log(summary.read_text())
    log(f"workspace: {run_dir} ({outcome.state}, exit {outcome.exit_code})")
    return outcome.exit_code


def _stage_lines(log):
    from engine.runs.state import stage_line

    def sink(event: dict) -> None:
        line = stage_line(event, verbose=True)
        if line is not None:
            log(line)
    return sink


if __name__ == "__main__":
    sys.exit(main())
