"""Control hooks around a benchmark's load (engine/bench/control.py): when the prefix cache is
reset and by which route, how an answer is judged, failures said once as warnings, the profiler's
start and stop recorded; and the ramp's adjustable concurrency gate (engine/bench/ramp.py)."""

import asyncio

import pytest
from aiohttp import web

from bench_server import BenchServer
from engine.bench.control import ControlHookError, ControlHooks, hook_lines, reset_plan
from engine.bench.launch import server_command
from engine.bench.ramp import _Gate
from engine.config.benchmark import BenchmarkConfig


def _cfg(framework="vllm", **client):
    return BenchmarkConfig.model_validate({"framework": framework, "model": "" if framework == "builtin" else "m",
                                           "client": client})


def test_resets_are_on_for_sweeps_and_capacity_searches_and_off_for_one_point():
    assert reset_plan(_cfg())[0] is False
    assert reset_plan(_cfg(sweep={"concurrency": [1, 2]})) == (
        True, "on: a sweep of 2 points (the default for sweeps and capacity searches)")
    assert reset_plan(_cfg(sweep={"concurrency": [4]}))[0] is False  # one point is no sweep
    assert reset_plan(_cfg(find_capacity={"ttft": 100}))[0] is True
    assert reset_plan(_cfg(find_capacity={"ttft": 100}, capacity_mode="ramp"))[0] is True
    assert reset_plan(_cfg(reset_prefix_cache=True))[0] is True
    assert reset_plan(_cfg(sweep={"concurrency": [1, 2]}, reset_prefix_cache=False))[0] is False
    assert reset_plan(_cfg("atom", sweep={"concurrency": [1, 2]})) == (False, "off: atom has no prefix-cache reset route")
    builtin_off = BenchmarkConfig.model_validate({"framework": "builtin", "server": {"prefix_caching": False},
                                                  "client": {"sweep": {"concurrency": [1, 2]}}})
    assert reset_plan(builtin_off)[0] is False


def test_a_ramp_refuses_what_it_cannot_do_before_anything_starts():
    from pydantic import ValidationError
    ramp = {"find_capacity": {"ttft": 100}, "capacity_mode": "ramp"}
    for extra, why in (({"client_procs": 2}, "one client process"), ({"repeats": 3}, "remove repeats"),
                       ({"dataset_name": "sessions"}, "multi-turn session replays")):
        with pytest.raises(ValidationError, match=why):
            _cfg(**ramp, **extra)
    with pytest.raises(ValidationError, match="profiles its hold at the knee"):
        BenchmarkConfig.model_validate({"framework": "builtin", "client": {**ramp, "ramp_hold": 0},
                                        "profiler": {"torch_profiler": {"enabled": True}}})


def test_a_launched_vllm_gets_its_dev_mode_only_while_the_run_resets():
    # vLLM mounts /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1.
    assert server_command(_cfg(sweep={"concurrency": [1, 2]}), 8000).env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in server_command(_cfg(), 8000).env
    mine = BenchmarkConfig.model_validate({"framework": "vllm", "model": "m", "server_env": {"VLLM_SERVER_DEV_MODE": "0"},
                                           "client": {"sweep": {"concurrency": [1, 2]}}})
    assert server_command(mine, 8000).env["VLLM_SERVER_DEV_MODE"] == "0"  # the user's own value stands
    assert "VLLM_SERVER_DEV_MODE" not in server_command(_cfg("sglang", sweep={"concurrency": [1, 2]}), 8000).env


class HookServer(BenchServer):
    """The scripted server with the control routes, each answering as ``answers[route]`` says."""

    def __init__(self, answers):
        super().__init__()
        self.answers = answers
        self.calls = []

    def app(self):
        app = super().app()
        for route in self.answers:
            app.router.add_post(route, self._hook)
        return app

    async def _hook(self, request):
        self.calls.append((request.path, await request.json() if request.can_read_body else None))
        status, body = self.answers[request.path]
        return web.Response(status=status, text=body, content_type="application/json" if body[:1] == "{" else "text/plain")


def _hooks(cfg, url):
    report, warnings, logs, events = {}, [], [], []
    hooks = ControlHooks(cfg, url, report, warnings, logs.append, lambda event, **f: events.append((event, f)))
    return hooks, report, warnings, logs, events


def test_each_reset_is_recorded_and_a_failure_is_a_warning_said_once():
    answers = {"/reset_prefix_cache": (200, ""), "/flush_cache": (400, "Cache not flushed: requests are running\n")}
    with HookServer(answers) as srv:
        hooks, report, warnings, logs, events = _hooks(_cfg(sweep={"concurrency": [1, 2]}), srv.url)
        assert hooks.reset_before(0, {"concurrency": 1}).ok
        sg, sg_report, sg_warnings, sg_logs, _ = _hooks(_cfg("sglang", sweep={"concurrency": [1, 2]}), srv.url)
        for i in range(2):
            assert not sg.reset_before(i, {"concurrency": i + 1}).ok
        assert [p for p, _ in srv.calls] == ["/reset_prefix_cache", "/flush_cache", "/flush_cache"]
    section = report["control_hooks"]["prefix_cache_reset"]
    assert section["enabled"] and section["route"] == "/reset_prefix_cache"
    assert section["points"][0] | {"seconds": 0} == {"point_index": 0, "point": {"concurrency": 1},
                                                     "hook": "reset_prefix_cache", "route": "/reset_prefix_cache",
                                                     "ok": True, "status": 200, "seconds": 0, "error": None}
    assert events[0][0] == "control_hook" and events[0][1]["ok"] is True and not warnings
    points = sg_report["control_hooks"]["prefix_cache_reset"]["points"]
    assert [(p["status"], p["ok"]) for p in points] == [(400, False), (400, False)]
    assert points[0]["route"] == "/flush_cache?timeout=30"  # SGLang waits for running requests to end
    assert "HTTP 400" in points[0]["error"] and "requests are running" in points[0]["error"]
    assert len(sg_warnings) == 1 and "before point concurrency 1 failed" in sg_warnings[0]  # the same failure once
    assert "--no-reset-prefix-cache" in sg_warnings[0] and sg_logs.count(f"warning: {sg_warnings[0]}") == 1
    assert hook_lines(sg_report) == [f"prefix cache: reset (/flush_cache) before 0 of 2 load point(s); FAILED before 2: "
                                     f"{points[0]['error']}"]


def test_a_reset_answered_200_with_success_false_did_not_happen_and_a_missing_route_says_why():
    with HookServer({"/reset_prefix_cache": (200, '{"success": false}')}) as srv:
        hooks, report, warnings, _, _ = _hooks(_cfg(reset_prefix_cache=True), srv.url)
        result = hooks.reset_before(0, {})
    assert not result.ok and result.status == 200 and "did not do it" in result.error
    with HookServer({"/reset_prefix_cache": (409, '{"detail": "Prefix cache reset failed."}')}) as srv:
        hooks, *_ = _hooks(_cfg(reset_prefix_cache=True), srv.url)
        result = hooks.reset_before(0, {})
        tries = len(srv.calls)
    assert tries == 3 and result.status == 409 and "reset failed" in result.error  # vLLM: blocks still held
    with HookServer({}) as srv:
        hooks, report, warnings, _, _ = _hooks(_cfg(reset_prefix_cache=True), srv.url)
        assert hooks.reset_before(0, {}, "the capacity ramp").status == 404
    assert "reset before the capacity ramp failed" in warnings[0] and "VLLM_SERVER_DEV_MODE=1" in warnings[0]
    # off: nothing is sent, and the report says why
    hooks, report, warnings, _, events = _hooks(_cfg(), "http://127.0.0.1:9")
    assert hooks.reset_before(0, {}) is None and not events
    assert report["control_hooks"]["prefix_cache_reset"]["why"].startswith("off: one load point")


def test_the_profiler_start_and_stop_are_recorded_and_a_start_that_fails_ends_the_run():
    answers = {"/start_profile": (200, '{"status": "profiling"}'), "/stop_profile": (500, "flush failed")}
    with HookServer(answers) as srv:
        hooks, report, warnings, _, events = _hooks(_cfg(), srv.url)
        hooks.start_profile({"max_iterations": 8}, "after the warm-up (2 request(s))")
        hooks.stop_profile(5, "the end of the measured load of repeat 1 of 1")
        calls = list(srv.calls)
    prof = report["control_hooks"]["profiler"]
    assert prof["start"]["ok"] and prof["start"]["body"] == {"max_iterations": 8} and calls[0][1] == {"max_iterations": 8}
    assert not prof["stop"]["ok"] and prof["stop"]["status"] == 500 and warnings == [f"/stop_profile: {prof['stop']['error']}"]
    assert [e for e, _ in events] == ["control_hook", "control_hook"]
    assert hook_lines(report)[-1].startswith("profiler: started after the warm-up (2 request(s)), stopped at the end of")
    with HookServer({}) as srv:
        hooks, report, *_ = _hooks(_cfg(), srv.url)
        with pytest.raises(ControlHookError, match="profiler did not start: .*HTTP 404"):
            hooks.start_profile({}, "after the warm-up (0 request(s))")
    assert report["control_hooks"]["profiler"]["start"]["ok"] is False


def test_the_ramp_gate_follows_its_limit_up_and_down():
    async def go():
        gate = _Gate(1)
        await gate.acquire()
        waiter = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        assert not waiter.done() and gate.waiting == 1
        gate.set_limit(2)  # a higher limit lets the waiter in at once
        await asyncio.sleep(0)
        assert waiter.done() and gate.used == 2
        gate.set_limit(1)  # a lower one lets nobody in until the load is below it
        third = asyncio.ensure_future(gate.acquire())
        gate.release()
        await asyncio.sleep(0)
        assert not third.done() and gate.used == 1
        gate.release()
        await asyncio.sleep(0)
        assert third.done() and gate.used == 1
        cancelled = asyncio.ensure_future(gate.acquire())  # a cancelled waiter holds no slot
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        gate.release()
        assert gate.used == 0 and gate.waiting == 0
    asyncio.run(go())


def _ramp(url, over, slos, ceiling, hold_s, window_s=0.15, start=1.0):
    from engine.bench.capacity import CapacitySearch
    from engine.bench.dataset import SampleRequest
    from engine.bench.loadgen import LoadGenConfig
    from engine.bench.ramp import RampGenerator, ramp_sections
    search = CapacitySearch(over=over, target=0.8, ceiling=ceiling, max_steps=6, start=start)
    config = LoadGenConfig(base_url=url, model="fake", max_concurrency=4 if over == "request_rate" else None,
                           request_timeout_s=10, event_loop="asyncio")
    lg = RampGenerator(config, [SampleRequest(prompt=[1, 2, 3], prompt_len=3, output_len=2, request_id="0")], search,
                       slos=slos, window_s=window_s, min_requests=2, hold_s=hold_s)
    result = asyncio.run(lg.run())
    return lg, result, ramp_sections(lg, search, slos, {"concurrency": 4}, None)


def test_a_rate_ramp_climbs_to_the_ceiling_and_holds_there_in_three_windows():
    from bench_server import Script
    with BenchServer(Script(itl_s=0.001, tokens=2)) as srv:
        lg, result, (section, points) = _ramp(srv.url, "request_rate", {"e2el": 2000}, 16, hold_s=0.3, start=4)
    assert [w["level"] for w in section["windows"]] == [4, 8, 16, 16, 16, 16]
    assert [w["kind"] for w in section["windows"]] == ["ramp"] * 3 + ["hold"] * 3
    assert all(w["passed"] and w["requests"] >= 2 for w in section["windows"])
    assert section["knee"] == 16 and section["hold"]["windows"] == 3 and section["hold"]["level"] == 16
    assert points[0]["point"]["hold"] is True and points[0]["point"]["request_rate"] == 16.0
    assert len(points) == 4 and not result.cancelled  # the hold, then each level
    # Every request after the warm-up is in the run's outputs, those of a window in its window.
    assert sum(w["requests"] for w in section["windows"]) <= len(result.outputs) == len(lg.measured)


def test_a_ramp_whose_first_level_fails_has_no_hold_and_says_so():
    from bench_server import Script
    from engine.bench.capacity import capacity_table
    with BenchServer(Script(ttft_s=0.02, tokens=2)) as srv:
        _, _, (section, points) = _ramp(srv.url, "concurrency", {"ttft": 1}, 8, hold_s=1)
    assert [w["level"] for w in section["windows"]] == [1] and section["hold"] is None
    assert section["knee"] is None and [p["level"] for p in points] == [1]
    text = "\n".join(capacity_table(section))
    assert "no level tried met the target" in text and "FAIL" in text and "hold at" not in text
