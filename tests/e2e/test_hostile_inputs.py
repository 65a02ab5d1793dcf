"""No input takes the machine down: hostile files through the real loaders, the real command line,
the run catalog, the workbench's config check and the MCP tools, each refused within seconds with
an error that names the file (issue 30).

Whatever could hang (a FIFO, /dev/zero) runs under ``within``: a regression fails the test
instead of hanging the suite."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, run_magpie

from engine.config.yamlfile import (
    MAX_ALIAS_NODES, MAX_CONFIG_BYTES, MAX_YAML_DEPTH, ConfigError, load_located_yaml, load_yaml_file,
)

DEV_ZERO = Path("/dev/zero")
needs_dev_zero = pytest.mark.skipif(not DEV_ZERO.exists(), reason="no /dev/zero")
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")


def within(seconds: float, fn, *args, fifos: tuple[Path, ...] = ()):
    """``fn(*args)`` on a thread; a failure when it has not returned after ``seconds`` (the FIFOs
    are then opened for writing, which unblocks a reader stuck on them, so the thread ends)."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # handed to the test
            out["error"] = exc
    t = threading.Thread(target=go, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(seconds)
    if t.is_alive():
        for f in fifos:
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"{getattr(fn, '__name__', fn)} still running after {seconds} s (hung on a hostile file)")
    if "error" in out:
        raise out["error"]
    return out.get("value"), time.monotonic() - started


def alias_bomb(path: Path) -> Path:
    """The "billion laughs": ten levels of nine aliases each, 9**10 strings from under 600 bytes."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for name in "bcdefghij":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    lines.append("kernel: *j")
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 600
    return path


def refused(fn, path, *needles: str, error: type = ConfigError) -> str:
    """``fn(path)`` raises ``error`` naming ``path`` (and ``needles``) within seconds."""
    def attempt() -> str:
        try:
            fn(path)
        except error as exc:
            return str(exc)
        raise AssertionError(f"{path} was not refused")
    text, took = within(10, attempt)
    assert str(path) in text, text
    for needle in needles:
        assert needle in text, text
    assert took < 5, f"took {took:.1f} s to refuse"
    return text


# ---------------------------------------------------------------------------------------- YAML
def test_alias_bomb_is_refused_by_every_loader(tmp_path):
    from engine.config.benchmark import load_benchmark_config
    from engine.config.kernel import load_kernel_config
    from engine.jobs.query import check_config
    bomb = alias_bomb(tmp_path / "bomb.yaml")
    refused(load_located_yaml, bomb, f"{bomb}:6:", f"{MAX_ALIAS_NODES:,}", "alias")  # the alias that went over
    refused(load_yaml_file, bomb, "alias")
    refused(lambda p: load_kernel_config(p), bomb, "alias")
    refused(lambda p: load_benchmark_config(p, []), bomb, "alias")
    check, took = within(10, check_config, bomb)  # the workbench's Configs screen
    assert took < 5 and not check.ok and any("alias" in p for p in check.problems), check.problems


def test_aliases_within_the_budget_still_load(tmp_path):
    ok = tmp_path / "ok.yaml"
    ok.write_text("defaults: &d {type: cuda, timeout: 30}\nkernels:\n  - {<<: *d, id: a}\n  - {<<: *d, id: b}\n"
                  "shared: [*d, *d, *d]\n")
    doc = load_located_yaml(ok)
    assert doc.data["kernels"][1] == {"type": "cuda", "timeout": 30, "id": "b"}
    assert doc.line_of(("kernels", 1, "id")) == 4 and doc.line_of(("shared", 2)) == 1
    rec = tmp_path / "rec.yaml"
    rec.write_text("a: &a [1, *a]\n")
    refused(load_located_yaml, rec, "recursive", f"{rec}:1")


def test_deep_nesting_is_refused_with_line_and_limit(tmp_path):
    flow = tmp_path / "flow.yaml"
    flow.write_text("kernel: " + "[" * 10_000 + "]" * 10_000 + "\n")
    text = refused(load_located_yaml, flow, f"{flow}:1:", f"deeper than {MAX_YAML_DEPTH} levels")
    assert "Traceback" not in text
    block = tmp_path / "block.yaml"
    block.write_text("".join(" " * i + "- \n" for i in range(MAX_YAML_DEPTH + 20)))
    refused(load_located_yaml, block, f"{block}:{MAX_YAML_DEPTH + 1}:", f"deeper than {MAX_YAML_DEPTH}")
    fine = tmp_path / "fine.yaml"
    fine.write_text("x: " + "[" * 50 + "1" + "]" * 50 + "\n")
    assert load_located_yaml(fine).data["x"]


def test_binary_and_oversized_yaml_are_refused_before_parsing(tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"kernel:\n  id: x\x00\x01\x02\xff\xfe")
    refused(load_located_yaml, binary, f"{binary}:2", "binary content")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"kernel:\n  id: caf\xe9\n")
    refused(load_located_yaml, latin, f"{latin}:2", "not UTF-8")
    big = tmp_path / "big.yaml"
    with open(big, "w") as fh:
        line = "  - {id: k, source: kernels/k.py, testcase: python test.py --size 4096}\n"
        fh.write("kernels:\n" + line * (3 * MAX_CONFIG_BYTES // len(line)))
    refused(load_located_yaml, big, "MB, larger than the 1 MiB a config may be")


@needs_fifo
def test_fifo_and_directory_configs_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file \\(a FIFO\\)"):
        within(10, load_located_yaml, fifo, fifos=(fifo,))
    from engine.jobs.query import check_config
    check, _ = within(10, check_config, fifo, fifos=(fifo,))
    assert any("a FIFO" in p for p in check.problems), check.problems
    with pytest.raises(ConfigError, match="a directory"):
        load_located_yaml(tmp_path)


@needs_dev_zero
def test_cli_refuses_hostile_configs_quickly(tmp_path):
    bomb = alias_bomb(tmp_path / "bomb.yaml")
    os.mkfifo(tmp_path / "fifo.yaml")
    for args, needle in ((("analyze", "-k", bomb), "alias"), (("benchmark", "-b", bomb), "alias"),
                         (("analyze", "-k", DEV_ZERO), "a character device"),
                         (("benchmark", "-b", tmp_path / "fifo.yaml"), "a FIFO")):
        started = time.monotonic()
        proc = run_magpie(*args, "-o", tmp_path / "out", timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert time.monotonic() - started < 20
    assert not (tmp_path / "out").exists()  # refused before any run folder


def test_mcp_validate_config_refuses_the_bomb(tmp_path):
    import anyio
    from mcp import Client

    from engine.mcp.server import ServerOptions, build_server
    bomb = alias_bomb(tmp_path / "bomb.yaml")
    app = build_server(ServerOptions(roots=[tmp_path], output_dir=tmp_path / "results"))

    def call():
        async def go():
            async with Client(app) as client:
                return await client.call_tool("validate_config", {"config_path": str(bomb)})
        return anyio.run(go)
    result, took = within(20, call)
    text = result.content[0].text
    assert "alias" in text and str(bomb) in text, text
    assert took < 10


# ------------------------------------------------------------------------- run folders, scanned
def _run_folder(root: Path, name: str, **finished) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    events = [{"event": "run_started", "ts": 1.0, "pid": 1, "mode": "analyze"}]
    if finished:
        events.append({"event": "run_finished", "ts": 2.0, **finished})
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def hostile_results(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A results folder with one good run and the special files of the hostile tests: a FIFO
    named events.jsonl, one linking to /dev/zero, a FIFO and a /dev/zero link under report
    names, and an events.jsonl of one endless line."""
    results = tmp_path / "results"
    good = _run_folder(results, "analyze_good_20261206_120000_aaaaaa", state="completed", exit_code=0,
                       report="analyze_report.json")
    (good / "analyze_report.json").write_text(json.dumps({"mode": "analyze", "results": []}))
    fifo_run = results / "analyze_fifo_20261206_120001_bbbbbb"
    fifo_run.mkdir()
    os.mkfifo(fifo_run / "events.jsonl")
    zero_run = results / "analyze_zero_20261206_120002_cccccc"
    zero_run.mkdir()
    (zero_run / "events.jsonl").symlink_to(DEV_ZERO)
    fifo_report = _run_folder(results, "compare_fiforeport_20261206_120003_dddddd", state="completed",
                              exit_code=0, report="compare_report.json")
    os.mkfifo(fifo_report / "compare_report.json")
    os.mkfifo(fifo_report / "summary.txt")
    (fifo_report / "config.yaml").symlink_to(DEV_ZERO)
    long_line = _run_folder(results, "analyze_longline_20261206_120004_eeeeee")
    with open(long_line / "events.jsonl", "ab") as fh:
        fh.write(b"x" * (3 << 20))  # a line with no end, longer than any event
    return results, [fifo_run / "events.jsonl", fifo_report / "compare_report.json", fifo_report / "summary.txt"]


@needs_fifo
@needs_dev_zero
def test_catalog_skips_special_files_with_a_note(tmp_path):
    from engine.runs.catalog import RunCatalog
    results, fifos = hostile_results(tmp_path)
    catalog = RunCatalog([results])
    _, took = within(10, catalog.refresh, fifos=fifos)
    names = {r.name.split("_")[1]: r for r in catalog.sorted_runs()}
    assert set(names) == {"good", "fiforeport", "longline"}, names
    assert names["good"].state == "completed" and names["longline"].events_read == 1
    notes = "\n".join(catalog.skipped.values())
    assert "analyze_fifo_" in notes and "a FIFO" in notes, notes
    assert "analyze_zero_" in notes and "a character device" in notes, notes
    assert took < 5
    # A later refresh (the workbench polls) stays as quick and the run list stays whole.
    _, took = within(10, catalog.refresh, fifos=fifos)
    assert took < 5 and len(catalog.runs) == 3


@needs_fifo
@needs_dev_zero
def test_job_api_and_workbench_watcher_never_block(tmp_path):
    from engine.jobs import attach
    from magpie_tui.bridge import FileTail, RunsWatcher, run_title
    results, fifos = hostile_results(tmp_path)
    fifo_report = results / "compare_fiforeport_20261206_120003_dddddd"
    job = attach(fifo_report)
    assert within(10, job.result, fifos=fifos)[0] is None  # a FIFO under the report's name: no report
    assert within(10, job.state, fifos=fifos)[0] in ("completed", "lost")
    assert within(10, attach(results / "analyze_fifo_20261206_120001_bbbbbb").state, fifos=fifos)[0] != "completed"

    class Target:
        def __init__(self):
            self.messages, self.notes = [], []

        def post_message(self, message):
            self.messages.append(message)

        def notify(self, text, **_kw):
            self.notes.append(text)
    target = Target()
    watcher = RunsWatcher([results], target)
    _, took = within(15, watcher.poll, fifos=fifos)
    assert took < 10 and target.messages and len(target.messages[0].runs) == 3
    assert any("a FIFO" in n for n in target.notes) and any("a character device" in n for n in target.notes)
    info = next(r for r in watcher.catalog.runs.values() if "fiforeport" in r.name)
    assert within(10, run_title, info, fifos=fifos)[0] == info.label  # config.yaml -> /dev/zero: not read
    tail = FileTail(fifo_report / "summary.txt")
    assert within(10, tail.read_lines, fifos=fifos)[0] == []


@needs_fifo
@needs_dev_zero
def test_mcp_job_list_and_status_keep_working(tmp_path):
    import anyio
    from mcp import Client

    from engine.mcp.server import ServerOptions, build_server
    results, fifos = hostile_results(tmp_path)
    app = build_server(ServerOptions(roots=[tmp_path], output_dir=results))

    def call(tool: str, args: dict):
        async def go():
            async with Client(app) as client:
                return await client.call_tool(tool, args)
        return anyio.run(go)
    for _ in range(3):  # the hang used to pile up: every call after it waited too
        result, took = within(20, call, "job_list", {}, fifos=fifos)
        assert not result.is_error and took < 10, result.content[0].text
    listed = json.loads(result.content[0].text)
    jobs = listed["jobs"] if isinstance(listed, dict) else listed
    assert {j["job_id"].split("_")[1] for j in jobs} == {"good", "fiforeport", "longline"}, jobs
    result, _ = within(20, call, "job_status", {"job_id": "compare_fiforeport_20261206_120003_dddddd"}, fifos=fifos)
    assert not result.is_error, result.content[0].text
    result, _ = within(20, call, "job_result", {"job_id": "compare_fiforeport_20261206_120003_dddddd"}, fifos=fifos)
    assert "compare_fiforeport" in result.content[0].text


# ------------------------------------------------------------------------------------- traces
_EVENT = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 1, "tid": 7, "ts": 1.0, "dur": 2.0,
          "args": {"correlation": 1, "stream": 7}}


def _trace(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _kernels(n: int) -> list[dict]:
    return [{**_EVENT, "name": f"k{i}", "ts": 10.0 * i, "args": {"correlation": i, "stream": 7}} for i in range(n)]


def trace_refused(path: Path, *needles: str) -> str:
    from engine.trace.load import TraceError, load_trace
    return refused(load_trace, path, *needles, error=TraceError)


def test_junk_after_a_valid_first_line_is_refused_quickly(tmp_path):
    """A valid start, then 50 MB of junk: refused at the junk, not after reading it all (the
    1.4 GB original hung for minutes, re-decoding a growing window)."""
    junk = tmp_path / "junk.pt.trace.json"
    with open(junk, "w") as fh:
        fh.write('{"traceEvents": [' + json.dumps(_EVENT) + ",\n")
        block = '"' + "a" * (1 << 20)  # an unterminated string: the worst case, a value that never ends
        fh.write(block)
        for _ in range(49):
            fh.write("a" * (1 << 20))
    assert junk.stat().st_size > 50 << 20
    text = trace_refused(junk, "event 1", "byte ")
    assert "Unterminated string" in text or "runs on past" in text
    brace = tmp_path / "brace.json"
    brace.write_text('{"traceEvents": [' + json.dumps(_EVENT) + ",\n{" + "x" * (4 << 20))
    trace_refused(brace, "malformed JSON in event 1", "byte 1")
    started = time.monotonic()
    proc = run_magpie("benchmark", "--trace-dir", junk, "-o", tmp_path / "out", timeout=120)
    assert proc.returncode == 1 and "event 1" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert time.monotonic() - started < 30


def test_deeply_nested_trace_json_is_refused_not_a_traceback(tmp_path):
    from engine.trace.load import MAX_JSON_DEPTH
    deep_event = tmp_path / "deep_event.json"
    deep_event.write_text('{"traceEvents": [' + json.dumps(_EVENT) + ", " + "[" * 10_000 + "]" * 10_000 + "]}")
    trace_refused(deep_event, f"deeper than {MAX_JSON_DEPTH} levels")
    deep_args = tmp_path / "deep_args.json"
    events = _kernels(3)
    text = json.dumps({"traceEvents": events})
    deep_args.write_text(text.replace('"stream": 7}', '"stream": ' + "[" * 10_000 + "]" * 10_000 + "}", 1))
    trace_refused(deep_args, f"deeper than {MAX_JSON_DEPTH} levels")
    medium = tmp_path / "medium.json"  # deeper than the limit, shallower than Python's recursion limit
    medium.write_text(text.replace('"stream": 7}', '"stream": ' + "[" * 300 + "]" * 300 + "}", 1))
    trace_refused(medium, f"deeper than {MAX_JSON_DEPTH} levels")
    deep_top = tmp_path / "deep_top.json"
    deep_top.write_text('{"meta": ' + "{\"a\": " * 5000 + "1" + "}" * 5000 + ', "traceEvents": []}')
    trace_refused(deep_top, f"deeper than {MAX_JSON_DEPTH} levels")


@pytest.mark.parametrize("value, shown", [("1e308", "dur=1e+308"), ("NaN", "dur=nan"), ("-5", "dur=-5"),
                                          ("Infinity", "dur=inf"), ("9" * 400, "(400 digits)")])
def test_absurd_durations_are_refused_with_their_count(tmp_path, value, shown):
    text = json.dumps({"traceEvents": _kernels(20)})
    for i in (3, 11):
        text = text.replace(f'"ts": {10.0 * i}, "dur": 2.0', f'"ts": {10.0 * i}, "dur": {value}')
    path = tmp_path / "bad.json"
    path.write_text(text)
    msg = trace_refused(path, "2 event(s)", "event 3", shown)
    assert "refused" in msg
    ts = tmp_path / "bad_ts.json"
    ts.write_text(json.dumps({"traceEvents": _kernels(5)}).replace('"ts": 20.0', '"ts": 1e400'))
    trace_refused(ts, "1 event(s)", "ts=inf")


@needs_fifo
@needs_dev_zero
def test_special_files_as_traces_are_refused(tmp_path):
    fifo = tmp_path / "rank0.pt.trace.json"
    os.mkfifo(fifo)
    trace_refused(fifo, "a FIFO")
    proc = run_magpie("benchmark", "--trace-dir", DEV_ZERO, "-o", tmp_path / "out", timeout=60)
    assert proc.returncode != 0 and "a character device" in proc.stderr and "Traceback" not in proc.stderr
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.pt.trace.json").symlink_to(DEV_ZERO)
    os.mkfifo(folder / "rank1.pt.trace.json")
    _trace(folder / "rank2.pt.trace.json", _kernels(5))
    from engine.trace.discover import discover_traces
    assert [p.name for _, p in discover_traces(folder)] == ["rank2.pt.trace.json"]


def _slow_trace(path: Path, copies: int = 400) -> Path:
    """A gzip trace of ``copies`` x 2,500 events (a few MB on disk): seconds of loading."""
    block = ",".join(json.dumps({**_EVENT, "ts": 10.0 * i}) for i in range(2500)).encode() + b","
    packed = gzip.compress(block, compresslevel=1)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(b'{"traceEvents": ['))
        for _ in range(copies):
            fh.write(packed)
        fh.write(gzip.compress(json.dumps(_EVENT).encode() + b"]}"))
    return path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_trace_analysis_writes_a_cancelled_report(tmp_path, sig):
    trace = _slow_trace(tmp_path / "slow.pt.trace.json.gz")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "benchmark", "--trace-dir", str(trace), "-o", str(out)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # signal once the trace is loading
            events = list(out.glob("*/events.jsonl"))
            if events and "load rank 0" in events[0].read_text():
                break
            time.sleep(0.05)
        else:
            pytest.fail("the trace analysis never started loading")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "cancelled" in err, err
    (ws,) = [p for p in out.iterdir() if p.is_dir()]
    report = json.loads((ws / "trace_analysis_report.json").read_text())
    assert report["state"] == "cancelled" and report["cancel_reason"], report
    finished = [json.loads(line) for line in (ws / "events.jsonl").read_text().splitlines()][-1]
    assert finished["event"] == "run_finished" and finished["state"] == "cancelled" and finished["exit_code"] == 130
