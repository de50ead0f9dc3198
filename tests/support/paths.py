"""Where things are, for every test: the repository root and the data the tests read.

``tests/support`` is on the import path through ``pythonpath`` in setup.cfg's ``[tool:pytest]``,
so a test writes ``from paths import ROOT`` (and ``import synth`` for the oracle allocator).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
TESTS = ROOT / "tests"
TEST_DATA = TESTS / "data"  # golden outputs, small traces
SAMPLES = ROOT / "sample_snapshots"  # real H200 recordings
EXTERNAL = ROOT.parent / "shared" / "external"  # third-party files, beside the checkout in CI
