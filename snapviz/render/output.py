"""Output files that cannot destroy anything (docs/security.md, "Outputs").

Every verb (analyze, compare, check, matrix) checks all its output paths with
:func:`check_outputs` before any work, and writes them with :func:`write_outputs`:

* an output may not be an input, a file inside an input run directory, the run.json a
  snapshot picks up beside it, or (hard link, symlink) the same file as one of those;
* it must be a new path or a regular file: FIFOs, devices, sockets and directories (or
  symlinks to them) are refused, never replaced; ``-`` (stdout) may be given once;
* its directory must accept a new file (probed by creating one), so ``-o /proc/x.html``
  fails before the analysis, not after it;
* all outputs of one command are written to temp files beside their targets first and
  renamed only when every one was written: a full disk leaves nothing half-done, and a
  failed rename puts back what was there. An existing file keeps its mode (and owner
  where allowed); a symlink to a regular file keeps pointing at it (the target is replaced).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Sequence

from snapviz.errors import InputError, ReaderGone

STDOUT = "-"
_TMP_PREFIX = ".snapviz-"
_MAX_DIR_MEMBERS = 10_000  # members of an input directory compared by inode (a run has a handful)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _protected(inputs: Sequence[str]) -> tuple[set[tuple[int, int]], list[str]]:
    """(dev, inode) of every input file, of the run.json beside a file input, and of the files in
    an input directory (a ``run.json`` input names its directory: the loader reads the whole run);
    plus the input directories themselves (real paths)."""
    ids: set[tuple[int, int]] = set()
    dirs: list[str] = []

    def add(path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode):
            ids.add((st.st_dev, st.st_ino))

    for p in inputs:
        if not p or p == STDOUT:
            continue
        # A run.json path loads its whole folder (snapviz.load.load): every file there is an input.
        folder = (os.path.dirname(p) or ".") if os.path.basename(p) == "run.json" else p
        if folder != p:
            add(p)
        if os.path.isdir(folder):
            dirs.append(os.path.realpath(folder))
            try:
                with os.scandir(folder) as it:
                    for i, entry in enumerate(it):
                        if i >= _MAX_DIR_MEMBERS:
                            break
                        add(entry.path)
            except OSError:
                pass
        else:
            add(p)
            add(os.path.join(os.path.dirname(p) or ".", "run.json"))  # the loader reads it as metadata
    return ids, dirs


def _probe_dir(flag: str, path: str, d: str) -> None:
    """Create and remove a file in ``d``: the only reliable test that an output can be written
    there (permissions, read-only mounts, /proc, full quotas all show up here)."""
    if not os.path.isdir(d):
        raise InputError(f"{flag} {path}: output directory {d} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=".probe", dir=d)
    except OSError as err:
        raise InputError(f"{flag} {path}: cannot create files in {d} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(tmp)


def _target(flag: str, path: str) -> tuple[str, os.stat_result | None]:
    """The real file an output path writes (symlinks followed) and its stat (None: new file);
    refuses anything that is not a new path or a regular file."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(f"{flag} {path}: is a symbolic link to a missing file; name the file itself") from None
        return real, None
    except OSError as err:
        raise InputError(f"{flag} {path}: cannot use as output ({err.strerror or err})") from None
    if not stat.S_ISREG(st.st_mode):
        hint = (
            "; name an output file"
            if stat.S_ISDIR(st.st_mode)
            else "; snapviz writes only regular files ('-' for stdout)"
        )
        link = " (through a symbolic link)" if os.path.islink(path) else ""
        raise InputError(f"{flag} {path}: is {_kind(st.st_mode)}{link}{hint}")
    return real, st


def check_outputs(outputs: Sequence[tuple[str, str | None]], inputs: Sequence[str] = ()) -> None:
    """Refuse, before any work, output paths that could destroy something or cannot be written.

    ``outputs``: (option, path or None) pairs; ``inputs``: the command's input paths.
    Raises :class:`InputError` (exit 2, one line) naming the option and the path.
    """
    given = [(flag, p) for flag, p in outputs if p]
    if sum(1 for _, p in given if p == STDOUT) > 1:
        raise InputError("only one output can go to stdout ('-')")
    ids, dirs = _protected(inputs)
    seen: dict[str, str] = {}
    for flag, path in given:
        if path == STDOUT:
            continue
        real, st = _target(flag, path)
        if real in seen:
            raise InputError(f"{flag} {path}: two outputs name the same file ({seen[real]} too)")
        seen[real] = flag
        if st is not None:
            inside = next((d for d in dirs if os.path.commonpath([d, real]) == d), None)
            if (st.st_dev, st.st_ino) in ids or inside is not None:
                what = f"a file of the input {inside}" if inside else "an input of this command (or the same file)"
                raise InputError(f"{flag} {path}: is {what}; writing it would destroy the input, choose another output")
            if not os.access(real, os.W_OK):
                raise InputError(f"{flag} {path}: is read-only; snapviz does not replace it")
        _probe_dir(flag, path, os.path.dirname(real))


def _stage(real: str, data: str | bytes, st: os.stat_result | None) -> str:
    """A complete temp file beside ``real`` with the mode (and owner) ``real`` has or would get."""
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=".tmp", dir=os.path.dirname(real))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())  # a full disk shows up here, before anything is renamed
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.chown(tmp, st.st_uid, st.st_gid)
                except OSError:
                    pass  # only root (or the owner, for the group) may; the mode is kept anyway
        else:
            # mkstemp creates 0600; a report is an ordinary file: honour the umask like open().
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def _backup(real: str) -> str | None:
    """A hard link to the file about to be replaced, to put it back if a later rename fails."""
    name = os.path.join(os.path.dirname(real), f"{_TMP_PREFIX}{os.getpid()}-{os.path.basename(real)[:100]}.bak")
    _unlink(name)
    try:
        os.link(real, name)
    except OSError:
        return None
    return name


def write_outputs(outputs: Sequence[tuple[str, str | bytes]]) -> list[str]:
    """Write rendered outputs (path, text) together; ``-`` is stdout, written after the files.

    Every file is first written in full beside its target; only then are they renamed into
    place. If any step fails, every temp file is removed and renamed files are put back, and
    :class:`InputError` says which output failed. Returns the paths written.
    """
    files = [(p, d) for p, d in outputs if p != STDOUT]
    staged: list[tuple[str, str, str, os.stat_result | None]] = []  # (path, real, tmp, old stat)
    done: list[tuple[str, str | None]] = []  # (real, backup or None for a new file)
    current = ""
    try:
        for path, data in files:
            current = path
            real, st = _target("output", path)  # again: the path may have changed since the check
            staged.append((path, real, _stage(real, data, st), st))
        for path, real, tmp, st in staged:
            current = path
            bak = _backup(real) if st is not None else None
            os.replace(tmp, real)
            done.append((real, bak))
    except OSError as err:
        for real, bak in reversed(done):
            if bak is not None:
                os.replace(bak, real)
            else:
                _unlink(real)
        for _, _, tmp, _ in staged:
            _unlink(tmp)
        raise InputError(f"{current}: could not write ({err.strerror or err}); no output was written") from None
    except BaseException:
        for _, _, tmp, _ in staged:
            _unlink(tmp)
        raise
    for _, bak in done:
        _unlink(bak)
    for path, data in outputs:
        if path == STDOUT:
            write_stdout(data if isinstance(data, str) else data.decode("utf-8", "replace"))
    return [p for p, _ in files]


def tolerant_stdio() -> None:
    """Let stdout and stderr show any text in any encoding: a character the stream's encoding
    cannot hold (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``, a latin-1 pipe) is written as its
    escape (``\\u2014``) instead of failing the command after its work is done."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a closed or detached stream: nothing to adapt
                pass


def write_stdout(text: str) -> None:
    """``text`` to standard output, flushed, whatever its encoding: what it cannot encode is
    written escaped. A closed stdout (``>&-``) or a failing one (a full device, an I/O error) is
    :class:`InputError` (one line, exit 2); a pipe whose reader went away is :class:`ReaderGone`
    (exit 0, as Unix tools do). Every stdout write goes here."""
    out = sys.stdout
    if out is None:
        raise InputError("standard output is closed; nothing could be written to it (give an output file instead)")
    encoding = getattr(out, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        text = text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding name Python does not know: leave the text to the stream
        pass
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        raise ReaderGone() from None
    except (OSError, ValueError) as err:  # ValueError: the stream object was closed
        detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or type(err).__name__
        raise InputError(f"standard output: cannot write ({detail})") from None


def say(line: str = "") -> None:
    """One line of the terminal summary (already made printable by the caller) to stdout."""
    write_stdout(line + "\n")


def write_atomic(path: str, data: str | bytes) -> None:
    """One output file, written as :func:`write_outputs` writes several."""
    write_outputs([(path, data)])
