"""Built-in server variants side by side on one GPU: each variant's server started once, then the
same ``magpie benchmark`` workload against each in turn, round after round (interleaved, the
order rotated each round), and a table last.

Usage (repository root on the GPU machine; see gpu_serving.py for what engine/ needs):

    PYTHONPATH=. python3 benchmarks/gpu_serving_ab.py RESULTS_DIR
        --variant NAME=ROOT[:FLAG,FLAG...] [--variant ...] [--size 1b] [--conc 64,16]
        [--rounds 3] [--budget S]

``ROOT`` is the folder the variant's ``engine`` package is imported from (``.`` for this
checkout; an older commit exported with ``git archive COMMIT engine | tar -x -C .old``); the
flags after ``:`` go to its ``python -m engine.serve`` (e.g. ``--event-loop,asyncio``). Every
benchmark is run by this checkout's client: ``magpie benchmark -b builtin.yaml --base-url URL
--concurrency C --num-prompts 4C --input-len 512 --output-len 64 --range-ratio 1 --warmup 2C
--repeats 1``. Besides the report's output tok/s and TPOT median, the server process's CPU
seconds (user + system, from /proc) during each benchmark give its host cost per 1k output tokens.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_serving import REPO, load_report, run_cli, say, stat, workspace  # noqa: E402

READY = re.compile(r"magpie-serve ready: http://([\d.]+):(\d+)")


class Server:
    def __init__(self, name: str, root: Path, flags: list[str], size: str, max_batch: int) -> None:
        self.name, self.root = name, root
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                             if p and Path(p).resolve() != REPO])}
        cmd = [sys.executable, "-m", "engine.serve", "--model", size, "--max-batch-size", str(max_batch), "--port", "0",
               "--stats-interval", "0", *flags]
        say(f"[{name}] $ (cd {root}) {' '.join(cmd)}")
        # cwd=root: ``python -m`` puts the working folder first on sys.path.
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, start_new_session=True)
        self.url: str | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            say(f"[{self.name} server] {line.rstrip()}")
            m = READY.search(line)
            if m:
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                self.ready.set()
        self.ready.set()

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (all threads)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def parse_variant(text: str) -> tuple[str, Path, list[str]]:
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=ROOT[:FLAG,FLAG...]")
    root, _, flags = rest.partition(":")
    path = (REPO / root).resolve()
    if not (path / "engine" / "serve").is_dir():
        raise SystemExit(f"--variant {text!r}: {path} has no engine/serve package")
    return name, path, [f for f in flags.split(",") if f]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--size", default="1b")
    ap.add_argument("--conc", default="64,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--py-spy", metavar="VARIANT", help="record that server with py-spy (collapsed stacks, all threads) "
                    "during its first benchmark at the highest concurrency, into RESULTS_DIR (py-spy must be on PATH)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds; rounds stop starting past it")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    variants = [parse_variant(v) for v in args.variant]
    concs = [int(c) for c in args.conc.split(",")]
    servers = [Server(n, root, flags, args.size, max(concs)) for n, root, flags in variants]
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    args.results.mkdir(parents=True, exist_ok=True)
    config = args.results / "builtin.yaml"  # so that the client asks for the model the servers serve
    config.write_text(f"benchmark:\n  framework: builtin\n  server: {{size: {args.size}, max_batch: {max(concs)}}}\n")
    try:
        for s in servers:
            s.ready.wait(300)
            if s.url is None:
                raise SystemExit(f"[{s.name}] the server did not start (exit {s.proc.poll()})")
        for r in range(args.rounds):
            for conc in concs:
                order = servers[r % len(servers):] + servers[:r % len(servers)]
                for s in order:
                    if time.monotonic() - t_start > args.budget:
                        say(f"budget {args.budget:.0f} s reached: round {r + 1} not finished")
                        raise StopIteration
                    out = args.results / f"{s.name}_c{conc}_r{r}"
                    spy = None
                    if args.py_spy == s.name and r == 0 and conc == max(concs):
                        spy = subprocess.Popen(["py-spy", "record", "--pid", str(s.proc.pid), "--duration", "8", "--rate", "250",
                                                "--nonblocking", "--threads", "--format", "raw",
                                                "--output", str(args.results / f"py-spy_{s.name}_c{conc}.txt")])
                    cpu0 = s.cpu_s()
                    rc, _ = run_cli(f"{s.name} c{conc} r{r}", [
                        "benchmark", "-b", str(config), "--base-url", s.url, "--concurrency", str(conc),
                        "--num-prompts", str(4 * conc), "--input-len", "512", "--output-len", "64", "--range-ratio", "1",
                        "--warmup", str(2 * conc), "--repeats", "1", "-o", str(out)], 180)
                    cpu = s.cpu_s() - cpu0
                    if spy is not None:
                        spy.wait(60)
                    report = load_report(workspace(out))
                    tok = stat(report, "output_throughput")
                    tpot = stat(report, "median_tpot_ms")
                    served = 6 * conc * 64  # the warm-up's 2C requests and the 4C measured, 64 tokens each
                    rows.setdefault((s.name, conc), []).append({
                        "rc": rc, "tok_s": tok and tok["mean"], "tpot_ms": tpot and tpot["mean"],
                        "cpu_ms_per_1k": 1e3 * cpu / (served / 1e3)})
    except StopIteration:
        pass
    finally:
        for s in servers:
            s.stop()
    say("")
    say(f"{'variant':<14}{'conc':>5}{'n':>3}{'tok/s (each round)':>34}{'median':>9}{'TPOT ms':>9}{'srv CPU ms/1k tok':>19}")
    for (name, conc), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        toks = [x["tok_s"] for x in rs if x["tok_s"]]
        tpots = [x["tpot_ms"] for x in rs if x["tpot_ms"]]
        cpus = [x["cpu_ms_per_1k"] for x in rs]
        say(f"{name:<14}{conc:>5}{len(rs):>3}{' '.join(f'{t:,.0f}' for t in toks):>34}"
            f"{statistics.median(toks) if toks else float('nan'):>9,.0f}"
            f"{statistics.median(tpots) if tpots else float('nan'):>9.2f}{statistics.median(cpus):>19.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
