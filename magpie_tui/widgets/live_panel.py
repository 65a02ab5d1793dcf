"""The live view of a benchmark run, the first thing the Run screen shows: where the run is
(phase, repeat i of n, ETA), its requests (done of the total and its share, failed and their share,
in flight, requests a second), output tok/s and
TTFT / TPOT p50 and p99 so far, each beside a sparkline of the last minute, and the server's own
numbers (running and waiting requests, KV-cache use) when it exposes /metrics.

Laid out for 80 columns: every number sits in a fixed-width cell on the left and the sparklines
take the width left over, so a narrow window narrows the sparklines, never the numbers. Once the
run has finished it shows the report's own figures (``RunFigures``), not its last repeat's live
numbers.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from engine.jobs.query import RunInfo, run_eta_s

LABEL_WIDTH = 38  # the numbers' cell: "TTFT p50 1234 ms · p99 12345 ms" fits with room
RANGE_WIDTH = 13  # after each sparkline, the lowest and highest value it draws: " 41.5–47.5 ms"


def format_ms(v: Optional[float]) -> str:
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:.0f} ms"
    return f"{v:.1f} ms" if v >= 10 else f"{v:.2f} ms"


def format_rate(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.0f}"


def format_duration(s: Optional[float]) -> str:
    if s is None:
        return "–"
    s = int(round(s))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _figure(fig: Any, fmt: Any) -> str:
    """A report figure: its mean, and over several repeats how many with the 95% interval."""
    if fig is None:
        return "–"
    text = fmt(fig.mean)
    if fig.n > 1 and fig.ci95:
        text += f"  mean of {fig.n}, 95% CI {fmt(fig.ci95[0])}–{fmt(fig.ci95[1])}"
    elif fig.n > 1:
        text += f"  mean of {fig.n}"
    return text


# A stage before the load, as the engine names it, in the words of someone waiting for it.
_STAGES = {"server running": "starting the server (until it answers)", "server SUCCESS": "server ready",
           "server success": "server ready"}


def _short(v: float) -> str:
    return f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.3g}" if v < 1000 else f"{v:.0f}"


def _series(values: Sequence[Optional[float]]) -> list[float]:
    return [v for v in values if v is not None]


class LivePanel(Vertical):
    """A benchmark run's live numbers (see the module's docstring); ``show(info)`` refreshes it."""

    DEFAULT_CSS = """
    LivePanel { height: auto; padding: 0 1; }
    LivePanel .live-row { height: 1; }
    LivePanel .live-cell { width: %d; height: 1; }
    LivePanel .live-line { height: 1; }
    LivePanel Sparkline { width: 1fr; height: 1; }
    LivePanel .live-range { width: %d; height: 1; padding: 0 0 0 1; color: $text-muted; }
    LivePanel.-finished .live-cell { width: 1fr; }
    """ % (LABEL_WIDTH, RANGE_WIDTH)

    def compose(self):
        yield Static("", id="live-where", classes="live-line")
        yield Static("", id="live-requests", classes="live-line")
        for key in ("tok", "ttft", "tpot"):
            with Horizontal(classes="live-row", id=f"live-row-{key}"):
                yield Static("", id=f"live-{key}", classes="live-cell")
                yield Sparkline([], id=f"live-spark-{key}")
                yield Static("", id=f"live-range-{key}", classes="live-range")
        yield Static("", id="live-server", classes="live-line")

    def show(self, info: RunInfo) -> None:
        status = info.status
        self.set_class(status.is_finished, "-finished")
        if status.is_finished:
            self._show_finished(info)
        else:
            self._show_running(info)

    def _put(self, key: str, text: str) -> None:
        self.query_one(f"#live-{key}", Static).update(text)

    def _show_sparks(self, visible: bool, history: Sequence[Any] = ()) -> None:
        """The last minute's sparklines, each followed by the lowest and highest value it draws (a
        sparkline spans its own range: a flat run would otherwise look like a wild one)."""
        for key, attr, unit in (("tok", "output_tok_s", ""), ("ttft", "ttft_p50_ms", " ms"),
                                ("tpot", "tpot_p50_ms", " ms")):
            spark = self.query_one(f"#live-spark-{key}", Sparkline)
            scale = self.query_one(f"#live-range-{key}", Static)
            spark.display = scale.display = visible
            if visible:
                data = _series([getattr(h, attr) for h in history])
                spark.data = data
                scale.update(f"{_short(min(data))}–{_short(max(data))}{unit}" if data else "")

    def _show_running(self, info: RunInfo) -> None:
        status = info.status
        p, v = status.progress, status.live
        where = [p.phase.replace("warmup", "warm-up") if p.phase else _STAGES.get(status.stage, status.stage or "starting")]
        if p.repeat is not None and p.repeats is not None:
            where.append(f"repeat {p.repeat} of {p.repeats}")
        if p.point:
            where.append(" ".join(f"{k}={val}" for k, val in p.point.items() if not isinstance(val, dict))[:24])
        if v is not None and v.elapsed_s is not None and not p.warmup:
            where.append(f"elapsed {format_duration(v.elapsed_s)}")
        eta = run_eta_s(status)
        where.append(f"ETA {format_duration(eta)}" if eta is not None else "ETA –")
        self._put("where", " · ".join(x for x in where if x))
        req = p.requests
        if p.warmup:
            self._put("requests", f"warm-up requests {p.done or 0}/{p.total or '?'} done (not measured)")
        elif req is not None or p.done is not None:
            total = p.total if p.total else "?"  # a duration-bounded run has no total
            done = p.done or 0
            failed = req.failed if req is not None and req.failed is not None else 0
            # As AIPerf's progress panel: how far as a share, errors as a share of those ended, and
            # the request rate, so that "is it going well" needs no arithmetic.
            share = f" ({100 * done // p.total}%)" if p.total else ""
            parts = [f"requests {done}/{total} done{share}",
                     f"{failed} failed" + (f" ({100 * failed / done:.1f}%)" if failed and done else ""),
                     f"{v.in_flight} in flight" if v is not None and v.in_flight is not None else "in flight –"]
            if v is not None and v.elapsed_s and done:
                parts.append(f"{done / v.elapsed_s:.1f} req/s")
            if req is not None and req.never_sent:
                parts.append(f"{req.never_sent} never sent")
            self._put("requests", " · ".join(parts))
        else:
            self._put("requests", "requests: waiting for the load to start")
        live = v if not p.warmup else None
        self._put("tok", f"output tok/s {format_rate(live.output_tok_s) if live else '–'}")
        self._put("ttft", f"TTFT p50 {format_ms(live.ttft_p50_ms if live else None)}"
                          f" · p99 {format_ms(live.ttft_p99_ms if live else None)}")
        self._put("tpot", f"TPOT p50 {format_ms(live.tpot_p50_ms if live else None)}"
                          f" · p99 {format_ms(live.tpot_p99_ms if live else None)}")
        self._show_sparks(True, status.history)
        server = self.query_one("#live-server", Static)
        if v is not None and any(x is not None for x in (v.server_running, v.server_waiting, v.server_kv_cache)):
            parts = []
            if v.server_running is not None:
                parts.append(f"{v.server_running} running")
            if v.server_waiting is not None:
                parts.append(f"{v.server_waiting} waiting")
            if v.server_kv_cache is not None:
                parts.append(f"KV cache {v.server_kv_cache * 100:.0f}%")
            server.update("server " + " · ".join(parts))
            server.display = True
        else:
            server.display = False

    def _show_finished(self, info: RunInfo) -> None:
        status, f = info.status, info.status.figures
        self._show_sparks(False)
        self.query_one("#live-server", Static).display = False
        exit_part = f" · exit {status.exit_code}" if status.exit_code is not None else ""
        self._put("where", f"{status.state}{exit_part} · the report's figures")
        if f is None or f.requests is None:
            self._put("requests", "the run wrote no figures: see the Summary tab and the report")
            for key in ("tok", "ttft", "tpot"):
                self._put(key, "")
            return
        parts = [f"requests {f.completed}/{f.requests} completed", f"{f.failed or 0} failed"]
        if f.never_sent:
            parts.append(f"{f.never_sent} never sent")
        self._put("requests", " · ".join(parts))
        self._put("tok", "output tok/s " + _figure(f.output_tok_s, format_rate))
        self._put("ttft", "TTFT p50 " + _figure(f.ttft_p50_ms, format_ms))
        self._put("tpot", "TPOT p50 " + _figure(f.tpot_p50_ms, format_ms))
