"""The one way snapviz opens a file it reads: regular files only, links resolved and checked
first, I/O errors as one line (docs/security.md, "Loading").

Every input (snapshot, trace, each file of a run directory, ``run.json``, rules files, the
trace of ``--merge-into``) is opened here:

* the path is resolved (every symbolic link followed) and the target checked *before* it is
  opened: FIFOs (reading blocks forever), character and block devices (``/dev/zero`` never
  ends), sockets and directories are refused, and so is anything under ``/proc``, ``/sys`` or
  ``/dev``, whose "regular" files are views of a process or the kernel (``/proc/self/mem``
  fails with EIO, ``/proc/kcore`` is terabytes);
* the file is opened non-blocking and checked again through its descriptor (a path swapped
  for a FIFO between the check and the open is still refused);
* every ``OSError`` while opening or reading becomes :class:`~snapviz.errors.InputError`,
  one line naming the file.
"""

from __future__ import annotations

import io
import os
import stat
from typing import IO, Any

from snapviz.errors import InputError

# Kernel and device pseudo-filesystems: their files look regular but are not data.
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _pseudo(real: str) -> str | None:
    return next((r for r in PSEUDO_ROOTS if real == r or real.startswith(r + "/")), None)


def check_regular_file(path: str, allow_dir: bool = True) -> os.stat_result:
    """Refuse, before opening, anything but a regular file (or, with ``allow_dir``, a directory):
    symbolic links are followed and their target must qualify; pseudo-filesystem files
    (``/proc``, ``/sys``, ``/dev``) are refused whatever their type."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        detail = _reason(exc) if isinstance(exc, OSError) else str(exc)
        raise InputError(f"{path}: cannot open ({detail})") from None
    if stat.S_ISDIR(st.st_mode) and not allow_dir:
        raise InputError(f"{path}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is {_kind(st.st_mode)}, not a regular file; copy the data to a file first")
    root = _pseudo(real)
    if root is not None:
        via = f" (a link to {real})" if real != os.path.abspath(path) else ""
        raise InputError(f"{path}: is a file of {root}{via}, not a data file; copy the data to a file first")
    return st


def open_regular(path: str) -> IO[bytes]:
    """``path`` opened for binary reading (a buffered :class:`io.FileIO`), after
    :func:`check_regular_file`; the descriptor is checked to be the same regular file."""
    st = check_regular_file(path, allow_dir=False)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.path.realpath(path), flags)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({_reason(exc)})") from None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise InputError(f"{path}: changed while it was being opened; not read")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        raw = _Checked(fd, path)
        return io.BufferedReader(raw, 1 << 16)
    except BaseException:
        os.close(fd)
        raise


class _Checked(io.FileIO):
    """A file whose read errors (EIO from a failing disk or a network mount) are one line."""

    def __init__(self, fd: int, path: str) -> None:
        super().__init__(fd, "rb", closefd=True)
        self._path = path

    def readinto(self, b: Any) -> int | None:
        try:
            return super().readinto(b)
        except OSError as exc:
            raise InputError(f"{self._path}: cannot read ({_reason(exc)})") from None

    def readall(self) -> bytes:
        try:
            return super().readall()
        except OSError as exc:
            raise InputError(f"{self._path}: cannot read ({_reason(exc)})") from None


def read_bounded(path: str, max_bytes: int, what: str) -> bytes:
    """The whole of a small input (``run.json``, a rules file), refused beyond ``max_bytes``
    without reading past them."""
    with open_regular(path) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(f"{path}: {what} is over {max_bytes >> 20} MiB, far more than such a file holds")
    return data
