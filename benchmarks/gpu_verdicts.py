"""Verdicts on a GPU: identical kernels must tie, cheats must not win.

Runs `magpie compare` on each YAML given (default: the identical-softmax pair three times and
every compare YAML under examples/kernels/adversarial/cuda/), each in its own process group
with a timeout, and prints one row per kernel: verdict, speedup [CI], median, timer, flags,
and the wall time of the compare.

    python3 benchmarks/gpu_verdicts.py [--yaml Y ...] [--identical-runs 3] [--no-side-stream] [--json PATH]

Each row also gives the verdicts the adversarial manifest accepts for it ("!!" where it got
another); the JSON is written after every compare, so a call cut short keeps what finished.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADV = REPO / "examples" / "kernels" / "adversarial" / "cuda"

IDENTICAL = f"""kernels:
  - id: torch_softmax
    type: pytorch
    source_files: [{ADV / 'torch_softmax.py'}]
    baseline: true
  - id: torch_softmax_again
    type: pytorch
    source_files: [{ADV / 'torch_softmax.py'}]
"""


SIDE_STREAM = f"""import sys
sys.path.insert(0, {str(ADV)!r})
import torch
from _problem import get_init_inputs, get_inputs  # noqa: F401


class Model(torch.nn.Module):
    \"\"\"Cheat: does the softmax on a private stream and returns without waiting for it.\"\"\"
    def __init__(self):
        super().__init__()
        self.stream = torch.cuda.Stream()

    def forward(self, x):
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            y = torch.softmax(x, dim=-1)
        return y
"""


def side_stream_yaml(work: Path, timer: str) -> Path:
    (work / "side_stream.py").write_text(SIDE_STREAM)
    y = work / f"side_stream_{timer}.yaml"
    y.write_text(f"""kernels:
  - id: torch_softmax
    type: pytorch
    source_files: [{ADV / 'torch_softmax.py'}]
    baseline: true
  - id: side_stream
    type: pytorch
    source_files: [{work / 'side_stream.py'}]
performance:
  timer: {timer}
""")
    return y


def run_compare(yaml: Path, out: Path, timeout: float, extra: list[str]) -> tuple[dict | None, float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "compare", "-k", str(yaml), "-o", str(out), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        return None, time.monotonic() - t0, "timeout\n" + (text or "")[-2000:]
    wall = time.monotonic() - t0
    reports = sorted(out.glob("*/compare_report.json"))
    if not reports:
        return None, wall, (text or "")[-3000:]
    return json.loads(reports[-1].read_text()), wall, (text or "")[-1500:]


def rows_of(name: str, report: dict, wall: float) -> list[dict]:
    rows = []
    for k in report["results"]["kernel_results"]:
        t = k.get("timing") or {}
        rows.append({"case": name, "kernel": k["kernel_id"], "verdict": k.get("verdict"),
                     "speedup": k.get("speedup"), "ci": k.get("speedup_ci"),
                     "median_us": t.get("median", 0) * 1e3 if t else None,
                     "timer": (k.get("performance_result") or {}).get("backend"),
                     "errors": [e.splitlines()[0][:160] for e in k.get("errors", [])],
                     "flags": [f["guard"] for f in (k.get("guards") or {}).get("flags", [])],
                     "wall_s": round(wall, 1)})
    rows.append({"case": name, "kernel": "(winner)", "verdict": report.get("winner_id"),
                 "errors": [report.get("winner_reason", "")], "wall_s": round(wall, 1)})
    return rows


def manifest_expectations() -> dict[tuple[Path, str], list[str]]:
    """(YAML path, kernel id) -> the verdicts the adversarial manifest accepts for it."""
    import yaml as pyyaml
    doc = pyyaml.safe_load((ADV.parent / "manifest.yaml").read_text()) or {}
    out: dict[tuple[Path, str], list[str]] = {}
    for case in doc.get("cases", []):
        want = (case.get("expect") or {}).get("verdict")
        if want is not None:
            out[((ADV.parent / case["yaml"]).resolve(), case["kernel"])] = want if isinstance(want, list) else [want]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--yaml", nargs="*", help="compare YAMLs (default: every *.yaml under adversarial/cuda)")
    ap.add_argument("--identical-runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--json", help="write the rows here (default $OUT/gpu_verdicts.json)")
    ap.add_argument("--extra", default="", help="extra compare flags, e.g. '--repeats 200'")
    ap.add_argument("--no-side-stream", action="store_true",
                    help="skip the side-stream pair (trace and events timers, about 100 s on an H100)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="magpie-verdicts-"))
    cases: list[tuple[str, Path]] = []
    ident = work / "identical.yaml"
    ident.write_text(IDENTICAL)
    cases += [(f"identical#{i + 1}", ident) for i in range(args.identical_runs)]
    if not args.no_side_stream:
        cases += [(f"side_stream_{t}", side_stream_yaml(work, t)) for t in ("trace", "events")]
    yamls = [Path(y) for y in args.yaml] if args.yaml is not None else sorted(ADV.glob("*.yaml"))
    cases += [(y.stem, y) for y in yamls]
    rows: list[dict] = []
    dest = args.json or (os.path.join(os.environ["OUT"], "gpu_verdicts.json") if os.environ.get("OUT") else None)
    expected = manifest_expectations()
    for i, (name, yaml) in enumerate(cases):
        report, wall, log = run_compare(yaml, work / f"run{i}", args.timeout, args.extra.split())
        if report is None:
            rows.append({"case": name, "kernel": "-", "verdict": "NO REPORT", "errors": [log[-300:]], "wall_s": wall})
            print(f"== {name}: no report\n{log}", flush=True)
            continue
        for r in rows_of(name, report, wall):
            r["expected"] = expected.get((yaml.resolve(), r["kernel"]))
            rows.append(r)
        print(f"== {name}: done in {wall:.1f} s", flush=True)
        if dest:  # after every case: a call cut short still leaves what it finished
            Path(dest).write_text(json.dumps(rows, indent=1))
    print(f"\n{'case':<22} {'kernel':<24} {'verdict':<12} {'expected':<16} {'speedup [95% CI]':<24} {'median us':>10} "
          f"{'timer':<20} {'wall s':>6}  flags / first error")
    for r in rows:
        ci = r.get("ci")
        sp = f"{r['speedup']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]" if r.get("speedup") is not None and ci else "-"
        med = f"{r['median_us']:.2f}" if r.get("median_us") else "-"
        note = ",".join(r.get("flags") or []) + (" | " + r["errors"][0] if r.get("errors") else "")
        exp = "/".join(r["expected"]) if r.get("expected") else "-"
        mark = "" if not r.get("expected") or r["verdict"] in r["expected"] else " !!"
        print(f"{r['case'][:22]:<22} {str(r['kernel'])[:24]:<24} {str(r['verdict'])[:12] + mark:<12} {exp[:16]:<16} "
              f"{sp:<24} {med:>10} "
              f"{str(r.get('timer') or '-')[:20]:<20} {r.get('wall_s', 0):>6}  {note[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
