"""DataGrid (magpie_tui/widgets/data_grid.py): sorting by raw value, filters, cursor, messages,
rendering. Timing lives in benchmarks/tui_table.py, not here."""

from __future__ import annotations

import math

import pytest
from tui.conftest import Harness
from magpie_tui.widgets.data_grid import Column, DataGrid

NAN = float("nan")


def kernel_columns(**kwargs) -> list[Column]:
    return [
        Column("name", "Kernel"),
        Column("time", "Time us", "number", fmt=lambda v: f"{v:.1f}"),
        Column("bound", "Bound"),
        Column("category", "Category"),
    ]


ROWS = [
    {"name": "gemm_bf16", "time": 100, "bound": "COMPUTE_BOUND", "category": "GEMM"},
    {"name": "Softmax", "time": 9, "bound": "MEMORY_BOUND", "category": "reduce"},
    {"name": "add", "time": None, "bound": "MEMORY_BOUND", "category": "elementwise"},
    {"name": "gemm_fp8", "time": 10, "bound": "MEMORY_BOUND", "category": "GEMM"},
    {"name": "layer_norm", "time": NAN, "bound": None, "category": "NORM"},
    {"name": "Attention", "time": 55.5, "bound": "COMPUTE_BOUND", "category": "SDPA"},
]
KEYS = ["k-gemm", "k-softmax", "k-add", "k-fp8", "k-ln", "k-attn"]

BOUND_CLASS = {"MEMORY_BOUND": "memory-bound", "COMPUTE_BOUND": "compute-bound"}


def make_grid(**kwargs) -> DataGrid:
    grid = DataGrid(kernel_columns(), **kwargs)
    grid.set_rows(ROWS, keys=KEYS)
    return grid


def posted(messages: list, kind: type) -> list:
    """Messages of one kind, once each (the hook sees a bubbling message at every node)."""
    unique = {id(m): m for m in messages if isinstance(m, kind)}
    return list(unique.values())


def names(grid: DataGrid) -> list[str]:
    return [row["name"] for row in grid.visible_rows()]


# ---------------------------------------------------------------- sorting (no app needed)

def test_numeric_sort_compares_raw_values_not_text():
    grid = make_grid()
    grid.sort_by("time", reverse=False)
    # as text "10.0" < "100.0" < "55.5" < "9.0"; by value 9 < 10 < 55.5 < 100
    assert names(grid)[:4] == ["Softmax", "gemm_fp8", "Attention", "gemm_bf16"]
    grid.sort_by("time", reverse=True)
    assert names(grid)[:4] == ["gemm_bf16", "Attention", "gemm_fp8", "Softmax"]


def test_missing_values_sort_last_in_both_directions():
    grid = make_grid()
    for reverse in (False, True):
        grid.sort_by("time", reverse=reverse)
        assert set(names(grid)[-2:]) == {"add", "layer_norm"}, reverse
        # ties among the missing keep the order the rows were given in
        assert names(grid)[-2:] == ["add", "layer_norm"]


def test_numeric_strings_and_nan_strings_sort_as_numbers():
    grid = DataGrid([Column("v", "V", "number")])
    grid.set_rows([{"v": "100"}, {"v": "9"}, {"v": "nan"}, {"v": 10.5}, {"v": "n/a"}])
    grid.sort_by("v")
    assert [r["v"] for r in grid.visible_rows()] == ["9", 10.5, "100", "nan", "n/a"]


def test_text_sort_is_case_insensitive_with_none_last():
    grid = make_grid()
    grid.sort_by("name")
    assert names(grid) == ["add", "Attention", "gemm_bf16", "gemm_fp8", "layer_norm", "Softmax"]
    grid.sort_by("bound", reverse=True)
    assert grid.visible_rows()[-1]["bound"] is None
    grid.sort_by("bound", reverse=False)
    assert grid.visible_rows()[-1]["bound"] is None


def test_sort_toggles_direction_and_starts_ascending_on_a_new_column():
    grid = make_grid()
    grid.sort_by("time")
    assert (grid.sort_column, grid.sort_reverse) == ("time", False)
    grid.sort_by("time")
    assert (grid.sort_column, grid.sort_reverse) == ("time", True)
    grid.sort_by("time")
    assert grid.sort_reverse is False
    grid.sort_by("time", reverse=True)
    grid.sort_by("name")
    assert (grid.sort_column, grid.sort_reverse) == ("name", False)
    grid.clear_sort()
    assert grid.visible_keys() == KEYS


def test_sort_by_unknown_column_raises():
    grid = make_grid()
    try:
        grid.sort_by("nope")
    except KeyError:
        pass
    else:
        raise AssertionError("expected KeyError")


def test_tuple_rows_with_keys():
    grid = DataGrid([Column("op", "Op"), Column("gflops", "GFLOP/s", "number")])
    grid.set_rows([("b", 3.5), ("a", None), ("c", 12.0)], keys=["x", "y", "z"])
    grid.sort_by("gflops", reverse=True)
    assert grid.visible_keys() == ["z", "x", "y"]
    assert grid.get_row("y") == ("a", None)
    grid.set_filter("A")
    assert grid.visible_keys() == ["y"]


def test_duplicate_keys_are_rejected():
    grid = DataGrid([Column("op", "Op")])
    try:
        grid.set_rows([{"op": 1}, {"op": 2}], keys=["same", "same"])
    except ValueError:
        pass
    else:
        raise AssertionError("expected ValueError")


# ---------------------------------------------------------------- filtering

def test_text_filter_is_case_insensitive_over_text_columns():
    grid = make_grid()
    assert (grid.row_count, grid.visible_count) == (6, 6)
    grid.set_filter("GEMM")
    assert sorted(names(grid)) == ["gemm_bf16", "gemm_fp8"]
    grid.set_filter("sdpa")  # matches the category column, not the name
    assert names(grid) == ["Attention"]
    grid.set_filter("gemm fp8")  # every term must match
    assert names(grid) == ["gemm_fp8"]
    grid.set_filter("no-such-kernel")
    assert grid.visible_count == 0 and grid.cursor_row_key is None and grid.cursor_row is None
    grid.set_filter()
    assert (grid.row_count, grid.visible_count) == (6, 6)


def test_filter_columns_restricts_the_text_search():
    grid = DataGrid(kernel_columns(), filter_columns=["name"])
    grid.set_rows(ROWS, keys=KEYS)
    grid.set_filter("sdpa")
    assert grid.visible_count == 0
    grid.set_filter("soft")
    assert names(grid) == ["Softmax"]


def test_exact_filters_combine_with_text_and_sort():
    grid = make_grid()
    grid.set_filter(bound="MEMORY_BOUND")
    assert names(grid) == ["Softmax", "add", "gemm_fp8"]
    grid.set_filter(bound="MEMORY_BOUND", category="GEMM")
    assert names(grid) == ["gemm_fp8"]
    grid.set_filter("gemm", bound="COMPUTE_BOUND")
    assert names(grid) == ["gemm_bf16"]
    grid.set_filter(bound={"MEMORY_BOUND", "COMPUTE_BOUND"})
    assert grid.visible_count == 5
    grid.sort_by("time", reverse=True)
    assert names(grid) == ["gemm_bf16", "Attention", "gemm_fp8", "Softmax", "add"]
    assert grid.filter_equals == {"bound": {"MEMORY_BOUND", "COMPUTE_BOUND"}}
    grid.set_filter(bound=None)  # None: no condition
    assert grid.visible_count == 6


def test_set_rows_keeps_the_cursor_key_only_with_explicit_keys():
    grid = make_grid()
    grid.move_cursor_to_key("k-fp8")
    grid.set_rows(list(reversed(ROWS)), keys=list(reversed(KEYS)))
    assert grid.cursor_row_key == "k-fp8" and grid.cursor_position == 2
    grid.set_rows(ROWS)  # default keys are positions: nothing to keep
    grid.action_last_row()
    grid.set_rows(ROWS)
    assert grid.cursor_position == 0


def test_filter_and_sort_survive_set_rows():
    grid = make_grid()
    grid.sort_by("time", reverse=True)
    grid.set_filter(bound="MEMORY_BOUND")
    grid.set_rows(ROWS + [{"name": "copy", "time": 20, "bound": "MEMORY_BOUND", "category": "x"}],
                  keys=KEYS + ["k-copy"])
    assert names(grid) == ["copy", "gemm_fp8", "Softmax", "add"]


# ---------------------------------------------------------------- cursor (no app needed)

def test_cursor_keeps_its_row_through_sort_and_filter():
    grid = make_grid()
    assert grid.move_cursor_to_key("k-fp8")
    assert grid.cursor_position == 3
    grid.sort_by("time", reverse=True)
    assert grid.cursor_row_key == "k-fp8" and grid.cursor_position == 2
    grid.sort_by("name")
    assert grid.cursor_row_key == "k-fp8" and grid.cursor_position == 3
    grid.set_filter("gemm")
    assert grid.cursor_row_key == "k-fp8"
    assert grid.cursor_row is ROWS[3]
    # the cursor row is filtered out: the cursor stays at its position, clamped
    grid.set_filter("attention")
    assert grid.cursor_row_key == "k-attn"
    assert not grid.move_cursor_to_key("k-fp8")  # not visible
    assert not grid.move_cursor_to_key("no-such-key")
    grid.set_filter()
    assert grid.cursor_row_key == "k-attn"


# ---------------------------------------------------------------- in an app

async def test_header_and_first_rows_are_rendered():
    grid = make_grid(row_class=lambda r: BOUND_CLASS.get(r["bound"]))
    app = Harness(grid)
    async with app.run_test(size=(80, 12)) as pilot:
        await pilot.pause()
        header = grid.render_line(0).text
        for label in ("Kernel", "Time us", "Bound", "Category"):
            assert label in header
        assert "gemm_bf16" in grid.render_line(1).text
        assert "100.0" in grid.render_line(1).text  # formatted through fmt
        assert "Softmax" in grid.render_line(2).text
        grid.sort_by("time", reverse=True)
        await pilot.pause()
        assert "Time us ▼" in grid.render_line(0).text
        grid.sort_by("time")
        await pilot.pause()
        assert "Time us ▲" in grid.render_line(0).text
        assert "Softmax" in grid.render_line(1).text
        screenshot = app.export_screenshot()
        assert "Kernel" in screenshot and "Softmax" in screenshot and "gemm_fp8" in screenshot


async def test_empty_filter_result_says_so():
    grid = make_grid()
    app = Harness(grid)
    async with app.run_test(size=(80, 12)) as pilot:
        grid.set_filter("zzz")
        await pilot.pause()
        assert "no rows match the filter" in grid.render_line(1).text
        assert grid.render_line(2).text.strip() == ""


async def test_only_visible_rows_are_formatted():
    calls = []

    def fmt(v):
        calls.append(v)
        return f"{v:.2f}"

    grid = DataGrid([Column("name", "Name"), Column("v", "Value", "number", fmt=fmt)])
    rows = [{"name": f"k{i}", "v": float(i)} for i in range(20_000)]
    app = Harness(grid)
    async with app.run_test(size=(60, 20)) as pilot:
        grid.set_rows(rows)
        await pilot.pause()
        assert "k0" in grid.render_line(1).text
        # widths come from a sample (~400 rows), painting from the ~19 rows on screen
        assert len(calls) < 1_000
        calls.clear()
        grid.sort_by("v", reverse=True)
        await pilot.pause()
        # the cursor stays on k0, now the last row, and the view follows it
        assert grid.cursor_position == 19_999
        assert "k0 " in grid.render_line(19).text
        grid.action_first_row()
        await pilot.pause()
        assert "19999.00" in grid.render_line(1).text
        assert len(calls) < 100


async def test_long_cells_are_cut_to_the_column_width():
    grid = DataGrid([Column("name", "Name", max_width=10), Column("v", "V", "number")])
    grid.set_rows([{"name": "a_very_long_kernel_name_indeed", "v": 1}])
    app = Harness(grid)
    async with app.run_test(size=(60, 6)) as pilot:
        await pilot.pause()
        assert grid.column_widths["name"] == 10
        assert "a_very_lo…" in grid.render_line(1).text


async def test_keys_move_cursor_and_post_messages():
    messages = []
    grid = make_grid()
    app = Harness(grid)
    async with app.run_test(size=(80, 12), message_hook=messages.append) as pilot:
        grid.focus()
        await pilot.pause()
        await pilot.press("down", "down")
        assert grid.cursor_row_key == "k-add"
        highlighted = posted(messages, DataGrid.RowHighlighted)
        assert highlighted[-1].row_key == "k-add"
        assert highlighted[-1].row is ROWS[2]
        assert highlighted[-1].grid is grid
        await pilot.press("enter")
        selected = posted(messages, DataGrid.RowSelected)
        assert [(m.row_key, m.row["name"]) for m in selected][-1] == ("k-add", "add")
        await pilot.press("end")
        assert grid.cursor_row_key == "k-attn"
        await pilot.press("home")
        assert grid.cursor_row_key == "k-gemm"
        await pilot.press("up")  # already at the top
        assert grid.cursor_row_key == "k-gemm"
        await pilot.press("pagedown")
        assert grid.cursor_row_key == "k-attn"  # a page is more than six rows
        await pilot.press("pageup")
        assert grid.cursor_row_key == "k-gemm"


async def test_row_highlighted_messages_coalesce():
    grid = make_grid()
    first = DataGrid.RowHighlighted(grid, "a", None)
    later = DataGrid.RowHighlighted(grid, "b", None)
    other_grid = DataGrid.RowHighlighted(make_grid(), "c", None)
    assert later.can_replace(first)
    assert not later.can_replace(other_grid)
    assert not DataGrid.RowSelected(grid, "a", None).can_replace(first)


async def test_sort_key_sorts_by_the_cursor_column_and_toggles():
    messages = []
    grid = make_grid()
    app = Harness(grid)
    async with app.run_test(size=(80, 12), message_hook=messages.append) as pilot:
        grid.focus()
        await pilot.pause()
        assert grid.cursor_column_key == "name"
        await pilot.press("right")
        assert grid.cursor_column_key == "time"
        await pilot.press("s")
        assert (grid.sort_column, grid.sort_reverse) == ("time", False)
        assert names(grid)[0] == "Softmax"
        await pilot.press("s")
        assert (grid.sort_column, grid.sort_reverse) == ("time", True)
        assert names(grid)[0] == "gemm_bf16"
        # the cursor stayed on its row (k-gemm, the first row before sorting)
        assert grid.cursor_row_key == "k-gemm"
        sorted_messages = posted(messages, DataGrid.Sorted)
        assert [(m.column_key, m.reverse) for m in sorted_messages][-2:] == [("time", False), ("time", True)]
        await pilot.press("left", "left")
        assert grid.cursor_column_key == "name"


async def test_binding_ids_are_stable():
    ids = {b.id: b for b in DataGrid.BINDINGS}
    assert ids["grid.sort"].key == "s" and ids["grid.sort"].description
    assert ids["grid.column_left"].key == "left" and ids["grid.column_left"].description
    assert ids["grid.column_right"].key == "right" and ids["grid.column_right"].description


async def test_clicking_a_header_sorts_by_that_column():
    grid = make_grid()
    app = Harness(grid)
    async with app.run_test(size=(80, 12)) as pilot:
        await pilot.pause()
        x = grid.render_line(0).text.index("Time us")
        assert await pilot.click(DataGrid, offset=(x, 0))
        assert (grid.sort_column, grid.sort_reverse) == ("time", False)
        assert grid.cursor_column_key == "time"
        await pilot.click(DataGrid, offset=(x, 0))
        assert (grid.sort_column, grid.sort_reverse) == ("time", True)
        x = grid.render_line(0).text.index("Category")
        await pilot.click(DataGrid, offset=(x + 2, 0))
        assert (grid.sort_column, grid.sort_reverse) == ("category", False)
        await pilot.pause()
        assert "Category ▲" in grid.render_line(0).text


async def test_clicking_a_row_moves_the_cursor_then_selects():
    messages = []
    grid = make_grid()
    app = Harness(grid)
    async with app.run_test(size=(80, 12), message_hook=messages.append) as pilot:
        await pilot.pause()
        await pilot.click(DataGrid, offset=(2, 3))  # line 3 = third data row
        assert grid.cursor_row_key == "k-add"
        assert not posted(messages, DataGrid.RowSelected)
        await pilot.click(DataGrid, offset=(2, 3))
        assert [m.row_key for m in posted(messages, DataGrid.RowSelected)] == ["k-add"]


async def test_row_class_and_cursor_colour_rows():
    grid = make_grid(row_class=lambda r: BOUND_CLASS.get(r["bound"]))
    app = Harness(grid)
    async with app.run_test(size=(80, 12)) as pilot:
        await pilot.pause()
        memory = grid.get_component_rich_style("data-grid--row-memory-bound").color
        compute = grid.get_component_rich_style("data-grid--row-compute-bound").color
        assert memory != compute
        assert app.get_css_variables()["memory-bound"].lower() == memory.triplet.hex.lower()
        # line 1 is the cursor row (gemm_bf16); line 2 Softmax (memory), line 6 Attention (compute)
        assert {s.style.color for s in grid.render_line(2) if s.text.strip()} == {memory}
        assert {s.style.color for s in grid.render_line(6) if s.text.strip()} == {compute}
        cursor_bg = grid.render_line(1)._segments[0].style.bgcolor
        assert cursor_bg != grid.render_line(2)._segments[0].style.bgcolor
        # no colour for rows whose class is not a component class
        plain = {s.style.color for s in grid.render_line(5) if s.text.strip()}  # layer_norm, bound None
        assert plain == {grid.rich_style.color}


async def test_zebra_stripes_alternate_backgrounds():
    grid = make_grid(zebra_stripes=True)
    app = Harness(grid)
    async with app.run_test(size=(80, 12)) as pilot:
        await pilot.pause()
        bg = [grid.render_line(y)._segments[0].style.bgcolor for y in (2, 3, 4, 5)]
        assert bg[0] == bg[2] and bg[1] == bg[3] and bg[0] != bg[1]


async def test_fixed_first_column_stays_when_scrolling_right():
    columns = [Column("name", "Name")] + [Column(f"c{i}", f"Col{i}", "number", width=8) for i in range(12)]
    grid = DataGrid(columns, fixed_columns=1)
    grid.set_rows([{"name": f"kernel{i}", **{f"c{j}": i * j for j in range(12)}} for i in range(30)])
    app = Harness(grid)
    async with app.run_test(size=(50, 10)) as pilot:
        grid.focus()
        await pilot.pause()
        assert "Col0" in grid.render_line(0).text
        for _ in range(11):
            await pilot.press("right")
        await pilot.pause()
        assert grid.cursor_column_key == "c10"
        assert grid.scroll_offset.x > 0
        header = grid.render_line(0).text
        assert header.startswith(" Name") and "Col10" in header and "Col0 " not in header
        assert grid.render_line(1).text.startswith(" kernel0")


async def test_cursor_scrolls_into_view_and_survives_sort():
    grid = DataGrid([Column("name", "Name"), Column("v", "V", "number")])
    grid.set_rows([{"name": f"k{i:04d}", "v": (i * 7919) % 1000} for i in range(1000)], keys=list(range(1000)))
    app = Harness(grid)
    async with app.run_test(size=(40, 12)) as pilot:
        grid.focus()
        await pilot.pause()
        await pilot.press("pagedown", "pagedown", "down")
        key = grid.cursor_row_key
        assert grid.scroll_offset.y > 0
        grid.sort_by("v", reverse=True)
        await pilot.pause()
        assert grid.cursor_row_key == key
        top = grid.scroll_offset.y
        assert top <= grid.cursor_position < top + 11  # visible below the header
        line = grid.render_line(grid.cursor_position - top + 1).text
        assert f"k{key:04d}" in line
        await pilot.press("end")
        assert grid.cursor_position == 999
        assert grid.render_line(11).text.strip() != ""
        assert not math.isnan(grid.scroll_offset.y)


async def test_columns_with_a_drop_order_step_aside_while_the_table_is_too_wide():
    columns = [Column("name", "Name", width=10), Column("a", "A", width=10, drop_order=2),
               Column("b", "B", width=10), Column("c", "C", width=10, drop_order=1)]
    grid = DataGrid(columns)
    grid.set_rows([{"name": f"row{i}", "a": f"a{i}", "b": f"b{i}", "c": f"c{i}"} for i in range(3)])
    app = Harness(grid)
    async with app.run_test(size=(40, 8)) as pilot:  # 48 cells of table: C steps aside, then it fits
        grid.focus()
        await pilot.pause()
        assert grid.shown_columns == ["name", "a", "b"]
        await pilot.resize_terminal(30, 8)
        await pilot.pause()
        assert grid.shown_columns == ["name", "b"]
        assert grid.render_line(0).text.split() == ["Name", "B"]
        assert grid.render_line(1).text.split() == ["row0", "b0"]
        await pilot.press("right")  # the column cursor steps over the dropped A
        assert grid.cursor_column_key == "b"
        await pilot.click(grid, offset=(14, 0))  # B's header: sorts by B
        assert grid.sort_column == "b"
        assert grid.to_csv().splitlines()[0] == "Name,A,B,C"  # a dropped column is still exported
        await pilot.resize_terminal(60, 8)
        await pilot.pause()
        assert grid.shown_columns == ["name", "a", "b", "c"]


async def test_columns_with_squeeze_to_share_the_shortfall_and_a_middle_ellipsis_keeps_both_ends():
    columns = [Column("name", "Name", width=6), Column("path", "Path", max_width=40, squeeze_to=10, ellipsis="middle"),
               Column("note", "Note", max_width=40, squeeze_to=10), Column("when", "When", width=8, drop_order=1)]
    row = {"name": "r1", "path": "benchmark_tiny_20261129_192724_793ef2", "note": "n" * 30, "when": "12:00"}
    grid = DataGrid(columns, select_label="Open")
    grid.set_rows([row])
    app = Harness(grid)
    fitted = []
    async with app.run_test(size=(100, 6), message_hook=lambda m: fitted.append(m)
                            if isinstance(m, DataGrid.ColumnsFitted) else None) as pilot:
        grid.focus()
        await pilot.pause()
        assert grid.column_widths == {"name": 6, "path": 37, "note": 30, "when": 8}  # it fits: nothing narrows
        grid.sort_by("when", reverse=True)
        assert grid.hidden_sort_note == ""
        await pilot.resize_terminal(60, 6)  # 89 cells of table: When steps aside (79), then 19 more go
        await pilot.pause()
        assert grid.shown_columns == ["name", "path", "note"] and fitted
        assert grid.hidden_sort_note == "sorted by When ▼ (hidden at this width)"
        widths = grid.column_widths
        assert widths["name"] + widths["path"] + widths["note"] + 6 == 60
        assert (37 - widths["path"], 30 - widths["note"]) == (11, 8)  # 19 in proportion to 27 and 20 to give
        cells = grid.render_line(1).text
        assert "benchmark_ti…192724_793ef2" in cells and "n" * 10 + "…" in cells
        await pilot.resize_terminal(30, 6)  # nothing narrows below squeeze_to: the rest scrolls
        await pilot.pause()
        assert (grid.column_widths["path"], grid.column_widths["note"]) == (10, 10)
        assert "benc…93ef2" in grid.render_line(1).text
        await pilot.resize_terminal(100, 6)
        await pilot.pause()
        assert grid.column_widths["path"] == 37 and grid.hidden_sort_note == ""
        # enter shows in the footer under the screen's name for it
        assert any(b.binding.description == "Open" and b.binding.show for b in app.screen.active_bindings.values())
    with pytest.raises(ValueError, match="ellipsis"):
        Column("x", "X", ellipsis="start")
