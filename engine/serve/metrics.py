"""``GET /metrics`` of the built-in server: the engine's counters in the Prometheus text
exposition format 0.0.4, written here rather than through ``prometheus_client`` so that the
server needs no package beyond torch and aiohttp (the GPU machines it runs on have no index).

Metrics (prefix ``magpie_serve_``):

* ``steps_total{kind}`` and ``step_seconds_total{kind}``: engine steps and their wall time, by
  kind ``prefill`` (prompt tokens only), ``decode`` or ``mixed``;
* ``decode_batch_size`` (histogram): sequences decoded per step with any;
* ``decode_graph_replays_total`` / ``decode_eager_steps_total``: decode steps replayed from a
  CUDA graph / run eagerly (CPU, ``--eager``, profiling, batches above the largest bucket);
* ``cuda_graph_batch_sizes``: one series per captured bucket (value 1);
* ``prompt_graph_replays_total`` / ``prompt_eager_steps_total``: steps with prompt tokens whose
  prompts were replayed from a CUDA graph / run eagerly; ``cuda_graph_token_buckets``: one series
  per captured prompt bucket (value 1); ``mixed_forward_steps_total``: steps whose decode rows
  ran inside the prompt forward (one read of the weights for both);
* ``requests_running``, ``requests_waiting``, ``kv_cache_slots_used``, ``kv_cache_slots``
  (gauges); ``prompt_tokens_total``, ``generation_tokens_total``,
  ``requests_finished_total{reason}`` (stop, length, error, abort);
* with prefix caching, vLLM's ``vllm:prefix_cache_queries_total`` and
  ``vllm:prefix_cache_hits_total`` (prompt tokens looked up / found in the prefix cache, so that
  a client reading vLLM's names gets the hit rate of either server), and
  ``prefix_cache_blocks_used``, ``prefix_cache_blocks`` (gauges), ``prefix_cache_evictions_total``.
"""

from __future__ import annotations

from typing import Any, Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "magpie_serve_"


def _value(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def _family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]
    for suffix, labels, value in samples:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{PREFIX}{name}{suffix}{{{text}}} {_value(value)}" if text else f"{PREFIX}{name}{suffix} {_value(value)}")
    return lines


def render(m: dict[str, Any]) -> str:
    """The exposition text of ``Engine.metrics()``'s snapshot ``m``."""
    out: list[str] = []
    out += _family("steps_total", "counter", "Engine steps, by kind (prefill, decode, mixed).",
                   [("", {"kind": k}, v) for k, v in m["steps"].items()])
    out += _family("step_seconds_total", "counter", "Wall time of engine steps in seconds, by kind.",
                   [("", {"kind": k}, float(v)) for k, v in m["step_seconds"].items()])
    cumulative, buckets = 0, []
    for bound, count in zip(m["batch_bounds"], m["batch_counts"]):
        cumulative += count
        buckets.append(("_bucket", {"le": str(bound)}, cumulative))
    total = sum(m["batch_counts"])
    out += _family("decode_batch_size", "histogram", "Sequences decoded per step (steps with any).",
                   [*buckets, ("_bucket", {"le": "+Inf"}, total), ("_sum", {}, m["batch_sum"]), ("_count", {}, total)])
    out += _family("decode_graph_replays_total", "counter", "Decode steps replayed from a CUDA graph.",
                   [("", {}, m["graph_replays"])])
    out += _family("decode_eager_steps_total", "counter", "Decode steps run eagerly (no graph).",
                   [("", {}, m["eager_decode_steps"])])
    out += _family("decode_steps_ahead_total", "counter", "Decode steps queued on the device before the host had "
                   "the previous step's tokens (host and GPU overlapped).", [("", {}, m["ahead_steps"])])
    out += _family("cuda_graph_batch_sizes", "gauge", "Batch sizes with a captured decode graph (1 each).",
                   [("", {"batch_size": str(b)}, 1) for b in m["graph_batch_sizes"]])
    out += _family("prompt_graph_replays_total", "counter", "Steps whose prompts were replayed from a CUDA graph.",
                   [("", {}, m["prompt_graph_replays"])])
    out += _family("prompt_eager_steps_total", "counter", "Steps with prompt tokens run eagerly (no graph).",
                   [("", {}, m["eager_prompt_steps"])])
    out += _family("mixed_forward_steps_total", "counter", "Steps whose decode rows ran inside the prompt forward.",
                   [("", {}, m["mixed_forward_steps"])])
    out += _family("cuda_graph_token_buckets", "gauge", "Prompt token counts with a captured graph (1 each).",
                   [("", {"tokens": str(b)}, 1) for b in m["graph_token_buckets"]])
    for name, key, help_text in (
            ("requests_running", "running", "Requests holding a KV-cache slot (prefilling or decoding)."),
            ("requests_waiting", "waiting", "Requests waiting for a KV-cache slot."),
            ("kv_cache_slots_used", "kv_slots_used", "KV-cache slots in use."),
            ("kv_cache_slots", "kv_slots", "KV-cache slots (the maximum batch size).")):
        out += _family(name, "gauge", help_text, [("", {}, m[key])])
    out += _family("prompt_tokens_total", "counter", "Prompt tokens prefilled.", [("", {}, m["prompt_tokens"])])
    out += _family("generation_tokens_total", "counter", "Tokens generated.", [("", {}, m["generation_tokens"])])
    out += _family("requests_finished_total", "counter", "Requests finished, by reason (stop, length, error, abort).",
                   [("", {"reason": r}, v) for r, v in m["finished"].items()])
    pc = m.get("prefix_cache")
    if pc is not None:
        for name, key, help_text in (
                ("prefix_cache_queries", "queries", "Prefix cache queries, in terms of number of queried tokens."),
                ("prefix_cache_hits", "hits", "Prefix cache hits, in terms of number of cached tokens.")):
            out += [f"# HELP vllm:{name}_total {help_text}", f"# TYPE vllm:{name}_total counter",
                    f"vllm:{name}_total {_value(pc[key])}"]
        out += _family("prefix_cache_blocks_used", "gauge", "Prefix-cache blocks holding a cached prefix block.",
                       [("", {}, pc["blocks_used"])])
        out += _family("prefix_cache_blocks", "gauge", "Prefix-cache blocks (the pool's size).", [("", {}, pc["blocks"])])
        out += _family("prefix_cache_evictions_total", "counter", "Prefix-cache blocks evicted (least recently used).",
                       [("", {}, pc["evictions"])])
    return "\n".join(out) + "\n"
