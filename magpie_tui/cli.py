"""``magpie-tui [DIR]`` (also ``magpie tui [DIR]``): open the workbench on a project folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="magpie-tui", description="The Magpie workbench: configs, runs, live logs, "
                                "reports, roofline and kernel drill-down, in the terminal.")
    p.add_argument("project", nargs="?", default=".", help="project folder (default: the current one); "
                   "'examples/' is the built-in demo")
    p.add_argument("-r", "--results", action="append", default=None, metavar="DIR",
                   help="results folder to watch (repeatable; default: <project>/results and any results/ "
                        "folder one or two levels down)")
    p.add_argument("--theme", help="theme for this session (magpie-dark, magpie-light, magpie-high-contrast, or "
                                   "any Textual theme)")
    p.add_argument("--settings", help="settings file (default: $MAGPIE_TUI_CONFIG or ~/.config/magpie/tui.yaml)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    project = Path(args.project).expanduser()
    if not project.is_dir():
        print(f"magpie-tui: {project}: not a folder (give a project folder, e.g. examples/)", file=sys.stderr)
        return 2
    from magpie_tui.app import run_app
    from magpie_tui.settings import load_settings
    settings = load_settings(project, [Path(r) for r in args.results] if args.results else None,
                             Path(args.settings).expanduser() if args.settings else None)
    if args.theme:
        settings.theme = args.theme
    return run_app(settings)


if __name__ == "__main__":
    sys.exit(main())
