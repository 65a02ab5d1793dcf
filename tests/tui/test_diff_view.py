"""DiffView and its model: rows, hunks and in-line spans; unified text; layout, keys, themes; big diffs."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from textual.worker import WorkerState

from magpie_tui.themes import load_themes
from tui.conftest import Harness
from magpie_tui.widgets import diff_view as diff_view_module
from magpie_tui.widgets.diff_model import DiffModel, DiffRow, compute_diff, inline_spans
from magpie_tui.widgets.diff_view import (
    DiffView,
    _Side,
    highlight_chunks,
    language_for_path,
)

REPO = Path(__file__).resolve().parents[2]
SOFTMAX = REPO / "examples" / "kernels" / "softmax_triton"


async def settle(pilot, view: DiffView, *, highlighted: bool = True) -> None:
    """Wait for the diff (and, unless told otherwise, the highlighting) to land."""
    for _ in range(400):
        await pilot.pause(0.02 if view.model is None else 0)
        if view.model is not None:
            break
    assert view.model is not None, "the diff never arrived"
    if highlighted:
        await workers_done(pilot)
    await pilot.pause()


async def workers_done(pilot) -> None:
    """Wait until no worker is pending or running (cancelled ones included, unlike ``wait_for_complete``)."""
    for _ in range(1000):
        if not any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in pilot.app.workers):
            return
        await pilot.pause(0.02)
    raise AssertionError("workers still running")


def lines(view: DiffView, count: int) -> list[str]:
    return [view.render_line(y).text for y in range(count)]


def theme_colour(theme_name: str, variable: str) -> str:
    """A theme's colour: a semantic variable (``diff-added``) or a base colour (``panel``)."""
    theme = next(t for t in load_themes()[0] if t.name == theme_name)
    value = theme.variables.get(variable) or getattr(theme, variable.replace("-", "_"))
    return str(value).lower()


def style_at(view: DiffView, y: int, text: str, offset: int = 0):
    """Rich style of the cell ``offset`` characters into the first ``text`` on row ``y``."""
    strip = view.render_line(y)
    x = strip.text.index(text) + offset
    position = 0
    for segment in strip:
        if position <= x < position + len(segment.text):
            return segment.style
        position += len(segment.text)
    raise AssertionError(f"{text!r} not in row {y}: {strip.text!r}")


def background_at(view: DiffView, y: int, text: str, offset: int = 0) -> str:
    style = style_at(view, y, text, offset)
    assert style is not None and style.bgcolor is not None
    return style.bgcolor.triplet.hex.lower()


def unified_by_difflib(a: str, b: str, path_a: str, path_b: str, n: int = 3) -> str:
    return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), path_a, path_b,
                                        n=n))


# -- the model, without Textual ----------------------------------------------------------------------------

BASE = "".join(f"line {i}\n" for i in range(1, 11))  # line 1 .. line 10


def test_model_rows_for_a_replaced_line_an_added_line_and_a_removed_line():
    candidate = BASE.replace("line 3\n", "line 3!\n").replace("line 6\n", "line 6\nnew line\n").replace(
        "line 9\n", "")
    model = compute_diff(BASE, candidate, context=1)
    assert model.added_lines == 2 and model.removed_lines == 2
    assert [(h.a_start, h.a_end, h.b_start, h.b_end) for h in model.hunks] == [(1, 4, 1, 4), (5, 10, 5, 10)]
    assert [h.header for h in model.hunks] == ["@@ -2,3 +2,3 @@", "@@ -6,5 +6,5 @@"]
    assert model.split_rows == [
        DiffRow("header", 0),
        DiffRow("context", 0, 2, 2),
        DiffRow("changed", 0, 3, 3, (), ((6, 7),)),  # "line 3" -> "line 3!": only the "!" is new
        DiffRow("context", 0, 4, 4),
        DiffRow("header", 1),
        DiffRow("context", 1, 6, 6),
        DiffRow("added", 1, None, 7),
        DiffRow("context", 1, 7, 8),
        DiffRow("context", 1, 8, 9),
        DiffRow("removed", 1, 9, None),
        DiffRow("context", 1, 10, 10),
    ]
    # unified: a replace block lists its old lines, then its new ones
    assert [(r.kind, r.left, r.right) for r in model.unified_rows[:5]] == [
        ("header", None, None), ("context", 2, 2), ("removed", 3, None), ("added", None, 3), ("context", 4, 4)]
    assert model.unified_rows[3].right_spans == ((6, 7),)
    assert model.split_hunk_rows == [0, 4] and model.unified_hunk_rows == [0, 5]


def test_inline_spans_at_the_changed_characters_and_cut_at_line_ends():
    old = ["    x = tl.load(ptr + offs, mask=mask)", "    y = x * 2"]
    new = ["    x = tl.load(ptr + offs, mask=m2)", "    y = x * 3"]
    model = compute_diff("\n".join(old) + "\n", "\n".join(new) + "\n")
    (changed_1, changed_2) = [r for r in model.split_rows if r.kind == "changed"]
    start = old[0].index("mask=") + len("mask=")
    assert [old[0][s:e] for s, e in changed_1.left_spans] == ["ask"]  # "mask" -> "m2": the m stays
    assert [new[0][s:e] for s, e in changed_1.right_spans] == ["2"]
    assert changed_1.left_spans == ((start + 1, start + 4),)
    assert changed_2.left_spans == ((12, 13),) and changed_2.right_spans == ((12, 13),)
    # a change straddling the newline between two lines of a block is cut at the line end
    old_spans, new_spans = inline_spans(["abc", "def"], ["abX", "Yef"])
    assert old_spans == [((2, 3),), ((0, 1),)] and new_spans == [((2, 3),), ((0, 1),)]


def test_unequal_replace_blocks_pair_lines_and_leave_the_rest_one_sided():
    model = compute_diff("a\nkeep\nx1\nx2\nx3\nkeep2\n", "a\nkeep\ny1\ny2\nkeep2\n")
    middle = [(r.kind, r.left, r.right) for r in model.split_rows if r.kind not in ("header", "context")]
    assert middle == [("changed", 3, 3), ("changed", 4, 4), ("removed", 5, None)]
    assert model.added_lines == 2 and model.removed_lines == 3


def test_rewritten_lines_get_no_inline_noise_and_huge_blocks_pair_line_by_line():
    model = compute_diff("completely different\n", "@@@@ 12345 ####\n")
    (row,) = [r for r in model.split_rows if r.kind == "changed"]
    assert row.left_spans == () and row.right_spans == ()
    old = [f"value_{i} = compute({i})" for i in range(400)]  # > BLOCK_CHAR_LIMIT: paired line by line
    new = [f"value_{i} = compute({i + 1})" if i % 2 else f"value_{i} = compute({i})!" for i in range(400)]
    old_spans, new_spans = inline_spans(old, new)
    assert len(old_spans) == len(new_spans) == 400
    assert [new[1][s:e] for s, e in new_spans[1]] == ["2"] and [new[0][s:e] for s, e in new_spans[0]] == ["!"]


def test_hunks_follow_the_context_setting():
    lines_a = [f"l{i}" for i in range(30)]
    lines_b = list(lines_a)
    lines_b[5], lines_b[24] = "changed 5", "changed 24"
    a, b = "\n".join(lines_a) + "\n", "\n".join(lines_b) + "\n"
    assert compute_diff(a, b, context=3).hunk_count == 2
    assert compute_diff(a, b, context=10).hunk_count == 1
    zero = compute_diff(a, b, context=0)
    assert [h.header for h in zero.hunks] == ["@@ -6 +6 @@", "@@ -25 +25 @@"]
    assert all(r.kind != "context" for r in zero.split_rows)
    identical = compute_diff(a, a)
    assert identical.hunk_count == 0 and identical.split_rows == [] and identical.unified_text() == ""


@pytest.mark.parametrize("context", [0, 1, 3, 5])
@pytest.mark.parametrize("candidate", ["softmax_onepass.py", "softmax_unmasked.py", "reference.py"])
def test_unified_text_is_what_difflib_prints(candidate, context):
    a = (SOFTMAX / "softmax_baseline.py").read_text()
    b = (SOFTMAX / candidate).read_text()
    expected = unified_by_difflib(a, b, "softmax_baseline.py", candidate, n=context)
    assert expected  # the files do differ
    model = compute_diff(a, b, context=context)
    assert model.unified_text("softmax_baseline.py", candidate) == expected
    view = DiffView("softmax_baseline.py", a, candidate, b, context=context)  # no app needed for this
    assert view.unified_text() == expected
    assert view.hunk_count == model.hunk_count == expected.count("\n@@ ")
    assert view.added_lines == sum(1 for line in expected.splitlines()[2:] if line.startswith("+"))
    assert view.removed_lines == sum(1 for line in expected.splitlines()[2:] if line.startswith("-"))
    # and the line-terminator-free form, for texts that do not end in a newline
    assert model.unified_lines("x", "y") == list(difflib.unified_diff(
        a.splitlines(), b.splitlines(), "x", "y", n=context, lineterm=""))


def test_languages_from_the_suffix_and_chunks_for_long_files():
    assert [language_for_path(p) for p in ("k.py", "k.cu", "k.cuh", "k.hip", "k.cpp", "k.h", "k.hpp")] == [
        "python", "cuda", "cuda", "cpp", "cpp", "cpp", "cpp"]
    assert language_for_path("kernel.ptx", ".version 8.0\n.target sm_90\n") == "ptx"
    chunk = diff_view_module.HIGHLIGHT_CHUNK_LINES
    lead = diff_view_module.HIGHLIGHT_LEAD_IN
    assert highlight_chunks(50, [(10, 20)]) == [(0, 50)]  # short files: whole, once
    long = 10 * chunk
    assert highlight_chunks(long, [(100, 110), (110 + lead, 130 + lead), (5 * chunk, 5 * chunk + 5)]) == [
        (100, 130 + lead), (5 * chunk, 5 * chunk + 5)]
    assert highlight_chunks(long, [(0, 2 * chunk + 1)]) == [(0, chunk), (chunk, 2 * chunk),
                                                            (2 * chunk, 2 * chunk + 1)]


def test_tabs_and_control_characters_keep_spans_on_the_right_characters():
    side = _Side(["\tx = 1\x1b", "a\tb"], "t.py")
    assert side.lines == ["    x = 1\ufffd", "a   b"]
    assert side.spans(0, ((1, 2),)) == ((4, 5),)  # the "x" after a tab
    assert side.spans(1, ((2, 3),)) == ((4, 5),)  # the "b" after "a" and a 3-cell tab
    highlighted = side.highlight_chunk(0, 2, diff_view_module.HighlightTheme)
    assert [c.plain for c in highlighted] == side.lines


# -- the widget --------------------------------------------------------------------------------------------

async def test_s_toggles_between_two_columns_and_one():
    a = (SOFTMAX / "softmax_baseline.py").read_text()
    b = (SOFTMAX / "softmax_onepass.py").read_text()
    view = DiffView("softmax_baseline.py", a, "softmax_onepass.py", b)
    app = Harness(view)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot, view)
        assert view.split
        changed = next(i for i, r in enumerate(view.rows) if r.kind == "changed" and r.left == 12)
        row = view.render_line(changed).text
        left, right = row.split("│")
        assert "12 - def softmax_three_pass(" in left and "12 + def softmax_one_pass(" in right
        split_screen = app.export_screenshot()
        split_rows = len(view.rows)

        await pilot.press("s")
        await pilot.pause()
        assert not view.split and len(view.rows) > split_rows
        text = lines(view, len(view.rows))
        assert not any("│" in line for line in text)
        # what reaches the terminal: a column rule on every row side by side, none unified
        assert split_screen.count("│") >= 30 and app.export_screenshot().count("│") == 0
        removed = next(line for line in text if "softmax_three_pass" in line)
        added = next(line for line in text if "softmax_one_pass" in line)
        assert removed.split()[:2] == ["12", "-"] and added.split()[:2] == ["12", "+"]
        assert text.index(removed) < text.index(added)  # unified: old lines, then new ones
        assert text[0].strip() == view.model.hunks[0].header

        await pilot.press("s")
        await pilot.pause()
        assert view.split and "│" in view.render_line(changed).text


async def test_split_filler_is_hatched_and_annotations_can_be_turned_off():
    view = DiffView("a.py", "x = 1\ny = 2\n", "b.py", "x = 1\nz = 3\ny = 2\n")
    app = Harness(view)
    async with app.run_test(size=(100, 12)) as pilot:
        await settle(pilot, view)
        added = next(i for i, r in enumerate(view.rows) if r.kind == "added")
        left, right = view.render_line(added).text.split("│")
        assert set(left) == {diff_view_module.HATCH}
        assert "2 + z = 3" in right
        assert background_at(view, added, diff_view_module.HATCH) == theme_colour("magpie-dark", "panel")
        assert background_at(view, added, "z = 3") == theme_colour("magpie-dark", "diff-added")
        view.annotations = False
        await pilot.pause()
        _, right = view.render_line(added).text.split("│")
        assert "+" not in right and right.split()[:2] == ["2", "z"]


async def test_long_lines_scroll_sideways_in_both_columns_under_fixed_line_numbers():
    a = "short\n" + "x = " + " + ".join(f"v{i}" for i in range(40)) + "\n"
    b = "short\n" + "x = " + " + ".join(f"v{i}" for i in range(41)) + "\n"
    view = DiffView("a.py", a, "b.py", b)
    app = Harness(view)
    async with app.run_test(size=(80, 10)) as pilot:
        await settle(pilot, view)
        assert view.max_scroll_x > 0
        view.scroll_to(x=view.max_scroll_x, animate=False, immediate=True)
        await pilot.pause()
        left, right = view.render_line(2).text.split("│")
        assert left.split()[:2] == ["2", "-"] and right.split()[:2] == ["2", "+"]
        assert left.rstrip().endswith("v38 + v39") and right.rstrip().endswith("v39 + v40")  # the longest line's end


async def test_n_and_p_scroll_to_the_hunks():
    lines_a = [f"value_{i} = {i}" for i in range(200)]
    lines_b = list(lines_a)
    for i in (20, 90, 160):
        lines_b[i] = f"value_{i} = {i} + 1"
    view = DiffView("a.py", "\n".join(lines_a) + "\n", "b.py", "\n".join(lines_b) + "\n")
    app = Harness(view)
    async with app.run_test(size=(120, 8)) as pilot:  # short, so every hunk can reach the top
        await settle(pilot, view)
        starts = view.model.hunk_rows(split=True)
        assert view.hunk_count == 3 and starts == [0, 8, 16]
        await pilot.press("n")
        assert view.scroll_y == starts[1] and view.current_hunk == 1
        assert view.render_line(0).text.strip() == "@@ -88,7 +88,7 @@"
        await pilot.press("n")
        assert view.scroll_y == min(starts[2], view.max_scroll_y) and view.current_hunk == 2
        await pilot.press("n")  # no further hunk: stays
        assert view.current_hunk == 2
        await pilot.press("p", "p")
        assert view.scroll_y == 0 and view.current_hunk == 0
        await pilot.press("s")  # unified: the hunks start at other rows
        await pilot.press("n")
        assert view.scroll_y == view.model.hunk_rows(split=False)[1]


async def test_next_hunk_keeps_moving_when_the_last_hunks_cannot_reach_the_top():
    lines_a = [f"v{i}" for i in range(40)]
    lines_b = list(lines_a)
    for i in (5, 30, 36):
        lines_b[i] = f"w{i}"
    view = DiffView("a.py", "\n".join(lines_a) + "\n", "b.py", "\n".join(lines_b) + "\n", context=1)
    app = Harness(view)
    async with app.run_test(size=(120, 10)) as pilot:
        await settle(pilot, view)
        assert view.hunk_count == 3 and view.max_scroll_y < view.model.hunk_rows(True)[2]
        await pilot.press("n", "n")
        assert view.current_hunk == 2 and view.scroll_y == view.max_scroll_y
        await pilot.press("p")
        assert view.current_hunk == 1
        await pilot.press("home")
        assert view.current_hunk == 0  # scrolled by hand: the top row decides again


async def test_colours_come_from_the_theme_and_follow_theme_changes():
    view = DiffView("k.py", "import torch\nx = 1\n", "k.py", "import torch\nx = 2\n", split=False)
    app = Harness(view)
    async with app.run_test(size=(100, 10)) as pilot:
        await settle(pilot, view)
        removed = next(i for i, r in enumerate(view.rows) if r.kind == "removed")
        added = next(i for i, r in enumerate(view.rows) if r.kind == "added")
        for theme in ("magpie-dark", "magpie-light"):
            app.theme = theme
            await pilot.pause()
            assert background_at(view, removed, "x = ") == theme_colour(theme, "diff-removed")
            assert background_at(view, added, "x = ") == theme_colour(theme, "diff-added")
            assert background_at(view, removed, "x = 1", 4) == theme_colour(theme, "diff-removed-inline")
            assert background_at(view, added, "x = 2", 4) == theme_colour(theme, "diff-added-inline")
            assert background_at(view, 0, "@@") == theme_colour(theme, "panel")  # hunk header
        # syntax highlighting: the keyword is coloured differently from the module name after it
        context = next(i for i, r in enumerate(view.rows) if r.kind == "context")
        assert style_at(view, context, "import").color != style_at(view, context, "torch").color


async def test_auto_split_follows_the_width_and_set_texts_replaces_the_diff():
    view = DiffView("a.py", "a\nb\n", "b.py", "a\nc\n")
    view.auto_split = True
    app = Harness(view)
    ready: list[DiffView.Ready] = []
    async with app.run_test(size=(80, 20), message_hook=lambda m: isinstance(m, DiffView.Ready) and ready.append(m)
                            ) as pilot:
        await settle(pilot, view)
        assert not view.split
        await pilot.resize_terminal(140, 20)
        await pilot.pause()
        assert view.split
        view.set_texts("c.py", "same\n", "d.py", "same\n")
        await pilot.pause()
        assert view.hunk_count == 0 and view.path_b == "d.py"
        assert "No differences between c.py and d.py" in view.render_line(0).text
        assert len({id(message) for message in ready}) == 2 and ready[-1].diff_view is view


async def test_bindings_have_ids_and_descriptions():
    ids = {binding.id: (binding.key, binding.description) for binding in DiffView.BINDINGS}
    assert ids["diff.toggle_split"][0] == "s" and ids["diff.next_hunk"][0] == "n"
    assert ids["diff.prev_hunk"][0] == "p" and all(description for _, description in ids.values())


async def test_a_20k_line_diff_is_computed_off_the_loop_and_scrolls():
    size = 20_000
    lines_a = [f"    x{i} = tl.load(ptr + {i} * stride, mask=mask)" for i in range(size)]
    lines_b = list(lines_a)
    for i in range(0, size, 1999):
        lines_b[i] = lines_b[i].replace("mask=mask", "mask=other")
    lines_b.insert(size // 2, "    tl.debug_barrier()")
    text_a, text_b = "\n".join(lines_a) + "\n", "\n".join(lines_b) + "\n"
    view = DiffView("big_a.py", text_a, "big_b.py", text_b)
    assert view.model is None  # too big to diff in the constructor
    app = Harness(view)
    async with app.run_test(size=(120, 30)) as pilot:
        assert view.loading
        await settle(pilot, view, highlighted=False)
        assert not view.loading
        expected = unified_by_difflib(text_a, text_b, "big_a.py", "big_b.py")
        assert view.hunk_count == expected.count("\n@@ ") == 11  # the insertion shares a hunk with a change
        assert view.added_lines == 12 and view.removed_lines == 11
        assert view.virtual_size.height == len(view.rows)
        await pilot.press("end")  # a jump, not an animation
        await pilot.pause()
        assert view.scroll_y == view.max_scroll_y > 0
        last_row = view.rows[-1]
        assert (last_row.kind, last_row.left, last_row.right) == ("context", 19994, 19995)
        bottom = view.render_line(view.scrollable_content_region.height - 1).text
        assert bottom.split("│")[0].split()[:2] == ["19994", "x19993"]
        await pilot.press("s")
        await pilot.pause()
        assert not view.split and view.scroll_y > 0
        assert view.unified_text() == expected


def test_model_compute_can_be_cancelled():
    from magpie_tui.widgets.diff_model import DiffCancelled

    with pytest.raises(DiffCancelled):
        DiffModel.compute("a\nb\n", "a\nc\n", cancelled=lambda: True)


async def test_set_texts_while_a_big_diff_is_computing_wins_over_it():
    big_a = "".join(f"a{i}\n" for i in range(30_000))
    big_b = "".join(f"a{i}\n" if i % 1000 else f"b{i}\n" for i in range(30_000))
    view = DiffView("big_a.py", big_a, "big_b.py", big_b)
    app = Harness(view)
    async with app.run_test(size=(100, 20)) as pilot:
        assert view.loading and view.model is None
        view.set_texts("small_a.py", "one\ntwo\n", "small_b.py", "one\n2\n")
        await workers_done(pilot)
        await pilot.pause()
        assert not view.loading and view.hunk_count == 1 and view.path_a == "small_a.py"
        assert "two" in view.render_line(2).text
