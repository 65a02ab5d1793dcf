"""``DataGrid``: a virtual table for large result tables (50k-row roofline sheets).

Textual's built-in ``DataTable`` measures every cell as rows are added and sorts its row dict,
which takes seconds at 50k rows. ``DataGrid`` is a line-API widget (``ScrollView`` plus
``render_line``) over a column model instead:

* rows are kept raw (dicts or tuples); only the rows on screen are formatted, through a small
  cache;
* column widths come from the header and a sample of rows (the first 200 plus 200 spread over the
  table), capped by ``Column.max_width``; longer cells end in an ellipsis;
* columns with a ``drop_order`` step aside (lowest first) while the table is wider than the grid,
  then columns with a ``squeeze_to`` give up width (down to it), so that a narrow terminal shows
  the columns that matter without scrolling; a sort by a column that stepped aside is told by
  ``hidden_sort_note``;
* sorting and filtering work on lists of row indices, comparing raw values: numbers numerically,
  text case-insensitively, ``None``/NaN always last, ties in the order the rows were given;
* the cursor follows its row (by key) through sorts and filters.

Colours come only from the component classes in ``DEFAULT_CSS`` (theme variables, no colour
codes). Row colouring goes through ``row_class(row) -> suffix`` which selects
``data-grid--row-<suffix>``.

Example::

    grid = DataGrid([Column("op_name", "Op", "text"),
                     Column("gflops", "GFLOP/s", "number", fmt=lambda v: f"{v:,.1f}")],
                    row_class=lambda r: {"MEMORY_BOUND": "memory-bound"}.get(r["bound"]),
                    fixed_columns=1)
    grid.set_rows(rows, keys=[r["id"] for r in rows])
    grid.sort_by("gflops", reverse=True)
    grid.set_filter("gemm", bound="MEMORY_BOUND")
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

__all__ = ["Column", "DataGrid"]

ColumnKind = Literal["text", "number"]
Align = Literal["left", "right"]
Ellipsis = Literal["end", "middle"]
RowKey = Hashable

_SAMPLE_HEAD = 200
"""Rows at the top of the table that column widths are measured from."""
_SAMPLE_SPREAD = 200
"""Further rows, evenly spread over the rest of the table, that widths are measured from."""
_ARROW_ASC = "▲"
_ARROW_DESC = "▼"
_ELLIPSIS = "…"
# Cells are single-line: newlines and tabs become spaces, other control characters are dropped.
_CONTROL = {c: None for c in range(32)} | {9: " ", 10: " ", 13: " ", 127: None}


@dataclass(slots=True)
class Column:
    """One column of a ``DataGrid``.

    ``fmt`` turns a raw value into the cell text (it is never called with ``None`` or NaN, which
    show as ``""`` and ``"NaN"``; if it raises, ``str(value)`` is shown). ``width`` fixes the
    content width; otherwise it is measured from the header and a sample of rows, between
    ``min_width`` and ``max_width``. ``align`` defaults to right for numbers, left for text.
    ``drop_order``: while the table is wider than the grid, columns that have one are left out,
    lowest first, until the rest fits (they still sort, filter and export). ``squeeze_to``: if it
    is still too wide, columns that have one narrow, down to that width, sharing the shortfall in
    proportion to what each can give. ``ellipsis``: where a cut cell loses its text, at the
    ``"end"`` or in the ``"middle"`` (for names whose start and end both tell, such as a run
    folder's mode prefix and its time stamp). ``drop_last``: a column with a ``drop_order`` that
    is narrowed before it steps aside: it is left out only when the table, every column that has
    a ``squeeze_to`` narrowed to it, is still wider than the grid. ``spill_left``: keys of the
    columns just before this one whose cells a text too long for its own may take when they are
    empty in that row, as a spreadsheet lets a text run over empty cells (the Runs list's progress
    of a compare over the TTFT, TPOT and tok/s a benchmark fills).
    """

    key: str
    label: str
    kind: ColumnKind = "text"
    fmt: Callable[[Any], str] | None = None
    width: int | None = None
    align: Align | None = None
    min_width: int = 3
    max_width: int = 48
    drop_order: int | None = None
    squeeze_to: int | None = None
    ellipsis: Ellipsis = "end"
    drop_last: bool = False
    spill_left: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("text", "number"):
            raise ValueError(f"Column {self.key!r}: kind must be 'text' or 'number', not {self.kind!r}")
        if self.align is None:
            self.align = "right" if self.kind == "number" else "left"
        elif self.align not in ("left", "right"):
            raise ValueError(f"Column {self.key!r}: align must be 'left' or 'right', not {self.align!r}")
        if self.width is not None and self.width < 1:
            raise ValueError(f"Column {self.key!r}: width must be at least 1")
        if self.ellipsis not in ("end", "middle"):
            raise ValueError(f"Column {self.key!r}: ellipsis must be 'end' or 'middle', not {self.ellipsis!r}")
        self.min_width = max(1, self.min_width)
        self.max_width = max(self.min_width, self.max_width)
        if self.squeeze_to is not None:
            self.squeeze_to = max(1, min(self.squeeze_to, self.max_width))

    def format(self, value: Any) -> str:
        """The cell text for a raw value (single line, not padded)."""
        if value is None:
            return ""
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        if self.fmt is not None:
            try:
                text = self.fmt(value)
            except Exception:  # noqa: BLE001 - a formatter that cannot take this value must not break the table
                text = str(value)
        elif self.kind == "number":
            text = _format_number(value)
        else:
            text = str(value)
        if not isinstance(text, str):
            text = str(text)
        return text if text.isprintable() else text.translate(_CONTROL)


def _format_number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _number_key(value: Any) -> Any:
    """Sort key of a number cell, or None when it is missing (None, NaN, not a number)."""
    kind = type(value)
    if kind is int:
        return value
    if kind is float:
        return None if math.isnan(value) else value
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    try:
        number = float(value)  # numeric strings, numpy scalars, Decimal
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _text_key(value: Any) -> Any:
    """Sort key of a text cell (case-insensitive), or None when it is missing (None, NaN)."""
    if type(value) is str:
        return value.casefold()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value).casefold()


def _fit(text: str, width: int, align: Align, ellipsis: Ellipsis = "end") -> str:
    """``text`` padded or cut (with an ellipsis at its end or in its middle) to exactly ``width``
    cells."""
    length = len(text) if text.isascii() else cell_len(text)
    if length > width:
        if width <= 1:
            text = _ELLIPSIS[:width]
        elif ellipsis == "middle" and text.isascii():
            head = (width - 1) // 2  # an odd cell goes to the end: a name's end tells it apart (time, id)
            text = text[:head] + _ELLIPSIS + text[len(text) - (width - 1 - head):]
        else:
            text = set_cell_size(text, width - 1) + _ELLIPSIS
        length = width
    pad = " " * (width - length)
    return pad + text if align == "right" else text + pad


class _RowMessage(Message):
    """A message about one row of a DataGrid: the grid, the row's key and the row."""

    def __init__(self, grid: DataGrid, row_key: RowKey, row: Any) -> None:
        super().__init__()
        self.grid = grid
        self.row_key = row_key
        self.row = row

    @property
    def control(self) -> DataGrid:
        return self.grid


class DataGrid(ScrollView, can_focus=True):
    """A sortable, filterable table that renders only the rows on screen.

    Keys: up/down (k/j), pageup/pagedown, home/end (g/G) move the row cursor, left/right the column cursor,
    ``s`` sorts by the cursor column (again to reverse), enter selects the row. Clicking a header
    sorts by that column; clicking a row moves the cursor there (clicking it again selects it).
    ``select_label`` shows enter in the footer under that name (what the screen does on
    ``RowSelected``, e.g. "Open").
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "cursor_up", "Up", show=False, id="grid.cursor_up"),
        Binding("down,j", "cursor_down", "Down", show=False, id="grid.cursor_down"),
        Binding("pageup", "page_up", "Page up", show=False, id="grid.page_up"),
        Binding("pagedown", "page_down", "Page down", show=False, id="grid.page_down"),
        Binding("home,g", "first_row", "First row", show=False, id="grid.first_row"),
        Binding("end,G", "last_row", "Last row", show=False, id="grid.last_row"),
        # Not in the footer: at 80 columns it has room only for the screen's main keys.
        Binding("left", "column_left", "Prev column", show=False, id="grid.column_left",
                tooltip="Move the column cursor left"),
        Binding("right", "column_right", "Next column", show=False, id="grid.column_right",
                tooltip="Move the column cursor right"),
        Binding("s", "sort_column", "Sort", id="grid.sort",
                tooltip="Sort by the highlighted column; again to reverse"),
        Binding("enter", "select_row", "Select", show=False, id="grid.select"),
        Binding("x", "export", "Export", show=False, id="grid.export",
                tooltip="Write the rows shown (filtered, sorted) as CSV and Markdown"),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "data-grid--header",
        "data-grid--sorted-header",
        "data-grid--cursor",
        "data-grid--cursor-column",
        "data-grid--stripe",
        "data-grid--row-memory-bound",
        "data-grid--row-compute-bound",
        "data-grid--row-correct",
        "data-grid--row-incorrect",
        "data-grid--row-tie",
        "data-grid--row-muted",
        "data-grid--row-running",
        "data-grid--row-suspect",
    }
    """
    | Class | Description |
    | :- | :- |
    | `data-grid--header` | The header line. |
    | `data-grid--sorted-header` | The header cell of the column the rows are sorted by. |
    | `data-grid--cursor` | The row under the cursor. |
    | `data-grid--cursor-column` | The header cell and cursor cell of the highlighted column. |
    | `data-grid--stripe` | Every other row, when `zebra_stripes` is on. |
    | `data-grid--row-<suffix>` | Rows for which `row_class(row)` returns `<suffix>`. |
    """

    DEFAULT_CSS = """
    DataGrid {
        height: 1fr;
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .data-grid--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .data-grid--cursor-column {
                background: $accent 45%;
            }
        }
        & > .data-grid--header {
            background: $panel;
            color: $foreground;
            text-style: bold;
        }
        & > .data-grid--sorted-header {
            color: $accent;
        }
        & > .data-grid--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        & > .data-grid--cursor-column {
            background: $accent 25%;
        }
        & > .data-grid--stripe {
            background: $foreground 4%;
        }
        & > .data-grid--row-memory-bound {
            color: $memory-bound;
        }
        & > .data-grid--row-compute-bound {
            color: $compute-bound;
        }
        & > .data-grid--row-correct {
            color: $correct;
        }
        & > .data-grid--row-incorrect {
            color: $incorrect;
        }
        & > .data-grid--row-tie {
            color: $tie;
        }
        & > .data-grid--row-muted {
            color: $muted;
        }
        & > .data-grid--row-running {
            color: $running;
            text-style: bold;
        }
        & > .data-grid--row-suspect {
            color: $warning;
        }
    }
    """

    class RowHighlighted(_RowMessage):
        """The cursor moved to another row (only the latest one queued is delivered)."""

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, DataGrid.RowHighlighted) and message.grid is self.grid

    class RowSelected(_RowMessage):
        """Enter was pressed on a row (or a highlighted row was clicked)."""

    class Sorted(Message):
        """The sort order changed (by ``sort_by``, ``s`` or a header click)."""

        def __init__(self, grid: DataGrid, column_key: str | None, reverse: bool) -> None:
            super().__init__()
            self.grid = grid
            self.column_key = column_key
            self.reverse = reverse

        @property
        def control(self) -> DataGrid:
            return self.grid

    class ColumnsFitted(Message):
        """The columns shown changed with the grid's width (``drop_order`` columns stepped aside or
        came back; ``squeeze_to`` columns narrowed or widened)."""

        def __init__(self, grid: DataGrid) -> None:
            super().__init__()
            self.grid = grid

        @property
        def control(self) -> DataGrid:
            return self.grid

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, DataGrid.ColumnsFitted) and message.grid is self.grid

    def __init__(
        self,
        columns: Sequence[Column],
        *,
        row_class: Callable[[Any], str | None] | None = None,
        fixed_columns: int = 0,
        zebra_stripes: bool = False,
        filter_columns: Iterable[str] | None = None,
        select_label: str | None = None,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        if select_label is not None:
            # enter in the footer, named for what the screen does with the row (it handles RowSelected)
            bindings = self._bindings.key_to_bindings
            bindings["enter"] = [replace(b, description=select_label, show=True) if b.id == "grid.select" else b
                                 for b in bindings.get("enter", [])]
        columns = list(columns)
        if not columns:
            raise ValueError("DataGrid needs at least one column")
        keys = [c.key for c in columns]
        if len(set(keys)) != len(keys):
            raise ValueError(f"DataGrid column keys must be unique: {keys}")
        self._columns: tuple[Column, ...] = tuple(columns)
        self._column_index = {c.key: i for i, c in enumerate(columns)}
        if filter_columns is None:
            filter_columns = [c.key for c in columns if c.kind == "text"]
        self._filter_columns = tuple(filter_columns)
        for key in self._filter_columns:
            if key not in self._column_index:
                raise ValueError(f"filter_columns: unknown column {key!r}")
        if not 0 <= fixed_columns < len(columns):
            raise ValueError(f"fixed_columns must be between 0 and {len(columns) - 1}")
        self._fixed_columns = fixed_columns
        self._zebra_stripes = zebra_stripes
        self._row_class = row_class

        # data
        self._rows: list[Any] = []
        self._keys: list[RowKey] = []
        self._index_of_key: dict[RowKey, int] = {}
        self._mapping_rows = True
        self._generation = 0
        self._values_cache: dict[str, list[Any]] = {}
        self._sort_keys_cache: dict[str, list[Any]] = {}
        self._folded_cache: dict[str, dict[Any, str] | None] = {}
        # view state
        self._sort_column: str | None = None
        self._sort_reverse = False
        self._sorted_all: list[int] = []
        self._filter_text = ""
        self._filter_equals: dict[str, Any] = {}
        self._mask: list[bool] | None = None
        self._order: list[int] = []
        self._cursor = 0
        self._cursor_column = 0
        self._highlighted_key: Any = _NOTHING
        # layout
        self._natural: list[int] = [self._initial_width(c) for c in columns]  # measured content widths
        self._widths: list[int] = list(self._natural)  # drawn widths: natural, less what squeeze_to takes
        self._shown: list[bool] = [True] * len(columns)  # False: dropped for a narrow view (drop_order)
        self._starts: list[int] = []
        self._table_width = 0
        self._fixed_width = 0
        self._update_geometry()
        # caches
        self._cells_cache: LRUCache[int, tuple[tuple[str, ...], str | None]] = LRUCache(4096)
        self._line_cache: LRUCache[tuple, Strip] = LRUCache(512)
        self._layer_cache: dict[str, Style] = {}

    # ------------------------------------------------------------------ public API: data
    @property
    def columns(self) -> tuple[Column, ...]:
        return self._columns

    @property
    def row_count(self) -> int:
        """Rows held, filtered or not."""
        return len(self._rows)

    @property
    def visible_count(self) -> int:
        """Rows that pass the filter."""
        return len(self._order)

    @property
    def zebra_stripes(self) -> bool:
        return self._zebra_stripes

    @zebra_stripes.setter
    def zebra_stripes(self, value: bool) -> None:
        self._zebra_stripes = bool(value)
        self._line_cache.clear()
        self.refresh()

    @property
    def column_widths(self) -> dict[str, int]:
        """Content width of every column (cells are padded by one space on each side)."""
        return {c.key: w for c, w in zip(self._columns, self._widths)}

    @property
    def shown_columns(self) -> list[str]:
        """Keys of the columns drawn now: all but those dropped for a narrow view."""
        return [c.key for c, shown in zip(self._columns, self._shown) if shown]

    @property
    def hidden_sort_note(self) -> str:
        """``"sorted by Started ▼ (hidden at this width)"`` while the rows are sorted by a column
        that stepped aside for a narrow view (its header, with the arrow, is not drawn); else ``""``."""
        index = self._column_index.get(self._sort_column) if self._sort_column is not None else None
        if index is None or self._shown[index]:
            return ""
        arrow = _ARROW_DESC if self._sort_reverse else _ARROW_ASC
        return f"sorted by {self._columns[index].label} {arrow} (hidden at this width)"

    def set_rows(self, rows: Sequence[Mapping[str, Any]] | Sequence[Sequence[Any]],
                 keys: Sequence[RowKey] | None = None) -> None:
        """Replace the rows. Each row is a mapping (read by column key) or a sequence (read by
        column position). ``keys`` name the rows (default: their index); they must be unique and
        hashable. The current sort and filter are applied to the new rows. With explicit ``keys``
        the cursor stays on the same key when it is still there (a live refresh); otherwise it
        goes to the first row."""
        rows = list(rows)
        explicit_keys = keys is not None
        keys = range(len(rows)) if keys is None else list(keys)
        if len(keys) != len(rows):
            raise ValueError(f"set_rows: {len(keys)} keys for {len(rows)} rows")
        index_of_key = {key: i for i, key in enumerate(keys)}
        if len(index_of_key) != len(rows):
            raise ValueError("set_rows: row keys must be unique")
        old_key = self.cursor_row_key if explicit_keys else None
        self._rows = rows
        self._keys = list(keys)
        self._index_of_key = index_of_key
        self._mapping_rows = not rows or isinstance(rows[0], Mapping)
        self._generation += 1
        self._values_cache.clear()
        self._sort_keys_cache.clear()
        self._folded_cache.clear()
        self._cells_cache.clear()
        self._line_cache.clear()
        self._measure_widths()
        self._sorted_all = self._sort_indices()
        self._mask = self._compute_mask()
        self._apply_order(old_key, keep_screen_offset=False, fallback_position=0, force_message=True)

    def get_row(self, key: RowKey) -> Any:
        """The raw row with this key (``KeyError`` if there is none)."""
        return self._rows[self._index_of_key[key]]

    def visible_keys(self) -> list[RowKey]:
        """Keys of the rows that pass the filter, in display order."""
        keys = self._keys
        return [keys[i] for i in self._order]

    def visible_rows(self) -> list[Any]:
        """Rows that pass the filter, in display order."""
        rows = self._rows
        return [rows[i] for i in self._order]

    # ------------------------------------------------------------------ public API: sort
    @property
    def sort_column(self) -> str | None:
        return self._sort_column

    @property
    def sort_reverse(self) -> bool:
        return self._sort_reverse

    def sort_by(self, column_key: str, reverse: bool | None = None) -> None:
        """Sort by a column's raw values. ``reverse=None`` toggles the direction when already
        sorted by this column and sorts ascending otherwise. Missing values (None, NaN, and for
        number columns anything that is not a number) stay last in both directions."""
        if column_key not in self._column_index:
            raise KeyError(f"no column {column_key!r}")
        if reverse is None:
            reverse = not self._sort_reverse if self._sort_column == column_key else False
        self._sort_column = column_key
        self._sort_reverse = bool(reverse)
        self._resort()

    def clear_sort(self) -> None:
        """Back to the order the rows were given in."""
        self._sort_column = None
        self._sort_reverse = False
        self._resort()

    def _resort(self) -> None:
        old_key = self.cursor_row_key
        self._sorted_all = self._sort_indices()
        self._apply_order(old_key, keep_screen_offset=True)
        self.post_message(self.Sorted(self, self._sort_column, self._sort_reverse))

    # ------------------------------------------------------------------ public API: filter
    @property
    def filter_text(self) -> str:
        return self._filter_text

    @property
    def filter_equals(self) -> dict[str, Any]:
        return dict(self._filter_equals)

    def set_filter(self, text: str = "", **column_equals: Any) -> None:
        """Show only matching rows; replaces the previous filter (no arguments: show all).

        ``text``: every whitespace-separated term must occur, case-insensitively, in one of the
        filter columns (``filter_columns``; default the text columns). ``column_equals``: the raw
        value must equal the given one (a set, list or tuple means "any of these"; ``None``
        means no condition on that column)."""
        equals = {k: v for k, v in column_equals.items() if v is not None}
        for key in equals:
            if key not in self._column_index and not self._mapping_rows:
                raise KeyError(f"set_filter: no column {key!r}")
        self._filter_text = text or ""
        self._filter_equals = equals
        old_key = self.cursor_row_key
        self._mask = self._compute_mask()
        self._apply_order(old_key, keep_screen_offset=True)

    # ------------------------------------------------------------------ public API: cursor
    @property
    def cursor_position(self) -> int:
        """Index of the cursor row among the visible rows (0 when there are none)."""
        return self._cursor

    @property
    def cursor_row_key(self) -> RowKey | None:
        if not self._order:
            return None
        return self._keys[self._order[self._cursor]]

    @property
    def cursor_row(self) -> Any:
        if not self._order:
            return None
        return self._rows[self._order[self._cursor]]

    @property
    def cursor_column(self) -> int:
        return self._cursor_column

    @property
    def cursor_column_key(self) -> str:
        return self._columns[self._cursor_column].key

    def move_cursor_to_key(self, key: RowKey) -> bool:
        """Put the cursor on the row with this key; False when no visible row has it."""
        index = self._index_of_key.get(key)
        if index is None:
            return False
        try:
            position = self._order.index(index)
        except ValueError:
            return False
        self._move_cursor(position)
        return True

    def move_cursor_to_column(self, column_key: str) -> None:
        self._move_column(self._column_index[column_key])

    # ------------------------------------------------------------------ public API: export
    def to_csv(self) -> str:
        """The visible rows in display order as CSV: raw values (numbers unformatted), one column
        per grid column, headers as shown."""
        import csv
        import io
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([c.label for c in self._columns])
        for row in self.visible_rows():
            writer.writerow(["" if v is None else v for v in (self._raw(row, i) for i in range(len(self._columns)))])
        return out.getvalue()

    def to_markdown(self) -> str:
        """The visible rows in display order as a Markdown table, cells as the grid shows them."""
        def cell(text: str) -> str:
            return text.replace("|", "\\|")
        lines = ["| " + " | ".join(cell(c.label) for c in self._columns) + " |",
                 "|" + "|".join("---:" if c.align == "right" else "---" for c in self._columns) + "|"]
        for row in self.visible_rows():
            lines.append("| " + " | ".join(cell(c.format(self._raw(row, i))) for i, c in enumerate(self._columns))
                         + " |")
        return "\n".join(lines) + "\n"

    def _raw(self, row: Any, column: int) -> Any:
        if self._mapping_rows:
            return row.get(self._columns[column].key)
        return row[column] if column < len(row) else None

    def action_export(self) -> None:
        from magpie_tui.screens.export import export_grid
        export_grid(self)

    # ------------------------------------------------------------------ actions
    def action_cursor_up(self) -> None:
        self._move_cursor(self._cursor - 1)

    def action_cursor_down(self) -> None:
        self._move_cursor(self._cursor + 1)

    def action_page_up(self) -> None:
        self._move_cursor(self._cursor - self._page_height())

    def action_page_down(self) -> None:
        self._move_cursor(self._cursor + self._page_height())

    def action_first_row(self) -> None:
        self._move_cursor(0)

    def action_last_row(self) -> None:
        self._move_cursor(len(self._order) - 1)

    def action_column_left(self) -> None:
        self._move_column(self._cursor_column - 1, step=-1)

    def action_column_right(self) -> None:
        self._move_column(self._cursor_column + 1, step=1)

    def action_sort_column(self) -> None:
        self.sort_by(self.cursor_column_key)

    def action_select_row(self) -> None:
        if self._order:
            self.post_message(self.RowSelected(self, self.cursor_row_key, self.cursor_row))

    # ------------------------------------------------------------------ events
    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        column = self._column_at(offset.x)
        if offset.y == 0:
            if column is not None:
                event.stop()
                self._move_column(column)
                self.sort_by(self._columns[column].key)
            return
        position = self.scroll_offset.y + offset.y - 1
        if not 0 <= position < len(self._order):
            return
        event.stop()
        if column is not None:
            self._move_column(column)
        if position == self._cursor:
            self.action_select_row()
        else:
            self._move_cursor(position)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._layer_cache.clear()
        self._line_cache.clear()

    def on_resize(self, event: events.Resize) -> None:
        self._line_cache.clear()
        if self._fit_columns():
            self.virtual_size = Size(self._table_width, len(self._order) + 1)
            self.refresh()
        self._scroll_cursor_into_view()

    # ------------------------------------------------------------------ rendering
    def render_line(self, y: int) -> Strip:
        width = self.size.width
        scroll_x, scroll_y = self.scroll_offset
        base = self.rich_style
        if y == 0:
            return self._render_header(scroll_x, width, base)
        position = scroll_y + y - 1
        order = self._order
        if position >= len(order):
            if position == 0:
                return self._render_message(width, base)
            return Strip.blank(width, base)
        index = order[position]
        is_cursor = position == self._cursor
        cursor_column = self._cursor_column if is_cursor else -1
        stripe = self._zebra_stripes and position % 2 == 1
        cache_key = (index, is_cursor, cursor_column, stripe, scroll_x, width, base, self._generation)
        strip = self._line_cache.get(cache_key)
        if strip is None:
            strip = self._render_row(index, is_cursor, stripe, scroll_x, width, base)
            self._line_cache[cache_key] = strip
        return strip

    def _render_header(self, scroll_x: int, width: int, base: Style) -> Strip:
        cache_key = ("header", self._sort_column, self._sort_reverse, self._cursor_column,
                     scroll_x, width, base, self._generation)
        strip = self._line_cache.get(cache_key)
        if strip is not None:
            return strip
        header = base + self._layer("data-grid--header")
        sorted_style = header + self._layer("data-grid--sorted-header")
        cursor_layer = self._layer("data-grid--cursor-column")
        segments = []
        for i, (column, w) in enumerate(zip(self._columns, self._widths)):
            label = column.label
            style = header
            if column.key == self._sort_column:
                label = f"{label} {_ARROW_DESC if self._sort_reverse else _ARROW_ASC}"
                style = sorted_style
            if i == self._cursor_column:
                style = style + cursor_layer
            segments.append(Segment(f" {_fit(label, w, column.align)} " if self._shown[i] else "", style))
        strip = self._assemble(segments, scroll_x, width, header)
        self._line_cache[cache_key] = strip
        return strip

    def _render_row(self, index: int, is_cursor: bool, stripe: bool, scroll_x: int, width: int,
                    base: Style) -> Strip:
        cells, suffix = self._cells(index)
        style = base
        if stripe:
            style = style + self._layer("data-grid--stripe")
        if suffix:
            style = style + self._layer(f"data-grid--row-{suffix}")
        if is_cursor:
            style = style + self._layer("data-grid--cursor")
            segments = [Segment(cell, style) for cell in cells]
            column = self._cursor_column
            segments[column] = Segment(cells[column], style + self._layer("data-grid--cursor-column"))
        else:
            segments = [Segment(cell, style) for cell in cells]
        return self._assemble(segments, scroll_x, width, style)

    def _render_message(self, width: int, base: Style) -> Strip:
        text = " no rows match the filter" if self._rows else " no rows"
        style = base + self._layer("data-grid--row-muted")
        return Strip([Segment(text, style)]).adjust_cell_length(width, base)

    def _assemble(self, segments: list[Segment], scroll_x: int, width: int, fill: Style) -> Strip:
        """One line of the table: fixed columns, then the scrolled part, cut to ``width``."""
        line = Strip(segments, self._table_width)
        fixed_width = self._fixed_width
        if fixed_width:
            line = Strip.join([line.crop(0, fixed_width),
                               line.crop(fixed_width + scroll_x, scroll_x + width)])
        elif scroll_x or self._table_width > width:
            line = line.crop(scroll_x, scroll_x + width)
        return line.adjust_cell_length(width, fill)

    def _cells(self, index: int) -> tuple[tuple[str, ...], str | None]:
        """Padded cell texts and the row-class suffix of row ``index`` (cached)."""
        cached = self._cells_cache.get(index)
        if cached is not None:
            return cached
        row = self._rows[index]
        if self._mapping_rows:
            get = row.get
            values = [get(c.key) for c in self._columns]
        else:
            values = list(row[: len(self._columns)])
            values += [None] * (len(self._columns) - len(values))
        texts = [c.format(v) if shown else "" for c, v, shown in zip(self._columns, values, self._shown)]
        cells = [f" {_fit(t, w, c.align, c.ellipsis)} " if shown else ""
                 for c, t, w, shown in zip(self._columns, texts, self._widths, self._shown)]
        for i, column in enumerate(self._columns):
            if column.spill_left and self._shown[i] and len(texts[i]) > self._widths[i]:
                self._spill(i, texts, cells)
        suffix = self._row_class(row) if self._row_class is not None else None
        cached = (tuple(cells), suffix or None)
        self._cells_cache[index] = cached
        return cached

    def _spill(self, i: int, texts: list[str], cells: list[str]) -> None:
        """Cell ``i``'s text over the empty cells of its ``spill_left`` columns just before it."""
        column, first, width = self._columns[i], i, self._widths[i]
        while first > 0 and self._columns[first - 1].key in column.spill_left and not texts[first - 1]:
            first -= 1
            if self._shown[first]:
                width += self._widths[first] + 2
        if first < self._fixed_columns <= i:
            return  # a frozen column stays whole when the rest scrolls sideways
        if width > self._widths[i]:
            cells[first:i] = [""] * (i - first)
            cells[i] = f" {_fit(texts[i], width, 'left', column.ellipsis)} "

    def _layer(self, name: str) -> Style:
        """The style a component class adds on top of what is below it: only the properties it
        sets (colours resolved against the widget background, so alpha works)."""
        layer = self._layer_cache.get(name)
        if layer is None:
            try:
                styles = self.get_component_styles(name)
            except KeyError:
                layer = Style.null()
            else:
                full = self.get_component_rich_style(name)
                partial = self.get_component_rich_style(name, partial=True)
                layer = partial.without_color + Style.from_color(
                    full.color if styles.has_rule("color") else None,
                    full.bgcolor if styles.has_rule("background") else None,
                )
            self._layer_cache[name] = layer
        return layer

    # ------------------------------------------------------------------ internals: model
    def _values(self, key: str) -> list[Any]:
        """Raw values of one column (or, for mapping rows, any field) for all rows (cached)."""
        values = self._values_cache.get(key)
        if values is None:
            if self._mapping_rows:
                values = [row.get(key) for row in self._rows]
            else:
                i = self._column_index[key]
                values = [row[i] if i < len(row) else None for row in self._rows]
            self._values_cache[key] = values
        return values

    def _sort_keys(self, key: str) -> list[Any]:
        keys = self._sort_keys_cache.get(key)
        if keys is None:
            to_key = _number_key if self._columns[self._column_index[key]].kind == "number" else _text_key
            keys = [to_key(v) for v in self._values(key)]
            self._sort_keys_cache[key] = keys
        return keys

    def _sort_indices(self) -> list[int]:
        if self._sort_column is None:
            return list(range(len(self._rows)))
        keys = self._sort_keys(self._sort_column)
        present = [i for i, k in enumerate(keys) if k is not None]
        missing = [i for i, k in enumerate(keys) if k is None] if len(present) < len(keys) else []
        try:
            present.sort(key=keys.__getitem__, reverse=self._sort_reverse)
        except TypeError:  # mixed types that do not compare: fall back to their text
            present.sort(key=lambda i: (type(keys[i]).__name__, str(keys[i])), reverse=self._sort_reverse)
        return present + missing

    def _compute_mask(self) -> list[bool] | None:
        """Which rows pass the filter (None: all of them)."""
        mask: list[bool] | None = None
        for key, wanted in self._filter_equals.items():
            values = self._values(key)
            if isinstance(wanted, (set, frozenset, list, tuple)):
                allowed = set(wanted) if all(isinstance(w, Hashable) for w in wanted) else list(wanted)
                hits = [v in allowed for v in values]
            else:
                hits = [v == wanted for v in values]
            mask = hits if mask is None else [a and b for a, b in zip(mask, hits)]
        terms = self._filter_text.casefold().split()
        for term in terms:
            hits = self._text_hits(term)
            mask = hits if mask is None else [a and b for a, b in zip(mask, hits)]
        return mask

    def _text_hits(self, term: str) -> list[bool]:
        """Rows where ``term`` (case-folded) occurs in one of the filter columns. Matching runs
        once per distinct value: result columns repeat a lot (categories, op names, bounds)."""
        n = len(self._rows)
        hits: list[bool] | None = None
        for key in self._filter_columns:
            values = self._values(key)
            folded = self._folded_values(key)
            if folded is None:  # unhashable values: match row by row
                column_hits = [v is not None and term in str(v).casefold() for v in values]
            else:
                matched = {v for v, text in folded.items() if term in text}
                if not matched:
                    continue
                column_hits = [v in matched for v in values]
            hits = column_hits if hits is None else [a or b for a, b in zip(hits, column_hits)]
        return [False] * n if hits is None else hits

    def _folded_values(self, key: str) -> dict[Any, str] | None:
        """Distinct values of a filter column and their case-folded text (cached); None when the
        values cannot be hashed."""
        folded = self._folded_cache.get(key, _NOTHING)
        if folded is _NOTHING:
            try:
                distinct = set(self._values(key))
            except TypeError:
                folded = None
            else:
                distinct.discard(None)
                folded = {v: str(v).casefold() for v in distinct}
            self._folded_cache[key] = folded
        return folded

    def _apply_order(self, old_key: Any, *, keep_screen_offset: bool, fallback_position: int | None = None,
                     force_message: bool = False) -> None:
        """Recompute the visible order, put the cursor back on ``old_key`` if it is still visible
        (otherwise on ``fallback_position``, default its old position, clamped) and refresh."""
        old_position = self._cursor
        old_offset = old_position - self.scroll_offset.y
        mask = self._mask
        self._order = self._sorted_all if mask is None else [i for i in self._sorted_all if mask[i]]
        count = len(self._order)
        position = -1
        index = self._index_of_key.get(old_key) if old_key is not None else None
        if index is not None and (mask is None or mask[index]):
            position = self._order.index(index)
        if position < 0:
            position = min(old_position if fallback_position is None else fallback_position, count - 1)
        self._cursor = max(0, position)
        self.virtual_size = Size(self._table_width, count + 1)
        if keep_screen_offset and self.is_mounted and 0 <= old_offset < self._page_height():
            self.scroll_to(y=max(0, self._cursor - old_offset), animate=False)
        self._scroll_cursor_into_view()
        self._line_cache.clear()
        self.refresh()
        self._post_highlighted(force=force_message)

    # ------------------------------------------------------------------ internals: layout
    def _initial_width(self, column: Column) -> int:
        if column.width is not None:
            return column.width
        return min(column.max_width, max(column.min_width, cell_len(column.label) + 2))

    def _measure_widths(self) -> None:
        """Widths from the header (plus room for the sort arrow) and a sample of rows: the first
        ``_SAMPLE_HEAD`` and ``_SAMPLE_SPREAD`` more spread evenly over the rest."""
        n = len(self._rows)
        sample = list(range(min(n, _SAMPLE_HEAD)))
        if n > _SAMPLE_HEAD:
            step = max(1, (n - _SAMPLE_HEAD) // _SAMPLE_SPREAD)
            sample += range(_SAMPLE_HEAD, n, step)
        sample_rows = [self._rows[i] for i in sample]
        widths = []
        for i, column in enumerate(self._columns):
            if column.width is not None:
                widths.append(column.width)
                continue
            if self._mapping_rows:
                values = [row.get(column.key) for row in sample_rows]
            else:
                values = [row[i] if i < len(row) else None for row in sample_rows]
            width = max([cell_len(column.label) + 2, *(cell_len(column.format(v)) for v in values)])
            widths.append(min(column.max_width, max(column.min_width, width)))
        self._natural = widths
        self._widths = list(widths)
        self._update_geometry()
        self._fit_columns(changed=True)

    def _update_geometry(self) -> None:
        starts, x = [], 0
        for w, shown in zip(self._widths, self._shown):
            starts.append(x)  # a dropped column starts where the next one does: clicks find the shown one
            if shown:
                x += w + 2
        self._starts = starts
        self._table_width = x
        self._fixed_width = starts[self._fixed_columns] if self._fixed_columns else 0

    def _fit_columns(self, changed: bool = False) -> bool:
        """Drop columns that have a ``drop_order`` (lowest first) while the table is wider than
        the view, then narrow those that have a ``squeeze_to``; bring them back when it is wide
        enough. True when the columns drawn changed (``changed``: the widths were just measured
        again, so the drawn ones must be recomputed whatever they were)."""
        view = self.scrollable_content_region.width if self.is_mounted else 0
        natural = self._natural
        shown = [True] * len(self._columns)
        widths = list(natural)
        if view > 0:  # 0: not laid out yet (or in a hidden tab): keep every column
            width = sum(w + 2 for w in natural)
            droppable = sorted((c.drop_order, i) for i, c in enumerate(self._columns)
                               if c.drop_order is not None and not c.drop_last)
            for _, i in droppable:
                if width <= view:
                    break
                shown[i] = False
                width -= natural[i] + 2
            # The columns narrowed before they step aside: out only while the table, squeezed
            # as far as it goes, is still too wide.
            last = sorted((c.drop_order, i) for i, c in enumerate(self._columns)
                          if c.drop_order is not None and c.drop_last)
            for _, i in last:
                if width <= view or self._squeezed_width(shown) <= view:
                    break
                shown[i] = False
                width -= natural[i] + 2
            if width > view:
                widths = self._squeezed(shown, width - view)
        if shown == self._shown and widths == self._widths and not changed:
            return False
        fitted = shown != self._shown or widths != self._widths
        self._shown = shown
        self._widths = widths
        self._update_geometry()
        self._cells_cache.clear()
        self._line_cache.clear()
        if not shown[self._cursor_column]:
            self._move_column(self._cursor_column, step=1)
        if fitted and self.is_mounted:
            self.post_message(self.ColumnsFitted(self))
        return True

    def _squeezed_width(self, shown: list[bool]) -> int:
        """The width of the shown columns with every one that has a ``squeeze_to`` narrowed to it."""
        return sum(min(w, c.squeeze_to if c.squeeze_to is not None else w) + 2
                   for w, c, on in zip(self._natural, self._columns, shown) if on)

    def _squeezed(self, shown: list[bool], excess: int) -> list[int]:
        """The natural widths, less up to ``excess`` cells taken from the shown columns that have
        a ``squeeze_to``, in proportion to what each can give (never below its ``squeeze_to``)."""
        widths = list(self._natural)
        give = {i: widths[i] - c.squeeze_to for i, c in enumerate(self._columns)
                if shown[i] and c.squeeze_to is not None and widths[i] > c.squeeze_to}
        total = sum(give.values())
        if not total:
            return widths
        take = min(excess, total)
        cuts = {i: take * g // total for i, g in give.items()}
        # The cells the rounding left: one each, to the columns with the largest share left over.
        left = take - sum(cuts.values())
        for i in sorted(give, key=lambda i: (-(take * give[i] % total), i))[:left]:
            cuts[i] += 1
        for i, cut in cuts.items():
            widths[i] -= cut
        return widths

    def _column_at(self, x: int) -> int | None:
        """Column under content column ``x`` (None: right of the table)."""
        if x >= self._fixed_width:
            x += self.scroll_offset.x
        if x < 0 or x >= self._table_width:
            return None
        return bisect_right(self._starts, x) - 1

    def _page_height(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    # ------------------------------------------------------------------ internals: cursor
    def _move_cursor(self, position: int) -> None:
        count = len(self._order)
        if not count:
            return
        position = max(0, min(count - 1, position))
        if position == self._cursor:
            return
        old = self._cursor
        self._cursor = position
        scroll_y = self.scroll_offset.y
        self._scroll_cursor_into_view()
        if self.scroll_offset.y == scroll_y:
            self.refresh_line(old + 1)
            self.refresh_line(position + 1)
        self._post_highlighted()

    def _move_column(self, column: int, step: int = 1) -> None:
        """Put the column cursor on ``column``, or if that one is dropped for a narrow view, on
        the next shown one in the direction of ``step`` (else the other way)."""
        last = len(self._columns) - 1
        column = max(0, min(last, column))
        if not self._shown[column]:
            ahead = [i for i in range(column, -1 if step < 0 else last + 1, -1 if step < 0 else 1) if self._shown[i]]
            behind = [i for i in range(column, last + 1 if step < 0 else -1, 1 if step < 0 else -1) if self._shown[i]]
            column = (ahead or behind)[0]
        if column == self._cursor_column:
            return
        self._cursor_column = column
        if column >= self._fixed_columns and self.is_mounted:
            start = self._starts[column]
            end = start + self._widths[column] + 2
            view = self.scrollable_content_region.width
            scroll_x = self.scroll_offset.x
            if start < scroll_x + self._fixed_width:
                self.scroll_to(x=start - self._fixed_width, animate=False)
            elif end > scroll_x + view and view > 0:
                self.scroll_to(x=min(start - self._fixed_width, end - view), animate=False)
        self.refresh()

    def _scroll_cursor_into_view(self) -> None:
        if not self._order or not self.is_mounted:
            return
        page = self._page_height()
        top = self.scroll_offset.y
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False)
        elif self._cursor >= top + page:
            self.scroll_to(y=self._cursor - page + 1, animate=False)

    def _post_highlighted(self, force: bool = False) -> None:
        key = self.cursor_row_key
        if key is None and not self._order:
            self._highlighted_key = _NOTHING
            return
        if force or key != self._highlighted_key:
            self._highlighted_key = key
            self.post_message(self.RowHighlighted(self, key, self.cursor_row))


class _Nothing:
    def __repr__(self) -> str:
        return "<nothing>"


_NOTHING: Any = _Nothing()
