"""GPU selection on recorded tool output (nvidia-smi query CSVs; amd-smi JSON)."""

import json

import pytest

from engine.bench.gpu_select import GpuSelectionError, gpu_states, parse_amd, parse_nvidia, select_gpus, visible_devices

NV_GPUS = """0, GPU-5b0c6a5e-2f4e-8d1a-93c7-0e6f4b2a7d11, 00000000:18:00.0, 1024, 81559
1, GPU-a39d7e02-64b1-1f8c-5e2a-c8d0b7f61e42, 00000000:2A:00.0, 80900, 81559
2, GPU-77d3e1aa-0b2c-4f10-9a55-3c2b1a0d9e88, 00000000:3A:00.0, 80910, 81559
3, GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5, 00000000:5D:00.0, 80915, 81559
"""
NV_APPS = "GPU-77d3e1aa-0b2c-4f10-9a55-3c2b1a0d9e88, 4242\n"

AMD_LIST = json.dumps([
    {"gpu": 0, "bdf": "0000:05:00.0", "uuid": "a1", "kfd_id": 41000, "node_id": 3, "partition_id": 0},
    {"gpu": 1, "bdf": "0000:26:00.0", "uuid": "b2", "kfd_id": 52000, "node_id": 2, "partition_id": 0},
    {"gpu": 2, "bdf": "0000:46:00.0", "uuid": "c3", "kfd_id": 63000, "node_id": 5, "partition_id": 0},
])
AMD_MEM = json.dumps([
    {"gpu": g, "mem_usage": {"total_vram": {"value": 196592, "unit": "MB"},
                             "used_vram": {"value": used, "unit": "MB"},
                             "free_vram": {"value": 196592 - used, "unit": "MB"}}}
    for g, used in ((0, 283), (1, 150000), (2, 283))])
AMD_PROC = json.dumps([{"gpu": 0, "process_list": []}, {"gpu": 1, "process_list": []},
                       {"gpu": 2, "process_list": [{"process_info": {"name": "python3", "pid": 777}}]}])


def test_nvidia_picks_free_gpus_and_pins_them_by_uuid():
    states = parse_nvidia(NV_GPUS, NV_APPS)
    chosen, skipped = select_gpus(states, 2, min_free_gb=8)
    assert [s.runtime_index for s in chosen] == [1, 3]
    assert any("GPU 0" in s and "GB free" in s for s in skipped) and any("busy" in s and "4242" in s for s in skipped)
    assert visible_devices(chosen) == {"CUDA_VISIBLE_DEVICES": "GPU-a39d7e02-64b1-1f8c-5e2a-c8d0b7f61e42,"
                                                               "GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5"}
    with pytest.raises(GpuSelectionError, match="3 free GPU"):
        select_gpus(states, 3)
    assert [s.runtime_index for s in select_gpus(states, 1, candidates=[3])[0]] == [3]


def test_amd_numbers_gpus_in_hip_order_not_smi_order():
    states = parse_amd(AMD_LIST, AMD_MEM, AMD_PROC)
    # node ids 3, 2, 5: HIP index 0 is amd-smi's GPU 1.
    assert [(s.runtime_index, s.smi_index) for s in states] == [(0, 1), (1, 0), (2, 2)]
    chosen, skipped = select_gpus(states, 1, min_free_gb=64)
    assert [s.smi_index for s in chosen] == [0] and chosen[0].runtime_index == 1
    assert visible_devices(chosen) == {"HIP_VISIBLE_DEVICES": "1"}
    assert any("busy" in s and "777" in s for s in skipped)


def test_gpu_states_through_a_runner():
    def runner(argv):
        if argv[0] == "nvidia-smi":
            return (0, NV_GPUS) if "--query-gpu" in argv[1] else (0, NV_APPS)
        return 1, ""
    assert len(gpu_states(runner)) == 4

    def amd_runner(argv):
        if argv[0] == "nvidia-smi":
            return 127, ""
        return 0, {"list": AMD_LIST, "metric": AMD_MEM, "process": AMD_PROC}[argv[1]]
    assert [s.vendor for s in gpu_states(amd_runner)] == ["amd"] * 3
    assert gpu_states(lambda argv: (127, "")) == []
