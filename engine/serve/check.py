"""Greedy decoding with and without CUDA graphs gives the same tokens: the check the GPU serving
benchmark runs first, and the parts the CPU tests call.

``python -m engine.serve.check --model 1b [--device cuda] [--json FILE]`` on one model:

1. step logits: the check prompts prefilled into a graph engine's cache, then decode steps each
   replayed from its graph and run eagerly on the same inputs: the largest logit difference and
   whether the greedy tokens agree (the random models often repeat a token, so the logits are
   the sharper test);
   The same for the prompt step: the check prompts packed into one step replayed from its prompt
   graph and run eagerly;
2. timing: GPU milliseconds of one decode graph replay, and the wall milliseconds of an eager
   decode step, per ``--time-batches`` batch at ``--context`` tokens; the same for prompt steps of
   1 and 8 prompts of 512 tokens;
3. engines: the check prompts generated through the scheduler by an eager engine and by a graph
   engine (continuous batching, padding to buckets as requests finish): tokens compared per prompt.

Prints one JSON object (also to ``--json``); exit code 0 when every token agreed, 1 when not, 2
for bad arguments. On the CPU there are no graphs: only step 3 runs, eager against eager.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from engine.serve.engine import Engine, TokenEvent
from engine.serve.kernels import check_triton_defaults, print_notes, resolve_kernels, triton_defaults_in_use
from engine.serve.model import LlamaModel, model_config
from engine.serve.tokenizer import BOS_ID

_LENGTHS = (5, 17, 64, 130, 9, 200, 33, 90)
_NEW_TOKENS = (24, 40, 8, 32, 16, 40, 4, 28)  # unequal: the batch shrinks through the buckets as requests end


def check_prompts(n: int = 8, scale: int = 1) -> tuple[list[list[int]], list[int]]:
    """``n`` fixed prompts of varied lengths (token ids below 256) and their max_tokens; ``scale``
    multiplies the new tokens."""
    prompts = [[BOS_ID] + [(31 * i + 7 * j) % 250 + 1 for j in range(_LENGTHS[i % len(_LENGTHS)])] for i in range(n)]
    return prompts, [scale * _NEW_TOKENS[i % len(_NEW_TOKENS)] for i in range(n)]


def generate_all(engine: Engine, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[list[int]]:
    """Every prompt's greedy tokens (ignoring EOS), submitted together and stepped on this thread."""
    events: list[list[TokenEvent]] = [[] for _ in prompts]
    for prompt, n, sink in zip(prompts, max_tokens, events):
        engine.submit(prompt, n, True, sink.append)
    while engine.step() is not None:
        pass
    errors = [ev.error for evs in events for ev in evs if ev.error]
    if errors:
        raise RuntimeError(f"generation failed: {errors[0]}")
    return [[ev.token for ev in evs if ev.token is not None] for evs in events]


def compare_engines(model: LlamaModel, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int],
                    first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The tokens of two engines on ``model`` (Engine keyword arguments ``first`` and ``second``),
    one after the other, compared prompt by prompt."""
    outputs, engines = [], []
    for kwargs in (first, second):
        engine = Engine(model, **kwargs)
        engine.warm_up()
        started = time.perf_counter()
        outputs.append(generate_all(engine, prompts, max_tokens))
        runner = engine.prefiller
        engines.append({"cuda_graphs": sorted(engine.decoder.graphs), "replays": engine.decoder.replays,
                        "eager_steps": engine.decoder.eager_steps, "steps": engine.steps,
                        "prompt_graphs": sorted(runner.graphs) if runner else [],
                        "prompt_replays": runner.replays if runner else 0,
                        "prompt_eager_steps": runner.eager_steps if runner else 0,
                        "seconds": round(time.perf_counter() - started, 3)})
        del engine
        if model.device.type == "cuda":
            torch.cuda.empty_cache()  # the next engine allocates its own KV cache
    a, b = outputs
    mismatches = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            at = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            mismatches.append({"prompt": i, "position": at, "first": x[at:at + 4], "second": y[at:at + 4]})
    return {"prompts": len(prompts), "tokens": sum(len(t) for t in a), "distinct_tokens": len({t for ts in a for t in ts}),
            "equal": not mismatches, "mismatches": mismatches, "first": engines[0], "second": engines[1]}


def compare_step_logits(engine: Engine, prompts: Sequence[Sequence[int]], steps: int) -> dict[str, Any]:
    """Decode steps of ``prompts`` (prefilled into slots 0..n-1) replayed from the engine's graphs
    and run eagerly on the same inputs; needs ``engine.warm_up()`` to have captured them."""
    n = len(prompts)
    slots = list(range(n))
    tokens = engine.model.prefill(engine.cache, slots, [0] * n, prompts).argmax(dim=-1).tolist()
    positions = [len(p) for p in prompts]
    worst, agree = 0.0, 0
    for _ in range(steps):
        replayed = engine.decoder.logits(tokens, positions, slots, graph=True).float().clone()
        eager = engine.decoder.logits(tokens, positions, slots, graph=False).float()
        worst = max(worst, (replayed - eager).abs().max().item())
        next_tokens = replayed.argmax(dim=-1).tolist()
        agree += sum(a == b for a, b in zip(next_tokens, eager.argmax(dim=-1).tolist()))
        tokens, positions = next_tokens, [p + 1 for p in positions]
    return {"batch": n, "bucket": engine.decoder.bucket(n), "steps": steps, "max_abs_logit_diff": worst,
            "tokens_agree": agree, "tokens": n * steps, "equal": agree == n * steps}


def compare_prompt_logits(engine: Engine, prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """One step of whole ``prompts`` (slots 0..n-1) replayed from the engine's prompt graph and run
    eagerly on the same inputs."""
    runner = engine.prefiller
    if runner is None or not runner.graphs:
        return {"equal": False, "why": runner.disabled if runner else "no prompt runner"}
    slots = list(range(len(prompts)))
    replayed = runner.logits(slots, prompts, graph=True).float().clone()
    eager = runner.logits(slots, prompts, graph=False).float()
    agree = sum(a == b for a, b in zip(replayed.argmax(dim=-1).tolist(), eager.argmax(dim=-1).tolist()))
    out = {"prompts": len(prompts), "tokens": sum(map(len, prompts)), "bucket": runner.bucket(sum(map(len, prompts))),
           "max_abs_logit_diff": (replayed - eager).abs().max().item(), "tokens_agree": agree,
           "equal": agree == len(prompts)}
    if runner.mixed and len(prompts) > 1:
        # The second half of the prompts decodes its next token inside a step that prefills the first half again.
        half = len(prompts) // 2
        first = replayed.argmax(dim=-1).tolist()
        args = (slots[:half], prompts[:half], first[half:], [len(p) for p in prompts[half:]], slots[half:])
        mixed_graph = runner.mixed_logits(*args, graph=True).float().clone()
        mixed_eager = runner.mixed_logits(*args, graph=False).float()
        mixed_agree = sum(a == b for a, b in zip(mixed_graph.argmax(dim=-1).tolist(), mixed_eager.argmax(dim=-1).tolist()))
        out["mixed"] = {"prompts": half, "decode_rows": len(prompts) - half,
                        "max_abs_logit_diff": (mixed_graph - mixed_eager).abs().max().item(), "tokens_agree": mixed_agree,
                        "equal": mixed_agree == len(prompts)}
        out["equal"] = out["equal"] and out["mixed"]["equal"]
    return out


def _kernels(size: str, device: torch.device, dtype: torch.dtype) -> Any:
    kernels = resolve_kernels({}, device)
    if triton_defaults_in_use(kernels):
        kernels = check_triton_defaults(kernels, model_config(size), device, dtype)
    print_notes(kernels)
    return kernels


def run_check(size: str, device: torch.device, *, n_prompts: int, scale: int, max_batch: int, max_len: int,
              time_batches: Sequence[int], context: int) -> dict[str, Any]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        if device.index is None:  # "cuda": the current device, made explicit (set_device needs an index)
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # Triton launches and graph captures go to the current device
    model = LlamaModel(model_config(size), device=device, dtype=dtype, kernels=_kernels(size, device, dtype))
    prompts, max_tokens = check_prompts(n_prompts, scale)
    out: dict[str, Any] = {"model": size, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                           "kernels": dict(model.kernels.sources), "kernel_notes": list(model.kernels.notes)}
    common = {"max_batch_size": max_batch, "max_model_len": max_len}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        engine = Engine(model, cuda_graphs=True, **common)
        engine.warm_up()
        out["prompt_logits"] = compare_prompt_logits(engine, prompts[:min(len(prompts), max_batch)])
        out["step_logits"] = compare_step_logits(engine, prompts[:min(len(prompts), max_batch)], steps=8)
        out["timing"] = [{"batch": b, "context": context, "graph_replay_gpu_ms": round(engine.decoder.time_step(b, context), 4),
                          "eager_step_wall_ms": round(engine.decoder.time_step(b, context, iters=5, graph=False), 3)}
                         for b in time_batches if b <= max_batch]
        runner = engine.prefiller
        if runner is not None and runner.graphs:
            out["prompt_timing"] = [
                {"prompts": n, "length": 512, "graph_replay_gpu_ms": round(runner.time_step(n, 512), 4),
                 "eager_step_wall_ms": round(runner.time_step(n, 512, iters=5, graph=False), 3)}
                for n in (1, 8) if n <= max_batch and n * 512 <= runner.tokens and 512 <= max_len]
        del engine
        torch.cuda.empty_cache()
    out["engines"] = compare_engines(model, prompts, max_tokens, {**common, "cuda_graphs": False},
                                     {**common, "cuda_graphs": True})
    out["equal"] = (out["engines"]["equal"] and out.get("step_logits", {}).get("equal", True)
                    and out.get("prompt_logits", {}).get("equal", True))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.serve.check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="1b", help="preset (tiny, 1b, 8b)")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--scale", type=int, default=1, help="multiply each prompt's new tokens")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--time-batches", default="16,64", help="batches whose decode step is timed (GPU)")
    ap.add_argument("--context", type=int, default=544, help="context length of the timed steps")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    try:
        device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                              "cpu" if args.device == "auto" else args.device)
        batches = [int(b) for b in args.time_batches.split(",") if b.strip()]
        if not 1 <= args.prompts <= args.max_batch or args.context >= args.max_len:
            raise ValueError("--prompts must be between 1 and --max-batch, and --context below --max-len")
        result = run_check(args.model, device, n_prompts=args.prompts, scale=args.scale, max_batch=args.max_batch,
                           max_len=args.max_len, time_batches=batches, context=args.context)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result)
    print(text, flush=True)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if result["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
