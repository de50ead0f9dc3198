"""The pytest plugin: ``@pytest.mark.limit_gpu_memory`` passes, fails and skips.

The inner test sessions (``pytester``) replace the CUDA recorder with a fake one that
returns a snapshot recorded by the reference allocator model (tests/support/synth.py), so these
run on CPU. tests/gpu/test_plugin_gpu.py runs the real recorder on a GPU.
"""

from __future__ import annotations

import pickle
import types
from typing import Any

import pytest

from snapviz.pytest_plugin import CudaRecorder, Recording, evaluate_recording
from synth import GiB, MiB, Sim, make_frames

pytest_plugins = ["pytester"]


def recorded_test_snapshot() -> tuple[dict[str, Any], dict[str, int]]:
    """What a test that loads 1 GiB of weights, runs 2 steps and decodes would record."""
    sim = Sim(seed=11)
    truth: dict[str, int] = {}
    for stage, nbytes in (("load", GiB), ("denoise/0", 300 * MiB), ("denoise/1", 300 * MiB), ("vae_decode", 700 * MiB)):
        sim.reset_peak()
        with sim.stage(stage):
            h = sim.alloc(nbytes, frames=make_frames(stage.split("/")[0], "/t/test_pipe.py", 10))
            if stage != "load":
                sim.free(h)
        truth[stage] = sim.peak_allocated()
    sim.start_recording(clear=False, reset_peak=False)
    truth["total"] = max(truth.values())
    return sim.snapshot(marker=False), truth


CONFTEST = """
import pytest
from snapviz.load.snapshot.safe_pickle import safe_load_pickle
from snapviz.pytest_plugin import Recording

class FakeRecorder:
    calls = []
    def unavailable(self):
        return None
    def start(self):
        FakeRecorder.calls.append("start")
    def stop(self):
        FakeRecorder.calls.append("stop")
        return Recording(safe_load_pickle("recorded.pickle"), allocator_peak=None)

@pytest.fixture
def snapviz_recorder():
    return FakeRecorder()
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester dir with the plugin loaded explicitly (not by entry point) and a fake recorder."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    snap, _ = recorded_test_snapshot()
    (pytester.path / "recorded.pickle").write_bytes(pickle.dumps(snap, protocol=4))
    pytester.makeconftest(CONFTEST)
    return pytester


def _run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    return p.runpytest("-p", "snapviz.pytest_plugin", "-p", "no:cacheprovider", *args)


def test_under_the_limit_passes(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import pytest
        @pytest.mark.limit_gpu_memory("2 GiB")
        def test_small():
            pass
        @pytest.mark.limit_gpu_memory("1.7 GiB", stage="vae_decode")
        def test_stage_ok():
            pass
    """)
    res = _run(inner, f"--snapviz-dir={inner.path / 'kept'}")
    res.assert_outcomes(passed=2)
    assert not (inner.path / "kept").exists()


def test_over_the_limit_fails_with_summary_and_keeps_the_snapshot(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        test_big="""
        import pytest
        @pytest.mark.limit_gpu_memory("1.5 GiB")
        def test_total():
            pass
    """
    )
    kept = inner.path / "kept"
    res = _run(inner, f"--snapviz-dir={kept}")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    # total = 1 GiB weights + 700 MiB decode buffer = 1.68 GiB > 1.50 GiB (+12.2%)
    assert "GPU memory limit exceeded: peak allocated 1.68 GiB > 1.50 GiB (+12.2%)" in out
    assert "### GPU memory" in out and "vae_decode" in out  # the Markdown summary
    files = list(kept.iterdir())
    assert [f.name for f in files] == ["test_big.py_test_total.pickle"]
    from snapviz.load import load

    assert load(str(files[0])).snapshot is not None  # a loadable snapshot


def test_stage_limit_applies_to_that_stage_only(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import pytest
        @pytest.mark.limit_gpu_memory("1.5 GiB", stage="vae_decode")
        def test_vae_over():   # vae_decode peak = 1 GiB weights + 700 MiB
            pass
        @pytest.mark.limit_gpu_memory("1.5 GiB", stage="denoise/1")
        def test_step_ok():    # 1 GiB + 300 MiB
            pass
        @pytest.mark.limit_gpu_memory("8 GiB", stage="upscale")
        def test_unknown_stage():
            pass
    """)
    res = _run(inner)
    res.assert_outcomes(passed=1, failed=2)
    out = res.stdout.str()
    assert "stage vae_decode peak allocated 1.68 GiB > 1.50 GiB" in out
    assert (
        "stage 'upscale' was not recorded in this test (stages: load, denoise, denoise/0..denoise/1, vae_decode)" in out
    )


def test_a_failing_test_keeps_its_snapshot_and_reports_its_own_error(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import pytest
        @pytest.mark.limit_gpu_memory("8 GiB")
        def test_raises():
            raise RuntimeError("CUDA out of memory (pretend)")
    """)
    res = _run(inner, f"--snapviz-dir={inner.path / 'kept'}")
    res.assert_outcomes(failed=1)
    assert "CUDA out of memory (pretend)" in res.stdout.str()
    assert len(list((inner.path / "kept").iterdir())) == 1


def test_unmarked_tests_are_not_recorded(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        from conftest import FakeRecorder
        def test_plain():
            assert FakeRecorder.calls == []
    """)
    _run(inner).assert_outcomes(passed=1)


def test_bad_limit_is_a_clear_error(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import pytest
        @pytest.mark.limit_gpu_memory("8 G")
        def test_x():
            pass
    """)
    res = _run(inner)
    res.assert_outcomes(errors=1)
    assert "ambiguous unit 'G'" in res.stdout.str()


def test_without_torch_the_marked_test_is_skipped(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (real) recorder, with torch made unimportable inside the inner session."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    pytester.makepyfile("""
        import pytest
        @pytest.mark.limit_gpu_memory("8 GiB")
        def test_gpu():
            raise AssertionError("must not run")
    """)
    res = _run(pytester, "-rs")
    res.assert_outcomes(skipped=1)
    assert "limit_gpu_memory: torch is not installed" in res.stdout.str()


def test_without_cuda_the_recorder_gives_a_skip_reason() -> None:
    cpu_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False), __version__="2.13.0+cpu")
    assert CudaRecorder(import_torch=lambda: cpu_torch).unavailable() == "limit_gpu_memory: CUDA is not available"

    def no_torch() -> Any:
        raise ImportError("No module named 'torch'")

    assert CudaRecorder(import_torch=no_torch).unavailable() == "limit_gpu_memory: torch is not installed"


def test_evaluate_recording_matches_the_allocator_truth() -> None:
    snap, truth = recorded_test_snapshot()
    v = evaluate_recording(Recording(snap), limit=truth["total"], stage=None, name="t")
    assert v["passed"] and v["actual"] == truth["total"]
    v = evaluate_recording(Recording(snap), limit=truth["total"] - 1, stage=None, name="t")
    assert not v["passed"]
    for stage in ("load", "denoise/0", "denoise/1", "vae_decode"):
        assert evaluate_recording(Recording(snap), limit=1 << 40, stage=stage, name="t")["actual"] == truth[stage]
