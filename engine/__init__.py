"""Headless engine of the Magpie workbench: configs, runs, kernel evaluation, hardware.

Nothing under ``engine`` imports Textual; the TUI talks to the engine through its
public functions and the run folders.
"""

__version__ = "0.1.0"
