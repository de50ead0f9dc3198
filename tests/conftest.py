"""Shared fixtures: synthetic snapshots from ``tests/support/synth.py`` written to temp files.

No torch and no GPU: every snapshot here is made by the reference allocator model.
"""

from __future__ import annotations

import gzip
import lzma
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import synth  # tests/support, on the path through setup.cfg's [tool:pytest] pythonpath


@pytest.fixture(scope="session")
def small_sim() -> synth.Sim:
    """A short diffusion-like run on one device (recorded from the start)."""
    return synth.random_workload(seed=3, n_ops=400)


@pytest.fixture(scope="session")
def small_snapshot(small_sim: synth.Sim) -> dict[str, Any]:
    return small_sim.snapshot(marker=False)


@pytest.fixture
def write_pickle(tmp_path: Path) -> Callable[..., Path]:
    """``write_pickle(obj, name="snapshot.pickle", compress=None|"gzip"|"xz", protocol=4)``."""

    def _write(obj: Any, name: str = "snapshot.pickle", compress: str | None = None, protocol: int = 4) -> Path:
        raw = pickle.dumps(obj, protocol=protocol)
        if compress == "gzip":
            raw = gzip.compress(raw)
        elif compress == "xz":
            raw = lzma.compress(raw)
        elif compress == "bz2":
            import bz2

            raw = bz2.compress(raw)
        path = tmp_path / name
        path.write_bytes(raw)
        return path

    return _write


@pytest.fixture
def snapshot_pickle(write_pickle: Callable[..., Path], small_snapshot: dict[str, Any]) -> Path:
    """The small synthetic snapshot as a plain protocol-4 pickle (what ``_dump_snapshot`` writes)."""
    return write_pickle(small_snapshot)


@pytest.fixture
def snapshot_gz(write_pickle: Callable[..., Path], small_snapshot: dict[str, Any]) -> Path:
    """The same snapshot gzip-compressed."""
    return write_pickle(small_snapshot, name="snapshot.pickle.gz", compress="gzip")


@pytest.fixture
def snapshot_xz(write_pickle: Callable[..., Path], small_snapshot: dict[str, Any]) -> Path:
    return write_pickle(small_snapshot, name="snapshot.pickle.xz", compress="xz")


@pytest.fixture
def legacy_segments_pickle(write_pickle: Callable[..., Path], small_sim: synth.Sim) -> Path:
    """A bare list of segments (``memory_snapshot()`` output / very old dumps)."""
    return write_pickle(small_sim.snapshot(layout="segments", marker=False), name="segments.pickle")


@pytest.fixture
def marker_path(tmp_path: Path) -> Path:
    """A file that a malicious pickle would create; tests assert it never appears."""
    p = tmp_path / "PWNED"
    assert not p.exists()
    return p


def pytest_report_header(config: Any) -> str:
    return f"snapviz tests: synthetic snapshots from {os.path.relpath(synth.__file__)} (no torch, no GPU)"
