"""A trace of the built-in server names the engine's own Triton kernels (engine/serve/triton_kernels.py):
the Kernel screen finds their source on any machine, beside the project's and the run's repositories."""

from __future__ import annotations

from pathlib import Path

from tui.conftest import find_run, open_runs

from magpie_tui.screens.kernel import locate_sources, source_repos

ENGINE = Path(__file__).resolve().parents[2] / "engine"


async def test_the_built_in_servers_triton_kernels_resolve_to_their_source(app, project):
    async with app.run_test(size=(120, 30)) as pilot:
        await open_runs(pilot, app)
        repos = source_repos(find_run(app, "trace_"), project)
    assert repos[0] == project and ENGINE / "serve" in repos
    found = {s["kernel"]: s for s in locate_sources(["_rmsnorm_kernel", "_silu_and_mul_kernel"], repos)}
    for name in ("_rmsnorm_kernel", "_silu_and_mul_kernel"):
        assert found[name]["status"] == "resolved", found[name]
        assert found[name]["path"] == ENGINE / "serve" / "triton_kernels.py"
        assert found[name]["confidence"] >= 0.9
