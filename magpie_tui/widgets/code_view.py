"""Kernel source, highlighted (Pygments through ``textual.highlight``), opened at a line."""

from __future__ import annotations

from pathlib import Path

from textual.containers import VerticalScroll
from textual.content import Content
from textual.highlight import highlight
from textual.widgets import Static

from engine.jobs.query import SOURCE_SUFFIXES, FileTooLarge, NotRegularFile, read_text

MAX_SHOWN_BYTES = 4 << 20  # a larger file (or a FIFO, a device) is refused, never read whole

# Pygments lexer names; HIP is C++ with CUDA-like qualifiers.
_LEXERS = {"python": "python", "cuda": "cuda", "hip": "cuda", "cpp": "cpp", "c": "c"}


def language_of(path: Path | str) -> str | None:
    return _LEXERS.get(SOURCE_SUFFIXES.get(Path(path).suffix.lower(), ""))


class CodeView(VerticalScroll):
    DEFAULT_CSS = """
    CodeView { background: $surface; }
    CodeView > .code-view--text { width: auto; min-width: 100%; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.path: Path | None = None
        self.line: int | None = None
        self.text = ""

    def compose(self):
        yield Static(Content("no source selected"), classes="code-view--text")

    def show_message(self, text: str) -> None:
        """Say why there is no source to show."""
        self.path, self.line, self.text = None, None, ""
        self.query_one(".code-view--text", Static).update(Content(text))

    def show(self, path: Path, line: int | None = None) -> None:
        """Open ``path`` and scroll so that ``line`` (1-based) is near the top and marked."""
        try:
            text = read_text(path, MAX_SHOWN_BYTES, "a file shown here", errors="replace")
        except (NotRegularFile, FileTooLarge) as exc:  # the text names the file
            self.query_one(".code-view--text", Static).update(Content(f"not shown: {exc}"))
            return
        except OSError as exc:
            self.query_one(".code-view--text", Static).update(Content(f"cannot read {path}: {exc}"))
            return
        self.path, self.line, self.text = path, line, text
        self.query_one(".code-view--text", Static).update(render_source(text, language_of(path), line))
        if line:
            self.call_after_refresh(self.scroll_to, 0, max(0, line - 4), animate=False)


def render_source(text: str, language: str | None, mark_line: int | None = None) -> Content:
    body = highlight(text, language=language) if language else Content(text)
    lines = body.split("\n", allow_blank=True) if text else [Content("")]
    width = len(str(len(lines)))
    out = []
    for number, line in enumerate(lines, 1):
        gutter = Content.styled(f"{number:>{width}} ", "$text-muted")
        row = Content.assemble(gutter, line)
        if number == mark_line:
            row = Content.assemble(Content.styled(f"{number:>{width}}>", "bold $accent"), line).stylize(
                "on $boost")
        out.append(row)
    return Content("\n").join(out)
