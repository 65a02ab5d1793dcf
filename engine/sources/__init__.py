"""Kernel source finder: from profiler kernel names to the local source that defines them."""

from engine.sources.finder import (COLUMNS, EXTRA_COLUMNS, SOURCE_COLUMNS, SourceMatch, find_kernel_sources,
                                   repository_variables, to_columns)
from engine.sources.index import Definition, Repository, SourceIndex, build_index
from engine.sources.names import KernelName, parse_kernel_name, parse_kernel_names

__all__ = ["COLUMNS", "EXTRA_COLUMNS", "SOURCE_COLUMNS", "Definition", "KernelName", "Repository", "SourceIndex",
           "SourceMatch", "build_index", "find_kernel_sources", "parse_kernel_name", "parse_kernel_names",
           "repository_variables", "to_columns"]
