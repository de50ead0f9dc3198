"""A snapshot pickle as the model: the safety layer, then one of the declared readers,
chosen in one place (:func:`choose_reader`) and recorded on the snapshot (``Snapshot.reader``).

* the safety layer (:mod:`snapviz.load.snapshot.safe_pickle`): bounded decompression, the
  opcode scan that bounds what may be built (:mod:`snapviz.load.snapshot.pickle_scan`), and
  the unpickler that refuses every global;
* the object path, for every file: the restricted unpickler, then the builder
  (:func:`snapviz.load.snapshot.builder.snapshot_from_dict`), which copes with every layout;
* the one fast backend, for big files where numba is installed: the pickle-to-columns VM
  (:mod:`snapviz.load.snapshot.columnar`), which gives the same columns, or gives the file
  back to the object path (a layout it leaves to the builder, or no numba).
"""

from __future__ import annotations

from collections.abc import Callable

from snapviz.compiled import min_size
from snapviz.load import paused_gc
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.load.snapshot.columnar import columnar_snapshot
from snapviz.load.snapshot.safe_pickle import safe_load_pickle
from snapviz.model import Snapshot

UNPICKLER = "restricted unpickler"
PICKLE_VM = "pickle-to-columns VM"
READERS = (UNPICKLER, PICKLE_VM)


def choose_reader(size: int) -> str:
    """The reader a checked pickle of ``size`` bytes is offered to first: the VM from the
    ``pickle_tape`` threshold on (:data:`snapviz.compiled.MIN_SIZE`, overridable by
    ``SNAPVIZ_KERNEL_MIN_SIZE``; numba is loaded for the safety scan there anyway), the
    unpickler below."""
    return PICKLE_VM if size >= min_size("pickle_tape") else UNPICKLER


def read_snapshot(path: str) -> Snapshot:
    """A snapshot pickle (any compression) as the columnar model."""
    used = [UNPICKLER]

    def fast(data: bytes) -> Callable[[], Snapshot | None] | None:
        finish = columnar_snapshot(data, path) if choose_reader(len(data)) == PICKLE_VM else None
        if finish is None:
            return None

        def run() -> Snapshot | None:
            snap = finish()
            if snap is not None:
                used[0] = PICKLE_VM
            return snap

        return run

    with paused_gc():
        raw = safe_load_pickle(path, build=fast)
        snap = raw if isinstance(raw, Snapshot) else snapshot_from_dict(raw, source=path)
    snap.reader = used[0]
    return snap
