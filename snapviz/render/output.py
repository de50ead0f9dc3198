"""Atomic output: write to a temp file beside the target, then rename (no half-written files)."""
from __future__ import annotations

import os
import tempfile


def check_output_paths(*paths: str | None) -> None:
    """Fail before any work (and before any file is written) if an output cannot be created."""
    from snapviz.errors import InputError

    for path in paths:
        if not path or path == "-":
            continue
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d):
            raise InputError(f"{path}: output directory does not exist")
        if os.path.isdir(path):
            raise InputError(f"{path}: is a directory; name an output file")
        if not os.access(d, os.W_OK):
            raise InputError(f"{path}: output directory is not writable")


def write_outputs(outputs: list[tuple[str, str]]) -> list[str]:
    """Write rendered outputs ('-' = stdout); everything was rendered before the first write,
    so a rendering failure leaves no partial files. Returns the paths written."""
    import sys

    written = []
    for path, text in outputs:
        if path == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            write_atomic(path, text)
            written.append(path)
    return written


def write_atomic(path: str, data: str | bytes) -> None:
    target = os.path.abspath(path)
    d = os.path.dirname(target)
    if not os.path.isdir(d):
        from snapviz.errors import InputError
        raise InputError(f"{path}: output directory does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".snapviz-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        # mkstemp creates 0600; a report is an ordinary file: honour the umask like open().
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
