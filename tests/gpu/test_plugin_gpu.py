"""The pytest plugin with the real CUDA recorder (run on a GPU machine; skipped elsewhere).

    python -m pytest tests/gpu/test_plugin_gpu.py -v

Allocates known tensors under ``@pytest.mark.limit_gpu_memory`` and checks that the
limit passes/fails as it should and that snapviz's replayed peak equals
``torch.cuda.max_memory_allocated()``.
"""

from __future__ import annotations

import glob

import pytest

# Cheap check first: CPU CI never pays for importing torch here.
if not glob.glob("/dev/nvidia[0-9]*"):
    pytest.skip("needs a CUDA GPU (tests/gpu runs on GPU machines only)", allow_module_level=True)
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (tests/gpu runs on GPU machines only)", allow_module_level=True)

from snapviz.pytest_plugin import CudaRecorder, evaluate_recording  # noqa: E402

pytest_plugins = ["pytester"]
MiB = 1 << 20


def test_replayed_peak_equals_the_allocators() -> None:
    rec = CudaRecorder()
    assert rec.unavailable() is None
    rec.start()
    keep = torch.empty(64 * MiB + 1000, dtype=torch.uint8, device="cuda")
    for n in (3 * MiB + 7, 200 * MiB, 1000, 37 * MiB):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        del t
    recording = rec.stop()
    del keep
    v = evaluate_recording(recording, limit=1 << 40, stage=None, name="replay")
    assert v["actual"] == recording.allocator_peak, v["message"]


INNER = """
import pytest, torch
MiB = 1 << 20

@pytest.mark.limit_gpu_memory("600 MiB")
def test_under():
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del x

@pytest.mark.limit_gpu_memory("600 MiB")
def test_over():
    x = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
    del x

@pytest.mark.limit_gpu_memory("300 MiB", stage="vae_decode")
def test_stage_under_even_though_denoise_is_bigger():
    if not hasattr(torch.cuda.memory, "_set_memory_metadata"):
        pytest.skip("torch without _set_memory_metadata")
    torch.cuda.memory._set_memory_metadata("denoise/0")
    a = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del a
    torch.cuda.memory._set_memory_metadata("vae_decode")
    b = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
    del b
    torch.cuda.memory._set_memory_metadata("")
"""


def test_marker_on_a_real_gpu(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_inner=INNER)
    res = pytester.runpytest("-p", "snapviz.pytest_plugin", f"--snapviz-dir={pytester.path / 'kept'}", "-rA")
    res.assert_outcomes(passed=2, failed=1)
    out = res.stdout.str()
    assert "GPU memory limit exceeded: peak allocated" in out
    assert [p.name for p in (pytester.path / "kept").iterdir()] == ["test_inner.py_test_over.pickle"]
