"""The bottleneck table of a profiled run: per inference stage, ops ranked by their share of the
device time, with calls, the ops/kernels behind each row, and which built-in registry op
(``engine.serve.kernels.KERNEL_KEYS``) the row maps to and whether the loop can replace it.

Mapping, most confident first:

* **call site** (confidence ``high``): the built-in server, while profiling, runs each registry
  call inside ``record_function("magpie_kernel::<key>")`` (``engine.serve.model``); every op
  (and, on a GPU, every kernel launched) inside that span belongs to the registry op.
* **kernel/op name** (confidence ``low``): outside such a span a name that looks like a registry
  op (``rms_norm``, ``silu_and_mul``, ``rotary``, ``attention``) is mapped by name only.
* otherwise ``none``: linear layers, copies, the LM head: not replaceable by this loop.

Source lines: on a trace recorded with Python stacks (``with_stack``; the built-in server's
profiler and the loop's profiled twin record them) each row also names the model functions
that called it (file, line, function), with the share of the row's time per line
(``mapping.lines``; ``engine.loop.stacks`` says how one is found). Each line says what it is
(``line_kind``):

* ``call line``: the exact line that made the call. The built-in server's model runs its aten
  calls (the embedding, the qkv/o/gate_up/down linear layers, the LM head's matmul) inside
  ``magpie_site::<file>:<line>`` spans while profiling, so its GEMM and embedding rows
  (``aten::linear``/``aten::matmul``/``aten::embedding`` on the CPU; their ``mm``/``addmm``/
  embedding kernels on a GPU) name the line of ``layer.qkv(h)``, ``rows @ head``, and so on.
  These lines need no Python stack (method ``call-line annotation``).
* ``function start``: the first line of the model function that called the row, all the
  Python tracer records: the registry ops' rows, the rest of the built-in server's ops, and
  every row of a trace without those spans (vLLM's, SGLang's).

A row mapped by kernel name whose model line is found is raised to confidence ``medium``, and
so is a non-registry row (``Python stack``, ``call-line annotation``): they name where it came
from, but only the call-site annotation ties a row to a registry op (``high``). On a trace with
neither stacks nor call-line spans the rows are mapped by name only, as before, and each row
says so (``mapping.stack``).

Time: on a GPU trace, GPU kernel time (each kernel attributed through its launch's correlation
id to the annotation and top-level op that launched it); on a CPU-only trace (the CI server)
the CPU time of the top-level ops, since there is no device timeline. Stages come from the step
annotations (vLLM's detailed names, as the built-in server writes them): ``prefill_only``,
``decode_only``, ``prefilldecode`` and ``all``. Window: the steady state of the profiled steps,
without ramp-up and drain (``engine.loop.window``: the longest run whose decode batch stays near
its median; every step but the first when the trace is too short for one), and the steps with
prompt tokens outside it but the first (a burst of prompts is prefilled in the ramp-up);
``window`` records the steps, the time range and why.

Each row also has ``bound`` (memory or compute) and ``roofline_pct`` on a GPU trace, from the
work its calls recorded and the GPU's ceilings (``engine.loop.roofline``).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

from engine.loop.roofline import arch_of_trace, row_roofline, works_of
from engine.loop.stacks import PythonStacks, Site, Spans, call_line_sites
from engine.loop.window import choose_window
from engine.serve.call_args import ARGS_ANNOTATION, parse_call_args
from engine.trace.steps import parse_step_annotation

# The built-in server's registry ops (engine.serve.kernels.KERNEL_KEYS, which imports torch; a
# test checks that the two agree): this module is read by the workbench, which must not wait for torch.
KERNEL_KEYS = ("rmsnorm", "activation", "rotary", "attention", "decode_attention")
ANNOTATION_PREFIX = "magpie_kernel::"
# A zero-length span at the start of each registry call naming its arguments (shapes, dtypes,
# scalars, the values of small integer tensors): what the harness step rebuilds the call from.
ARGS_PREFIX = ARGS_ANNOTATION
BOTTLENECKS_FILE = "bottlenecks.json"
STAGE_OF_KIND = {"prefill": "prefill_only", "decode": "decode_only", "prefilldecode": "prefilldecode"}
STAGES = ("all", "prefill_only", "decode_only", "prefilldecode")
_NAME_HINTS = (("rms_norm", "rmsnorm"), ("rmsnorm", "rmsnorm"), ("silu_and_mul", "activation"),
               ("act_and_mul", "activation"), ("rotary", "rotary"), ("rope", "rotary"),
               ("flash_attn", "attention"), ("attention", "attention"), ("fmha", "attention"))
TOP_ROWS = 25
TOP_LINES = 5


def _name_hint(name: str) -> Optional[str]:
    low = name.lower()
    for needle, key in _NAME_HINTS:
        if needle in low:
            return key
    return None


def load_trace_events(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _top_level(events: list[dict]) -> list[dict]:
    """The events of one thread that no other of them contains."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0))):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e.get("dur", 0)
    return out


def _by_thread(events: Iterable[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        out[(e.get("pid"), e.get("tid"))].append(e)
    return out


def _shape_key(event: dict) -> Optional[str]:
    dims = (event.get("args") or {}).get("Input Dims")
    if not isinstance(dims, list):
        return None
    shown = [d for d in dims if isinstance(d, list) and d]
    return json.dumps(shown) if shown else None


class _Row:
    def __init__(self, name: str, registry: Optional[str], confidence: str, method: str) -> None:
        self.name, self.registry, self.confidence, self.method = name, registry, confidence, method
        self.calls, self.time_us = 0, 0.0
        self.behind: dict[str, list] = defaultdict(lambda: [0, 0.0])  # op/kernel -> [calls, us]
        self.shapes: dict[str, float] = defaultdict(float)
        self.call_args: dict[str, float] = defaultdict(float)  # args JSON -> us
        self.call_counts: dict[str, int] = defaultdict(int)  # args JSON -> calls
        self.op_calls: dict[str, list] = defaultdict(lambda: [0, 0.0])  # [top-level op, its args] JSON -> [calls, us]
        self.lines: dict[Site, float] = defaultdict(float)  # the source site that called it -> us

    def to_dict(self, total: float, rank: int, arch: Optional[dict] = None, stacks: bool = False) -> dict:
        behind = sorted(self.behind.items(), key=lambda kv: -kv[1][1])[:8]
        shapes = sorted(self.shapes.items(), key=lambda kv: -kv[1])[:3]
        replaceable = self.registry is not None
        return {
            "rank": rank, "name": self.name, "registry_op": self.registry, "replaceable": replaceable,
            "replace_with": f"server kernels.{self.registry}" if replaceable else None,
            "why_not": None if replaceable else "not a registry op of the built-in server (no kernels: key replaces it)",
            "calls": self.calls, "time_us": round(self.time_us, 3),
            "avg_us": round(self.time_us / self.calls, 3) if self.calls else None,
            "share_pct": round(100.0 * self.time_us / total, 2) if total else 0.0,
            "mapping": self.mapping(stacks),
            "behind": [{"name": n, "calls": c, "time_us": round(t, 3)} for n, (c, t) in behind],
            "op_input_shapes": [{"dims": json.loads(k), "time_us": round(t, 3)} for k, t in shapes],
            "call_args": [{"args": json.loads(k), "time_us": round(t, 3),
                           "share_of_op_pct": round(100.0 * t / self.time_us, 2) if self.time_us else 0.0}
                          for k, t in sorted(self.call_args.items(), key=lambda kv: -kv[1])[:5]],
            **self.roofline(arch),
        }

    def mapping(self, stacks: bool) -> dict:
        """How the row maps to its op and to the source lines that called it (the module docstring)."""
        out: dict[str, Any] = {"method": self.method, "confidence": self.confidence}
        exact = any(site.exact for site in self.lines)
        if not stacks and not exact:
            out["stack"] = ("none in the trace (recorded without with_stack): mapped by "
                            + ("the call-site annotation only" if self.confidence == "high" else "name only"))
            out["lines"] = []
            return out
        found = sum(self.lines.values())
        lines = sorted(self.lines.items(), key=lambda kv: -kv[1])
        out["lines"] = [{"file": site.file, "line": site.line,
                         "line_kind": "call line" if site.exact else "function start",
                         "function": site.function, "model_code": site.model, "module": site.module,
                         "time_us": round(t, 3),
                         "share_pct": round(100.0 * t / self.time_us, 2) if self.time_us else 0.0}
                        for site, t in lines[:TOP_LINES]]
        out["lines_left_out_pct"] = round(100.0 * sum(t for _, t in lines[TOP_LINES:]) / self.time_us, 2) \
            if self.time_us else 0.0
        out["unlocated_pct"] = max(0.0, round(100.0 * (self.time_us - found) / self.time_us, 2)) if self.time_us else 0.0
        if not any(site.model for site, _ in lines):
            out["stack"] = "recorded, but no frame of the model's code calls this row" if lines else \
                "recorded, but no Python frame holds this row's ops"
            return out
        if not stacks:
            out["stack"] = ("none in the trace (recorded without with_stack): the lines are the call lines "
                            "the model's magpie_site spans name")
        elif exact:
            out["stack"] = ("recorded: the lines are the model lines that called the row (line_kind: "
                            "the call line from its magpie_site span, or the first line of the function)")
        else:
            out["stack"] = "recorded: the lines are the model functions that called the row (their first lines)"
        how = " + ".join((["call-line annotation"] if exact else []) + (["Python stack"] if stacks else []))
        if self.confidence == "low":
            out["method"], out["confidence"] = "kernel name + " + how, "medium"
        elif self.confidence == "none":
            out["method"], out["confidence"] = how, "medium"
        else:
            out["method"] = self.method + " + " + how
        return out

    def roofline(self, arch: Optional[dict]) -> dict:
        registry = self.registry if self.confidence == "high" else None
        calls = {k: [self.call_counts.get(k, 0), t] for k, t in self.call_args.items()}
        return row_roofline(works_of(calls, self.op_calls, registry), arch)


_OP_ARG_KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")


def _op_key(op: dict) -> str:
    args = op.get("args") or {}
    return json.dumps([op.get("name", ""), {k: args[k] for k in _OP_ARG_KEYS if k in args}])


def _row_for(rows: dict, name: str, registry: Optional[str], confidence: str, method: str) -> _Row:
    key = f"registry:{registry}" if registry and confidence == "high" else f"op:{name}"
    row = rows.get(key)
    if row is None:
        row = rows[key] = _Row(name, registry, confidence, method)
    return row


def _steps(events: list[dict]) -> list[tuple[dict, str, int]]:
    """The step annotations in time order: (event, stage, decode batch size)."""
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "user_annotation":
            info = parse_step_annotation(e.get("name", ""))
            if info is not None:
                out.append((e, STAGE_OF_KIND.get(info.kind, "other"), info.generation_requests))
    out.sort(key=lambda x: x[0]["ts"])
    return out


def _window(steps: list[tuple[dict, str, int]]) -> tuple[list[tuple[dict, str]], dict]:
    """The steps of the steady-state window (``engine.loop.window``) and its record, plus the
    steps with prompt tokens outside it (but the trace's first): a load that sends its prompts
    in one burst prefills them all in the ramp-up, and the ops of prompts (the prefill attention)
    must not drop out of the table."""
    first, last, info = choose_window([b for _, _, b in steps])
    chosen = [(e, stage) for e, stage, _ in steps[first:last + 1]]
    outside = [(e, stage) for i, (e, stage, _) in enumerate(steps)
               if stage in ("prefill_only", "prefilldecode") and i and not first <= i <= last]
    if outside:
        chosen = sorted(chosen + outside, key=lambda es: es[0]["ts"])
    window = {"steps": len(chosen), "steps_in_trace": len(steps), **info, "prompt_steps_outside": len(outside)}
    run = steps[first:last + 1]
    if run:
        t0 = steps[0][0]["ts"]
        start, end = run[0][0]["ts"], max(e["ts"] + e.get("dur", 0.0) for e, _, _ in run)
        window.update({"step_range": [first, last], "steps_before": first, "steps_after": len(steps) - 1 - last,
                       "time_range_us": [round(start - t0, 3), round(end - t0, 3)],
                       "duration_us": round(end - start, 3)})
    return chosen, window


def analyze_trace(path: Path) -> dict:
    """The bottleneck table of one trace file (see the module docstring)."""
    data = load_trace_events(path)
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    device = "gpu" if kernels else "cpu"
    steps = _steps(events)
    window_steps, window = _window(steps)
    stage_of = {id(s): stage for s, stage in window_steps}
    step_spans = {th: Spans((s["ts"], s["ts"] + s.get("dur", 0), (s, stage_of[id(s)])) for s in items)
                  for th, items in _by_thread([s for s, _ in window_steps]).items()}
    annotations = [e for e in events if e.get("cat") == "user_annotation"
                   and e.get("name", "").startswith(ANNOTATION_PREFIX)]
    ann_spans = {th: Spans((a["ts"], a["ts"] + a.get("dur", 0), a) for a in items)
                 for th, items in _by_thread(annotations).items()}
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    stacks = PythonStacks(data.get("traceEvents", []))
    tables: dict[str, dict[str, _Row]] = {st: {} for st in STAGES}
    step_time: dict[str, float] = defaultdict(float)
    step_count: dict[str, int] = defaultdict(int)
    for s, stage in window_steps:
        for st in ("all", stage):
            step_time[st] += s.get("dur", 0.0)
            step_count[st] += 1

    ctx = _Ctx(tables, step_spans, ann_spans, _call_args(events, ann_spans))
    if device == "cpu":
        if stacks:
            ctx.sites = stacks.sites(cpu_ops, annotations)
        ctx.call_lines = call_line_sites(events, cpu_ops, ctx.sites)
        _account_cpu(ctx, cpu_ops, annotations)
    else:
        _account_gpu(ctx, events, kernels, cpu_ops, stacks)
    arch = arch_of_trace(data) if device == "gpu" else None
    out_stages = {}
    for st in STAGES:
        rows = sorted(tables[st].values(), key=lambda r: -r.time_us)
        total = sum(r.time_us for r in rows)
        if not rows:
            continue
        out_stages[st] = {
            "steps": step_count[st], "step_time_us": round(step_time[st], 3), "accounted_time_us": round(total, 3),
            "rows": [r.to_dict(total, i + 1, arch, bool(stacks)) for i, r in enumerate(rows[:TOP_ROWS])],
            "rows_left_out": max(0, len(rows) - TOP_ROWS),
        }
    return {"trace": str(path), "device": device,
            "time_basis": "GPU kernel time" if device == "gpu" else
            "CPU time of top-level ops (a CPU-only trace has no device timeline)",
            "window": window, "annotated": bool(annotations), "call_lines_annotated": bool(ctx.call_lines),
            "python_stacks": {"recorded": bool(stacks), "frames": stacks.count,
                              "note": "rows name the model lines that called them (mapping.lines; a line is the "
                                      "call line where a magpie_site span names it, line_kind 'call line', else the "
                                      "first line of the function: the Python tracer records where a function "
                                      "starts)" if stacks else
                              "the trace has no Python stacks (recorded without with_stack): rows are mapped by "
                              "name or call-site annotation, and lines only where a magpie_site span names "
                              "the call line"}, "gpu_arch": arch.get("name") if arch else None,
            "roofline": ("least time = max(FLOPs / peak, bytes / bandwidth) per call, datasheet ceilings of "
                         f"{arch['name']} (engine.hw.specs)") if arch else None, "stages": out_stages}


def _call_args(events: list[dict], ann_spans: dict) -> dict[int, str]:
    """id(registry annotation) -> the JSON of its call's arguments (from the ARGS_PREFIX span in it)."""
    out: dict[int, str] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "user_annotation" or not name.startswith(ARGS_PREFIX):
            continue
        spans = ann_spans.get((e.get("pid"), e.get("tid")))
        ann = spans.find(e["ts"]) if spans else None
        parsed = parse_call_args(name[len(ARGS_PREFIX):]) if ann is not None else None
        if parsed is not None:
            out[id(ann)] = json.dumps(parsed)  # one key per distinct call
    return out


class _Ctx:
    def __init__(self, tables: dict, step_spans: dict, ann_spans: dict, args_of: dict[int, str]) -> None:
        self.tables, self.step_spans, self.ann_spans, self.args_of = tables, step_spans, ann_spans, args_of
        self.sites: dict[int, Optional[Site]] = {}  # id(op, launch or annotation) -> the source that called it
        self.call_lines: dict[int, Site] = {}  # id(op or launch) -> its exact call line (a magpie_site span)

    def locate(self, th: tuple, t: float) -> tuple[Optional[str], Optional[dict]]:
        """(stage, registry annotation) of a moment on a thread; stage None outside the window."""
        sp = self.step_spans.get(th)
        hit = sp.find(t) if sp else None
        if hit is None:
            return None, None
        ann = self.ann_spans.get(th)
        return hit[1], (ann.find(t) if ann else None)

    def account(self, stage: str, ann: Optional[dict], name: str, dur: float, shape_from: Optional[dict],
                caller: Optional[dict] = None) -> None:
        """Book ``dur`` of op/kernel ``name`` to its row; ``caller`` (the annotation, the op or the
        launch) locates the source line that called it."""
        site = self.call_lines.get(id(caller)) if ann is None and caller is not None else None
        if site is None and self.sites:
            site = self.sites.get(id(ann if ann is not None else caller))
        for st in ("all", stage):
            if ann is not None:
                key = ann["name"][len(ANNOTATION_PREFIX):]
                row = _row_for(self.tables[st], key, key if key in KERNEL_KEYS else None, "high", "call-site annotation")
            else:
                hint = _name_hint(name)
                row = _row_for(self.tables[st], name, hint, "low" if hint else "none", "kernel name" if hint else "none")
            row.time_us += dur
            row.behind[name][0] += 1
            row.behind[name][1] += dur
            if site is not None:
                row.lines[site] += dur
            sk = _shape_key(shape_from) if shape_from is not None else None
            if sk:
                row.shapes[sk] += dur
            args = self.args_of.get(id(ann)) if ann is not None else None
            if args:
                row.call_args[args] += dur
            elif ann is None and shape_from is not None:
                work = row.op_calls[_op_key(shape_from)]
                work[0] += 1
                work[1] += dur


def _account_cpu(ctx: _Ctx, cpu_ops: list[dict], annotations: list[dict]) -> None:
    """CPU time of top-level ops: within a registry span, top level inside it; else in the step."""
    for th, ops in _by_thread(cpu_ops).items():
        spans = ctx.ann_spans.get(th)
        outside = []
        for op in _top_level(ops):
            stage, ann = ctx.locate(th, op["ts"])
            if stage is not None and ann is None:
                ctx.account(stage, None, op["name"], op.get("dur", 0.0), op, op)
                outside.append((stage, op))
        inside = [op for op in ops if spans is not None and spans.find(op["ts"]) is not None]
        for op in _top_level(inside):
            stage, ann = ctx.locate(th, op["ts"])
            if stage is not None and ann is not None:
                ctx.account(stage, ann, op["name"], op.get("dur", 0.0), op)
        for stage, op in outside:
            _count_call(ctx.tables, stage, None, op["name"])
    # One call per annotation span (the CPU ops of one call are not separate calls).
    for th, items in _by_thread(annotations).items():
        for a in items:
            stage, _ = ctx.locate(th, a["ts"])
            if stage is not None:
                _count_call(ctx.tables, stage, a, None, ctx.args_of.get(id(a)))


def _account_gpu(ctx: _Ctx, events: list[dict], kernels: list[dict], cpu_ops: list[dict],
                 stacks: PythonStacks) -> None:
    """GPU kernel time, each kernel placed through its launch (correlation id) on the host thread."""
    launches = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None and e.get("cat") in ("cuda_runtime", "cuda_driver", "hip_runtime"):
            launches[corr] = e
    if stacks:
        spans = [a for items in ctx.ann_spans.values() for _, _, a in items.items]
        ctx.sites = stacks.sites(launches.values(), spans)
    ctx.call_lines = call_line_sites(events, launches.values(), ctx.sites)
    ops_by_thread = {th: Spans((o["ts"], o["ts"] + o.get("dur", 0), o) for o in _top_level(items))
                     for th, items in _by_thread(cpu_ops).items()}
    seen_calls: set = set()
    for k in kernels:
        launch = launches.get((k.get("args") or {}).get("correlation"))
        if launch is None:
            continue
        th = (launch.get("pid"), launch.get("tid"))
        stage, ann = ctx.locate(th, launch["ts"])
        if stage is None:
            continue
        top = ops_by_thread[th].find(launch["ts"]) if th in ops_by_thread else None
        ctx.account(stage, ann, k["name"], k.get("dur", 0.0), top, launch)
        call_key = id(ann) if ann is not None else (id(top) if top is not None else id(k))
        if call_key not in seen_calls:
            seen_calls.add(call_key)
            _count_call(ctx.tables, stage, ann, k["name"] if ann is None else None,
                        ctx.args_of.get(id(ann)) if ann is not None else None)


def _count_call(tables: dict, stage: str, ann: Optional[dict], op_name: Optional[str], args: Optional[str] = None) -> None:
    for st in ("all", stage):
        if ann is not None:
            key = ann["name"][len(ANNOTATION_PREFIX):]
            row = tables[st].get(f"registry:{key}") if key in KERNEL_KEYS else tables[st].get(f"op:{key}")
        else:
            row = tables[st].get(f"op:{op_name}")
        if row is not None:
            row.calls += 1
            if args:
                row.call_counts[args] += 1


def top_replaceable(table: dict, stage: str = "all") -> Optional[dict]:
    for row in table.get("stages", {}).get(stage, {}).get("rows", []):
        if row["replaceable"]:
            return row
    return None
