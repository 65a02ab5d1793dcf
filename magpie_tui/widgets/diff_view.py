"""``DiffView``: a baseline kernel source against a candidate, side by side or unified, with in-line changes.

A line-API widget (``ScrollView`` + ``render_line``): only the rows on screen are rendered, so 50k-line diffs
scroll freely. The diff itself is ``magpie_tui.widgets.diff_model.DiffModel`` (plain Python, tested without
Textual).

Work off the event loop:

* texts over ``LARGE_TEXT_LINES`` lines are diffed in a thread worker while the widget shows its loading
  indicator;
* syntax highlighting (``textual.highlight.highlight``, i.e. Pygments) runs in a thread worker as soon as the
  diff is there, and the rows are shown plain until it lands. Pygments' Python lexer needs about 1 ms per line,
  so a file is highlighted in one piece up to ``HIGHLIGHT_CHUNK_LINES`` lines; longer files are highlighted
  only where the diff shows them, in chunks of that size, each re-lexed from ``HIGHLIGHT_LEAD_IN`` lines
  earlier so the lexer is in step (a construct open for longer than that, such as a huge block comment, can
  be coloured wrongly at a chunk start). Between chunks the worker checks for cancellation, so closing the
  view or the app never waits long on a thread. Tiny texts are highlighted at once.

Highlighting is cached per highlight theme (the Textual theme's token styles, or the ANSI ones for ANSI
themes); rendered rows are cached and thrown away when the app theme or the CSS changes. Colours come only
from the component classes, styled in ``DEFAULT_CSS`` with theme variables.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterable
from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style as RichStyle
from textual import on
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.content import Content, Span
from textual.geometry import Size
from textual.highlight import (
    ANSIDarkHighlightTheme,
    ANSILightHighlightTheme,
    HighlightTheme,
    guess_language,
    highlight,
)
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.worker import Worker, WorkerState, get_current_worker

from magpie_tui.widgets.diff_model import DiffCancelled, DiffModel, DiffRow, Spans

__all__ = ["DiffView", "language_for_path"]

#: Above this many lines (either text) the diff is computed in a thread worker.
LARGE_TEXT_LINES = 2000
#: Up to this many lines (both texts together) highlighting is done at once, on the event loop.
SYNC_HIGHLIGHT_LINES = 400
#: Files up to this long are highlighted in one piece; longer ones in chunks of this size.
HIGHLIGHT_CHUNK_LINES = 1000
#: Lines re-lexed before each chunk so the lexer state is right where the chunk starts.
HIGHLIGHT_LEAD_IN = 100
TAB_SIZE = 4
HATCH = "╱"

_LANGUAGES = {
    ".py": "python",
    ".cu": "cuda",
    ".cuh": "cuda",
    ".hip": "cpp",
    ".cpp": "cpp",
    ".cc": "cpp",
    ".h": "cpp",
    ".hpp": "cpp",
}
# Content strips control characters, which would shift every offset after them: show them as U+FFFD.
_CONTROL = {c: "\ufffd" for c in [*range(0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0)]}


def language_for_path(path: str, code: str = "") -> str:
    """Pygments language for a source path: by suffix for our kernel languages, otherwise a guess."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in _LANGUAGES:
        return _LANGUAGES[suffix]
    # Pygments' guess runs every lexer's analyser over the text: a sample is plenty and stays fast.
    return guess_language("\n".join(code.splitlines()[:200]), path or None)


class _Side:
    """One file as displayed: tabs expanded, control characters replaced, highlighting as it arrives."""

    def __init__(self, lines: list[str], path: str) -> None:
        self.path = path
        self.lines: list[str] = []
        self.tab_maps: dict[int, list[int]] = {}  # line index → display column of each character
        for index, line in enumerate(lines):
            if "\t" in line:
                columns: list[int] = []
                pieces: list[str] = []
                column = 0
                for char in line:
                    columns.append(column)
                    width = TAB_SIZE - column % TAB_SIZE if char == "\t" else 1
                    pieces.append(" " * width if char == "\t" else char)
                    column += width
                columns.append(column)
                self.tab_maps[index] = columns
                line = "".join(pieces)
            self.lines.append(line.translate(_CONTROL))
        self.max_cells = max((cell_len(line) for line in self.lines), default=0)
        self.language = language_for_path(path, "\n".join(self.lines[:200]))
        self.highlighted: dict[type[HighlightTheme], list[Content | None]] = {}

    def content(self, index: int, theme: type[HighlightTheme]) -> Content:
        done = self.highlighted.get(theme)
        if done is not None and (content := done[index]) is not None:
            return content
        return Content(self.lines[index])

    def spans(self, index: int, spans: Spans) -> Spans:
        """Character offsets in the file's line → offsets in the displayed line."""
        columns = self.tab_maps.get(index)
        if columns is None:
            return spans
        return tuple((columns[start], columns[end]) for start, end in spans)

    def pending(self, theme: type[HighlightTheme], chunks: list[tuple[int, int]]) -> list[tuple[int, int]]:
        done = self.highlighted.get(theme)
        return [chunk for chunk in chunks if done is None or done[chunk[0]] is None]

    def highlight_chunk(self, start: int, end: int, theme: type[HighlightTheme]) -> list[Content]:
        """Highlighted lines ``start``..``end`` (the lexer starts ``HIGHLIGHT_LEAD_IN`` lines earlier)."""
        lead = max(0, start - HIGHLIGHT_LEAD_IN)
        shown = self.lines[lead:end]
        code = "\n".join(shown)
        contents = highlight(code, language=self.language, path=self.path or None, theme=theme).split(
            "\n", allow_blank=True) if shown else []
        if len(contents) < len(shown):  # highlight() drops trailing blank lines
            contents.extend(Content(line) for line in shown[len(contents):])
        contents = contents[start - lead: len(shown)]
        for offset, content in enumerate(contents):
            if content.plain != shown[start - lead + offset]:  # never show text that differs from the file
                contents[offset] = Content(shown[start - lead + offset])
        return contents

    def store(self, theme: type[HighlightTheme], start: int, contents: list[Content]) -> None:
        done = self.highlighted.setdefault(theme, [None] * len(self.lines))
        done[start: start + len(contents)] = contents


def highlight_chunks(line_count: int, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The line ranges to highlight: the whole file when short, else the shown ``ranges`` in chunks."""
    if line_count <= HIGHLIGHT_CHUNK_LINES:
        return [(0, line_count)] if line_count else []
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if end <= start:
            continue
        if merged and start - merged[-1][1] <= HIGHLIGHT_LEAD_IN:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return [(chunk, min(end, chunk + HIGHLIGHT_CHUNK_LINES))
            for start, end in merged for chunk in range(start, end, HIGHLIGHT_CHUNK_LINES)]


class DiffView(ScrollView, can_focus=True):
    """A diff of two texts: side by side (``split``) or unified, with in-line changes highlighted.

    Keys: ``s`` toggles split, ``n`` / ``p`` jump to the next / previous hunk (binding ids ``diff.*``).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "toggle_split", "Split/unified", id="diff.toggle_split"),
        Binding("n", "next_hunk", "Next hunk", id="diff.next_hunk"),
        Binding("p", "prev_hunk", "Previous hunk", id="diff.prev_hunk"),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "diff-view--added",
        "diff-view--removed",
        "diff-view--added-inline",
        "diff-view--removed-inline",
        "diff-view--line-number",
        "diff-view--hatch",
        "diff-view--hunk-header",
    }

    DEFAULT_CSS = """
    DiffView {
        width: 1fr;
        height: 1fr;
        background: $surface;
        & > .diff-view--added { background: $diff-added; }
        & > .diff-view--removed { background: $diff-removed; }
        & > .diff-view--added-inline { background: $diff-added-inline; }
        & > .diff-view--removed-inline { background: $diff-removed-inline; }
        & > .diff-view--line-number { color: $muted; }
        & > .diff-view--hatch { color: $muted; background: $panel; }
        & > .diff-view--hunk-header { color: $primary; background: $panel; text-style: bold; }
    }
    """

    #: With ``auto_split``, side by side needs at least this many columns.
    AUTO_SPLIT_MIN_WIDTH: ClassVar[int] = 100

    split: reactive[bool] = reactive(True)
    """Side by side (True) or unified (False)."""
    annotations: reactive[bool] = reactive(True)
    """Show ``+`` / ``-`` markers on changed lines, so the diff reads without colour."""
    auto_split: reactive[bool] = reactive(False)
    """Choose ``split`` from the width: side by side at ``AUTO_SPLIT_MIN_WIDTH`` columns or more."""

    class Ready(Message):
        """The diff is computed and shown (after mount and after each ``set_texts``)."""

        def __init__(self, diff_view: DiffView) -> None:
            super().__init__()
            self.diff_view = diff_view

        @property
        def control(self) -> DiffView:
            return self.diff_view

    class _Computed(Message, bubble=False):
        def __init__(self, generation: int, model: DiffModel, sides: tuple[_Side, _Side]) -> None:
            super().__init__()
            self.generation = generation
            self.model = model
            self.sides = sides

    class _Highlighted(Message, bubble=False):
        def __init__(self, generation: int, theme: type[HighlightTheme], side: int, start: int,
                     contents: list[Content]) -> None:
            super().__init__()
            self.generation = generation
            self.theme = theme
            self.side = side
            self.start = start
            self.contents = contents

    def __init__(self, path_a: str, text_a: str, path_b: str, text_b: str, *, split: bool = True,
                 context: int = 3, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.set_reactive(DiffView.split, split)
        self._diff_context = max(0, context)
        self._generation = 0
        self._model: DiffModel | None = None
        self._sides: tuple[_Side, _Side] | None = None
        self._highlight_worker: tuple[type[HighlightTheme], Worker[None]] | None = None
        self._line_cache: LRUCache[tuple[object, ...], Strip] = LRUCache(1024)
        self._styles: dict[str, RichStyle] = {}
        self._jump: tuple[int, int] | None = None
        self._set_texts(path_a, text_a, path_b, text_b)

    # -- public API -------------------------------------------------------------------------------------------

    @property
    def path_a(self) -> str:
        return self._path_a

    @property
    def path_b(self) -> str:
        return self._path_b

    @property
    def model(self) -> DiffModel | None:
        """The computed diff, or None while a worker is still computing it."""
        return self._model

    @property
    def hunk_count(self) -> int:
        return self._model.hunk_count if self._model else 0

    @property
    def added_lines(self) -> int:
        return self._model.added_lines if self._model else 0

    @property
    def removed_lines(self) -> int:
        return self._model.removed_lines if self._model else 0

    @property
    def rows(self) -> list[DiffRow]:
        """The rows of the current layout (empty while computing)."""
        return self._model.rows(self.split) if self._model else []

    def unified_text(self) -> str:
        """The plain unified diff (what ``difflib.unified_diff`` prints with the same context)."""
        model = self._model or DiffModel.compute(self._text_a, self._text_b, context=self._diff_context,
                                                 inline=False)
        return model.unified_text(self._path_a, self._path_b)

    def set_texts(self, path_a: str, text_a: str, path_b: str, text_b: str) -> None:
        """Replace both texts; the view goes back to the top."""
        if self.is_mounted:  # work for the old texts is wasted now
            self.workers.cancel_group(self, "diff-view")
            self.workers.cancel_group(self, "diff-view-highlight")
        self._set_texts(path_a, text_a, path_b, text_b)
        if self.is_mounted:
            self._start()

    @property
    def current_hunk(self) -> int:
        """The hunk last jumped to with n / p / ``scroll_to_hunk`` while the view stays where that put it
        (near the end it cannot scroll a header to the top), else the hunk at the top row; -1: no hunks."""
        if not self._model or not self._model.hunks:
            return -1
        if self._jump is not None and self._jump[0] < self._model.hunk_count:
            index, row = self._jump
            if self._model.hunk_rows(self.split)[index] == row and round(self.scroll_y) == min(
                    row, round(self.max_scroll_y)):
                return index
        return max(0, bisect_right(self._model.hunk_rows(self.split), round(self.scroll_y)) - 1)

    def scroll_to_hunk(self, index: int, *, animate: bool = False) -> None:
        """Put hunk ``index``'s header row at the top of the view (clamped to the hunks there are)."""
        if not self._model or not self._model.hunks:
            return
        index = max(0, min(index, self._model.hunk_count - 1))
        row = self._model.hunk_rows(self.split)[index]
        self._jump = (index, row)
        self.scroll_to(y=row, animate=animate, immediate=True)

    def action_toggle_split(self) -> None:
        """Toggle side by side / unified; choosing explicitly turns ``auto_split`` off."""
        self.auto_split = False
        self.split = not self.split

    def action_next_hunk(self) -> None:
        self.scroll_to_hunk(self.current_hunk + 1)

    # Home / End jump like the hunk keys do: an animated scroll over SSH only costs frames.
    def action_scroll_home(self) -> None:
        self.scroll_to(y=0, animate=False, immediate=True)

    def action_scroll_end(self) -> None:
        self.scroll_to(y=self.max_scroll_y, animate=False, immediate=True)

    def action_prev_hunk(self) -> None:
        self.scroll_to_hunk(self.current_hunk - 1)

    # -- computing --------------------------------------------------------------------------------------------

    def _set_texts(self, path_a: str, text_a: str, path_b: str, text_b: str) -> None:
        self._path_a, self._text_a, self._path_b, self._text_b = path_a, text_a, path_b, text_b
        self._generation += 1
        self._highlight_worker = None
        self._line_cache.clear()
        self._jump = None
        self._model = None
        self._sides = None
        if max(text_a.count("\n"), text_b.count("\n")) < LARGE_TEXT_LINES:
            self._model = DiffModel.compute(text_a, text_b, context=self._diff_context)
            self._sides = (_Side(self._model.a_lines, path_a), _Side(self._model.b_lines, path_b))

    def _start(self) -> None:
        """After mount or ``set_texts``: show the diff, or compute it in a worker."""
        self.scroll_to(0, 0, animate=False, immediate=True)
        if self._model is not None:
            self._show_model()
            return
        self.loading = True
        self._update_virtual_size()
        generation = self._generation
        texts = (self._path_a, self._text_a, self._path_b, self._text_b)
        self.run_worker(lambda: self._compute(generation, texts), thread=True, exclusive=True,
                        group="diff-view", name="diff", description=f"diff {texts[0]} → {texts[2]}",
                        exit_on_error=False)

    def _compute(self, generation: int, texts: tuple[str, str, str, str]) -> None:
        """Thread worker: the diff model and the display lines of both sides."""
        worker = get_current_worker()
        path_a, text_a, path_b, text_b = texts
        try:
            model = DiffModel.compute(text_a, text_b, context=self._diff_context,
                                      cancelled=lambda: worker.is_cancelled)
        except DiffCancelled:
            return
        sides = (_Side(model.a_lines, path_a), _Side(model.b_lines, path_b))
        if not worker.is_cancelled:
            self.post_message(self._Computed(generation, model, sides))

    @on(_Computed)
    def _on_computed(self, message: _Computed) -> None:
        message.stop()
        if message.generation != self._generation:
            return  # the texts were replaced meanwhile
        self._model, self._sides = message.model, message.sides
        self._show_model()

    def _show_model(self) -> None:
        self.loading = False
        self._apply_auto_split()
        self._line_cache.clear()
        self._update_virtual_size()
        self._highlight()
        self.refresh()
        self.post_message(self.Ready(self))

    def _highlight_theme(self) -> type[HighlightTheme]:
        theme = self.app.current_theme
        if theme.ansi:
            return ANSIDarkHighlightTheme if theme.dark else ANSILightHighlightTheme
        return HighlightTheme

    def _highlight(self) -> None:
        """Highlight both sides for the current theme: at once when tiny, else in a thread worker."""
        if self._model is None or self._sides is None:
            return
        theme = self._highlight_theme()
        running = self._highlight_worker
        if running is not None and running[0] is theme and running[1].state in (WorkerState.PENDING,
                                                                                 WorkerState.RUNNING):
            return
        model, sides = self._model, self._sides
        jobs = [(0, chunk) for chunk in sides[0].pending(
                    theme, highlight_chunks(len(sides[0].lines), ((h.a_start, h.a_end) for h in model.hunks)))]
        jobs += [(1, chunk) for chunk in sides[1].pending(
                    theme, highlight_chunks(len(sides[1].lines), ((h.b_start, h.b_end) for h in model.hunks)))]
        jobs.sort(key=lambda job: (job[1][0], job[0]))  # both columns fill in together, top first
        if not jobs:
            return
        if len(sides[0].lines) + len(sides[1].lines) <= SYNC_HIGHLIGHT_LINES:
            for side, (start, end) in jobs:
                sides[side].store(theme, start, sides[side].highlight_chunk(start, end, theme))
            return
        generation = self._generation

        def work() -> None:
            worker = get_current_worker()
            for side, (start, end) in jobs:
                if worker.is_cancelled:
                    return
                contents = sides[side].highlight_chunk(start, end, theme)
                self.post_message(self._Highlighted(generation, theme, side, start, contents))

        # exclusive: a worker still highlighting for another theme is superseded (its finished chunks stay)
        worker = self.run_worker(work, thread=True, exclusive=True, group="diff-view-highlight",
                                 name="highlight", description=f"highlight {self._path_a} and {self._path_b}",
                                 exit_on_error=False)
        self._highlight_worker = (theme, worker)

    @on(_Highlighted)
    def _on_highlighted(self, message: _Highlighted) -> None:
        message.stop()
        if message.generation != self._generation or self._sides is None:
            return
        self._sides[message.side].store(message.theme, message.start, message.contents)
        self._line_cache.clear()
        self.refresh()

    # -- Textual hooks ----------------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self._start()

    def _on_theme_changed(self, _theme: object) -> None:
        self._highlight()  # a switch to or from an ANSI theme changes the token styles
        self._forget_rendering()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._forget_rendering()

    def _forget_rendering(self) -> None:
        self._line_cache.clear()
        self._styles.clear()
        if self.is_mounted:
            self.refresh()

    def on_resize(self) -> None:
        self._apply_auto_split()
        self._line_cache.clear()
        self._update_virtual_size()

    def watch_split(self, old: bool, new: bool) -> None:
        if old == new or not self.is_mounted:
            return
        target = self._map_row(round(self.scroll_y), old, new)
        self._jump = None
        self._line_cache.clear()
        self._update_virtual_size()
        self.scroll_to(y=target, animate=False, immediate=True)
        self.refresh()

    def watch_annotations(self) -> None:
        self._line_cache.clear()
        if self.is_mounted:
            self._update_virtual_size()
            self.refresh()

    def watch_auto_split(self, value: bool) -> None:
        if value:
            self._apply_auto_split()

    def _apply_auto_split(self) -> None:
        if self.auto_split and self.is_mounted and self.size.width:
            self.split = self.size.width >= self.AUTO_SPLIT_MIN_WIDTH

    def _map_row(self, index: int, old_split: bool, new_split: bool) -> int:
        """The row of the new layout that shows the line row ``index`` showed in the old one."""
        if not self._model or not self._model.hunks:
            return 0
        old_rows, new_rows = self._model.rows(old_split), self._model.rows(new_split)
        anchor = old_rows[min(index, len(old_rows) - 1)]
        start = self._model.hunk_rows(new_split)[anchor.hunk]
        if anchor.kind == "header":
            return start
        for position in range(start, len(new_rows)):
            row = new_rows[position]
            if row.hunk != anchor.hunk:
                break
            if (anchor.left is not None and row.left == anchor.left) or (
                    anchor.right is not None and row.right == anchor.right):
                return position
        return start

    # -- rendering --------------------------------------------------------------------------------------------

    def _style(self, name: str) -> RichStyle:
        """Rich style of a row kind or part, from the component classes (cached until the CSS changes)."""
        style = self._styles.get(name)
        if style is None:
            base = self.rich_style
            if name == "context":
                style = base
            else:  # the component's own rules over the widget's: line numbers keep the widget background
                style = base + self.get_component_rich_style(f"diff-view--{name}", partial=True)
            self._styles[name] = style
        return style

    def _number_width(self) -> int:
        assert self._model is not None
        return len(str(max(len(self._model.a_lines), len(self._model.b_lines), 1)))

    def _code_width(self, width: int) -> int:
        """Cells for code in one column at this widget width."""
        marker = 2 if self.annotations else 1
        digits = self._number_width()
        if self.split:
            return max(1, (width - 1) // 2 - digits - 2 - marker)
        return max(1, width - 2 * digits - 3 - marker)

    def _update_virtual_size(self) -> None:
        if not self._model or not self._sides:
            self.virtual_size = Size(0, 0)
            return
        rows = len(self._model.rows(self.split)) or 1
        width = self.scrollable_content_region.width or self.size.width
        longest = max(self._sides[0].max_cells, self._sides[1].max_cells)
        self.virtual_size = Size(width + max(0, longest - self._code_width(width)), rows)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        index = scroll_y + y
        key = (index, scroll_x, width, self.split, self.annotations)
        strip = self._line_cache.get(key)
        if strip is None:
            strip = self._render_row(index, scroll_x, width)
            self._line_cache[key] = strip
        return strip

    def _render_row(self, index: int, scroll_x: int, width: int) -> Strip:
        base = self.rich_style
        model, sides = self._model, self._sides
        if model is None or sides is None:
            return Strip.blank(width, base)
        rows = model.rows(self.split)
        if not rows:
            if index == 0:
                text = f" No differences between {self._path_a} and {self._path_b}"
                return Strip([Segment(text, self._style("line-number"))]).crop_extend(0, width, base)
            return Strip.blank(width, base)
        if index >= len(rows):
            return Strip.blank(width, base)
        row = rows[index]
        if row.kind == "header":
            header_style = self._style("hunk-header")
            text = f" {model.hunks[row.hunk].header}"
            return Strip([Segment(text, header_style)]).crop_extend(0, width, header_style)
        theme = self._highlight_theme()
        digits = self._number_width()
        code_width = self._code_width(width)
        if self.split:
            left_width = (width - 1) // 2
            left_kind = {"context": "context", "removed": "removed", "changed": "removed"}.get(row.kind)
            right_kind = {"context": "context", "added": "added", "changed": "added"}.get(row.kind)
            segments = self._column(sides[0], row.left, row.left_spans, left_kind, theme, digits, code_width,
                                    scroll_x, left_width)
            segments.append(Segment("│", self._style("line-number")))
            segments += self._column(sides[1], row.right, row.right_spans, right_kind, theme, digits,
                                     code_width, scroll_x, width - left_width - 1)
            return Strip(segments).crop_extend(0, width, base)
        if row.kind == "added":
            side, number, spans, kind = sides[1], row.right, row.right_spans, "added"
        elif row.kind == "removed":
            side, number, spans, kind = sides[0], row.left, row.left_spans, "removed"
        else:
            side, number, spans, kind = sides[0], row.left, row.left_spans, "context"
        left_no = "" if row.left is None else str(row.left)
        right_no = "" if row.right is None else str(row.right)
        segments = [Segment(f" {left_no:>{digits}} {right_no:>{digits}} ", self._number_style(kind))]
        segments += self._code(side, number, spans, kind, theme, code_width, scroll_x)
        return Strip(segments).crop_extend(0, width, base)

    def _number_style(self, kind: str) -> RichStyle:
        number = self._style("line-number")
        return self._style(kind) + RichStyle(color=number.color, bold=number.bold)

    def _column(self, side: _Side, number: int | None, spans: Spans, kind: str | None,
                theme: type[HighlightTheme], digits: int, code_width: int, scroll_x: int,
                column_width: int) -> list[Segment]:
        """One column of a side-by-side row, exactly ``column_width`` cells: hatched when the side has no line."""
        if number is None or kind is None:
            return [Segment(HATCH * column_width, self._style("hatch"))]
        segments = [Segment(f" {number:>{digits}} ", self._number_style(kind))]
        segments += self._code(side, number, spans, kind, theme, code_width, scroll_x)
        return list(Strip(segments).crop_extend(0, column_width, self._style(kind)))

    def _code(self, side: _Side, number: int | None, spans: Spans, kind: str, theme: type[HighlightTheme],
              code_width: int, scroll_x: int) -> list[Segment]:
        """The marker and the visible window of one line of code (``code_width`` cells from ``scroll_x``)."""
        row_style = self._style(kind)
        marker = {"added": "+", "removed": "-"}.get(kind, " ") if self.annotations else ""
        segments = [Segment(f"{marker} ", row_style)]
        if number is None:
            return segments
        content = side.content(number - 1, theme)
        if spans and kind in ("added", "removed"):
            inline = VisualStyle.from_rich_style(RichStyle(bgcolor=self._style(f"{kind}-inline").bgcolor))
            content = content.add_spans([Span(start, end, inline) for start, end in side.spans(number - 1, spans)])
        code = Strip([Segment(text, style.rich_style) for text, style in content.render(
            VisualStyle.from_rich_style(row_style), end="", parse_style=self._get_style)])
        segments.extend(code.crop_extend(scroll_x, scroll_x + code_width, row_style))
        return segments
