"""Opening files by name without trusting what the name points at.

A results folder, a project tree or a path from a client may hold a FIFO (an ``open`` that
never returns), a device (``/dev/zero``: a read that never ends), a directory, or a file far
larger than anything the engine means to hold in memory. Every file the engine opens by a name
it did not create itself goes through here:

* ``check_regular`` refuses what is not a regular file (a symlink counts as its target) and,
  given a limit, a file larger than it;
* ``open_regular`` opens with ``O_NONBLOCK`` (a FIFO swapped in after the check cannot block
  the open) and checks the opened file again (``fstat``);
* ``read_bytes`` / ``read_text`` read a whole file, never more than the limit.

The errors are ``OSError`` subclasses, so a caller that already handles an unreadable file
handles these too; their text names the file and what it is.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
from typing import Any, BinaryIO, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

MiB = 1 << 20
# What a run folder's files may be when read whole: a report (JSON, with per-request data a few
# MB at most), a small text (summary.txt, job.json, a request). Logs and events are read in part.
MAX_REPORT_BYTES = 256 * MiB
MAX_SMALL_TEXT_BYTES = 16 * MiB


class NotRegularFile(OSError):
    """The name is a FIFO, a device, a socket or a directory, not a file to read. ``strerror``
    says what it is; ``str()`` names the file too."""

    def __init__(self, path: PathLike, kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind}); refused", str(path))
        self.path, self.kind = str(path), kind

    def __str__(self) -> str:
        return f"{self.path}: {self.strerror}"


class FileTooLarge(OSError):
    """A file larger than the caller reads into memory."""

    def __init__(self, path: PathLike, size: int, limit: int, what: str = "the file") -> None:
        if size < 2 * limit:  # close to the limit: exact bytes, or "1.0 MB, larger than 1 MiB" reads wrong
            text = f"{size:,} bytes, larger than the {limit_text(limit)} ({limit:,} bytes) {what} may be"
        else:
            text = f"{human_size(size)}, larger than the {limit_text(limit)} {what} may be"
        super().__init__(errno.EFBIG, text, str(path))
        self.path, self.size, self.limit = str(path), size, limit

    def __str__(self) -> str:
        return f"{self.path}: {self.strerror}"


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words ("a FIFO", "a character device", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def human_size(n: float) -> str:
    """Decimal units, as ``ls -lh --si`` and file managers say them: ``52.4 MB``."""
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"  # pragma: no cover


def limit_text(limit: int) -> str:
    """A limit as it was chosen: ``1 MiB``, ``64 KiB``, else bytes."""
    if limit >= MiB and limit % MiB == 0:
        return f"{limit // MiB} MiB"
    if limit >= 1024 and limit % 1024 == 0:
        return f"{limit // 1024} KiB"
    return f"{limit} bytes"


def check_regular(path: PathLike, max_bytes: Optional[int] = None, what: str = "the file") -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed), refusing anything but a regular file and, with
    ``max_bytes``, a file larger than that. ``FileNotFoundError`` and the like pass through."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(path, file_kind(st.st_mode))
    if max_bytes is not None and st.st_size > max_bytes:
        raise FileTooLarge(path, st.st_size, max_bytes, what)
    return st


def is_regular_file(path: PathLike) -> bool:
    """True for a regular file (or a symlink to one); False for anything else, missing included."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: PathLike, max_bytes: Optional[int] = None, what: str = "the file") -> BinaryIO:
    """Open a regular file for binary reading; never blocks on a FIFO and never opens a device
    (checked before the open, and again on the opened file in case the name changed between)."""
    check_regular(path, max_bytes, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, file_kind(st.st_mode))
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileTooLarge(path, st.st_size, max_bytes, what)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: PathLike, max_bytes: int, what: str = "the file") -> bytes:
    """The whole file, refused (``FileTooLarge``) when it is, or grows to be, over ``max_bytes``."""
    with open_regular(path, max_bytes, what) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLarge(path, max(len(data), os.stat(path).st_size), max_bytes, what)
    return data


def read_text(path: PathLike, max_bytes: int, what: str = "the file", errors: str = "strict",
              encoding: str = "utf-8") -> str:
    return read_bytes(path, max_bytes, what).decode(encoding, errors)


def read_json(path: PathLike, max_bytes: int = MAX_REPORT_BYTES, what: str = "a report") -> Any:
    """A JSON file of a run folder (a report, job.json): ``OSError`` when it is not a regular file
    or over ``max_bytes``, ``ValueError`` when it is not JSON (or nests past the parser's limit)."""
    try:
        return json.loads(read_bytes(path, max_bytes, what))
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None


def open_text(path: PathLike, encoding: str = "utf-8", errors: str = "strict", newline: Optional[str] = None
              ) -> io.TextIOWrapper:
    """``open_regular`` for text (a CSV read row by row): never blocks on a FIFO or reads a device."""
    return io.TextIOWrapper(open_regular(path), encoding=encoding, errors=errors, newline=newline)


def read_tail(path: PathLike, max_bytes: int, errors: str = "replace") -> str:
    """The last ``max_bytes`` of a regular file (a log shown in full only when it is small)."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            fh.seek(size - max_bytes)
        return fh.read(max_bytes).decode("utf-8", errors)


__all__ = ["FileTooLarge", "MAX_REPORT_BYTES", "MAX_SMALL_TEXT_BYTES", "MiB", "NotRegularFile", "check_regular",
           "file_kind", "human_size", "is_regular_file", "limit_text", "open_regular", "open_text", "read_bytes", "read_json",
           "read_tail", "read_text"]
