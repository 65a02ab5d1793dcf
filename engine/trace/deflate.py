"""The deflate codec of trace files: zlib-ng's (a dependency), else, where it cannot be imported,
the standard library's zlib. Same gzip format either way (files from one read by the other); on a
337 MiB profiler trace zlib-ng inflated 2.1x and deflated at level 1 2.5x as fast as zlib here
(its level-1 output ~20% larger), which is most of what a large trace's load and split cost
beside parsing and encoding (docs/validation.md, "Trace analysis speed IV")."""

from __future__ import annotations

try:
    from zlib_ng import zlib_ng as zlib
except ImportError:  # the standard library's: the same calls
    import zlib

NAME = "zlib-ng" if zlib.__name__.startswith("zlib_ng") else "zlib"
