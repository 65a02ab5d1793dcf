"""Every error the engine (or the workbench) lets reach a user is a MagpieError with a title."""

from __future__ import annotations

import json

import pytest

from engine.bench.gpu_select import GpuSelectionError
from engine.bench.http_client import HTTPError
from engine.bench.launch import LaunchError
from engine.bench.tokenizers import TokenizerError
from engine.config.yamlfile import ConfigError
from engine.errors import MagpieError, format_error
from engine.kernels.pipeline import MeasurementError
from engine.kernels.session import KernelRaised, WorkerError
from engine.runs.catalog import CancelRefused
from engine.trace.load import TraceError
from magpie_tui.settings import SettingsError
from magpie_tui.themes import ThemeFileError

ONE_MESSAGE = [TraceError, MeasurementError, CancelRefused, LaunchError, TokenizerError, HTTPError,
               GpuSelectionError, WorkerError, KernelRaised, SettingsError, ThemeFileError]


def _kernel_error():
    pytest.importorskip("torch")
    from engine.serve.kernels import KernelError
    return KernelError


def _all_errors() -> list[MagpieError]:
    errors: list[MagpieError] = [cls("something went wrong") for cls in ONE_MESSAGE]
    errors.append(ConfigError(["a.yaml:3: field x: expected a number"]))
    errors.append(_kernel_error()("kernels.rmsnorm: no such module"))
    return errors


@pytest.mark.parametrize("exc", _all_errors(), ids=lambda e: type(e).__name__)
def test_each_error_is_a_magpie_error_with_a_title(exc):
    assert isinstance(exc, MagpieError)
    assert isinstance(type(exc).title, str) and type(exc).title.strip()
    assert type(exc).title != MagpieError.title
    assert format_error(exc).startswith(f"error: {exc.title}: ")


@pytest.mark.parametrize("exc", _all_errors(), ids=lambda e: type(e).__name__)
def test_to_dict_is_json_able(exc):
    d = json.loads(json.dumps(exc.to_dict()))
    assert d["error"] == type(exc).__name__
    assert d["title"] == exc.title
    assert d["message"] == exc.message


def test_message_is_unchanged():
    for cls in ONE_MESSAGE:
        assert str(cls("exactly this")) == "exactly this"


def test_config_error_details_are_its_problems():
    problems = ["a.yaml:3: field x: expected a number", "a.yaml:7: unknown field y"]
    exc = ConfigError(problems)
    assert exc.problems == problems
    assert exc.details() == problems
    assert str(exc) == "\n".join(problems)
    assert exc.title == "configuration problem"
    assert exc.to_dict()["details"] == problems
    assert format_error(exc).splitlines() == ["error: configuration problem: nothing was run"] + [f"  {p}" for p in problems]


def test_kernel_raised_keeps_its_traceback():
    exc = KernelRaised("ZeroDivisionError: division by zero", "Traceback ...\n  line 3\n")
    assert str(exc) == "ZeroDivisionError: division by zero"
    assert exc.traceback.startswith("Traceback")
    assert exc.details() == ["Traceback ...", "  line 3"]
    assert KernelRaised("no traceback").details() == []


def test_second_bases_are_kept():
    assert isinstance(CancelRefused("x"), RuntimeError)
    assert isinstance(SettingsError("x"), ValueError)
    assert isinstance(ThemeFileError("x"), ValueError)
    assert isinstance(_kernel_error()("x"), ValueError)


def test_title_and_hint_can_be_given_per_instance():
    exc = LaunchError("boom", hint="look at the log")
    assert exc.hint == "look at the log" and LaunchError.hint is None
    assert format_error(exc).endswith("hint: look at the log")
