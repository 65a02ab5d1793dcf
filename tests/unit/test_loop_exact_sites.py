"""The exact model line behind each aten GEMM and embedding: the built-in server's model, while it
profiles, runs those calls inside magpie_site spans that name their line, and the bottleneck
table maps each op inside one to that line (``line_kind`` "call line") instead of the first line
of the calling function, on a real CPU trace of the server's profiler and on a GPU-shaped one."""

import inspect

import pytest
import torch
from trace_builder import TraceBuilder

from engine.loop.bottlenecks import analyze_trace
from engine.loop.stacks import short_file
from engine.serve.engine import step_annotation
from engine.serve.model import PRESETS, SITE_ANNOTATION, LlamaModel

MODEL_FILE = short_file(inspect.getsourcefile(LlamaModel))


def _source_lines(code: str) -> dict[int, str]:
    """Line number -> the model method holding it, for each line of model.py that calls ``code``."""
    out = {}
    for name, fn in vars(LlamaModel).items():
        fn = getattr(fn, "__wrapped__", fn)
        if not inspect.isfunction(fn):
            continue
        lines, start = inspect.getsourcelines(fn)
        out.update({start + i: name for i, text in enumerate(lines) if code in text})
    assert out, f"no line of {MODEL_FILE} calls {code}"
    return out


QKV, O_PROJ, GATE_UP, DOWN = (_source_lines(c) for c in ("layer.qkv(h)", "layer.o(attn)", "layer.gate_up(h)",
                                                           "layer.down(act)"))
HEAD, EMBED = _source_lines("rows @ head"), _source_lines("self.embed(ids)")


def _lines(row: dict) -> dict[int, dict]:
    return {ln["line"]: ln for ln in row["mapping"]["lines"]}


def test_the_gemm_and_embedding_rows_name_the_lines_that_called_them(server_trace):
    table = analyze_trace(server_trace)
    assert table["call_lines_annotated"] is True
    rows = {r["name"]: r for r in table["stages"]["all"]["rows"]}
    # The four linear layers: each at its own call line (the function start would fold o,
    # gate_up and down into one line of _finish_layer).
    linear = rows["aten::linear"]
    want = {**QKV, **O_PROJ, **GATE_UP, **DOWN}
    assert len(want) == 4 and _lines(linear).keys() == want.keys()
    for line, ln in _lines(linear).items():
        assert (ln["file"], ln["function"], ln["line_kind"], ln["module"]) == \
            (MODEL_FILE, want[line], "call line", "Linear")
        assert ln["share_pct"] > 0
    assert sum(ln["share_pct"] for ln in linear["mapping"]["lines"]) == pytest.approx(100, abs=0.1)
    assert linear["mapping"]["unlocated_pct"] == 0.0
    # The LM head's matmul and the embedding (in both forwards that run in the window).
    head = rows["aten::matmul"]
    assert [(ln["line"], ln["function"], ln["line_kind"]) for ln in head["mapping"]["lines"]] == \
        [(line, fn, "call line") for line, fn in HEAD.items()]
    embed = _lines(rows["aten::embedding"])
    assert embed and embed.keys() <= EMBED.keys() and "decode" in {ln["function"] for ln in embed.values()}
    assert all(ln["function"] == EMBED[line] and ln["module"] == "Embedding" and ln["line_kind"] == "call line"
               for line, ln in embed.items())
    # Ops with no span of their own keep the function start, and say so.
    norm = rows["rmsnorm"]["mapping"]
    assert norm["lines"] and {ln["line_kind"] for ln in norm["lines"]} == {"function start"}


def test_the_site_spans_are_named_once_per_call_line_and_only_while_profiling():
    model = LlamaModel(PRESETS["tiny"])
    cache = model.new_cache(2, 32)
    ids, positions = torch.tensor([5, 9]), torch.tensor([0, 0])
    args = (cache, ids, positions, torch.tensor([0, 1]), torch.tensor([1, 1], dtype=torch.int32))

    def profiled() -> tuple[torch.Tensor, list[str]]:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            logits = model.decode(*args)
        return logits, [e.name for e in prof.events() if e.name.startswith(SITE_ANNOTATION)]

    plain, spans = profiled()
    assert spans == []  # off: the forward runs with no span
    model.annotate_kernels = True
    annotated, spans = profiled()
    _, again = profiled()
    model.annotate_kernels = False
    assert torch.equal(plain, annotated)  # the same ops, the same numbers
    layers = len(model.layers)
    names = {f"{SITE_ANNOTATION}{MODEL_FILE}:{line} {label} in {fn}"
             for label, sites in (("qkv", QKV), ("o", O_PROJ), ("gate_up", GATE_UP), ("down", DOWN), ("lm_head", HEAD))
             for line, fn in sites.items()}
    names |= {f"{SITE_ANNOTATION}{MODEL_FILE}:{line} decode_embed in decode"
              for line, fn in EMBED.items() if fn == "decode"}
    assert set(spans) == names and len(spans) == 4 * layers + 2
    assert again == spans


def test_a_gpu_kernel_launched_inside_a_site_span_gets_its_call_line(tmp_path):
    """GPU-shaped, without Python stacks: a GEMM kernel launched by aten::mm inside the qkv span and
    one inside the o span; an unannotated elementwise kernel keeps no line."""
    tb = TraceBuilder()
    tb.annotation(step_annotation([], [(1, 40)] * 4), 0.0, 900.0)  # the first step: left out
    tb.annotation(step_annotation([], [(1, 41)] * 4), 1000.0, 900.0)
    tb.annotation(f"{SITE_ANNOTATION}engine/serve/model.py:287 qkv in _qkv", 1010.0, 50.0)
    tb.op_with_kernel("aten::mm", 1015.0, "nvjet_gemm", 1100.0, 30.0)
    tb.annotation(f"{SITE_ANNOTATION}engine/serve/model.py:298 o in _finish_layer", 1200.0, 50.0)
    tb.op_with_kernel("aten::mm", 1205.0, "nvjet_gemm", 1300.0, 10.0)
    tb.op_with_kernel("aten::add", 1400.0, "elementwise_kernel", 1450.0, 5.0)
    table = analyze_trace(tb.write(tmp_path / "t.json"))
    rows = {r["name"]: r for r in table["stages"]["all"]["rows"]}
    gemm = rows["nvjet_gemm"]["mapping"]
    assert (gemm["method"], gemm["confidence"]) == ("call-line annotation", "medium")
    assert [(ln["file"], ln["line"], ln["function"], ln["line_kind"], ln["model_code"], ln["share_pct"])
            for ln in gemm["lines"]] == [("engine/serve/model.py", 287, "_qkv", "call line", True, 75.0),
                                         ("engine/serve/model.py", 298, "_finish_layer", "call line", True, 25.0)]
    assert rows["elementwise_kernel"]["mapping"]["lines"] == []
