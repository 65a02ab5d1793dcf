"""Kernels and benchmark points on a real local Ray cluster (127.0.0.1, started once for the
module): CPU resources, and a custom resource ``sim_gpu`` standing in for GPUs.

The kernels are small C programs (compiled with cc, checked by their exit code, timed by
their own MAGPIE_TIMING_JSON line), so every stage really runs on a Ray worker.
"""

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, local_ray_head, only_workspace, read_events, run_magpie

ray = pytest.importorskip("ray")

KERNEL_C = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#ifndef VARIANT
#define VARIANT 0
#endif
#define N 4096   // in L1: a pass is bound by its chain of dependent adds, not by memory another process shares
#define SPIN 200 // ~1 ms a pass: samples well above the timer and scheduler noise of a busy machine
static double now_ms(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e3+t.tv_nsec/1e6;}
static float a[N], b[N], c[N];
static volatile float sink;
static void pass(void){float acc=0.0f;
  for(int s=0;s<SPIN;s++) for(int i=0;i<N;i++) acc+=a[i]*b[i];
  sink=acc; for(int i=0;i<N;i++) c[i]=a[i]+b[i];}
int main(void){
  for(int i=0;i<N;i++){a[i]=i*0.5f;b[i]=1.0f;}
  double s[8];
  for(int r=-2;r<8;r++){double t0=now_ms();
    for(int rep=0;rep<=VARIANT%5;rep++) pass();  // 1 + VARIANT%5 passes
    if(r>=0) s[r]=now_ms()-t0;}
  for(int i=0;i<N;i++) if(c[i]!=a[i]+b[i]+(VARIANT==99)) {fprintf(stderr,"wrong at %d\n",i); return 1;}
  printf("MAGPIE_TIMING_JSON: {\"samples_ms\": [");
  for(int r=0;r<8;r++) printf("%s%.6f", r?", ":"", s[r]);
  printf("]}\n"); return 0;}
"""


@pytest.fixture(scope="module")
def cluster():
    """One Ray head on 127.0.0.1 for the module: 4 CPUs and 2 stand-in GPUs."""
    with local_ray_head("mgray", resources={"sim_gpu": 2}) as address:
        yield address


def _kernel_dir(tmp_path: Path, kernels: list[dict], ray_settings: dict, name: str = "k.yaml",
                performance: dict | None = None) -> Path:
    (tmp_path / "kern.c").write_text(KERNEL_C)
    cfg = {"kernels": kernels, "scheduler": {"ray": {"gpu_resource": "sim_gpu", **ray_settings}}}
    if performance:
        cfg["performance"] = performance
    (tmp_path / name).write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp_path / name


def _c_kernel(kid: str, variant: int, **extra) -> dict:
    return {"id": kid, "type": "hip", "working_dir": "${MAGPIE_CONFIG_DIR}",
            "compile_command": f"mkdir -p build && cc -O1 -DVARIANT={variant} -o build/{kid} kern.c",
            "testcase_command": f"./build/{kid}", **extra}


@pytest.mark.slow
def test_compare_fans_out_12_kernels_with_same_gpu_speedups(cluster, tmp_path):
    # Twelve kernels on four workers: three times as many tasks as workers, so tasks queue and
    # finish out of order.
    kernels = [_c_kernel(f"k{i:02d}", i) for i in range(10)]
    kernels.append(_c_kernel("wrong", 99))  # compiles, fails its testcase
    kernels.append({**_c_kernel("broken", 0), "compile_command": "cc -o build/broken does_not_exist.c"})
    # Three processes a kernel (performance.rounds) instead of ten: the fan-out is what is tested.
    cfg = _kernel_dir(tmp_path, kernels, {}, performance={"rounds": 3})
    out = tmp_path / "out"
    r = run_magpie("-e", "ray", "--ray-address", cluster, "-w", "4", "compare", "-k", cfg, "-o", out, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = only_workspace(out)
    report = json.loads((ws / "compare_report.json").read_text())
    rows = {row["kernel_id"]: row for row in report["results"]["kernel_results"]}
    assert rows["wrong"]["correctness_state"] == "FAILED" and rows["wrong"]["performance_state"] == "SKIPPED"
    assert rows["broken"]["compiling_state"] == "FAILED"
    for i in range(10):
        row = rows[f"k{i:02d}"]
        # 8 samples from each of performance.rounds processes
        assert row["correctness_state"] == "SUCCESS" and row["timing"]["n"] == 8 * report["settings"]["rounds"], \
            row["errors"]
        assert row["execution"]["environment"] == "ray" and row["execution"]["check"]["node"]["node_id"]
        if i:
            assert row["speedup"] is not None and row["execution"]["time"]["folder"].endswith(f"tasks/time_k{i:02d}")
    # Every candidate was timed beside its own re-timing of the baseline.
    assert sorted(b["with"] for b in report["same_gpu"]["baseline_runs"]) == [f"k{i:02d}" for i in range(1, 10)]
    cluster_file = json.loads((ws / "cluster.json").read_text())
    kinds = [t["kind"] for t in cluster_file["tasks"]]
    assert kinds.count("check") == 12 and kinds.count("time") == 9  # the failed two never took a GPU
    assert {t["state"] for t in cluster_file["tasks"]} == {"finished"}
    assert all(t["resources"] == {"sim_gpu": 1} for t in cluster_file["tasks"] if t["kind"] == "time")
    assert cluster_file["ray_job_id"] and cluster_file["gcs_address"] == cluster
    # The logs came back through the object store into the one run folder.
    assert "MAGPIE_TIMING_JSON" in (ws / "tasks" / "time_k07" / "logs" / "k07" / "testcase_1.stdout.log").read_text()
    assert "wrong at" in (ws / "tasks" / "check_wrong" / "logs" / "wrong" / "testcase_1.stderr.log").read_text()
    events = read_events(ws)
    assert sum(e["event"] == "ray_task" and e["state"] == "finished" for e in events) == 21
    assert events[-1]["event"] == "run_finished" and events[-1]["state"] == "completed"


def test_a_crashed_task_is_a_failed_kernel(cluster, tmp_path):
    from engine.jobs import KernelRequest, submit
    kernels = [_c_kernel("fine", 1),
               # The compile command kills the Ray worker that runs it (its parent is the reaper that
               # supervises the command; the worker is the reaper's parent): the task itself fails.
               {**_c_kernel("crash", 2), "compile_command": "kill -9 $(cut -d' ' -f4 /proc/$PPID/stat); sleep 5"}]
    cfg = _kernel_dir(tmp_path, kernels, {})
    job = submit(KernelRequest(mode="analyze", kernel_config=str(cfg)), tmp_path / "out", executor="ray",
                 driver="in-process")
    assert job.wait(120) == "completed"  # the run ended normally; a kernel of it failed
    report = job.result()
    rows = {row["kernel_id"]: row for row in report["results"]}
    assert rows["fine"]["correctness_state"] == "SUCCESS" and rows["fine"]["performance_state"] == "SUCCESS"
    assert rows["crash"]["correctness_state"] == "FAILED"
    assert "Ray check task failed" in " ".join(rows["crash"]["errors"])
    assert report["exit_code"] == 1
    tasks = {t["key"]: t for t in json.loads((job.run_dir / "cluster.json").read_text())["tasks"]}
    assert tasks["check_crash"]["state"] == "failed" and "Worker" in tasks["check_crash"]["error"]
    assert json.loads((job.run_dir / "job.json").read_text())["executor"] == "ray"


def test_cancel_stops_the_remote_tasks_and_the_report_says_so(cluster, tmp_path):
    from engine.jobs import KernelRequest, attach, submit
    pids = tmp_path / "pids"  # outside the kernels' folder, which the workers get a copy of
    pids.mkdir()
    (tmp_path / "src").mkdir()
    slow = [{**_c_kernel(f"s{i}", i), "testcase_command": f"echo $$ > {pids}/s{i}; sleep 60"} for i in range(4)]
    cfg = _kernel_dir(tmp_path / "src", slow, {"cancel_grace_s": 20})
    job = submit(KernelRequest(mode="compare", kernel_config=str(cfg), workers=2), tmp_path / "out",
                 executor="ray", address=cluster)  # the driver is a detached process
    try:
        deadline = time.monotonic() + 90
        while len(list(pids.iterdir())) < 2:  # two testcases are running on workers
            assert time.monotonic() < deadline, job.state()
            time.sleep(0.2)
    except BaseException:
        job.cancel()
        job.wait(60)
        raise
    again = attach(job.run_dir)  # as a front end that reconnects would
    assert again.state() == "running"
    assert json.loads((job.run_dir / "cluster.json").read_text())["ray_job_id"]
    again.cancel()
    assert job.wait(60) == "cancelled"
    report = job.result()
    assert report["state"] == "cancelled" and report["winner_id"] is None
    states = [row["correctness_state"] for row in report["results"]["kernel_results"]]
    assert states.count("CANCELLED") == 2, states  # the two that ran; the others never started
    started = [int(p.read_text()) for p in pids.iterdir()]
    for pid in started:  # the testcases' process groups were stopped on the workers
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    tasks = json.loads((job.run_dir / "cluster.json").read_text())["tasks"]
    assert {t["state"] for t in tasks} == {"cancelled"}
    assert sum(1 for t in tasks if t.get("folder")) == 2  # the running ones sent back what they reached


def test_stage_events_reach_the_run_while_the_task_runs(cluster, tmp_path):
    from engine.jobs import KernelRequest, submit
    gate = tmp_path / "gate"  # outside the kernels' folder, which the workers get a copy of
    (tmp_path / "src").mkdir()
    kernels = [_c_kernel("fine", 1),
               {**_c_kernel("gated", 2), "testcase_command": f"while [ ! -f {gate} ]; do sleep 0.05; done; ./build/gated"}]
    cfg = _kernel_dir(tmp_path / "src", kernels, {})
    job = submit(KernelRequest(mode="analyze", kernel_config=str(cfg)), tmp_path / "out", executor="ray",
                 driver="in-process")
    try:
        deadline = time.monotonic() + 60
        seen: list[dict] = []
        while not any(e.get("ray_task") == "check_gated" and e.get("stage") == "testcase"
                      and e.get("state", "").upper() == "RUNNING" for e in seen):
            assert time.monotonic() < deadline and job.state() in ("pending", "running"), (job.state(), seen)
            time.sleep(0.1)
            seen = read_events(job.run_dir) if (job.run_dir / "events.jsonl").is_file() else []
        # The task is still held at the gate, and its stages are already in the run's events.
        assert not gate.exists() and job.state() == "running"
        live = [(e["stage"], e["state"].upper()) for e in seen if e.get("ray_task") == "check_gated"]
        assert live == [("compile", "RUNNING"), ("compile", "SUCCESS"), ("testcase", "RUNNING")], live
        assert all(e["index"] == 1 and e["kernel"] == "gated" for e in seen if e.get("ray_task") == "check_gated")
        assert not any(e.get("event") == "ray_task" and e.get("key") == "check_gated" and e["state"] == "finished"
                       for e in seen)
    finally:
        gate.touch()
    assert job.wait(120) == "completed"
    events = read_events(job.run_dir)
    timed = [(e["stage"], e["state"].upper()) for e in events if e.get("ray_task") == "time_gated"]
    assert ("performance", "SUCCESS") in timed and timed[0] == ("compile", "RUNNING"), timed
    finished = next(i for i, e in enumerate(events) if e.get("event") == "ray_task" and e.get("key") == "time_gated"
                    and e["state"] == "finished")
    assert max(i for i, e in enumerate(events) if e.get("ray_task") == "time_gated") < finished


def _gone(pid: int, timeout: float = 15.0) -> bool:
    """The process has exited (a zombie left for a PID 1 that does not reap counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("started_by", ["run_process", "own Popen"])
@pytest.mark.parametrize("how", ["ray.cancel force", "worker SIGKILL"])
def test_a_dead_worker_leaves_no_kernel_process_behind(cluster, tmp_path, how, started_by):
    import signal

    @ray.remote(num_cpus=1, max_retries=0)
    def long_kernel(repo: str, folder: str, started_by: str) -> int:
        import subprocess
        import sys
        sys.path.insert(0, repo)
        from engine.runs.process import child_groups_watched, run_process
        Path(folder, "worker").write_text(str(os.getpid()))
        # A shell (the group leader) with a background grandchild: both must go with the worker.
        cmd = f"sleep 60 & echo $! > {folder}/bg; echo $$ > {folder}/sh; wait"
        if started_by == "run_process":  # compile, testcase and profiler commands
            return run_process(cmd, cwd=folder, log_stem=f"{folder}/kernel").returncode
        with child_groups_watched():  # as a Ray task runs the harness or a benchmark's server
            return subprocess.Popen(["bash", "-c", cmd], start_new_session=True).wait()

    ref = long_kernel.remote(str(REPO), str(tmp_path), started_by)
    deadline = time.monotonic() + 60
    while not all((tmp_path / n).is_file() and (tmp_path / n).read_text().strip() for n in ("bg", "sh", "worker")):
        assert time.monotonic() < deadline, "the task did not start its kernel"
        time.sleep(0.05)
    pids = [int((tmp_path / n).read_text()) for n in ("sh", "bg")]
    if started_by == "own Popen":
        time.sleep(0.6)  # the task's scan of its children runs every 0.25 s
    if how == "ray.cancel force":
        ray.cancel(ref, force=True)
    else:
        os.kill(int((tmp_path / "worker").read_text()), signal.SIGKILL)
    try:
        # Ray kills a worker's direct children as it goes down: the task may even return first.
        assert ray.get(ref, timeout=60) != 0
    except ray.exceptions.RayError:
        pass
    assert [pid for pid in pids if not _gone(pid)] == [], f"{how}: the kernel's processes outlived the worker"


@pytest.mark.slow
def test_python_kernels_checked_and_timed_by_the_harness_on_a_worker(cluster, tmp_path):
    src = tmp_path / "rms"
    shutil.copytree(REPO / "examples" / "kernels" / "rmsnorm_pytorch", src)
    cfg = yaml.safe_load((src / "compare.yaml").read_text())
    cfg["scheduler"] = {"ray": {"gpu_resource": "sim_gpu"}}
    (src / "compare.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    r = run_magpie("-e", "ray", "--ray-address", cluster, "compare", "-k", src / "compare.yaml", "--seed", "3",
                   "-o", out, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = only_workspace(out)
    text = (ws / "compare_report.json").read_text()
    assert "magpie-ray-" not in text  # every path names the run folder or the sources, never a worker's copy
    fused = json.loads(text)["results"]["kernel_results"][1]
    assert fused["correctness_result"]["harness"]["passed"] and fused["correctness_result"]["harness"]["seeds"]
    assert fused["speedup"] is not None and fused["performance_result"]["backend"].startswith("harness")
    assert (ws / "tasks" / "time_fused" / "logs" / "fused" / "harness.stderr.log").is_file()


def test_several_gpu_models_are_refused_unless_chosen():
    from engine.cluster.ray_eval import ClusterError, check_gpu_models, cluster_gpu_models
    from engine.cluster.settings import RaySettings
    nodes = [{"NodeID": "a", "Alive": True, "Resources": {"GPU": 8, "accelerator_type:H200": 1}},
             {"NodeID": "b", "Alive": True, "Resources": {"GPU": 8, "accelerator_type:H100": 1}},
             {"NodeID": "c", "Alive": True, "Resources": {"CPU": 64}},
             {"NodeID": "d", "Alive": False, "Resources": {"GPU": 8, "accelerator_type:A100": 1}}]
    models = cluster_gpu_models(nodes, "GPU")
    assert models == {"H200": ["a"], "H100": ["b"]}
    with pytest.raises(ClusterError, match="several GPU models"):
        check_gpu_models(models, RaySettings())
    assert check_gpu_models(models, RaySettings(gpu_type="H100")) == {"H100": ["b"]}
    assert len(check_gpu_models(models, RaySettings(allow_mixed_gpus=True))) == 2
    with pytest.raises(ClusterError, match="no node has it"):
        check_gpu_models(models, RaySettings(gpu_type="MI300X"))


def test_timing_placement_gpu_kernels_never_land_on_cpu_nodes():
    """Where time tasks go: GPUs when the cluster has them (a mixed cluster's CPU-only nodes time
    nothing), whole CPU nodes on a cluster without GPUs or with device cpu (CPU-only nodes only)."""
    from engine.cluster.ray_eval import ClusterError, timing_placement
    from engine.cluster.settings import RaySettings
    gpu = {"NodeID": "g", "Alive": True, "Resources": {"CPU": 64, "GPU": 8, "accelerator_type:H100": 1}}
    cpu_small = {"NodeID": "c1", "Alive": True, "Resources": {"CPU": 8}}
    cpu_big = {"NodeID": "c2", "Alive": True, "Resources": {"CPU": 32}}
    dead = {"NodeID": "d", "Alive": False, "Resources": {"CPU": 128}}
    mixed = [gpu, cpu_small, cpu_big, dead]
    auto = timing_placement(mixed, RaySettings())
    assert (auto.device, auto.gpu_models, auto.cpu_nodes) == ("gpu", {"H100": ["g"]}, [])
    cpu = timing_placement(mixed, RaySettings(device="cpu"))
    assert (cpu.device, cpu.cpu_nodes) == ("cpu", [("c2", 32.0), ("c1", 8.0)])  # never the GPU node, never the dead one
    only_cpu = timing_placement([cpu_small, dead], RaySettings())
    assert (only_cpu.device, only_cpu.cpu_nodes) == ("cpu", [("c1", 8.0)]) and "no node" in only_cpu.why
    for settings, match in [(RaySettings(device="gpu"), "that GPU timing needs .*device: gpu"),
                            (RaySettings(gpu_type="H200"), "that GPU timing needs .*gpu_type: H200"),
                            (RaySettings(gpu_resource="sim_gpu"), "'sim_gpu' that GPU timing needs"),
                            (RaySettings(num_cpus=16), "no node without a GPU has 16 CPU")]:
        with pytest.raises(ClusterError, match=match):
            timing_placement([cpu_small, dead], settings)
    with pytest.raises(ClusterError, match="every node offers a GPU"):
        timing_placement([gpu], RaySettings(device="cpu"))
    with pytest.raises(ClusterError, match="CPU timing uses no GPU"):
        timing_placement(mixed, RaySettings(device="cpu", gpu_type="H100"))


def _cpu_cluster_config(folder: Path, kernels: list[dict], ray_settings: dict, rounds: int | None = None) -> Path:
    """A kernel YAML whose Ray block names no stand-in resource: the module's cluster has no GPU."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kern.c").write_text(KERNEL_C)
    cfg: dict = {"kernels": kernels, "scheduler": {"ray": ray_settings}}
    if rounds is not None:
        cfg["performance"] = {"rounds": rounds}
    (folder / "k.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder / "k.yaml"


def _verdicts(report: dict) -> dict:
    return {r["kernel_id"]: (r["compiling_state"], r["correctness_state"], r["verdict"])
            for r in report["results"]["kernel_results"]}


def test_cpu_kernels_on_a_cluster_without_gpus_are_judged_as_locally(cluster, tmp_path):
    # k1 and k2 do 3x and 4x the baseline's work: slower on both, by far more than a busy spell of
    # a 2-core machine (Ray starting its workers beside the first timing task) can hide.
    kernels = [_c_kernel("k0", 0, baseline=True), _c_kernel("k1", 2), _c_kernel("k2", 3),
               _c_kernel("wrong", 99), {**_c_kernel("broken", 0), "compile_command": "cc -o build/broken nope.c"}]
    # Three processes a kernel instead of ten: 3x and 4x the work stay far apart in 24 samples.
    cfg = _cpu_cluster_config(tmp_path / "src", kernels, {}, rounds=3)
    local = run_magpie("compare", "-k", cfg, "-o", tmp_path / "local", timeout=300)
    on_ray = run_magpie("-e", "ray", "--ray-address", cluster, "compare", "-k", cfg, "-o", tmp_path / "ray", timeout=300)
    assert (local.returncode, on_ray.returncode) == (0, 0), on_ray.stdout[-3000:] + on_ray.stderr[-3000:]
    ws = only_workspace(tmp_path / "ray")
    report = json.loads((ws / "compare_report.json").read_text())
    here, there = _verdicts(json.loads((only_workspace(tmp_path / "local") / "compare_report.json").read_text())), \
        _verdicts(report)
    rows = {r["kernel_id"]: (r.get("speedup"), r.get("speedup_ci")) for r in report["results"]["kernel_results"]}
    print("RAYROWS", rows)
    assert here == there, (here, there, rows)
    assert there["wrong"][1:] == ("FAILED", "incorrect") and there["broken"][0] == "FAILED"
    assert there["k1"][2] == there["k2"][2] == "slower" and report["winner_id"] == "k0"
    cluster_file = json.loads((ws / "cluster.json").read_text())
    head = cluster_file["timing"]["cpu_nodes"]
    assert cluster_file["timing"]["device"] == "cpu" and [n["cpus"] for n in head] == [4.0]
    tasks = {t["key"]: t for t in cluster_file["tasks"]}
    assert sorted(k for k in tasks if k.startswith("time_")) == ["time_k1", "time_k2"]
    for key, t in tasks.items():  # a time task holds all the node's CPUs; checks hold no GPU share
        assert t["resources"] == ({"CPU": 4.0} if key.startswith("time_") else {}), t
        assert t.get("pinned_node") == (head[0]["node_id"] if key.startswith("time_") else None)
    # Nothing ran beside a timing: no other task posted a stage event while a time task ran.
    spans: dict[str, list[float]] = {}
    for e in read_events(ws):
        if e.get("ray_task") and e.get("task_ts"):
            spans.setdefault(e["ray_task"], []).append(e["task_ts"])
    for key in ("time_k1", "time_k2"):
        lo, hi = min(spans[key]), max(spans[key])
        beside = [k for k, ts in spans.items() if k != key and any(lo < t < hi for t in ts)]
        assert beside == [], f"{beside} ran during {key}"


def test_gpu_timing_on_a_cluster_without_gpus_is_not_run(cluster, tmp_path):
    kernels = [_c_kernel("k0", 0), _c_kernel("k1", 1)]
    cfg = _cpu_cluster_config(tmp_path / "src", kernels, {"gpu_type": "H100"})
    r = run_magpie("-e", "ray", "--ray-address", cluster, "compare", "-k", cfg, "-o", tmp_path / "out", timeout=120)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    first = r.stdout.strip().splitlines()[0]
    assert first.startswith("not run: no node of the cluster offers the resource 'GPU'") and "gpu_type: H100" in first
    assert "incorrect" not in r.stdout and "Winner: none — nothing was run" in r.stdout
    report = json.loads((only_workspace(tmp_path / "out") / "compare_report.json").read_text())
    assert report["state"] == "failed" and report["exit_code"] == 2 and report["winner_reason"].startswith("not run:")
    assert report["not_run"]["error"] == "ClusterError" and "device: cpu" in report["not_run"]["hint"]
    for row in report["results"]["kernel_results"]:
        assert row["verdict"] == "not run" and row["correctness_state"] == "SKIPPED", row
        assert row["environment_problems"][0].startswith("not run: no node") and row["errors"] == []
    # analyze too: nothing judged, exit 2
    cfg = _cpu_cluster_config(tmp_path / "src2", kernels, {"device": "gpu"})
    r = run_magpie("-e", "ray", "--ray-address", cluster, "analyze", "-k", cfg, "-o", tmp_path / "out2", timeout=120)
    assert r.returncode == 2 and r.stdout.startswith("not run: ") and "device: gpu" in r.stdout.splitlines()[0], r.stdout


def test_bad_scheduler_block_names_the_field(tmp_path):
    cfg = _kernel_dir(tmp_path, [_c_kernel("a", 0)], {"gpu_resorce": "x"})
    r = run_magpie("-e", "ray", "analyze", "-k", cfg)
    assert r.returncode == 2
    assert "gpu_resorce" in r.stderr and "gpu_resource" in r.stderr


def _batch_file(tmp_path: Path) -> Path:
    batch = {"sweep": {"config": str(REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml"),
                       "flags": {"num_prompts": 6, "input_len": 16, "output_len": 4, "warmup": 0, "repeats": 1},
                       "over": {"concurrency": [1, 2]}},
             "batch": [{"config": str(REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml"),
                        "flags": {"tp": 4, "num_prompts": 4}}],  # more stand-in GPUs than a node has
             "scheduler": {"ray": {"gpu_resource": "sim_gpu"}}}
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(batch, sort_keys=False))
    return path


@pytest.mark.slow
def test_benchmark_batch_of_builtin_server_points(cluster, tmp_path):
    out = tmp_path / "out"
    r = run_magpie("-e", "ray", "--ray-address", cluster, "benchmark", "--batch", _batch_file(tmp_path), "-o", out,
                   timeout=400)
    ws = only_workspace(out)
    report = json.loads((ws / "benchmark_report.json").read_text())
    assert report["batch"] is True and report["run_environment"] == "ray"
    points = report["points"]
    assert [p["tp"] for p in points] == [4, 1, 1]
    assert points[0]["state"] == "failed" and "largest node" in points[0]["error"]
    for p in points[1:]:
        assert p["state"] == "completed", (p, r.stderr[-2000:])
        assert p["metrics"]["request_throughput"] > 0 and p["metrics"]["completed"] == 6
        point_report = json.loads((Path(p["folder"]) / "benchmark_report.json").read_text())
        assert point_report["state"] == "completed"
    assert [p["flags"]["concurrency"] for p in points[1:]] == [1, 2]
    assert r.returncode == 1 and report["state"] == "failed"  # one point failed: the batch says so
    tasks = json.loads((ws / "cluster.json").read_text())["tasks"]
    assert len(tasks) == 2 and all(t["resources"] == {"sim_gpu": 1} and t["state"] == "finished" for t in tasks)
    assert "request_throughput" in (ws / "summary.txt").read_text()


def test_batch_file_problems_name_the_file_and_the_point(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"batch": [str(REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml"),
                                             {"config": "missing.yaml"}], "sweep": {"config": "x.yaml", "over": {}}}))
    r = run_magpie("benchmark", "--batch", bad, "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert f"{bad}: sweep.over: give each key a non-empty list" in r.stderr
    bad.write_text(yaml.safe_dump({"batch": [{"config": "missing.yaml"}]}))
    r = run_magpie("benchmark", "--batch", bad, "-o", tmp_path / "out")
    assert r.returncode == 2 and f"{bad}: batch[0]" in r.stderr and "missing.yaml" in r.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.slow
def test_local_batch_runs_the_points_in_turn(tmp_path):
    batch = {"sweep": {"config": str(REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml"),
                       "flags": {"num_prompts": 4, "input_len": 16, "output_len": 4, "warmup": 0, "repeats": 1},
                       "over": {"concurrency": [2]}}}
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(batch))
    r = run_magpie("benchmark", "--batch", path, "-o", tmp_path / "out", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = only_workspace(tmp_path / "out")
    report = json.loads((ws / "benchmark_report.json").read_text())
    assert report["run_environment"] == "local" and [p["state"] for p in report["points"]] == ["completed"]
    assert all((Path(p["folder"]) / "benchmark_report.json").is_file() for p in report["points"])
    from engine.runs.schema import load_report
    assert load_report(ws / "benchmark_report.json").state == "completed"  # the workbench reads it
