"""The compiled grammar check (numba) gives the Python one's verdict, to the message.

``fast_scan`` (regex, the reference) and ``fast_scan_compiled`` run on the same bytes and
must agree: True (safe), False (the exact scan decides) or the same exception and message.
Inputs: every bundled sample's pickle, the third-party pickles beside the checkout, every
hostile pickle of tests/support/hostile.py, randomized damage of a small real pickle, and
random token streams built to cross the reference's 256-token run boundaries.
"""

from __future__ import annotations

import glob
import gzip
import lzma
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hostile
from paths import EXTERNAL, ROOT
from snapviz.load.decompress import open_decompressed, read_all
from snapviz.load.limits import LimitExceeded, Limits
from snapviz.load.snapshot import pickle_scan
from snapviz.load.snapshot.pickle_scan_fast import FULL_SCAN_BYTES, fast_scan, fast_scan_compiled

pytest.importorskip("numba")

SAMPLES = sorted(glob.glob(str(ROOT / "sample_snapshots" / "*" / "snapshot.pickle.xz")))
EXTERNAL_PICKLES = sorted(glob.glob(str(EXTERNAL / "*.pickle")))
HOSTILE_CAP = 40 << 20  # decompression bombs are compared on their first 40 MiB


def verdict(scan: Any, data: bytes, limits: Limits) -> tuple[Any, ...]:
    """What ``scan_pickle`` sees of a grammar check: its answer, or the exception and message."""
    try:
        return (scan(data, "f.pickle", limits),)
    except LimitExceeded as exc:
        return (type(exc), str(exc), exc.limit_name)


def assert_same(data: bytes, limits: Limits | None = None) -> tuple[Any, ...]:
    lim = limits or Limits()
    ref = verdict(fast_scan, data, lim)
    got = verdict(fast_scan_compiled, data, lim)
    if ref == (False,) and len(data) > lim.objects and got != ref:
        # By design the reference leaves a pickle longer than the object limit to the exact
        # scan (it cannot count); the kernel counts, and decides as the exact scan does.
        exact = verdict(lambda d, p, li: pickle_scan.scan_pickle(d, p, li, exact=True) is None, data, lim)
        assert got[0] is LimitExceeded and got == exact, data[:64]
        return got
    assert got == ref, data[:64]
    return ref


def read(path: str) -> bytes:
    with open_decompressed(path) as f:
        return read_all(f)


@pytest.mark.skipif(not SAMPLES, reason="no bundled samples")
@pytest.mark.parametrize("path", SAMPLES, ids=[Path(p).parent.name for p in SAMPLES])
def test_samples_pass_both(path: str) -> None:
    data = read(path)
    assert assert_same(data) == (True,), "a real snapshot is in the grammar"
    # a limit under the longest string turns the answer into the same LimitExceeded
    tight = assert_same(data, Limits(string_length=255))
    assert tight == (True,) or tight[0] is LimitExceeded


@pytest.mark.parametrize("path", EXTERNAL_PICKLES or ["absent"], ids=[Path(p).name for p in EXTERNAL_PICKLES] or None)
def test_external_pickles_agree(path: str) -> None:
    if path == "absent":
        pytest.skip("external corpus absent")
    data = read(path)
    assert_same(data)
    assert_same(data, Limits(string_length=255))
    assert_same(data[: len(data) // 2])


def _head(path: Path) -> bytes:
    opener: Any = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "rb") as f:
        return f.read(HOSTILE_CAP)


def test_hostile_pickles_agree(tmp_path: Path) -> None:
    verdicts = {}
    for name, (path, _word) in hostile.pickle_cases(tmp_path).items():
        data = _head(path)
        verdicts[name] = assert_same(data)
        assert_same(data, Limits(string_length=100))
    assert verdicts["binunicode8_length_2_62"][0] is LimitExceeded
    assert verdicts["string_32MiB_plain"][0] is LimitExceeded
    assert verdicts["billion_laughs_padded_2MiB"] == (True,)
    assert verdicts["flat_frozenset"] == verdicts["deep_tuple_dict_key_gz"] == (False,)  # the exact scan refuses


def small_real_pickle() -> bytes:
    """The first 300 events of the smallest sample, pickled as ``_dump_snapshot`` does."""
    snap = pickle.loads(read(min(SAMPLES, key=lambda p: Path(p).stat().st_size)))
    snap["device_traces"] = [t[:300] for t in snap["device_traces"]]
    snap["segments"] = snap["segments"][:3]
    return pickle.dumps(snap, protocol=4)


# opcodes and fragments a mutation inserts: grammar tokens, handled opcodes, refused ones
_INSERTS = [bytes([op]) for op in b"\x85\x86\x87)\x94.(ue}]saN\x88\x89\x80\x8f\x91Rbh\x8c\x8aX\x8d"] + [
    b"K\x07",
    b"J\x00\x00\x00\x80",
    b"\x8c\x03abc",
    b"X\xff\xff\xff\x00",
    b"\x8e" + (1 << 40).to_bytes(8, "little"),
    b"B\x05\x00\x00\x00hello",
    b"\x95" + (10).to_bytes(8, "little"),
]


@pytest.mark.skipif(not SAMPLES, reason="no bundled samples")
def test_damaged_real_pickle_agrees() -> None:
    rng = random.Random(14)
    base = small_real_pickle()
    assert assert_same(base) == (True,)
    seen = set()
    for _ in range(400):
        data = bytearray(base)
        kind = rng.randrange(3)
        if kind == 0:  # truncation
            del data[rng.randrange(len(data)) :]
        elif kind == 1:  # byte flips
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        else:  # inserted opcodes
            for _ in range(rng.randint(1, 2)):
                at = rng.randrange(len(data))
                data[at:at] = rng.choice(_INSERTS)
        seen.add(assert_same(bytes(data), Limits(string_length=rng.choice([1 << 16, 1 << 40])))[0])
    assert seen == {True, False, LimitExceeded}, "the mutations reach every verdict"


def token_stream(rng: random.Random) -> bytes:
    """Grammar tokens with many MEMOIZEs and tuples, so tuple items straddle 256-token runs."""
    scalars = [b"K\x01", b"M\x01\x02", b"N", b"\x88", b"G" + bytes(8), b"\x8c\x02ab", b"\x8a\x01\x05"]
    others = [b"h\x00", b"j\x00\x00\x00\x00", b"(", b"]", b"}", b"a", b"e", b"s", b"u", b"\x95" + bytes(8)]
    out = [b"\x80\x04"]
    for _ in range(rng.randint(1, 1200)):
        r = rng.random()
        if r < 0.45:
            out.append(b"\x94" * rng.choice([1, 1, 2, 250, 254, 255, 256, 257, 511]))
        elif r < 0.75:
            out.append(rng.choice(scalars))
        elif r < 0.85:
            out.append(rng.choice(others))
        elif r < 0.97:
            out.append(rng.choice([b"\x85", b"\x86", b"\x87"]))
        else:
            out.append(rng.choice([b")", b"X\x01\x00\x00\x00z"]))
    out.append(b".")
    return b"".join(out)


def test_random_token_streams_agree() -> None:
    rng = random.Random(256)
    seen = set()
    for _ in range(300):
        seen.add(assert_same(token_stream(rng))[0])
    assert seen == {True, False}


@pytest.mark.parametrize("memoizes", [0, 1, 253, 254, 255, 256, 257, 509, 510, 511, 512, 513])
@pytest.mark.parametrize("filler", [0, 1, 255, 256, 257, 600])
def test_tuple_items_across_run_boundaries(memoizes: int, filler: int) -> None:
    """A tuple whose items sit before a long run of MEMOIZEs: both checks see the same window."""
    for tup, items in ((b"\x85", b"K\x01"), (b"\x86", b"K\x01N"), (b"\x87", b"K\x01\x94K\x02\x88")):
        assert_same(b"\x80\x04" + b"N" * filler + items + b"\x94" * memoizes + tup + b".")
        assert_same(b"\x80\x04" + b"N" * filler + items[:1] + b"\x94" * memoizes + items[1:] + tup + b".")


def test_scan_pickle_takes_the_compiled_check_for_big_pickles(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def checker(name: str) -> Callable[..., bool]:
        def check(*a: object) -> bool:
            calls.append(name)
            return True

        return check

    monkeypatch.setattr(pickle_scan, "fast_scan_compiled", checker("compiled"))
    monkeypatch.setattr(pickle_scan, "fast_scan", checker("python"))
    monkeypatch.setenv("SNAPVIZ_KERNEL_MIN_SIZE", f"pickle_scan={2 * FULL_SCAN_BYTES}")
    for size in (FULL_SCAN_BYTES + 1, 2 * FULL_SCAN_BYTES):
        assert pickle_scan.scan_pickle(b"\x80\x04" + b"N" * size + b".", "p", Limits()) is None
    assert calls == ["python", "compiled"]


@pytest.mark.skipif(not SAMPLES, reason="no bundled samples")
def test_compiled_check_bounds_objects_for_pickles_over_the_object_limit() -> None:
    """A pickle longer (in bytes) than the object limit: the reference hands it to the exact
    scan; the kernel counts the objects as the exact scan does. Whenever it says safe, the
    exact scan under the same limit passes too; over the limit it raises the exact scan's
    error (same limit, same message), exactly down to the count."""
    data = read(SAMPLES[0])
    counts = pickle_scan.scan_pickle(data, "f.pickle", Limits(), exact=True)
    assert counts is not None
    objects = counts["objects"]
    for limit in (objects // 2, objects - 1, objects, objects * 2, len(data) - 1):
        lim = Limits(objects=limit)
        assert len(data) > limit or limit == objects * 2  # the reference cannot decide these
        if limit < objects:
            with pytest.raises(LimitExceeded) as got:
                fast_scan_compiled(data, "f.pickle", lim)
            with pytest.raises(LimitExceeded) as exact:
                pickle_scan.scan_pickle(data, "f.pickle", lim, exact=True)
            assert got.value.limit_name == "objects" and str(got.value) == str(exact.value)
        else:
            assert fast_scan_compiled(data, "f.pickle", lim)
            pickle_scan.scan_pickle(data, "f.pickle", lim, exact=True)  # must not raise
