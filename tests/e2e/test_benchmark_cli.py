"""magpie benchmark through the real command line: the built-in server on the CPU, clean and
profiled, a server that is already running (--base-url), repeats, and config errors."""

import json

import pytest

from conftest import only_workspace, read_events, run_magpie


def _report(out):
    ws = only_workspace(out)
    return ws, json.loads((ws / "benchmark_report.json").read_text())


@pytest.mark.slow
def test_builtin_clean_run(tmp_path):
    proc = run_magpie("benchmark", "builtin", "--concurrency", "3", "--input-len", "24", "--output-len", "8",
                      "--num-prompts", "9", "--repeats", "2", "--range-ratio", "1", "-o", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, r = _report(tmp_path)
    assert ws.name.startswith("benchmark_builtin-tiny_")
    assert r["success"] is True and r["run_kind"] == "measurement" and r["reward_eligible"] is True
    assert r["throughput"]["completed_requests"] == 9 and r["throughput"]["total_output_tokens"] == 72
    assert r["throughput"]["total_input_tokens"] == 9 * 24
    lat = r["latency"]
    # A TPOT of 0 is a real reading: on a busy machine a request's 8 tokens can arrive in one read.
    assert 0 < lat["ttft"]["median_ms"] <= lat["e2el"]["median_ms"] and lat["tpot"]["mean_ms"] >= 0
    rep = r["repeats"]["output_throughput"]
    # two repeats: no interval (t(1) = 12.7 makes it meaningless), the reason in its place
    assert rep["n"] == 2 and rep["ci95"] is None and rep["ci95_note"] == "not meaningful with fewer than 3 repeats"
    assert {"field": "benchmark.envs.CONC", "yaml": "32", "cli": "3", "flag": "--concurrency"} in r["overrides"]
    assert (ws / "server.log").read_text().count("magpie-serve ready") == 1
    summary = (ws / "summary.txt").read_text()
    assert "output tok/s" in summary and "over 2 repeats" in summary and "not meaningful" in summary
    assert "FAILED" not in summary.splitlines()[0]
    events = read_events(ws)
    assert events[0]["event"] == "run_started" and events[-1]["state"] == "completed"
    assert any(e["event"] == "progress" and e["phase"] == "measure" for e in events)
    detail = json.loads((ws / "requests" / "point0_repeat1.json").read_text())
    assert len(detail["ttfts"]) == 9 and all(0 < t <= lat_s for t, lat_s in zip(detail["ttfts"], detail["latencies"]))
    assert detail["output_lens"] == [8] * 9


@pytest.mark.slow
def test_builtin_profiled_run_collects_traces_with_step_annotations(tmp_path):
    proc = run_magpie("benchmark", "builtin", "--concurrency", "2", "--input-len", "16", "--output-len", "6",
                      "--num-prompts", "4", "--repeats", "2", "--torch-profiler", "-o", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, r = _report(tmp_path)
    assert r["profiling_enabled"] is True and r["run_kind"] == "diagnostic" and r["reward_eligible"] is False
    # The profiler's window: after the first repeat's warm-up to the end of the last repeat's measured load.
    prof = r["control_hooks"]["profiler"]
    assert prof["start"]["ok"] and prof["start"]["after"] == "after the warm-up (2 request(s))"
    assert prof["stop"]["ok"] and prof["stop"]["until"] == "the end of the measured load of repeat 2 of 2"
    assert prof["start"]["at"] <= prof["stop"]["at"]
    assert r["control_hooks"]["prefix_cache_reset"]["points"] == []  # one point: no reset
    traces = list((ws / "torch_trace").glob("*.pt.trace.json.gz"))
    assert len(traces) == 1
    from engine.trace.load import load_trace
    from engine.trace.steps import find_steps
    steps = find_steps(load_trace(traces[0]))
    assert steps and any(s.kind == "prefill" or s.context_requests for s in steps)


def test_base_url_server_and_failures(tmp_path):
    from bench_server import BenchServer, Script
    with BenchServer(Script(tokens=5, itl_s=0.001)) as srv:
        proc = run_magpie("benchmark", "vllm", "-m", "test-model", "--base-url", srv.url, "--concurrency", "2",
                          "--num-prompts", "4", "--input-len", "8", "--output-len", "5", "--http-client", "aiohttp",
                          "--vocab-size", "1000", "-o", tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path)
    assert r["server"] == {"base_url": srv.url, "launched": False}
    assert r["throughput"]["completed_requests"] == 4
    assert r["environment"]["http_client"] == "aiohttp"
    assert {"field": "benchmark.client.http_client", "yaml": "lean", "cli": "aiohttp",
            "flag": "--http-client"} in r["overrides"]
    assert r["dataset"]["prompts"] == "token ids" or r["dataset"]["tokenizer"] == "test-model"
    if r["dataset"]["prompts"] == "token ids":  # no transformers here: ids below the size given
        assert r["dataset"]["vocab_size"] == 1000 and r["dataset"]["vocab_source"] == "client.vocab_size"


def test_the_lean_client_on_each_event_loop_reads_every_token(tmp_path):
    # asyncio's loop reads the streams in its selector (its turn in C where built); uvloop's transports
    # read (auto's choice between them: test_stream_selector). Each gives every token of every request
    # and says which loop ran.
    from bench_server import BenchServer, Script
    import importlib.util
    from engine.eventloop import c_loop_turn
    loops = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
    for loop in loops:
        out = tmp_path / loop
        with BenchServer(Script(tokens=7, itl_s=0.001)) as srv:
            proc = run_magpie("benchmark", "vllm", "-m", "test-model", "--base-url", srv.url, "--concurrency", "3",
                              "--num-prompts", "9", "--input-len", "8", "--output-len", "7", "--event-loop", loop,
                              "--vocab-size", "1000", "-o", out, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _, r = _report(out)
        assert r["environment"]["event_loop"] == loop and r["environment"]["http_client"] == "lean"
        assert r["environment"]["loop_turn"] == (("C" if c_loop_turn() else "Python") if loop == "asyncio" else None)
        assert r["throughput"]["completed_requests"] == 9 and r["throughput"]["total_output_tokens"] == 63


@pytest.mark.slow
def test_chat_endpoint_with_text_prompts(tmp_path):
    proc = run_magpie("benchmark", "builtin", "--endpoint", "chat", "--concurrency", "2", "--input-len", "16",
                      "--output-len", "4", "--num-prompts", "4", "--range-ratio", "1", "-o", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, r = _report(tmp_path)
    assert r["dataset"] == {"name": "random", "path": None, "prompts": "text", "tokenizer": "builtin", "prefix_len": 0}
    assert r["throughput"]["completed_requests"] == 4 and r["throughput"]["total_output_tokens"] == 16
    detail = json.loads((ws / "requests" / "point0_repeat0.json").read_text())
    # server-counted: 16 prompt tokens, the chat template around them, and the BOS
    assert len(set(detail["input_lens"])) == 1 and detail["input_lens"][0] > 16


def test_a_tokenizer_that_cannot_load_fails_before_any_server_starts(tmp_path):
    from engine.bench.tokenizers import transformers_available
    proc = run_magpie("benchmark", "builtin", "--tokenizer", str(tmp_path / "no-such-tokenizer"), "-o", tmp_path,
                      timeout=120)
    if not transformers_available():  # known before anything starts: exit 2, no workspace
        assert proc.returncode == 2 and "needs the transformers package" in proc.stderr
        assert not list(tmp_path.glob("benchmark_*"))
        return
    assert proc.returncode == 1
    ws, r = _report(tmp_path)
    assert r["state"] == "failed" and "no-such-tokenizer" in r["errors"][0]
    assert "server" not in r and not (ws / "server.log").exists()


@pytest.mark.slow
def test_shared_prefix(tmp_path):
    proc = run_magpie("benchmark", "builtin", "--concurrency", "2", "--input-len", "12", "--output-len", "2",
                      "--num-prompts", "4", "--range-ratio", "1", "--prefix-len", "8", "--repeats", "1",
                      "--goodput", "ttft:60000", "e2el:0.001", "-o", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path)
    assert r["dataset"]["prefix_len"] == 8
    # no request ends within 1 us: goodput 0 (a generous TTFT alone would pass them all)
    assert r["result"]["request_goodput"] == 0.0
    assert r["throughput"]["total_input_tokens"] == 4 * (8 + 12)  # server-counted: prefix + input


def test_config_errors(tmp_path):
    proc = run_magpie("benchmark", "-o", tmp_path / "o")
    assert proc.returncode == 2 and "give a framework" in proc.stderr
    bad = tmp_path / "b.yaml"
    bad.write_text("benchmark:\n  model: m\n  framework: tgi\n")
    proc = run_magpie("benchmark", "-b", bad)
    assert proc.returncode == 2 and f"{bad}:3: benchmark.framework: Input should be 'vllm', 'sglang', 'atom' or " \
        "'builtin'" in proc.stderr
    proc = run_magpie("benchmark", "vllm")
    assert proc.returncode == 2 and "needs a model" in proc.stderr
    proc = run_magpie("benchmark", "builtin", "--goodput", "ttft:100", "itl:5")
    assert proc.returncode == 2 and "goodput SLOs are ttft, tpot and e2el (in ms); unknown: itl" in proc.stderr
    proc = run_magpie("benchmark", "builtin", "--goodput", "ttft=100")
    assert proc.returncode == 2 and "--goodput ttft=100: expected KEY:MS" in proc.stderr
    from engine.bench.tokenizers import transformers_available
    if not transformers_available():  # with it, model "m"'s tokenizer is tried (and fails in the run)
        proc = run_magpie("benchmark", "vllm", "-m", "m", "--endpoint", "chat")
        assert proc.returncode == 2 and "set client.tokenizer (--tokenizer)" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_compare_reports_says_what_lies_inside_the_noise(tmp_path):
    from engine.bench.metrics import aggregate_repeats
    a = {"state": "completed", "repeats": aggregate_repeats([
        {"output_throughput": v, "median_ttft_ms": t} for v, t in ((100, 50), (101, 52), (99, 51))])}
    b = {"state": "completed", "repeats": aggregate_repeats([
        {"output_throughput": v, "median_ttft_ms": t} for v, t in ((120, 49), (121, 53), (119, 51))])}
    single = {"state": "completed", "result": {"output_throughput": 110.0, "median_ttft_ms": 50.0}}
    for name, doc in (("a", a), ("b", b), ("one", single)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "benchmark_report.json").write_text(json.dumps(doc))
    proc = run_magpie("benchmark", "--compare-reports", tmp_path / "a", tmp_path / "b")
    assert proc.returncode == 0, proc.stderr
    lines = {ln.split("│")[1].strip(): ln for ln in proc.stdout.splitlines() if ln.count("│") > 5}
    assert "outside" in lines["output_throughput"] and "better" in lines["output_throughput"]
    assert "inside" in lines["median_ttft_ms"] and "tie" in lines["median_ttft_ms"]
    proc = run_magpie("benchmark", "--compare-reports", tmp_path / "a", tmp_path / "one")
    assert proc.returncode == 0 and "noise unknown" in proc.stdout
    proc = run_magpie("benchmark", "--compare-reports", tmp_path / "a", tmp_path / "missing")
    assert proc.returncode == 2 and "cannot read a benchmark report" in proc.stderr


def test_docker_mode_errors_are_reported_in_the_run(tmp_path):
    proc = run_magpie("benchmark", "vllm", "-m", "org/m", "--run-mode", "docker", "--gpu-arch", "sm_90", "--vocab-size", "1000",
                      "-o", tmp_path / "a", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert proc.returncode == 1
    _, r = _report(tmp_path / "a")
    assert r["state"] == "failed" and r["errors"][0].startswith("docker: ")
    proc = run_magpie("benchmark", "builtin", "--run-mode", "docker", "-o", tmp_path / "b")
    _, r = _report(tmp_path / "b")
    assert proc.returncode == 1 and "runs on this host" in r["errors"][0]


@pytest.mark.slow
def test_gpu_selection_pins_a_free_gpu_for_the_server(tmp_path):
    import stat
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in\n"
                   "  *query-gpu*) printf '0, GPU-aaa, 00000000:18:00.0, 512, 81559\\n"
                   "1, GPU-bbb, 00000000:2A:00.0, 80900, 81559\\n' ;;\n"
                   "  *query-compute-apps*) printf '' ;;\n  *) exit 1 ;;\nesac\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    import os
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = run_magpie("benchmark", "builtin", "--num-prompts", "2", "--concurrency", "1", "--input-len", "8",
                      "--output-len", "2", "-o", tmp_path / "o", env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path / "o")
    sel = r["gpu_selection"]
    assert [g["uuid"] for g in sel["gpus"]] == ["GPU-bbb"] and sel["env"] == {"CUDA_VISIBLE_DEVICES": "GPU-bbb"}
    assert "0.5 GB free" in sel["skipped"][0]


def test_bad_envs_stop_before_anything_starts_with_every_problem(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_text("benchmark:\n  framework: builtin\n  envs:\n    CONC: -4\n    ISL: lots\n"
                   "    RANDOM_RANGE_RATIO: 2\n  client: {repeats: 0}\n")
    proc = run_magpie("benchmark", "-b", bad, "-o", tmp_path / "o", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for expected in (f"{bad}:4: benchmark.envs.CONC: the client's max concurrency: expected an integer >= 1, "
                     "got '-4'",
                     f"{bad}:5: benchmark.envs.ISL: input tokens per request: expected an integer >= 1, got 'lots'",
                     f"{bad}:6: benchmark.envs.RANDOM_RANGE_RATIO: Magpie's length ratio (lengths drawn from [L*r, L]; "
                     "1 = fixed): expected a number in [0, 1], got '2'",
                     f"{bad}:7: benchmark.client.repeats:"):
        assert expected in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()
    proc = run_magpie("benchmark", "builtin", "--concurrency", "-4", "-o", tmp_path / "o", timeout=60)
    assert proc.returncode == 2 and "--concurrency -4: the client's max concurrency" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_token_ids_without_a_known_vocabulary_stop_before_any_request(tmp_path):
    from bench_server import BenchServer, Script
    from engine.bench.tokenizers import transformers_available
    if transformers_available():
        import pytest
        pytest.skip("transformers is installed here: the model's tokenizer is tried first")
    with BenchServer(Script(tokens=2)) as srv:
        proc = run_magpie("benchmark", "vllm", "-m", "org/no-folder", "--base-url", srv.url, "-o", tmp_path / "o",
                          timeout=60)
        served = srv.max_in_flight
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "random token-id prompts for vllm 'org/no-folder' need the model's vocabulary size" in proc.stderr
    assert "--vocab-size N" in proc.stderr and "--tokenizer NAME_OR_FOLDER" in proc.stderr
    assert served == 0 and not (tmp_path / "o").exists()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 358}))
    with BenchServer(Script(tokens=2)) as srv:
        proc = run_magpie("benchmark", "vllm", "-m", model, "--base-url", srv.url, "--num-prompts", "3",
                          "--concurrency", "1", "--input-len", "8", "--output-len", "2", "-o", tmp_path / "o",
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path / "o")
    assert r["dataset"]["vocab_size"] == 358 and r["dataset"]["vocab_source"] == f"{model}/config.json"


def test_a_run_whose_every_request_fails_says_so_first(tmp_path):
    from bench_server import BenchServer, Script
    with BenchServer(Script(status=400)) as srv:
        proc = run_magpie("benchmark", "vllm", "-m", "m", "--base-url", srv.url, "--vocab-size", "1000",
                          "--num-prompts", "3", "--concurrency", "1", "--input-len", "8", "--output-len", "2",
                          "--warmup", "0", "-o", tmp_path, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ws, r = _report(tmp_path)
    first = (ws / "summary.txt").read_text().splitlines()[0]
    assert r["state"] == "failed" and first.startswith("ALL 3 REQUESTS FAILED: no measurement")


def test_an_unexpected_exception_still_writes_a_failed_report(tmp_path, monkeypatch):
    """In-process through the job API: whatever breaks inside the run, the report says so."""
    from engine.bench import run as bench_run
    from engine.jobs import BenchmarkRequest, run_benchmark

    def broken(*_a, **_k):
        raise RuntimeError("the load generator exploded")

    monkeypatch.setattr(bench_run, "_run_points", broken)
    from bench_server import BenchServer
    with BenchServer() as srv:  # a server that answers: the run gets as far as its load
        request = BenchmarkRequest(framework="builtin", flags={"base_url": srv.url, "num_prompts": 2})
        outcome = run_benchmark(request, tmp_path)
    assert outcome.exit_code == 1 and outcome.state == "failed"
    on_disk = json.loads((outcome.workspace / "benchmark_report.json").read_text())
    assert on_disk["state"] == "failed" and on_disk["success"] is False
    assert on_disk["errors"] == ["internal error: RuntimeError: the load generator exploded"]
    assert "RuntimeError" in (outcome.workspace / "logs" / "engine_error.log").read_text()
    assert "error: internal error: RuntimeError" in (outcome.workspace / "summary.txt").read_text()
    assert read_events(outcome.workspace)[-1]["state"] == "failed"


@pytest.mark.slow
def test_live_progress_and_server_metrics_of_the_builtin_server(tmp_path):
    proc = run_magpie("benchmark", "builtin", "--concurrency", "4", "--input-len", "16", "--output-len", "32",
                      "--num-prompts", "60", "--range-ratio", "1", "-o", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws, r = _report(tmp_path)
    sm = r["server_metrics"]
    assert sm["available"] is True and sm["scrapes"] >= 2 and sm["file"] == "server_metrics.jsonl"
    rows = [json.loads(line) for line in (ws / "server_metrics.jsonl").read_text().splitlines()]
    assert len(rows) == sm["scrapes"] and all("t" in row for row in rows)
    assert {"magpie_serve_requests_running", "magpie_serve_kv_cache_slots_used",
            "magpie_serve_generation_tokens_total", "magpie_serve_requests_finished_total"} <= set(sm["found"])
    series = sm["series"]
    # the first scrape is taken before the warm-up, the last after the load: the deltas hold all of it
    assert series["magpie_serve_generation_tokens_total"]["delta"] >= 60 * 32
    assert series["magpie_serve_requests_finished_total"]["delta"] >= 60
    assert series["magpie_serve_requests_running"]["kind"] == "gauge"
    assert 1 <= sm["derived"]["decode_batch_size_mean"] <= 4
    progress = [e for e in read_events(ws) if e["event"] == "progress" and e["phase"] == "measure"]
    last = progress[-1]
    assert (last["done"], last["total"], last["completed"], last["failed"]) == (60, 60, 60, 0)
    assert last["output_tok_s"] > 0 and 0 < last["ttft_p50_ms"] and last["tpot_p50_ms"] > 0
    assert last["repeat"] == 0 and last["point_index"] == 0
    assert all(a["done"] <= b["done"] for a, b in zip(progress, progress[1:]))


def _base_url_run(srv, tmp_path, *flags, timeout=120):
    return run_magpie("benchmark", "vllm", "-m", "test-model", "--base-url", srv.url, "--vocab-size", "1000",
                      "--tokenizer", "none", "--warmup", "0", *flags, "-o", tmp_path, timeout=timeout)


def test_custom_jsonl_trace_is_replayed_on_its_timestamps(tmp_path):
    from bench_server import BenchServer, Script
    lines = [{"prompt_token_ids": [1, 2, 3, 4], "output_len": 3, "timestamp": 100.0},
             {"prompt": [5, 6], "output_len": 2, "timestamp": 100.3},
             {"prompt_token_ids": [7], "timestamp": 100.6}]
    data = tmp_path / "trace.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with BenchServer(Script(itl_s=0.001)) as srv:
        proc = _base_url_run(srv, tmp_path / "out", "--dataset-name", "custom", "--dataset-path", data,
                             "--custom-output-len", "4", "--concurrency", "4")
        arrivals = sorted(t for rid, t in srv.arrivals)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path / "out")
    assert r["dataset"]["name"] == "custom" and r["dataset"]["path"] == str(data)
    assert r["throughput"]["completed_requests"] == 3 and r["throughput"]["total_output_tokens"] == 3 + 2 + 4
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert all(0.25 < g < 0.45 for g in gaps), gaps  # released 0.3 s apart, as the timestamps say


def test_a_malformed_jsonl_line_stops_before_anything_starts(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "fine"}\n{"prompt": "x", "output_len": "many"}\n{oops\n')
    proc = run_magpie("benchmark", "vllm", "-m", "m", "--base-url", "http://127.0.0.1:9", "--dataset-name", "custom",
                      "--dataset-path", data, "-o", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{data}:2: output_len: expected an integer >= 1, got 'many'" in proc.stderr + proc.stdout
    assert f"{data}:3: not JSON" in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_duration_run_leaves_the_warmup_and_cooldown_windows_out(tmp_path):
    from bench_server import BenchServer, Script
    with BenchServer(Script(ttft_s=0.02, itl_s=0.01)) as srv:
        proc = _base_url_run(srv, tmp_path, "--duration", "1.5", "--warmup-seconds", "0.4", "--cooldown-seconds",
                             "0.4", "--concurrency", "2", "--input-len", "8", "--output-len", "4",
                             "--range-ratio", "1")
        sent = len(srv.arrivals)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path)
    res = r["result"]
    assert res["measured_window_s"] == [0.4, 1.1] and res["duration"] == pytest.approx(0.7)
    assert res["excluded_requests"] > 0 and res["completed"] + res["excluded_requests"] == sent
    assert res["completed"] >= 4  # ~60 ms a request, two at a time, for 0.7 s


def test_request_rate_sweep_end_to_end(tmp_path):
    from bench_server import BenchServer, Script
    with BenchServer(Script(itl_s=0.001)) as srv:
        proc = _base_url_run(srv, tmp_path, "--sweep", "request_rate=20,80", "--num-prompts", "6",
                             "--concurrency", "4", "--input-len", "8", "--output-len", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path)
    points = [p["point"] for p in r["sweep"]]
    assert [p["request_rate"] for p in points] == [20, 80] and all(p["num_prompts"] == 6 for p in points)
    durations = [p["runs"][0]["duration"] for p in r["sweep"]]
    assert durations[0] > durations[1]  # the slower rate takes longer to release the same prompts


@pytest.mark.slow
def test_find_capacity_bisects_to_the_knee(tmp_path):
    from bench_server import BenchServer, Script
    srv = BenchServer()
    # TTFT grows with the requests in flight (15 ms each): ttft <= 50 ms holds up to 3 at once.
    srv.script_for = lambda _rid, _body: Script(ttft_s=0.015 * srv.in_flight, itl_s=0.001, tokens=2)
    with srv:
        proc = _base_url_run(srv, tmp_path, "--find-capacity", "ttft:50", "--goodput-target", "0.8",
                             "--capacity-max", "8", "--capacity-search", "bisect", "--input-len", "8", "--output-len",
                             "2", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path)
    cap = r["capacity"]
    levels = {lv["level"]: lv for lv in cap["levels"]}
    assert cap["over"] == "concurrency" and cap["slos_ms"] == {"ttft": 50.0} and cap["goodput_target"] == 0.8
    assert cap["search"] == "bisect" and [lv["level"] for lv in cap["levels"]][:4] == [1, 2, 4, 8]
    # Doubling from 1: 4 is usually the last to pass and 8 fails; a busy machine may fail 4 already.
    assert levels[1]["passed"] and not levels[max(levels)]["passed"] and max(levels) in (4, 8)
    assert cap["knee"] in (2, 3, 4) and cap["knee_interval"][1] == cap["knee"] + 1
    assert all({"level", "passed", "goodput_share", "request_throughput", "latency_ms"} <= set(lv)
               for lv in cap["levels"])
    summary = (only_workspace(tmp_path) / "summary.txt").read_text()
    assert "SLO capacity over concurrency" in summary and cap["verdict"] in summary


@pytest.mark.slow
def test_find_capacity_margin_search_reports_the_boundary_interval_binding_slo_and_shape(tmp_path):
    from bench_server import BenchServer, Script
    srv = BenchServer()
    # TTFT grows with the requests in flight (15 ms each) and TPOT stays at 1 ms: ttft binds.
    srv.script_for = lambda _rid, _body: Script(ttft_s=0.015 * srv.in_flight, itl_s=0.001, tokens=3)
    with srv:
        proc = _base_url_run(srv, tmp_path, "--find-capacity", "ttft:50", "tpot:40", "--goodput-target", "0.8",
                             "--capacity-max", "8", "--num-prompts", "12", "--input-len", "8", "--output-len", "3",
                             timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path)
    cap = r["capacity"]
    assert cap["search"] == "margin" and cap["probes"] == sum(lv["repeats"] for lv in cap["levels"])
    levels = sorted(cap["levels"], key=lambda lv: lv["level"])
    assert levels[0]["level"] == 1 and levels[0]["passed"] and not levels[-1]["passed"]
    # Each level's margin: its requests' TTFT over 50 ms at the 80% quantile, TPOT's far below 1.
    assert all(lv["slo_margins"]["tpot"] < 0.5 for lv in levels if lv["slo_margins"])
    assert all(lv["passed"] == (lv["slo_margin"] <= 1) for lv in levels
               if lv["slo_margin"] is not None and lv["repeats"] == 1)
    smoothed = [lv["smoothed_share"] for lv in levels]
    assert smoothed == sorted(smoothed, reverse=True)  # non-increasing in the level
    knee, upper = cap["knee_interval"]
    assert knee in (2, 3, 4) and upper == knee + 1 and cap["binding_slo"] == "ttft"
    low, high = cap["boundary_ci95"]
    assert (low is None or low <= knee) and (high is None or high >= upper)
    assert cap["boundary_shape"] in ("smooth", "cliff") and knee <= cap["boundary"] <= upper
    # One report row per level: a level run again keeps one sweep point with all its runs.
    assert sorted(p["point"]["concurrency"] for p in r["sweep"]) == [lv["level"] for lv in levels]
    summary = (only_workspace(tmp_path) / "summary.txt").read_text()
    assert "margin search" in summary and "95% interval [" in summary and "binding SLO: ttft" in summary
    assert f"boundary: {cap['boundary_shape']}" in summary


def test_capacity_ramp_holds_at_the_knee_in_one_run(tmp_path):
    from aiohttp import web

    from bench_server import BenchServer, Script

    class ControlledServer(BenchServer):
        """Counts the prefix-cache resets and the client's connections (one run keeps its own)."""

        def __init__(self):
            super().__init__()
            self.resets, self.peers = 0, set()

        def app(self):
            app = super().app()
            app.router.add_post("/reset_prefix_cache", self._reset)
            return app

        async def _reset(self, _request):
            self.resets += 1
            return web.Response(status=200)

        async def _handle(self, request):
            self.peers.add(request.transport.get_extra_info("peername")[1])
            return await super()._handle(request)

    srv = ControlledServer()
    # TTFT grows with the requests in flight (15 ms each): ttft <= 50 ms holds up to 3 at once.
    srv.script_for = lambda _rid, _body: Script(ttft_s=0.015 * srv.in_flight, itl_s=0.001, tokens=2)
    with srv:
        proc = _base_url_run(srv, tmp_path, "--find-capacity", "ttft:50", "--goodput-target", "0.8",
                             "--capacity-max", "8", "--capacity-mode", "ramp", "--capacity-search", "bisect",
                             "--ramp-window", "0.3",
                             "--ramp-min-requests", "5", "--ramp-hold", "0.9", "--input-len", "8", "--output-len", "2",
                             timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, r = _report(tmp_path)
    cap = r["capacity"]
    levels = {lv["level"]: lv for lv in cap["levels"]}
    assert cap["mode"] == "ramp" and cap["slos_ms"] == {"ttft": 50.0} and cap["window_s"] == 0.3
    # Doubling from 1: 4 is usually the last to pass and 8 fails; a busy machine may fail 4 already.
    assert levels[1]["passed"] and not levels[max(levels)]["passed"] and max(levels) in (4, 8)
    assert cap["knee"] in (2, 3, 4) and cap["knee_interval"][1] == cap["knee"] + 1
    # The windows in time order: the ramp's levels as the search chose them, then three at the knee.
    windows = cap["windows"]
    assert [w["level"] for w in windows if w["kind"] == "ramp"] == [lv["level"] for lv in cap["levels"]]
    assert [w["kind"] for w in windows[-3:]] == ["hold"] * 3 and all(w["level"] == cap["knee"] for w in windows[-3:])
    assert all(a["window_s"][1] <= b["window_s"][0] for a, b in zip(windows, windows[1:]))
    hold = cap["hold"]
    assert hold["level"] == cap["knee"] and hold["windows"] == 3
    assert hold["interval"]["output_throughput"]["n"] == 3 and hold["interval"]["output_throughput"]["ci95"]
    # The hold is the run's headline; one client for the whole ramp: no more connections than requests at once.
    assert r["result"]["completed"] == hold["result"]["completed"] and r["sweep"][0]["point"]["hold"] is True
    assert len(srv.peers) <= 8 and srv.resets == 1
    reset = r["control_hooks"]["prefix_cache_reset"]
    assert reset["enabled"] and [p["ok"] for p in reset["points"]] == [True]
    summary = (only_workspace(tmp_path) / "summary.txt").read_text()
    assert "ramp over concurrency in one run" in summary and f"hold at concurrency {cap['knee']:g}" in summary
    assert "prefix cache: reset (/reset_prefix_cache) before 1 of 1 load point(s)" in summary
