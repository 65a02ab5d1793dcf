"""Client overhead of the load generator: the tokens/s it sustains before its own timing error
exceeds 1 ms at p99 — and the same for vLLM's client when `vllm` is importable.

Set-up: `tests/bench_server.py` runs in its own process (pinned to another CPU when there is one)
and does no model work: each stream sends one token per chunk every `--itl-ms` milliseconds. The
client runs closed-loop at concurrency C (rate inf, `--waves` × C requests of `--tokens` tokens,
C warm-up requests first); the offered load is C × 1000 / itl_ms tokens/s, and C doubles until
`--max-concurrency`, or until the run saturates (achieved < 80% of offered, or p99 lag > 50 ms).

Timing error, defined precisely. The server stamps `time.perf_counter()` just before writing each
`choices` message k of a request (`s_k`); Linux's perf_counter is CLOCK_MONOTONIC, one clock for
both processes. The client's own stamp of message k is rebuilt from what it reports:
`c_0 = start_time + ttft`, `c_k = c_{k-1} + itl[k-1]`. The **lag** `c_k − s_k` is how late the
client saw message k: loopback transfer (tens of µs) plus every client-side delay (event-loop
backlog, parsing, GC). TTFT and E2EL are off by the lag of their message, an ITL sample by the
difference of two lags (also reported, as "gap error" |itl[k-1] − (s_k − s_{k-1})|). The criterion
is p99 lag ≤ 1 ms over all messages of the level (the median over `--repeats` runs, the clients
taking turns at each level so both see the same background load); the sustained rate is the highest achieved
output tokens/s (client-measured) of a level meeting it. For scale, the script also measures the
platform floor: the same lag for a bare blocking socket between the same two CPUs at the same
pace (on a small VM, waking an idle vCPU alone can cost ~1 ms at p99).

    python benchmarks/loadgen_overhead.py [--itl-ms 10 --tokens 64 --waves 3 --repeats 3 --max-concurrency 1024]
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.bench.dataset import SampleRequest, sample_random_requests  # noqa: E402
from engine.bench.loadgen import LoadGenConfig, LoadGenerator  # noqa: E402

LIMIT_MS = 1.0


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

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.p99_lag_ms <= LIMIT_MS


Runner = Callable[[str, Sequence[SampleRequest], int, str], Coroutine[Any, Any, tuple[list[Timed], float]]]


async def run_ours(url: str, reqs: Sequence[SampleRequest], conc: int, prefix: str) -> tuple[list[Timed], float]:
    cfg = LoadGenConfig(base_url=url, model="fake", max_concurrency=conc, num_warmups=conc,
                        request_id_prefix=prefix)
    res = await LoadGenerator(cfg, reqs).run()
    return [Timed(o.request_id, o.success, o.start_time, o.ttft, o.itl, o.output_tokens)
            for o in res.outputs], res.duration_s


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


def measure(timed: list[Timed], duration: float, stamps: dict[str, list[float]], conc: int,
            itl_ms: float) -> Level:
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
                 p99_gap_err_ms=float(np.percentile(gap, 99)), failed=failed)


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
                 p99_gap_err_ms=med("p99_gap_err_ms"), failed=max(r.failed for r in runs))


def sweep(clients: list[tuple[str, Runner]], url: str, args: argparse.Namespace) -> dict[str, list[Level]]:
    """Doubling concurrency; at each level the clients take turns, repeat by repeat, so that both
    see the same background noise. A client stops once it saturates."""
    levels: dict[str, list[Level]] = {name: [] for name, _ in clients}
    active = list(clients)
    conc = 1
    while conc <= args.max_concurrency and active:
        reqs = sample_random_requests(conc * args.waves, input_len=32, output_len=args.tokens,
                                      vocab_size=32000, seed=conc)
        runs: dict[str, list[Level]] = {name: [] for name, _ in active}
        for rep in range(args.repeats):
            for name, runner in active:
                timed, duration = asyncio.run(runner(url, reqs, conc, f"{name}-c{conc}-r{rep}-"))
                runs[name].append(measure(timed, duration, fetch_stamps(url), conc, args.itl_ms))
        for name, _ in list(active):
            level = median_level(runs[name])
            levels[name].append(level)
            print(f"  {name:5s} C={conc:<5d} offered {level.offered_tok_s:9.0f} tok/s  achieved "
                  f"{level.achieved_tok_s:9.0f} tok/s  p99 lag {level.p99_lag_ms:7.3f} ms", flush=True)
            if level.achieved_tok_s < 0.8 * level.offered_tok_s or level.p99_lag_ms > 50:
                active = [c for c in active if c[0] != name]
        conc *= 2
    return levels


def table(name: str, levels: list[Level]) -> str:
    rows = [f"{name}: itl-paced zero-compute server, p99 lag limit {LIMIT_MS} ms",
            f"{'C':>5} {'offered tok/s':>14} {'achieved tok/s':>15} {'p50 lag ms':>11} {'p99 lag ms':>11} "
            f"{'p99 gap err ms':>15} {'failed':>7} {'ok':>3}"]
    for lv in levels:
        rows.append(f"{lv.concurrency:>5} {lv.offered_tok_s:>14.0f} {lv.achieved_tok_s:>15.0f} {lv.p50_lag_ms:>11.3f} "
                    f"{lv.p99_lag_ms:>11.3f} {lv.p99_gap_err_ms:>15.3f} {lv.failed:>7} {'yes' if lv.ok else 'no':>3}")
    ok = [lv.achieved_tok_s for lv in levels if lv.ok]
    rows.append(f"sustained: {max(ok):.0f} tok/s" if ok else "sustained: none (even C=1 exceeds the limit)")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--itl-ms", type=float, default=10.0, help="server gap between chunks of one stream")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--waves", type=int, default=3, help="requests per level = waves x concurrency")
    ap.add_argument("--max-concurrency", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3, help="runs per level and client; medians are reported")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[-1] if len(cpus) > 1 else None
    if server_cpu is not None:  # keep the client off the server's CPU
        os.sched_setaffinity(0, set(cpus[:-1]))
    clients: list[tuple[str, Runner]] = [("ours", run_ours)]
    vllm = vllm_runner()
    if vllm is not None:
        clients.append(("vllm", vllm))
    else:
        print("vllm is not importable: measuring our client only")
    floor = socket_floor(args.itl_ms, 500, server_cpu)
    proc, url = start_server(args.itl_ms, server_cpu)
    try:
        results = sweep(clients, url, args)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"\n{len(cpus)} CPUs, server on CPU {server_cpu}, {args.tokens} tokens/request, itl {args.itl_ms} ms; "
          f"bare-socket floor: p50 {floor[0]:.3f} ms, p99 {floor[1]:.3f} ms")
    for name, levels in results.items():
        print()
        print(table(name, levels))


if __name__ == "__main__":
    main()
