"""Inference step annotations, the TraceLens splitter, Magpie's stage pick and the compact
roofline CSV, checked against the TraceLens golden set (synthetic_vllm, Case 2) and small traces
built here."""

import csv
import gzip
import json
import math
import shutil
from pathlib import Path

import pytest

from engine.trace.load import load_trace
from engine.trace.roofline_simple import SIMPLE_COLUMNS, simple_csv_name, write_roofline_simple
from engine.trace.split import (GPU_CATEGORIES, detect_steady_state, find_steady_state_regions, middle_slice,
                                pick_stage_steps, sanitise_annotation, split_trace, trace_base_name)
from engine.trace.steps import find_steps, parse_step_annotation
from trace_builder import TraceBuilder

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "tracelens-golden" / "synthetic_vllm"
SPLIT_GOLDEN = DATA / "trace_split"
REL = 1e-6

PD_NAME = "execute_514_context_1(sq512sk512sqsq262144sqsk262144)_generation_2(sq2sk2048sqsq2sqsk2048)"
# Annotation names as vLLM 0.32 wrote them (rank0.vllm-cpu.pt.trace.json.gz of the shared vLLM CPU trace).
VLLM_NATIVE = {
    "execute_context_1(65)_generation_0(0)": ("prefill", 1, 0, 65, 0, 65, 1),
    "execute_context_0(0)_generation_1(1)": ("decode", 0, 1, 0, 1, 1, 1),
    "execute_context_1(64)_generation_1(1)": ("prefilldecode", 1, 1, 64, 1, 65, 2),
    "execute_context_1(65)_generation_2(2)": ("prefilldecode", 1, 2, 65, 2, 67, 3),
    "execute_context_0(0)_generation_3(3)": ("decode", 0, 3, 0, 3, 3, 3),
    "execute_context_0(0)_generation_0(0)": ("other", 0, 0, 0, 0, 0, 0),
}


def _same(a, b) -> bool:
    """Equal text, or equal numbers within 1e-6 relative (an expected 0 must be 0)."""
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= REL * max(abs(x), abs(y))


def _same_tree(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_tree(x, y) for x, y in zip(a, b))
    return _same(a, b)


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def _events(path: Path) -> tuple[dict, list[dict]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    return {k: v for k, v in doc.items() if k != "traceEvents"}, doc["traceEvents"]


def _same_multiset(ours: list[dict], golden: list[dict]) -> bool:
    """Same events regardless of order (100 == 100.0: our loader keeps times as floats)."""
    left = list(ours)
    for g in golden:
        for i, o in enumerate(left):
            if o == g:
                del left[i]
                break
        else:
            return False
    return not left


@pytest.fixture(scope="module")
def golden_split(tmp_path_factory):
    """Our splitter run as the golden command was: inside synthetic_vllm/, ``-o trace_split``."""
    root = tmp_path_factory.mktemp("synthetic_vllm")
    trace = load_trace(GOLDEN / "synthetic_vllm.json.gz")
    result = split_trace(trace, root / "trace_split", num_steps=4, conc=3, osl=8, ratio=1.0, output_path_base=root)
    return root, result


# --------------------------------------------------------------------------- step annotations

def test_vllm_detailed_annotation():
    s = parse_step_annotation(PD_NAME)
    assert s is not None and s.framework == "vllm" and s.detailed
    assert (s.kind, s.context_requests, s.generation_requests, s.num_requests, s.batch_size) == \
        ("prefilldecode", 1, 2, 3, 514)
    assert (s.c_sq, s.c_sk, s.c_sqsq, s.c_sqsk) == (512, 512, 262144, 262144)
    assert (s.g_sq, s.g_sk, s.g_sqsq, s.g_sqsk) == (2, 2048, 2, 2048)
    d = parse_step_annotation("execute_3_context_0(sq0sk0sqsq0sqsk0)_generation_3(sq3sk3075sqsq3sqsk3075)")
    assert d is not None and (d.kind, d.batch_size, d.num_requests, d.g_sk) == ("decode", 3, 3, 3075)
    p = parse_step_annotation("execute_14721_context_2(sq14721sk14721sqsq108745533sqsk108745533)"
                              "_generation_0(sq0sk0sqsq0sqsk0)")
    assert p is not None and (p.kind, p.batch_size, p.c_sqsq) == ("prefill", 14721, 108745533)


@pytest.mark.parametrize("name", sorted(VLLM_NATIVE))
def test_vllm_native_annotations_from_a_real_trace(name):
    s = parse_step_annotation(name)
    assert s is not None and s.framework == "vllm" and not s.detailed
    assert (s.kind, s.context_requests, s.generation_requests, s.c_sq, s.g_sq, s.batch_size, s.num_requests) == \
        VLLM_NATIVE[name]
    assert (s.c_sk, s.c_sqsq, s.g_sk, s.g_sqsk) == (0, 0, 0, 0)


@pytest.mark.parametrize("name, expected", [
    ("step[EXTEND bs=2 toks=14721 c_sq=14721 c_sqsq=108745533 c_sqsk=108745533 c_sk=14721]",
     ("prefill", True, 2, 0, 14721, 14721, 0, 14721)),
    ("step[DECODE bs=64 g_sq=128 g_sqsq=256 g_sqsk=262144 g_sk=131072]",  # MTP: g_sq > bs
     ("decode", True, 0, 64, 128, 0, 128, 131072)),
    ("step[MIXED bs=2 c=1 g=1 c_sq=5 c_sk=8 c_sqsq=25 c_sqsk=40 g_sq=1 g_sk=12 g_sqsq=1 g_sqsk=12]",
     ("prefilldecode", True, 1, 1, 6, 5, 1, 20)),
    ("step[EXTEND bs=2 toks=14721]", ("prefill", False, 2, 0, 14721, 14721, 0, 0)),
    ("step[DECODE bs=64]", ("decode", False, 0, 64, 64, 0, 64, 0)),
    ("step[MIXED bs=2]", ("prefill", False, 2, 0, 2, 0, 0, 0)),  # TraceLens: MIXED without counts is prefill
])
def test_sglang_annotations(name, expected):
    s = parse_step_annotation(name)
    assert s is not None and s.framework == "sglang"
    assert (s.kind, s.detailed, s.context_requests, s.generation_requests, s.batch_size, s.c_sq, s.g_sq,
            s.c_sk + s.g_sk) == expected


@pytest.mark.parametrize("name, expected", [
    ("prefill[bs=2 tok=14721 ctx=[7803, 6918]]", ("prefill", False, 2, 0, 14721, 14721, 0, 0)),
    ("prefill[bs=2 tok=14721 ctx=[7803, 6918] sqsq=108745533 sqsk=108745533 sk=14721]",
     ("prefill", True, 2, 0, 14721, 14721, 108745533, 14721)),
    ("decode[bs=117/128 tok=117 d=117]", ("decode", False, 0, 117, 117, 117, 0, 0)),  # CUDA-graph padding
    ("decode[bs=32 tok=128 d=32 spec=3 sqsq=512 sqsk=262144 sk=65536]",
     ("decode", True, 0, 32, 128, 128, 512, 65536)),
])
def test_atom_annotations(name, expected):
    s = parse_step_annotation(name)
    assert s is not None and s.framework == "atom"
    sq = s.c_sq or s.g_sq
    sqsq = s.c_sqsq or s.g_sqsq
    sk = s.c_sk or s.g_sk
    assert (s.kind, s.detailed, s.context_requests, s.generation_requests, s.batch_size, sq, sqsq, sk) == expected


@pytest.mark.parametrize("name", ["step_0", "execute_model", "capture_128_decode", "ProfilerStep#3", ""])
def test_other_names_are_not_steps(name):
    assert parse_step_annotation(name) is None


def test_find_steps_on_the_golden_trace():
    steps = find_steps(load_trace(GOLDEN / "synthetic_vllm.json.gz"))
    assert len(steps) == 12
    assert [s.kind for s in steps] == ["prefilldecode" if i % 4 == 0 else "decode" for i in range(12)]
    assert [s.ts for s in steps] == [10000.0 * i for i in range(12)]
    assert all((s.pid, s.tid, s.dur) == (1000, 1000, 9000.0) for s in steps)
    assert steps[1].g_sk == 3 * 1025 and steps[0].uid == 7  # uid: index in traceEvents, metadata counted


def test_detailed_annotations_win_over_native_ones(tmp_path):
    b = TraceBuilder()
    b.annotation("execute_context_0(0)_generation_3(3)", 0, 10)
    b.annotation(PD_NAME, 20, 10)
    b.annotation("step_0", 40, 10)
    steps = find_steps(load_trace(b.write(tmp_path / "t.json")))
    assert [s.name for s in steps] == [PD_NAME]


# --------------------------------------------------------------------------- splitter vs golden

def test_execution_details_csv_matches_golden(golden_split):
    root, result = golden_split
    header, rows = _read_csv(root / "trace_split" / "execution_details.csv")
    g_header, g_rows = _read_csv(SPLIT_GOLDEN / "execution_details.csv")
    assert header == g_header
    assert len(rows) == len(g_rows) == 15
    for row, g_row in zip(rows, g_rows):
        assert all(_same(a, b) for a, b in zip(row, g_row)), (row, g_row)
    assert rows[0][1].startswith("trace_split/")  # relative to the folder the split "ran in", as the golden
    assert [str(v) for v in result.rows[0].values()][:4] == rows[0][:4]


def test_execution_details_json_matches_golden(golden_split):
    root, result = golden_split
    text = (root / "trace_split" / "execution_details.json").read_text()
    assert text == json.dumps(json.loads(text), indent=2)  # json.dump(..., indent=2), as TraceLens writes it
    assert _same_tree(json.loads(text), json.loads((SPLIT_GOLDEN / "execution_details.json").read_text()))


def test_written_file_names_match_golden(golden_split):
    root, result = golden_split
    _, g_rows = _read_csv(SPLIT_GOLDEN / "execution_details.csv")
    expected = {Path(r[1]).name for r in g_rows} | {"execution_details.csv", "execution_details.json"}
    assert {p.name for p in (root / "trace_split").iterdir()} == expected
    assert [p.name for p in result.files] == [Path(r[1]).name for r in g_rows] + \
        ["execution_details.json", "execution_details.csv"]
    assert trace_base_name("x/rank0.vllm-cpu.pt.trace.json.gz") == "rank0.vllm-cpu"
    assert sanitise_annotation("step[DECODE bs=64 a/b:c]") == "step[DECODE_bs=64_a_bc]"


def test_slice_contents(golden_split):
    root, result = golden_split
    meta, _ = _events(GOLDEN / "synthetic_vllm.json.gz")
    sizes = {}
    for path in result.files[:-2]:
        file_meta, events = _events(path)
        assert file_meta == meta  # the input's top-level keys travel with every slice
        assert not any(e["ph"] == "M" for e in events)  # TraceLens keeps only ts-less events as metadata
        sizes[path.name] = (len(events), sum(e.get("cat") in GPU_CATEGORIES for e in events))
    steps = [v for k, v in sizes.items() if "_annotation_iteration_" in k]
    assert steps == [(55, 10)] * 12
    windows = {k.split("_prefill_")[0]: v for k, v in sizes.items() if "_steady_state_" in k}
    assert windows == {"mixed_steady_state": (220, 40), "decode_only_steady_state": (165, 30),
                       "prefilldecode_steady_state": (55, 10)}


@pytest.mark.parametrize("golden", [
    GOLDEN / "trace_split" / ("synthetic_vllm_annotation_iteration_4_execute_514_context_1_sq512sk512sqsq262144"
                              "sqsk262144_generation_2_sq2sk2048sqsq2sqsk2048.json.gz"),
    GOLDEN / "trace_split" / ("synthetic_vllm_annotation_iteration_6_execute_3_context_0_sq0sk0sqsq0sqsk0"
                              "_generation_3_sq3sk3090sqsq3sqsk3090.json.gz"),
    *sorted(SPLIT_GOLDEN.glob("*_steady_state_*.json.gz")),
], ids=lambda p: p.name[:40])
def test_slices_hold_the_golden_events(golden_split, golden):
    root, _ = golden_split
    _, ours = _events(root / "trace_split" / golden.name)
    _, theirs = _events(golden)
    assert _same_multiset(ours, theirs)


def test_steady_state_of_the_golden_run(golden_split):
    _, result = golden_split
    st = result.steady
    assert st is not None and st.found
    assert st.regions == [(0, 11)]  # still open at the end: stops one step short
    assert st.ideal_ratio == pytest.approx(0.375) and st.reference_ratio == pytest.approx(0.375)
    assert st.mixed_num_steps == 4  # ceil(1 / 0.375) = 3 <= 4
    assert st.windows == {"mixed_steady_state": (0, 4), "decode_only_steady_state": (1, 4),
                          "prefilldecode_steady_state": (0, 1)}
    assert st.warnings == []


def test_stage_pick_chooses_iterations_4_and_6(golden_split):
    root, result = golden_split
    picks = pick_stage_steps(result.rows, conc=3)
    assert sorted(picks) == ["decode_only", "prefilldecode"]  # no prefill-only step in this trace
    assert (picks["prefilldecode"]["idx"], picks["decode_only"]["idx"]) == (4, 6)
    assert (root / picks["decode_only"]["output_path"]).is_file()
    with (SPLIT_GOLDEN / "execution_details.csv").open(newline="", encoding="utf-8") as fh:
        golden_picks = pick_stage_steps(list(csv.DictReader(fh)), conc=3)  # TraceLens's own CSV, as text
    assert {k: v["output_path"] for k, v in golden_picks.items()} == \
        {k: v["output_path"] for k, v in picks.items()}


def test_stage_pick_rules():
    def row(idx, bs, conc, busy, stage="decode", steps=1, gpu=10, path=None):
        return {"idx": idx, "output_path": path or f"t/x_annotation_iteration_{idx}.json.gz", "num_gpu_events": gpu,
                "gpu_duration": busy, "gpu_busy_duration": busy, "phase_num_prefill": int(stage == "prefill"),
                "phase_num_prefilldecode": int(stage == "pd"), "phase_num_decode": int(stage == "decode"),
                "phase_avg_bs": bs, "phase_avg_conc": conc, "num_steps": steps}
    rows = [row(0, 8, 8, 5.0), row(1, 8, 6, 1.0), row(2, 8, 7, 3.0), row(3, 8, 7, 2.0), row(4, 4, 7, 9.0),
            row(5, 8, 7, 0.0, gpu=0),  # no GPU work
            row(6, 9, 7, 4.0, steps=2),  # not a single step
            row(7, 9, 7, 4.0, path="t/decode_only_steady_state_x.json.gz"),  # a window
            row(8, 100, 3, 7.0, stage="prefill"), row(9, 50, 3, 7.0, stage="pd")]
    picks = pick_stage_steps(rows, conc=7)
    # decode: largest bs (8), then conc closest to 7 (rows 2, 3), then the median by busy time.
    assert (picks["decode_only"]["idx"], picks["prefill_only"]["idx"], picks["prefilldecode"]["idx"]) == (2, 8, 9)
    assert pick_stage_steps(rows, conc=None)["decode_only"]["idx"] == 2  # rows 0-3 by busy: 1, 3, 2, 0 -> 2


# --------------------------------------------------------------------------- steady-state rules

def test_region_opens_after_more_than_five_near_peak_steps():
    assert find_steady_state_regions([1, 1, 8, 8, 8, 8, 8], 4) == []  # five are not enough
    assert find_steady_state_regions([1, 1, 8, 8, 8, 8, 8, 8, 8, 8], 4) == [(2, 9)]  # open at the end: n - 1
    # off-peak steps before the opening do not reset the count; the start is back-dated by the count
    assert find_steady_state_regions([8, 8, 1, 8, 8, 8, 8, 1, 1], 4) == [(1, 8)]


def test_region_closes_after_six_off_peak_steps():
    req = [8] * 10 + [1] * 6 + [8] * 3
    assert find_steady_state_regions(req, 4) == [(0, 15)]  # closes at the 6th off-peak step (exclusive)
    req = [8] * 10 + [1] * 5 + [8] * 3  # five off-peak steps are absorbed
    assert find_steady_state_regions(req, 4) == [(0, 17)]
    two = [8] * 8 + [1] * 6 + [8] * 7
    assert find_steady_state_regions(two, 4) == [(0, 13), (14, 20)]


def test_near_peak_threshold_depends_on_the_step_count():
    req = [10, 8] * 5
    assert find_steady_state_regions(req, 4) == []  # t = 0.1: |8 - 10| > max(1, 1)
    assert find_steady_state_regions(req, 32) == [(0, 9)]  # fewer steps than num_steps: t = 0.2


def test_no_region_falls_back_to_the_middle_slice():
    steps = [parse_step_annotation(n) for n in
             ["execute_context_0(0)_generation_1(1)", "execute_context_1(64)_generation_3(3)"] * 5]
    st = detect_steady_state(steps, 32)  # 1 / 4 requests in turn: only five near-peak steps in all
    assert not st.found and st.regions == [middle_slice(10, 32)] == [(5, 6)]
    assert "no steady-state region" in st.warnings[0]
    assert middle_slice(100, 32) == (4, 96) and middle_slice(1, 32) == (0, 1)


def test_ideal_ratio_raises_the_mixed_window():
    steps = [parse_step_annotation("execute_context_0(0)_generation_4(4)")] * 40
    steps[20] = parse_step_annotation("execute_context_1(64)_generation_3(3)")
    st = detect_steady_state(steps, 4, conc=4, osl=50, ratio=0.0)  # ideal 8/50 = 0.16 -> ceil(6.25) = 7 steps
    assert st.mixed_num_steps == 7 and st.reference_ratio == pytest.approx(0.16)
    first, last = st.windows["mixed_steady_state"]
    assert last - first == 7 and first <= 20 < last  # a window with a prefill step is preferred
    assert st.windows["decode_only_steady_state"] == (0, 4)  # capped at the requested num_steps
    assert st.windows["prefilldecode_steady_state"] == (20, 21)
    assert detect_steady_state(steps, 4, conc=5).warnings == ["expected peak concurrency CONC=5 but the trace "
                                                              "peak is 4"]


def test_split_of_a_built_trace(tmp_path):
    """Ramp-up, a steady region of 10 steps, ramp-down; one kernel per step."""
    requests = [1, 1, 2] + [4] * 10 + [2, 1, 1, 1, 1, 1, 1]
    b = TraceBuilder()
    for i, r in enumerate(requests):
        t = 1000.0 * i
        prefill = i in (5, 6)
        name = (f"execute_{r + 64}_context_1(sq64sk64sqsq4096sqsk4096)_generation_{r - 1}"
                f"(sq{r - 1}sk{100 * (r - 1)}sqsq{r - 1}sqsk{100 * (r - 1)})" if prefill else
                f"execute_{r}_context_0(sq0sk0sqsq0sqsk0)_generation_{r}(sq{r}sk{100 * r}sqsq{r}sqsk{100 * r})")
        b.annotation(name, t, 500)
        b.op_with_kernel("aten::mm", t + 10, "gemm", t + 100, 20 + i)
    b.op_with_kernel("aten::mm", 990_000, "outside_any_step", 990_100, 5)
    trace = load_trace(b.write(tmp_path / "built.pt.trace.json.gz", deviceProperties=[{"id": 0}]))
    out = tmp_path / "split"
    result = split_trace(trace, out, num_steps=4)
    st = result.steady
    assert st is not None and st.found
    assert st.regions == [(3, 18)]  # closes at the 6th off-peak step
    assert st.reference_ratio == pytest.approx(2 / 15)  # 2 context steps in the region
    assert st.windows == {"mixed_steady_state": (3, 7), "decode_only_steady_state": (7, 11),
                          "prefilldecode_steady_state": (5, 7)}
    assert len(result.rows) == len(requests) + 3
    first = result.rows[0]
    assert first["output_path"] == str(out / f"built_annotation_iteration_0_{sanitise_annotation(trace.events[2].name)}"
                                                  ".json.gz")
    assert (first["event_count"], first["num_gpu_events"], first["gpu_busy_duration"]) == (6, 1, 20.0)
    mixed = result.rows[len(requests)]
    assert Path(mixed["output_path"]).name == \
        "mixed_steady_state_prefill_0_prefilldecode_2_decode_2_bs35_conc4_built.json.gz"
    assert (mixed["num_steps"], mixed["num_gpu_events"], mixed["gpu_duration"]) == (4, 4, 20.0 * 4 + 3 + 4 + 5 + 6)
    meta, events = _events(Path(mixed["output_path"]))
    assert meta == {"schemaVersion": 1, "deviceProperties": [{"id": 0}]}
    assert "outside_any_step" not in {e["name"] for e in events}
    only_steps = split_trace(trace, tmp_path / "steps_only", find_steady_state=False)
    assert only_steps.steady is None and len(only_steps.rows) == len(requests)


def test_split_without_step_annotations_is_an_error(tmp_path):
    b = TraceBuilder()
    b.annotation("step_0", 0, 100)
    b.op_with_kernel("aten::mm", 10, "gemm", 20, 5)
    with pytest.raises(ValueError, match="no inference step annotations"):
        split_trace(load_trace(b.write(tmp_path / "t.json")), tmp_path / "out")


# --------------------------------------------------------------------------- compact roofline CSV

@pytest.mark.parametrize("stage", ["prefilldecode", "decode_only"])
def test_roofline_simple_matches_golden(tmp_path, stage):
    name = simple_csv_name(stage, 512, 8, 3)
    assert name == f"{stage}_ISL512_OSL8_CONC3_kernel_roofline_simple.csv"
    out = write_roofline_simple(GOLDEN / "tracelens" / stage, tmp_path / name)
    header, rows = _read_csv(out)
    g_header, g_rows = _read_csv(SPLIT_GOLDEN / name)
    assert header == g_header == list(SIMPLE_COLUMNS)
    assert len(rows) == len(g_rows) == 9
    for row, g_row in zip(rows, g_rows):
        assert all(_same(a, b) for a, b in zip(row, g_row)), (row, g_row)
    by_op = {r[1]: dict(zip(header, r)) for r in rows}
    assert by_op["aten::gelu"]["param_signature"] == "" and by_op["aten::gelu"]["has_perf_model"] == "False"
    assert by_op["aten::copy_"]["param_signature"].startswith("op_shape=(2048, 4096),")  # matched by name only


def test_roofline_simple_without_arch(tmp_path):
    """A report without a GPU arch has no roofline columns: the table keeps 18 columns."""
    stage = tmp_path / "decode_only"
    shutil.copytree(GOLDEN / "tracelens" / "decode_only", stage)
    dropped = {"Roofline Bound", "Roofline Time (µs)_first"} | {f"Pct Roofline_{s}" for s in
                                                                ("mean", "median", "std", "min", "max")}
    header, rows = _read_csv(stage / "unified_perf_summary.csv")
    keep = [i for i, h in enumerate(header) if h not in dropped]
    with (stage / "unified_perf_summary.csv").open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([[r[i] for i in keep] for r in [header, *rows]])
    out_header, out_rows = _read_csv(write_roofline_simple(stage, tmp_path / "simple.csv"))
    assert len(out_header) == 18
    assert out_header == [c for c in SIMPLE_COLUMNS if c not in ("roofline_bound", "pct_roofline_mean",
                                                                 "roofline_time_us")]
    assert [r[5] for r in out_rows][:3] == ["0.2", "0.1", "0.05"]  # kernel_time_ms_sum, 6 significant digits


def test_simple_csv_name_sanitising():
    assert simple_csv_name("decode_only", 1024, 1.5, "64") == \
        "decode_only_ISL1024_OSL1p5_CONC64_kernel_roofline_simple.csv"
    assert simple_csv_name("prefill_only", None, "", " 8 k/x ") == \
        "prefill_only_ISLunknown_OSLunknown_CONC8kx_kernel_roofline_simple.csv"


def _split_files(folder: Path) -> dict[str, bytes]:
    """The files of a split folder; execution_details's paths with the folder's name as DIR."""
    return {p.name: p.read_bytes().replace(folder.name.encode(), b"DIR") for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("fork", [True, False])
def test_the_background_split_writes_what_split_trace_writes(tmp_path, monkeypatch, fork):
    """The inference split run in a forked child (or, without fork, when its result is asked for)
    writes the same files and returns the same result as split_trace run here."""
    import engine.trace.analyze as analyze
    from engine.trace.analyze import TraceAnalysisOptions, _BackgroundSplit
    from engine.trace.split import split_trace
    trace = load_trace(GOLDEN / "synthetic_vllm.json.gz")
    here = split_trace(trace, tmp_path / "here", output_path_base=tmp_path)
    monkeypatch.setattr(analyze.threading, "active_count", lambda: 1)  # pytest's own threads aside
    if not fork:
        monkeypatch.delattr(analyze.os, "fork")
    job = _BackgroundSplit(trace, tmp_path / "child", TraceAnalysisOptions(), tmp_path)
    assert bool(job.pid) == fork
    there = job.result()
    assert job.child_s is not None and job.pid == 0
    assert _split_files(tmp_path / "child") == _split_files(tmp_path / "here")
    assert there.rows == [{**r, "output_path": r["output_path"].replace("here", "child")} for r in here.rows]
    assert there.steps == here.steps


def test_the_background_split_raises_what_the_split_raised(tmp_path):
    from engine.trace.analyze import TraceAnalysisOptions, _BackgroundSplit
    b = TraceBuilder()
    b.op_with_kernel("aten::mm", 0, "gemm", 100, 10)
    trace = load_trace(b.write(tmp_path / "no_steps.json"))
    job = _BackgroundSplit(trace, tmp_path / "split", TraceAnalysisOptions(), tmp_path)
    with pytest.raises(ValueError, match="no inference step annotations"):
        job.result()
    job.stop()  # nothing left to end


def test_a_split_written_by_two_processes_is_the_same(tmp_path, monkeypatch):
    """split_trace(workers=2): a forked child writes the windows and their steps, this process the
    other steps; the same files, rows and details as one process writes."""
    import engine.trace.split as split_mod
    from engine.trace.split import split_trace
    monkeypatch.setattr(split_mod.threading, "active_count", lambda: 1)  # pytest's own threads aside
    trace = load_trace(GOLDEN / "synthetic_vllm.json.gz")
    one = split_trace(trace, tmp_path / "one", output_path_base=tmp_path)
    two = split_trace(trace, tmp_path / "two", output_path_base=tmp_path, workers=2)
    assert _split_files(tmp_path / "two") == _split_files(tmp_path / "one")
    assert [p.name for p in two.files] == [p.name for p in one.files]
    assert two.details == [{**d, "output_path": d["output_path"].replace("one", "two")} for d in one.details]


def test_a_slice_finds_flows_and_gpu_events_by_odd_ids(tmp_path):
    """Flow and correlation ids written as floats (kept aside as odd values) still find their
    events, as a dict would: 3.0 and 3 are one id."""
    b = TraceBuilder()
    for s in range(3):
        b.annotation(PD_NAME, s * 1000.0, 900.0)
        for i in range(5):
            ext = b.op("aten::mm", s * 1000.0 + i * 100 + 1, 50, dims=[[2, 3], [3, 4]])
            b.launch(s * 1000.0 + i * 100 + 5, "gemm", 1e5 + s * 1000 + i * 100, 10, ext=ext)
    for e in b.events:
        if e.get("ph") in ("s", "f") and e["id"] % 3 == 0:
            e["id"] = float(e["id"])
        if e.get("cat") == "cuda_runtime" and e["args"]["correlation"] % 4 == 0:
            e["args"]["correlation"] = float(e["args"]["correlation"])
    result = split_trace(load_trace(b.write(tmp_path / "odd.json")), tmp_path / "split", find_steady_state=False)
    assert [(d["event_count"], d["num_gpu_events"]) for d in result.details] == [(26, 5)] * 3


def test_either_deflate_writes_the_same_split_text_and_reads_the_others_files(tmp_path, monkeypatch):
    """zlib-ng (the `fast` extra) and the standard library's zlib: the split traces of one trace
    hold the same text, and a trace deflated by one loads through the other's inflate."""
    import gzip
    import zlib as std_zlib

    import engine.trace.load as load_mod
    import engine.trace.split as split_mod
    from engine.trace.deflate import NAME
    from engine.trace.split import split_trace
    if NAME != "zlib-ng":
        pytest.skip("zlib-ng is not installed here (pip install zlib-ng)")
    fast = split_trace(load_trace(GOLDEN / "synthetic_vllm.json.gz"), tmp_path / "fast", output_path_base=tmp_path)
    monkeypatch.setattr(split_mod, "zlib", std_zlib)
    monkeypatch.setattr(load_mod, "zlib", std_zlib)
    std = split_trace(load_trace(GOLDEN / "synthetic_vllm.json.gz"), tmp_path / "std", output_path_base=tmp_path)
    gz = [p.name for p in fast.files if p.suffix == ".gz"]
    assert gz and gz == [p.name for p in std.files if p.suffix == ".gz"]
    for name in gz:
        a, b = (tmp_path / "fast" / name).read_bytes(), (tmp_path / "std" / name).read_bytes()
        assert a != b and gzip.decompress(a) == gzip.decompress(b)
    # Loading each other's files: the stdlib reader (patched in now) reads zlib-ng's ...
    t_std = load_trace(tmp_path / "fast" / gz[0])
    monkeypatch.undo()
    # ... and zlib-ng's reader the standard library's.
    t_fast = load_trace(tmp_path / "std" / gz[0])
    assert len(t_std.events) == len(t_fast.events) > 0
    assert [t_std.event_json(u) for u in range(len(t_std.events))] == [t_fast.event_json(u) for u in range(len(t_fast.events))]
