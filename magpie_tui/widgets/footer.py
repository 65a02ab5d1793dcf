"""``KeysFooter``: the footer of every workbench screen. Its keys fit the terminal's width.

Textual's ``Footer`` lays its keys out in one row and lets whatever does not fit fall off the
right edge, so at 80 columns a screen with many keys lost ``?`` (help) and ``ctrl+q`` (quit),
and on the Diff screen, where the diff view's own keys come first, ``c`` (compare). This footer
leaves keys out instead, least needed first, until the rest fits:

1. ``:`` (the command palette; Help names it), then the side keys ``1``/``2`` together (their
   screens name them too);
2. the keys the screen does not name as main ones, from the right;
3. the screen's main keys, from the least needed one.

A screen names its main keys in ``FOOTER_KEYS``: binding ids (its own or its widgets', such as
``grid.sort``), most needed first. Keys keep their order in the footer. ``?`` and quit always
stay, and ``?`` lists every key of the screen, shown here or not.

Example::

    class DiffScreen(Screen):
        BINDINGS = [Binding("escape", "app.pop_screen", "Back", id="diff.back"),
                    Binding("c", "launch_compare", "Compare marked", id="diff.compare")]
        FOOTER_KEYS = ("diff.back", "diff.compare", "diff.toggle_split", "diff.next_hunk")
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.cells import cell_len
from textual import events
from textual.binding import Binding
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

__all__ = ["ALWAYS_SHOWN", "KeysFooter", "LEFT_OUT_FIRST"]

ALWAYS_SHOWN = ("app.help", "app.quit")
"""Binding ids that are never left out: how to find every other key (Help names ``:`` too), and how to leave."""
LEFT_OUT_FIRST = ("app.configs", "app.runs", "app.palette")
"""Binding ids left out (together) before any of the screen's keys: at 80 columns a screen's own
keys matter more than the side keys and ``:`` (the palette, which ``?`` names)."""


class KeysFooter(Footer):
    """A compact footer (the command palette shown as ``:``; ctrl+p opens it too) whose keys
    fit its width, keeping the screen's main keys (``FOOTER_KEYS``) longest."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("compact", True)
        kwargs.setdefault("show_command_palette", False)
        super().__init__(**kwargs)
        self._laid_out_for = 0  # the width the keys were last chosen for
        self._shown: tuple | None = None  # what the keys composed last show

    def _chosen(self) -> list:
        """The keys to show at this width: (binding, enabled, tooltip, key display)."""
        # One key per action, as Footer shows them (the first binding of an action wins).
        by_action: dict[str, tuple[Binding, bool, str]] = {}
        for _node, binding, enabled, tooltip in self.screen.active_bindings.values():
            if binding.show:
                by_action.setdefault(binding.action, (binding, enabled, tooltip))
        keys = [(binding, enabled, tooltip, self.app.get_key_display(binding))
                for binding, enabled, tooltip in by_action.values()]
        main = tuple(getattr(self.screen, "FOOTER_KEYS", ()))
        return self._fitting(keys, self._width(), main)

    @staticmethod
    def _what_shows(keys: list) -> tuple:
        return tuple((b.key, b.action, b.description, enabled, tooltip, display) for b, enabled, tooltip, display in keys)

    def compose(self) -> Iterator[FooterKey]:
        if not self._bindings_ready:
            return
        self._laid_out_for = self._width()
        keys = self._chosen()
        self._shown = self._what_shows(keys)
        for binding, enabled, tooltip, key_display in keys:
            yield FooterKey(binding.key, key_display, binding.description, binding.action,
                            disabled=not enabled, tooltip=tooltip).data_bind(compact=Footer.compact)

    def bindings_changed(self, screen) -> None:
        # Footer recomposes on every change of the screen's bindings (each focus move, each
        # screen opened); most leave the shown keys as they were, and a recompose restyles every key.
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    async def _recompose_if_changed(self) -> None:
        if not self.is_attached:
            return
        if self._shown is None or self._what_shows(self._chosen()) != self._shown:
            await self.recompose()

    def _width(self) -> int:
        return self.size.width or self.app.size.width

    @staticmethod
    def _fitting(keys: list, width: int, main: tuple[str, ...] = ()) -> list:
        """``keys`` less those left out (in the order of the module's docstring) until they fit;
        ``main``: the binding ids of the screen's main keys, most needed first."""
        def cells(key) -> int:  # a compact key: "k Description" and one column between keys
            binding, _enabled, _tooltip, key_display = key
            return cell_len(key_display) + (1 + cell_len(binding.description) if binding.description else 0) + 1

        total = sum(cells(k) for k in keys) - 1
        ids = [k[0].id for k in keys]
        kept = ALWAYS_SHOWN + LEFT_OUT_FIRST
        # Groups of keys, left out a group at a time: : first, then 1 and 2 together (one without
        # the other misleads).
        candidates = [[ids.index(i) for i in group if i in ids] for group in (LEFT_OUT_FIRST[2:], LEFT_OUT_FIRST[:2])]
        candidates += [[n] for n in reversed(range(len(keys))) if ids[n] not in kept and ids[n] not in main]
        candidates += [[ids.index(i)] for i in reversed(main) if i in ids and i not in kept]
        left_out: set[int] = set()
        for group in candidates:
            if total <= width:
                break
            left_out.update(group)
            total -= sum(cells(keys[n]) for n in group)
        return [k for n, k in enumerate(keys) if n not in left_out]

    def on_resize(self, event: events.Resize) -> None:
        if self._bindings_ready and event.size.width != self._laid_out_for:
            self._laid_out_for = event.size.width
            self.call_after_refresh(self._recompose_if_changed)
