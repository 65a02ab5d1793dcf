"""Client cost and accuracy, side by side: `magpie benchmark` and `vllm bench serve` taking turns
against one scheduled streaming server (`benchmarks/scheduled_server.py`: first token 80 ms after
the request arrives, one token every 10 ms, 64 out), far below that server's own capacity.

Per client and run:

* CPU per 1k output tokens: the CPU time (user + system, every thread of the client's process and
  of the processes below it) spent while its measured requests were in flight, read by the server
  when the first measured request arrives and when the last one is done (so start-up, tokenizer
  loading, warm-up and report writing do not count), over the output tokens of those requests;
* TTFT error: the client's own mean TTFT (from its result file) minus the server's mean of (first
  token written − request arrived) over the same requests; and the client's mean TTFT minus the
  scheduled 80 ms, the figure the issue quotes. The error is split per request (from each client's
  per-request start stamps and TTFTs: our `requests/` file, vLLM's `--save-detailed`) into the time
  from the client's start stamp to the server having read the request (sending, and the server's
  own intake when it is busy), and from the server's write of the first token to the client's stamp
  of it (the client's reading lag).

Both clients run their shipped command lines, each in a process of its own, with the same
workload (random prompts of `--input-len` tokens, `--output-len` out, `--num-prompts`, max
concurrency C, all requests at once, `ignore_eos`, the same warm-up count) and take turns run by
run, so both see the same background load. vLLM's client needs vLLM: the interpreter of an
environment that has it (`--vllm-python`, default the venv of the opt-in tests, made by
`tests/vllm_cpu.py install`) and a tokenizer folder (`--tokenizer`; default: the tiny model that
`tests/vllm_cpu.py model DIR` builds, made on first use). Without it only our client is measured
and the table says the peer was not run.

    python benchmarks/client_cost.py [--concurrency 128,512 --repeats 3 --client-procs 1,2 --json FILE]

`--baseline REV` adds our client as it was at git revision REV (its `engine/` from `git archive`)
as a third client taking its turn in the same rounds: a before/after of a client change measured
interleaved, on the same server and machine state, not on another day.

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
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

DEFAULT_VENV = Path(os.environ.get("MAGPIE_VLLM_VENV", Path.home() / ".cache" / "magpie-test" / "vllm-cpu-venv"))
TINY_MODEL = Path.home() / ".cache" / "magpie-test" / "tiny-llama"


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
    return tree


def fixed_lengths_flag(root: Path) -> list[str]:
    """Fixed lengths in the CLI of the tree at ``root``: --vllm-range-ratio 0 where it exists (the
    --range-ratio of later revisions is Magpie's [L*r, L]), else --range-ratio 0 (vLLM's, before)."""
    cli = (root / "engine" / "cli.py").read_text()
    return ["--vllm-range-ratio", "0"] if "--vllm-range-ratio" in cli else ["--range-ratio", "0"]


def ours_command(args: argparse.Namespace, url: str, conc: int, procs: int, out: Path,
                 root: Path = REPO) -> tuple[list[str], Path]:
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


def _client_result(client: str, where: Path) -> tuple[float, int, dict[str, tuple[float, float]]]:
    """(mean TTFT ms, failed requests, {request id: (start stamp, TTFT s)}) from what the client wrote."""
    if client == "vllm":
        r = json.loads(where.read_text())
        # Outputs are in request order; request i was sent as x-request-id vllm-<i> (--request-id-prefix).
        per = {f"vllm-{i}": (st, t) for i, (st, t) in enumerate(zip(r.get("start_times", []), r.get("ttfts", [])))}
        return float(r["mean_ttft_ms"]), int(r.get("failed", 0)), per
    reports = sorted(where.glob("*/benchmark_report.json"))
    if not reports:
        raise RuntimeError(f"our client wrote no report under {where}")
    r = json.loads(reports[-1].read_text())["result"]
    detail = json.loads(next(reports[-1].parent.glob("requests/point0_repeat0.json")).read_text())
    per = {str(i): (st, t) for i, (st, t) in enumerate(zip(detail["start_times"], detail["ttfts"]))}
    return float(r["mean_ttft_ms"]), int(r.get("failed", 0)), per


def run_once(args: argparse.Namespace, url: str, client: str, conc: int, procs: int, cpus: set[int] | None) -> Sample:
    _post(url + "/reset", {})
    out = Path(tempfile.mkdtemp(prefix=f"client_cost_{client}_"))
    root = args.baseline_tree if client == "baseline" else REPO
    cmd, result_at = (vllm_command(args, url, conc, out) if client == "vllm"
                      else ours_command(args, url, conc, procs, out, root))
    env = dict(os.environ)
    if client == "vllm":
        from vllm_cpu import vllm_env
        env = vllm_env()
    else:
        env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = (out / "client.log").open("w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    # vLLM's test and warm-up requests carry no x-request-id, ours are named warmup-<i>.
    _post(url + "/watch", {"pid": proc.pid, "count": args.num_prompts or 4 * conc, "skip_ids": ["anon-", "warmup-"]})
    rc = proc.wait(args.timeout)
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
    cpu = window["client_cpu_s"]
    return Sample(client=client, concurrency=conc, client_procs=procs if client != "vllm" else 1,
                  requests=window["requests"], tokens=window["tokens"],
                  cpu_ms_per_1k_tokens=cpu * 1000 / (window["tokens"] / 1000),
                  client_mean_ttft_ms=client_ttft, server_mean_ttft_ms=server_ttft,
                  ttft_error_ms=client_ttft - server_ttft, ttft_above_schedule_ms=client_ttft - args.ttft_ms,
                  send_to_arrival_ms=send_lag, write_to_read_ms=read_lag,
                  window_s=window["end"] - window["start"], failed=failed, load_avg=os.getloadavg()[0])


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}"


def table(samples: list[Sample], peer_note: str, baseline: str = "") -> str:
    rows = ["| client | C | procs | runs | CPU ms / 1k out tokens | mean TTFT - server's (ms) | of which send -> "
            "server read (ms) | of which server write -> client read (ms) | mean TTFT - 80 ms (ms) | failed |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.concurrency, s.client, s.client_procs), []).append(s)
    for (conc, client, procs), ss in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "vllm", kv[0][2])):
        name = {"vllm": "vllm bench serve", "baseline": f"magpie benchmark @{baseline}"}.get(client, "magpie benchmark")
        rows.append(f"| {name} | {conc} | {procs} | {len(ss)} | {_range([s.cpu_ms_per_1k_tokens for s in ss])} | "
                    f"{_range([s.ttft_error_ms for s in ss])} | {_range([s.send_to_arrival_ms for s in ss])} | "
                    f"{_range([s.write_to_read_ms for s in ss])} | {_range([s.ttft_above_schedule_ms for s in ss])} | "
                    f"{sum(s.failed for s in ss)} |")
    ratios = []
    for conc in sorted({s.concurrency for s in samples}):
        peer = [s.cpu_ms_per_1k_tokens for s in samples if s.concurrency == conc and s.client == "vllm"]
        for procs in sorted({s.client_procs for s in samples if s.client == "ours"}):
            ours = [s.cpu_ms_per_1k_tokens for s in samples if s.concurrency == conc and s.client == "ours"
                    and s.client_procs == procs]
            if peer and ours:
                ratios.append(f"C={conc}, {procs} proc(s): ours/vLLM CPU per token, median of runs "
                              f"{statistics.median(ours) / statistics.median(peer):.2f}x")
            base = [s.cpu_ms_per_1k_tokens for s in samples if s.concurrency == conc and s.client == "baseline"
                    and s.client_procs == procs]
            if base and ours:
                change = statistics.median(ours) / statistics.median(base)
                ratios.append(f"C={conc}, {procs} proc(s): ours/ours@{baseline} CPU per token, median of runs "
                              f"{change:.2f}x ({(change - 1) * 100:+.1f}%)")
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
    ap.add_argument("--tokenizer", help="tokenizer folder for vllm bench serve (default: the tiny test model)")
    ap.add_argument("--clients", default="ours,vllm")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the server and the clients to CPUs")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write every run and the table here")
    ap.add_argument("--baseline", metavar="REV", help="also run our client as of this git revision, in the same rounds")
    args = ap.parse_args(argv)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    args.baseline_tree = None
    if args.baseline:
        args.baseline_tree = baseline_tree(args.baseline)
        clients.insert(clients.index("ours") + 1 if "ours" in clients else 0, "baseline")
    peer_note = ""
    if "vllm" in clients:
        ok = Path(args.vllm_python).exists() and subprocess.run(
            [args.vllm_python, "-c", "import vllm.benchmarks.serve"], capture_output=True).returncode == 0
        if not ok:
            clients.remove("vllm")
            peer_note = f"vllm bench serve was not run: vLLM is not importable by {args.vllm_python}"
        else:
            args.tokenizer = _tokenizer(args)
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
            for rep in range(args.repeats):
                for client in clients:
                    for procs in ([int(p) for p in args.client_procs.split(",")] if client != "vllm" else [1]):
                        s = run_once(args, url, client, conc, procs, client_cpus)
                        samples.append(s)
                        print(f"C={conc} run {rep + 1} {client:8s} procs {s.client_procs}: "
                              f"{s.cpu_ms_per_1k_tokens:6.1f} ms CPU / 1k tokens, TTFT {s.client_mean_ttft_ms:7.2f} "
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
