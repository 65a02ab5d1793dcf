"""TraceLens's inference-trace splitter (``TraceLens_split_inference_trace``, spec §5.2) and
Magpie's per-stage step pick (§5.5 step 2).

From the step annotations (``engine.trace.steps``) it writes

* one trace per step, ``<base>_annotation_iteration_<i>_<sanitised annotation>.json.gz``
  (``store_single_iteration``);
* three contiguous windows from the largest steady-state region (``find_steady_state``):
  ``mixed_steady_state_*``, ``decode_only_steady_state_*``, ``prefilldecode_steady_state_*``;
* ``execution_details.json`` / ``.csv`` describing every written trace, with TraceLens's
  columns and values.

A step's slice holds the CPU ``X`` events on the annotation's (pid, tid) that lie inside its
span, then the flow events and GPU events (kernel, memcpy, memset, GPU annotation) whose
correlation id one of those CPU events carries. Like TraceLens, no ``M`` events are copied:
TraceLens keeps only events without a ``ts`` as metadata and Kineto's ``M`` events have one
(so reports on the slices show ``Unknown`` process/thread names, as the golden stage CSVs do).
The original top-level keys (``deviceProperties``, ...) are written around ``traceEvents``.
"""

from __future__ import annotations

import csv
import gc
import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from engine.trace.deflate import zlib
from engine.trace.forked import ForkedCall
from engine.trace.load import ODD_ID, EventWriter, Trace
from engine.trace.steps import StepInfo, find_steps

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})
MIXED, DECODE_ONLY, PREFILLDECODE = "mixed_steady_state", "decode_only_steady_state", "prefilldecode_steady_state"
WINDOW_LABELS = (MIXED, DECODE_ONLY, PREFILLDECODE)
CSV_COLUMNS = ("idx", "output_path", "event_count", "num_gpu_events", "gpu_duration", "gpu_busy_duration",
               "phase_num_prefill", "phase_num_prefilldecode", "phase_num_decode", "phase_avg_bs",
               "phase_avg_conc", "num_steps")
_GZIP_LEVEL = 1  # the slices are re-read by the report; speed matters more than size
_OPEN_AFTER = 5  # a region opens once more than this many near-peak steps were seen


# --------------------------------------------------------------------------- steady state

@dataclass
class SteadyState:
    """Regions and chosen windows, as [start, end) step indices. ``mixed_num_steps`` is
    ``num_steps`` raised to ceil(1/ideal ratio) when CONC/OSL/R are given (mixed window only,
    as in TraceLens, where the other two windows keep the requested ``num_steps``)."""

    regions: list[tuple[int, int]]
    found: bool  # False: no region, ``regions`` is the middle-slice fallback
    reference_ratio: float
    ideal_ratio: float | None
    mixed_num_steps: int
    windows: dict[str, tuple[int, int]]
    warnings: list[str] = field(default_factory=list)


def find_steady_state_regions(num_requests: Sequence[int], num_steps: int) -> list[tuple[int, int]]:
    """TraceLens's region scan. A step is near peak if |requests - max| <= max(1, t*max), with
    t = 0.1 (0.2 when there are fewer steps than ``num_steps``). Before a region opens, near-peak
    steps are counted (off-peak ones do not reset the count); when the count exceeds 5 a region
    opens, back-dated over those steps. Once open, each off-peak step decrements the count and the
    region closes (exclusive) at the step where it reaches 0. A region still open at the end stops
    one step short of the last step (TraceLens's quirk)."""
    n = len(num_requests)
    if n == 0:
        return []
    peak = max(num_requests)
    tolerance = max(1.0, (0.1 if n >= num_steps else 0.2) * peak)
    regions: list[tuple[int, int]] = []
    count, start, is_open = 0, 0, False
    for i, req in enumerate(num_requests):
        near = abs(req - peak) <= tolerance
        if not is_open:
            count += near
            if count > _OPEN_AFTER:
                is_open, start = True, i - count + 1
        elif not near:
            count -= 1
            if count <= 0:
                regions.append((start, i))
                is_open, count = False, 0
    if is_open:
        regions.append((start, n - 1))
    return regions


def middle_slice(n: int, num_steps: int) -> tuple[int, int]:
    """TraceLens's fallback when no region is found: drop delta/2 steps at each end."""
    delta = min(n, max(8, num_steps - n))
    start = delta // 2
    return start, max(start + 1, min(n, n - delta // 2))


def _longest_run(flags: Sequence[bool], lo: int, hi: int) -> tuple[int, int] | None:
    """First longest run of True in flags[lo:hi]."""
    best: tuple[int, int] | None = None
    run_start: int | None = None
    for i in range(lo, hi + 1):
        if i < hi and flags[i]:
            if run_start is None:
                run_start = i
        elif run_start is not None:
            if best is None or i - run_start > best[1] - best[0]:
                best = (run_start, i)
            run_start = None
    return best


def detect_steady_state(steps: Sequence[StepInfo], num_steps: int = 32, *, conc: int | None = None,
                        osl: float | None = None, ratio: float | None = None) -> SteadyState:
    """Regions, reference PD ratio and the three windows (spec §5.2 steps 2-4)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if not steps:
        raise ValueError("no steps to search for a steady state")
    requests = [s.num_requests for s in steps]
    has_context = [s.context_requests > 0 for s in steps]
    warnings: list[str] = []
    regions = find_steady_state_regions(requests, num_steps)
    found = bool(regions)
    if not found:
        regions = [middle_slice(len(steps), num_steps)]
        warnings.append(f"no steady-state region found; using the middle steps {regions[0]}")
    # TraceLens's empirical reference: the step-weighted share of context steps over all regions.
    total = sum(e - s for s, e in regions)
    reference = sum(sum(has_context[s:e]) for s, e in regions) / total if total else 0.0
    peak = max(requests)
    if conc is not None and peak != conc:
        warnings.append(f"expected peak concurrency CONC={conc} but the trace peak is {peak}")
    ideal: float | None = None
    mixed_steps = num_steps
    if conc is not None and osl is not None and ratio is not None:
        if conc <= 0 or osl <= 0:
            raise ValueError(f"CONC and OSL must be positive, got CONC={conc}, OSL={osl}")
        r = min(1.0, max(0.0, ratio))
        if r != ratio:
            warnings.append(f"R={ratio} is outside [0, 1]; clamped to {r}")
        ideal = 2.0 * conc / (osl * (1.0 + r))
        mixed_steps = max(num_steps, math.ceil(1.0 / ideal))
        reference = ideal

    lo, hi = max(regions, key=lambda reg: reg[1] - reg[0])
    windows: dict[str, tuple[int, int]] = {}

    stride = max(1, mixed_steps // max(1, min(mixed_steps // 2, 10)))
    spans = ([(s, s + mixed_steps) for s in range(lo, hi - mixed_steps + 1, stride)]
             if hi - lo >= mixed_steps else [(lo, hi)])

    def score(span: tuple[int, int]) -> tuple[float, float]:
        s, e = span
        pd_ratio = sum(has_context[s:e]) / (e - s) if e > s else 0.0
        avg_requests = sum(requests[s:e]) / (e - s) if e > s else 0.0
        return abs(pd_ratio - reference), -avg_requests  # closest ratio, then busier window

    pool = [sp for sp in spans if any(has_context[sp[0]:sp[1]])] or spans
    windows[MIXED] = min(pool, key=score)

    for label, flags in ((DECODE_ONLY, [s.kind == "decode" for s in steps]), (PREFILLDECODE, has_context)):
        run = _longest_run(flags, lo, hi)
        if run is not None:
            windows[label] = (run[0], min(run[1], run[0] + num_steps))
        else:
            warnings.append(f"{label}: no such run in the steady-state region [{lo}, {hi})")
    return SteadyState(regions, found, reference, ideal, mixed_steps, windows, warnings)


# --------------------------------------------------------------------------- extraction

class _Extractor:
    """Indexes a trace once so that each step's slice is a binary search away (events as uids)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        FLOW, GPU, HOST = 1, 2, 3
        role = bytes(FLOW if ph in ("s", "f") else GPU if cat in GPU_CATEGORIES else HOST if ph == "X" else 0
                     for ph, cat in trace.kinds)
        # Each role's uids, and their ids, by numpy passes over the columns.
        role_of = np.frombuffer(role, dtype=np.uint8)[np.frombuffer(trace.kind, dtype=np.uint32)] if len(trace.kind) \
            else np.zeros(0, dtype=np.uint8)
        flows = np.flatnonzero(role_of == FLOW)
        self.flows = _UidsById(flows, np.frombuffer(trace.flow, dtype=np.int64)[flows], trace.flow_of)
        gpu = np.flatnonzero(role_of == GPU)
        self.gpu = _UidsById(gpu, np.frombuffer(trace.corr, dtype=np.int64)[gpu], trace.corr_of)
        host = np.flatnonzero(role_of == HOST)
        thread = np.frombuffer(trace.pid, dtype=np.uint32)[host].astype(np.int64) * max(len(trace.ids), 1) \
            + np.frombuffer(trace.tid, dtype=np.uint32)[host]
        all_ts = np.frombuffer(trace.ts, dtype=np.float64)
        all_dur = np.frombuffer(trace.dur, dtype=np.float64)
        # per thread: (uids by start, their starts, their ends)
        self.threads: dict[tuple[Any, Any], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        ids = trace.ids
        groups: dict[tuple[Any, Any], list[np.ndarray]] = {}  # (1, 2) and (1.0, 2) are one key, as in a dict
        for key in np.unique(thread).tolist():
            pid, tid = divmod(key, max(len(ids), 1))
            groups.setdefault((ids[pid], ids[tid]), []).append(host[thread == key])
        for key, parts in groups.items():
            mine = parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))
            uid = mine[np.argsort(all_ts[mine], kind="stable")].astype(np.int64)  # by start, then uid
            ts = all_ts[uid]
            self.threads[key] = (uid, ts, ts + all_dur[uid])

    def slice(self, step: StepInfo) -> tuple[list[int], list[int]]:
        """(all events of the step's slice in write order, its GPU events), as uids."""
        group = self.threads.get((step.pid, step.tid))
        if group is None:
            return [], []
        uid, ts, end = group
        t_end = step.ts + step.dur
        lo, hi = np.searchsorted(ts, step.ts, "left"), np.searchsorted(ts, t_end, "right")
        sel = lo + np.flatnonzero(end[lo:hi] <= t_end)
        cpu = np.sort(uid[sel], kind="stable").tolist()  # trace order, as TraceLens writes them
        corrs = list(dict.fromkeys(c for c in map(self.trace.corr_of, cpu) if c is not None))
        gpu = self.gpu.gather(corrs)
        return cpu + self.flows.gather(corrs) + gpu, gpu


class _UidsById:
    """The events of each id (a flow id, a correlation id), in uid order: as a dict of lists would
    hold them, but as two sorted arrays when every id is a plain int (a few MB where the dict cost
    tens), looked up for a whole step at once."""

    def __init__(self, uids: np.ndarray, values: np.ndarray, read: Any) -> None:
        self.table: dict[Any, list[int]] | None = None
        plain = values > ODD_ID  # NO_ID: none; ODD_ID: a value kept aside, read one by one
        if plain.all():
            order = np.argsort(values, kind="stable")  # by id, then uid
            self.keys, self.uids = values[order], uids[order]
            return
        self.keys = self.uids = None
        self.table = {}
        for value, uid in ((v if p else read(u), u) for v, p, u in zip(values.tolist(), plain.tolist(), uids.tolist())):
            if value is not None:
                self.table.setdefault(value, []).append(uid)

    def gather(self, ids: list) -> list[int]:
        """The events of each of ``ids`` in turn (as ``[u for i in ids for u in table.get(i, ())]``)."""
        if self.table is None and not all(type(i) is int for i in ids):  # 1.0, True: equal keys in a dict
            self.table = {}
            for value, uid in zip(self.keys.tolist(), self.uids.tolist()):
                self.table.setdefault(value, []).append(uid)
        if self.table is not None:
            table = self.table
            return [u for i in ids for u in table.get(i, ())]
        if not ids:
            return []
        wanted = np.array(ids, dtype=np.int64)
        lo = np.searchsorted(self.keys, wanted, "left")
        counts = np.searchsorted(self.keys, wanted, "right") - lo
        total = int(counts.sum())
        if not total:
            return []
        ends = np.cumsum(counts)
        at = np.repeat(lo - (ends - counts), counts) + np.arange(total)
        return self.uids[at].tolist()


def trace_base_name(path: Path | str) -> str:
    """TraceLens's base name: the file name without ``.pt.trace``, ``.json.gz``, ``.json``."""
    return os.path.basename(str(path)).replace(".pt.trace", "").replace(".json.gz", "").replace(".json", "")


def sanitise_annotation(name: str) -> str:
    """The annotation as TraceLens puts it in a per-step file name."""
    return name.replace("/", "_").replace("(", "_").replace(")", "").replace(":", "").replace(" ", "_")


def _phase(steps: Sequence[StepInfo]) -> dict[str, int]:
    n = len(steps)
    return {
        "num_prefill": sum(s.kind == "prefill" for s in steps),
        "num_prefilldecode": sum(s.kind == "prefilldecode" for s in steps),
        "num_decode": sum(s.kind == "decode" for s in steps),
        "avg_bs": int(sum(s.batch_size for s in steps) / n) if n else 0,
        "avg_conc": int(sum(s.num_requests for s in steps) / n) if n else 0,
    }


def _step_detail(s: StepInfo) -> dict[str, int]:
    return {"batch_size": s.batch_size, "num_requests": s.num_requests, "context_requests": s.context_requests,
            "context_sum": s.c_sq, "generation_requests": s.generation_requests, "generation_sum": s.g_sq}


# --------------------------------------------------------------------------- split

@dataclass
class SplitResult:
    files: list[Path]  # every file written, execution_details.* last
    rows: list[dict[str, Any]]  # execution_details.csv rows (typed values), CSV column order
    details: list[dict[str, Any]]  # execution_details.json entries
    steps: list[StepInfo]
    steady: SteadyState | None  # None without find_steady_state


def split_trace(trace: Trace, out_dir: Path | str, *, num_steps: int = 32, conc: int | None = None,
                osl: float | None = None, ratio: float | None = None, find_steady_state: bool = True,
                store_single_iteration: bool = True, output_path_base: Path | None = None,
                workers: int = 1) -> SplitResult:
    """Split ``trace`` into per-step traces and steady-state windows under ``out_dir``
    (TraceLens's ``--store-single-iteration`` / ``--find-steady-state`` / ``--num-steps`` /
    ``--CONC`` / ``--OSL`` / ``--R``).

    ``output_path_base``: the ``output_path`` values in execution_details are written relative to
    this folder (TraceLens writes ``-o`` as given, so the golden files are relative to the folder
    the splitter ran in); None writes ``out_dir / <file>`` as passed.

    ``workers=2``: the files are written by this process and a forked child, half each (where
    fork is there and no other thread runs); the same files and result.
    """
    steps = find_steps(trace)
    if not steps:
        raise ValueError(f"{trace.path}: no inference step annotations (vLLM execute_*, SGLang step[...], "
                         "ATOM prefill[...]/decode[...] user_annotation events) to split on")
    steady = detect_steady_state(steps, num_steps, conc=conc, osl=osl, ratio=ratio) if find_steady_state else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = trace_base_name(trace.path)
    was_enabled = gc.isenabled()
    gc.disable()  # one short-lived JSON dict per event written: collector passes would only cost time
    try:
        writer = _SliceWriter(trace, steps, out, output_path_base)
        jobs: list[tuple[int, str, int, int]] = []  # (idx, file name, first step, last step + 1)
        if store_single_iteration:
            for i, s in enumerate(steps):
                jobs.append((i, f"{base}_annotation_iteration_{i}_{sanitise_annotation(s.name)}.json.gz", i, i + 1))
        windows = steady.windows if steady is not None else {}
        for label in WINDOW_LABELS:
            if label in windows:
                first, last = windows[label]
                p = _phase(steps[first:last])
                jobs.append((0, f"{label}_prefill_{p['num_prefill']}_prefilldecode_{p['num_prefilldecode']}"
                                f"_decode_{p['num_decode']}_bs{p['avg_bs']}_conc{p['avg_conc']}_{base}.json.gz",
                             first, last))
        if workers > 1 and len(jobs) > 1 and hasattr(os, "fork") and threading.active_count() == 1:
            _write_in_two(writer, jobs)
        else:
            writer.write_all(jobs)
    finally:
        if was_enabled:
            gc.enable()
    files, details = writer.files, writer.details
    rows = [_csv_row(d) for d in details]
    if details:
        json_path, csv_path = out / "execution_details.json", out / "execution_details.csv"
        json_path.write_text(json.dumps(details, indent=2), encoding="utf-8")
        _write_csv(csv_path, rows)
        files += [json_path, csv_path]
    return SplitResult(files, rows, details, steps, steady)


def _write_in_two(writer: _SliceWriter, jobs: list[tuple[int, str, int, int]]) -> None:
    """``writer.write_all(jobs)`` by this process and a forked child: the child writes the windows
    and the steps inside them (a step's text then serves its file and its windows), this process
    the other steps; files and details come back in job order."""
    in_window = {i for _, _, first, last in jobs if last - first > 1 for i in range(first, last)}
    theirs = [j for j, (_, _, first, last) in enumerate(jobs) if last - first > 1 or first in in_window]
    # Then single steps, from the last, until the child has about half the work: a step costs 1
    # (its text and its file), a window 0.35 a step (its file: the text is its steps').
    cost = [1.0 if last - first == 1 else _WINDOW_COST * (last - first) for _, _, first, last in jobs]
    half = sum(cost) / 2
    load = sum(cost[j] for j in theirs)
    taken = set(theirs)
    for j in reversed(range(len(jobs))):
        if load >= half:
            break
        if j not in taken:
            taken.add(j)
            load += cost[j]
    theirs = sorted(taken)
    mine = [j for j in range(len(jobs)) if j not in taken]
    if not mine or not theirs:
        writer.write_all(jobs)
        return
    def theirs_written() -> tuple:  # in the child: its files, then its files and details through the pipe
        writer.write_all([jobs[j] for j in theirs])
        return writer.files, writer.details

    child = ForkedCall(theirs_written, "the trace split's second process")
    try:
        writer.write_all([jobs[j] for j in mine])
    except BaseException:
        child.stop()
        raise
    value = child.result()
    done = dict(zip(mine, zip(writer.files, writer.details)))
    done.update(zip(theirs, zip(*value)))
    writer.files = [done[j][0] for j in range(len(jobs))]
    writer.details = [done[j][1] for j in range(len(jobs))]


_WINDOW_COST = 0.35  # a window's file per step it holds, against 1 for a step's text and file (zlib's share)


class _SliceWriter:
    """Writes the slice of one step or a window of steps and records its execution details."""

    def __init__(self, trace: Trace, steps: Sequence[StepInfo], out: Path, output_path_base: Path | None) -> None:
        self.trace, self.steps, self.out, self.base = trace, steps, out, output_path_base
        self.index = _Extractor(trace)
        self.encoder = EventWriter(trace)
        self.files: list[Path] = []
        self.details: list[dict[str, Any]] = []

    def write_all(self, jobs: Sequence[tuple[int, str, int, int]]) -> None:
        """Write each job's file (``(idx, file name, first, last)``: the slices of steps
        ``first`` to ``last - 1``), in one pass over the steps: a step's events are encoded once
        and go to every file that holds the step (its own and the windows around it), each file
        compressed as it grows. Details and files are listed in job order."""
        t = self.trace
        outs: list[Any] = [None] * len(jobs)  # each file is open from its first step to its last
        by_step: dict[int, list[int]] = {}
        for j, (_, _, first, last) in enumerate(jobs):
            for i in range(first, last):
                by_step.setdefault(i, []).append(j)
        try:
            for i in sorted(by_step):
                cpu_gpu, gpu = self.index.slice(self.steps[i])
                for j in by_step[i]:
                    if outs[j] is None:
                        outs[j] = _SliceFile(self.out / jobs[j][1], t.metadata)
                targets = [outs[j] for j in by_step[i]]
                for out in targets:
                    out.add_gpu(t, gpu)
                    out.events += len(cpu_gpu)
                for b in range(0, len(cpu_gpu), _BATCH):
                    data = self.encoder.text(cpu_gpu[b:b + _BATCH]).encode()
                    for out in targets:
                        out.write(data)
                for j in by_step[i]:
                    if i == jobs[j][3] - 1:
                        outs[j].close()
            for j, job in enumerate(jobs):  # a job of no steps: an empty trace
                if outs[j] is None:
                    outs[j] = _SliceFile(self.out / job[1], t.metadata)
        finally:
            for out in outs:
                if out is not None:
                    out.close()
        for (idx, _, first, last), out in zip(jobs, outs):
            self.files.append(out.path)
            chosen = self.steps[first:last]
            shown = os.path.relpath(out.path, self.base) if self.base is not None else str(out.path)
            self.details.append({"idx": idx, "output_path": shown, "event_count": out.events,
                                 "num_gpu_events": out.n_gpu, "gpu_duration": out.gpu_duration,
                                 "gpu_busy_duration": out.gpu_busy,
                                 "steps": [_step_detail(s) for s in chosen], "phase": _phase(chosen)})


class _SliceFile:
    """One split trace being written: ``{**metadata, "traceEvents": [...]}`` as compact JSON into
    a .json.gz, a batch of events at a time (a window of 32 steps as one string cost 100+ MB).
    The bytes are those of gzip.compress(whole text, mtime=0): zlib's one gzip stream either way.
    (Compressing on a worker thread was slower here, and its malloc arena cost 15 MB.) Also
    counts what execution_details says of it."""

    def __init__(self, path: Path, metadata: dict) -> None:
        self.path = path
        self.events = self.n_gpu = 0
        self.gpu_duration: float = 0  # stay int 0 without GPU events, as in TraceLens's JSON
        self.gpu_busy: float = 0
        self._empty = True
        head = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode(metadata)[:-1]  # '{"k":v' or '{'
        self._fh = open(path, "wb")
        self._gz = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: with a gzip header
        self._fh.write(self._gz.compress((head + (',"traceEvents":[' if metadata else '"traceEvents":[')).encode()))

    def add_gpu(self, t: Trace, gpu: list[int]) -> None:
        if gpu:
            self.n_gpu += len(gpu)
            busy = self.gpu_busy
            for g in gpu:
                busy += t.dur_of(g)  # a plain sum: overlaps and communication count in full
            self.gpu_busy = busy
            # max(end) - min(start) over the JSON's values (the first of equal ones, with its type)
            self.gpu_duration += (t.end_of(max(gpu, key=lambda g: t.ts[g] + t.dur[g]))
                                  - t.ts_of(min(gpu, key=t.ts.__getitem__)))

    def write(self, data: bytes) -> None:
        if data:
            self._fh.write(self._gz.compress(data if self._empty else b"," + data))
            self._empty = False

    def close(self) -> None:
        if self._fh.closed:
            return
        try:
            self._fh.write(self._gz.compress(b"]}"))
            self._fh.write(self._gz.flush())
        finally:
            self._fh.close()


_BATCH = 2000  # events encoded per batch


def _csv_row(detail: Mapping[str, Any]) -> dict[str, Any]:
    row = {k: detail[k] for k in CSV_COLUMNS[:6]}
    row.update({f"phase_{k}": v for k, v in detail["phase"].items()})
    row["num_steps"] = len(detail["steps"])
    return row


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """As pandas' ``to_csv(index=False, float_format="%.2f")``: a column holding any float is a
    float column, every value of it printed with two decimals."""
    float_cols = {c for c in CSV_COLUMNS if any(isinstance(r[c], float) for r in rows)}
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for r in rows:
            writer.writerow([f"{r[c]:.2f}" if c in float_cols else r[c] for c in CSV_COLUMNS])


# --------------------------------------------------------------------------- Magpie's stage pick

STAGE_COLUMNS = (("prefilldecode", "phase_num_prefilldecode"), ("decode_only", "phase_num_decode"),
                 ("prefill_only", "phase_num_prefill"))


def _float(row: Mapping[str, Any], key: str) -> float | None:
    raw = row.get(key)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def _is_single_step(row: Mapping[str, Any]) -> bool:
    if os.path.basename(str(row.get("output_path") or "")).startswith(tuple(f"{w}_" for w in WINDOW_LABELS)):
        return False
    n = _float(row, "num_steps")
    return n is None or int(n) <= 1


def _has_gpu_work(row: Mapping[str, Any]) -> bool:
    """Magpie drops a row when any present GPU column is <= 0 (or not a number)."""
    for key in ("num_gpu_events", "gpu_duration", "gpu_busy_duration"):
        raw = row.get(key)
        if raw is None or raw == "":
            continue
        value = _float(row, key)
        if value is None or value <= 0:
            return False
    return True


def pick_stage_steps(rows: Iterable[Mapping[str, Any]], conc: float | None) -> dict[str, Mapping[str, Any]]:
    """Magpie's pick of one single-step trace per stage (``prefilldecode``, ``decode_only``,
    ``prefill_only``) from execution_details rows (ours, or ``csv.DictReader`` rows of a
    TraceLens CSV): single-step rows with GPU work; stage by ``phase_num_prefilldecode`` == 1,
    else ``phase_num_decode`` == 1, else ``phase_num_prefill`` == 1; the largest ``phase_avg_bs``;
    for decode the ``phase_avg_conc`` closest to ``conc``; then the median by
    (``gpu_busy_duration``, row index). Stages without a candidate are absent."""
    candidates: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for index, row in enumerate(rows):
        if not row.get("output_path") or not _is_single_step(row) or not _has_gpu_work(row):
            continue
        stage = next((s for s, col in STAGE_COLUMNS if int(_float(row, col) or 0) == 1), None)
        if stage is not None:
            candidates.setdefault(stage, []).append((index, row))
    picks: dict[str, Mapping[str, Any]] = {}
    for stage, items in candidates.items():
        top = max(_float(r, "phase_avg_bs") or 0.0 for _, r in items)
        pool = [(i, r) for i, r in items if (_float(r, "phase_avg_bs") or 0.0) == top]
        if stage == "decode_only" and conc is not None:
            gaps = [(abs(c - conc), i, r) for i, r in pool if (c := _float(r, "phase_avg_conc")) is not None]
            if gaps:
                best = min(g for g, _, _ in gaps)
                pool = [(i, r) for g, i, r in gaps if g == best]
        timed = [(i, r) for i, r in pool if _float(r, "gpu_busy_duration") is not None]
        if timed:
            timed.sort(key=lambda item: (_float(item[1], "gpu_busy_duration") or 0.0, item[0]))
            picks[stage] = timed[len(timed) // 2][1]
        else:
            pool.sort(key=lambda item: item[0])
            picks[stage] = pool[len(pool) // 2][1]
    return picks
