"""Streaming loader for torch-profiler (Kineto) Chrome traces: ``.json`` or ``.json.gz``, a
``{"traceEvents": [...]}`` object or a bare list.

The file is decompressed and decoded in windows of a few MB. Inside a window msgspec decodes
thousands of events per call into slotted ``Event``s; an event's args stay as their JSON text
(pooled: the same op signature every step is one copy) and are decoded on first use. Whatever
msgspec cannot take (a window boundary inside a string, a bad event) goes through
``json.raw_decode`` one event at a time, which also pins down errors: a truncated or malformed
file raises ``TraceError`` naming the file, the character offset and the index of the event.
"""

from __future__ import annotations

import codecs
import gc
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any, BinaryIO, Iterator

_CHUNK = 1 << 17  # characters decoded per read (small windows: less transient memory, as fast)
_WS = re.compile(r"[\s,]*")
_SPACE = re.compile(r"\s*")
_DECODER = json.JSONDecoder()

# args kept per category: the rest of an event's args are dropped at load time.
_KEEP_ALL_ARGS = {"cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "user_annotation", "python_function",
                  "cuda_runtime", "cuda_driver", "gpu_user_annotation"}


class TraceError(Exception):
    pass


# Kept in the Event's slots (ids) or dropped (per-event counters no analysis reads).
_NOT_ARGS = ("correlation", "External id", "Ev Idx", "Record function id")


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
    _FAST_ERRORS: tuple = (msgspec.DecodeError, msgspec.ValidationError)

    def _decode_args(raw: bytes) -> dict | None:
        args = msgspec.json.decode(raw)
        if type(args) is not dict:
            return None
        for k in _NOT_ARGS:
            args.pop(k, None)
        return args
except ImportError:  # pragma: no cover - msgspec is a dependency; keep working without it
    _FAST = None

    def _decode_args(raw: bytes) -> dict | None:
        args = json.loads(raw)
        if type(args) is not dict:
            return None
        for k in _NOT_ARGS:
            args.pop(k, None)
        return args


_FAST_MIN = 1 << 13  # characters: below this, one event at a time is as quick

_ARGS_CACHE: dict[bytes, dict | None] = {}


def _shared_args(raw: bytes) -> dict | None:
    """Decoded args, one dict per distinct text (the loader pooled the texts with their per-event
    ids zeroed, so this is one dict per distinct op signature); treat it as read-only."""
    hit = _ARGS_CACHE.get(raw, _ARGS_CACHE)
    if hit is _ARGS_CACHE:
        hit = _ARGS_CACHE[raw] = _decode_args(raw)
    return hit


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


def _from_raw(uid: int, r: Any, intern: dict, raw_pool: dict) -> Event:
    cat = r.cat
    cat = intern.setdefault(cat, cat)
    name = r.name
    if type(name) is not str:
        name = "" if name is None else str(name)
    if len(name) < 256:
        name = intern.setdefault(name, name)
    raw = bytes(r.args)
    corr = ext = None
    if raw != b"null" and raw != b"{}":
        if raw[:1] == b"{":
            ids = _IDS_TYPED.decode(raw)
            corr, ext = ids.corr, ids.ext
            # With its per-event ids zeroed, an op's args repeat every step: keep one shared copy.
            # (Plain replaces of the known values: several times cheaper than a regex.)
            for label, value in ((b'"External id": ', ext), (b'"correlation": ', corr), (b'"Ev Idx": ', ids.idx)):
                if type(value) is int:
                    raw = raw.replace(label + b"%d" % value, label + b"0", 1)
            raw = raw_pool.setdefault(raw, raw) if (cat in _KEEP_ALL_ARGS or r.ph == "M") else None
    else:
        raw = None
    return Event(uid, r.ph, cat, name, r.pid, r.tid, _num(r.ts), _num(r.dur), None, corr, ext, r.id, raw)


class Event:
    """One trace event. ``uid`` is its index in ``traceEvents`` (metadata included), as in TraceLens.

    ``args`` holds the event's args without ``correlation`` / ``External id`` (those are the
    ``corr`` / ``ext_id`` slots) and without per-event counters; identical args are one shared
    dict, so treat it as read-only."""

    __slots__ = ("uid", "ph", "cat", "name", "pid", "tid", "ts", "dur", "_args", "_raw_args", "corr", "ext_id",
                 "flow_id", "parent", "children", "gpu_events", "linked")

    def __init__(self, uid: int, ph: str, cat: str, name: str, pid: Any, tid: Any, ts: float, dur: float,
                 args: dict | None, corr: int | None, ext_id: int | None, flow_id: Any,
                 raw_args: bytes | None = None) -> None:
        self.uid = uid
        self.ph = ph
        self.cat = cat
        self.name = name
        self.pid = pid
        self.tid = tid
        self.ts = ts
        self.dur = dur
        self._args = args
        self._raw_args = raw_args  # the args' JSON text, decoded on first use (most never are)
        self.corr = corr
        self.ext_id = ext_id
        self.flow_id = flow_id
        self.parent: Event | None = None
        self.children: list[Event] | None = None
        self.gpu_events: list[Event] | None = None  # GPU events linked under this node
        self.linked = False  # GPU event reached from a launch (TraceLens "tree" flag)

    @property
    def args(self) -> dict | None:
        if self._args is None and self._raw_args is not None:
            self._args = _shared_args(self._raw_args)
            self._raw_args = None
        return self._args

    @property
    def t_end(self) -> float:
        return self.ts + self.dur

    def to_json(self) -> dict:
        """The event as a Chrome-trace object again (for split traces that Perfetto can open)."""
        out: dict = {"ph": self.ph, "name": self.name, "pid": self.pid, "tid": self.tid}
        if self.cat:
            out["cat"] = self.cat
        if self.ph != "M":
            out["ts"] = self.ts
        if self.ph == "X":
            out["dur"] = self.dur
        if self.ph in ("s", "f"):
            out["id"] = self.flow_id
            if self.ph == "f":
                out["bp"] = "e"
        ids = {k: v for k, v in (("External id", self.ext_id), ("correlation", self.corr)) if v is not None}
        if self.args is not None or ids:
            out["args"] = {**ids, **(self.args or {})}
        return out

    def __repr__(self) -> str:
        return f"Event(uid={self.uid}, cat={self.cat!r}, name={self.name[:60]!r}, ts={self.ts}, dur={self.dur})"


class Trace:
    def __init__(self, path: Path, events: list[Event], metadata: dict) -> None:
        self.path = path
        self.events = events
        self.metadata = metadata
        self.process_names: dict[Any, str] = {}
        self.process_labels: dict[Any, str] = {}
        self.thread_names: dict[tuple, str] = {}
        for e in events:
            if e.ph == "M" and e.args:
                if e.name == "process_name":
                    self.process_names[e.pid] = str(e.args.get("name", ""))
                elif e.name == "process_labels":
                    self.process_labels[e.pid] = str(e.args.get("labels", ""))
                elif e.name == "thread_name":
                    self.thread_names[(e.pid, e.tid)] = str(e.args.get("name", ""))

    def device_properties(self) -> list[dict]:
        props = self.metadata.get("deviceProperties") or []
        return props if isinstance(props, list) else []


def _open_text(path: Path) -> tuple[BinaryIO, Any]:
    fh = open(path, "rb")
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        fh = gzip.GzipFile(fileobj=fh)  # type: ignore[assignment]
    return fh, codecs.getincrementaldecoder("utf-8")(errors="strict")


class _Reader:
    """A growing text window over the (decompressed) file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh, self.decoder = _open_text(path)
        self.buf = ""
        self.pos = 0  # position in buf
        self.offset = 0  # characters dropped before buf[0]
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        try:
            raw = self.fh.read(_CHUNK)
        except (OSError, EOFError) as exc:  # bad gzip stream
            raise TraceError(f"{self.path}: cannot read after character {self.offset + len(self.buf)}: {exc}") from None
        try:
            text = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{self.path}: not UTF-8 text near character {self.offset + len(self.buf)}: {exc}") from None
        if not raw:
            self.eof = True
        # Drop what was consumed so the window stays one chunk or so long.
        self.buf = self.buf[self.pos:] + text
        self.offset += self.pos
        self.pos = 0
        return bool(text) or not self.eof

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
        self.skip_ws()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if not self.eof:  # most likely the value runs past the window: read more, retry
                    self.fill()
                    continue
                truncated = exc.pos >= len(self.buf.rstrip()) - 1 or exc.msg.startswith("Unterminated")
                raise TraceError(f"{self.path}: {'truncated' if truncated else 'malformed'} JSON in {what} "
                                 f"at character {self.offset + exc.pos}: {exc.msg}") from None
            self.pos = end
            return obj


def _num(v: Any) -> float:
    # Numbers stay as the JSON wrote them (an integral dur prints as `50`, as TraceLens's does).
    if type(v) is float or type(v) is int:
        return v
    return float(v) if v is not None else 0.0


_DROP_ARGS = _NOT_ARGS[2:]  # the per-event counters


def _make_event(uid: int, raw: Any, intern: dict, shared_args: dict) -> Event:
    if type(raw) is not dict:
        raise TypeError(f"expected an object, got {type(raw).__name__}")
    get = raw.get
    cat = get("cat") or ""
    cat = intern.setdefault(cat, cat)
    name = get("name")
    if type(name) is not str:
        name = "" if name is None else str(name)
    if len(name) < 256:
        name = intern.setdefault(name, name)
    ph = get("ph") or ""
    args = get("args")
    corr = ext = None
    if type(args) is dict:
        corr = args.pop("correlation", None)
        ext = args.pop("External id", None)
        if cat in _KEEP_ALL_ARGS or ph == "M":
            for k in _DROP_ARGS:
                args.pop(k, None)
            # Identical args (the same op and shapes every step) share one dict.
            key = (cat, repr(args))
            args = shared_args.setdefault(key, args)
        else:
            args = None
    else:
        args = None
    return Event(uid, ph, cat, name, get("pid"), get("tid"), _num(get("ts")), _num(get("dur")),
                 args, corr, ext, get("id"))


def _events(reader: _Reader, intern: dict, start_uid: int = 0) -> Iterator[Event]:
    """The hot loop: one regex skip and one raw_decode per event; refills only at window ends."""
    uid = start_uid
    slow_until = 0  # absolute character offset before which the fast path is not retried
    shared_args: dict = {}
    raw_pool: dict[bytes, bytes] = {}
    ws_match = _WS.match
    decode = _DECODER.raw_decode
    while True:
        buf, pos = reader.buf, reader.pos
        pos = ws_match(buf, pos).end()
        if pos >= len(buf):
            reader.pos = pos
            if not reader.fill():
                raise TraceError(f"{reader.path}: truncated: the traceEvents list ends without ']' "
                                 f"after event {uid - 1}")
            continue
        if buf[pos] == "]":
            reader.pos = pos + 1
            return
        if _FAST is not None and len(buf) - pos > _FAST_MIN and reader.offset + pos >= slow_until:
            j = _last_event_end(buf, pos)
            items = None
            for _ in range(2):  # a false boundary (inside a string) gets one earlier try
                if j <= pos:
                    break
                try:
                    items = _FAST.decode("[" + buf[pos:j + 1] + "]")
                    break
                except _FAST_ERRORS:
                    j = _last_event_end(buf[:j], pos)
            if items is None:
                # A bad event or an odd string: go event by event through this window.
                slow_until = reader.offset + len(buf)
            else:
                for r in items:
                    yield _from_raw(uid, r, intern, raw_pool)
                    uid += 1
                reader.pos = j + 1
                continue
        try:
            raw, end = decode(buf, pos)
        except json.JSONDecodeError:
            reader.pos = pos
            raw = reader.value(f"event {uid}")  # refills, or raises with the offset
            end = reader.pos
        reader.pos = end
        try:
            yield _make_event(uid, raw, intern, shared_args)
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{reader.path}: event {uid} (character {reader.offset + pos}): {exc}") from None
        uid += 1


def load_trace(path: Path | str) -> Trace:
    """Load a trace. The cyclic GC is paused while loading: millions of small objects that
    never form cycles would otherwise trigger repeated full collections (2-3x slower)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        trace = _load(Path(path))
        # The events never form reference cycles: move them out of the collector's sight, so
        # later collections do not walk millions of objects again and again.
        gc.freeze()
        return trace
    finally:
        if was_enabled:
            gc.enable()


def _load(path: Path) -> Trace:
    if not path.is_file():
        raise TraceError(f"{path}: trace file not found")
    reader = _Reader(path)
    intern: dict[str, str] = {}
    events: list[Event] = []
    metadata: dict = {}
    c = reader.skip_ws()
    if c == "[":
        reader.pos += 1
        events.extend(_events(reader, intern))
    elif c == "{":
        reader.pos += 1
        seen_events = False
        while True:
            c = reader.skip_ws(",")
            if c == "}":
                break
            if c == "":
                raise TraceError(f"{path}: truncated: the top-level object is not closed")
            key = reader.value("a top-level key")
            if not isinstance(key, str) or reader.skip_ws() != ":":
                raise TraceError(f"{path}: malformed top level at character {reader.offset + reader.pos}")
            reader.pos += 1
            if key == "traceEvents":
                if reader.skip_ws() != "[":
                    raise TraceError(f"{path}: traceEvents is not a list")
                reader.pos += 1
                events.extend(_events(reader, intern))
                seen_events = True
            else:
                metadata[key] = reader.value(f"top-level key {key!r}")
        if not seen_events:
            raise TraceError(f"{path}: no traceEvents list (is this a torch-profiler trace?)")
    elif c == "":
        raise TraceError(f"{path}: empty file")
    else:
        raise TraceError(f"{path}: not a JSON trace (starts with {c!r})")
    reader.fh.close()
    return Trace(path, events, metadata)


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
