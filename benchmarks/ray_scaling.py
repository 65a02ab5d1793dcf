"""How compare's wall time scales with Ray workers on this machine.

    python benchmarks/ray_scaling.py [--kernels 16] [--workers 1 2 4] [--work-ms 300]

For each worker count W it starts a fresh local Ray instance with W+1 CPUs and W stand-in GPUs
(the custom resource ``sim_gpu``), runs ``magpie -e ray -w W compare`` on the same C kernels,
and prints the wall time of the whole command (Ray's worker start-up and the uploads included;
the cluster's own start is not) and the speed-up over W=1. Each testcase takes about --work-ms:
waiting (``--work sleep``, the default: a GPU testcase mostly waits for the device) or
spinning a CPU core (``--work spin``, which on this 2-core machine measures the cores, not the
fan-out). Each W is run --rounds times, interleaved, and the median is shown.

On N nodes (not run here: one machine only): start the head with ``ray start --head
--num-gpus 8`` and the workers with ``ray start --address HEAD:6379``, then run the same
command with ``--ray-address HEAD:6379`` and ``-w`` equal to the total CPU slots you give the
checks, once with 1 node joined and once with N; the time tasks scale with the GPUs, the check
tasks with ``-w``. Compare the medians of several interleaved runs, as this script does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
KERNEL_C = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static double now_ms(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(int argc, char **argv){
  double budget = WORK_MS, t0 = now_ms(); volatile double x = 0; double s[5];
  if (SPIN) { while (now_ms() - t0 < budget) x += 1e-9; } else { usleep((useconds_t)(budget * 1000)); }
  for (int r = 0; r < 5; r++) { double a = now_ms(); for (int i = 0; i < 200000; i++) x += i; s[r] = now_ms() - a; }
  printf("MAGPIE_TIMING_JSON: {\"samples_ms\": [%f, %f, %f, %f, %f]}\n", s[0], s[1], s[2], s[3], s[4]);
  return 0; }
"""

CLUSTER = """
import shutil, sys, tempfile, time, ray
w = int(sys.argv[1])
temp = tempfile.mkdtemp(prefix="mgscale", dir="/tmp")  # short: Ray's unix socket paths
ray.init(num_cpus=w + 1, resources={"sim_gpu": w}, _node_ip_address="127.0.0.1", include_dashboard=False,
         _temp_dir=temp, logging_level="ERROR")
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the script closes it
ray.shutdown()
shutil.rmtree(temp, ignore_errors=True)
"""


def _kernels(folder: Path, n: int, work_ms: int, spin: bool) -> Path:
    (folder / "kern.c").write_text(KERNEL_C.replace("WORK_MS", str(work_ms)).replace("SPIN", "1" if spin else "0"))
    kernels = [{"id": f"k{i:02d}", "type": "hip", "working_dir": ".",
                "compile_command": f"mkdir -p build && cc -O1 -o build/k{i:02d} kern.c",
                "testcase_command": f"./build/k{i:02d}"} for i in range(n)]
    cfg = folder / "k.yaml"
    cfg.write_text(yaml.safe_dump({"kernels": kernels, "scheduler": {"ray": {"gpu_resource": "sim_gpu"}}}))
    return cfg


def _run(cfg: Path, workers: int, address: str, out: Path, env: dict) -> float:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "engine.cli", "-e", "ray", "--ray-address", address, "-w", str(workers),
                        "compare", "-k", str(cfg), "-o", str(out)], capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"compare failed (W={workers}):\n{r.stderr[-3000:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=16)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--work-ms", type=int, default=300)
    ap.add_argument("--work", choices=["sleep", "spin"], default="sleep")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    tmp = Path(tempfile.mkdtemp(prefix="magpie-scale-"))
    cfg = _kernels(tmp, args.kernels, args.work_ms, args.work == "spin")
    try:
        walls = _measure(args, cfg, tmp, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print(args, walls)
    return 0


def _measure(args: argparse.Namespace, cfg: Path, tmp: Path, env: dict) -> dict[int, list[float]]:
    walls: dict[int, list[float]] = {w: [] for w in args.workers}
    for _ in range(args.rounds):
        for w in args.workers:  # interleaved, so a slow moment of the machine hits every W
            proc = subprocess.Popen([sys.executable, "-c", CLUSTER, str(w)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
            try:
                walls[w].append(_run(cfg, w, proc.stdout.readline().strip(), tmp / f"out{w}", env))
            finally:
                proc.stdin.close()  # the cluster process shuts its Ray instance down and exits
                proc.wait(60)
    return walls


def _print(args: argparse.Namespace, walls: dict[int, list[float]]) -> None:
    base = statistics.median(walls[args.workers[0]])
    print(f"{args.kernels} kernels (+ the baseline re-timed beside each), testcase ~{args.work_ms} ms ({args.work}), "
          f"{os.cpu_count()} CPU cores, median of {args.rounds}")
    print(f"{'workers':>8} {'wall s':>8} {'min..max':>14} {'speed-up':>9}")
    for w in args.workers:
        med = statistics.median(walls[w])
        print(f"{w:>8} {med:8.2f} {min(walls[w]):6.2f}..{max(walls[w]):<6.2f} {base / med:8.2f}x")


if __name__ == "__main__":
    sys.exit(main())
