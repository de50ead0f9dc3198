"""pytest plugin: ``@pytest.mark.limit_gpu_memory`` (work in progress)."""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "limit_gpu_memory(limit, stage=None): fail the test when its CUDA peak exceeds limit")
