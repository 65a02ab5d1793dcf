"""Streaming loader for torch-profiler (Kineto) Chrome traces: ``.json`` or ``.json.gz``, a
``{"traceEvents": [...]}`` object or a bare list.

Storage is columnar: event ``i`` (its ``uid``, the index in ``traceEvents``) is row ``i`` of a
few ``array`` columns (time stamps, durations, ids) and of index columns into small tables of the
distinct (ph, cat) pairs, names and pid/tid values. That is about 60 bytes an event, where one
Python object per event cost about 400. ``trace.events[i]`` is an ``Event``, a two-field view
made on demand; the analyses that visit every event read the columns instead.

The file is decompressed and decoded in windows of a few hundred kB. Inside a window msgspec
decodes thousands of events per call; an event's args stay as their JSON text (pooled: the same
op signature every step is one copy) and are decoded on first use. Whatever msgspec cannot take
(a window boundary inside a string, a bad event) goes through ``json.raw_decode`` one event at a
time, which also pins down errors: a truncated or malformed file raises ``TraceError`` naming the
file, the character and byte offset and the index of the event.

Junk gives up within seconds, whatever its size: a parse error in the middle of a window is an
error at once (only a value cut by the window's end is read on, in doubling windows, and no single
value may pass ``MAX_VALUE_CHARS``); JSON nested deeper than ``MAX_JSON_DEPTH`` is refused; and
once loaded, events whose ``ts``/``dur`` are not finite or are absurd (NaN, inf, a negative
duration, |ts| over ``MAX_ABS_TS`` or dur over ``MAX_DUR``) refuse the trace, with their count.
"""

from __future__ import annotations

import codecs
import gc
import json
import math
import os
import re
import struct
import sys
import threading
import weakref
from array import array
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterator, Sequence, Union

import numpy as np

from engine.errors import MagpieError
from engine.trace.deflate import zlib
from engine.trace.forked import ForkedCall

if TYPE_CHECKING:
    from engine.trace.tree import EventTree

_CHUNK = 1 << 17  # characters decoded per read (small windows: less transient memory, as fast)
_WS = re.compile(r"[\s,]*")
_SPACE = re.compile(r"\s*")
_DECODER = json.JSONDecoder()

# args kept per category: the rest of an event's args are dropped at load time.
_KEEP_ALL_ARGS = {"cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "user_annotation", "python_function",
                  "cuda_runtime", "cuda_driver", "gpu_user_annotation"}


class TraceError(MagpieError):
    """A trace file that cannot be read or is not a trace; the message names the file."""

    title = "unreadable trace"


class TraceCancelled(MagpieError):
    """Loading stopped because the run was cancelled (a SIGTERM, a Ctrl-C, a cancel call)."""

    title = "cancelled"


# Limits that make junk fail fast. No real trace comes near them: an event is a few kB, its
# args nest 4-5 levels (shapes in lists), its times are microseconds (or nanoseconds) since boot
# or the epoch.
MAX_VALUE_CHARS = 16 << 20  # one event or top-level value; beyond this it is no trace event
MAX_JSON_DEPTH = 100  # nesting of one event (or top-level value)
MAX_ABS_TS = 1e19  # |ts|: 300+ years in ns since the epoch
MAX_DUR = 1e15  # dur: 31 years in us, 11 days in ns
_CANCEL_EVERY = 16  # windows read between two looks at the cancel token


def _depth_of_text(raw: bytes | str) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text (strings skipped), without parsing it."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    brackets = _JSON_STRING.sub(b'""', raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_BRACKET_STEP = [0] * 256
_BRACKET_STEP[ord("[")] = _BRACKET_STEP[ord("{")] = 1
_BRACKET_STEP[ord("]")] = _BRACKET_STEP[ord("}")] = -1


def _too_deep(raw: bytes | str) -> bool:
    """Nested deeper than ``MAX_JSON_DEPTH`` (a cheap count first: most texts have few brackets)."""
    if isinstance(raw, str):
        if raw.count("[") + raw.count("{") <= MAX_JSON_DEPTH:
            return False
    elif raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    return _depth_of_text(raw) > MAX_JSON_DEPTH


# Kept in the id columns (correlation, External id) or dropped (per-event counters no analysis reads).
_NOT_ARGS = ("correlation", "External id", "Ev Idx", "Record function id")
_DROP_ARGS = _NOT_ARGS[2:]  # the per-event counters
_NOT_ARGS_SET = frozenset(_NOT_ARGS)


try:  # msgspec decodes many events per call, 5-10x faster than one json.raw_decode per event
    import msgspec

    class _RawEvent(msgspec.Struct, gc=False):
        ph: str = ""
        cat: str = ""
        name: Any = ""
        pid: Any = None
        tid: Any = None
        ts: Any = None
        dur: Any = None
        id: Any = None
        args: msgspec.Raw = msgspec.Raw(b"null")

    class _Ids(msgspec.Struct, gc=False, rename={"corr": "correlation", "ext": "External id", "idx": "Ev Idx"}):
        corr: Any = None
        ext: Any = None
        idx: Any = None

    _FAST = msgspec.json.Decoder(list[_RawEvent])
    _IDS_TYPED = msgspec.json.Decoder(_Ids)
    _IDS_LIST = msgspec.json.Decoder(list[Union[_Ids, None]])
    _FAST_ERRORS: tuple = (msgspec.DecodeError, msgspec.ValidationError)
    _json_loads: Callable[[bytes], Any] = msgspec.json.decode
    _ENCODE: Callable[[Any], bytes] | None = msgspec.json.Encoder().encode
except ImportError:  # pragma: no cover - msgspec is a dependency; keep working without it
    _FAST = None
    _json_loads = json.loads
    _ENCODE = None


_FAST_MIN = 1 << 13  # characters: below this, one event at a time is as quick


def _decode_args(raw: bytes) -> dict | None:
    args = _json_loads(raw)
    if type(args) is not dict:
        return None
    for k in _NOT_ARGS:
        args.pop(k, None)
    return args


# ------------------------------------------------------------------------------ columns

# Id columns (correlation, External id, flow id) hold int64; these two values mark "no id" and
# "a value the column cannot hold" (a string id, a huge int), which then lives in Trace.odd.
NO_ID = -(1 << 63)
ODD_ID = NO_ID + 1
_MAX_EXACT = 1 << 53  # an int time stamp beyond this is not exact as a float: kept in Trace.odd
# Bits of the per-event ``num_flags`` column: the JSON wrote ts / dur as an int (kept so that an
# integral duration prints as ``50``, as TraceLens's does), or the event has a value in Trace.odd.
TS_INT, DUR_INT, HAS_ODD = 1, 2, 4
_UNDECODED = object()
_MAX_ID = 1 << 63  # exclusive bound of an int64 id


class Trace:
    """A loaded trace, stored by column; ``events`` gives ``Event`` views of its rows.

    Columns (row = uid): ``kind`` (index into ``kinds``, the distinct (ph, cat) pairs), ``name``
    (into ``names``), ``pid`` / ``tid`` (into ``ids``), ``ts`` / ``dur`` (float64), ``num_flags``,
    ``corr`` / ``ext`` / ``flow`` (int64, ``NO_ID`` when absent) and ``args`` (into the pooled
    args texts, -1 when the event has none or they were dropped)."""

    def __init__(self, path: Path, metadata: dict | None = None) -> None:
        self.path = path
        self.metadata: dict = metadata if metadata is not None else {}
        self.kinds: list[tuple[str, str]] = []  # (ph, cat)
        self.names: list[str] = []
        self.ids: list[Any] = []  # distinct pid / tid values
        self.kind = array("I")
        self.name = array("I")
        self.pid = array("I")
        self.tid = array("I")
        self.ts = array("d")
        self.dur = array("d")
        self.num_flags = array("B")
        self.corr = array("q")
        self.ext = array("q")
        self.flow = array("q")
        self.args = array("i")
        self.args_pool: list[Any] = []  # per distinct args: the JSON text, or the dict (slow path)
        self._args_decoded: list[Any] = []  # the decoded dict of each pool entry, once asked for
        # 1 where args_pool holds the entry's compact JSON (as event_json writes it), which
        # EventWriter put there in place of the profiler's text: both decode to the same args.
        self._pool_compact = bytearray()
        self.odd: dict[tuple[str, int], Any] = {}  # (column, uid) -> the exact value
        # The latest tree built on this trace (build_tree sets it), which the views read parent /
        # children / gpu_events from; held weakly, as the tree holds the trace: keep the tree.
        self._tree: Callable[[], EventTree | None] = lambda: None
        self.process_names: dict[Any, str] = {}
        self.process_labels: dict[Any, str] = {}
        self.thread_names: dict[tuple, str] = {}

    # ---------------------------------------------------------------- per-event values

    @property
    def tree(self) -> EventTree | None:
        return self._tree()

    @tree.setter
    def tree(self, tree: EventTree) -> None:
        self._tree = weakref.ref(tree)

    @property
    def events(self) -> EventList:
        return EventList(self)

    def event(self, uid: int) -> Event:
        return Event(self, uid)

    def ph_of(self, uid: int) -> str:
        return self.kinds[self.kind[uid]][0]

    def cat_of(self, uid: int) -> str:
        return self.kinds[self.kind[uid]][1]

    def name_of(self, uid: int) -> str:
        return self.names[self.name[uid]]

    def pid_of(self, uid: int) -> Any:
        return self.ids[self.pid[uid]]

    def tid_of(self, uid: int) -> Any:
        return self.ids[self.tid[uid]]

    def ts_of(self, uid: int) -> float:
        """The start as the JSON wrote it (an int stays an int)."""
        flags = self.num_flags[uid]
        if not flags:
            return self.ts[uid]
        if flags & HAS_ODD and ("ts", uid) in self.odd:
            return self.odd[("ts", uid)]
        return int(self.ts[uid]) if flags & TS_INT else self.ts[uid]

    def dur_of(self, uid: int) -> float:
        flags = self.num_flags[uid]
        if not flags:
            return self.dur[uid]
        if flags & HAS_ODD and ("dur", uid) in self.odd:
            return self.odd[("dur", uid)]
        return int(self.dur[uid]) if flags & DUR_INT else self.dur[uid]

    def end_of(self, uid: int) -> float:
        """ts + dur with their JSON types (int + int stays an int)."""
        if not self.num_flags[uid]:
            return self.ts[uid] + self.dur[uid]
        return self.ts_of(uid) + self.dur_of(uid)

    def corr_of(self, uid: int) -> Any:
        v = self.corr[uid]
        return v if v > ODD_ID else None if v == NO_ID else self.odd[("corr", uid)]

    def ext_of(self, uid: int) -> Any:
        v = self.ext[uid]
        return v if v > ODD_ID else None if v == NO_ID else self.odd[("ext", uid)]

    def flow_of(self, uid: int) -> Any:
        v = self.flow[uid]
        return v if v > ODD_ID else None if v == NO_ID else self.odd[("flow", uid)]

    def args_of(self, uid: int) -> dict | None:
        """The event's args without correlation / External id and the per-event counters; one
        shared dict per distinct args text, so treat it as read-only."""
        i = self.args[uid]
        if i < 0:
            return None
        return self.pooled_args(i)

    def pooled_args(self, i: int) -> dict | None:
        """The decoded args of pool entry ``i`` (``Trace.args`` holds these indices)."""
        hit = self._args_decoded[i]
        if hit is _UNDECODED:
            raw = self.args_pool[i]
            hit = self._args_decoded[i] = raw if type(raw) is dict else _decode_args(raw)
            if i >= len(self._pool_compact) or not self._pool_compact[i]:
                self.args_pool[i] = None  # the text is not needed any more
        return hit

    def event_json(self, uid: int) -> dict:
        """The event as a Chrome-trace object again (for split traces that Perfetto can open).
        Written for speed (the split encodes every event once or twice): plain column reads
        where the value needs no care, the ``*_of`` readers otherwise."""
        ph, cat = self.kinds[self.kind[uid]]
        ids = self.ids
        out: dict = {"ph": ph, "name": self.names[self.name[uid]], "pid": ids[self.pid[uid]], "tid": ids[self.tid[uid]]}
        if cat:
            out["cat"] = cat
        plain = not self.num_flags[uid]  # float times, no odd values
        if ph != "M":
            out["ts"] = self.ts[uid] if plain else self.ts_of(uid)
        if ph == "X":
            out["dur"] = self.dur[uid] if plain else self.dur_of(uid)
        if ph == "s" or ph == "f":
            out["id"] = self.flow_of(uid)
            if ph == "f":
                out["bp"] = "e"
        ext, corr, pooled = self.ext[uid], self.corr[uid], self.args[uid]
        decoded = self.pooled_args(pooled) if pooled >= 0 else None
        if decoded is not None or ext != NO_ID or corr != NO_ID:
            args: dict = {}  # the ids first, as Kineto writes them
            if ext != NO_ID:
                args["External id"] = ext if plain else self.ext_of(uid)
            if corr != NO_ID:
                args["correlation"] = corr if plain else self.corr_of(uid)
            if decoded:
                args.update(decoded)
            out["args"] = args
        return out

    # ---------------------------------------------------------------- whole-trace helpers

    def kinds_where(self, test: Callable[[str, str], bool]) -> bytearray:
        """Per kind index, 1 where ``test(ph, cat)`` holds: ``flags[trace.kind[uid]]`` then filters
        events without building their views."""
        return bytearray(1 if test(ph, cat) else 0 for ph, cat in self.kinds)

    def uids_where(self, test: Callable[[str, str], bool]) -> array:
        """The uids, in order, of the events whose (ph, cat) passes ``test``."""
        out = array("i")
        out.frombytes(self._uids_of(self.kinds_where(test)).astype(np.int32).tobytes())
        return out

    def uids_of(self, flags: bytes | bytearray) -> list[int]:
        """The uids, in order, of the events whose kind has a non-zero flag (``kinds_where``'s
        result, or any per-kind table of small ints): one numpy pass, not a Python step per event."""
        return self._uids_of(flags).tolist()

    def _uids_of(self, flags: bytes | bytearray) -> Any:
        if not len(self.kind) or not any(flags):
            return np.zeros(0, dtype=np.int64)
        kinds = np.frombuffer(self.kind, dtype=np.uint32)
        return np.flatnonzero(np.frombuffer(bytes(flags), dtype=np.uint8)[kinds])

    def device_properties(self) -> list[dict]:
        props = self.metadata.get("deviceProperties") or []
        return props if isinstance(props, list) else []

    def _read_names(self) -> None:
        for uid in self.uids_where(lambda ph, cat: ph == "M"):
            args = self.args_of(uid)
            if not args:
                continue
            name, pid = self.name_of(uid), self.pid_of(uid)
            if name == "process_name":
                self.process_names[pid] = str(args.get("name", ""))
            elif name == "process_labels":
                self.process_labels[pid] = str(args.get("labels", ""))
            elif name == "thread_name":
                self.thread_names[(pid, self.tid_of(uid))] = str(args.get("name", ""))


class Event:
    """One event of a ``Trace``: a view of row ``uid`` of its columns, made on demand (two views
    of one event are equal, not identical).

    ``args`` holds the event's args without ``correlation`` / ``External id`` (those are
    ``corr`` / ``ext_id``) and without per-event counters; identical args are one shared dict, so
    treat it as read-only. ``parent``, ``children``, ``gpu_events`` and ``linked`` come from the
    trace's event tree (``engine.trace.tree.build_tree``); before one is built they are empty."""

    __slots__ = ("trace", "uid")

    def __init__(self, trace: Trace, uid: int) -> None:
        self.trace = trace
        self.uid = uid

    def __eq__(self, other: object) -> bool:
        return type(other) is Event and other.uid == self.uid and other.trace is self.trace

    def __hash__(self) -> int:
        return self.uid

    @property
    def ph(self) -> str:
        t = self.trace
        return t.kinds[t.kind[self.uid]][0]

    @property
    def cat(self) -> str:
        t = self.trace
        return t.kinds[t.kind[self.uid]][1]

    @property
    def name(self) -> str:
        t = self.trace
        return t.names[t.name[self.uid]]

    @property
    def pid(self) -> Any:
        t = self.trace
        return t.ids[t.pid[self.uid]]

    @property
    def tid(self) -> Any:
        t = self.trace
        return t.ids[t.tid[self.uid]]

    @property
    def ts(self) -> float:
        return self.trace.ts_of(self.uid)

    @property
    def dur(self) -> float:
        return self.trace.dur_of(self.uid)

    @property
    def t_end(self) -> float:
        return self.trace.end_of(self.uid)

    @property
    def corr(self) -> Any:
        return self.trace.corr_of(self.uid)

    @property
    def ext_id(self) -> Any:
        return self.trace.ext_of(self.uid)

    @property
    def flow_id(self) -> Any:
        return self.trace.flow_of(self.uid)

    @property
    def args(self) -> dict | None:
        return self.trace.args_of(self.uid)

    @property
    def parent(self) -> Event | None:
        tree = self.trace.tree
        return tree.parent_event(self.uid) if tree is not None else None

    @property
    def children(self) -> list[Event] | None:
        tree = self.trace.tree
        return tree.children_events(self.uid) if tree is not None else None

    @property
    def gpu_events(self) -> Sequence[Event] | None:
        """GPU events linked under this node (its launches' and its descendants'), in launch order."""
        tree = self.trace.tree
        return tree.gpu_events_of(self.uid) if tree is not None else None

    @property
    def linked(self) -> bool:
        """A GPU event reached from a launch (TraceLens's "tree" flag)."""
        tree = self.trace.tree
        return tree is not None and tree.is_linked(self.uid)

    def to_json(self) -> dict:
        """The event as a Chrome-trace object again (for split traces that Perfetto can open)."""
        return self.trace.event_json(self.uid)

    def __repr__(self) -> str:
        return f"Event(uid={self.uid}, cat={self.cat!r}, name={self.name[:60]!r}, ts={self.ts}, dur={self.dur})"


class EventList(Sequence):
    """``trace.events``: the events in uid order, as views made on access."""

    __slots__ = ("trace",)

    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def __len__(self) -> int:
        return len(self.trace.kind)

    def __getitem__(self, i: Any) -> Any:
        n = len(self.trace.kind)
        if isinstance(i, slice):
            return [Event(self.trace, u) for u in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("event index out of range")
        return Event(self.trace, i)

    def __iter__(self) -> Iterator[Event]:
        t = self.trace
        return (Event(t, u) for u in range(len(t.kind)))


class EventWriter:
    """Events of a trace as JSON text, exactly as ``json.dumps([trace.event_json(u) for u in
    uids], separators=(",", ":"))[1:-1]`` writes them, at several times its speed: the text of
    every name, pid/tid value and (ph, cat) pair is made once, an event's args once per distinct
    args (msgspec where it writes what json writes), and an event is one string concatenation.
    Events with an odd value (an int time stamp, a string id...) go through ``event_json``."""

    def __init__(self, trace: Trace) -> None:
        self.t = trace
        self.names = [_compact(n) for n in trace.names]
        self.ids = [_compact(v) for v in trace.ids]
        self.kinds = []
        for ph, cat in trace.kinds:
            head = '{"ph":' + _compact(ph) + ',"name":'
            tail = (',"cat":' + _compact(cat)) if cat else ""
            mode = 0 if ph == "M" else 2 if ph == "X" else 3 if ph == "s" else 4 if ph == "f" else 1
            self.kinds.append((head, tail, mode))
        self.modes = bytes(mode for _, _, mode in self.kinds)
        self.heads: dict[int, str] = {}  # (kind, name, pid, tid) as one int -> the event's text up to its time
        pool = trace.args_pool
        flags = trace._pool_compact
        if len(flags) < len(pool):
            flags.extend(bytes(len(pool) - len(flags)))

    def args_text(self, i: int) -> str | None:
        """The compact JSON of pool entry ``i``'s decoded args (None: args that are not an object)."""
        t = self.t
        raw = t.args_pool[i]
        if not t._pool_compact[i]:
            decoded = t._args_decoded[i]
            if decoded is _UNDECODED:
                decoded = raw if type(raw) is dict else _decode_args(raw)
            raw = t.args_pool[i] = _compact(decoded)
            t._pool_compact[i] = 1
        return None if raw == "null" else raw

    def _compact_pool(self, indices: Sequence[int]) -> None:
        """Put the compact JSON of these pool entries in the pool, profiler texts in bulk: one
        msgspec call decodes them all, one checks what msgspec wrote (each alone cost 5x)."""
        t = self.t
        pool, done, decoded = t.args_pool, t._pool_compact, t._args_decoded
        todo = [i for i in dict.fromkeys(indices) if i >= 0 and not done[i]]
        raw = [i for i in todo if type(pool[i]) is bytes and decoded[i] is _UNDECODED]
        if raw and _ENCODE is not None:
            blob = b",".join([pool[i] for i in raw])
            try:
                dicts = _json_loads(b"[" + blob + b"]")
            except (ValueError, RecursionError):
                dicts = None
            if dicts is not None and all(type(d) is dict for d in dicts):
                # (Python frames' args hold none of the keys args_of leaves out: no look per dict.)
                if b"\\u" in blob or any(b'"%s"' % k.encode() in blob for k in _NOT_ARGS):
                    for d in dicts:
                        if not _NOT_ARGS_SET.isdisjoint(d):
                            for k in _NOT_ARGS:
                                d.pop(k, None)
                texts = list(map(_ENCODE, dicts))
                if _msgspec_differs(b"".join(texts)):
                    texts = list(map(_compact, dicts))
                else:
                    texts = [x.decode() for x in texts]
                for i, x in zip(raw, texts):
                    pool[i] = x
                    done[i] = 1
        for i in todo:
            if not done[i]:
                self.args_text(i)

    def text(self, uids: Sequence[int]) -> str:
        t = self.t
        if any(map(t.num_flags.__getitem__, uids)):  # an odd value: those events as event_json writes them
            return ",".join(self.text([u]) if not t.num_flags[u] else _compact(t.event_json(u)) for u in uids)
        pool = t.args_pool
        pooled_list = list(map(t.args.__getitem__, uids))
        self._compact_pool(pooled_list)
        # '{"ph":..,"name":..,"pid":..,"tid":..[,"cat":..]' once per (kind, name, pid, tid): the
        # key of each event made by numpy from the columns, its text looked up in a dict.
        at = np.fromiter(uids, dtype=np.int64, count=len(uids))
        kind = np.frombuffer(t.kind, dtype=np.uint32)[at].astype(np.int64)
        n_names, n_ids = max(len(t.names), 1), max(len(t.ids), 1)
        keys = ((kind * n_names + np.frombuffer(t.name, dtype=np.uint32)[at]) * n_ids
                + np.frombuffer(t.pid, dtype=np.uint32)[at]) * n_ids + np.frombuffer(t.tid, dtype=np.uint32)[at]
        keys = keys.tolist()
        heads = list(map(self.heads.get, keys))
        if None in heads:
            for i, head in enumerate(heads):
                if head is None:
                    heads[i] = self._head(keys[i], n_names, n_ids)
        modes = np.frombuffer(self.modes, dtype=np.uint8)[kind].tolist()
        columns = (heads, modes, _float_texts(list(map(t.ts.__getitem__, uids))),
                   _float_texts(list(map(t.dur.__getitem__, uids))), map(t.flow.__getitem__, uids),
                   map(t.ext.__getitem__, uids), map(t.corr.__getitem__, uids), pooled_list)
        out = []
        add = out.append
        for s, mode, ts, dur, flow, ext, corr, pooled in zip(*columns):
            a = pool[pooled] if pooled >= 0 else None
            if mode == 2:
                if a is not None and ext == NO_ID and corr == NO_ID and a != "null":  # a Python frame, an annotation
                    add(f'{s},"ts":{ts},"dur":{dur},"args":{a}}}')
                    continue
                s = f'{s},"ts":{ts},"dur":{dur}'
            elif mode == 1:
                s = f'{s},"ts":{ts}'
            elif mode >= 3:
                s = f'{s},"ts":{ts},"id":{flow if flow != NO_ID else "null"}'
                if mode == 4:
                    s += ',"bp":"e"'
            if a == "null":
                a = None
            if ext != NO_ID or corr != NO_ID:
                ids_text = (f'"External id":{ext},"correlation":{corr}' if ext != NO_ID and corr != NO_ID
                            else f'"External id":{ext}' if ext != NO_ID else f'"correlation":{corr}')
                add(f'{s},"args":{{{ids_text},{a[1:]}}}' if a is not None and a != "{}" else f'{s},"args":{{{ids_text}}}}}')
            elif a is not None:
                add(f'{s},"args":{a}}}')
            else:
                add(s + "}")
        return ",".join(out)

    def _head(self, key: int, n_names: int, n_ids: int) -> str:
        rest, tid = divmod(key, n_ids)
        rest, pid = divmod(rest, n_ids)
        kind, name = divmod(rest, n_names)
        head, tail, _ = self.kinds[kind]
        text = self.heads[key] = f'{head}{self.names[name]},"pid":{self.ids[pid]},"tid":{self.ids[tid]}{tail}'
        return text


_JSON_TEXT = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
# What msgspec writes otherwise than json: exponents (1e16 / 1e+16), small numbers (0.00001 /
# 1e-05), NaN and infinities (null / NaN), DEL and non-ASCII (raw / escaped). A text with any of
# these (a false hit inside a string only costs time) is written by json instead. (Plain ``in``
# tests on the text with its digits made 0: a regular expression cost 10 times as much.)
_DIGITS_TO_0 = bytes.maketrans(b"123456789", b"000000000")


def _msgspec_differs(text: bytes) -> bool:
    if not text.isascii() or b"null" in text or b"\x7f" in text:
        return True
    zeros = text.translate(_DIGITS_TO_0)
    return b"0e" in zeros or b"0E" in zeros or b"0.0000" in zeros


def _float_texts(values: list[float]) -> list[str]:
    """``repr`` of each float (as json writes a float), msgspec's text where it is the same:
    repr costs about 0.6 us a float, msgspec 0.03."""
    if _ENCODE is not None and values:
        text = _ENCODE(values).decode()  # digits, '.', '-' and ',' unless an exponent, a NaN (null) or 0.0000x
        if "e" not in text and "n" not in text and "0.0000" not in text:
            return text[1:-1].split(",")
    return list(map(repr, values))


def _compact(value: Any) -> str:
    """``value`` as ``json.dumps(value, separators=(",", ":"))`` writes it."""
    if _ENCODE is not None:
        try:
            text = _ENCODE(value)
        except (TypeError, ValueError, OverflowError):
            return _JSON_TEXT(value)
        if not _msgspec_differs(text):
            return text.decode()
    return _JSON_TEXT(value)


# ------------------------------------------------------------------------------ appending rows

class _Appender:
    """Appends events to a Trace's columns, interning kinds, names and pid/tid values."""

    def __init__(self, trace: Trace) -> None:
        self.t = trace
        self.kind_pairs: dict[tuple[str, str], int] = {}  # (ph, cat) -> kind
        self.name_index: dict[str, int] = {}
        self.id_index: dict[Any, int] = {}
        self.args_index: dict[Any, int] = {}  # args text (or (cat, repr) on the slow path) -> pool index

    def kind(self, ph: str, cat: str) -> int:
        k = self.kind_pairs.get((ph, cat))
        if k is None:
            k = self.kind_pairs[(ph, cat)] = len(self.t.kinds)
            self.t.kinds.append((ph, cat))
        return k

    def name(self, name: Any) -> int:
        if type(name) is not str:
            name = "" if name is None else str(name)
        i = self.name_index.get(name)
        if i is None:
            i = self.name_index[name] = len(self.t.names)
            self.t.names.append(name)
        return i

    def ident(self, v: Any) -> int:
        # ints and strs are their own keys; anything else (rare) by type and repr, so that 1, 1.0
        # and True stay three values.
        key = v if type(v) is int or type(v) is str else (type(v).__name__, repr(v))
        i = self.id_index.get(key)
        if i is None:
            i = self.id_index[key] = len(self.t.ids)
            self.t.ids.append(v)
        return i

    def pooled(self, key: Any, value: Any) -> int:
        i = self.args_index.get(key)
        if i is None:
            i = self.args_index[key] = len(self.t.args_pool)
            self.t.args_pool.append(value)  # (its _args_decoded and _pool_compact entries: at the end)
        return i

    def add(self, ph: str, cat: str, name: Any, pid: Any, tid: Any, ts: Any, dur: Any, corr: Any, ext: Any,
            flow: Any, args: int) -> None:
        t = self.t
        uid = len(t.kind)
        flags = 0
        if type(ts) is not float:
            ts, flags = self._number(uid, "ts", ts, flags, TS_INT)
        if type(dur) is not float:
            dur, flags = self._number(uid, "dur", dur, flags, DUR_INT)
        if not (type(corr) is int and ODD_ID < corr < 1 << 63):
            corr, flags = self._odd_id(uid, "corr", corr, flags)
        if not (type(ext) is int and ODD_ID < ext < 1 << 63):
            ext, flags = self._odd_id(uid, "ext", ext, flags)
        if not (type(flow) is int and ODD_ID < flow < 1 << 63):
            flow, flags = self._odd_id(uid, "flow", flow, flags)
        t.kind.append(self.kind(ph, cat))
        t.name.append(self.name(name))
        t.pid.append(self.ident(pid))
        t.tid.append(self.ident(tid))
        t.ts.append(ts)
        t.dur.append(dur)
        t.num_flags.append(flags)
        t.corr.append(corr)
        t.ext.append(ext)
        t.flow.append(flow)
        t.args.append(args)

    def _number(self, uid: int, column: str, v: Any, flags: int, int_flag: int) -> tuple[float, int]:
        # Numbers stay as the JSON wrote them: an int is flagged, a huge int kept exactly aside.
        if type(v) is int:
            if -_MAX_EXACT <= v <= _MAX_EXACT:
                return float(v), flags | int_flag
            self.t.odd[(column, uid)] = v
            try:
                return float(v), flags | HAS_ODD
            except OverflowError:  # beyond any float: refused with the other absurd times
                return (math.inf if v > 0 else -math.inf), flags | HAS_ODD
        return (float(v) if v is not None else 0.0), flags

    def _odd_id(self, uid: int, column: str, v: Any, flags: int) -> tuple[int, int]:
        if v is None:
            return NO_ID, flags
        self.t.odd[(column, uid)] = v
        return ODD_ID, flags | HAS_ODD


def _add_window(app: _Appender, items: list) -> None:
    """Append the events msgspec decoded from one window: the hot loop of the loader.

    One loop reads each event's ids from its args text and pools the text; every other column is
    built a window at a time (a comprehension, then one C-level ``fromlist``), which is what makes
    this faster than appending event by event. A window with an unusual number (an int time
    stamp, a string id...) goes event by event through ``_Appender.add``."""
    if not items:
        return
    corrs, exts, args = _window_args(app, items)
    # The fields as columns: a comprehension per field (twice as fast as attrgetter's tuples
    # transposed by zip); C-level maps where a column is looked up in a table.
    phs, cats, raw_names = [r.ph for r in items], [r.cat for r in items], [r.name for r in items]
    pids, tids, flows = [r.pid for r in items], [r.tid for r in items], [r.id for r in items]
    ts, dur = [r.ts for r in items], [r.dur for r in items]
    if None in dur:
        dur = [0.0 if d is None else d for d in dur]
    if not (_all_floats(ts) and _all_floats(dur) and _plain_ids(corrs) and _plain_ids(exts) and _plain_ids(flows)):
        for r, corr, ext, pooled in zip(items, corrs, exts, args):
            app.add(r.ph, r.cat, r.name, r.pid, r.tid, r.ts, r.dur, corr, ext, r.id, pooled)
        return
    t = app.t
    kinds = list(map(app.kind_pairs.get, zip(phs, cats)))
    if None in kinds:  # a first sighting
        kinds = [app.kind(ph, cat) for ph, cat in zip(phs, cats)]
    names = [None]
    if set(map(type, raw_names)) == {str}:
        names = list(map(app.name_index.get, raw_names))
    if None in names:  # a first sighting, or a name that is not a string
        names = [app.name(n) for n in raw_names]
    t.kind.fromlist(kinds)
    t.name.fromlist(names)
    t.pid.fromlist(_id_indices(app, pids))
    t.tid.fromlist(_id_indices(app, tids))
    t.ts.fromlist(ts)
    t.dur.fromlist(dur)
    t.num_flags.frombytes(bytes(len(items)))
    no_id = _NO_ID_FOR_NONE.get  # get(v, v): NO_ID for None, v itself otherwise
    t.corr.fromlist(list(map(no_id, corrs, corrs)))
    t.ext.fromlist(list(map(no_id, exts, exts)))
    t.flow.fromlist(list(map(no_id, flows, flows)))
    t.args.fromlist(args)


_NO_ID_FOR_NONE = {None: NO_ID}


def _window_args(app: _Appender, items: list) -> tuple[list, list, list[int]]:
    """(correlation, External id, pooled args index) of each event: its ids are read from its args
    text, then zeroed in it, so that an op's args, which repeat every step, are kept once. The ids
    of the whole window come from one msgspec call; a window with args that are not objects (or
    nest too deep) is read event by event (``_window_args_each``), which also names the error."""
    raws = [bytes(r.args) for r in items]
    try:
        ids_list = _IDS_LIST.decode(b"[" + b",".join(raws) + b"]")
    except (*_FAST_ERRORS, RecursionError):
        return _window_args_each(app, items)
    corrs = [None if x is None else x.corr for x in ids_list]
    exts = [None if x is None else x.ext for x in ids_list]
    args = [-1] * len(items)
    keep_args = _KEEP_ALL_ARGS
    args_index = app.args_index
    pool = app.t.args_pool
    # Python frames (most events of a trace with stacks): their args hold their own ids, so never
    # repeat and are pooled as they are, in one pass; the others are looked up one by one.
    cats = [r.cat for r in items]
    frames = [n for n, c, ids, raw in zip(range(len(items)), cats, ids_list, raws)
              if c == "python_function" and ids is not None and raw != b"{}"]
    if frames:
        texts = [raws[n] for n in frames]
        if max(map(len, texts)) > 2 * MAX_JSON_DEPTH and any(map(_too_deep, texts)):  # (needs that many brackets)
            raise ValueError(f"args nest deeper than {MAX_JSON_DEPTH} levels, the most a trace event may")
        base = len(pool)
        pool.extend(texts)
        for j, n in enumerate(frames, base):
            args[n] = j
    for n in (range(len(items)) if not frames else [n for n, c in enumerate(cats) if c != "python_function"]):
        r, c, raw, ids = items[n], cats[n], raws[n], ids_list[n]
        if ids is None or c == "python_function" or (c not in keep_args and r.ph != "M") or raw == b"{}":
            continue
        ext, corr, idx = ids.ext, ids.corr, ids.idx
        # (Plain replaces of the known values: several times cheaper than a regex.)
        if type(ext) is int:
            raw = raw.replace(b'"External id": %d' % ext, b'"External id": 0', 1)
        if type(corr) is int:
            raw = raw.replace(b'"correlation": %d' % corr, b'"correlation": 0', 1)
        if type(idx) is int:
            raw = raw.replace(b'"Ev Idx": %d' % idx, b'"Ev Idx": 0', 1)
        pooled = args_index.get(raw)
        if pooled is None:  # a text not seen before: decoded later, so checked now
            if len(raw) > 2 * MAX_JSON_DEPTH and _too_deep(raw):
                raise ValueError(f"args nest deeper than {MAX_JSON_DEPTH} levels, the most a trace event may")
            pooled = args_index[raw] = len(pool)
            pool.append(raw)
        args[n] = pooled
    return corrs, exts, args


def _window_args_each(app: _Appender, items: list) -> tuple[list, list, list[int]]:
    """``_window_args`` one event at a time."""
    corrs, exts, args = [], [], []
    decode_ids = _IDS_TYPED.decode
    keep_args = _KEEP_ALL_ARGS
    args_index = app.args_index
    for r in items:
        raw = bytes(r.args)
        corr = ext = None
        pooled = -1
        if raw[:1] == b"{" and raw != b"{}":  # args that are not an object read as None
            try:
                ids = decode_ids(raw)
            except RecursionError:
                raise ValueError(f"args nest deeper than {MAX_JSON_DEPTH} levels, the most a trace event may") from None
            corr, ext = ids.corr, ids.ext
            if r.cat in keep_args or r.ph == "M":
                # (Plain replaces of the known values: several times cheaper than a regex.)
                if type(ext) is int:
                    raw = raw.replace(b'"External id": %d' % ext, b'"External id": 0', 1)
                if type(corr) is int:
                    raw = raw.replace(b'"correlation": %d' % corr, b'"correlation": 0', 1)
                if type(ids.idx) is int:
                    raw = raw.replace(b'"Ev Idx": %d' % ids.idx, b'"Ev Idx": 0', 1)
                pooled = args_index.get(raw, -1)
                if pooled < 0:  # a text not seen before: decoded later, so checked now
                    if _too_deep(raw):
                        raise ValueError(f"args nest deeper than {MAX_JSON_DEPTH} levels, the most a trace event may")
                    pooled = app.pooled(raw, raw)
        corrs.append(corr)
        exts.append(ext)
        args.append(pooled)
    return corrs, exts, args


def _all_floats(values: Sequence) -> bool:
    return set(map(type, values)) <= {float}


def _plain_ids(values: Sequence) -> bool:
    """Ids that the int64 columns hold as they are (None: no id)."""
    ids = [v for v in values if v is not None]
    return not ids or (set(map(type, ids)) == {int} and ODD_ID < min(ids) and max(ids) < _MAX_ID)


def _id_indices(app: _Appender, values: Sequence) -> list[int]:
    """Indices of pid or tid values in the trace's table of distinct ids."""
    if set(map(type, values)) <= {int, str}:  # ints and strs are their own dict keys
        found = list(map(app.id_index.get, values))
        if None not in found:
            return found
    return [app.ident(v) for v in values]


def _add_dict(app: _Appender, raw: Any) -> None:
    """One event decoded by json (the slow path)."""
    if type(raw) is not dict:
        raise TypeError(f"expected an object, got {type(raw).__name__}")
    get = raw.get
    cat = get("cat") or ""
    ph = get("ph") or ""
    args = get("args")
    corr = ext = None
    pooled = -1
    if type(args) is dict:
        corr = args.pop("correlation", None)
        ext = args.pop("External id", None)
        if cat in _KEEP_ALL_ARGS or ph == "M":
            for k in _DROP_ARGS:
                args.pop(k, None)
            # Identical args (the same op and shapes every step) share one dict.
            pooled = app.pooled((cat, repr(args)), args)
    app.add(ph, cat, get("name"), get("pid"), get("tid"), get("ts"), get("dur"), corr, ext, get("id"), pooled)


# ------------------------------------------------------------------------------ reading the file

def _last_event_end(buf: str, start: int) -> int:
    """Index of the '}' that closes the last complete event in buf[start:], found as '}' ',' '{'
    with only whitespace between; -1 if none. A false hit inside a string only makes the chunk
    fail to decode, and that chunk then goes the slow way."""
    end = len(buf)
    while True:
        j = buf.rfind("{", start, end)
        if j <= start:
            return -1
        k = j - 1
        while k > start and buf[k] in " \t\r\n":
            k -= 1
        if buf[k] == ",":
            k -= 1
            while k > start and buf[k] in " \t\r\n":
                k -= 1
            if buf[k] == "}":
                return k
        end = j


def _last_brace(buf: str, start: int) -> int:
    """Index of the last '}' in buf[start:] before only whitespace and commas; -1 if none."""
    k = len(buf.rstrip(" \t\r\n,")) - 1
    return k if k > start and buf[k] == "}" else -1


def _open_text(path: Path) -> tuple[BinaryIO, Any]:
    from engine.safeio import NotRegularFile, open_regular
    try:
        fh = open_regular(path)  # a FIFO or a device is refused, never waited on or read forever
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except NotRegularFile as exc:
        raise TraceError(f"{path}: not a regular file ({exc.kind}); a trace must be a file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        fh = _Gunzip(fh)  # type: ignore[assignment]
    return fh, codecs.getincrementaldecoder("utf-8")(errors="strict")


class _Gunzip:
    """A gzip file's text (every member, in order), inflated by zlib a large block at a time
    (GzipFile's reads take 8 kB of input each: 2-3 times the time). Trailing zeros after the last
    member are skipped, as GzipFile skips them; a stream cut short raises EOFError, bad data
    OSError."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.inflate = zlib.decompressobj(31)  # 31: a gzip header and trailer (its CRC and size checked)
        self.started = False
        self.input = b""

    def read(self, size: int) -> bytes:
        parts, n = [], 0
        while n < size:
            if not self.input:
                self.input = self.raw.read(_GZ_INPUT)
                if not self.input:
                    if self.started and not self.inflate.eof:
                        raise EOFError("compressed file ended before the end-of-stream marker was reached")
                    break
            if self.inflate.eof:  # another member follows, or zeros
                if not self.input.strip(b"\x00"):
                    self.input = b""
                    continue
                self.inflate, self.started = zlib.decompressobj(31), False
            try:
                out = self.inflate.decompress(self.input, size - n)
            except zlib.error as exc:
                raise OSError(f"not a valid gzip stream ({exc})") from None
            self.started = True
            self.input = self.inflate.unused_data if self.inflate.eof else self.inflate.unconsumed_tail
            if out:
                parts.append(out)
                n += len(out)
        return b"".join(parts)

    def close(self) -> None:
        self.raw.close()


_GZ_INPUT = 1 << 18  # compressed bytes read at a time


class _Reader:
    """A growing text window over the (decompressed) file."""

    def __init__(self, path: Path, cancel: Any = None, *, resume: tuple[BinaryIO, bytes, int] | None = None) -> None:
        """``resume``: (an open text stream, the bytes already read from it to start with, their
        offset in the text): the child's reader, from its first event on."""
        self.path = path
        if resume is None:
            self.fh, self.decoder = _open_text(path)
            first, self.byte_offset = b"", 0
        else:
            self.fh, first, self.byte_offset = resume
            self.decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self.gz = isinstance(self.fh, _Gunzip)
        self.buf = self.decoder.decode(first)
        self.pos = 0  # position in buf
        self.offset = 0  # characters dropped before buf[0]
        # (byte_offset: bytes of the decompressed text dropped before buf[0])
        self.eof = False
        self.cancel = cancel
        self._fills = 0
        # A large trace's events from the byte ``tail.split_at`` on are loaded by a forked child
        # (``_Tail``): this reader then stops at the event boundary the child began at.
        self.tail: _Tail | None = None
        self.in_events = False  # inside the traceEvents list (the only place a split may fall)
        self.raw_pos = 0  # bytes of the (decompressed) text read so far
        self.limit: int | None = None  # where this reader stops: the child's first event
        self.at_limit = False

    def fill(self, size: int = _CHUNK) -> bool:
        if self.eof:
            return False
        self._fills += 1
        if self.cancel is not None and self._fills % _CANCEL_EVERY == 0 and self.cancel.cancelled:
            raise TraceCancelled(f"{self.path}: loading cancelled ({self.cancel.reason or 'cancelled'})")
        if self.tail is not None and self.limit is None and self.raw_pos + size + _CHUNK >= self.tail.split_at:
            self._meet_tail()
        try:
            raw = self.fh.read(size)
        except (OSError, EOFError) as exc:  # bad gzip stream
            raise TraceError(f"{self.path}: cannot read after character {self.offset + len(self.buf)}: {exc}") from None
        if self.limit is not None and self.raw_pos + len(raw) >= self.limit:
            raw = raw[:self.limit - self.raw_pos]  # (what was read past it is the child's)
            self.at_limit = True
        self.raw_pos += len(raw)
        try:
            text = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{self.path}: not UTF-8 text near character {self.offset + len(self.buf)} "
                             f"(byte {self.byte_at(len(self.buf)) + exc.start}): {exc.reason}") from None
        if not raw or (self.at_limit and self.raw_pos >= self.limit):  # type: ignore[operator]
            self.eof = True
        # Drop what was consumed so the window stays one chunk or so long.
        if self.pos:
            self.byte_offset += len(self.buf[:self.pos].encode("utf-8", "surrogatepass"))
        self.buf = self.buf[self.pos:] + text
        self.offset += self.pos
        self.pos = 0
        return bool(text) or not self.eof

    def _meet_tail(self) -> None:
        """Near the child's start: stop at its first event, or (outside the events list, or where
        the child found no place to begin) go on alone."""
        assert self.tail is not None
        boundary = self.tail.boundary() if self.in_events else None
        if boundary is None or boundary < self.raw_pos:
            self.tail.stop()
            self.tail = None
        else:
            self.limit = boundary

    def close(self) -> None:
        self.fh.close()

    def byte_at(self, pos: int) -> int:
        """The byte offset (in the decompressed text) of ``buf[pos]``."""
        return self.byte_offset + len(self.buf[:pos].encode("utf-8", "surrogatepass"))

    def where(self, pos: int) -> str:
        """``character N (byte M)`` of ``buf[pos]``, as errors name a place."""
        return f"character {self.offset + pos} (byte {self.byte_at(pos)}{' of the decompressed text' if self.gz else ''})"

    def skip_ws(self, extra: str = "") -> str:
        """Skip whitespace (and commas when ``extra`` == ','); return the next char or '' at EOF."""
        while True:
            m = (_WS if extra else _SPACE).match(self.buf, self.pos)
            self.pos = m.end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def value(self, what: str) -> Any:
        """The next JSON value. A parse error at the window's end may be a value the window cut:
        the window then doubles, up to ``MAX_VALUE_CHARS``; an error anywhere else is one at once."""
        self.skip_ws()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                at_end = exc.pos >= len(self.buf.rstrip()) - 64 or exc.msg.startswith("Unterminated")
                if at_end and not self.eof:  # most likely the value runs past the window: read more, retry
                    if len(self.buf) - self.pos > MAX_VALUE_CHARS:
                        raise TraceError(f"{self.path}: {what} at {self.where(self.pos)} runs on past "
                                         f"{MAX_VALUE_CHARS >> 20} MiB: not a trace event (junk after the trace?)") from None
                    self.fill(max(_CHUNK, len(self.buf) - self.pos))
                    continue
                truncated = exc.pos >= len(self.buf.rstrip()) - 1 or exc.msg.startswith("Unterminated")
                raise TraceError(f"{self.path}: {'truncated' if truncated else 'malformed'} JSON in {what} "
                                 f"at {self.where(exc.pos)}: {exc.msg}") from None
            except RecursionError:
                raise TraceError(f"{self.path}: {what} at {self.where(self.pos)} nests deeper than "
                                 f"{MAX_JSON_DEPTH} levels, the most a trace event may") from None
            except ValueError as exc:  # an integer of thousands of digits
                raise TraceError(f"{self.path}: malformed JSON in {what} at {self.where(self.pos)}: {exc}") from None
            if isinstance(obj, (dict, list)) and _too_deep(self.buf[self.pos:end]):
                raise TraceError(f"{self.path}: {what} at {self.where(self.pos)} nests deeper than "
                                 f"{MAX_JSON_DEPTH} levels, the most a trace event may")
            self.pos = end
            return obj


def _read_events(reader: _Reader, app: _Appender) -> None:
    """The hot loop: msgspec decodes a window's complete events in one call; refills only at
    window ends; event by event (json) where msgspec fails."""
    slow_until = 0  # absolute character offset before which the fast path is not retried
    ws_match = _WS.match
    decode = _DECODER.raw_decode
    trace = app.t
    while True:
        buf, pos = reader.buf, reader.pos
        pos = ws_match(buf, pos).end()
        if pos >= len(buf):
            reader.pos = pos
            if not reader.fill():
                if reader.at_limit:  # the child's events begin here
                    return
                raise TraceError(f"{reader.path}: truncated: the traceEvents list ends without ']' "
                                 f"after event {len(trace.kind) - 1}")
            continue
        if buf[pos] == "]":
            reader.pos = pos + 1
            return
        fast = _FAST is not None and reader.offset + pos >= slow_until
        if fast and len(buf) - pos <= _FAST_MIN and not reader.eof:
            # The window's tail: read on rather than try (and fail) to decode a cut event.
            reader.pos = pos
            reader.fill()
            continue
        if fast and (len(buf) - pos > _FAST_MIN or reader.at_limit):
            # (At the child's start every event left is whole: decoded as they would be mid-file.)
            j = _last_event_end(buf, pos) if not reader.at_limit else _last_brace(buf, pos)
            items = None
            for _ in range(2):  # a false boundary (inside a string) gets one earlier try
                if j <= pos:
                    break
                try:
                    items = _FAST.decode("[" + buf[pos:j + 1] + "]")
                    break
                except (*_FAST_ERRORS, RecursionError):
                    j = _last_event_end(buf[:j], pos)
            if items is None:
                # A bad event or an odd string: go event by event through this window.
                slow_until = reader.offset + len(buf)
            else:
                try:
                    _add_window(app, items)
                except (TypeError, ValueError, ArithmeticError) as exc:
                    raise TraceError(f"{reader.path}: event {len(trace.kind)}: {exc}") from None
                reader.pos = j + 1
                continue
        try:
            raw, end = decode(buf, pos)
            if _too_deep(buf[pos:end]):
                raise RecursionError
        except (ValueError, RecursionError):  # JSONDecodeError, a number too long, too deep
            reader.pos = pos
            raw = reader.value(f"event {len(trace.kind)}")  # refills, or raises with the offset
            end = reader.pos
        reader.pos = end
        try:
            _add_dict(app, raw)
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise TraceError(f"{reader.path}: event {len(trace.kind)} at {reader.where(pos)}: {exc}") from None


def load_trace(path: Path | str, cancel: Any = None) -> Trace:
    """Load a trace. The cyclic GC is paused while loading: the msgspec windows make many small
    objects that never form cycles, and collections would only cost time. ``cancel`` (a
    ``CancelToken``) is looked at every few windows: ``TraceCancelled`` once it is set."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _load(Path(path), cancel)
    finally:
        if was_enabled:
            gc.enable()


def _load(path: Path, cancel: Any = None) -> Trace:
    tail = _Tail.start(path)
    try:
        trace = _load_with(path, cancel, tail)
    except _Restart:  # the split fell where no event begins (a string that looks like one): alone
        trace = _load_with(path, cancel, None)
    finally:
        if tail is not None:
            tail.stop()
    n = len(trace.args_pool)  # the pool's per-entry state, made once its size is known
    trace._args_decoded = [_UNDECODED] * n
    trace._pool_compact = bytearray(n)
    _check_times(trace)
    trace._read_names()
    return trace


def _load_with(path: Path, cancel: Any, tail: _Tail | None) -> Trace:
    reader = _Reader(path, cancel)
    reader.tail = tail
    try:
        return _read_trace(path, reader)
    except TraceError:
        if reader.at_limit:  # read to the child's start and failed there: not an event boundary
            raise _Restart() from None
        raise
    finally:
        reader.close()


def _read_trace(path: Path, reader: _Reader) -> Trace:
    trace = Trace(path)
    app = _Appender(trace)
    c = reader.skip_ws()
    if c == "[":
        reader.pos += 1
        _events_list(reader, app)
    elif c == "{":
        reader.pos += 1
        if not _object_keys(path, reader, app):
            raise TraceError(f"{path}: no traceEvents list (is this a torch-profiler trace?)")
    elif c == "":
        raise TraceError(f"{path}: empty file")
    else:
        raise TraceError(f"{path}: not a JSON trace (starts with {c!r}): a trace is a JSON object or a list of events")
    return trace


def _object_keys(path: Path, reader: _Reader, app: _Appender, *, after_events: bool = False) -> bool:
    """The keys of the top-level object to its end: metadata, and the traceEvents list (True once
    read). ``after_events``: the keys after the list (the child's part), where a second list is an
    error (one process then reads the file)."""
    seen_events = after_events
    while True:
        c = reader.skip_ws(",")
        if c == "}":
            return seen_events
        if c == "":
            raise TraceError(f"{path}: truncated: the top-level object is not closed")
        key = reader.value("a top-level key")
        if not isinstance(key, str) or reader.skip_ws() != ":":
            raise TraceError(f"{path}: malformed top level at character {reader.offset + reader.pos}")
        reader.pos += 1
        if key == "traceEvents":
            if after_events:
                raise TraceError(f"{path}: a second traceEvents list")
            if reader.skip_ws() != "[":
                raise TraceError(f"{path}: traceEvents is not a list")
            reader.pos += 1
            if _events_list(reader, app):
                return True  # the child read the rest of the file
            seen_events = True
        else:
            app.t.metadata[key] = reader.value(f"top-level key {key!r}")


def _events_list(reader: _Reader, app: _Appender) -> bool:
    """The traceEvents list; True when it stopped where the child's part begins and the child's
    events (and the rest of the file: its top-level keys after the list) were appended."""
    reader.in_events = True
    try:
        _read_events(reader, app)
    finally:
        reader.in_events = False
    if not reader.at_limit:
        return False
    assert reader.tail is not None
    part = reader.tail.result()
    if part is None:  # the child failed (an error further on, which this process then reports)
        raise _Restart()
    _append_part(app, part)
    return True


# ------------------------------------------------------------------------------ two processes

# A large trace is loaded by two processes: this one reads its events up to about ``_SPLIT_AT`` of
# the text, a forked child (decompressing the file from the start, without parsing, up to there)
# the rest; the child's columns come back pickled through a pipe and are appended with its tables
# mapped onto this process's. The result is the one a single process gets, table order included
# (the child's new names, ids and args follow this part's, in the order the child met them).
_PARALLEL_MIN = 48 << 20  # bytes of JSON text: below this, one process is as quick
_SPLIT_AT = 0.55  # the child also decompresses this process's part and sends its own back: it gets less
_EVENT_START = re.compile(rb"\}\s*,\s*\{")
_BOUNDARY_SEARCH = 16 << 20  # bytes looked through past the split point for an event boundary


class _Restart(Exception):
    """The two-process load could not join its parts: load again in one process."""


class _Tail:
    """The events from the first event boundary at or after byte ``split_at`` of the text to the
    end of the file, loaded by ``_load_tail`` in a forked child: its first message is that boundary
    (8 bytes; -1 when it found none it could decode from), its result the part (None: no part)."""

    def __init__(self, path: Path, split_at: int) -> None:
        self.split_at = split_at
        self.call = ForkedCall(lambda send_first: _load_tail(path, split_at, send_first),
                               "the trace's second part", first_message=True)
        self._boundary: int | None | object = _UNDECODED

    @classmethod
    def start(cls, path: Path) -> _Tail | None:
        """The child for a trace large enough to be worth it, where fork is there and safe (no
        other threads, whose locks the child would get half-held); else None."""
        if _FAST is None or not hasattr(os, "fork") or threading.active_count() > 1 or _cpus() < 2:
            return None
        size = _text_size(path)
        if size is None or size < _PARALLEL_MIN:
            return None
        return cls(path, int(size * _SPLIT_AT))

    def boundary(self) -> int | None:
        if self._boundary is _UNDECODED:
            data = self.call.first()
            value = struct.unpack("<q", data)[0] if len(data) == 8 else -1
            self._boundary = value if value >= 0 else None
        return self._boundary  # type: ignore[return-value]

    def result(self) -> dict | None:
        try:
            return self.call.result()
        except Exception:  # the child failed (this process then reads the file alone and says why)
            return None

    def stop(self) -> None:
        self.call.stop()


def _cpus() -> int:
    """CPUs this process may run on (one CPU: the child would only take turns with this process)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _text_size(path: Path) -> int | None:
    """The size of the (decompressed) text: a gzip file's last member records it modulo 2**32
    (a larger text counts as about 10x its compressed size)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return os.fstat(fh.fileno()).st_size
            compressed = fh.seek(0, os.SEEK_END)
            if compressed < 8:
                return None
            fh.seek(-4, os.SEEK_END)
            size = struct.unpack("<I", fh.read(4))[0]
    except OSError:
        return None
    while size < compressed:
        size += 1 << 32
    return size if size < 40 * compressed else 10 * compressed


def _load_tail(path: Path, start: int, send_first: Callable[[bytes], None]) -> dict | None:
    """The child: find the first event boundary at or after ``start`` that msgspec decodes from,
    send it, load the events from there and the file's rest; the part (None without a boundary)."""
    fh, _ = _open_text(path)
    first = fh.read(1 << 16).lstrip()[:1]
    top_object = first == b"{"
    if isinstance(fh, _Gunzip):
        pos = 1 << 16
        while pos < start:  # decompress up to the split point (what this process skips)
            chunk = fh.read(min(1 << 20, start - pos))
            if not chunk:
                break
            pos += len(chunk)
    else:
        pos = fh.seek(start)
    window = b""
    boundary = -1
    while len(window) < _BOUNDARY_SEARCH:
        chunk = fh.read(1 << 20)
        if not chunk:
            break
        window += chunk
        boundary = _first_boundary(window)
        if boundary >= 0:
            break
    send_first(struct.pack("<q", pos + boundary if boundary >= 0 else -1))
    if boundary < 0:
        return None
    reader = _Reader(path, resume=(fh, window[boundary:], pos + boundary))
    trace = Trace(path)
    app = _Appender(trace)
    try:
        _read_events(reader, app)
        if top_object:  # the top-level keys after the list
            _object_keys(path, reader, app, after_events=True)
        elif reader.skip_ws():
            raise TraceError("text after the list")
    finally:
        reader.close()
    index = app.args_index
    keyed = [None] * len(trace.args_pool)
    for key, i in index.items():
        keyed[i] = key
    pool: Any = trace.args_pool
    if all(type(x) is bytes for x in pool):  # one blob and its offsets: pickled 10x faster than the list
        pool = (b"".join(pool), array("q", accumulate(map(len, pool), initial=0)))
    return {"columns": {c: getattr(trace, c) for c in _COLUMNS}, "kinds": trace.kinds, "names": trace.names,
            "ids": trace.ids, "args_pool": pool, "args_keys": keyed, "odd": trace.odd,
            "metadata": trace.metadata}


def _first_boundary(window: bytes) -> int:
    """The offset in ``window`` of the first ``{`` after ``},`` from which the events that follow
    decode (a false boundary inside a string mostly does not); -1 if none."""
    for m in _EVENT_START.finditer(window):
        at = m.end() - 1
        text = window[at:at + (1 << 18)].decode("utf-8", "ignore")
        end = _last_event_end(text, 0)
        if end <= 0:
            continue
        try:
            _FAST.decode("[" + text[:end + 1] + "]")
        except (*_FAST_ERRORS, RecursionError):
            continue
        return at
    return -1


_COLUMNS = ("kind", "name", "pid", "tid", "ts", "dur", "num_flags", "corr", "ext", "flow", "args")


def _append_part(app: _Appender, part: dict) -> None:
    """Append the child's events: its kinds, names, ids and args pool mapped onto this trace's
    tables (new entries appended in the child's order, as one process would have met them)."""
    t = app.t
    base = len(t.kind)
    kinds = np.array([app.kind(ph, cat) for ph, cat in part["kinds"]] or [0], dtype=np.int64)
    names = np.array([app.name(n) for n in part["names"]] or [0], dtype=np.int64)
    ids = np.array([app.ident(v) for v in part["ids"]] or [0], dtype=np.int64)
    # The part's entries are taken out of it as they are used, so that each is freed once
    # appended: the main process's peak is that of the loaded trace, not of it and a copy.
    pool_map = []
    pool = part.pop("args_pool")
    if type(pool) is tuple:
        blob, offsets = pool
        pool = [blob[a:b] for a, b in zip(offsets, offsets[1:])]
        del blob, offsets
    for key, value in zip(part.pop("args_keys"), pool):
        if key is None:  # a python_function frame's args: never shared
            pool_map.append(len(t.args_pool))
            t.args_pool.append(value)
        else:
            pool_map.append(app.pooled(key, value))
    del pool
    cols = part.pop("columns")
    for name, table in (("kind", kinds), ("name", names), ("pid", ids), ("tid", ids)):
        col, theirs = getattr(t, name), cols.pop(name)
        col.frombytes(table[np.frombuffer(theirs, dtype=theirs.typecode)].astype(col.typecode).tobytes())
    args = np.frombuffer(cols.pop("args"), dtype=t.args.typecode)
    mapped = np.array(pool_map or [0], dtype=np.int64)[np.maximum(args, 0)]
    t.args.frombytes(np.where(args >= 0, mapped, -1).astype(t.args.typecode).tobytes())
    del args, mapped
    for name in ("ts", "dur", "num_flags", "corr", "ext", "flow"):
        getattr(t, name).extend(cols.pop(name))
    for (column, uid), value in part["odd"].items():
        t.odd[(column, base + uid)] = value
    t.metadata.update(part["metadata"])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 32 else f"{text[:16]}...({len(text)} digits)"


def _check_times(trace: Trace) -> None:
    """Refuse a trace with events whose ts or dur are NaN, infinite, a negative duration, or past
    ``MAX_ABS_TS`` / ``MAX_DUR``: every sum, gap and percentage built on them would be garbage."""
    n = len(trace.kind)
    if not n:
        return
    try:
        import numpy as np
        ts = np.frombuffer(trace.ts, dtype=np.float64)
        dur = np.frombuffer(trace.dur, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(ts) <= MAX_ABS_TS) | ~((dur >= 0.0) & (dur <= MAX_DUR))
        count = int(bad.sum())
        first = int(bad.argmax()) if count else -1
    except ImportError:  # pragma: no cover - numpy is a dependency
        flags = [not (abs(t) <= MAX_ABS_TS and 0.0 <= d <= MAX_DUR) for t, d in zip(trace.ts, trace.dur)]
        count = sum(flags)
        first = flags.index(True) if count else -1
    if count:
        raise TraceError(f"{trace.path}: {count} event(s) with a time stamp or duration that is not finite or is absurd "
                         f"(NaN, inf, a negative dur, |ts| over {MAX_ABS_TS:g}, dur over {MAX_DUR:g}); the first is "
                         f"event {first} ({trace.name_of(first)[:80]!r}: ts={_short(trace.ts_of(first))}, "
                         f"dur={_short(trace.dur_of(first))}); "
                         "refused rather than analysed")


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB. Linux: VmHWM, which starts afresh at exec
    (ru_maxrss carries the forking parent's peak into a child)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024.0 if sys.platform != "darwin" else rss / (1024.0 * 1024.0)
