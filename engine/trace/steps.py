"""Inference step annotations (TraceLens §5.1): the ``user_annotation`` ranges that serving
frameworks emit once per engine step, parsed into request and token counts.

Recognised names (the detailed forms carry the attention aggregates Σq, Σkv, Σq², Σq·kv of the
context (prefill) and generation (decode) requests):

* vLLM detailed ``execute_<n>_context_<Rc>(sq..sk..sqsq..sqsk..)_generation_<Rg>(sq..sk..sqsq..sqsk..)``
  (also what this project's built-in server emits);
* vLLM native ``execute_context_<Rc>(<Σq>)_generation_<Rg>(<Σq>)``;
* SGLang ``step[EXTEND|DECODE|MIXED bs=.. [toks=..] [c=.. g=..] [c_sq=.. ... g_sqsk=..]]``;
* ATOM ``prefill[bs=.. tok=.. ctx=[..] [sqsq=.. sqsk=.. sk=..]]`` / ``decode[bs=.. tok=.. d=.. ...]``.

Counts follow TraceLens's ``IterationAnnotation``: ``batch_size`` is the step's token count
(Σq of both groups for vLLM), ``num_requests`` = context + generation requests.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from engine.trace.load import Trace

StepKind = Literal["prefill", "prefilldecode", "decode", "other"]

_VLLM_DETAILED = re.compile(
    r"execute_\d+_context_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
    r"_generation_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)")
_VLLM_NATIVE = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_SGLANG = re.compile(r"step\[(EXTEND|DECODE|MIXED)\b.*\]")
_ATOM = re.compile(r"(prefill|decode)\[(.*)\]")
_KV_INT = re.compile(r"(\w+)=(\d+)")
# ATOM values: a bracketed list (possibly truncated, "[..]...+3") or one token.
_ATOM_KV = re.compile(r"(\w+)=(\[[^\]]*\](?:\.\.\.\+\d+)?|\S+)")
_FIRST_INT = re.compile(r"\d+")


@dataclass(frozen=True, kw_only=True)
class StepInfo:
    """One engine step. ``ts``/``dur``/``pid``/``tid``/``uid`` locate the annotation in a trace
    (defaults when parsed from a bare name). ``detailed`` is True when the c_*/g_* attention
    aggregates were present in the name (they are 0 otherwise, except c_sq/g_sq)."""

    name: str
    ts: float = 0.0
    dur: float = 0.0
    pid: Any = None
    tid: Any = None
    uid: int = -1
    kind: StepKind
    context_requests: int
    generation_requests: int
    c_sq: int = 0
    c_sk: int = 0
    c_sqsq: int = 0
    c_sqsk: int = 0
    g_sq: int = 0
    g_sk: int = 0
    g_sqsq: int = 0
    g_sqsk: int = 0
    batch_size: int
    num_requests: int
    framework: Literal["vllm", "sglang", "atom"]
    detailed: bool


def _kind(context_requests: int, generation_requests: int) -> StepKind:
    if context_requests > 0:
        return "prefilldecode" if generation_requests > 0 else "prefill"
    return "decode" if generation_requests > 0 else "other"


def _step(name: str, framework: Literal["vllm", "sglang", "atom"], detailed: bool, ctx: int, gen: int,
          batch_size: int, **agg: int) -> StepInfo:
    return StepInfo(name=name, kind=_kind(ctx, gen), context_requests=ctx, generation_requests=gen,
                    batch_size=batch_size, num_requests=ctx + gen, framework=framework, detailed=detailed, **agg)


def _parse_sglang(name: str) -> StepInfo:
    body = name[name.index("[") + 1:name.rindex("]")]
    mode = body.split()[0]
    kv = {k: int(v) for k, v in _KV_INT.findall(body)}
    bs, toks = kv.get("bs", 0), kv.get("toks", 0)
    if any(k.endswith("sqsq") for k in kv):  # TraceLens's detailed form: any "sqsq=<n>" field
        agg = {k: kv.get(k, 0) for k in ("c_sq", "c_sk", "c_sqsq", "c_sqsk", "g_sq", "g_sk", "g_sqsq", "g_sqsk")}
        if mode == "DECODE":
            ctx, gen = 0, bs
        elif mode == "EXTEND":
            ctx, gen = bs, 0
        else:  # MIXED: c= / g= are the per-group request counts
            ctx, gen = kv.get("c", 0), kv.get("g", 0)
        return _step(name, "sglang", True, ctx, gen, agg["c_sq"] + agg["g_sq"] or toks or bs, **agg)
    if mode == "DECODE":
        return _step(name, "sglang", False, 0, bs, bs, g_sq=bs)
    if mode == "MIXED" and ("c" in kv or "g" in kv):
        # Not in TraceLens's native parser (it rejects extra fields); the counts are explicit here.
        return _step(name, "sglang", False, kv.get("c", 0), kv.get("g", 0), toks or bs, c_sq=toks)
    # EXTEND (and MIXED without counts, as TraceLens does): prefill of bs requests, toks tokens.
    return _step(name, "sglang", False, bs, 0, toks or bs, c_sq=toks)


def _parse_atom(phase: str, body: str, name: str) -> StepInfo:
    kv = dict(_ATOM_KV.findall(body))
    m = _FIRST_INT.search(kv.get("bs", ""))
    bs = int(m.group()) if m else 0  # "bs=117/128": the real batch before CUDA-graph padding
    tok = _int(kv.get("tok"))
    detailed = "sqsq" in kv and "sqsk" in kv
    sk, sqsq, sqsk = _int(kv.get("sk")), _int(kv.get("sqsq")), _int(kv.get("sqsk"))
    if phase == "prefill":
        return _step(name, "atom", detailed, bs, 0, tok, c_sq=tok, c_sk=sk, c_sqsq=sqsq, c_sqsk=sqsk)
    return _step(name, "atom", detailed, 0, bs, tok, g_sq=tok, g_sk=sk, g_sqsq=sqsq, g_sqsk=sqsk)


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


def parse_step_annotation(name: str) -> StepInfo | None:
    """Parse one annotation name (pure: no trace needed). None when it is not a step annotation."""
    m = _VLLM_DETAILED.match(name)
    if m:
        rc, csq, csk, csqsq, csqsk, rg, gsq, gsk, gsqsq, gsqsk = map(int, m.groups())
        return _step(name, "vllm", True, rc, rg, csq + gsq, c_sq=csq, c_sk=csk, c_sqsq=csqsq, c_sqsk=csqsk,
                     g_sq=gsq, g_sk=gsk, g_sqsq=gsqsq, g_sqsk=gsqsk)
    m = _VLLM_NATIVE.match(name)
    if m:
        rc, cq, rg, gq = map(int, m.groups())
        return _step(name, "vllm", False, rc, rg, cq + gq, c_sq=cq, g_sq=gq)
    if _SGLANG.match(name):
        return _parse_sglang(name)
    m = _ATOM.match(name)
    if m:
        return _parse_atom(m.group(1), m.group(2), name)
    return None


def find_steps(trace: Trace) -> list[StepInfo]:
    """The trace's step annotations, sorted by start time. As in TraceLens, detailed annotations
    win: when any step carries the c_*/g_* aggregates, steps without them are not roots."""
    found = _FOUND.get(trace)
    if found is not None:  # the analysis asks several times (idle causes, the split, the report)
        return list(found)
    steps: list[StepInfo] = []
    parsed: dict[int, StepInfo | None] = {}  # by name: an annotation name repeats every step
    for uid in trace.uids_where(lambda ph, cat: cat == "user_annotation" and ph == "X"):
        name = trace.name[uid]
        info = parsed[name] if name in parsed else parsed.setdefault(name, parse_step_annotation(trace.names[name]))
        if info is not None:
            steps.append(dataclasses.replace(info, ts=trace.ts_of(uid), dur=trace.dur_of(uid), pid=trace.pid_of(uid),
                                             tid=trace.tid_of(uid), uid=uid))
    if any(s.detailed for s in steps):
        steps = [s for s in steps if s.detailed]
    steps.sort(key=lambda s: s.ts)
    _FOUND[trace] = tuple(steps)
    return steps


_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # trace -> its steps (StepInfo is frozen)
