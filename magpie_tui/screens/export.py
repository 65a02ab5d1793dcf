"""Export any table (``x`` on a DataGrid): the rows as shown, filtered and sorted, written as CSV
(raw values, for a spreadsheet or pandas) and Markdown (the cells as drawn, for a report or an
issue), side by side under ``<results>/exports/``."""

from __future__ import annotations

import re
import time
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def export_paths(folder: Path, stem: str, stamp: str) -> tuple[Path, Path]:
    base = _UNSAFE.sub("_", stem).strip("_") or "table"
    return folder / f"{base}_{stamp}.csv", folder / f"{base}_{stamp}.md"


def write_export(grid, folder: Path, stem: str) -> tuple[Path, Path]:
    """Blocking (formats every visible row, writes two files): call it off the event loop."""
    csv_path, md_path = export_paths(folder, stem, time.strftime("%Y%m%d_%H%M%S"))
    folder.mkdir(parents=True, exist_ok=True)
    csv_path.write_text(grid.to_csv(), encoding="utf-8")
    md_path.write_text(grid.to_markdown(), encoding="utf-8")
    return csv_path, md_path


def export_grid(grid) -> None:
    """Write ``grid``'s rows in a thread worker and say where they went."""
    app = grid.app
    screen = grid.screen
    folder = Path(app.settings.launch_results_dir) / "exports"
    subject = getattr(getattr(screen, "info", None), "name", None) or type(screen).__name__.replace("Screen", "")
    stem = f"{subject}_{grid.id or 'table'}"
    rows = grid.visible_count

    def work() -> None:
        try:
            csv_path, md_path = write_export(grid, folder, stem)
        except OSError as exc:
            app.call_from_thread(app.notify, f"export failed: {exc}", severity="error")
            return
        app.call_from_thread(app.notify, f"exported {rows} rows: {csv_path} and {md_path.name}", timeout=8)

    app.run_worker(work, thread=True, group="export", exit_on_error=False, description="export a table")
