"""Tests of engine.hw: arch specs, tool-output parsers and GPU detection on recorded output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.hw import detect
from engine.hw.detect import (
    GPU_TOOLS,
    NVIDIA_SMI_FIELDS,
    GpuInfo,
    ToolInfo,
    detect_gpu,
    find_tool,
    first_meaningful_line,
    format_gpu_info,
    parse_amd_smi_static_json,
    parse_hipcc_version,
    parse_ncu_version,
    parse_nvcc_version,
    parse_nvidia_smi_csv,
    parse_nvidia_smi_cuda_version,
    parse_rocminfo,
    parse_rocprofv3_version,
    parse_tool_version,
    run_tool,
)
from engine.hw.specs import ARCH_SPECS, DTYPES, canonical_dtype, get_arch_spec, load_arch_spec_file

DATA = Path(__file__).resolve().parents[1] / "data" / "hw"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _no_visibility_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's or CI's own settings must not filter the recorded devices.
    for var in detect.VISIBILITY_VARS:
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------- specs


def test_required_specs_exist_and_are_consistent() -> None:
    assert {"A100", "H100", "H200", "B200", "MI300X", "MI325X", "MI355X"} <= set(ARCH_SPECS)
    for key, spec in ARCH_SPECS.items():
        assert spec.key == key
        assert spec.vendor in ("nvidia", "amd")
        assert spec.arch.startswith("sm_" if spec.vendor == "nvidia" else "gfx")
        assert set(spec.peak_tflops) <= set(DTYPES)
        assert all(v > 0 for v in spec.peak_tflops.values())
        assert spec.memory_bw_tbs > 0 and spec.memory_gb and spec.l2_cache_mb
        assert {"peak_tflops", "memory_bw_tbs", "l2_cache_mb"} <= set(spec.sources)
        assert set(spec.measured) == set(spec.measured_sources)


@pytest.mark.parametrize(
    ("key", "dtype", "tflops"),
    [
        ("H200", "bf16", 989.4), ("H200", "fp8", 1978.9), ("H200", "tf32", 494.7),
        ("H200", "fp32", 66.9), ("H200", "fp64", 33.5), ("H200", "fp64_tensor", 66.9),
        ("H100", "bf16", 989.4), ("H100", "fp8", 1978.9),
        ("A100", "bf16", 312), ("A100", "tf32", 156), ("A100", "fp32", 19.5), ("A100", "fp64", 9.7),
        ("B200", "bf16", 2250), ("B200", "fp8", 4500), ("B200", "fp4", 9000), ("B200", "tf32", 1100),
        ("B200", "fp64", 40),
        ("MI300X", "bf16", 1307.4), ("MI300X", "fp16", 1307.4), ("MI300X", "fp8", 2614.9),
        ("MI300X", "tf32", 653.7), ("MI300X", "fp32", 163.4), ("MI300X", "fp64", 81.7),
        ("MI325X", "bf16", 1307.4),
        ("MI355X", "bf16", 2516.6), ("MI355X", "fp8", 5033.2), ("MI355X", "fp4", 10066.3),
        ("MI355X", "fp32", 157.3), ("MI355X", "fp64", 78.6),
    ],
)
def test_dense_peaks(key: str, dtype: str, tflops: float) -> None:
    assert ARCH_SPECS[key].peak_tflops[dtype] == tflops


@pytest.mark.parametrize(
    ("key", "bw", "memory_gb", "arch"),
    [
        ("A100", 2.039, 80, "sm_80"), ("H100", 3.35, 80, "sm_90"), ("H200", 4.8, 141, "sm_90"),
        ("B200", 8.0, 180, "sm_100"), ("MI300X", 5.3, 192, "gfx942"), ("MI325X", 6.0, 256, "gfx942"),
        ("MI355X", 8.0, 288, "gfx950"),
    ],
)
def test_memory_and_arch(key: str, bw: float, memory_gb: float, arch: str) -> None:
    spec = ARCH_SPECS[key]
    assert (spec.memory_bw_tbs, spec.memory_gb, spec.arch) == (bw, memory_gb, arch)


def test_amd_peaks_follow_from_cu_count_and_clock() -> None:
    # CDNA3 matrix cores: 2048 dense fp16 FLOP/clock/CU; CDNA4: 4096 fp16, 8192 fp8, 16384 fp4.
    assert ARCH_SPECS["MI300X"].peak_tflops["bf16"] == pytest.approx(304 * 2.1e9 * 2048 / 1e12, abs=0.05)
    assert ARCH_SPECS["MI355X"].peak_tflops["bf16"] == pytest.approx(256 * 2.4e9 * 4096 / 1e12, abs=0.05)
    assert ARCH_SPECS["MI355X"].peak_tflops["fp8"] == pytest.approx(256 * 2.4e9 * 8192 / 1e12, abs=0.05)
    assert ARCH_SPECS["MI355X"].peak_tflops["fp4"] == pytest.approx(256 * 2.4e9 * 16384 / 1e12, abs=0.05)


def test_sources_say_where_dense_was_derived_and_what_the_last_level_cache_is() -> None:
    assert "dense = sparse/2" in ARCH_SPECS["H200"].sources["peak_tflops"]
    assert "dense = sparse/2" in ARCH_SPECS["B200"].sources["peak_tflops"]
    for key in ("MI300X", "MI325X", "MI355X"):
        assert ARCH_SPECS[key].l2_cache_mb == 256
        assert "Infinity Cache" in ARCH_SPECS[key].sources["l2_cache_mb"]


def test_h200_measured_ceilings() -> None:
    h200 = ARCH_SPECS["H200"]
    assert h200.measured == {"memory_bw_tbs": 4.3, "bf16": 788.0}
    for key in ("memory_bw_tbs", "bf16"):
        assert "measured on a lent NVIDIA H200, torch 2.11, 2026-10-28" in h200.measured_sources[key]
    assert h200.ceiling_bandwidth_tbs() == 4.3
    assert h200.ceiling_tflops_for("bfloat16") == 788.0
    assert h200.ceiling_tflops_for("fp8") == 1978.9  # no measurement: the datasheet figure
    assert h200.peak_tflops_for("bf16") == 989.4  # the peak stays the datasheet's
    assert ARCH_SPECS["H100"].ceiling_bandwidth_tbs() == 3.35


@pytest.mark.parametrize(
    ("query", "key"),
    [
        # keys, any case
        ("h200", "H200"), ("H100", "H100"), ("mi300x", "MI300X"), ("Mi355x", "MI355X"),
        ("h100-pcie", "H100-PCIe"), ("H100_PCIE", "H100-PCIe"), ("l40s", "L40S"), ("mi250x", "MI250X"),
        # names as nvidia-smi / torch print them
        ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA B200", "B200"), ("NVIDIA L40S", "L40S"),
        ("nvidia h200", "H200"), ("  NVIDIA H200  ", "H200"),
        # names as amd-smi / rocminfo / torch on ROCm print them
        ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI325X", "MI325X"), ("AMD Instinct MI355X", "MI355X"),
        ("AMD Instinct MI250X", "MI250X"),
        # archs
        ("gfx942", "MI300X"), ("gfx950", "MI355X"), ("gfx90a", "MI250X"), ("sm_90", "H100"),
        ("sm_80", "A100"), ("sm_100", "B200"), ("sm_89", "L40S"), ("gfx942:sramecc+:xnack-", "MI300X"),
        ("sm_90a", "H100"), ("SM90", "H100"), ("compute_90", "H100"), ("sm_100a", "B200"),
    ],
)
def test_get_arch_spec_aliases(query: str, key: str) -> None:
    spec = get_arch_spec(query)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize("key", sorted(ARCH_SPECS))
def test_every_name_and_alias_finds_its_own_spec(key: str) -> None:
    spec = ARCH_SPECS[key]
    for name in (spec.key, spec.name, *spec.aliases):
        assert get_arch_spec(name) is spec, name


@pytest.mark.parametrize(
    "query",
    ["", "   ", "NVIDIA H100 NVL", "NVIDIA GeForce RTX 4090", "AMD Instinct MI308X", "gfx1100", "sm_75", "H2000"],
)
def test_get_arch_spec_unknown(query: str) -> None:
    assert get_arch_spec(query) is None


@pytest.mark.parametrize(
    ("alias", "canon"),
    [
        ("float16", "fp16"), ("half", "fp16"), ("fp16", "fp16"), ("torch.float16", "fp16"),
        ("bfloat16", "bf16"), ("BF16", "bf16"), ("torch.bfloat16", "bf16"),
        ("float32", "fp32"), ("float", "fp32"), ("fp32", "fp32"),
        ("tf32", "tf32"), ("tensorfloat32", "tf32"),
        ("float64", "fp64"), ("double", "fp64"), ("fp64_tensor", "fp64_tensor"),
        ("e4m3", "fp8"), ("fp8_e4m3", "fp8"), ("fp8-e4m3", "fp8"), ("e5m2", "fp8"),
        ("float8_e4m3fn", "fp8"), ("torch.float8_e5m2", "fp8"), ("float8_e4m3fnuz", "fp8"),
        ("int8", "int8"), ("fp4", "fp4"), ("e2m1", "fp4"), ("nvfp4", "fp4"),
    ],
)
def test_dtype_aliases(alias: str, canon: str) -> None:
    assert canonical_dtype(alias) == canon
    b200 = ARCH_SPECS["B200"]
    assert b200.peak_tflops_for(alias) == b200.peak_tflops[canon]


def test_unsupported_or_unknown_dtypes_have_no_peak() -> None:
    assert ARCH_SPECS["A100"].peak_tflops_for("fp8") is None  # Ampere has no FP8 tensor cores
    assert ARCH_SPECS["MI355X"].peak_tflops_for("tf32") is None  # CDNA 4 dropped TF32
    assert ARCH_SPECS["H200"].peak_tflops_for("complex64") is None
    assert ARCH_SPECS["H200"].ridge_point("complex64") is None
    assert ARCH_SPECS["A100"].ridge_point("e4m3") is None


def test_ridge_point_arithmetic() -> None:
    h200 = ARCH_SPECS["H200"]
    assert h200.ridge_point("bf16") == pytest.approx(989.4 / 4.8)  # 206.1 FLOP/byte
    assert h200.ridge_point("bfloat16", measured=True) == pytest.approx(788.0 / 4.3)
    assert h200.ridge_point("fp8", measured=True) == pytest.approx(1978.9 / 4.3)  # mixed ceilings
    assert ARCH_SPECS["MI300X"].ridge_point("fp8") == pytest.approx(2614.9 / 5.3)
    assert ARCH_SPECS["A100"].ridge_point("float32") == pytest.approx(19.5 / 2.039)


@pytest.mark.parametrize("key", sorted(ARCH_SPECS))
def test_to_dict_round_trips_through_a_spec_file(key: str, tmp_path: Path) -> None:
    spec = ARCH_SPECS[key]
    path = tmp_path / f"{key}.json"
    path.write_text(json.dumps(spec.to_dict()))
    assert load_arch_spec_file(path) == spec


def test_load_minimal_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.json"
    path.write_text(json.dumps({"memory_bw_tbs": 2.5, "peak_tflops": {"bfloat16": 500, "float32": 60}}))
    spec = load_arch_spec_file(path)
    assert (spec.key, spec.name, spec.vendor) == ("my-gpu", "my-gpu", "")
    assert spec.peak_tflops == {"bf16": 500.0, "fp32": 60.0}
    assert spec.ridge_point("bf16") == pytest.approx(200.0)
    assert spec.l2_cache_mb is None and spec.measured == {}


VALID = {"memory_bw_tbs": 3.0, "peak_tflops": {"bf16": 1.0}}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"memory_bw_tbs": 3.0}, ["field 'peak_tflops'", "required"]),
        ({"peak_tflops": {"bf16": 1.0}}, ["field 'memory_bw_tbs'", "required"]),
        ({**VALID, "memory_bw_tbs": "fast"}, ["field 'memory_bw_tbs'", "positive number", "'fast'"]),
        ({**VALID, "memory_bw_tbs": -1}, ["field 'memory_bw_tbs'", "positive number"]),
        ({**VALID, "memory_bw_tbs": True}, ["field 'memory_bw_tbs'", "positive number"]),
        ({**VALID, "peak_tflops": {}}, ["field 'peak_tflops'", "non-empty"]),
        ({**VALID, "peak_tflops": [1.0]}, ["field 'peak_tflops'", "object"]),
        ({**VALID, "peak_tflops": {"bf17": 1.0}}, ["field 'peak_tflops.bf17'", "dtype", "bf16"]),
        ({**VALID, "peak_tflops": {"bf16": "lots"}}, ["field 'peak_tflops.bf16'", "positive number"]),
        ({"memroy_bw_tbs": 3.0, "peak_tflops": {"bf16": 1.0}}, ["field 'memroy_bw_tbs'", "unknown field"]),
        ({**VALID, "vendor": "intel"}, ["field 'vendor'", '"nvidia" or "amd"']),
        ({**VALID, "arch": 90}, ["field 'arch'", "a string"]),
        ({**VALID, "l2_cache_mb": 0}, ["field 'l2_cache_mb'", "positive"]),
        ({**VALID, "measured": {"copy": 2.0}}, ["field 'measured.copy'", "memory_bw_tbs"]),
        ({**VALID, "measured_sources": {"bf16": 7}}, ["field 'measured_sources'", "object of strings"]),
        ({**VALID, "aliases": "H9"}, ["field 'aliases'", "list of strings"]),
        ([1, 2], ["expected a JSON object"]),
    ],
)
def test_load_spec_file_errors_name_file_and_field(content: object, expected: list[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError) as err:
        load_arch_spec_file(path)
    message = str(err.value)
    assert str(path) in message
    for part in expected:
        assert part in message


def test_load_spec_file_unreadable_or_not_json(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ValueError, match=r"missing\.json: cannot read"):
        load_arch_spec_file(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{memory_bw_tbs: 3")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON"):
        load_arch_spec_file(broken)


# --------------------------------------------------------------------------- parsers


def test_parse_nvidia_smi_csv_h200_capture() -> None:
    (dev,) = parse_nvidia_smi_csv(read("nvidia_smi_h200.csv"))
    assert dev.index == 0 and dev.name == "NVIDIA H200" and dev.vendor == "nvidia"
    assert dev.arch == "sm_90"
    assert dev.memory_mb == 143771
    assert dev.driver == "580.159.04"
    assert dev.pci_bus_id == "00000000:00:06.0"
    assert dev.uuid == "GPU-2107e1ac-16d9-7e5a-839b-b1b1fbaa8146"


def test_parse_nvidia_smi_csv_two_gpus() -> None:
    devs = parse_nvidia_smi_csv(read("nvidia_smi_2gpu.csv"))
    assert [d.index for d in devs] == [0, 1]
    assert [d.pci_bus_id for d in devs] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert all(d.arch == "sm_90" and d.memory_mb == 81559 for d in devs)


def test_parse_nvidia_smi_csv_without_compute_cap_uses_the_spec_arch() -> None:
    (dev,) = parse_nvidia_smi_csv(read("nvidia_smi_old_driver.csv"))
    assert (dev.name, dev.arch, dev.memory_mb, dev.driver) == ("NVIDIA A100-SXM4-80GB", "sm_80", 81920, "470.182.03")


def test_parse_nvidia_smi_csv_na_compute_cap() -> None:
    text = (
        "0, NVIDIA H200, [N/A], 143771, 580.159.04, 00000000:00:06.0, GPU-1\n"
        "1, NVIDIA Mystery GPU, [N/A], [N/A], 580.159.04, 00000000:00:07.0, [N/A]\n"
    )
    h200, mystery = parse_nvidia_smi_csv(text)
    assert h200.arch == "sm_90"
    assert (mystery.arch, mystery.memory_mb, mystery.uuid) == (None, None, None)


def test_parse_nvidia_smi_csv_skips_error_text() -> None:
    assert parse_nvidia_smi_csv(read("nvidia_smi_no_compute_cap_error.txt")) == []
    assert parse_nvidia_smi_csv("No devices were found\n") == []


def test_parse_nvidia_smi_cuda_version() -> None:
    assert parse_nvidia_smi_cuda_version(read("nvidia_smi_h200.txt")) == "13.0"
    assert parse_nvidia_smi_cuda_version("garbage") is None


def test_parse_rocminfo_skips_cpu_agents() -> None:
    devs = parse_rocminfo(read("rocminfo_mi300x.txt"))
    assert len(devs) == 2
    assert [d.index for d in devs] == [0, 1]
    for d in devs:
        assert (d.name, d.vendor, d.arch, d.driver) == ("AMD Instinct MI300X", "amd", "gfx942", "6.8.5")
        assert d.memory_mb == 201310208 // 1024  # 196592 MiB of the first (VRAM) pool
    assert [d.uuid for d in devs] == ["GPU-07386a321fa45d1e", "GPU-c14abb436c69353f"]


def test_parse_rocminfo_without_marketing_name_or_driver_version() -> None:
    text = "ROCk module is loaded\n*******\nAgent 1\n*******\n  Name:  gfx950\n  Device Type:  GPU\n"
    (dev,) = parse_rocminfo(text)
    assert (dev.name, dev.arch, dev.driver, dev.memory_mb) == ("gfx950", "gfx950", None, None)


def test_parse_amd_smi_static_json_list_form() -> None:
    devs = parse_amd_smi_static_json(read("amd_smi_static_mi300x.json"))
    assert [(d.index, d.name, d.arch, d.memory_mb, d.driver) for d in devs] == [
        (0, "AMD Instinct MI300X", "gfx942", 196592, "6.8.5"),
        (1, "AMD Instinct MI300X", "gfx942", 196592, "6.8.5"),
    ]
    assert [d.pci_bus_id for d in devs] == ["0000:1b:00.0", "0000:3d:00.0"]


def test_parse_amd_smi_static_json_gpu_data_form() -> None:
    (dev,) = parse_amd_smi_static_json(read("amd_smi_static_mi355x.json"))
    assert (dev.name, dev.arch, dev.memory_mb, dev.driver) == ("AMD Instinct MI355X", "gfx950", 294896, None)
    assert dev.pci_bus_id == "0000:05:00.0"


def test_parse_amd_smi_static_json_odd_values() -> None:
    text = json.dumps(
        [
            {"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X", "target_graphics_version": "N/A"},
             "vram": {"size": "196592 MB"}},
            {"gpu": 1, "asic": {"market_name": "AMD Instinct MI325X"}, "vram": {"size": {"value": 256, "unit": "GB"}}},
        ]
    )
    a, b = parse_amd_smi_static_json(text)
    assert (a.arch, a.memory_mb) == ("gfx942", 196592)  # arch from the spec of the name
    assert (b.arch, b.memory_mb) == ("gfx942", 262144)
    assert parse_amd_smi_static_json("WARNING: not json") == []
    assert parse_amd_smi_static_json(json.dumps({"gpu_data": []})) == []


def test_version_parsers() -> None:
    assert parse_nvcc_version(read("nvcc_version.txt")) == "13.0"
    assert parse_hipcc_version(read("hipcc_version.txt")) == "6.2.41133"
    assert parse_ncu_version(read("ncu_version.txt")) == "2025.3.1.0"
    assert parse_rocprofv3_version(read("rocprofv3_version.txt")) == "0.5.0"
    assert parse_tool_version("compute-sanitizer", read("compute_sanitizer_version.txt")) == "2025.3.1.0"
    assert parse_tool_version("nsys", read("nsys_version.txt")) == "2025.3.2.474-253236389321v0"
    assert parse_tool_version("rocprof-compute", "rocprofiler-compute version: 3.1.0\n") == "3.1.0"
    banner = "\nCopyright (c) 2025 X\n-----\nMystery Tool build 7\n"
    assert parse_tool_version("mystery", banner) == "Mystery Tool build 7"
    assert first_meaningful_line("\n \n") is None
    assert parse_nvcc_version("") is None and parse_hipcc_version("") is None


# --------------------------------------------------------------------------- detection

NV_QUERY = "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS)
NV_QUERY_OLD = "--query-gpu=" + ",".join(f for f in NVIDIA_SMI_FIELDS if f != "compute_cap")
CSV_FMT = "--format=csv,noheader,nounits"
FAKE_BIN = "/opt/fake/bin"


class FakeTools:
    """Replays recorded outputs: a tool exists when some output is recorded for it."""

    def __init__(self, outputs: dict[tuple[str, ...], tuple[int, str] | BaseException]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[str, ...]] = []

    def which(self, name: str) -> str | None:
        return f"{FAKE_BIN}/{name}" if any(k[0] == name for k in self.outputs) else None

    def run(self, argv: Sequence[str]) -> tuple[int, str]:
        assert argv[0].startswith(FAKE_BIN)
        key = (os.path.basename(argv[0]), *argv[1:])
        self.calls.append(key)
        result = self.outputs.get(key, (1, ""))
        if isinstance(result, BaseException):
            raise result
        return result


def nvidia_outputs(csv: str = "nvidia_smi_h200.csv") -> dict[tuple[str, ...], tuple[int, str] | BaseException]:
    return {
        ("nvidia-smi", NV_QUERY, CSV_FMT): (0, read(csv)),
        ("nvidia-smi",): (0, read("nvidia_smi_h200.txt")),
        ("nvcc", "--version"): (0, read("nvcc_version.txt")),
        ("ncu", "--version"): (0, read("ncu_version.txt")),
        ("compute-sanitizer", "--version"): (0, read("compute_sanitizer_version.txt")),
    }


def amd_outputs() -> dict[tuple[str, ...], tuple[int, str] | BaseException]:
    return {
        ("amd-smi", "static", "--json"): (0, read("amd_smi_static_mi300x.json")),
        ("amd-smi", "version"): (0, read("amd_smi_version_rocm6.txt")),
        ("rocminfo",): (0, read("rocminfo_mi300x.txt")),
        ("hipcc", "--version"): (0, read("hipcc_version.txt")),
        ("rocprofv3", "--version"): (0, read("rocprofv3_version.txt")),
    }


def detect_with(outputs: dict[tuple[str, ...], tuple[int, str] | BaseException]) -> tuple[GpuInfo | None, FakeTools]:
    fake = FakeTools(outputs)
    return detect_gpu(runner=fake.run, which=fake.which), fake


H200_TEXT = f"""Vendor: NVIDIA
GPU: NVIDIA H200 (x1)
Memory: 143771 MiB
Architecture: sm_90
Driver: 580.159.04
Runtime: CUDA 13.0
Compiler: nvcc 13.0 ({FAKE_BIN}/nvcc)
Profiler: ncu 2025.3.1.0 ({FAKE_BIN}/ncu)
Profiler: compute-sanitizer 2025.3.1.0 ({FAKE_BIN}/compute-sanitizer)
Arch spec: H200 — 4.8 TB/s, bf16 989.4 TFLOP/s dense (datasheet); measured 4.3 TB/s, bf16 788 TFLOP/s"""


def test_detect_nvidia_h200() -> None:
    info, fake = detect_with(nvidia_outputs())
    assert info is not None
    assert (info.vendor, info.name, info.arch, info.driver, info.runtime) == (
        "nvidia", "NVIDIA H200", "sm_90", "580.159.04", "CUDA 13.0",
    )
    assert info.compiler == ToolInfo("nvcc", f"{FAKE_BIN}/nvcc", "13.0")
    assert [p.name for p in info.profilers] == ["ncu", "compute-sanitizer"]  # nsys is not installed
    assert info.spec is ARCH_SPECS["H200"]
    assert format_gpu_info(info) == H200_TEXT
    assert NV_QUERY_OLD not in {c[1] for c in fake.calls if len(c) > 1}
    json.dumps(info.to_dict())  # serialisable as is


def test_detect_nvidia_old_driver_retries_without_compute_cap() -> None:
    outputs = nvidia_outputs()
    outputs[("nvidia-smi", NV_QUERY, CSV_FMT)] = (2, read("nvidia_smi_no_compute_cap_error.txt"))
    outputs[("nvidia-smi", NV_QUERY_OLD, CSV_FMT)] = (0, read("nvidia_smi_old_driver.csv"))
    info, fake = detect_with(outputs)
    assert info is not None
    assert (info.name, info.arch, info.driver) == ("NVIDIA A100-SXM4-80GB", "sm_80", "470.182.03")
    assert info.spec is ARCH_SPECS["A100"]
    assert ("nvidia-smi", NV_QUERY_OLD, CSV_FMT) in fake.calls


def test_detect_nvidia_unknown_model_gets_no_spec() -> None:
    outputs = nvidia_outputs()
    outputs[("nvidia-smi", NV_QUERY, CSV_FMT)] = (
        0, "0, NVIDIA H100 NVL, 9.0, 95830, 580.159.04, 00000000:00:06.0, GPU-1\n",
    )
    info, _ = detect_with(outputs)
    assert info is not None and info.arch == "sm_90"
    assert info.spec is None  # not the H100 SXM's peaks just because the arch matches
    assert "Arch spec: none known for 'NVIDIA H100 NVL' (sm_90)" in format_gpu_info(info)


def test_detect_amd_with_amd_smi() -> None:
    info, fake = detect_with(amd_outputs())
    assert info is not None
    assert (info.vendor, info.name, info.arch, info.driver, info.runtime) == (
        "amd", "AMD Instinct MI300X", "gfx942", "6.8.5", "ROCm 6.3.1",
    )
    assert len(info.devices) == 2
    assert info.compiler == ToolInfo("hipcc", f"{FAKE_BIN}/hipcc", "6.2.41133")
    assert info.profilers == [ToolInfo("rocprofv3", f"{FAKE_BIN}/rocprofv3", "0.5.0")]
    assert info.spec is ARCH_SPECS["MI300X"]
    assert ("rocminfo",) not in fake.calls  # amd-smi answered
    text = format_gpu_info(info)
    assert text.splitlines()[:2] == ["Vendor: AMD", "GPU: AMD Instinct MI300X (x2)"]
    assert "Arch spec: MI300X — 5.3 TB/s, bf16 1307.4 TFLOP/s dense (datasheet)" in text


def test_detect_amd_falls_back_to_rocminfo() -> None:
    outputs = amd_outputs()
    outputs[("amd-smi", "static", "--json")] = (1, "ERROR:root:Unable to detect any GPU devices")
    info, fake = detect_with(outputs)
    assert info is not None
    assert [d.uuid for d in info.devices] == ["GPU-07386a321fa45d1e", "GPU-c14abb436c69353f"]
    assert (info.driver, info.runtime) == ("6.8.5", "HIP 6.2.41133")  # runtime from hipcc
    assert ("rocminfo",) in fake.calls
    assert ("amd-smi", "version") not in fake.calls  # a failing amd-smi is not asked again


def test_detect_amd_gpu_data_form_takes_driver_from_amd_smi_version() -> None:
    outputs = amd_outputs()
    outputs[("amd-smi", "static", "--json")] = (0, read("amd_smi_static_mi355x.json"))
    outputs[("amd-smi", "version")] = (0, read("amd_smi_version_rocm7.txt"))
    info, _ = detect_with(outputs)
    assert info is not None
    assert (info.name, info.arch, info.driver, info.runtime) == (
        "AMD Instinct MI355X", "gfx950", "6.16.13", "ROCm 7.2.1",
    )
    assert info.spec is ARCH_SPECS["MI355X"]


def test_detect_amd_without_marketing_name_uses_the_arch_spec() -> None:
    rocminfo = "ROCk module is loaded\n*******\nAgent 1\n*******\n  Name:  gfx950\n  Device Type:  GPU\n"
    info, _ = detect_with({("rocminfo",): (0, rocminfo)})
    assert info is not None and info.name == "gfx950"
    assert info.spec is ARCH_SPECS["MI355X"]


def test_detect_none_when_no_tool_or_no_gpu() -> None:
    info, fake = detect_with({})
    assert info is None and fake.calls == []
    broken_driver = (
        9,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n",
    )
    info, _ = detect_with({("nvidia-smi", NV_QUERY, CSV_FMT): broken_driver, ("nvcc", "--version"): (0, "x")})
    assert info is None
    info, _ = detect_with({("rocminfo",): (0, "ROCk module is loaded\n*******\nAgent 1\n  Device Type: CPU\n")})
    assert info is None


def test_detect_survives_a_tool_that_times_out_or_cannot_start() -> None:
    outputs = amd_outputs()
    outputs[("nvidia-smi", NV_QUERY, CSV_FMT)] = subprocess.TimeoutExpired("nvidia-smi", 10)
    outputs[("rocprofv3", "--version")] = PermissionError("not executable")
    info, fake = detect_with(outputs)
    assert info is not None and info.vendor == "amd"
    # A hung nvidia-smi is not asked again (the no-compute_cap retry is for its error message only).
    assert [c for c in fake.calls if c[0] == "nvidia-smi"] == [("nvidia-smi", NV_QUERY, CSV_FMT)]
    assert info.profilers == [ToolInfo("rocprofv3", f"{FAKE_BIN}/rocprofv3", None)]
    assert f"Profiler: rocprofv3 (version unknown) ({FAKE_BIN}/rocprofv3)" in format_gpu_info(info)


def test_detect_with_the_real_runner_kills_a_hung_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "child.pid"
    hung = tmp_path / "nvidia-smi"
    hung.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nwait\n")
    hung.chmod(0o755)
    monkeypatch.setattr(detect, "TOOL_TIMEOUT_S", 0.5)
    start = time.monotonic()
    info = detect_gpu(which=lambda name: str(hung) if name == "nvidia-smi" else None)
    assert info is None
    assert time.monotonic() - start < 5
    # The tool's own child went with it: the whole process group was killed (SIGKILL is delivered
    # at once, but a loaded machine may take a moment to reap it; a survivor would sleep 60 s).
    stat = Path(f"/proc/{pid_file.read_text().strip()}/stat")
    deadline = time.monotonic() + 5
    while stat.exists() and not stat.read_text().split(") ")[1].startswith("Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")


def test_run_tool() -> None:
    assert run_tool(["/nonexistent/tool", "--version"]) == (127, "")
    assert run_tool([sys.executable, "-c", "print('hi')"]) == (0, "hi\n")
    # Output on stderr only (some tools print their version there) is returned.
    assert run_tool([sys.executable, "-c", "import sys; sys.stderr.write('v1.2\\n'); sys.exit(3)"]) == (3, "v1.2\n")


def test_run_tool_hides_visibility_vars_from_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("PATH_CHECK", "kept")
    code, out = run_tool(
        [sys.executable, "-c", "import os; print(os.environ.get('ROCR_VISIBLE_DEVICES'), os.environ['PATH_CHECK'])"]
    )
    assert (code, out) == (0, "None kept\n")


@pytest.mark.parametrize(
    ("value", "buses"),
    [
        ("1", ["00000000:2A:00.0"]),
        ("1,0", ["00000000:2A:00.0", "00000000:18:00.0"]),
        (" 0 , 1 ", ["00000000:18:00.0", "00000000:2A:00.0"]),
        ("0,5,1", ["00000000:18:00.0"]),  # CUDA ignores everything from the first invalid index
        ("GPU-a39d7e02-64b1-1f8c-5e2a-c8d0b7f61e42", ["00000000:18:00.0", "00000000:2A:00.0"]),  # UUIDs: not applied
    ],
)
def test_cuda_visible_devices_filters_and_renumbers(
    value: str, buses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    info, _ = detect_with(nvidia_outputs("nvidia_smi_2gpu.csv"))
    assert info is not None
    assert [d.pci_bus_id for d in info.devices] == buses
    assert [d.index for d in info.devices] == list(range(len(buses)))


@pytest.mark.parametrize("value", ["", "-1", "7"])
def test_cuda_visible_devices_hiding_every_gpu(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    info, _ = detect_with(nvidia_outputs("nvidia_smi_2gpu.csv"))
    assert info is None
    text = format_gpu_info(info, tools=[], which=lambda name: None)
    assert f"Note: CUDA_VISIBLE_DEVICES={value!r} is set" in text


@pytest.mark.parametrize(
    ("env", "uuids"),
    [
        ({"ROCR_VISIBLE_DEVICES": "1"}, ["GPU-c14abb436c69353f"]),
        ({"HIP_VISIBLE_DEVICES": "1,0"}, ["GPU-c14abb436c69353f", "GPU-07386a321fa45d1e"]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, ["GPU-c14abb436c69353f"]),  # HIP reads it too
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, ["GPU-07386a321fa45d1e"]),  # HIP_ wins
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"}, ["GPU-c14abb436c69353f"]),  # applied in turn
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}, []),
    ],
)
def test_amd_visibility_vars(env: dict[str, str], uuids: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    outputs = amd_outputs()
    outputs[("amd-smi", "static", "--json")] = (1, "")  # rocminfo carries the uuids
    info, _ = detect_with(outputs)
    if not uuids:
        assert info is None
        return
    assert info is not None
    assert [d.uuid for d in info.devices] == uuids
    assert [d.index for d in info.devices] == list(range(len(uuids)))


def test_format_no_gpu() -> None:
    tools = [ToolInfo("nvcc", "/usr/local/cuda/bin/nvcc", "13.0")]
    lines = format_gpu_info(None, tools=tools, which=lambda name: None).splitlines()
    assert lines[0] == "No GPU detected"
    assert lines[1] == "Looked for: nvidia-smi (not found), amd-smi (not found), rocminfo (not found)"
    assert lines[2].startswith("Searched: PATH, ") and "/usr/local/cuda/bin" in lines[2]
    assert lines[3:] == ["Compiler: nvcc 13.0 (/usr/local/cuda/bin/nvcc)", "Profiler: not found"]


def test_format_no_gpu_with_a_gpu_tool_that_found_nothing() -> None:
    which = {"nvidia-smi": "/usr/bin/nvidia-smi"}.get
    tools = [ToolInfo("ncu", "/usr/local/cuda/bin/ncu", "2025.3.1.0")]
    lines = format_gpu_info(None, tools=tools, which=which).splitlines()
    assert lines[0] == "No GPU detected"
    assert "nvidia-smi (/usr/bin/nvidia-smi: no GPU reported)" in lines[1]
    assert lines[3:] == ["Compiler: not found", "Profiler: ncu 2025.3.1.0 (/usr/local/cuda/bin/ncu)"]


def test_detect_gpu_for_real_on_this_machine() -> None:
    info = detect_gpu()  # must not raise, whatever is installed
    has_gpu_tool = any(find_tool(t) for t in GPU_TOOLS)
    if not has_gpu_tool:
        assert info is None
    text = format_gpu_info(info)
    if info is None:
        assert text.splitlines()[0] == "No GPU detected"
        nvcc = find_tool("nvcc")
        if nvcc:
            assert any(line.startswith("Compiler: nvcc ") and f"({nvcc})" in line for line in text.splitlines())
