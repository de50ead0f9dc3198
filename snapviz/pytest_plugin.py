"""pytest plugin: fail a test whose CUDA memory peak exceeds a limit.

::

    @pytest.mark.limit_gpu_memory("8 GiB")                      # whole test
    @pytest.mark.limit_gpu_memory("3 GiB", stage="vae_decode")  # one stage's peak
    def test_pipeline(): ...

Around the test call the plugin records the allocator's history
(``torch.cuda.memory._record_memory_history``), resets the peak statistics, dumps the
snapshot afterwards and stops recording; snapviz replays it (the peak matches
``torch.cuda.max_memory_allocated()``, memory allocated before the test included) and,
when over the limit, fails the test with snapviz's Markdown summary in the message and
keeps the snapshot (``--snapviz-dir``). Stages come from
``torch.cuda.memory._set_memory_metadata("vae_decode")`` calls inside the test, as the
collectors do. Without torch or without CUDA the marked test is skipped.

The recorder is a fixture, ``snapviz_recorder``: override it (e.g. in a conftest) with
any object that has ``unavailable() -> str | None``, ``start()`` and ``stop() -> dict``
(the snapshot dict, or a :class:`Recording`) to test without a GPU.

torch is imported lazily and only by :class:`CudaRecorder`; the analyzer never needs it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

MARKER = "limit_gpu_memory"
DEFAULT_MAX_ENTRIES = 1_000_000


@dataclass
class Recording:
    """What a recorder returns: the snapshot dict and, when known, the allocator's own peak."""

    snapshot: Any
    allocator_peak: int | None = None


def _import_torch() -> Any:
    return importlib.import_module("torch")


class CudaRecorder:
    """Records CUDA allocator history around a test (the real recorder)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, import_torch: Callable[[], Any] = _import_torch) -> None:
        self.max_entries = max_entries
        self._import_torch = import_torch
        self._torch: Any = None

    def unavailable(self) -> str | None:
        """Why the test cannot be measured here (a skip reason), or None."""
        try:
            torch = self._import_torch()
        except ImportError:
            return f"{MARKER}: torch is not installed"
        if not torch.cuda.is_available():
            return f"{MARKER}: CUDA is not available"
        if not hasattr(torch.cuda.memory, "_record_memory_history"):
            return f"{MARKER}: this torch ({torch.__version__}) cannot record CUDA memory history"
        self._torch = torch
        return None

    def start(self) -> None:
        torch = self._torch
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        for d in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(d)

    def stop(self) -> Recording:
        torch = self._torch
        try:
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()  # dump before disabling: enabled=None clears the history
            peak = max((torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())), default=None)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
            setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
            if setter is not None:
                setter("")
        return Recording(snap, peak)


# ------------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapviz", "GPU memory limits (snapviz)")
    group.addoption(
        "--snapviz-dir",
        action="store",
        default=None,
        metavar="DIR",
        help="keep the CUDA memory snapshots of tests that fail a limit_gpu_memory limit here "
        "(default: a new temporary directory)",
    )
    parser.addini(
        "snapviz_max_entries",
        f"ring buffer size for limit_gpu_memory recordings (default {DEFAULT_MAX_ENTRIES})",
        default=str(DEFAULT_MAX_ENTRIES),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(limit, stage=None): fail if the test's CUDA peak allocated memory (or the peak of `stage`, "
        "labelled with torch.cuda.memory._set_memory_metadata) exceeds limit, e.g. '8 GiB'; skipped without CUDA",
    )


@pytest.fixture
def snapviz_recorder(request: pytest.FixtureRequest) -> Any:
    """The recorder used by ``limit_gpu_memory`` tests; override to record differently."""
    return CudaRecorder(max_entries=int(request.config.getini("snapviz_max_entries")))


_STATE = pytest.StashKey[dict]()


def _marker_args(marker: pytest.Mark) -> tuple[Any, str | None]:
    if not marker.args and "limit" not in marker.kwargs:
        raise pytest.UsageError(f"@pytest.mark.{MARKER} needs a limit, e.g. {MARKER}('8 GiB')")
    limit = marker.args[0] if marker.args else marker.kwargs["limit"]
    stage = marker.kwargs.get("stage", marker.args[1] if len(marker.args) > 1 else None)
    return limit, stage


@pytest.fixture(autouse=True)
def _snapviz_limit_gpu_memory(request: pytest.FixtureRequest) -> Any:
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        yield
        return
    from snapviz.errors import InputError
    from snapviz.units import parse_size

    raw, stage = _marker_args(marker)
    try:
        limit = parse_size(raw, f"@pytest.mark.{MARKER}")
    except InputError as exc:
        raise pytest.UsageError(str(exc)) from None
    recorder = request.getfixturevalue("snapviz_recorder")
    reason = recorder.unavailable()
    if reason:
        pytest.skip(reason)
    request.node.stash[_STATE] = {"limit": limit, "limit_text": str(raw), "stage": stage, "recorder": recorder}
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    state = pyfuncitem.stash.get(_STATE, None)
    if state is None:
        yield
        return
    recorder = state["recorder"]
    recorder.start()
    outcome = yield
    recording = recorder.stop()
    if not isinstance(recording, Recording):
        recording = Recording(recording)
    state["recording"] = recording
    exc_type = outcome.excinfo[0] if outcome.excinfo is not None else None
    if exc_type is None:
        state["verdict"] = evaluate_recording(recording, state["limit"], state["stage"], pyfuncitem.nodeid)
    else:
        state["verdict"] = None
    skipped = exc_type is not None and issubclass(exc_type, (pytest.skip.Exception, pytest.xfail.Exception))
    # Keep the snapshot of a test that failed, whether by the limit or by itself (an OOM, say).
    if (exc_type is not None and not skipped) or (state["verdict"] is not None and not state["verdict"]["passed"]):
        state["kept"] = _keep_snapshot(pyfuncitem.config, pyfuncitem.nodeid, recording.snapshot)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    if call.when != "call":
        return
    state = item.stash.get(_STATE, None)
    if not state:
        return
    report = outcome.get_result()
    kept = state.get("kept")
    verdict = state.get("verdict")
    if report.passed and verdict is not None and not verdict["passed"]:
        report.outcome = "failed"
        report.longrepr = verdict["message"] + (
            f"\n\nsnapshot kept: {kept}\n(open it with: snapviz analyze {kept} -o report.html)" if kept else ""
        )
    elif report.failed and kept:
        report.sections.append(("snapviz", f"CUDA memory snapshot of this failing test: {kept}"))


def evaluate_recording(recording: Recording, limit: int, stage: str | None, name: str) -> dict[str, Any]:
    """Analyse a recording against the limit: ``{"passed", "actual", "message"}``.

    The verdict is ``snapviz check``'s (:func:`snapviz.analyses.gate.evaluate_gates` on the
    summary), so a test and a CI gate on the same recording agree; only the wording is the plugin's.
    """
    from snapviz.analyses.document import to_json
    from snapviz.analyses.gate import describe_stages, evaluate_gates, stage_peaks
    from snapviz.analyses.pipeline import analyze_input, document_of
    from snapviz.load import Run
    from snapviz.load.snapshot import snapshot_from_dict
    from snapviz.render.markdown import render_markdown
    from snapviz.units import fmt_bytes

    snap = snapshot_from_dict(recording.snapshot, source=name)
    doc = document_of(analyze_input(Run(source=name, label=name, snapshot=snap, trace=None, run_json=None)))
    if stage is not None and stage not in (peaks := stage_peaks(doc)):
        # the gate would refuse it as bad input; a test gets the stages it has and how to label them
        return {
            "passed": False,
            "actual": None,
            "message": (
                f"{MARKER}: stage {stage!r} was not recorded in this test (stages: {describe_stages(list(peaks))}); "
                "label stages with torch.cuda.memory._set_memory_metadata(name)\n\n" + render_markdown(doc)
            ),
        }
    if stage is None:
        (gate,) = evaluate_gates(doc, max_peak=limit)
        what = "peak allocated"
    else:
        (gate,) = evaluate_gates(doc, stage_limits=[(stage, limit)])
        what = f"stage {stage} peak allocated"
    if gate.passed:
        return {
            "passed": True,
            "actual": gate.actual,
            "summary": doc,
            "message": f"{what} {fmt_bytes(gate.actual)} <= {fmt_bytes(limit)}",
        }
    over = f" (+{gate.excess_ratio * 100:.1f}%)" if gate.excess_ratio is not None else ""
    truth = ""
    if stage is None and recording.allocator_peak is not None and recording.allocator_peak != gate.actual:
        truth = f"; the allocator reported {fmt_bytes(recording.allocator_peak)}"
    msg = f"GPU memory limit exceeded: {what} {fmt_bytes(gate.actual)} > {fmt_bytes(limit)}{over}{truth}\n\n"
    return {"passed": False, "actual": gate.actual, "message": msg + render_markdown(doc), "summary": to_json(doc)}


def _keep_snapshot(config: pytest.Config, nodeid: str, snapshot: Any) -> str | None:
    from snapviz.render.output import write_atomic

    d = config.getoption("snapviz_dir", None)
    if not d:
        d = getattr(config, "_snapviz_tmp", None) or tempfile.mkdtemp(prefix="snapviz-")
        config._snapviz_tmp = d  # type: ignore[attr-defined]
    os.makedirs(d, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180] or "test"
    path = os.path.join(d, f"{name}.pickle")
    try:
        # Protocol 4: the pytorch.org memory_viz page cannot read 5.
        write_atomic(path, pickle.dumps(snapshot, protocol=4))
    except Exception:  # noqa: BLE001 - keeping the snapshot must never mask the test's own result
        return None
    return path
