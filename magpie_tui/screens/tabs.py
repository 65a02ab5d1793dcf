"""``[`` / ``]``: previous / next tab on every screen with tabs (the Run screen, the reports,
the roofline), so switching tabs never needs Shift+Tab to reach the tab bar first."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import TabbedContent, TabPane


def tab_bindings(where: str) -> list[Binding]:
    return [Binding("right_square_bracket", "next_tab", "Next tab", id=f"{where}.next_tab"),
            Binding("left_square_bracket", "previous_tab", "Prev tab", show=False, id=f"{where}.previous_tab")]


def cycle_tab(screen, step: int, focus: bool = True) -> str | None:
    """Activate the tab ``step`` places on (wrapping); the id of the tab now shown. ``focus``:
    the new tab's first control takes the focus (False: the focus stays where it is, for a screen
    whose keys act on a widget outside the tabs)."""
    found = screen.query(TabbedContent)
    if not found:
        return None
    tabs = found.first(TabbedContent)
    panes = [p.id for p in tabs.query(TabPane) if p.id and not p.disabled]
    if not panes:
        return None
    current = panes.index(tabs.active) if tabs.active in panes else 0
    if not focus:
        tabs.active = panes[(current + step) % len(panes)]
        return tabs.active
    # Let go of the focus first (a control focused in the tab being hidden would pass it to a
    # neighbour there, and TabbedContent would switch back), then focus the new tab's first control.
    screen.set_focus(None)
    tabs.active = panes[(current + step) % len(panes)]
    pane = tabs.get_pane(tabs.active)
    first = next((w for w in pane.query("*") if w.focusable), None)
    if first is not None:
        first.focus()
    return tabs.active
