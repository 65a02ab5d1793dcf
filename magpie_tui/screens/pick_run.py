"""Pick one run from a list; dismisses with the RunInfo or None."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from engine.jobs.query import RunInfo


class PickRunScreen(ModalScreen):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="pick.cancel")]

    def __init__(self, runs: list[RunInfo], question: str) -> None:
        super().__init__()
        self.runs = runs
        self.question = question

    def compose(self):
        with Vertical(id="confirm-dialog"):
            yield Static(self.question, id="confirm-question")
            yield OptionList(*[Option(f"{r.name}  ({r.state})", id=str(i)) for i, r in enumerate(self.runs)],
                             id="pick-list")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.runs[int(event.option.id)])

    def action_cancel(self) -> None:
        self.dismiss(None)
