"""The one interner of snapviz: each distinct value gets a dense ``int`` code, in order of
first appearance, so a column of repeated values becomes integer codes plus one table of the
distinct values (a pandas categorical, the snapshot's string table, the frame and stack tables).

Every interning of strings or rows goes through :class:`Interner`: trace names and shapes
(:mod:`snapviz.load.trace.columns`), a snapshot's strings, frames and stacks
(:mod:`snapviz.load.snapshot.columns`), the stage labels of the HTML views
(:mod:`snapviz.render.html.view_common`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

import numpy as np
import pandas as pd

K = TypeVar("K", bound=Hashable)


class Interner(Generic[K]):
    """Value -> dense code (0, 1, 2... in order of first appearance); ``values`` in code order.

    ``raw`` is a memo for readers that intern a value parsed from source text: the source
    bytes -> the code of what they parse to, so each distinct text is parsed once."""

    __slots__ = ("codes", "raw")

    def __init__(self, initial: Iterable[K] = ()) -> None:
        self.codes: dict[K, int] = {}
        self.raw: dict[bytes, int] = {}
        for v in initial:
            self(v)

    def __call__(self, v: K) -> int:
        """The code of ``v``, a new one where it was not seen yet."""
        code = self.codes.get(v)
        if code is None:
            code = self.codes[v] = len(self.codes)
        return code

    def __len__(self) -> int:
        return len(self.codes)

    def get(self, v: K, default: int = -1) -> int:
        """The code of ``v``, or ``default`` where it was never interned."""
        return self.codes.get(v, default)

    @property
    def values(self) -> list[K]:
        """The distinct values, in code order."""
        return list(self.codes)

    def many(self, values: Sequence[K]) -> np.ndarray:
        """Codes of a batch (int32): new values get codes in order of first appearance, as one
        :meth:`__call__` per value would give them, with a Python step per distinct value only."""
        codes = self.codes
        for s in dict.fromkeys(values):
            if s not in codes:
                codes[s] = len(codes)
        return np.fromiter(map(codes.__getitem__, values), np.int32, len(values))

    def categorical(self, codes: np.ndarray, to_text: Callable[[K], str] | None = None) -> pd.Categorical:
        """``codes`` as a pandas categorical over the interned values (as text by ``to_text``)."""
        cats = [to_text(c) for c in self.codes] if to_text else list(self.codes)
        return pd.Categorical.from_codes(codes, categories=pd.Index(cats, dtype=object))
