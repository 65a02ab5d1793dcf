"""Launch: start analyze, compare, benchmark or optimize (the optimization loop on a clean
benchmark config) from the selected config, with the common overrides and a preview of the
effective config before anything starts."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from engine.errors import MagpieError
from engine.jobs.launch import BENCH_FORM_FIELDS, command_line, config_path, effective_config, form_request
from engine.jobs.query import STEP_NAMES, ConfigCheck, ConfigError, optimizable_ops
from engine.jobs.requests import OVERRIDES
from magpie_tui.errors import error_text
from magpie_tui.launching import start_run

_INT_FIELDS = ("repeats", "concurrency", "input_len", "output_len", "num_prompts", "warmup", "seed")
_FLOAT_FIELDS = ("timeout", "rtol", "atol")
_BENCH_FIELDS = ("concurrency", "input_len", "output_len", "num_prompts", "profiler")
_KERNEL_FIELDS = ("rtol", "atol")
_KERNEL_SOURCES = {k: ("settings", k) for k in ("repeats", "warmup", "seed", "rtol", "atol")}
_TIMING_MODES = ("analyze", "compare", "benchmark", "optimize")


def _config_value(bench: dict, path: str) -> Any:
    """A value of the effective ``benchmark:`` config by its dotted place (``envs.CONC``)."""
    node: Any = bench
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def config_defaults(check: ConfigCheck, preview: Optional[Callable[[Any], tuple]] = None) -> dict[str, str]:
    """The config's own value of each override field ("config: 4"), for the placeholders; empty
    where the config leaves it to the default. Reads the file the way a run would (``preview``:
    the screen's memo of ``effective_config``)."""
    mode = check.modes[0] if check.modes else None
    if mode is None:
        return {}
    try:
        req = form_request(mode, check.path)
        config, _overrides, _warnings = preview(req)[1:] if preview else effective_config(req)
    except (ConfigError, ValueError, OSError):
        return {}
    out: dict[str, str] = {}
    if "benchmark" in config:
        bench = config["benchmark"]
        for field, name in BENCH_FORM_FIELDS.items():
            value = _config_value(bench, OVERRIDES[name].config)  # where the override lands
            if field in _INT_FIELDS + _FLOAT_FIELDS and value not in (None, ""):
                out[field] = str(value)
    else:
        settings = config.get("settings") or {}
        for field, (_section, key) in _KERNEL_SOURCES.items():
            if settings.get(key) is not None:
                out[field] = str(settings[key])
        if settings.get("perf_timeout_s") is not None:
            out["timeout"] = str(settings["perf_timeout_s"])
    return out


class LaunchScreen(ModalScreen):
    """Dismisses with the ``StartedRun``, or None when cancelled."""

    BINDINGS = [
        Binding("ctrl+s", "start", "Start", id="launch.start", priority=True),
        Binding("escape", "cancel", "Cancel", id="launch.cancel"),
    ]

    def __init__(self, check: ConfigCheck) -> None:
        super().__init__()
        self.check = check
        self.request: Any = None  # the typed request the form shows (engine.jobs.requests)
        self.problem: str | None = None
        self._previews: dict[tuple, tuple] = {}

    def _preview(self, request: Any) -> tuple:
        """(prepared, config, overrides, warnings) of a launch: its prepare() runs once for each
        distinct request and state of the file, not again for a keystroke that leaves the request
        as it was (or goes back to an earlier one), nor again when it starts."""
        try:
            st = os.stat(config_path(request) or self.check.path)
            stamp: Optional[tuple] = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        key = (request.to_json(), stamp)
        if key not in self._previews:
            if len(self._previews) > 64:
                self._previews.clear()
            prepared = request.prepare()
            self._previews[key] = (prepared, *effective_config(request, prepared))
        return self._previews[key]

    def compose(self):
        modes = self.check.modes
        self.defaults = config_defaults(self.check, self._preview)

        def hint(field: str) -> str:
            return f"config: {self.defaults[field]}" if field in self.defaults else "config's default"
        with Vertical(id="launch-dialog"):
            yield Static(f"Launch from {self.check.path.name} — blank fields keep the config's value",
                         id="launch-title")
            with Horizontal(id="launch-body"):
                with VerticalScroll(id="launch-form"):
                    yield Label("Mode")
                    yield Select([(m, m) for m in modes], value=modes[0], allow_blank=False, id="mode", compact=True)
                    yield Label("Repeats", classes="-repeats")
                    yield Input(placeholder=hint("repeats"), type="integer", id="repeats", classes="-repeats", compact=True)
                    yield Label("Baseline", classes="-compare")
                    yield Select([(k, k) for k in self.check.kernel_ids], prompt="config's baseline",
                                 id="baseline", classes="-compare", compact=True)
                    for field, label in (("concurrency", "Concurrency"), ("input_len", "Input length"),
                                         ("output_len", "Output length"), ("num_prompts", "Prompts")):
                        yield Label(label, classes="-benchmark")
                        yield Input(placeholder=hint(field), type="integer", id=field, classes="-benchmark", compact=True)
                    yield Label("Torch profiler", classes="-benchmark")
                    yield Select([("on", "on"), ("off", "off")], prompt="as in the config", id="profiler",
                                 classes="-benchmark", compact=True)
                    for field, label, kind in (("warmup", "Warm-up", "integer"), ("timeout", "Timeout s", "number"),
                                               ("seed", "Seed", "integer")):
                        yield Label(label, classes="-repeats")
                        yield Input(placeholder=hint(field), type=kind, id=field, classes="-repeats", compact=True)
                    for field, label in (("rtol", "rtol"), ("atol", "atol")):
                        yield Label(label, classes="-kernel")
                        yield Input(placeholder=hint(field), type="number", id=field, classes="-kernel", compact=True)
                    yield Checkbox("No timing (--no-perf)", id="no_perf", classes="-kernel")
                    yield Label("Stop after step", classes="-optimize")
                    yield Select([(f"{i}. {name}", name) for i, name in enumerate(STEP_NAMES, 1)],
                                 prompt="every step", id="until", classes="-optimize", compact=True)
                    yield Label("Kernel (op)", classes="-optimize")
                    yield Select([(op, op) for op in optimizable_ops()], prompt="the top replaceable row",
                                 id="kernel", classes="-optimize", compact=True)
                    yield Label("Candidates", classes="-optimize")
                    yield Input(placeholder="files or folders, space-separated (relative: to the config's folder)",
                                id="candidates", classes="-optimize", compact=True)
                    yield Checkbox("Bundled library's candidates too", value=True, id="library", classes="-optimize")
                yield VerticalScroll(Static("", id="launch-preview-text"), id="launch-preview")
            with Horizontal(id="launch-buttons"):
                yield Button("Start (ctrl+s)", variant="primary", id="start")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self._update()
        # Typing starts in the first number field, never on Start (a digit typed there is lost).
        first = next((w for w in self.query(Input) if w.display), None)
        if first is not None:
            first.focus()

    def on_checkbox_changed(self, _event: Checkbox.Changed) -> None:
        self._update()

    def on_input_changed(self, _event: Input.Changed) -> None:
        self._update()

    def on_select_changed(self, _event: Select.Changed) -> None:
        self._update()

    def _value(self, widget_id: str):
        widget = self.query_one(f"#{widget_id}")
        if isinstance(widget, Select):
            return None if widget.is_blank() else widget.value
        if isinstance(widget, Checkbox):
            return widget.value
        text = widget.value.strip()
        if not text:
            return None
        return float(text) if widget_id in _FLOAT_FIELDS else int(text)

    def _candidates(self) -> list[str]:
        """The candidate paths typed, each relative to the config's folder unless absolute or ~."""
        text = self.query_one("#candidates", Input).value
        base = self.check.path.parent
        try:
            words = shlex.split(text)
        except ValueError as exc:  # an unclosed quote
            raise ConfigError([f"launch form: candidates: {exc}"]) from None
        return [str(base / Path(c).expanduser()) for c in words]

    def _update(self) -> None:
        mode = self._value("mode")
        optimize = mode == "optimize"
        kernel = mode in ("analyze", "compare")
        for cls, on in (("-compare", mode == "compare"), ("-benchmark", mode == "benchmark"),
                        ("-optimize", optimize), ("-repeats", not optimize), ("-kernel", kernel)):
            for widget in self.query(f".{cls}"):
                widget.display = on
        try:
            # The loop sets its own repeats and workload (the clean config's): no overrides.
            values = {} if optimize else {f: self._value(f) for f in _INT_FIELDS + _FLOAT_FIELDS}
        except ValueError:
            self._show_problem("numbers only in the override fields")
            return
        profiler = self._value("profiler") if mode == "benchmark" else None
        try:
            req = form_request(mode, self.check.path,
                               baseline=self._value("baseline") if mode == "compare" else None,
                               profiler=None if profiler is None else profiler == "on",
                               until=self._value("until") if optimize else None,
                               kernel=self._value("kernel") if optimize else None,
                               candidates=self._candidates() if optimize else None,
                               library=bool(self._value("library")) if optimize else True,
                               no_perf=bool(self._value("no_perf")) if kernel else False,
                               **{k: v for k, v in values.items() if (mode == "benchmark" or k not in _BENCH_FIELDS)
                                  and (kernel or k not in _KERNEL_FIELDS)})
            _prepared, config, overrides, warnings = self._preview(req)
        except ConfigError as exc:
            self._show_problem("\n".join(exc.problems))
            return
        self.request, self.problem = req, None
        lines = [f"$ magpie {' '.join(command_line(req, self.app.settings.launch_results_dir)[3:])}", ""]
        if overrides:
            lines.append("overrides:")
            lines += [f"  {o['field']}: {o['yaml']!r} -> {o['cli']!r} ({o['flag']})" for o in overrides]
        lines += [f"warning: {w}" for w in warnings]
        busy = [r for r in self.app.runs if r.state == "running" and r.mode in _TIMING_MODES]
        if busy and mode in _TIMING_MODES:
            # Two timing runs on one machine disturb each other's numbers.
            lines.append(f"warning: {len(busy)} timing run(s) already running ({', '.join(r.name for r in busy[:2])}):"
                         " both sets of timings will be disturbed; wait, or cancel it on the Runs screen")
        heading = ("the baseline step's config (the loop raises its repeats to the minimum a confidence interval "
                   "needs, and derives the profiled twin from it):" if optimize else "effective config:")
        lines += ["", heading, yaml.safe_dump(config, sort_keys=False, default_flow_style=False)]
        preview = self.query_one("#launch-preview-text", Static)
        preview.update("\n".join(lines))
        preview.set_class(False, "-invalid")
        self.query_one("#start", Button).disabled = False

    def _show_problem(self, text: str) -> None:
        self.request, self.problem = None, text
        preview = self.query_one("#launch-preview-text", Static)
        preview.update("cannot start:\n" + text)
        preview.set_class(True, "-invalid")
        self.query_one("#start", Button).disabled = True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        else:
            self.action_cancel()

    def action_start(self) -> None:
        if self.request is None:
            self.notify(self.problem or "nothing to start", severity="error")
            return
        try:
            # The preview's check, again only when the file changed since it was shown.
            started = start_run(self.request, self.app.settings.launch_results_dir,
                                prepared=self._preview(self.request)[0])
        except MagpieError as exc:  # the file changed since the preview checked it, and no longer checks out
            self._show_problem(error_text(exc))
            return
        except OSError as exc:
            self._show_problem(f"could not start: {exc}")
            return
        self.dismiss(started)

    def action_cancel(self) -> None:
        self.dismiss(None)
