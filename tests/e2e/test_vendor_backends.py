"""The NVIDIA (ncu) and AMD (rocprofv3) timing paths, end to end through the CLI, on a machine
without a GPU: stand-in executables on PATH replay recorded tool output (tests/data), while the
testcase itself really runs under them."""

import os
import stat
import sys
from pathlib import Path

import pytest

from conftest import REPO, read_report, run_magpie

DATA = REPO / "tests" / "data"

FAKE_NCU = r'''#!{py}
import shutil, subprocess, sys
args = sys.argv[1:]
if args == ["--version"]:
    sys.stdout.write(open("{data}/hw/ncu_version.txt").read()); sys.exit(0)
log = args[args.index("--log-file") + 1]
assert "--clock-control" in args and args[args.index("--clock-control") + 1] == "none"
rc = subprocess.call(args[args.index("--") + 1:])   # the testcase really runs
shutil.copy("{data}/profilers/ncu_raw_vectoradd_scale.csv", log)
sys.exit(rc)
'''

FAKE_ROCPROFV3 = r'''#!{py}
import os, shutil, socket, subprocess, sys
args = sys.argv[1:]
if args == ["--version"]:
    sys.stdout.write(open("{data}/hw/rocprofv3_version.txt").read()); sys.exit(0)
assert "--kernel-trace" in args
out = args[args.index("-d") + 1]
rc = subprocess.call(args[args.index("--") + 1:])
os.makedirs(os.path.join(out, socket.gethostname()), exist_ok=True)
shutil.copy("{data}/profilers/rocprofv3_vector_add_kernel_trace.csv",
            os.path.join(out, socket.gethostname(), "%d_kernel_trace.csv" % os.getpid()))
sys.exit(rc)
'''

FAKE_CAT = '#!/bin/sh\ncase "$*" in {cases} *) exit 1 ;; esac\n'


def _tool(folder: Path, name: str, text: str) -> None:
    p = folder / name
    p.write_text(text)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def nvidia_box(tmp_path):
    bin_dir = tmp_path / "nvidia_bin"
    bin_dir.mkdir()
    _tool(bin_dir, "ncu", FAKE_NCU.format(py=sys.executable, data=DATA))
    cases = (f'*--query-gpu*) cat {DATA}/hw/nvidia_smi_h200.csv ;; '
             f'"") cat {DATA}/hw/nvidia_smi_h200.txt ;;')
    _tool(bin_dir, "nvidia-smi", FAKE_CAT.format(cases=cases))
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def amd_box(tmp_path):
    bin_dir = tmp_path / "amd_bin"
    bin_dir.mkdir()
    _tool(bin_dir, "rocprofv3", FAKE_ROCPROFV3.format(py=sys.executable, data=DATA))
    _tool(bin_dir, "amd-smi", FAKE_CAT.format(cases=(
        f'"static --json") cat {DATA}/hw/amd_smi_static_mi300x.json ;; '
        f'"version"*) cat {DATA}/hw/amd_smi_version_rocm6.txt ;;')))
    _tool(bin_dir, "rocminfo", FAKE_CAT.format(cases=f'"") cat {DATA}/hw/rocminfo_mi300x.txt ;;'))
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_gpu_info_reads_the_tools(nvidia_box, amd_box):
    nv = run_magpie("--gpu-info", env=nvidia_box)
    assert nv.returncode == 0 and "NVIDIA H200" in nv.stdout and "sm_90" in nv.stdout and "ncu" in nv.stdout
    amd = run_magpie("--gpu-info", env=amd_box)
    assert amd.returncode == 0 and "MI300X" in amd.stdout and "gfx942" in amd.stdout and "rocprofv3" in amd.stdout


def test_cuda_kernel_timed_by_ncu(tmp_path, write_yaml, nvidia_box):
    cfg = write_yaml(f"""
kernel:
  id: vector_pair
  type: cuda
  testcase_command: "echo PASSED: All 1024 elements correct. > {tmp_path}/ran"
""")
    proc = run_magpie("analyze", "-k", cfg, "-o", tmp_path / "out", env=nvidia_box)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "ran").read_text().startswith("PASSED")  # the testcase ran under the profiler
    (res,) = read_report(tmp_path / "out")["results"]
    perf = res["performance_result"]
    assert perf["backend"] == "ncu" and "--clock-control none" in perf["command"]
    names = [k["kernel_name"] for k in perf["kernels"]]
    assert len(names) == 2 and any(n.startswith("vectorAdd") for n in names)
    assert res["timing"]["n"] == perf["kernels"][0]["dispatch_count"]
    assert "sum" in perf["samples_note"] or "launches" in perf["samples_note"]
    s = perf["summary"]
    assert s["peak_bandwidth_tbs"] == 4.8
    assert s["pct_of_peak_bandwidth"] == pytest.approx(100 * s["achieved_bandwidth_tbs"] / 4.8)
    env = read_report(tmp_path / "out")["environment"]
    assert env["gpu"]["name"] == "NVIDIA H200" and env["driver"] == "580.159.04"


def test_hip_kernel_timed_by_rocprofv3(tmp_path, write_yaml, amd_box):
    cfg = write_yaml("""
kernel:
  id: vector_add_hip
  type: hip
  testcase_command: "echo PASSED: All 1024 elements correct."
""")
    proc = run_magpie("analyze", "-k", cfg, "-o", tmp_path / "out", env=amd_box)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (res,) = read_report(tmp_path / "out")["results"]
    perf = res["performance_result"]
    assert perf["backend"] == "rocprofv3" and "--kernel-trace" in perf["command"]
    assert [k["kernel_name"] for k in perf["kernels"]] == ["vector_add(float const*, float const*, float*, int)"]
    assert res["timing"]["n"] == perf["kernels"][0]["dispatch_count"] > 1
    # Durations are End - Start of the recorded dispatches, in ms.
    assert 0.1 < res["timing"]["median"] < 0.3
