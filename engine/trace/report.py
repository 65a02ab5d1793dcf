"""TraceLens's pytorch-mode perf report, re-implemented without pandas (tracelens-reference §3, §5.4).

``pytorch_report(tree, arch)`` returns the sheets ``TraceLens_generate_perf_report_pytorch`` writes
(``inference=True``: those of ``TraceLens_generate_perf_report_pytorch_inference``), keyed by sheet
name, each a ``Table`` of columns and rows whose cells format like pandas' ``to_csv`` output
(see ``engine.trace.csvout``). Only non-empty sheets are returned, as TraceLens writes only those.

Numbers are computed the way TraceLens computes them so that they agree to the last bits where it
matters: busy time is the union of ``[ts, ts + dur)`` in float64 absolute time stamps; grouped
statistics follow pandas 3 (``reduceat``/pairwise or Kahan sums, Welford sample std, NaN-skipping
``first``); the statistics inside kernel-detail cells follow numpy (pairwise sums, population std)
and print as ``np.float64(...)``. Sorting is stable, as pandas' is for these table sizes.

Performance: events are uids read from the trace's columns (``engine.trace.load``), rows are
slotted records (a dict per op cost four times the memory), the largest rows are dropped before
the next are made, dicts for grouping, model results cached per distinct (op, shapes,
annotation), no numpy import; a 150k-event trace with 19k kernels takes about 0.7-1 s on a
2-core machine (the cyclic GC is paused meanwhile, so nothing here may form a reference cycle).

Quirks of TraceLens that are copied on purpose are listed in tracelens-reference §8 and in the
module docstring of ``engine.trace.perf_models``; the ones that are not copied are marked
"Divergence" below.
"""

from __future__ import annotations

import bisect
import gc
import math
import re
from array import array
from typing import Any, Callable, Iterable, Sequence

from engine.trace import perf_models as pm
from engine.trace.csvout import NpFloat
from engine.trace.timeline import COMM_RE, gpu_timeline
from engine.trace.tree import RUNTIME_CATS, EventTree

NAN = float("nan")
AGG = ("mean", "median", "std", "min", "max")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
ARG_COLS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")

# Ops whose step annotation the report attaches before computing metrics (§5.4).
ANNOTATED_OPS_PYTORCH = ("vllm::unified_attention_with_output",)
ANNOTATED_OPS_INFERENCE = (
    "vllm::unified_attention_with_output", "aiter::mha_varlen_fwd", "pseudo_mla_decode_fwd",
    "pseudo_mla_prefill_fwd", "vllm::gdn_attention_core", "aiter::fmha_v3_varlen_fwd",
    "sglang_profiler::tilelang_kernel_tilelang_sparse_fwd", "sglang_profiler::attention_paged_attention_ragged",
    "aiter::mha_batch_prefill", "aiter::pa_decode_gluon",
)
# Backward ops the forward pass of a split family sheet hands to its _bwd sheet, and the reverse.
_BWD_IN_FWD = ("flash_attn::_flash_attn_varlen_backward", "aten::convolution_backward",
               "ConvBias_Backward", "ConvBiasReLU_Backward")
_FWD_IN_BWD = ("aten::convolution", "aten::miopen_convolution", "aten::cudnn_convolution", "ConvBias_", "ConvBiasReLU_")
_SINGLE_SHEETS_PYTORCH = ("GEMM", "UnaryElementwise", "BinaryElementwise", "Normalization")
_SINGLE_SHEETS_INFERENCE = ("GEMM", "UnaryElementwise", "BinaryElementwise")


class Table:
    """A sheet: column names and rows (lists of cell values, in column order)."""

    __slots__ = ("columns", "rows")

    def __init__(self, columns: list[str], rows: list[list]) -> None:
        self.columns = columns
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]

    def __repr__(self) -> str:
        return f"Table({len(self.rows)} x {len(self.columns)})"


# ---------------------------------------------------------------------------- statistics

def _isna(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _vals(xs: Iterable[Any]) -> list:
    return [x for x in xs if x is not None and x == x]  # NaN != NaN


def _sum_clean(v: list, fast: bool) -> Any:
    if not v:
        return 0.0  # an all-NaN group sums to 0 (the column is float)
    if all(type(x) is int for x in v):
        return sum(v)
    if fast:
        return v[0] + np_sum(v[1:]) if len(v) > 1 else (float(v[0]) if v else 0.0)
    s = comp = 0.0
    for x in v:
        y = x - comp
        t = s + y
        comp = (t - s) - y
        if comp != comp:
            comp = 0.0
        s = t
    return s


def _std_clean(v: list) -> float:
    n = 0
    mean = m2 = 0.0
    for x in v:
        n += 1
        old = mean
        mean += (x - old) / n
        m2 += (x - mean) * (x - old)
    if n < 2:
        return NAN
    return math.sqrt(m2 / (n - 1))


def _median_clean(v: list) -> float:
    v = sorted(v)
    n = len(v)
    if n == 0:
        return NAN
    if n % 2:
        return float(v[n // 2])
    return (v[n // 2 - 1] + v[n // 2]) / 2


def pd_aggs(xs: Iterable[Any], aggs: Sequence[str], fast: bool = False) -> list:
    """Several pandas groupby aggregations of one group's values (NaN skipped):

    * ``sum``/``mean``: pandas 3 uses ``np.add.reduceat`` when the group ids are sorted in row order
      and the whole column has no NaN (``fast``) -- the first value plus numpy's pairwise sum of the
      rest --, else its Cython kernel, a Kahan-compensated sum; ``mean`` divides by the count;
    * ``std``: sample std (ddof=1) with Welford's update, NaN under two values;
    * ``median``: the middle value, or the mean of the two middle ones;
    * ``min``/``max``; NaN for a group with no values (``sum``: 0)."""
    v = _vals(xs)
    out: list[Any] = []
    for a in aggs:
        if a == "sum":
            out.append(_sum_clean(v, fast))
        elif a == "mean":
            out.append(float(_sum_clean([float(x) for x in v], fast)) / len(v) if v else NAN)
        elif a == "std":
            out.append(_std_clean(v))
        elif a == "median":
            out.append(_median_clean(v))
        elif a == "min":
            out.append(min(v) if v else NAN)
        elif a == "max":
            out.append(max(v) if v else NAN)
        else:
            raise ValueError(a)
    return out


def pd_sum(xs: Iterable[Any], fast: bool = False) -> Any:
    return _sum_clean(_vals(xs), fast)


def pd_mean(xs: Iterable[Any], fast: bool = False) -> float:
    return pd_aggs(xs, ("mean",), fast)[0]


def pd_std(xs: Iterable[Any]) -> float:
    return _std_clean(_vals(xs))


def pd_median(xs: Iterable[Any]) -> float:
    return _median_clean(_vals(xs))


def pd_min(xs: Iterable[Any]) -> Any:
    v = _vals(xs)
    return min(v) if v else NAN


def pd_max(xs: Iterable[Any]) -> Any:
    v = _vals(xs)
    return max(v) if v else NAN


def pd_first(xs: Iterable[Any]) -> Any:
    """pandas ``first``: the first value that is not NA."""
    for x in xs:
        if not _isna(x):
            return x
    return None


_DROP = object()  # a row whose group key has a NaN, left out by groupby(dropna=True)


def _sort_key(k: Any) -> Any:
    if isinstance(k, tuple):
        return tuple((x is None, x if x is not None else 0) for x in k)
    return (k is None, k if k is not None else 0)


def group_rows(keys: Sequence[Any], sort: bool) -> tuple[list[Any], dict[Any, list[int]], bool]:
    """pandas ``groupby``: the group keys in result order (sorted, NaN last, or first-seen), the
    row indices of each group, and whether the group ids are sorted in row order (then pandas 3
    sums with ``np.add.reduceat`` instead of its Kahan kernel)."""
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        if k is not _DROP:
            groups.setdefault(k, []).append(i)
    order = sorted(groups, key=_sort_key) if sort else list(groups)
    code = {k: c for c, k in enumerate(order)}
    last, mono = -1, True
    for k in keys:
        c = -1 if k is _DROP else code[k]
        if c < last:
            mono = False
            break
        last = c
    return order, groups, mono


def _fast(mono: bool, column: Iterable[Any]) -> bool:
    return mono and not any(_isna(x) for x in column)


def np_sum(xs: Sequence[float]) -> float:
    """numpy's pairwise float64 sum (``np.add.reduce`` on a contiguous array), bit for bit."""
    n = len(xs)
    if n < 8:
        r = 0.0
        for x in xs:
            r += x
        return r
    if n <= 128:
        acc = [float(x) for x in xs[:8]]
        i = 8
        end = n - n % 8
        while i < end:
            for j in range(8):
                acc[j] += xs[i + j]
            i += 8
        res = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        while i < n:
            res += xs[i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return np_sum(xs[:n2]) + np_sum(xs[n2:])


def np_stats(durs: Sequence[float]) -> dict[str, NpFloat]:
    """mean/median/std(population)/min/max as numpy computes them, for kernel-detail cells."""
    n = len(durs)
    mean = np_sum(durs) / n
    s = sorted(durs)
    med = s[n // 2] if n % 2 else np_sum([s[n // 2 - 1], s[n // 2]]) / 2
    std = math.sqrt(np_sum([(x - mean) * (x - mean) for x in durs]) / n)
    return {"mean_duration_us": NpFloat(mean), "median_duration_us": NpFloat(med),
            "std_dev_duration_us": NpFloat(std), "min_duration_us": NpFloat(min(durs)),
            "max_duration_us": NpFloat(max(durs))}


def summarize_kernel_stats(lists: Iterable[Any], detail: Callable[[Any], dict] | None = None,
                           dur: Callable[[Any], float] | None = None) -> list[dict]:
    """TraceLens ``_summarize_kernel_stats``: per kernel position of the first non-empty list, over
    every instance with the same number of kernels.

    The lists hold kernel dicts (``name``, ``dur``, ``stream``...) or, with ``detail`` and ``dur``,
    GPU events (uids) that ``detail`` turns into such dicts (only the template's are built) and
    whose duration is ``dur(k)``."""
    lists = [kl for kl in lists if isinstance(kl, list)]
    template = next((kl for kl in lists if kl), None)
    if template is None:
        return []
    n = len(template)
    if detail is not None:
        assert dur is not None
        cols = [[dur(k) for k in col] for col in zip(*(kl for kl in lists if len(kl) == n))]
        template = [detail(k) for k in template]
    else:
        cols = [[k["dur"] for k in col] for col in zip(*(kl for kl in lists if len(kl) == n))]
    out = []
    for i, t in enumerate(template):
        d = {k: v for k, v in t.items() if k != "dur"}
        durs = cols[i]
        d["count"] = len(durs)
        d["total_duration_us"] = NpFloat(np_sum(durs))
        if durs:
            d.update(np_stats(durs))
        out.append(d)
    return out


def _np_round2(x: float) -> float:
    return round(x * 100.0) / 100.0  # np.round(x, 2): rint(x * 100) / 100


def trunc_kernel_details(summary: list[dict] | None, length: int = 64) -> list[dict] | None:
    if not summary:
        return None
    out = []
    for d in summary:
        name = d["name"]
        mean = d.get("mean_duration_us", 0)
        out.append({"name": name[:length] + "..." if len(name) > length else name, "stream": d.get("stream"),
                    "mean_duration_us": NpFloat(_np_round2(mean)) if isinstance(mean, float) else round(mean, 2)})
    return out


def histogram(values: Sequence[float], bins: int) -> tuple[list[int], list[float]]:
    """``np.histogram(values, bins)`` for equal-width bins, bit for bit, without importing numpy
    (the import alone costs ~0.1 s): edges from ``np.linspace(min, max, bins + 1)`` (min/max
    widened by 0.5 when equal), values binned as numpy does, the last bin closed."""
    lo, hi = float(min(values)), float(max(values))
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    step = (hi - lo) / bins
    edges = [i * step + lo for i in range(bins + 1)]
    edges[-1] = hi
    norm = bins / (hi - lo)
    counts = [0] * bins
    for v in values:
        i = int((v - lo) * norm)
        if i == bins:
            i -= 1
        if v < edges[i]:
            i -= 1
        elif i != bins - 1 and v >= edges[i + 1]:
            i += 1
        counts[i] += 1
    return counts, edges


def _desc_key(x: Any) -> Any:
    """Sort key for a descending float column with NaN last (pandas ``na_position='last'``)."""
    return (1, 0.0) if _isna(x) else (0, -x)


def _asc_key(x: Any) -> Any:
    return (1, 0) if _isna(x) else (0, x)


def _to_tuple(obj: Any) -> Any:
    if isinstance(obj, list):
        return tuple(_to_tuple(x) for x in obj)
    return obj


def _percentages(values: list[float]) -> tuple[list[float], list[float]]:
    total = np_sum(values)
    pct = [(v / total) * 100 for v in values]
    cum, acc = [], 0.0
    for p in pct:
        acc += p
        cum.append(acc)
    return pct, cum


# ---------------------------------------------------------------------------- the report's rows

class _Record:
    """A row kept in slots (a dict per row costs about four times the memory: a large trace has
    tens of thousands of ops), read like the dict it replaces: ``row[column]`` and
    ``row.get(column)``, with TraceLens's column names, through ``COLUMNS``."""

    __slots__ = ()
    COLUMNS: dict[str, Callable[[Any], Any]] = {}

    def __getitem__(self, column: str) -> Any:
        return self.COLUMNS[column](self)

    def get(self, column: str, default: Any = None) -> Any:
        read = self.COLUMNS.get(column)
        return read(self) if read is not None else default


def _names_columns() -> dict[str, Callable[[Any], Any]]:
    return {"process_name": lambda r: r.names[0], "process_label": lambda r: r.names[1],
            "thread_name": lambda r: r.names[2]}


class _LauncherRow(_Record):
    """An op that launched kernels directly (TraceLens's kernel-launcher rows, the ops_* sheets)."""

    __slots__ = ("uid", "name", "category", "names", "argv", "args_s", "direct", "subtree", "kernels",
                 "call_stack", "parent_module")
    COLUMNS = {"name": lambda r: r.name, "op category": lambda r: r.category, "UID": lambda r: r.uid,
               "total_direct_kernel_time": lambda r: r.direct, "total_subtree_kernel_time": lambda r: r.subtree,
               "direct_kernel_count": lambda r: len(r.kernels), "num_kernels": lambda r: len(r.kernels),
               "_args_s": lambda r: r.args_s, "kernels": lambda r: r.kernels,
               "call_stack": lambda r: r.call_stack, "parent_module": lambda r: r.parent_module,
               **{c: (lambda r, i=i: r.argv[i]) for i, c in enumerate(ARG_COLS)}, **_names_columns()}

    def __init__(self, uid: int, name: str, category: str, names: tuple, argv: tuple, args_s: tuple, direct: float,
                 subtree: float, kernels: list[int], call_stack: list[str] | None, parent_module: str | None) -> None:
        self.uid, self.name, self.category, self.names, self.argv, self.args_s = uid, name, category, names, argv, args_s
        self.direct, self.subtree, self.kernels = direct, subtree, kernels
        self.call_stack, self.parent_module = call_stack, parent_module


class _PerfRow(_Record):
    """One instance of a modelled op (the roofline sheets): its model result and kernel time."""

    __slots__ = ("uid", "name", "names", "args", "st", "busy", "kernels")
    COLUMNS = {"name": lambda r: r.name, "UID": lambda r: r.uid, "st": lambda r: r.st, "busy": lambda r: r.busy,
               "kernels": lambda r: r.kernels, "num_kernels": lambda r: len(r.kernels),
               **{c: (lambda r, c=c: r.args.get(c)) for c in ARG_COLS}, **_names_columns()}

    def __init__(self, uid: int, name: str, names: tuple, args: dict, st: Any, busy: float,
                 kernels: list[int]) -> None:
        self.uid, self.name, self.names, self.args, self.st, self.busy, self.kernels = \
            uid, name, names, args, st, busy, kernels


class _UnifiedRow(_Record):
    """One row of the unified perf summary's input: an op (or a synthetic runtime->kernel op)."""

    __slots__ = ("uid", "name", "category", "names", "dur", "has_model", "argv", "args_s", "kernels", "st", "busy")
    # kernels: the GPU event of a synthetic op; None for an op (see _Report.unified_kernels)
    COLUMNS = {"name": lambda r: r.name, "op category": lambda r: r.category, "UID": lambda r: r.uid,
               "duration_us": lambda r: r.dur, "has_perf_model": lambda r: r.has_model, "argv": lambda r: r.argv,
               "st": lambda r: r.st, "busy": lambda r: r.busy, **_names_columns()}

    def __init__(self, uid: int, name: str, category: str, names: tuple, dur: float, has_model: bool, argv: tuple,
                 args_s: tuple, kernels: list[int] | None, st: Any, busy: float) -> None:
        self.uid, self.name, self.category, self.names, self.dur, self.has_model = \
            uid, name, category, names, dur, has_model
        self.argv, self.args_s, self.kernels, self.st, self.busy = argv, args_s, kernels, st, busy

    @property
    def key(self) -> tuple:
        """The unified summary's group key."""
        return (self.name, self.category, *self.names, *self.args_s)


class _KernelRows:
    """Every kernel (TraceLens's kernel sheets), in columns: its uid, its launch and the cpu_op
    above it (-1: none), and that op's (Input Dims, Input type, Input Strides, Concrete Inputs)."""

    def __init__(self) -> None:
        self.kernel = array("i")
        self.launcher = array("i")
        self.cpu = array("i")
        self.argv: list[tuple] = []  # shared tuples: the same shapes recur on every step


# ---------------------------------------------------------------------------- the report

class _Report:
    """The report's state for one tree. Events are handled by uid and read from the trace's
    columns; kernel lists are lists of uids."""

    def __init__(self, tree: EventTree, arch: dict | None, inference: bool, python_frames: bool) -> None:
        self.tree = tree
        self.trace = tree.trace
        self.arch = arch
        self.inference = inference
        self.python_frames = python_frames  # TraceLens add_python_func (module grouping, call stacks)
        self.annotation: dict[int, str] = {}
        # uid of a kernel launcher -> its first kernel (for its category); -1 for other events
        self.first_kernel = array("i", [-1]) * len(self.trace.kind)
        self.cat_cache: dict[tuple[int, int], str] = {}  # (name, first kernel's name) as name indices
        self._model_args: dict[int, tuple] = {}  # args pool index -> the args a model result depends on
        self._bwd_perf: dict[int, tuple[Any, list[int], float]] = {}  # forward op uid -> perf(uid, bwd=True)
        self._gpu_kind = self.trace.kinds_where(lambda ph, cat: cat in GPU_CATS)  # kernel, memcpy, memset
        self.cpu_ops = self.trace.uids_where(lambda ph, cat: cat == "cpu_op")  # three passes read them
        self.bwd_links: dict[int, list[int]] = {}  # fwd uid -> bwd autograd uids
        self.fwd_link: dict[int, int] = {}  # bwd autograd uid -> fwd uid
        self._tup_cache: dict[str, tuple[tuple, tuple]] = {}
        self._arg_cache: dict[int, tuple[tuple, tuple]] = {}  # args pool index -> arg_tuples
        self._static_cache: dict[tuple, Any] = {}
        self._comm_cache: dict[str, bool] = {}
        self._names_cache: dict[tuple, tuple[str, str, str]] = {}

    # ------------------------------------------------------------------ small helpers

    def is_comm(self, name: str) -> bool:
        hit = self._comm_cache.get(name)
        if hit is None:
            hit = self._comm_cache[name] = COMM_RE.search(name) is not None
        return hit

    def tup(self, obj: Any) -> tuple[Any, str]:
        """(the value with lists turned into tuples, its str)."""
        if obj is None:
            return None, "None"
        if type(obj) is not list:
            return obj, str(obj)
        t = _to_tuple(obj)
        return t, str(t)

    def arg_tuples(self, uid: int) -> tuple[tuple, tuple]:
        """Input Dims, Input type, Input Strides, Concrete Inputs as tuples, and their strs; cached per
        distinct args and on the repr of the four lists, since the same shapes recur on every step."""
        pooled = self.trace.args[uid]
        hit = self._arg_cache.get(pooled)
        if hit is None:
            args = self.trace.args_of(uid) or {}
            vals = [args.get("Input Dims"), args.get("Input type"), args.get("Input Strides"),
                    args.get("Concrete Inputs")]
            key = repr(vals)
            hit = self._tup_cache.get(key)
            if hit is None:
                pairs = [self.tup(v) for v in vals]
                hit = self._tup_cache[key] = (tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
            self._arg_cache[pooled] = hit
        return hit

    def names(self, uid: int) -> tuple[str, str, str]:
        t = self.trace
        key = (t.pid[uid], t.tid[uid])
        hit = self._names_cache.get(key)
        if hit is None:
            pid, tid = t.pid_of(uid), t.tid_of(uid)
            hit = self._names_cache[key] = (t.process_names.get(pid, "Unknown"),
                                            t.process_labels.get(pid, "Unknown"),
                                            t.thread_names.get((pid, tid), "Unknown"))
        return hit

    def category(self, uid: int) -> str:
        t = self.trace
        k = self.first_kernel[uid]
        key = (t.name[uid], t.name[k] if k >= 0 else -1)
        c = self.cat_cache.get(key)
        if c is None:
            c = self.cat_cache[key] = pm.categorize(t.name_of(uid), t.name_of(k) if k >= 0 else None)
        return c

    def busy(self, uids: Sequence[int]) -> float:
        """Union length of [ts, ts + dur), summed over merged intervals in time order."""
        n = len(uids)
        if n == 0:
            return 0
        t = self.trace
        if n == 1:
            return t.end_of(uids[0]) - t.ts_of(uids[0])  # with the JSON's types, as TraceLens's
        ts, dur = t.ts, t.dur
        ivs = sorted([(ts[u], ts[u] + dur[u]) for u in uids])
        total = 0.0
        cs, ce = ivs[0]
        for s, e in ivs[1:]:
            if s <= ce:
                if e > ce:
                    ce = e
            else:
                total += ce - cs
                cs, ce = s, e
        return total + (ce - cs)

    def call_stack(self, uid: int) -> list[str]:
        """TraceLens ``traverse_parents_and_get_callstack(ev, filter=('nn.Module',))``.

        Divergence: the tree holds no ``python_function`` frames, so there is never an
        ``nn.Module`` frame above an op and ``parent_module`` is always ``NA`` (as in the golden
        traces, which have no Python stacks)."""
        t, parent = self.trace, self.tree.parent
        frames = [t.name_of(uid)]
        p = parent[uid]
        while p >= 0:
            name = t.name_of(p)
            name = name if len(name) <= 256 else name[:256] + ".."
            if "nn.Module" in name:
                frames.append(name)
            p = parent[p]
        return frames

    def kernel_call_stack(self, k: int) -> list[str]:
        """The cpu ops above a GPU event, outermost first (unified kernel details with Python frames)."""
        t, parent = self.trace, self.tree.parent
        out = []
        p = parent[parent[k]] if parent[k] >= 0 else -1
        while p >= 0:
            if t.cat_of(p) in ("cpu_op", "python_function"):
                out.append(t.name_of(p))
            p = parent[p]
        out.reverse()
        return out

    def kernel_detail(self, k: int, with_stack: bool = False) -> dict:
        t = self.trace
        d = {"name": t.name_of(k), "dur": t.dur_of(k), "stream": (t.args_of(k) or {}).get("stream")}
        if with_stack:
            d["call_stack"] = self.kernel_call_stack(k)
        return d

    def kernel_stats(self, lists: Iterable[Any], with_stack: bool = False) -> list[dict]:
        return summarize_kernel_stats(lists, lambda k: self.kernel_detail(k, with_stack), self.trace.dur_of)

    # ------------------------------------------------------------------ annotations and fwd/bwd links

    def attach_annotations(self, names: Sequence[str]) -> None:
        """Each op named in ``names`` gets the earliest-starting ``user_annotation`` that strictly
        encloses it (TraceLens ``apply_annotation``); ops outside every step get ``NA``."""
        t = self.trace
        ts, dur = t.ts, t.dur
        anns = sorted(t.uids_where(lambda ph, cat: cat == "user_annotation" and ph == "X"), key=ts.__getitem__)
        starts = [ts[a] for a in anns]
        prefix_end: list[float] = []
        best = -math.inf
        for a in anns:
            best = max(best, ts[a] + dur[a])
            prefix_end.append(best)
        wanted_names = set(names)
        wanted = {i for i, n in enumerate(t.names) if n in wanted_names}  # as name indices
        name = t.name
        for uid in self.cpu_ops:
            if name[uid] not in wanted:
                continue
            end = ts[uid] + dur[uid]
            k = bisect.bisect_left(starts, ts[uid])  # annotations starting strictly before the op
            label = "NA"
            i = bisect.bisect_right(prefix_end, end, 0, k)  # the first whose running max end > op end
            while i < k:
                a = anns[i]
                if ts[a] + dur[a] > end:
                    label = t.name_of(a)
                    break
                i += 1
            self.annotation[uid] = label

    def link_fwd_bwd(self) -> None:
        """TraceLens ``link_all_fwd_bwd_events``: per ``Sequence number`` with an
        ``autograd::engine::evaluate_function:`` event, the latest-starting op with that number on
        another thread is its forward op."""
        t = self.trace
        seq_of: dict[int, Any] = {}  # args pool index -> its Sequence number (None: none)
        by_seq: dict[Any, list[int]] = {}
        for uid in self.cpu_ops:
            pooled = t.args[uid]
            if pooled < 0:
                continue
            s = seq_of.get(pooled, seq_of)
            if s is seq_of:
                args = t.pooled_args(pooled)
                s = seq_of[pooled] = args.get("Sequence number") if args else None
            if s is not None:
                by_seq.setdefault(s, []).append(uid)
        for uids in by_seq.values():
            bwd = next((u for u in uids if t.name_of(u).startswith("autograd::engine::evaluate_function:")), None)
            if bwd is None:
                continue
            bwd_pid, bwd_tid = t.pid_of(bwd), t.tid_of(bwd)
            fwd, fwd_ts = None, -1.0
            for u in uids:
                if t.pid_of(u) == bwd_pid and t.tid_of(u) == bwd_tid:
                    continue
                if t.ts[u] > fwd_ts:
                    fwd, fwd_ts = u, t.ts[u]
            if fwd is None:
                continue
            self.fwd_link[bwd] = fwd
            self.bwd_links.setdefault(fwd, []).append(bwd)

    # ------------------------------------------------------------------ perf metrics of one op

    def subtree_bwd_kernels(self, uid: int) -> tuple[list[int], bool]:
        uids: set[int] = set()
        stack = [uid]
        while stack:
            e = stack.pop()
            uids.update(self.bwd_links.get(e, ()))
            stack.extend(self.tree.children_of(e))
        kernels: list[int] = []
        for u in sorted(uids):
            kernels.extend(self.tree.gpu_uids_of(u))
        return kernels, bool(self.bwd_links.get(uid))

    def perf(self, uid: int, bwd: bool = False) -> tuple[Any, list[int], float]:
        """(the op's StaticMetrics or the exception its model raised, the kernels it is timed on,
        their busy time). Models are evaluated once per distinct (name, shapes, annotation); the
        rest is recomputed on each call (two per op), cheaper than keeping it for every op; only
        the backward results, which walk a subtree, are kept."""
        if bwd:
            hit = self._bwd_perf.get(uid)
            if hit is None:
                hit = self._bwd_perf[uid] = self._perf(uid, True, self.subtree_bwd_kernels(uid)[0])
            return hit
        return self._perf(uid, False, self.tree.gpu_uids_of(uid).tolist())

    def _perf(self, uid: int, bwd: bool, kernels: list[int]) -> tuple[Any, list[int], float]:
        busy = self.busy(kernels) if kernels else 0
        t = self.trace
        name = t.name_of(uid)
        cls = pm.model_class(name)
        pooled = t.args[uid]
        model_args = self._model_args.get(pooled)
        if model_args is None:
            args = t.args_of(uid) or {}
            model_args = self._model_args[pooled] = (
                self.arg_tuples(uid)[1], tuple(repr(args[k]) for k in pm.MODEL_ARG_KEYS[4:] if k in args))
        annotation = self.annotation.get(uid, "NA")
        skey = (name, bwd, annotation, *model_args,
                tuple(t.name_of(k) for k in kernels) if cls is not None and issubclass(cls, pm.Gemm) else ())
        static = self._static_cache.get(skey)
        if static is None:
            try:
                if cls is None:
                    raise NotImplementedError(name)
                model = cls(pm.OpView(name, t.args_of(uid), [t.name_of(k) for k in kernels], annotation))
                static = pm.StaticMetrics(model, self.arch, bwd)
            except Exception as exc:  # noqa: BLE001 - TraceLens keeps going on any model failure
                # Kept without its traceback, whose frames would keep the callers' locals alive.
                static = exc.with_traceback(None)
            self._static_cache[skey] = static
        return static, kernels, busy

    # ------------------------------------------------------------------ kernel launchers (ops_* sheets)

    def kernel_launchers(self) -> list[_LauncherRow]:
        t, parent = self.trace, self.tree.parent
        groups: dict[int, list[int]] = {}
        for g in self.tree.gpu_uids:
            if self.is_comm(t.name_of(g)):
                continue  # communication kernels have no launcher row (§1.4)
            rt = parent[g]
            if rt < 0:
                continue
            cur = parent[rt]
            leaf = -1
            while cur >= 0:
                cat = t.cat_of(cur)
                if cat == "cpu_op":
                    if t.name_of(cur) == "execute":  # a pass-through op: its parent launches
                        cur = parent[cur]
                        continue
                    leaf = cur
                    break
                if cat == "python_function":
                    cur = parent[cur]
                else:
                    break
            owner = leaf if leaf >= 0 else rt
            lst = groups.get(owner)
            if lst is None:
                groups[owner] = [g]
            else:
                lst.append(g)
        for uid, ks in groups.items():
            self.first_kernel[uid] = ks[0]
        order = sorted(groups, key=t.ts.__getitem__)
        out = []
        for uid in order:
            ks = groups[uid]
            argv, args_s = self.arg_tuples(uid)
            direct = self.busy(ks)
            n_sub = self.tree.gpu_count(uid)  # a superset of ks: equal length means the same kernels
            cs = module = None
            if self.python_frames:
                cs = self.call_stack(uid)
                module = re.sub(r"_\d+", "", (cs + ["NA", "NA"])[1])
            subtree = direct if n_sub == len(ks) else self.busy(self.tree.gpu_uids_of(uid))
            out.append(_LauncherRow(uid, t.name_of(uid), self.category(uid), self.names(uid), argv, args_s, direct,
                                    subtree, ks, cs, module))
        return out

    def ops_summary(self, kl: list[_LauncherRow]) -> Table:
        module = self.inference and self.python_frames
        with_pm = module  # the module variant groups by parent_module too
        keys = [(r.name, r.parent_module) if with_pm else (r.name,) for r in kl]
        order, groups, mono = group_rows(keys, sort=True)
        d_all = [r.direct for r in kl]
        s_all = [r.subtree for r in kl]
        fd, fs = _fast(mono, d_all), _fast(mono, s_all)
        recs = []
        for k in order:
            idx = groups[k]
            s_vals = [s_all[i] for i in idx]
            rec = {"key": k, "d_sum": pd_sum([d_all[i] for i in idx], fd), "count": len(idx),
                   "cats": sorted({kl[i].category for i in idx}),
                   "s_sum": pd_sum(s_vals, fs), "s_count": len(_vals(s_vals))}
            if module:
                rec["cs"] = pd_first(kl[i].call_stack for i in idx)
            recs.append(rec)
        recs.sort(key=lambda r: _desc_key(r["d_sum"]))
        d_ms = [r["d_sum"] / 1000 for r in recs]
        pct, cum = _percentages(d_ms)
        if not self.inference:
            cols = ["name", "total_direct_kernel_time_sum", "total_subtree_kernel_time_sum", "total_direct_kernel_time_ms",
                    "total_subtree_kernel_time_ms", "Count", "Categories", "Percentage (%)", "Cumulative Percentage (%)"]
            rows = [[r["key"][0], r["d_sum"], r["s_sum"], d_ms[i], r["s_sum"] / 1000, r["count"], r["cats"], pct[i], cum[i]]
                    for i, r in enumerate(recs)]
            return Table(cols, rows)
        cols = ["name"] + (["parent_module"] if module else []) + [
            "total_direct_kernel_time_sum", "total_subtree_kernel_time_sum", "total_subtree_kernel_time_count",
            "total_direct_kernel_time_ms", "Count", "Categories"] + (["call_stack_first"] if module else []) + [
            "Percentage (%)", "Cumulative Percentage (%)"]
        rows = []
        for i, r in enumerate(recs):
            row = list(r["key"]) + [r["d_sum"], r["s_sum"], r["s_count"], d_ms[i], r["count"], r["cats"]]
            if module:
                row.append(r["cs"])
            rows.append(row + [pct[i], cum[i]])
        return Table(cols, rows)

    def ops_by_category(self, kl: list[_LauncherRow]) -> Table:
        module = self.inference and self.python_frames
        keys = [(r.category, r.parent_module) if module else (r.category,) for r in kl]
        order, groups, mono = group_rows(keys, sort=True)
        d_all = [r.direct for r in kl]
        fd = _fast(mono, d_all)
        recs = []
        for k in order:
            idx = groups[k]
            rec = {"key": k, "d_sum": pd_sum([d_all[i] for i in idx], fd), "count": len(idx)}
            if module:
                rec["cs"] = pd_first(kl[i].call_stack for i in idx)
            recs.append(rec)
        recs.sort(key=lambda r: _desc_key(r["d_sum"]))
        d_ms = [r["d_sum"] / 1000 for r in recs]
        pct, cum = _percentages(d_ms)
        if module:
            cols = ["op category", "parent_module", "Count", "call_stack_first", "total_direct_kernel_time_ms",
                    "Percentage (%)", "Cumulative Percentage (%)"]
            rows = [[r["key"][0], r["key"][1], r["count"], r["cs"], d_ms[i], pct[i], cum[i]] for i, r in enumerate(recs)]
        else:
            cols = ["op category", "Count", "total_direct_kernel_time_ms", "Percentage (%)", "Cumulative Percentage (%)"]
            rows = [[r["key"][0], r["count"], d_ms[i], pct[i], cum[i]] for i, r in enumerate(recs)]
        return Table(cols, rows)

    def ops_unique_args(self, kl: list[_LauncherRow], group_by_num_kernels: bool) -> Table:
        gcols = ["name", "op category"]
        if self.python_frames:
            gcols.append("parent_module")
        gcols += ["process_name", "process_label", "thread_name", *ARG_COLS]
        if group_by_num_kernels:
            gcols.append("num_kernels")
        def key(r: _LauncherRow) -> tuple:
            k = [r.name, r.category]
            if self.python_frames:
                k.append(str(r.parent_module))
            k += [*r.names, *r.args_s]
            if group_by_num_kernels:
                k.append(str(len(r.kernels)))
            return tuple(k)

        order, groups, mono = group_rows([key(r) for r in kl], sort=False)
        d_all = [r.direct for r in kl]
        s_all = [r.subtree for r in kl]
        fd, fs = _fast(mono, d_all), _fast(mono, s_all)
        recs = []
        for key in order:
            rs = [kl[i] for i in groups[key]]
            d = [r.direct for r in rs]
            s = [r.subtree for r in rs]
            rec: dict[str, Any] = {c: pd_first(r.get(c) for r in rs) for c in gcols}
            rec["operation_count"] = len(rs)
            for agg, dv, sv in zip((*AGG, "sum"), pd_aggs(d, (*AGG, "sum"), fd), pd_aggs(s, (*AGG, "sum"), fs)):
                rec["d_" + agg] = dv
                rec["s_" + agg] = sv
            rec["ex_UID"] = rs[0].uid
            if self.python_frames:
                rec["call_stack"] = pd_first(r.call_stack for r in rs)
            rec["kds"] = self.kernel_stats(r.kernels for r in rs)
            recs.append(rec)
        recs.sort(key=lambda r: (_desc_key(r["d_sum"]), r["ex_UID"]))
        pct, cum = _percentages([r["d_sum"] for r in recs])
        cols = list(gcols) + ["operation_count"]
        for agg in (*AGG, "sum"):
            cols += [f"total_direct_kernel_time_{agg}", f"total_subtree_kernel_time_{agg}"]
        cols.append("ex_UID")
        if self.python_frames:
            cols.append("call_stack")
        cols += ["kernel_details_summary", "trunc_kernel_details", "Percentage (%)", "Cumulative Percentage (%)"]
        rows = []
        for i, r in enumerate(recs):
            row = [r[c] for c in gcols] + [r["operation_count"]]
            for agg in (*AGG, "sum"):
                row += [r["d_" + agg], r["s_" + agg]]
            row.append(r["ex_UID"])
            if self.python_frames:
                row.append(r["call_stack"])
            row += [r["kds"], trunc_kernel_details(r["kds"]), pct[i], cum[i]]
            rows.append(row)
        return Table(cols, rows)

    # ------------------------------------------------------------------ roofline ("perf metrics") sheets

    def perf_rows(self, uids: Iterable[int], bwd: bool) -> list[_PerfRow]:
        rows = []
        for uid in uids:
            if bwd and not self.bwd_links.get(uid):
                continue  # TraceLens computes these too, then drops them: no backward op
            st, kernels, busy = self.perf(uid, bwd)
            if isinstance(st, Exception):
                continue  # NotImplementedError: no model; anything else: failed (TraceLens warns)
            rows.append(_PerfRow(uid, self.trace.name_of(uid), self.names(uid), self.trace.args_of(uid) or {}, st, busy,
                                 kernels))
        return rows

    @staticmethod
    def _param_strings(statics: list[pm.StaticMetrics]) -> tuple[list[str], dict[int, tuple]]:
        """The ``param:`` columns in order of first appearance, and per model result its cells as
        pandas prints them after ``astype(str)``: NA stays empty, and an int column with missing
        cells is float64 ("2048.0")."""
        keys: dict[str, None] = {}
        for st in statics:
            for k in st.params:
                keys.setdefault(k, None)
        as_float = {}
        for k in keys:
            vals = [st.params.get(k) for st in statics]
            present = [v for v in vals if v is not None]
            as_float[k] = len(present) < len(vals) and bool(present) and all(type(v) is int for v in present)
        out = {}
        for st in statics:
            cells: list[str | None] = []
            for k in keys:
                v = st.params.get(k)
                if v is None or (isinstance(v, float) and v != v):
                    cells.append(None)
                else:
                    cells.append(repr(float(v)) if as_float[k] else str(v))
            out[id(st)] = tuple(cells)
        return list(keys), out

    def summarize_perf(self, rows: list[_PerfRow], group_by_num_kernels: bool) -> Table | None:
        if not rows:
            return None
        uniq: dict[int, pm.StaticMetrics] = {}
        for r in rows:
            uniq.setdefault(id(r.st), r.st)
        pkeys, pstr = self._param_strings(list(uniq.values()))
        has_roof = any(st.roof is not None for st in uniq.values())
        order, groups, mono = group_rows(
            [(r.name, *pstr[id(r.st)]) + ((len(r.kernels),) if group_by_num_kernels else ()) for r in rows],
            sort=True)
        tbs = [r.st.tb_s(r.busy) for r in rows]
        tfl = [r.st.tflops_s(r.busy) for r in rows]
        pct = [r.st.pct_roofline(r.busy) for r in rows]
        kt = [r.busy for r in rows]
        f_tbs, f_tfl, f_pct, f_kt = _fast(mono, tbs), _fast(mono, tfl), _fast(mono, pct), _fast(mono, kt)
        cols = ["name", *pkeys] + (["num_kernels"] if group_by_num_kernels else [])
        cols += ["GFLOPS_first", "Data Moved (MB)_first", "FLOPS/Byte_first"]
        cols += [f"TB/s_{a}" for a in AGG] + [f"TFLOPS/s_{a}" for a in AGG]
        cols += ["process_name_first", "process_label_first", "thread_name_first", "Compute Spec"]
        if has_roof:
            cols += ["Roofline Time (µs)_first", "Roofline Bound_first"] + [f"Pct Roofline_{a}" for a in AGG]
        cols += ["kernel_details__summarize_kernel_stats", "trunc_kernel_details"]
        cols += [f"{a}_first" for a in ARG_COLS]
        cols += [f"Kernel Time (µs)_{a}" for a in (*AGG, "sum")] + ["name_count", "UID_first"]
        out = []
        for key in order:
            idx = groups[key]
            rs = [rows[i] for i in idx]
            sts = [r.st for r in rs]
            row: list[Any] = [key[0], *key[1:]]
            row += [pd_first(st.gflops for st in sts), pd_first(st.data_mb for st in sts),
                    pd_first(st.flops_per_byte for st in sts)]
            g_tbs, g_tfl = [tbs[i] for i in idx], [tfl[i] for i in idx]
            row += pd_aggs(g_tbs, AGG, f_tbs) + pd_aggs(g_tfl, AGG, f_tfl)
            row += [*rs[0].names, sts[0].spec]
            if has_roof:
                row += [pd_first(st.roof for st in sts), pd_first(st.bound for st in sts)]
                g_pct = [pct[i] for i in idx]
                row += pd_aggs(g_pct, AGG, f_pct)
            kds = self.kernel_stats(r.kernels for r in rs)
            row += [kds, trunc_kernel_details(kds)]
            row += [pd_first(r.args.get(a) for r in rs) for a in ARG_COLS]
            g_kt = [kt[i] for i in idx]
            row += pd_aggs(g_kt, (*AGG, "sum"), f_kt)
            row += [len(rs), rs[0].uid]
            out.append(row)
        i_sum, i_uid = cols.index("Kernel Time (µs)_sum"), cols.index("UID_first")
        out.sort(key=lambda r: (_desc_key(r[i_sum]), r[i_uid]))
        return Table(cols, out)

    def roofline_sheets(self, group_by_num_kernels: bool) -> dict[str, Table]:
        fams = pm.sheet_families()
        fam_of = {n: f for f, names in fams.items() for n in names}
        trace = self.trace
        fam_of_name = {i: fam_of.get(n) for i, n in enumerate(trace.names)}  # per name index
        by_fam: dict[str, list[int]] = {}
        for uid in self.cpu_ops:  # every op with a modelled name (§8.8)
            f = fam_of_name[trace.name[uid]]
            if f is not None:
                by_fam.setdefault(f, []).append(uid)
        single = _SINGLE_SHEETS_INFERENCE if self.inference else _SINGLE_SHEETS_PYTORCH
        out: dict[str, Table] = {}
        for fam in fams:
            evs = by_fam.get(fam)
            if not evs:
                continue
            if fam in single:
                t = self.summarize_perf(self.perf_rows(evs, False), group_by_num_kernels)
                if t is not None:
                    out[fam] = t
                continue
            fwd = self.summarize_perf(self.perf_rows(evs, False), group_by_num_kernels)
            moved: list[list] = []
            if fwd is not None:
                i_name = fwd.columns.index("name")
                moved = [r for r in fwd.rows if r[i_name] in _BWD_IN_FWD]
                fwd.rows = [r for r in fwd.rows if r[i_name] not in _BWD_IN_FWD]
            bwd = None
            if not self.inference:
                bevs = [u for u in evs if trace.name_of(u) != "vllm::unified_attention_with_output"]
                bwd = self.summarize_perf(self.perf_rows(bevs, True), group_by_num_kernels)
                if moved:
                    if bwd is None:
                        bwd = Table(list(fwd.columns), [])  # type: ignore[union-attr]
                    # pd.concat aligns by column name: a missing column is NaN.
                    src = fwd.columns  # type: ignore[union-attr]
                    for r in moved:
                        d = dict(zip(src, r))
                        bwd.rows.append([d.get(c) for c in bwd.columns])
                if bwd is not None:
                    i_name = bwd.columns.index("name")
                    bwd.rows = [r for r in bwd.rows if r[i_name] not in _FWD_IN_BWD]
            if fwd is not None and fwd.rows:
                out[f"{fam}_fwd"] = fwd
            if bwd is not None and bwd.rows:
                out[f"{fam}_bwd"] = bwd
        return out

    # ------------------------------------------------------------------ unified perf summary

    def linked_fwd(self, uid: int) -> tuple[int | None, bool]:
        """TraceLens ``_get_linked_fwd_event``: the forward op of a backward op (up to 5 levels up to
        the autograd wrapper) and whether this op is the wrapper's only main backward op."""
        t, tree = self.trace, self.tree
        cur, wrapper, fwd = uid, -1, None
        for _ in range(5):
            p = tree.parent[cur]
            if p < 0:
                break
            fwd = self.fwd_link.get(p)
            if fwd is not None:
                wrapper = p
                break
            cur = p
        if wrapper < 0 or fwd is None:
            return None, False
        if pm.model_class(t.name_of(fwd)) is None:
            return None, False
        wrapper_name = t.name_of(wrapper)
        main = wrapper_name.split(": ", 1)[1] if ": " in wrapper_name else None
        count = 0
        stack = list(reversed(tree.children_of(wrapper)))
        while stack:
            c = stack.pop()
            if t.cat_of(c) == "cpu_op":
                if tree.gpu_count(c) and (main is None or t.name_of(c) == main):
                    count += 1
                stack.extend(reversed(tree.children_of(c)))
        return fwd, count == 1

    def sole_bwd(self, uid: int) -> int | None:
        if not self.fwd_link:
            return None  # no backward pass in the trace
        fwd, sole = self.linked_fwd(uid)
        if fwd is None or not sole:
            return None
        st = self.perf(fwd, True)[0]
        return None if isinstance(st, Exception) else fwd

    def unified_events(self, include_nccl: bool) -> list[int]:
        t, tree = self.trace, self.tree
        collected: list[int] = []
        models = pm.MODELS
        has_gpu = tree.gpu_count

        def has_model(u: int) -> bool:
            return t.name_of(u) in models

        def is_leaf(u: int) -> bool:
            return any(t.cat_of(c) in RUNTIME_CATS and has_gpu(c) for c in tree.children_of(u))

        # Depth first, children in order (a stack instead of recursion: a nested function that
        # calls itself is a reference cycle, and the cyclic GC is off during the report).
        stack = [r for r in reversed(tree.roots) if has_gpu(r)]
        while stack:
            u = stack.pop()
            cat = t.cat_of(u)
            if cat == "python_function":
                stack.extend(c for c in reversed(tree.children_of(u)) if has_gpu(c))
                continue
            if cat != "cpu_op" or not has_gpu(u):
                continue
            if has_model(u) or self.sole_bwd(u) is not None:
                collected.append(u)
                continue
            if is_leaf(u):
                inner = [c for c in tree.children_of(u) if t.cat_of(c) == "cpu_op" and has_model(c) and has_gpu(c)]
                if inner:
                    stack.extend(reversed(inner))
                    continue
                if not include_nccl and any(self.is_comm(t.name_of(g)) for g in tree.gpu_uids_of(u)):
                    continue
                collected.append(u)
                continue
            stack.extend(c for c in reversed(tree.children_of(u)) if has_gpu(c))  # nothing to find without GPU work
        return collected

    def unified_rows(self, include_nccl: bool) -> list[_UnifiedRow]:
        """One row per unified event: its model result ``st`` (StaticMetrics; None without a model;
        the exception when the model failed) and kernel time ``busy`` (NaN when it failed)."""
        t, tree = self.trace, self.tree
        rows = []
        for uid in self.unified_events(include_nccl):
            name = t.name_of(uid)
            own = pm.model_class(name) is not None
            fwd = None if own else self.sole_bwd(uid)
            st: Any = None
            kernels = tree.gpu_uids_of(uid)
            if own or fwd is not None:
                st, _, busy = self.perf(uid, False) if own else self.perf(fwd, True)  # type: ignore[arg-type]
                if isinstance(st, NotImplementedError):
                    continue  # no metrics for this op: TraceLens drops the row
                if isinstance(st, Exception):
                    busy = NAN  # failed: kept without metrics, not even Kernel Time
            else:
                busy = self.busy(kernels) if kernels else NAN
            argv, args_s = self.arg_tuples(uid)
            rows.append(_UnifiedRow(uid, name, self.category(uid), self.names(uid), t.dur_of(uid), own or fwd is not None,
                                    argv, args_s, None, st, busy))
        # GPU work launched outside every cpu_op (a bare runtime call, e.g. a CUDA-graph replay)
        # becomes "<runtime>-><kernel> (Synthetic Op)" rows (tracelens-reference §1.4).
        parent = tree.parent
        for g in tree.gpu_uids:
            rt = parent[g]
            if rt < 0 or (not include_nccl and self.is_comm(t.name_of(g))):
                continue
            p = parent[rt]
            while p >= 0 and t.cat_of(p) != "cpu_op":
                p = parent[p]
            if p >= 0:
                continue
            name = f"{t.name_of(rt)}->{t.name_of(g)} (Synthetic Op)"
            rows.append(_UnifiedRow(g, name, pm.categorize(name, t.name_of(g)), self.names(rt), t.dur_of(rt), False,
                                    (None, None, None, None), ("None", "None", "None", "None"), [g], None,
                                    self.busy([g])))
        return rows

    def unified_kernels(self, row: _UnifiedRow) -> list[int] | None:
        """The kernel/memcpy/memset events of a unified row (None: none); an op's are read off the
        tree when needed rather than kept on every row."""
        if row.kernels is not None:
            return row.kernels  # a synthetic op's one GPU event
        kind, gpu_kind = self.trace.kind, self._gpu_kind
        kds = [g for g in self.tree.gpu_uids_of(row.uid) if gpu_kind[kind[g]]]
        return kds if kds else None

    def unified_summary(self, rows: list[_UnifiedRow]) -> Table | None:
        if not rows:
            return None
        head = ["name", "op category", "process_name", "process_label", "thread_name"]
        gcols = head + list(ARG_COLS)
        ok = [r.st if isinstance(r.st, pm.StaticMetrics) else None for r in rows]
        any_model = any(st is not None for st in ok)
        any_roof = any(st is not None and st.roof is not None for st in ok)
        busy = [r.busy for r in rows]
        # Per-instance columns (NaN/None where a row has no value, as in TraceLens's DataFrame).
        cols_v: dict[str, list] = {
            "duration_us": [r.dur for r in rows],
            "TB/s": [st.tb_s(b) if st else NAN for st, b in zip(ok, busy)],
            "TFLOPS/s": [st.tflops_s(b) if st else NAN for st, b in zip(ok, busy)],
            "Pct Roofline": [st.pct_roofline(b) if st else NAN for st, b in zip(ok, busy)],
            "Kernel Time (µs)": busy,
        }
        has_kt = any(not _isna(b) for b in busy)
        order, groups, mono = group_rows([r.key for r in rows], sort=False)
        fast = {c: _fast(mono, v) for c, v in cols_v.items()}
        static = ["GFLOPS", "Data Moved (MB)", "FLOPS/Byte", "Compute Spec"] if any_model else []
        if any_roof:
            static.append("Roofline Bound")
        varying = ["TB/s", "TFLOPS/s"] if any_model else []
        recs = []
        for key in order:
            idx = groups[key]
            rs = [rows[i] for i in idx]
            sts = [ok[i] for i in idx]
            first = rs[0]
            rec: dict[str, Any] = {c: first[c] for c in head}
            rec.update(zip(ARG_COLS, first.argv))
            rec["ex_UID"] = first.uid
            rec["operation_count"] = len(rs)

            def stats(c: str, aggs: Sequence[str], rec: dict = rec, idx: Any = idx) -> None:  # called at once
                col = cols_v[c]
                for a, v in zip(aggs, pd_aggs([col[i] for i in idx], aggs, fast[c])):
                    rec[f"{c}_{a}"] = v

            stats("duration_us", (*AGG, "sum"))
            rec["total_duration_us"] = rec["duration_us_sum"]
            if any_model:
                rec["GFLOPS"] = pd_first(st.gflops if st else NAN for st in sts)
                rec["Data Moved (MB)"] = pd_first(st.data_mb if st else NAN for st in sts)
                rec["FLOPS/Byte"] = pd_first(st.flops_per_byte if st else NAN for st in sts)
                rec["Compute Spec"] = pd_first(st.spec if st else None for st in sts)
            for c in varying:
                stats(c, AGG)
            if any_roof:
                rec["Roofline Bound"] = pd_first(st.bound if st else None for st in sts)
                rec["Roofline Time (µs)_first"] = pd_first(st.roof if st else None for st in sts)
                stats("Pct Roofline", AGG)
            if has_kt:
                stats("Kernel Time (µs)", (*AGG, "sum"))
            rec["kernel_details_summary"] = self.kernel_stats((self.unified_kernels(r) for r in rs), self.python_frames)
            rec["perf_params"] = pd_first((st.plain_params or None) if st else None for st in sts)
            rec["has_perf_model"] = first.has_model
            recs.append(rec)
        _rank_unified(recs, has_kt)
        cols = _unified_columns(gcols, static, varying, any_roof, has_kt)
        return Table(cols, [[r.get(c) for c in cols] for r in recs])

    # ------------------------------------------------------------------ kernel sheets

    def kernel_rows(self) -> _KernelRows:
        """One row per ``kernel`` event, linked or not (TraceLens ``get_df_kernels``)."""
        t, parent = self.trace, self.tree.parent
        kernel = t.kinds_where(lambda ph, cat: cat == "kernel")
        rows = _KernelRows()
        for k in self.tree.gpu_uids:  # every GPU event, in trace order
            if not kernel[t.kind[k]]:
                continue
            launcher = parent[k]  # a GPU event has a parent only when linked
            cpu = launcher
            while cpu >= 0 and t.cat_of(cpu) != "cpu_op":
                cpu = parent[cpu]
            rows.kernel.append(k)
            rows.launcher.append(launcher)
            rows.cpu.append(cpu)
            rows.argv.append(self.arg_tuples(cpu)[0] if cpu >= 0 else (None, None, None, None))
        return rows

    def kernel_summary(self, krows: _KernelRows, total_time_ms: float) -> Table | None:
        if not krows.kernel:
            return None
        t = self.trace
        keys = []
        for k, launcher, cpu in zip(krows.kernel, krows.launcher, krows.cpu):
            if cpu >= 0:
                parent, cat = t.name_of(cpu), self.category(cpu)
            elif launcher >= 0:
                parent = t.name_of(launcher)
                low = parent.lower()
                cat = "graph" if ("cudagraph" in low or "graphlaunch" in low) else "runtime"
            else:
                parent = cat = None
            keys.append((cat, parent, t.name_of(k), (t.args_of(k) or {}).get("stream")))
        if any(k[3] is None for k in keys):  # an int column with a missing stream is float64 in pandas
            keys = [k[:3] + (float(k[3]) if isinstance(k[3], int) else k[3],) for k in keys]
        order, groups, mono = group_rows(keys, sort=True)  # dropna=False: NaN keys sort last
        durs = [t.dur_of(k) for k in krows.kernel]
        fast = _fast(mono, durs)
        total_k = np_sum(durs)
        total_us = total_time_ms * 1e3
        recs = []
        for key in order:
            d = [durs[i] for i in groups[key]]
            s = pd_sum(d, fast)
            recs.append(list(key) + [s, len(d), pd_mean(d, fast), pd_min(d), pd_max(d),
                                     (s / total_k) * 100 if total_k > 0 else NAN,
                                     (s / total_us) * 100 if total_us else NAN])
        recs.sort(key=lambda r: _desc_key(r[4]))
        cols = ["Parent op category", "Parent cpu_op", "Kernel name", "Kernel stream", "Kernel duration (µs)_sum",
                "Kernel duration (µs)_count", "Kernel duration (µs)_mean", "Kernel duration (µs)_min",
                "Kernel duration (µs)_max", "Percent of kernels time (%)", "Percent of total time (%)"]
        return Table(cols, recs)

    def short_kernels(self, krows: _KernelRows, total_time_ms: float, threshold: float, bins: int,
                      gpu_only: bool) -> tuple[Table | None, Table | None]:
        t = self.trace
        short = [i for i, k in enumerate(krows.kernel) if t.dur[k] < threshold]
        if not short:
            return None, None
        durs = [t.dur_of(krows.kernel[i]) for i in short]
        counts, edges = histogram(durs, bins)
        hist = Table(["bin_start", "bin_end", "count"],
                     [[edges[i], edges[i + 1], counts[i]] for i in range(len(counts))])
        gcols = ["Kernel name"] if gpu_only else ["Parent cpu_op", "Input dims", "Input strides", "Concrete Inputs",
                                                  "Kernel name"]
        keys = []
        for i in short:
            cpu, (dims, _, strides, concrete) = krows.cpu[i], krows.argv[i]
            vals = {"Parent cpu_op": t.name_of(cpu) if cpu >= 0 else None, "Input dims": dims,
                    "Input strides": strides, "Concrete Inputs": concrete, "Kernel name": t.name_of(krows.kernel[i])}
            key = tuple(vals[c] for c in gcols)
            # groupby(dropna=True): a kernel without a parent op or its args is left out
            keys.append(_DROP if any(v is None for v in key) else key)
        order, groups, mono = group_rows(keys, sort=False)
        fast = _fast(mono, durs)
        total_us = total_time_ms * 1e3
        recs = []
        for key in order:
            d = [durs[i] for i in groups[key]]
            s = pd_sum(d, fast)
            recs.append(list(key) + [s, len(d), pd_mean(d, fast), s / total_us * 100])
        n = len(gcols)
        recs.sort(key=lambda r: (_desc_key(r[n]), r[n + 1], _asc_key(r[n + 2]), _asc_key(r[n + 3])))
        summary = Table(gcols + ["Short Kernel duration (µs) sum", "Short Kernel count",
                                 "Short Kernel duration (µs) mean", "Short Kernel duration (µs) percent of total time"],
                        recs) if recs else None
        return hist, summary

    # ------------------------------------------------------------------ collective analysis

    _COLL_BYTES = {"Float": 4, "Int": 4, "Long": 8, "BFloat16": 2, "Bool": 1, "Byte": 1, "Double": 8, "Half": 2,
                   "Short": 2}
    _COLL_FIELDS = ("Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                    "In msg nelems", "Out msg nelems", "In split size", "Out split size", "stream")

    def coll_analysis(self) -> Table | None:
        """TraceLens ``NcclAnalyser.build_df_summary_long`` for this one trace (rank 0)."""
        t = self.trace
        rows = []
        for k in self.tree.gpu_uids:
            name = t.name_of(k)
            if t.cat_of(k) != "kernel" or not self.is_comm(name):
                continue
            if t.corr_of(k) is None and t.ext_of(k) is None:
                continue
            args = t.args_of(k) or {}
            row: dict[str, Any] = {"ts": t.ts_of(k), "dur": t.dur_of(k), "rank": 0}
            for f in self._COLL_FIELDS:
                row[f] = _to_tuple(args.get(f))
            if row["Collective name"] is None and "cross_device_reduce" in name:
                row["Collective name"] = "allreduce"  # vLLM custom all-reduce
            bpe = self._COLL_BYTES.get(row["dtype"]) if isinstance(row["dtype"], str) else None
            if bpe is not None and row["In msg nelems"] is not None:
                row["In"] = row["In msg nelems"] * bpe / 1024 ** 2
                row["Out"] = row["Out msg nelems"] * bpe / 1024 ** 2 if row["Out msg nelems"] is not None else NAN
            else:
                row["In"] = row["Out"] = None
            rows.append(row)
        if not rows:
            return None
        no_pg = all(r["Process Group Name"] is None for r in rows)
        streams = {r["stream"] for r in rows}
        for r in rows:
            if no_pg and len(streams) <= 1:
                r["Process Group Name"] = "all"  # simplified single-stream inference mode
            elif r["Process Group Name"] is None:
                r["Process Group Name"] = "Unknown_Group"
        keys = ("rank",) + self._COLL_FIELDS
        gkeys = []
        for r in rows:
            k = tuple(r[c] for c in keys)
            gkeys.append(_DROP if any(v is None for v in k) else k)  # dropna=True
        order, groups, mono = group_rows(gkeys, sort=True)
        durs = [r["dur"] for r in rows]
        fast = _fast(mono, durs)
        recs = []
        for k in order:
            rs = [rows[i] for i in groups[k]]
            d = [r["dur"] for r in rs]
            recs.append(list(k) + [pd_first(r["In"] for r in rs), pd_first(r["Out"] for r in rs), pd_sum(d, fast),
                                   pd_mean(d, fast), pd_std(d), pd_min(d), pd_max(d), len(rs)])
        recs.sort(key=lambda r: _desc_key(r[len(keys) + 2]))
        cols = list(keys) + ["In msg size (MB)_first", "Out msg size (MB)_first", "dur_sum", "dur_mean", "dur_std",
                             "dur_min", "dur_max", "operation_count"]
        return Table(cols, recs) if recs else None


def pytorch_report(tree: EventTree, arch: dict | None, *, inference: bool = False,
                   enable_kernel_summary: bool | None = None, short_kernel_study: bool | None = None,
                   short_kernel_threshold_us: float = 10,
                   short_kernel_histogram_bins: int = 100, group_by_num_kernels: bool = False,
                   group_by_parent_module: bool = False, coll_analysis: bool = True) -> dict[str, Table]:
    """TraceLens's perf report for one trace, as sheets keyed by name (only non-empty ones).

    ``inference=True`` reproduces ``TraceLens_generate_perf_report_pytorch_inference``: module
    variants of the ops summaries (with ``group_by_parent_module``), ``*_fwd`` sheet names, step
    annotations on more attention ops, no ``_bwd`` sheets and no collective analysis. Without
    ``arch`` the roofline columns are left out. Raises ValueError for a trace without linked GPU
    events ("No GPU events found in the trace"), as TraceLens does.

    ``enable_kernel_summary`` / ``short_kernel_study`` default to True in pytorch mode (the golden
    pytorch runs pass ``--enable_kernel_summary --short_kernel_study``) and to False in inference
    mode (TraceLens's inference CLI default, used for the golden stage folders).

    Divergences from TraceLens: ``--enable_pseudo_ops`` tree extensions are not applied (no pseudo
    ops are inserted); the tree has no Python frames, so ``parent_module`` is always ``NA``; CPU-op
    durations that are JSON integers print as floats ("600.0", pandas "600"), because the loader
    keeps every duration as a float; an empty short-kernel sheet is not written."""
    if enable_kernel_summary is None:
        enable_kernel_summary = not inference
    if short_kernel_study is None:
        short_kernel_study = not inference
    # The cyclic GC is paused: the report makes many small objects that never form cycles, and
    # each full collection would walk every event of the trace again (as in ``load_trace``).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _pytorch_report(tree, arch, inference, enable_kernel_summary, short_kernel_study,
                               short_kernel_threshold_us, short_kernel_histogram_bins, group_by_num_kernels,
                               group_by_parent_module, coll_analysis)
    finally:
        if was_enabled:
            gc.enable()


def _pytorch_report(tree: EventTree, arch: dict | None, inference: bool, enable_kernel_summary: bool,
                    short_kernel_study: bool, short_kernel_threshold_us: float, short_kernel_histogram_bins: int,
                    group_by_num_kernels: bool, group_by_parent_module: bool, coll_analysis: bool) -> dict[str, Table]:
    rep = _Report(tree, arch, inference, python_frames=inference and group_by_parent_module)
    linked = tree.linked_gpu_events
    if not linked:
        raise ValueError("No GPU events found in the trace")
    tl = [list(r) for r in gpu_timeline(linked)]
    tables: dict[str, Table] = {"gpu_timeline": Table(["type", "time ms", "percent"], tl)}
    total_time_ms = next(r[1] for r in tl if r[0] == "total_time")
    gpu_only = not any(cat in ("cpu_op", "python_function") for _, cat in tree.trace.kinds)

    if not gpu_only:
        rep.attach_annotations(ANNOTATED_OPS_INFERENCE if inference else ANNOTATED_OPS_PYTORCH)
        if not inference:
            rep.link_fwd_bwd()
        perf_tables = rep.roofline_sheets(group_by_num_kernels)  # before the launcher rows: one at a time
        kl = rep.kernel_launchers()
        if kl:
            tables["ops_summary_by_category"] = rep.ops_by_category(kl)
            tables["ops_summary"] = rep.ops_summary(kl)
            tables["ops_unique_args"] = rep.ops_unique_args(kl, group_by_num_kernels)
        del kl  # the largest rows of the report: gone before the unified rows are made
        unified = rep.unified_summary(rep.unified_rows(include_nccl=False))
        if unified is not None and unified.rows:
            tables["unified_perf_summary"] = unified
        tables.update(perf_tables)

    krows = rep.kernel_rows() if (enable_kernel_summary or short_kernel_study) else _KernelRows()
    if enable_kernel_summary:
        ks = rep.kernel_summary(krows, total_time_ms)
        if ks is not None and ks.rows:
            tables["kernel_summary"] = ks
    if short_kernel_study:
        hist, summary = rep.short_kernels(krows, total_time_ms, short_kernel_threshold_us,
                                          short_kernel_histogram_bins, gpu_only)
        if hist is not None and hist.rows:
            tables["short_kernel_histogram"] = hist
        if summary is not None and summary.rows:
            tables["short_kernels_summary"] = summary
    if coll_analysis and not inference and not gpu_only:
        ca = rep.coll_analysis()
        if ca is not None:
            tables["coll_analysis"] = ca
    return tables


def _rank_unified(recs: list[dict], has_kt: bool) -> None:
    """TraceLens's order of the unified summary (kernel time, else duration, descending), its
    percentage columns, and the columns derived from the aggregates."""
    if has_kt:
        recs.sort(key=lambda r: (_desc_key(r["Kernel Time (µs)_sum"]), r["ex_UID"]))
        pct, cum = _percentages([r["Kernel Time (µs)_sum"] for r in recs])
        for r, pc, cu in zip(recs, pct, cum):
            r["Percentage (%)"], r["Cumulative Percentage (%)"] = pc, cu
    else:
        recs.sort(key=lambda r: (_desc_key(r["total_duration_us"]), r["ex_UID"]))
    for r in recs:
        r["mean_duration_us"] = r["duration_us_mean"]
        r["std_duration_us"] = r["duration_us_std"]
        r["trunc_kernel_details"] = trunc_kernel_details(r["kernel_details_summary"])


def _unified_columns(gcols: list[str], static: list[str], varying: list[str], any_roof: bool,
                     has_kt: bool) -> list[str]:
    """The unified summary's columns, in TraceLens's order."""
    cols = gcols + ["ex_UID", "operation_count", "total_duration_us", "mean_duration_us", "std_duration_us"]
    cols += static
    for c in varying + (["Kernel Time (µs)"] if has_kt else []):
        cols += [f"{c}_mean", f"{c}_std"] + ([f"{c}_sum"] if c == "Kernel Time (µs)" else [])
    cols += ["duration_us_median", "duration_us_min", "duration_us_max"]
    for c in varying:
        cols += [f"{c}_median", f"{c}_min", f"{c}_max"]
    if any_roof:
        cols.append("Roofline Time (µs)_first")
        cols += [f"Pct Roofline_{a}" for a in AGG]
    if has_kt:
        cols += ["Kernel Time (µs)_median", "Kernel Time (µs)_min", "Kernel Time (µs)_max"]
    cols += ["kernel_details_summary", "trunc_kernel_details", "perf_params", "has_perf_model"]
    if has_kt:
        cols += ["Percentage (%)", "Cumulative Percentage (%)"]
    return cols
