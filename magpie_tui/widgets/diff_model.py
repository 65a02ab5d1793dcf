"""The diff model behind ``DiffView``: plain Python, no Textual.

Line level: ``difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(context)`` gives the hunks, exactly the
groups ``difflib.unified_diff`` prints, so ``DiffModel.unified_text`` matches it line for line.

Character level: inside every ``replace`` block a second ``SequenceMatcher`` runs over the block's lines joined
with newlines; its non-equal opcodes become the in-line spans, cut at line boundaries. Blocks too big for that
(the character matcher is roughly quadratic) fall back to pairing the block's lines one to one, and pairs that
are too long or too dissimilar get no in-line spans (the whole line is still marked as changed).

Rows come in two layouts built from the same hunks:

* split (side by side): a ``replace`` block of m old and n new lines gives max(m, n) rows; the first min(m, n)
  are ``changed`` rows (old on the left, new on the right), the rest are ``removed`` or ``added`` rows whose other
  side is empty filler.
* unified: the old lines of a block (``removed`` rows) come first, then the new ones (``added`` rows).

Each hunk starts with a ``header`` row. Line numbers on rows are 1-based; span offsets are character offsets
into the line, as ``(start, end)`` half-open pairs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

RowKind = Literal["header", "context", "removed", "added", "changed"]
Spans = tuple[tuple[int, int], ...]

#: Joined replace blocks longer than this (characters, either side) are matched line pair by line pair.
BLOCK_CHAR_LIMIT = 4000
#: Line pairs whose length product exceeds this get no in-line spans.
PAIR_CHAR_PRODUCT_LIMIT = 250_000
#: Below this character-level similarity a block or pair is "rewritten", not "edited": no in-line spans.
INLINE_MIN_RATIO = 0.3


class DiffCancelled(Exception):
    """Raised by ``DiffModel.compute`` when its ``cancelled`` callback says so."""


@dataclass(frozen=True, slots=True)
class DiffRow:
    """One rendered row. ``left`` / ``right`` are 1-based line numbers in the old / new text (None: no line)."""

    kind: RowKind
    hunk: int
    left: int | None = None
    right: int | None = None
    left_spans: Spans = ()
    right_spans: Spans = ()


@dataclass(frozen=True, slots=True)
class DiffHunk:
    """A group of opcodes with context; ranges are 0-based, half-open, as in difflib."""

    index: int
    a_start: int
    a_end: int
    b_start: int
    b_end: int
    opcodes: tuple[tuple[str, int, int, int, int], ...]

    @property
    def header(self) -> str:
        return f"@@ -{_format_range(self.a_start, self.a_end)} +{_format_range(self.b_start, self.b_end)} @@"


def _format_range(start: int, stop: int) -> str:
    """The ``start,length`` of a unified hunk header, as difflib writes it."""
    beginning = start + 1
    length = stop - start
    if length == 1:
        return str(beginning)
    if not length:
        beginning -= 1
    return f"{beginning},{length}"


def split_lines(text: str) -> list[str]:
    """Lines without terminators (``str.splitlines``, as difflib users split)."""
    return text.splitlines()


def _merge(spans: list[tuple[int, int]]) -> Spans:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if start >= end:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def _cut_by_lines(ranges: Sequence[tuple[int, int]], lines: Sequence[str]) -> list[Spans]:
    """Character ranges over ``"\\n".join(lines)`` → per-line spans (the newlines themselves are dropped)."""
    per_line: list[list[tuple[int, int]]] = [[] for _ in lines]
    starts = []
    offset = 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    line_no = 0
    for start, end in sorted(ranges):
        while line_no < len(lines) and starts[line_no] + len(lines[line_no]) < start:
            line_no += 1
        index = line_no
        while index < len(lines) and starts[index] < end:
            line_start = starts[index]
            lo = max(start, line_start) - line_start
            hi = min(end, line_start + len(lines[index])) - line_start
            if hi > lo:
                per_line[index].append((lo, hi))
            index += 1
    return [_merge(spans) for spans in per_line]


def inline_spans(old: Sequence[str], new: Sequence[str],
                 cancelled: Callable[[], bool] | None = None) -> tuple[list[Spans], list[Spans]]:
    """In-line changed spans for a replace block: one tuple of spans per old line and per new line."""
    old_text = "\n".join(old)
    new_text = "\n".join(new)
    if len(old_text) <= BLOCK_CHAR_LIMIT and len(new_text) <= BLOCK_CHAR_LIMIT:
        result = _char_diff(old_text, new_text)
        if result is None:
            return [()] * len(old), [()] * len(new)
        old_ranges, new_ranges = result
        return _cut_by_lines(old_ranges, old), _cut_by_lines(new_ranges, new)
    old_spans: list[Spans] = [()] * len(old)
    new_spans: list[Spans] = [()] * len(new)
    for index in range(min(len(old), len(new))):
        if cancelled is not None and index % 512 == 511 and cancelled():
            raise DiffCancelled
        a, b = old[index], new[index]
        if len(a) * len(b) > PAIR_CHAR_PRODUCT_LIMIT:
            continue
        result = _char_diff(a, b)
        if result is not None:
            old_spans[index], new_spans[index] = _merge(list(result[0])), _merge(list(result[1]))
    return old_spans, new_spans


def _char_diff(a: str, b: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    # autojunk off: at character level the "popular" characters (spaces, 'e') are exactly what must match.
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if (a or b) and matcher.ratio() < INLINE_MIN_RATIO:
        return None
    a_ranges: list[tuple[int, int]] = []
    b_ranges: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if i2 > i1:
            a_ranges.append((i1, i2))
        if j2 > j1:
            b_ranges.append((j1, j2))
    return a_ranges, b_ranges


@dataclass
class DiffModel:
    """Hunks and rows for two texts. Build with ``DiffModel.compute(text_a, text_b, context=3)``."""

    a_lines: list[str]
    b_lines: list[str]
    context: int
    hunks: list[DiffHunk] = field(default_factory=list)
    split_rows: list[DiffRow] = field(default_factory=list)
    unified_rows: list[DiffRow] = field(default_factory=list)
    split_hunk_rows: list[int] = field(default_factory=list)
    unified_hunk_rows: list[int] = field(default_factory=list)
    added_lines: int = 0
    removed_lines: int = 0

    @classmethod
    def compute(cls, text_a: str, text_b: str, *, context: int = 3, inline: bool = True,
                cancelled: Callable[[], bool] | None = None) -> DiffModel:
        """Diff two texts. ``cancelled`` is polled between hunks; when it returns True, ``DiffCancelled``."""
        a_lines, b_lines = split_lines(text_a), split_lines(text_b)
        model = cls(a_lines, b_lines, max(0, context))
        model._build(inline, cancelled)
        return model

    @property
    def hunk_count(self) -> int:
        return len(self.hunks)

    def rows(self, split: bool) -> list[DiffRow]:
        return self.split_rows if split else self.unified_rows

    def hunk_rows(self, split: bool) -> list[int]:
        """Index of each hunk's header row in the given layout."""
        return self.split_hunk_rows if split else self.unified_hunk_rows

    def _build(self, inline: bool, cancelled: Callable[[], bool] | None) -> None:
        a, b = self.a_lines, self.b_lines
        matcher = difflib.SequenceMatcher(None, a, b)
        split_rows, unified_rows = self.split_rows, self.unified_rows
        for index, group in enumerate(matcher.get_grouped_opcodes(self.context)):
            if cancelled is not None and cancelled():
                raise DiffCancelled
            hunk = DiffHunk(index, group[0][1], group[-1][2], group[0][3], group[-1][4],
                            tuple(tuple(op) for op in group))  # type: ignore[misc]
            self.hunks.append(hunk)
            self.split_hunk_rows.append(len(split_rows))
            self.unified_hunk_rows.append(len(unified_rows))
            header = DiffRow("header", index)
            split_rows.append(header)
            unified_rows.append(header)
            for tag, i1, i2, j1, j2 in group:
                if tag == "equal":
                    for offset in range(i2 - i1):
                        row = DiffRow("context", index, i1 + offset + 1, j1 + offset + 1)
                        split_rows.append(row)
                        unified_rows.append(row)
                    continue
                self.removed_lines += i2 - i1
                self.added_lines += j2 - j1
                if tag == "replace" and inline:
                    old_spans, new_spans = inline_spans(a[i1:i2], b[j1:j2], cancelled)
                else:
                    old_spans, new_spans = [()] * (i2 - i1), [()] * (j2 - j1)
                removed = [DiffRow("removed", index, i1 + k + 1, None, old_spans[k]) for k in range(i2 - i1)]
                added = [DiffRow("added", index, None, j1 + k + 1, (), new_spans[k]) for k in range(j2 - j1)]
                unified_rows.extend(removed)
                unified_rows.extend(added)
                paired = min(len(removed), len(added))
                for k in range(paired):
                    split_rows.append(DiffRow("changed", index, removed[k].left, added[k].right,
                                              removed[k].left_spans, added[k].right_spans))
                split_rows.extend(removed[paired:])
                split_rows.extend(added[paired:])

    def unified_lines(self, path_a: str = "a", path_b: str = "b") -> list[str]:
        """Lines (no terminators) of the unified diff: what ``difflib.unified_diff(..., lineterm="")`` yields."""
        if not self.hunks:
            return []
        out = [f"--- {path_a}", f"+++ {path_b}"]
        a, b = self.a_lines, self.b_lines
        for hunk in self.hunks:
            out.append(hunk.header)
            for tag, i1, i2, j1, j2 in hunk.opcodes:
                if tag == "equal":
                    out.extend(" " + line for line in a[i1:i2])
                    continue
                out.extend("-" + line for line in a[i1:i2])
                out.extend("+" + line for line in b[j1:j2])
        return out

    def unified_text(self, path_a: str = "a", path_b: str = "b") -> str:
        """The unified diff as text, every line ending in a newline ("" when the texts are equal)."""
        lines = self.unified_lines(path_a, path_b)
        return "".join(line + "\n" for line in lines)


def compute_diff(text_a: str, text_b: str, *, context: int = 3, inline: bool = True) -> DiffModel:
    """Shorthand for ``DiffModel.compute``."""
    return DiffModel.compute(text_a, text_b, context=context, inline=inline)
