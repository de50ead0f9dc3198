"""Every kernel of snapviz.compiled's registry equals its reference, on the arguments real work
gives it: a bundled snapshot is loaded (safety scan, the pickle machine's tape and its loops),
replayed, decimated and simulated with every threshold at 0, each kernel's compiled path
recording what it is called with; then each recorded call is run by the reference too and the
results compared with the kernel's own equality test. A kernel registered without being
reached here fails the test, so a new kernel cannot go unchecked."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import pytest

from paths import SAMPLES
from snapviz import compiled
from snapviz.compiled import ENV, MIN_SIZE, Kernel, min_size, same
from snapviz.errors import InputError

# Over 1 MiB of pickle (the grammar check's floor) and small enough for the machine's own code
# run by Python.
SAMPLE = SAMPLES / "sd15-fp16-profile-1step" / "snapshot.pickle.xz"
CALLS_KEPT = 2


def _spy_everywhere(m: pytest.MonkeyPatch, k: Kernel, calls: list[tuple[Any, ...]]) -> None:
    """Replace ``k``'s compiled path, in the registry and wherever a snapviz module holds it."""
    real = k.compiled_path

    def spy(*args: Any) -> Any:
        if len(calls) < CALLS_KEPT:
            calls.append(args)
        return real(*args)

    m.setattr(k, "compiled_path", spy)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("snapviz"):
            for attr, value in list(vars(mod).items()):
                if value is real:
                    m.setattr(mod, attr, spy)


@pytest.fixture(scope="module")
def recorded() -> tuple[dict[str, Kernel], dict[str, list[tuple[Any, ...]]]]:
    pytest.importorskip("numba")
    kernels = compiled.registered()
    calls: dict[str, list[tuple[Any, ...]]] = {name: [] for name in kernels}
    with pytest.MonkeyPatch.context() as m:
        m.setenv(ENV, "*=0")
        for name, k in kernels.items():
            _spy_everywhere(m, k, calls[name])
        from snapviz.analyses.allocator_rules import settings_from_record
        from snapviz.analyses.decimate import decimate_minmax
        from snapviz.analyses.replay import replay_allocator
        from snapviz.analyses.simulate import Cap, run
        from snapviz.analyses.whatif import replay_stream
        from snapviz.load import load

        snap = load(str(SAMPLE)).snapshot
        assert snap is not None
        rep = replay_allocator(snap, 0)
        ev = rep.events  # type: ignore[attr-defined]
        a = ev["allocated"].to_numpy()
        decimate_minmax(np.arange(len(a)), a, ev["reserved"].to_numpy(), max_points=500)
        settings = settings_from_record(snap.allocator_settings)
        run(replay_stream(rep, settings, Cap()), settings, Cap())
    return kernels, calls  # the compiled paths are the real ones again


def test_every_kernel_is_reached_by_real_work(recorded: Any) -> None:
    kernels, calls = recorded
    assert set(kernels) >= {"replay", "simulate", "decimate", "pickle_scan", "pickle_tape", "tape_fields"}
    assert not [name for name, c in calls.items() if not c], "kernels no real work reached"


@pytest.mark.parametrize("name", sorted(compiled.registered()))
def test_kernel_equals_its_reference(name: str, recorded: Any) -> None:
    kernels, calls = recorded
    k = kernels[name]
    for args in calls[name]:
        with warnings.catch_warnings():  # numpy's overflow warnings on the hashes' wrapping multiplies
            warnings.simplefilter("ignore")
            want = k.reference(*args)
            got = k.compiled_path(*args)
        assert k.equal(want, got), f"{name}: the compiled path differs from the reference"


def test_every_kernel_has_one_threshold_row() -> None:
    kernels = compiled.registered()
    assert {k.row for k in kernels.values()} == set(MIN_SIZE), "a threshold no kernel uses, or a kernel without one"


@pytest.mark.parametrize(
    ("env", "want"),
    [("", MIN_SIZE["replay"]), ("replay=5", 5), ("*=7", 7), ("*=7, replay=never", float("inf")), ("decimate=0", None)],
)
def test_thresholds_are_overridden_by_the_environment(
    env: str, want: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, env)
    assert min_size("replay") == (MIN_SIZE["replay"] if want is None else want)


@pytest.mark.parametrize("env", ["replay", "nope=3", "replay=-1", "replay=1e6"])
def test_a_bad_override_is_one_input_error(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, env)
    with pytest.raises(InputError, match=ENV):
        min_size("replay")


def test_below_its_threshold_a_kernel_runs_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    k = Kernel("t", "replay", lambda: None, lambda n: seen.append("ref"), lambda n: seen.append("compiled"))
    monkeypatch.setattr(compiled, "_compile", lambda k: lambda: None)
    monkeypatch.setenv(ENV, "replay=10")
    k.run(9, 9)
    k.run(10, 10)
    monkeypatch.setattr(compiled, "_compile", lambda k: None)  # no numba: the reference at any size
    k.run(10, 10)
    assert seen == ["ref", "compiled", "ref"]


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (np.array([1.0, np.nan]), np.array([1.0, np.nan]), True),
        (np.array([1, 2]), np.array([1.0, 2.0]), False),  # a float result where ints were due
        ((np.array([1]), 3, {"k": [1]}), (np.array([1]), 3, {"k": [1]}), True),
        ((np.array([1]), 3), (np.array([1]), 4), False),
    ],
)
def test_the_default_equality_is_exact(a: Any, b: Any, equal: bool) -> None:
    assert same(a, b) is equal
