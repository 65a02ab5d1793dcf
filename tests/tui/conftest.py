"""Fixtures for the workbench tests: a project folder with recorded run folders, and the app
built on it, with everything that varies between machines pinned (paths, time zone, blink)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from textual.app import App

from magpie_tui.app import WorkbenchApp
from magpie_tui.settings import load_settings
from magpie_tui.themes import load_themes, semantic_defaults

REPO = Path(__file__).resolve().parents[2]
# Snapshots show paths: build the project at a fixed place so the SVGs do not change per run.
SNAPSHOT_ROOT = Path("/tmp/magpie-tui-tests")


def _keep_parsed_css() -> None:
    """Parse each CSS source once per test process. Textual parses the app's CSS and every
    widget's DEFAULT_CSS again for each app (its cache lives in one Stylesheet, and a theme change
    builds a new one): about a third of an app's start, and the tests start hundreds of apps. The
    rules are a function of the CSS text, where it was read from, its scope and the theme's
    variables, all in the key; Textual reads them and never changes them."""
    from textual.css.stylesheet import Stylesheet
    parse = Stylesheet._parse_rules
    kept: dict = {}

    def parse_once(self, css, read_from, is_default_rules=False, tie_breaker=0, scope=""):
        key = (css, read_from, is_default_rules, tie_breaker, scope, tuple(sorted(self._variables.items())))
        rules = kept.get(key)
        if rules is None:
            rules = kept[key] = parse(self, css, read_from, is_default_rules, tie_breaker, scope)
        return rules

    Stylesheet._parse_rules = parse_once


_keep_parsed_css()


@pytest.fixture(autouse=True)
def snapshot_root_held(request):
    """A test module that builds its project at SNAPSHOT_ROOT holds it alone: a second test suite
    running on the same machine would otherwise rebuild the folder under a test's feet."""
    if "SNAPSHOT_ROOT" not in getattr(request.module, "__dict__", {}):
        yield
        return
    import fcntl
    with open(str(SNAPSHOT_ROOT) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


GPU_RUN = "benchmark_builtin-1b_20261206_204557_017c5f"
"""The recorded run of the built-in 1B server profiled on an H100 (``examples/runs``): left out of
the test project unless asked for, so the lists and pictures of the other tests stay as they are."""


def make_project(root: Path, *, gpu_run: bool = False) -> Path:
    """A copy of ``examples/``: kernels, benchmark configs and the recorded runs in ``runs/``
    (their paths are relative to their folders, so the copy is self-contained); the GPU-recorded
    run only with ``gpu_run``."""
    if root.exists():
        shutil.rmtree(root)
    project = root / "project"
    left_out = ["__pycache__", "results"] + ([] if gpu_run else [GPU_RUN])
    shutil.copytree(REPO / "examples", project, ignore=shutil.ignore_patterns(*left_out))
    return project


@pytest.fixture(autouse=True)
def pinned_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("MAGPIE_TUI_CONFIG", str(tmp_path / "settings" / "tui.yaml"))
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
    from textual.widgets import Input
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None, raising=False)
    yield
    os.environ.pop("TZ", None)
    time.tzset()


@pytest.fixture
def project(tmp_path) -> Path:
    return make_project(tmp_path / "work")


def build_app(project: Path, **kwargs) -> WorkbenchApp:
    settings = load_settings(project, [project / "runs", project / "results"])
    kwargs.setdefault("watch_files", False)
    kwargs.setdefault("poll_interval", 0.1)
    return WorkbenchApp(settings, **kwargs)


@pytest.fixture
def app(project) -> WorkbenchApp:
    return build_app(project)


class Harness(App):
    """One widget alone in an app with the workbench's themes registered (widget tests)."""

    def __init__(self, widget):
        super().__init__()
        self._w = widget

    def get_theme_variable_defaults(self):
        return semantic_defaults()

    def compose(self):
        yield self._w

    def on_mount(self):
        for t in load_themes()[0]:
            self.register_theme(t)
        self.theme = "magpie-dark"


# -- pilot helpers shared by the workbench tests ------------------------------------------------

async def wait_for(pilot, condition, timeout: float = 10.0, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(step)


async def wait_screen(pilot, app, cls, selector: str = "Footer", timeout: float = 10.0) -> None:
    """Until ``cls`` is the active screen and its widgets are mounted (``selector`` found)."""
    await wait_for(pilot, lambda: isinstance(app.screen, cls) and bool(app.screen.query(selector)), timeout)
    await pilot.pause()


async def open_launch(pilot, app, config: Path):
    """From the Configs tree: select ``config`` and open its launch form (``l``); returns the form."""
    from magpie_tui.screens.configs import ConfigsScreen
    from magpie_tui.screens.launch import LaunchScreen
    await wait_screen(pilot, app, ConfigsScreen)
    app.screen.select(config)
    await pilot.press("l")
    await wait_screen(pilot, app, LaunchScreen, "#start")
    return app.screen


def find_run(app, prefix: str):
    """The catalog's run whose folder name starts with ``prefix``."""
    return next(r for r in app.runs if r.name.startswith(prefix))


async def open_runs(pilot, app) -> None:
    """Switch to the Runs list and wait until it lists the catalog."""
    from magpie_tui.screens.runs import RunsScreen
    await pilot.press("2")
    await wait_screen(pilot, app, RunsScreen, "#runs-table")
    await wait_for(pilot, lambda: bool(app.runs))
