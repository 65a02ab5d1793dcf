"""No input takes the machine down: hostile files through the real loaders, the real command line,
the run catalog, the workbench's config check and the MCP tools, each refused within seconds with
an error that names the file (issue 30).

Whatever could hang (a FIFO, /dev/zero) runs under ``within``: a regression fails the test
instead of hanging the suite."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import run_magpie

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


def refused(fn, path, *needles: str) -> str:
    """``fn(path)`` raises a ConfigError naming ``path`` (and ``needles``) within seconds."""
    def attempt() -> str:
        try:
            fn(path)
        except ConfigError as exc:
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
    from engine.runs.launch import check_config
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
    from engine.runs.launch import check_config
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
