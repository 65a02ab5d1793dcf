"""The streaming loader: formats, chunk boundaries, and errors that name file, offset and event."""

import gzip
import json

import pytest

import engine.trace.load as load_mod
from engine.trace.load import TraceError, load_trace


def _events(n):
    return [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 2, "ts": 10.0 * i, "dur": 5.5,
             "args": {"External id": i, "Input Dims": [[i, 2], []], "Concrete Inputs": ["", "1"]}} for i in range(n)]


def test_object_and_bare_list_forms(tmp_path):
    evs = _events(5)
    obj = tmp_path / "a.json"
    obj.write_text(json.dumps({"schemaVersion": 1, "traceEvents": evs, "deviceProperties": [{"name": "NVIDIA H200"}]}))
    bare = tmp_path / "b.json.gz"
    with gzip.open(bare, "wt") as fh:
        json.dump(evs, fh)
    for path in (obj, bare):
        t = load_trace(path)
        assert [e.uid for e in t.events] == list(range(5))
        assert t.events[3].name == "aten::op3" and t.events[3].ext_id == 3 and t.events[3].ts == 30.0
        assert t.events[3].args["Input Dims"] == [[3, 2], []]
    assert load_trace(obj).device_properties() == [{"name": "NVIDIA H200"}]


def test_chunk_boundaries_do_not_change_the_result(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _events(300), "after": {"k": "v" * 50}}, indent=2))
    whole = load_trace(path)
    monkeypatch.setattr(load_mod, "_CHUNK", 97)  # many refills, values split across windows
    pieces = load_trace(path)
    assert [(e.name, e.ts, e.args) for e in pieces.events] == [(e.name, e.ts, e.args) for e in whole.events]
    assert pieces.metadata == {"after": {"k": "v" * 50}}


def test_truncated_file_names_file_and_event(tmp_path):
    text = json.dumps({"traceEvents": _events(50)})
    path = tmp_path / "cut.json.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(text[: len(text) // 2])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    assert str(path) in msg and "truncated" in msg and "character" in msg


def test_malformed_event_names_its_index(tmp_path):
    text = json.dumps({"traceEvents": _events(10)})
    bad = text.replace('"name": "aten::op6"', '"name": aten::op6', 1)
    path = tmp_path / "bad.json"
    path.write_text(bad)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    assert "malformed JSON in event 6" in msg and str(path) in msg


def test_not_a_trace(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"foo": 1}')
    with pytest.raises(TraceError, match="no traceEvents"):
        load_trace(p)
    p.write_text("")
    with pytest.raises(TraceError, match="empty file"):
        load_trace(p)
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "missing.json")


def test_fast_chunked_path_equals_event_by_event(tmp_path, monkeypatch):
    """msgspec decodes many events per call; the json fallback one at a time: same events."""
    from trace_builder import TraceBuilder
    b = TraceBuilder()
    for i in range(3000):
        ext = b.op(f"aten::op{i % 7}", i * 10.0, 5, dims=[[i % 5, 3], []])
        b.launch(i * 10.0 + 1, f"kernel_{i % 3}", 1e6 + i * 20.0, 4, ext=ext)
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "odd }, { name", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1,
                     "args": {"Concrete Inputs": ["}, {"]}})
    path = b.write(tmp_path / "t.json.gz")
    fast = load_trace(path)
    monkeypatch.setattr(load_mod, "_FAST", None)
    slow = load_trace(path)
    assert len(fast.events) == len(slow.events) > 12000

    def key(e):
        return (e.uid, e.ph, e.cat, e.name, e.pid, e.tid, e.ts, e.dur, e.corr, e.ext_id, e.flow_id, e.args)
    assert [key(e) for e in fast.events] == [key(e) for e in slow.events]
    kernel = next(e for e in fast.events if e.cat == "kernel")
    assert kernel.corr == 1 and kernel.args == {"stream": 7, "device": 0}
    assert fast.events[-1].args == {"Concrete Inputs": ["}, {"]}


def test_event_writer_writes_what_json_writes_of_event_json(tmp_path):
    """The split's fast event text equals json.dumps of event_json for every kind of value:
    odd ids and int time stamps (event_json's path), non-ASCII and DEL, floats json writes with
    an exponent or msgspec writes otherwise, args without ids, empty args, non-object args."""
    from engine.trace.load import EventWriter
    from trace_builder import TraceBuilder
    b = TraceBuilder()
    for i in range(50):
        ext = b.op(f"aten::op{i % 4}", i * 10.0 + 0.125, 5.25, dims=[[i % 5, 3], []])
        b.launch(i * 10.0 + 1, "kérnel_\x7f" if i % 9 == 0 else f"kernel_{i % 3}", 1e6 + i * 20.0, 4, ext=ext)
    odd = [
        {"ph": "X", "cat": "cpu_op", "name": "int times", "pid": 1, "tid": 2, "ts": 7, "dur": 3, "args": {"External id": "x"}},
        {"ph": "X", "cat": "python_function", "name": "f.py(1): g", "pid": "p", "tid": 2.0, "ts": 1.5e-7, "dur": 1e14,
         "args": {"Python parent id": 1, "Python id": 2, "Python thread": 0}},
        {"ph": "X", "cat": "cpu_op", "name": None, "pid": 1, "tid": 2, "ts": 3.0, "dur": 0.00001,
         "args": {"small": 1e-05, "big": 1e22, "exp": 1.5e-7, "text": "é\u2028", "none": None, "Ev Idx": 4}},
        {"ph": "X", "cat": "user_annotation", "name": "empty", "pid": 1, "tid": 2, "ts": 2e16, "dur": 1.0, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "list args", "pid": 1, "tid": 2, "ts": 5.0, "dur": 1.0, "args": [1, 2]},
        {"ph": "i", "cat": "instant", "name": "mark", "pid": 1, "tid": 2, "ts": 6.0, "s": "t"},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "pid": 1, "tid": 2, "ts": 6.5, "id": "str-id"},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 3, "args": {"name": "ü"}},
    ]
    b.events.extend(odd)
    b.events.append({"ph": "X", "cat": "python_function", "name": "escaped", "pid": 1, "tid": 2, "ts": 8.0, "dur": 1.0,
                     "args": {"Python id": 9, "ESCAPED": 3}})
    path = b.write(tmp_path / "t.json")
    path.write_text(path.read_text().replace('"ESCAPED"', '"Ev\\u0020Idx"'))  # a dropped key, written escaped
    encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
    want = load_trace(path)
    expected = encode([want.event_json(u) for u in range(len(want.events))])[1:-1]
    got = load_trace(path)
    writer = EventWriter(got)
    uids = list(range(len(got.events)))
    assert writer.text(uids) == expected
    assert ",".join(writer.text(uids[i:i + 7]) for i in range(0, len(uids), 7)) == expected  # args now compact
    assert [got.args_of(u) for u in uids] == [want.args_of(u) for u in uids]  # decoded from the compact texts


@pytest.fixture
def two_processes(monkeypatch):
    """Any trace loads in two processes (pytest's own threads aside); yields the forks' arguments."""
    forks = []
    real = load_mod._Tail.__init__

    def counted(self, *args):
        forks.append(args)
        real(self, *args)
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN", 0)
    monkeypatch.setattr(load_mod.threading, "active_count", lambda: 1)
    monkeypatch.setattr(load_mod, "_cpus", lambda: 2)  # (on one CPU too: the result must not depend on it)
    monkeypatch.setattr(load_mod._Tail, "__init__", counted)
    return forks


def _same_trace(a, b, exact_pool=True):
    """``exact_pool``: the args pools equal entry by entry (else each event's args equal: where one
    process read an odd event on its slow path, its pool holds the args decoded, not as text)."""
    for column in load_mod._COLUMNS:
        if column != "args" or exact_pool:
            assert getattr(a, column) == getattr(b, column), column
    assert (a.kinds, a.names, a.ids, a.odd, a.metadata) == (b.kinds, b.names, b.ids, b.odd, b.metadata)
    if exact_pool:
        assert a.args_pool == b.args_pool  # the same entries, in the same order: one process's tables
    assert [a.args_of(u) for u in range(len(a.kind))] == [b.args_of(u) for u in range(len(b.kind))]


def _frames_trace(n=2500, odd_at=None):
    """Ops, launches and Python frames (whose args never repeat), as a trace with stacks has them."""
    from trace_builder import TraceBuilder
    b = TraceBuilder()
    for i in range(n):
        ext = b.op(f"aten::op{i % 7}", i * 10.0, 5, dims=[[i % 5, 3], []])
        b.launch(i * 10.0 + 1, f"kernel_{i % 3}", 1e6 + i * 20.0, 4, ext=ext)
        b.events.append({"ph": "X", "cat": "python_function", "name": f"model.py({i % 50}): forward", "pid": 100,
                         "tid": 100, "ts": i * 10.0 + 0.5, "dur": 2.0,
                         "args": {"Python parent id": i, "Python id": i + 1, "Python thread": 0}})
        if odd_at is not None and i == odd_at:
            b.events.append(odd_at_event())
    return b


def odd_at_event():
    return {"ph": "X", "cat": "cpu_op", "name": "odd }, {\"ph\": \"X\" name", "pid": 100, "tid": 100, "ts": 7,
            "dur": 1, "args": {"Concrete Inputs": ["}, {\"ph\": \"X\"}"], "Ev Idx": 3}}


@pytest.mark.parametrize("name", ["t.json.gz", "t.json"])
def test_two_process_load_equals_one_process(tmp_path, monkeypatch, two_processes, name):
    """A large trace is loaded by this process and a forked child (the events after the split
    point): the trace is the one a single process loads, tables in the same order, and the
    top-level keys after the events list come back from the child."""
    path = _frames_trace().write(tmp_path / name, deviceProperties=[{"name": "NVIDIA H100"}])
    doc = json.loads(gzip.open(path, "rt").read() if name.endswith(".gz") else path.read_text())
    doc["traceName"], doc["baseTimeNanoseconds"] = "x", 1700000000000000000
    path_after = tmp_path / ("after_" + name)
    with (gzip.open if name.endswith(".gz") else open)(path_after, "wt") as fh:
        json.dump(doc, fh)
    bare = tmp_path / ("bare_" + name)
    with (gzip.open if name.endswith(".gz") else open)(bare, "wt") as fh:
        json.dump(doc["traceEvents"], fh)
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN", 48 << 20)
    assert load_mod._Tail.start(path) is None  # small: one process
    alone = {p: load_trace(p) for p in (path, path_after, bare)}
    assert not two_processes
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN", 0)
    for n, (p, one) in enumerate(alone.items(), 1):
        two = load_trace(p)
        assert len(two_processes) == n and len(two.events) == len(one.events) > 10000
        _same_trace(two, one)
    assert alone[path_after].metadata["traceName"] == "x"


def test_two_process_load_skips_a_boundary_look_alike_in_a_string(tmp_path, monkeypatch, two_processes):
    """An event boundary look-alike inside a string just after the split point: the child does not
    begin there (the events from there do not decode) but at the next event; the same trace."""
    path, one = _look_alike_at_the_split(tmp_path, monkeypatch)
    _same_trace(load_trace(path), one, exact_pool=False)
    assert len(two_processes) == 1


def test_two_process_load_that_cannot_join_loads_alone(tmp_path, monkeypatch, two_processes):
    """A child made to begin inside a string (its look-alike taken for a boundary): it fails, this
    process fails to end there, and loads the whole trace alone; the same trace."""
    path, one = _look_alike_at_the_split(tmp_path, monkeypatch)
    monkeypatch.setattr(load_mod, "_first_boundary", lambda window: window.index(b'}, {\\"ph') + 3)
    tries = _count_tries(monkeypatch)
    _same_trace(load_trace(path), one)
    assert len(two_processes) == 1 and tries == [True, False]  # with the child, then alone


def _look_alike_at_the_split(tmp_path, monkeypatch):
    """A trace with an event boundary look-alike in a string near its middle, the split point
    just before it; (its path, the trace one process loads)."""
    b = _frames_trace(n=1200)
    text = json.dumps({"traceEvents": b.events})
    pos = text.index("}, {", len(text) // 2) + 3  # an event start near the middle
    text = text[:pos] + json.dumps(odd_at_event()) + ", " + text[pos:]
    at = text.index('}, {\\"ph\\"', pos)  # the look-alike (ASCII: characters are bytes)
    path = tmp_path / "t.json"
    path.write_text(text)
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN", 1 << 62)
    one = load_trace(path)
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN", 0)
    monkeypatch.setattr(load_mod, "_SPLIT_AT", (at - 20) / len(text))
    return path, one


def test_two_process_load_reports_an_error_in_the_childs_part_as_one_process(tmp_path, monkeypatch, two_processes):
    text = json.dumps({"traceEvents": _frames_trace(n=1200).events})
    at = text.index('"name": "aten::op', int(len(text) * 0.8))
    path = tmp_path / "bad.json"
    path.write_text(text[:at] + '"name": aten::op' + text[at + len('"name": "aten::op'):])
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN", 1 << 62)
    with pytest.raises(TraceError) as alone:
        load_trace(path)
    monkeypatch.setattr(load_mod, "_PARALLEL_MIN", 0)
    tries = _count_tries(monkeypatch)
    with pytest.raises(TraceError) as two:
        load_trace(path)
    assert str(two.value) == str(alone.value) and "malformed JSON in event" in str(two.value)
    assert len(two_processes) == 1 and tries == [True, False]


def _count_tries(monkeypatch) -> list[bool]:
    """Each load attempt: True with a child."""
    tries: list[bool] = []
    real = load_mod._load_with

    def counted(path, cancel, tail):
        tries.append(tail is not None)
        return real(path, cancel, tail)
    monkeypatch.setattr(load_mod, "_load_with", counted)
    return tries
