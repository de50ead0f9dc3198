"""Load untrusted snapshot pickles without ever executing code.

Snapshots from ``torch.cuda.memory._dump_snapshot`` hold only builtins (dict, list,
str, int, float, bool, tuple, None): no GLOBAL/STACK_GLOBAL opcode is needed, so an
unpickler whose ``find_class`` always refuses loads every real snapshot and blocks
every ``__reduce__`` payload before it can run.
"""

from __future__ import annotations

import io
import lzma
import os
import pickle
import zlib
from collections.abc import Callable
from typing import Any

from snapviz.errors import InputError
from snapviz.load.decompress import open_decompressed, read_all
from snapviz.load.limits import Limits
from snapviz.load.snapshot.pickle_scan import scan_pickle


class _RefuseGlobals(pickle.Unpickler):
    """C-speed unpickler (subclass of ``_pickle.Unpickler``) that refuses every global."""

    def find_class(self, module: str, name: str) -> Any:
        raise InputError(
            f"refusing to load: the pickle asks for {module}.{name}; "
            "memory snapshots contain plain data only (this file may be malicious)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise InputError("refusing to load: the pickle uses persistent ids, which snapshots never do")


def safe_load_pickle(
    path: str | os.PathLike[str], build: Callable[[bytes], Callable[[], Any] | None] | None = None
) -> Any:
    """Unpickle ``path`` (protocols 0-5, optionally compressed) with globals refused.

    ``build``, when given, is offered the bytes once they passed the safety scan. It may
    return a function that finishes the job without them (the bytes are let go before it
    runs); what that returns, unless None, is returned instead of unpickling the file.
    Every failure becomes an :class:`InputError` carrying one readable line.
    """
    p = os.fspath(path)
    limits = Limits.from_env()
    f = open_decompressed(p, limits=limits)
    try:
        with f:
            data = read_all(f)
            if not data:
                raise InputError(f"{p}: empty file")
            # Every structural limit is checked on the opcodes before one object is built.
            scan_pickle(data, p, limits)
            finish = build(data) if build is not None else None
            if finish is not None:
                del data
                built = finish()
                if built is not None:
                    return built
                del finish  # its tape (~14 bytes per object) must not stay beside the unpickled objects
                if not isinstance(getattr(f, "raw", None), io.FileIO):  # the bytes are gone: decompress again
                    with open_decompressed(p, limits=limits) as again:
                        return _RefuseGlobals(again).load()
            if isinstance(getattr(f, "raw", None), io.FileIO):
                # An uncompressed file is unpickled from the file, read again (from the page
                # cache), so the checked bytes are not held beside the objects they become:
                # the load's peak is the objects', as for any reader of the file.
                data = b""
                f.seek(0)
                return _RefuseGlobals(f).load()
        # BytesIO has no peek(), so the C unpickler would call read() per opcode wherever the
        # pickle has no FRAME opcodes (protocol 2, or a hand-made one): 15M frame dicts took 44 s
        # instead of 8 s; through a buffered reader it reads ahead, as from a file.
        return _RefuseGlobals(io.BufferedReader(io.BytesIO(data), 1 << 16)).load()
    except InputError as exc:
        msg = str(exc)
        raise InputError(msg if msg.startswith(p) else f"{p}: {msg}") from None
    except RecursionError:
        raise InputError(f"{p}: pickle nests too deeply to be a snapshot") from None
    except MemoryError:
        # FIX (tests/unit/test_safe_load.py): a corrupt length field asks for exabytes
        raise InputError(
            f"{p}: not a readable snapshot pickle (a length field asks for more memory "
            "than there is: corrupt, or too big for this machine)"
        ) from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        lzma.LZMAError,
        OSError,
        UnicodeDecodeError,
        OverflowError,
        zlib.error,
    ) as exc:  # FIX: OverflowError from FRAME/BINBYTES8 lengths
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, EOFError) or "truncated" in detail.lower() or "ran out of input" in detail.lower():
            raise InputError(f"{p}: truncated or incomplete snapshot pickle ({detail})") from None
        raise InputError(f"{p}: not a readable snapshot pickle ({detail})") from None
