"""Launch: start analyze, compare, benchmark or optimize (the optimization loop on a clean
benchmark config) from the selected config, with the common overrides and a preview of the
effective config before anything starts."""

from __future__ import annotations

import yaml
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from engine.config.yamlfile import ConfigError
from engine.errors import MagpieError
from engine.loop.schema import STEP_NAMES
from engine.runs.launch import ConfigCheck, LaunchRequest, effective_config, start_run
from magpie_tui.errors import error_text

_INT_FIELDS = ("repeats", "concurrency", "input_len", "output_len", "num_prompts")
_BENCH_FIELDS = ("concurrency", "input_len", "output_len", "num_prompts", "profiler")


class LaunchScreen(ModalScreen):
    """Dismisses with the ``StartedRun``, or None when cancelled."""

    BINDINGS = [
        Binding("ctrl+s", "start", "Start", id="launch.start", priority=True),
        Binding("escape", "cancel", "Cancel", id="launch.cancel"),
    ]

    def __init__(self, check: ConfigCheck) -> None:
        super().__init__()
        self.check = check
        self.request: LaunchRequest | None = None
        self.problem: str | None = None

    def compose(self):
        modes = self.check.modes
        with Vertical(id="launch-dialog"):
            yield Static(f"Launch from {self.check.path.name}", id="launch-title")
            with Horizontal(id="launch-body"):
                with VerticalScroll(id="launch-form"):
                    yield Label("Mode")
                    yield Select([(m, m) for m in modes], value=modes[0], allow_blank=False, id="mode")
                    yield Label("Repeats (blank: config)", classes="-repeats")
                    yield Input(placeholder="e.g. 20", type="integer", id="repeats", classes="-repeats")
                    yield Label("Baseline", classes="-compare")
                    yield Select([(k, k) for k in self.check.kernel_ids], prompt="config's baseline",
                                 id="baseline", classes="-compare")
                    for field, label in (("concurrency", "Concurrency"), ("input_len", "Input length"),
                                         ("output_len", "Output length"), ("num_prompts", "Prompts")):
                        yield Label(label, classes="-benchmark")
                        yield Input(type="integer", id=field, classes="-benchmark")
                    yield Label("Torch profiler", classes="-benchmark")
                    yield Select([("on", "on"), ("off", "off")], prompt="as in the config", id="profiler",
                                 classes="-benchmark")
                    yield Label("Stop after step", classes="-optimize")
                    yield Select([(f"{i}. {name}", name) for i, name in enumerate(STEP_NAMES, 1)],
                                 prompt="every step", id="until", classes="-optimize")
                yield VerticalScroll(Static("", id="launch-preview-text"), id="launch-preview")
            with Horizontal(id="launch-buttons"):
                yield Button("Start (ctrl+s)", variant="primary", id="start")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self._update()

    def on_input_changed(self, _event: Input.Changed) -> None:
        self._update()

    def on_select_changed(self, _event: Select.Changed) -> None:
        self._update()

    def _value(self, widget_id: str):
        widget = self.query_one(f"#{widget_id}")
        if isinstance(widget, Select):
            return None if widget.is_blank() else widget.value
        text = widget.value.strip()
        return int(text) if text else None

    def _update(self) -> None:
        mode = self._value("mode")
        optimize = mode == "optimize"
        for cls, on in (("-compare", mode == "compare"), ("-benchmark", mode == "benchmark"),
                        ("-optimize", optimize), ("-repeats", not optimize)):
            for widget in self.query(f".{cls}"):
                widget.display = on
        try:
            # The loop sets its own repeats and workload (the clean config's): no overrides.
            values = {} if optimize else {f: self._value(f) for f in _INT_FIELDS}
        except ValueError:
            self._show_problem("numbers only in the override fields")
            return
        profiler = self._value("profiler") if mode == "benchmark" else None
        req = LaunchRequest(mode=mode, config=self.check.path, output_dir=self.app.settings.launch_results_dir,
                            baseline=self._value("baseline") if mode == "compare" else None,
                            profiler=None if profiler is None else profiler == "on",
                            until=self._value("until") if optimize else None,
                            **{k: v for k, v in values.items() if mode == "benchmark" or k not in _BENCH_FIELDS})
        try:
            config, overrides, warnings = effective_config(req)
        except ConfigError as exc:
            self._show_problem("\n".join(exc.problems))
            return
        self.request, self.problem = req, None
        lines = [f"$ magpie {' '.join(req.argv()[3:])}", ""]
        if overrides:
            lines.append("overrides:")
            lines += [f"  {o['field']}: {o['yaml']!r} -> {o['cli']!r} ({o['flag']})" for o in overrides]
        lines += [f"warning: {w}" for w in warnings]
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
            started = start_run(self.request)
        except MagpieError as exc:  # the file changed since the preview checked it
            self._show_problem(error_text(exc))
            return
        except OSError as exc:
            self._show_problem(f"could not start: {exc}")
            return
        self.dismiss(started)

    def action_cancel(self) -> None:
        self.dismiss(None)
