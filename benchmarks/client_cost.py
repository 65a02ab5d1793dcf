"""Client cost and accuracy, side by side: `magpie benchmark`, `vllm bench serve` and AIPerf
(`aiperf profile`) taking turns, round by round, against one scheduled streaming server
(`benchmarks/scheduled_server.py`: first token 80 ms after the request arrives, one token every
10 ms, 64 out, one SSE event per token, one chunk per write), far below that server's own capacity.

Per client and run, the client's CPU (user + system, every thread of its process and of the
processes below it) per 1k output tokens, taken over three windows:

* whole process: from the client's start to its exit (`os.wait4`'s resource usage of the process
  and of every descendant it waited for), over every token the server sent it (its warm-up's and
  test requests' included): start-up and imports, tokenizer loading, prompt generation, warm-up,
  progress and scraper threads, metrics and report writing all count;
* from its first request: from the arrival of its first request of any kind (a test or warm-up
  request) to the server's last token of its measured requests, over the measured tokens;
* request window: from the arrival of its first measured request to that last token, over the
  measured tokens (start-up, warm-up and what comes after the last token do not count). Read by the
  server at both ends from `/proc/<pid>/stat` (threads that have ended included); the figure of the
  live threads' `schedstat` (what this script reported before) is kept beside it in the JSON.

The whole-process CPU is also split at those moments into start-up (to the first request),
warm-up (to the first measured request), the request window and the tail (after the last token).

TTFT error: the client's own mean TTFT (from its result file) minus the server's mean of (first
token written − request arrived) over the same requests, and the client's mean TTFT minus the
scheduled 80 ms. The server takes a request's arrival from the kernel's receive stamp of its
bytes and stamps each token as it writes it, so neither its own intake of a burst of requests nor
its writing of a burst of tokens is charged to the client. The error is split per request (from
each client's per-request start stamps and TTFTs: our `requests/` file, vLLM's `--save-detailed`,
AIPerf's `profile_export.jsonl`) into the time from the client's start stamp to the request's
arrival (the client's sending) and from the server's write of the first token to the client's
stamp of it (the client's reading lag).

Every client runs its shipped command line, each in a process of its own, with the same
workload (random prompts of `--input-len` tokens, `--output-len` out, `--num-prompts`, max
concurrency C, all requests at once, `ignore_eos`, the same warm-up count) and they take turns
run by run (ours, vLLM's, AIPerf, then again: `--repeats` rounds), so all see the same background
load. vLLM's client needs vLLM: the interpreter of an
environment that has it (`--vllm-python`, default the venv of the opt-in tests, made by
`tests/vllm_cpu.py install`) and a tokenizer folder (`--tokenizer`; default: the tiny model that
`tests/vllm_cpu.py model DIR` builds, made on first use). Without it only our client is measured
and the table says the peer was not run.

    python benchmarks/client_cost.py [--concurrency 128,512 --repeats 3 --client-procs 1,2 --json FILE]

`--baseline REV` adds our client as it was at git revision REV (its `engine/` from `git archive`)
as a third client taking its turn in the same rounds: a before/after of a client change measured
interleaved, on the same server and machine state, not on another day (its C modules are built
from its tree). `--clients asyncio,uvloop,vllm` runs our client on each named event loop
(`--event-loop`; uvloop where it is installed) the same way; `asyncio-py` is asyncio's loop with
its turn in Python (as where engine/_streamread.c was not built).

`floor` (`benchmarks/floor_client.c`, built with `cc` on first use) is the least a client can cost:
C, one thread, one epoll set, the same requests and connections, every read stamped and nothing
parsed, the kernel asked for an ACK every second token (as our client is once its warm-up showed
the server does not wait for ACKs: the report's `halved_acks`). What any client that reads each
token when it arrives pays on top of it is its own work; the ratio of the floor to a peer is the
lowest ratio any such client could show against that peer.

AIPerf needs its own environment (`--aiperf`, default `/tmp/aiperf-venv/bin/aiperf`: made by
`python -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0`) and a local
tokenizer folder (the same `--tokenizer`). Its requests carry random `X-Request-ID`s, so its
warm-up requests are told by order (the first `--warmup`), and its mean TTFT is read from its
`profile_export.jsonl` (the profiling phase's records). A peer that is not installed is left out and
the table says so.

`--client-procs 1,2,4` runs our client once per value (`magpie benchmark --client-procs N`): its CPU
is that of the whole process tree, so N processes are summed. The server is pinned to the last CPU
and the clients (all of a pool's processes) to the others when there are two or more; on a 2-core
machine that leaves the clients one core, where more processes cannot add CPU (`--no-pin` lets them
and the server share both).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import signal
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

DEFAULT_VENV = Path(os.environ.get("MAGPIE_VLLM_VENV", Path.home() / ".cache" / "magpie-test" / "vllm-cpu-venv"))
TINY_MODEL = Path.home() / ".cache" / "magpie-test" / "tiny-llama"
DEFAULT_AIPERF = Path("/tmp/aiperf-venv/bin/aiperf")
PEERS = ("vllm", "aiperf")


@dataclass
class Sample:
    client: str
    concurrency: int
    client_procs: int
    requests: int
    tokens: int
    cpu_ms_per_1k_tokens: float
    client_mean_ttft_ms: float
    server_mean_ttft_ms: float
    ttft_error_ms: float  # client mean TTFT - server's first-write mean
    ttft_above_schedule_ms: float  # client mean TTFT - the scheduled TTFT
    # The TTFT error in its two parts, per request over the same requests (both on one clock):
    send_to_arrival_ms: float  # the server's arrival (request read) - the client's start stamp
    write_to_read_ms: float  # the client's first-token stamp - the server's write of that token
    window_s: float
    failed: int
    load_avg: float = 0.0  # the machine's 1-minute load average when the run ended (other work on it)
    round: int = 0
    # CPU ms per 1k output tokens by window (see the module's doc); the request window is cpu_ms_per_1k_tokens
    whole_ms_per_1k: float = math.nan  # whole process life, over all the tokens it was sent
    from_first_request_ms_per_1k: float = math.nan
    window_schedstat_ms_per_1k: float = math.nan  # live threads' schedstat only (ended threads lost)
    whole_cpu_s: float = math.nan
    all_tokens: int = 0
    # the whole process's CPU (s) split at the first request, the first measured one and the last token
    startup_cpu_s: float = math.nan
    warmup_cpu_s: float = math.nan
    window_cpu_s: float = math.nan
    tail_cpu_s: float = math.nan
    wall_s: float = math.nan


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:  # noqa: S310 - our loopback server
        return json.loads(r.read())


def _post(url: str, body: dict) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60):  # noqa: S310
        pass


def start_server(args: argparse.Namespace, cpu: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(REPO / "benchmarks" / "scheduled_server.py"), "--ttft-ms", str(args.ttft_ms),
           "--itl-ms", str(args.itl_ms), "--tokens", str(args.output_len)]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"the scheduled server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def baseline_tree(rev: str) -> Path:
    """Our `engine/` as it was at `rev`, unpacked into a temporary folder (run from there, it is
    what `python -m engine.cli` imports)."""
    tree = Path(tempfile.mkdtemp(prefix="client_cost_tree_"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "engine"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for source in (tree / "engine").glob("_*.c"):  # its C modules, built as an install would build them
        name = source.stem
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        subprocess.run(["cc", "-O2", "-fPIC", "-shared", f"-I{sysconfig.get_paths()['include']}", str(source),
                        "-o", str(source.with_name(name + suffix))], check=True)
    return tree


def fixed_lengths_flag(root: Path) -> list[str]:
    """Fixed lengths in the CLI of the tree at ``root``: --vllm-range-ratio 0 where it exists (the
    --range-ratio of later revisions is Magpie's [L*r, L]), else --range-ratio 0 (vLLM's, before)."""
    cli = (root / "engine" / "cli.py").read_text()
    return ["--vllm-range-ratio", "0"] if "--vllm-range-ratio" in cli else ["--range-ratio", "0"]


def requests_of(args: argparse.Namespace, conc: int) -> int:
    """Measured requests a run sends: --num-prompts, or every turn of every session."""
    if args.sessions:
        return args.sessions[0] * args.sessions[1]
    return args.num_prompts or 4 * conc


def ours_command(args: argparse.Namespace, url: str, conc: int, procs: int, out: Path,
                 root: Path = REPO) -> tuple[list[str], Path]:
    if args.sessions:  # chat sessions, each turn on top of the whole conversation so far, as AIPerf's
        cmd = [sys.executable, "-m", "engine.cli", "benchmark", "vllm", "-m", "fake", "--base-url", url,
               "--endpoint", "chat", "--tokenizer", str(args.tokenizer), "--dataset-name", "sessions",
               "--num-sessions", str(args.sessions[0]), "--session-turns", str(args.sessions[1]),
               "--system-prompt-len", "0", "--input-len", str(args.input_len), "--output-len", str(args.output_len),
               "--concurrency", str(conc), "--warmup", str(args.warmup), "-o", str(out)]
        return cmd, out
    cmd = [sys.executable, "-m", "engine.cli", "benchmark", "vllm", "-m", "fake", "--base-url", url,
           "--tokenizer", "none", "--vocab-size", "1000", "--input-len", str(args.input_len),
           "--output-len", str(args.output_len), *fixed_lengths_flag(root),
           "--num-prompts", str(args.num_prompts or 4 * conc),
           "--concurrency", str(conc), "--warmup", str(args.warmup), "-o", str(out)]
    if procs > 1:
        cmd += ["--client-procs", str(procs)]
    return cmd, out


def vllm_command(args: argparse.Namespace, url: str, conc: int, out: Path) -> tuple[list[str], Path]:
    py = Path(args.vllm_python)
    cmd = [str(py), str(py.parent.parent / "magpie_vllm.py"), "bench", "serve", "--backend", "openai",
           "--base-url", url, "--endpoint", "/v1/completions", "--model", "fake", "--tokenizer", str(args.tokenizer),
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(args.num_prompts or 4 * conc), "--max-concurrency", str(conc), "--ignore-eos",
           "--num-warmups", str(args.warmup), "--disable-tqdm", "--save-result", "--save-detailed",
           "--request-id-prefix", "vllm-", "--result-dir", str(out), "--result-filename", "result.json"]
    return cmd, out / "result.json"


def floor_command(args: argparse.Namespace, url: str, conc: int, out: Path) -> tuple[list[str], Path]:
    """`floor_client.c`, built once per run of this script: the least a client that reads each token costs."""
    if args.floor_binary is None:
        args.floor_binary = Path(tempfile.mkdtemp(prefix="floor_client_")) / "floor_client"
        subprocess.run(["cc", "-O2", "-o", str(args.floor_binary), str(REPO / "benchmarks" / "floor_client.c")], check=True)
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    cmd = [str(args.floor_binary), host, port, str(conc), str(args.num_prompts or 4 * conc), str(args.warmup),
           str(args.output_len), str(args.input_len), str(out / "result.json")]
    return cmd, out / "result.json"


def aiperf_command(args: argparse.Namespace, url: str, conc: int, out: Path) -> tuple[list[str], Path]:
    if args.sessions:
        load = ["--endpoint-type", "chat", "--conversation-num", str(args.sessions[0]),
                "--conversation-turn-mean", str(args.sessions[1]), "--conversation-turn-stddev", "0"]
    else:
        load = ["--endpoint-type", "completions", "--request-count", str(args.num_prompts or 4 * conc)]
    cmd = [str(args.aiperf), "profile", "--model", "fake", "--url", url, *load,
           "--streaming", "--tokenizer", str(args.tokenizer), "--concurrency", str(conc),
           "--warmup-request-count", str(args.warmup),
           "--synthetic-input-tokens-mean", str(args.input_len), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(args.output_len), "--output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--random-seed", "0", "--ui-type", "none",
           "--no-server-metrics", "--artifact-dir", str(out)]
    return cmd, out


def _aiperf_result(where: Path) -> tuple[float, int, dict[str, tuple[float, float]]]:
    """AIPerf's profiling-phase records: mean TTFT (ms), failed, {request id: (start, TTFT s)} with
    its wall-clock start stamps moved to this machine's perf_counter clock."""
    offset = time.time() - time.perf_counter()
    per: dict[str, tuple[float, float]] = {}
    failed = 0
    for line in next(where.rglob("profile_export.jsonl")).read_text().splitlines():
        rec = json.loads(line)
        meta = rec.get("metadata", {})
        if meta.get("benchmark_phase") != "profiling":
            continue
        ttft = (rec.get("metrics") or {}).get("time_to_first_token")
        if rec.get("error") or ttft is None:
            failed += 1
            continue
        per[meta["x_request_id"]] = (meta["request_start_ns"] / 1e9 - offset, ttft["value"] / 1000)
    if not per:
        raise RuntimeError(f"AIPerf wrote no profiling records under {where}")
    return statistics.fmean(t for _s, t in per.values()) * 1000, failed, per


def _client_result(client: str, where: Path) -> tuple[float, int, dict[str, tuple[float, float]]]:
    """(mean TTFT ms, failed requests, {request id: (start stamp, TTFT s)}) from what the client wrote."""
    if client == "aiperf":
        return _aiperf_result(where)
    if client in ("vllm", "floor"):
        r = json.loads(where.read_text())
        # Outputs are in request order; request i was sent as x-request-id vllm-<i> (--request-id-prefix).
        per = {f"{client}-{i}": (st, t) for i, (st, t) in enumerate(zip(r.get("start_times", []), r.get("ttfts", [])))}
        return float(r["mean_ttft_ms"]), int(r.get("failed", 0)), per
    reports = sorted(where.glob("*/benchmark_report.json"))
    if not reports:
        raise RuntimeError(f"our client wrote no report under {where}")
    r = json.loads(reports[-1].read_text())["result"]
    detail = json.loads(next(reports[-1].parent.glob("requests/point0_repeat0.json")).read_text())
    if "session_id" in detail:  # a session replay: request ids are <session>:<turn>
        per = {f"{sid}:{k}": (st, t) for sid, k, st, t in
               zip(detail["session_id"], detail["turn"], detail["start_time"], detail["ttft"])}
    else:
        per = {str(i): (st, t) for i, (st, t) in enumerate(zip(detail["start_times"], detail["ttfts"]))}
    return float(r["mean_ttft_ms"]), int(r.get("failed", 0)), per


def run_once(args: argparse.Namespace, url: str, client: str, conc: int, procs: int, cpus: set[int] | None) -> Sample:
    _post(url + "/reset", {})
    out = Path(tempfile.mkdtemp(prefix=f"client_cost_{client}_"))
    root = args.baseline_tree if client == "baseline" else REPO
    if client == "vllm":
        cmd, result_at = vllm_command(args, url, conc, out)
    elif client == "floor":
        cmd, result_at = floor_command(args, url, conc, out)
    elif client == "aiperf":
        cmd, result_at = aiperf_command(args, url, conc, out)
    else:
        cmd, result_at = ours_command(args, url, conc, procs, out, root)
        cmd += OURS.get(client, [])
        if client == "asyncio-py":  # the same client with StreamSelector's loop turn in Python, not C
            cmd[1:3] = ["-c", "import sys, engine.eventloop as e; e._poll = None; "
                        "from engine.cli import main; sys.exit(main())"]
    env = dict(os.environ)
    if client == "vllm":
        from vllm_cpu import vllm_env
        env = vllm_env()
    elif client == "aiperf":
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = (out / "client.log").open("w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=out if client == "aiperf" else root, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    # vLLM's test and warm-up requests carry no x-request-id, ours are named warmup-<i>; AIPerf's
    # are random UUIDs: its warm-up is the first --warmup requests.
    _post(url + "/watch", {"pid": proc.pid, "count": requests_of(args, conc), "skip_ids": ["anon-", "warmup-", "warmup:"],
                           "skip_first": args.warmup if client == "aiperf" else 0})
    timer = threading.Timer(args.timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        # the process's own resource usage and that of every descendant it waited for
        _pid, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    wall = time.perf_counter() - t0
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    whole_cpu = usage.ru_utime + usage.ru_stime
    log.close()
    if rc != 0:
        raise RuntimeError(f"{client} exited {rc}: {shlex.join(cmd)}\n{(out / 'client.log').read_text()[-3000:]}")
    stats = _get(url + "/stats")
    if not stats["windows"]:
        raise RuntimeError(f"{client}: the server saw no complete measured window ({stats['arrived']} requests "
                           f"arrived, {stats['in_flight']} in flight)")
    window = stats["windows"][-1]
    reqs = [r for r in stats["requests"].values() if window["start"] <= r["arrival"] <= window["end"]]
    server_ttft = statistics.fmean(r["first"] - r["arrival"] for r in reqs) * 1000
    client_ttft, failed, per = _client_result(client, result_at)
    pairs = [(per[rid], r) for rid, r in stats["requests"].items()
             if rid in per and per[rid][1] > 0 and window["start"] <= r["arrival"] <= window["end"]]
    send_lag = statistics.fmean(r["arrival"] - st for (st, _t), r in pairs) * 1000 if pairs else math.nan
    read_lag = statistics.fmean(st + t - r["first"] for (st, t), r in pairs) * 1000 if pairs else math.nan
    per_1k = 1e6 / window["tokens"]  # CPU s -> ms per 1k measured tokens
    all_tokens = sum(r["tokens"] for r in stats["requests"].values())
    stat_cpu = window["client_stat_cpu_s"]
    from_first = window["client_stat_cpu_from_first_any_s"]
    return Sample(client=client, concurrency=conc, client_procs=procs if client not in (*PEERS, "floor") else 1,
                  requests=window["requests"], tokens=window["tokens"],
                  cpu_ms_per_1k_tokens=stat_cpu * per_1k,
                  client_mean_ttft_ms=client_ttft, server_mean_ttft_ms=server_ttft,
                  ttft_error_ms=client_ttft - server_ttft, ttft_above_schedule_ms=client_ttft - args.ttft_ms,
                  send_to_arrival_ms=send_lag, write_to_read_ms=read_lag,
                  window_s=window["end"] - window["start"], failed=failed, load_avg=os.getloadavg()[0],
                  whole_ms_per_1k=whole_cpu * 1e6 / all_tokens, from_first_request_ms_per_1k=from_first * per_1k,
                  window_schedstat_ms_per_1k=window["client_cpu_s"] * per_1k, whole_cpu_s=whole_cpu,
                  all_tokens=all_tokens, startup_cpu_s=window["stat_first_any"],
                  warmup_cpu_s=window["stat_start"] - window["stat_first_any"], window_cpu_s=stat_cpu,
                  tail_cpu_s=whole_cpu - window["stat_end"], wall_s=wall)


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}"


def _med(values: list[float]) -> str:
    """Median [range] of the runs."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} [{_range(values)}]"


NAMES = {"vllm": "vllm bench serve", "aiperf": "aiperf profile", "ours": "magpie benchmark",
         "asyncio": "magpie benchmark, asyncio", "uvloop": "magpie benchmark, uvloop",
         "asyncio-py": "magpie benchmark, asyncio, loop turn in Python",
         "floor": "floor (C: read and stamp, no parsing)"}
# our client as installed (its default loop), and on a named event loop
OURS = {"ours": [], "asyncio": ["--event-loop", "asyncio"], "uvloop": ["--event-loop", "uvloop"],
        "asyncio-py": ["--event-loop", "asyncio"]}
# (column, Sample field) of the CPU per 1k tokens by window
METHODS = (("whole process", "whole_ms_per_1k"), ("from first request", "from_first_request_ms_per_1k"),
           ("request window", "cpu_ms_per_1k_tokens"))


def table(samples: list[Sample], peer_note: str, baseline: str = "") -> str:
    rows = ["| client | C | procs | runs | CPU ms / 1k tokens: whole process | from first request | request window | "
            "mean TTFT - server's (ms) | of which send -> server read | of which server write -> client read | "
            "mean TTFT - 80 ms | failed |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.concurrency, s.client, s.client_procs), []).append(s)
    order = {"vllm": 0, "aiperf": 1, "floor": 2}
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 2), kv[0][1], kv[0][2]))
    for (conc, client, procs), ss in ordered:
        name = NAMES.get(client, f"magpie benchmark @{baseline}")
        rows.append(f"| {name} | {conc} | {procs} | {len(ss)} | " + " | ".join(
            _med([getattr(s, f) for s in ss]) for _m, f in METHODS) + " | "
            f"{_med([s.ttft_error_ms for s in ss])} | {_med([s.send_to_arrival_ms for s in ss])} | "
            f"{_med([s.write_to_read_ms for s in ss])} | {_med([s.ttft_above_schedule_ms for s in ss])} | "
            f"{sum(s.failed for s in ss)} |")
    rows += ["", "Where the whole process's CPU goes (s, median of runs): start-up to the first request, warm-up to "
             "the first measured request, the request window, after the last token; and the wall time",
             "| client | C | procs | start-up | warm-up | request window | after the last token | whole | wall (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (conc, client, procs), ss in ordered:
        name = NAMES.get(client, f"magpie benchmark @{baseline}")
        cells = [statistics.median(getattr(s, f) for s in ss) for f in
                 ("startup_cpu_s", "warmup_cpu_s", "window_cpu_s", "tail_cpu_s", "whole_cpu_s", "wall_s")]
        rows.append(f"| {name} | {conc} | {procs} | " + " | ".join(f"{c:.3f}" for c in cells[:5]) + f" | {cells[5]:.2f} |")
    ratios = []
    for conc in sorted({s.concurrency for s in samples}):
        for who, procs in sorted({(s.client, s.client_procs) for s in samples if s.client in OURS or s.client == "floor"}):
            ours = [s for s in samples if s.concurrency == conc and s.client == who and s.client_procs == procs]
            base = [s for s in samples if s.concurrency == conc and s.client == "baseline" and s.client_procs == procs
                    and who == "ours"]
            label = "ours" if who == "ours" else "the floor" if who == "floor" else f"ours on {who}"
            for method, f in METHODS:
                mine = statistics.median(getattr(s, f) for s in ours) if ours else math.nan
                peers = {c: statistics.median(getattr(s, f) for s in samples if s.concurrency == conc and s.client == c)
                         for c in PEERS if any(s.concurrency == conc and s.client == c for s in samples)}
                if ours and peers:
                    lightest = min(peers, key=peers.get)
                    each = ", ".join(f"{mine / v:.2f}x {NAMES[c]}'s" for c, v in peers.items())
                    ratios.append(f"C={conc}, {procs} proc(s), {method}: {label} / the lightest peer's ({NAMES[lightest]}) "
                                  f"CPU per token, medians of runs {mine / peers[lightest]:.2f}x ({each})")
                if base and ours:
                    change = mine / statistics.median(getattr(s, f) for s in base)
                    ratios.append(f"C={conc}, {procs} proc(s), {method}: ours/ours@{baseline} CPU per token, "
                                  f"medians of runs {change:.2f}x ({(change - 1) * 100:+.1f}%)")
    loads = [s.load_avg for s in samples]
    load_note = [f"1-minute load average at the end of the runs: {min(loads):.2f}-{max(loads):.2f}"] if loads else []
    return "\n".join(rows + ([""] + ratios if ratios else []) + load_note + ([peer_note] if peer_note else []))


def _tokenizer(args: argparse.Namespace) -> str | None:
    if args.tokenizer:
        return args.tokenizer
    if not (TINY_MODEL / "tokenizer.json").exists():
        import vllm_cpu
        vllm_cpu.build_tiny_model(TINY_MODEL)
    return str(TINY_MODEL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="128,512", help="comma-separated max concurrencies")
    ap.add_argument("--client-procs", default="1", help="comma-separated --client-procs values for our client")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=0, help="default 4 x concurrency")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--ttft-ms", type=float, default=80.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--vllm-python", default=str(DEFAULT_VENV / "bin" / "python"))
    ap.add_argument("--tokenizer", help="tokenizer folder for the peers (default: the tiny test model, built with vLLM's venv)")
    ap.add_argument("--aiperf", default=str(DEFAULT_AIPERF), help="AIPerf's console script")
    ap.add_argument("--clients", default="ours,vllm,aiperf")
    ap.add_argument("--sessions", metavar="S:T", help="a session replay instead: S chat sessions of T turns, each "
                    "turn --input-len new tokens on top of the conversation so far (ours and AIPerf; vLLM's "
                    "bench serve has no sessions)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the server and the clients to CPUs")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write every run and the table here")
    ap.add_argument("--baseline", metavar="REV", help="also run our client as of this git revision, in the same rounds")
    args = ap.parse_args(argv)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if args.sessions:
        args.sessions = tuple(int(x) for x in args.sessions.split(":"))
        if "vllm" in clients:
            clients.remove("vllm")
    args.baseline_tree = None
    args.floor_binary = None
    if args.baseline:
        args.baseline_tree = baseline_tree(args.baseline)
        clients.insert(clients.index("ours") + 1 if "ours" in clients else 0, "baseline")
    notes = []
    if "vllm" in clients:
        ok = Path(args.vllm_python).exists() and subprocess.run(
            [args.vllm_python, "-c", "import vllm.benchmarks.serve"], capture_output=True).returncode == 0
        if not ok:
            clients.remove("vllm")
            notes.append(f"vllm bench serve was not run: vLLM is not importable by {args.vllm_python}")
        else:
            args.tokenizer = _tokenizer(args)
    if "aiperf" in clients:
        if not Path(args.aiperf).exists():
            clients.remove("aiperf")
            notes.append(f"AIPerf was not run: {args.aiperf} does not exist")
        elif not args.tokenizer and (TINY_MODEL / "tokenizer.json").exists():
            args.tokenizer = str(TINY_MODEL)
        if "aiperf" in clients and not args.tokenizer:
            clients.remove("aiperf")
            notes.append("AIPerf was not run: it needs a local tokenizer folder (--tokenizer)")
    if "uvloop" in clients and subprocess.run([sys.executable, "-c", "import uvloop"], capture_output=True).returncode:
        clients.remove("uvloop")
        notes.append("our client on uvloop was not run: uvloop is not installed (pip install uvloop)")
    peer_note = "; ".join(notes)
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[-1] if len(cpus) > 1 and not args.no_pin else None
    client_cpus = set(cpus[:-1]) if server_cpu is not None else None
    try:
        proc, url = start_server(args, server_cpu)
    except BaseException:
        if args.baseline_tree is not None:
            shutil.rmtree(args.baseline_tree, ignore_errors=True)
        raise
    samples: list[Sample] = []
    try:
        for conc in [int(c) for c in args.concurrency.split(",")]:
            for rep in range(args.repeats):  # rounds: every client once per round, in turn
                for client in clients:
                    for procs in ([int(p) for p in args.client_procs.split(",")] if client not in (*PEERS, "floor") else [1]):
                        s = run_once(args, url, client, conc, procs, client_cpus)
                        s.round = rep + 1
                        samples.append(s)
                        print(f"C={conc} round {rep + 1} {client:8s} procs {s.client_procs}: CPU ms / 1k tokens "
                              f"whole {s.whole_ms_per_1k:6.1f}, from first request {s.from_first_request_ms_per_1k:6.1f}, "
                              f"window {s.cpu_ms_per_1k_tokens:6.1f} (schedstat {s.window_schedstat_ms_per_1k:5.1f}); "
                              f"TTFT {s.client_mean_ttft_ms:7.2f} "
                              f"ms (server {s.server_mean_ttft_ms:6.2f}; error {s.ttft_error_ms:+6.2f} = send "
                              f"{s.send_to_arrival_ms:+.2f} + read {s.write_to_read_ms:+.2f}), "
                              f"{s.requests} requests in {s.window_s:.2f} s, {s.failed} failed, "
                              f"load {s.load_avg:.2f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
        if args.baseline_tree is not None:
            shutil.rmtree(args.baseline_tree, ignore_errors=True)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    machine = f"{len(cpus)} CPUs ({platform.processor() or platform.machine()}), Python {platform.python_version()}"
    text = table(samples, peer_note, args.baseline or "")
    print(f"\n{when}, {machine}, server on CPU {server_cpu}, clients on {sorted(client_cpus or cpus)}\n{text}")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": when, "machine": machine, "argv": sys.argv[1:],
                                               "samples": [asdict(s) for s in samples], "table": text}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
