"""The model source line behind an op, from the Python stacks of a torch-profiler trace.

A trace recorded with ``with_stack=True`` (the built-in server's profiler; vLLM's
``torch_profiler_with_stack``, SGLang's ``SGLANG_PROFILE_WITH_STACK``) holds one
``python_function`` event per Python call, named ``<file>(<line>): <function>`` and linked to
its caller by ``args["Python parent id"]``, plus ``nn.Module: <Class>_<n>`` events for module
calls. The events of a thread nest, and an op recorded on that thread runs inside the innermost
one open when it starts.

The *site* of an op is the innermost frame of the model's own code: a file named ``model.py``
or ``modeling_*.py``, or any file under a ``models/`` folder (``engine/serve/model.py``,
``vllm/model_executor/models/llama.py``, ``sglang/srt/models/...``). Without one in the stack
(sampling, input copies) it is the innermost frame that is not torch, Triton or the standard
library. ``line`` is the first line of that function (``exact`` False, "function start"): the
profiler's Python tracer records where a called function starts, not the line inside the
caller that called it.

A registry op of the built-in server runs inside a ``record_function`` span opened by a small
wrapper (``engine.serve.model``): its site is found from the wrapper's caller, so that the row
names the model function that called the op rather than the wrapper (still its first line).

Exact lines: the built-in server, while profiling, runs each of its model's aten calls (the
embedding, the linear layers, the LM head's matmul) inside a span named
``magpie_site::<file>:<line> <label> in <function>`` (``engine.serve.model``). An op inside
one gets that site (``exact`` True, "call line": the line that made the call), with the
nn.Module class from the stack when there is one (``call_line_sites``); this needs no Python
stack. Traces without these spans (vLLM, SGLang) keep the function-start sites.
"""

from __future__ import annotations

import bisect
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Optional

SITE_PREFIX = "magpie_site::"  # engine.serve.model.SITE_ANNOTATION (this module must not import torch)
_SITE_SPAN = re.compile("^" + re.escape(SITE_PREFIX) + r"(?P<file>.+):(?P<line>\d+) (?P<label>.+) in (?P<function>[^ ]+)$")

_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<function>.*)$")
_MODULE_PREFIX = "nn.Module: "
_MODULE_INDEX = re.compile(r"_\d+$")
_MODEL_FILE = re.compile(r"(^|/)(models/.*\.py|model\.py|modeling_[^/]*\.py)$")
_LIBRARY_ROOTS = ("torch", "triton", "torchgen", "functorch")
_REPO = str(Path(__file__).resolve().parents[2]) + "/"
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


class Spans:
    """Intervals of one thread, sorted, non-overlapping at one nesting level: which one holds t."""

    def __init__(self, items: Iterable[tuple[float, float, Any]]) -> None:
        self.items = sorted(items, key=lambda x: x[0])
        self.starts = [s for s, _, _ in self.items]

    def find(self, t: float) -> Optional[Any]:
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and t <= self.items[i][1]:
            return self.items[i][2]
        return None


class Site(NamedTuple):
    file: str  # shortened: relative to this repository or to site-packages when under them
    line: int  # the call line when ``exact``, else the first line of the function (module docstring)
    function: str
    model: bool  # a frame of the model's code (else the innermost non-library frame)
    module: Optional[str]  # the nn.Module class the op ran in below that frame (Linear), if any
    exact: bool = False  # from a magpie_site span: ``line`` is the line that made the call


def site_of_span(name: str) -> Optional[Site]:
    """The exact site a ``magpie_site::`` span names, or None for any other name."""
    m = _SITE_SPAN.match(name) if name.startswith(SITE_PREFIX) else None
    if m is None:
        return None
    return Site(m["file"], int(m["line"]), m["function"], bool(_MODEL_FILE.search(m["file"])), None, True)


def call_line_sites(events: Iterable[dict], ops: Iterable[dict],
                    stack_sites: Optional[dict[int, Optional[Site]]] = None) -> dict[int, Site]:
    """id(op) -> the exact site of each of ``ops`` (cpu ops or kernel launches) that starts inside
    a ``magpie_site::`` span of its thread (``events``: the trace's), with the nn.Module class of
    its stack site (``stack_sites``, from ``PythonStacks.sites``) when it has one."""
    items: dict[tuple, list[tuple[float, float, Site]]] = defaultdict(list)
    for e in events:
        site = site_of_span(e.get("name", "")) if e.get("cat") == "user_annotation" else None
        if site is not None and "ts" in e:
            items[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e.get("dur", 0.0), site))
    if not items:
        return {}
    spans = {th: Spans(v) for th, v in items.items()}  # the spans do not nest: one call each
    out: dict[int, Site] = {}
    for op in ops:
        th = (op.get("pid"), op.get("tid"))
        site = spans[th].find(op["ts"]) if th in spans and "ts" in op else None
        if site is None:
            continue
        below = (stack_sites or {}).get(id(op))
        out[id(op)] = site._replace(module=below.module) if below is not None else site
    return out


def short_file(path: str) -> str:
    if path.startswith(_REPO):
        return path[len(_REPO):]
    marker = "/site-packages/"
    return path.split(marker, 1)[1] if marker in path else path


def _is_library(path: str) -> bool:
    """torch, Triton and the standard library: never the site of an op."""
    first = path.lstrip("/").split("/", 1)[0]
    if "/site-packages/" in path:
        first = path.split("/site-packages/", 1)[1].split("/", 1)[0]
    elif "/" not in path:  # the tracer writes stdlib files relative to their folder: typing.py
        first = path[:-3] if path.endswith(".py") else path
    elif first not in _LIBRARY_ROOTS and not path.startswith("/"):
        first = path.split("/", 1)[0]  # concurrent/futures/thread.py
    return first in _LIBRARY_ROOTS or first in _STDLIB


class PythonStacks:
    """The ``python_function`` events of one trace, and the site of an op or a span."""

    def __init__(self, events: Iterable[dict]) -> None:
        self.frames: dict[int, dict] = {}
        self.by_thread: dict[tuple, list[dict]] = defaultdict(list)
        for e in events:
            if e.get("cat") != "python_function" or e.get("ph") != "X" or "ts" not in e:
                continue
            pid = (e.get("args") or {}).get("Python id")
            if pid is not None:
                self.frames[pid] = e
            self.by_thread[(e.get("pid"), e.get("tid"))].append(e)
        self._memo: dict[int, tuple] = {}  # id(frame) -> what _info found for it

    def __bool__(self) -> bool:
        return bool(self.by_thread)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.by_thread.values())

    def sites(self, ops: Iterable[dict], spans: Iterable[dict]) -> dict[int, Optional[Site]]:
        """id(event) -> its site, for ``ops`` (the innermost frame open at their start) and for
        ``spans`` opened by a wrapper (the innermost frame holding the whole span is the wrapper:
        the site is found from its caller)."""
        queries: dict[tuple, list[tuple[dict, bool]]] = defaultdict(list)
        for e in ops:
            queries[(e.get("pid"), e.get("tid"))].append((e, False))
        for e in spans:
            queries[(e.get("pid"), e.get("tid"))].append((e, True))
        out: dict[int, Optional[Site]] = {}
        for th, items in queries.items():
            frames = self.by_thread.get(th)
            if not frames:
                for e, _ in items:
                    out[id(e)] = None
                continue
            for e, frame, is_span in _innermost(frames, items):
                out[id(e)] = None if frame is None else self.site_of(frame, skip_first=is_span)
        return out

    def _parent(self, frame: dict) -> Optional[dict]:
        parent = (frame.get("args") or {}).get("Python parent id")
        return self.frames.get(parent) if parent is not None else None

    def site_of(self, frame: dict, skip_first: bool = False) -> Optional[Site]:
        """The site of an op run in ``frame`` (of a span opened by ``frame``, with ``skip_first``)."""
        start = self._parent(frame) if skip_first else frame
        if start is None:
            return None
        model, fallback, module = self._info(start)
        if model is not None:
            return Site(*model, True, module)
        return Site(*fallback, False, module) if fallback is not None else None

    def _info(self, frame: dict) -> tuple[Optional[tuple], Optional[tuple], Optional[str]]:
        """(the nearest model frame at or above ``frame``, the nearest non-library one, the innermost
        nn.Module class below that model frame), each as (file, line, function); memoised per frame,
        so a trace's frames are each read once."""
        path, f = [], frame
        while f is not None and id(f) not in self._memo:
            path.append(f)
            f = self._parent(f)
        above = self._memo[id(f)] if f is not None else (None, None, None)
        for f in reversed(path):
            name = f.get("name", "")
            m = _FRAME.match(name)
            if name.startswith(_MODULE_PREFIX):
                above = (above[0], above[1], _MODULE_INDEX.sub("", name[len(_MODULE_PREFIX):]))
            elif m is not None:
                where = (short_file(m["file"]), int(m["line"]), m["function"])
                if _MODEL_FILE.search(m["file"]):
                    above = (where, where, None)
                elif not _is_library(m["file"]):
                    above = (above[0], where, above[2])
            self._memo[id(f)] = above
        return above


def _innermost(frames: list[dict], items: list[tuple[dict, bool]]) -> list[tuple[dict, Optional[dict], bool]]:
    """For each (event, is_span), the innermost frame of ``frames`` (one thread's, nested) open at
    the event's start; for a span, the innermost one holding all of it (the wrapper that opened it)."""
    # At one time stamp: frames before events, and an enclosing (longer) frame before the ones inside it.
    timeline = sorted([(f["ts"], 0, -f.get("dur", 0.0), i) for i, f in enumerate(frames)]
                      + [(e["ts"], 1, 0.0, j) for j, (e, _) in enumerate(items)])
    stack: list[dict] = []
    out: list[tuple[dict, Optional[dict], bool]] = []
    for ts, kind, _, i in timeline:
        while stack and stack[-1]["ts"] + stack[-1].get("dur", 0.0) < ts:
            stack.pop()
        if kind == 0:
            stack.append(frames[i])
            continue
        event, is_span = items[i]
        if not is_span:
            out.append((event, stack[-1] if stack else None, False))
            continue
        end = ts + event.get("dur", 0.0)
        out.append((event, next((f for f in reversed(stack) if f["ts"] + f.get("dur", 0.0) >= end - 1e-3), None), True))
    return out
