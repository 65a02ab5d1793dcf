"""Profiler backends: command lines and parsing of recorded ncu / rocprofv3 output.

Where the recorded formats in tests/data/profilers come from:

- ncu_raw_vectoradd_scale.csv, ncu_vector_add.log: ``ncu --csv --page raw
  --print-units base`` (NVIDIA Nsight Compute CLI manual, "Console Output": --csv
  implies base units; the raw page gives one row per launch). Layout -- the fixed
  columns "ID","Process ID","Process Name","Host Name","Kernel Name","Context",
  "Stream","Block Size","Grid Size","Device","CC", metric columns in alphabetical
  order, then a units row whose identity fields are empty -- follows raw-page
  captures quoted in public repositories' ncu parsers and tests. The ``==PROF==``
  lines follow the manual's Quickstart transcript ("Connected to process",
  'Profiling "vectorAdd" - 0: 0%....50%....100% - N passes', "Disconnected").
- ncu_details_vectoradd_scale.csv: the details page (one row per metric with
  "Section Name","Metric Name","Metric Unit","Metric Value" and the rule columns of
  recent ncu), as ``--print-units auto`` prints it (usecond, Mbyte; the manual,
  "Metrics and Units": SI factors of 1000) and "Command line profiler metrics" as
  the section of --metrics metrics.
- rocprofv3_vector_add_kernel_trace.csv: the kernel_trace.csv header and row shape
  of ROCprofiler-SDK's docs (rocprofiler-sdk source/docs/data/kernel_trace.csv and
  how-to/using-rocprofv3.rst): quoted Kind / Agent_Id / Kernel_Name, ns timestamps.
- rocprof_v1_results.csv: the legacy rocprof (v1) ``--stats`` results.csv, as quoted in
  public ROCm training notes (a mini-nbody run) and rocprof users' scripts: "[clone .kd]"
  and ".kd" name suffixes, BeginNs / EndNs / DurationNs.

The numbers are made up but consistent: H200-like for ncu (N = 1<<24 floats for
the raw/details files, 1<<26 for the log of examples/kernels/vector_add/cuda) and
MI300X-like for rocprofv3 (examples/kernels/vector_add/hip, one hipMemset fill).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.kernels.profilers import (
    KernelLaunch,
    aggregate_launches,
    build_ncu_command,
    build_rocprofv3_command,
    find_kernel_trace_files,
    is_helper_kernel,
    iteration_samples_ns,
    ncu_summary,
    parse_ncu_csv,
    parse_rocprofv3_kernel_trace,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "profilers"

VECTOR_ADD = "vectorAdd(const float *, const float *, float *, int)"
SCALE = "void scale<float, 256>(float *, const float *, float, int)"
VECTOR_ADD_DURATIONS = [52384, 49088, 49184, 49312, 49056, 49248, 49312, 49216, 49088, 48960,
                        49056, 48992, 48992, 49152, 49184, 49376, 49216, 49216, 49280, 49024]
SCALE_DURATIONS = [35232, 33280, 33152, 33408, 33280, 33312, 33472, 33312, 33120, 33376,
                   33344, 33408, 33472, 33280, 33280, 33184, 33408, 33184, 33344, 33184]
HIP_DURATIONS = [201840, 191400, 190560, 191160, 191560, 191040, 191600, 191040, 191160, 191400,
                 191400, 191480, 190960, 191160, 190440, 190720, 191440, 191200, 190640, 191320]


def read(name: str) -> str:
    return (DATA / name).read_text()


def launch(name: str, duration_ns: float, launch_id: int, read_bytes: float | None = None) -> KernelLaunch:
    return KernelLaunch(name=name, duration_ns=duration_ns, dram_read_bytes=read_bytes, dram_write_bytes=None,
                        grid=None, block=None, launch_id=launch_id, helper=is_helper_kernel(name))


# ---------------------------------------------------------------- ncu command

def test_ncu_command_default_options() -> None:
    cmd = build_ncu_command("ncu", ["./vector_add_bin", "1024"], Path("/tmp/run/ncu.log"))
    assert cmd == [
        "ncu", "--clock-control", "none", "--target-processes", "all", "--csv", "--print-units", "base",
        "--page", "raw", "--metrics", "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum",
        "--log-file", "/tmp/run/ncu.log", "--", "./vector_add_bin", "1024",
    ]


def test_ncu_command_kernel_filter_metrics_and_user_options() -> None:
    cmd = build_ncu_command("/opt/ncu", ["./app"], Path("log.csv"), extra_args=["--page", "details", "-c", "5"],
                            metrics=["gpu__time_duration.sum"], kernel_name="regex:vector")
    # the user's --page replaces ours (ncu refuses an option given twice); the rest stays
    assert cmd.count("--page") == 1
    assert cmd[cmd.index("--page") + 1] == "details"
    assert cmd[cmd.index("--metrics") + 1] == "gpu__time_duration.sum"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:vector"
    assert cmd[-4:] == ["-c", "5", "--", "./app"]


def test_ncu_command_user_kernel_filter_wins_in_any_spelling() -> None:
    cmd = build_ncu_command("ncu", ["./app"], Path("l"), extra_args=["-k", "foo", "--clock-control=base"],
                            kernel_name="bar")
    assert "--kernel-name" not in cmd and "bar" not in cmd
    assert "--clock-control" not in cmd and "--clock-control=base" in cmd


# ---------------------------------------------------------------- ncu parsing

def test_parse_ncu_raw_page_two_kernels() -> None:
    launches = parse_ncu_csv(read("ncu_raw_vectoradd_scale.csv"))
    assert len(launches) == 40
    first, second = launches[0], launches[1]
    assert first == KernelLaunch(name=VECTOR_ADD, duration_ns=52384.0, dram_read_bytes=134220512.0,
                                 dram_write_bytes=67109248.0, grid="(65536, 1, 1)", block="(256, 1, 1)",
                                 launch_id=0, helper=False)
    assert second.name == SCALE  # quoted name with commas and a template
    assert (second.duration_ns, second.dram_read_bytes, second.dram_write_bytes) == (35232.0, 67109856.0, 67108992.0)
    assert [la.duration_ns for la in launches if la.name == VECTOR_ADD] == VECTOR_ADD_DURATIONS
    assert [la.duration_ns for la in launches if la.name == SCALE] == SCALE_DURATIONS


def test_aggregate_ncu_raw_page() -> None:
    kernels = aggregate_launches(parse_ncu_csv(read("ncu_raw_vectoradd_scale.csv")))
    assert [k["kernel_name"] for k in kernels] == [VECTOR_ADD, SCALE]  # most total time first
    va, sc = kernels
    assert va["dispatch_count"] == 20 and sc["dispatch_count"] == 20
    assert va["duration_ns"] == {"avg": 49316.8, "min": 48960, "max": 52384, "total": 986336, "median": 49184.0}
    assert sc["duration_ns"]["total"] == 668032 and sc["duration_ns"]["median"] == 33312.0
    assert va["dram_bytes"] == 4026569440 and sc["dram_bytes"] == 2684377280


def test_iteration_samples_sum_each_iteration() -> None:
    samples, note = iteration_samples_ns(parse_ncu_csv(read("ncu_raw_vectoradd_scale.csv")))
    assert samples == [a + b for a, b in zip(VECTOR_ADD_DURATIONS, SCALE_DURATIONS)]
    assert samples[:3] == [87616, 82368, 82336]
    assert note.startswith("20 iterations") and "2 kernels" in note


def test_parse_ncu_details_page_with_scaled_units() -> None:
    launches = parse_ncu_csv(read("ncu_details_vectoradd_scale.csv"))
    assert [la.launch_id for la in launches] == [0, 1, 2, 3, 4]
    assert [la.name for la in launches] == [VECTOR_ADD, SCALE, VECTOR_ADD, SCALE, VECTOR_ADD]
    first = launches[0]
    assert first.duration_ns == pytest.approx(52380.0)  # "usecond","52.38"
    assert first.dram_read_bytes == pytest.approx(134.22e6)  # "Mbyte","134.22"
    assert first.dram_write_bytes == pytest.approx(67.11e6)
    assert (first.grid, first.block) == ("(65536, 1, 1)", "(256, 1, 1)")


def test_iteration_samples_fall_back_to_top_kernel_when_counts_differ() -> None:
    # -c 5 cut the loop short: vectorAdd ran 3 times, scale twice
    samples, note = iteration_samples_ns(parse_ncu_csv(read("ncu_details_vectoradd_scale.csv")))
    assert samples == pytest.approx([52380.0, 49090.0, 49180.0])
    assert "launch counts differ" in note and VECTOR_ADD in note and "largest total time" in note


def test_parse_ncu_log_with_prof_lines_and_summary() -> None:
    launches = parse_ncu_csv(read("ncu_vector_add.log"))
    assert len(launches) == 20
    assert {la.name for la in launches} == {"vector_add(const float *, const float *, float *, int)"}
    assert launches[0].duration_ns == 194912 and launches[0].grid == "(262144, 1, 1)"
    summary = ncu_summary(launches, spec_bandwidth_tbs=4.8)
    assert summary["kernel_launches"] == 20
    assert summary["gpu_time_ns"] == 3752192
    assert summary["dram_read_bytes"] == 10737525280 and summary["dram_write_bytes"] == 5368721632
    assert summary["dram_bytes"] == 16106246912
    assert summary["achieved_bandwidth_tbs"] == pytest.approx(16106246912 / 3752192e-9 / 1e12)
    assert summary["achieved_bandwidth_tbs"] == pytest.approx(4.2925, abs=1e-4)
    assert summary["pct_of_peak_bandwidth"] == pytest.approx(89.427, abs=1e-3)


def test_ncu_summary_without_peak_or_bytes() -> None:
    launches = [launch("k", 1000.0, 0)]
    summary = ncu_summary(launches, None)
    assert summary["dram_bytes"] is None and summary["achieved_bandwidth_tbs"] is None
    assert summary["pct_of_peak_bandwidth"] is None and summary["gpu_time_ns"] == 1000.0
    with_bytes = ncu_summary([launch("k", 1000.0, 0, read_bytes=2e6)], None)
    assert with_bytes["achieved_bandwidth_tbs"] == pytest.approx(2.0)  # 2 MB in 1 us
    assert with_bytes["pct_of_peak_bandwidth"] is None


def test_parse_ncu_ignores_warnings_and_program_output() -> None:
    text = "\n".join([
        "==PROF== Connected to process 7 (/tmp/app)",
        "==WARNING== Backing up device memory in system memory. Kernel replay might be slow.",
        "PASSED: All 1024 elements correct.",
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","gpu__time_duration.sum"',
        '"","","","","","","","","","","","usecond"',
        '"0","7","app","127.0.0.1","k(int)","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","1,234.5"',
        "==PROF== Disconnected from process 7",
    ])
    [only] = parse_ncu_csv(text)
    assert only.name == "k(int)" and only.duration_ns == pytest.approx(1234500.0)
    assert only.dram_read_bytes is None and only.dram_write_bytes is None


@pytest.mark.parametrize(("unit", "value", "expected_ns", "bytes_unit", "expected_bytes"), [
    ("nsecond", "2,048", 2048.0, "byte", 4096.0),
    ("msecond", "1.5", 1.5e6, "Kbyte", 4096e3),
    ("second", "0.002", 2e6, "Gbyte", 4096e9),
])
def test_parse_ncu_details_units(unit: str, value: str, expected_ns: float, bytes_unit: str,
                                 expected_bytes: float) -> None:
    ident = '"3","1","app","h","k(float *)","1","7","(256, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics"'
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"',
        f'{ident},"dram__bytes_read.sum","{bytes_unit}","4,096"',
        f'{ident},"gpu__time_duration.sum","{unit}","{value}"',
    ])
    [only] = parse_ncu_csv(text)
    assert only.launch_id == 3
    assert only.duration_ns == pytest.approx(expected_ns)
    assert only.dram_read_bytes == pytest.approx(expected_bytes)


def test_parse_ncu_errors() -> None:
    assert parse_ncu_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n") == []
    no_duration = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","dram__bytes_read.sum"',
        '"","","","","","byte"',
        '"0","1","app","h","k()","100"',
    ])
    with pytest.raises(ValueError, match="gpu__time_duration.sum"):
        parse_ncu_csv(no_duration)
    odd_unit = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","cycle"\n"0","k()","12"\n'
    with pytest.raises(ValueError, match="unknown unit 'cycle'"):
        parse_ncu_csv(odd_unit)


# ---------------------------------------------------------------- rocprofv3

def test_rocprofv3_command() -> None:
    assert build_rocprofv3_command("rocprofv3", ["./vector_add_bin"], Path("/tmp/prof"), ["--kernel-include-regex", "vector"]) == [
        "rocprofv3", "--kernel-trace", "--output-format", "csv", "-d", "/tmp/prof", "-o", "run",
        "--kernel-include-regex", "vector", "--", "./vector_add_bin",
    ]


def test_find_kernel_trace_files_both_layouts(tmp_path: Path) -> None:
    nested = tmp_path / "gpu-node-3" / "1893417_kernel_trace.csv"
    nested.parent.mkdir()
    nested.write_text("")
    flat = tmp_path / "run_kernel_trace.csv"
    flat.write_text("")
    (tmp_path / "run_agent_info.csv").write_text("")
    (tmp_path / "run_kernel_stats.csv").write_text("")
    assert find_kernel_trace_files(tmp_path) == sorted([nested, flat])


def test_parse_rocprofv3_kernel_trace() -> None:
    launches = parse_rocprofv3_kernel_trace(read("rocprofv3_vector_add_kernel_trace.csv"))
    assert len(launches) == 21
    fill = launches[0]
    assert fill.name == "__amd_rocclr_fillBufferAligned" and fill.helper
    assert fill.duration_ns == 63480 and fill.launch_id == 1
    first = launches[1]
    assert first == KernelLaunch(name="vector_add(float const*, float const*, float*, int)", duration_ns=201840.0,
                                 dram_read_bytes=None, dram_write_bytes=None, grid="(67108864, 1, 1)",
                                 block="(256, 1, 1)", launch_id=2, helper=False)


def test_rocprofv3_helpers_do_not_count() -> None:
    launches = parse_rocprofv3_kernel_trace(read("rocprofv3_vector_add_kernel_trace.csv"))
    [kernel] = aggregate_launches(launches)
    assert kernel["kernel_name"] == "vector_add(float const*, float const*, float*, int)"
    assert kernel["dispatch_count"] == 20
    assert kernel["duration_ns"]["total"] == 3833520 and kernel["duration_ns"]["median"] == 191180.0
    assert kernel["dram_bytes"] is None
    samples, note = iteration_samples_ns(launches)
    assert samples == HIP_DURATIONS
    assert note == "20 launches of vector_add(float const*, float const*, float*, int)"


def test_rocprofv3_rows_sorted_by_start_and_other_kinds_skipped() -> None:
    header = '"Kind","Agent_Id","Dispatch_Id","Kernel_Name","Start_Timestamp","End_Timestamp"'
    text = "\n".join([
        header,
        '"KERNEL_DISPATCH","Agent 4",3,"b(int)",3000,3500',
        '"KERNEL_DISPATCH","Agent 4",2,"a(int)",1000,1800',
        '"MEMORY_COPY","Agent 4",4,"",4000,4100',
    ])
    launches = parse_rocprofv3_kernel_trace(text)
    assert [(la.name, la.duration_ns, la.launch_id) for la in launches] == [("a(int)", 800.0, 2), ("b(int)", 500.0, 3)]
    assert launches[0].grid is None and launches[0].block is None


def test_parse_rocprof_v1_results_csv() -> None:
    launches = parse_rocprofv3_kernel_trace(read("rocprof_v1_results.csv"))
    assert [la.name for la in launches] == ["__amd_rocclr_fillBufferAligned"] + [
        "vector_add(float const*, float const*, float*, int)"] * 3
    assert launches[0].helper and not launches[1].helper
    assert [la.duration_ns for la in launches] == [63480, 201840, 191400, 190560]
    assert (launches[1].grid, launches[1].block, launches[1].launch_id) == ("67108864", "256", 1)


# ---------------------------------------------------------------- common

def test_helper_kernel_names() -> None:
    assert is_helper_kernel("__amd_rocclr_copyBuffer")
    assert is_helper_kernel("void __hip_fill_kernel<1>(unsigned char*, unsigned long)")
    assert not is_helper_kernel("vector_add(float const*, float const*, float*, int)")
    assert not is_helper_kernel("my__amd_rocclr_lookalike()")


def test_aggregate_and_samples_of_nothing() -> None:
    only_helpers = [launch("__amd_rocclr_fillBufferAligned", 10.0, 0)]
    assert aggregate_launches(only_helpers) == []
    assert iteration_samples_ns(only_helpers)[0] == []
