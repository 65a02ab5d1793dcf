"""The launch form checks each distinct request once (not once per keystroke that comes back to
an earlier one), and starts the run it showed without checking it again."""

from __future__ import annotations

from tui.conftest import open_launch

from engine.jobs.requests import BenchmarkRequest
from magpie_tui.screens import launch as launch_screen

SIZE = (140, 45)


async def test_the_form_prepares_each_request_once_and_starts_what_it_showed(app, project, monkeypatch):
    calls: list[dict] = []
    real = BenchmarkRequest._prepare_one
    monkeypatch.setattr(BenchmarkRequest, "_prepare_one",
                        lambda self, *a, **k: calls.append(self.flags.given()) or real(self, *a, **k))
    started = []
    monkeypatch.setattr(launch_screen, "start_run",
                        lambda req, output_dir=None, prepared=None: started.append((req, prepared)))
    async with app.run_test(size=SIZE) as pilot:
        dialog = await open_launch(pilot, app, project / "benchmarks" / "builtin_tiny_cpu.yaml")
        assert calls == [{}]  # the placeholders and the first preview: one check
        for text in ("3", "", "3", "31", "3"):  # back to requests already checked: not again
            dialog.query_one("#concurrency").value = text
            await pilot.pause()
        assert calls == [{}, {"concurrency": 3}, {"concurrency": 31}]
        assert "--concurrency 3" in str(dialog.query_one("#launch-preview-text").render())
        dialog.action_start()
        await pilot.pause()
    assert len(calls) == 3  # the start checked nothing again
    (req, prepared), = started
    assert req.flags.concurrency == 3 and prepared.config.envs["CONC"] == "3"
