"""The adversarial suite (examples/kernels/adversarial): faulty and cheating kernels, and honest
controls, each with the verdict `magpie compare` must give it (manifest.yaml).

Each CPU compare YAML runs once (a module-scoped fixture per YAML) with --seed 1, and every
manifest case of that YAML is checked against the report: its verdict, and where the manifest
names them an error substring and a guard flag. The CUDA cases are only checked for shape
here (their YAMLs and files exist); they run by hand on a GPU.
"""

from pathlib import Path

import pytest
import yaml

from conftest import EXAMPLES, read_report, run_magpie

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: timed verdicts need the machine alone

SUITE = EXAMPLES / "adversarial"
MANIFEST = yaml.safe_load((SUITE / "manifest.yaml").read_text())
CASES: list[dict] = MANIFEST["cases"]
REPORTS: dict[str, dict] = {r["yaml"]: r for r in MANIFEST.get("reports") or []}
CPU_YAMLS = sorted({c["yaml"] for c in CASES if c["device"] == "cpu"})
VERDICTS = {"baseline", "faster", "slower", "tie", "incorrect", "rejected", "not measured", "cancelled"}


def _allowed(case: dict) -> list[str]:
    v = case["expect"]["verdict"]
    return list(v) if isinstance(v, list) else [v]


def _yaml_kernels(rel: str) -> list[dict]:
    return yaml.safe_load((SUITE / rel).read_text())["kernels"]


def _messages(result: dict) -> str:
    """Everything the report says went wrong with one kernel: its errors and its guard flags."""
    flags = (result.get("guards") or {}).get("flags") or []
    return "\n".join(list(result.get("errors") or []) + [str(f.get("message", "")) for f in flags])


# ----------------------------------------------------------------------------- the manifest itself

def test_manifest_is_complete_and_consistent():
    ids = [c["id"] for c in CASES]
    assert len(CASES) >= 15, f"the suite has only {len(CASES)} cases"
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    yamls = sorted({c["yaml"] for c in CASES})
    for c in CASES:
        assert c["device"] in ("cpu", "cuda"), c
        assert c["yaml"].startswith(c["device"] + "/"), c
        assert set(_allowed(c)) <= VERDICTS, c
        assert set(c["expect"]) <= {"verdict", "error_contains", "flag"}, c
        assert c.get("why"), c
    for rel in yamls:
        kernels = _yaml_kernels(rel)
        kids = [k["id"] for k in kernels]
        listed = [c["kernel"] for c in CASES if c["yaml"] == rel]
        # every kernel of a YAML has exactly one case, and every case names a kernel of its YAML
        assert sorted(listed) == sorted(kids), (rel, sorted(set(kids) ^ set(listed)))
        baselines = [k["id"] for k in kernels if k.get("baseline")]
        assert len(baselines) == 1, (rel, baselines)
        for c in CASES:
            if c["yaml"] == rel:
                assert ("baseline" in _allowed(c)) == (c["kernel"] == baselines[0]), c
        for k in kernels:
            for src in k["source_files"]:
                assert (SUITE / rel).parent.joinpath(src).is_file(), (rel, k["id"], src)
    for rel in REPORTS:
        assert rel in yamls, rel
    readme = (SUITE / "README.md").read_text()
    missing = [c["id"] for c in CASES if f"`{c['id']}`" not in readme]
    assert not missing, f"README.md does not list {missing}"


# ----------------------------------------------------------------------------- one compare per CPU YAML

@pytest.fixture(scope="module")
def pidfile(tmp_path_factory) -> Path:
    """Where a kernel that detaches a process (detached_process.py) writes its pid: one path for
    every compare of the module, so that all of them run in the same environment and fork their
    workers from the session's one shared fork server (its environment is part of the key: a
    path per compare would make each compare start a server of its own, torch and all)."""
    return tmp_path_factory.mktemp("adversarial_pids") / "detached.pids"


@pytest.fixture(scope="module", params=CPU_YAMLS)
def compare_run(request, tmp_path_factory, pidfile):
    rel = request.param
    out = tmp_path_factory.mktemp(Path(rel).stem)
    pidfile.unlink(missing_ok=True)
    proc = run_magpie("compare", "-k", SUITE / rel, "-o", out, "--seed", "1", timeout=1500,
                      env={"MAGPIE_ADVERSARIAL_PIDFILE": str(pidfile)})
    if pidfile.exists():  # this compare's detached pids, read by test_no_detached_process_outlives_the_run
        pidfile.rename(out / "detached.pids")
    return rel, proc, out


def _report(proc, out: Path) -> dict:
    try:
        return read_report(out)
    except (AssertionError, OSError, ValueError) as exc:
        pytest.fail(f"no compare report ({exc}); exit {proc.returncode}\n"
                    f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")


def test_every_case_gets_its_verdict(compare_run):
    rel, proc, out = compare_run
    report = _report(proc, out)
    results = report["results"]["kernel_results"]
    assert [r["kernel_id"] for r in results] == [k["id"] for k in _yaml_kernels(rel)]
    by_id = {r["kernel_id"]: r for r in results}
    problems = []
    for case in (c for c in CASES if c["yaml"] == rel):
        r = by_id[case["kernel"]]
        said = _messages(r)
        if r["verdict"] not in _allowed(case):
            problems.append(f"{case['id']}: verdict {r['verdict']!r}, expected {case['expect']['verdict']!r} "
                            f"(speedup {r.get('speedup')}, ci {r.get('speedup_ci')}; errors: {said[:400]!r})")
        want = case["expect"].get("error_contains")
        if want and want not in said:
            problems.append(f"{case['id']}: no error or flag contains {want!r}; it said {said[:600]!r}")
        flag = case["expect"].get("flag")
        if flag and flag not in [f.get("guard") for f in (r.get("guards") or {}).get("flags") or []]:
            problems.append(f"{case['id']}: no guard flag {flag!r}; flags {r.get('guards')!r}")
    assert not problems, f"{rel}:\n" + "\n".join(problems)


def test_no_detached_process_outlives_the_run(compare_run):
    """A grandchild that left the worker's process group with setsid is stopped, not left behind."""
    rel, proc, out = compare_run
    pidfile = out / "detached.pids"
    detaches = any(k["source_files"] == ["detached_process.py"] for k in _yaml_kernels(rel))
    assert pidfile.is_file() == detaches, (rel, proc.stderr[-2000:])
    if not detaches:
        return
    pids = [int(x) for x in pidfile.read_text().split()]
    assert pids
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"pid {pid} (a detached grandchild) still runs after the compare"


def test_report_level_expectations(compare_run):
    rel, proc, out = compare_run
    report = _report(proc, out)
    want = REPORTS.get(rel, {})
    degenerate = report.get("degenerate_test")
    if "degenerate_test" in want:
        assert degenerate and want["degenerate_test"] in degenerate, degenerate
    else:
        assert degenerate is None, degenerate
    if "winner_id" in want:
        assert report.get("winner_id") == want["winner_id"], (report.get("winner_id"), report.get("winner_reason"))
    # a kernel expected to be incorrect or rejected never wins, whatever it measured
    cheats = {c["kernel"] for c in CASES if c["yaml"] == rel and set(_allowed(c)) <= {"incorrect", "rejected"}}
    assert report.get("winner_id") not in cheats, (report.get("winner_id"), report.get("winner_reason"))
